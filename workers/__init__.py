"""Worker processes: ONNX Runtime sessions fed through shared memory."""
