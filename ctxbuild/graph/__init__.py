"""ONNX graphs as ctxbuild reads them: loading with clear errors, graph inputs, input samples."""
from pathlib import Path

# The legalization rules' sources: their digest is in prepare's spec, and they are build.ninja's generator inputs
# (a rule added or changed re-prepares). Named here, where importing costs nothing (legalize/ imports onnx).
LEGALIZE_DIR = Path(__file__).resolve().parent / "legalize"
