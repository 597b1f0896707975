"""ONNX graphs as ctxbuild reads them: loading with clear errors, graph inputs, input samples."""
