"""Sources from frameworks other than PyTorch: load, run and export each to ONNX."""
