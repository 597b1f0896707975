"""pytest -m slow: real public models from PyPI wheels and the long measured matrices."""
