"""Static-shape replacements for PyTorch ops whose output size depends on the data.

`edgeflow.ops.static` holds them (`nms_fixed`, `batched_nms_fixed`, `nonzero_fixed`,
`masked_select_padded`): each returns fixed-size outputs plus a `valid` mask, so a model that
uses them exports to an ONNX graph without NonZero, Loop, If or NonMaxSuppression. The
`ast.replace_call` rule swaps them in for the originals. This package imports no torch.
"""
