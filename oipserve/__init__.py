"""oipserve: an Open Inference Protocol (KServe v2) server for ONNX models."""

__version__ = "0.1.0"
