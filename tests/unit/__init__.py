"""Fast unit tests: no end-to-end fixture, no QNN run."""
