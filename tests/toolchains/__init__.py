"""Older onnxruntime-qnn releases (provisioned toolchains) and what they can do."""
