"""Source frameworks edgeflow loads models from, and their converters to ONNX."""
