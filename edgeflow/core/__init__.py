"""The leaf layer: basics every other part of edgeflow builds on, importing none of them.

errors (user errors, stage failures, bugs), specs (the recipe's section models such as
TensorSpec, and the quantization presets), loader (YAML with positions, validation with
located problems, command-line overrides), refs (`module:Name` references and the hashes of
the code they reach, via codehash), suggest ("did you mean"), resources (where built-in and
user recipes and targets live) and onnxgraph (ONNX graph helpers). docs/engine.md shows the
layers above it; tests/test_layers.py keeps the order.
"""
