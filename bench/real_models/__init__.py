"""Real public ONNX models shipped inside PyPI wheels, and realistic inputs for them generated locally."""
