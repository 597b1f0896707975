"""ctxbuild: declarative recipes -> QNN context binaries and EPContext models, built by ninja."""

__version__ = "0.1.0"
