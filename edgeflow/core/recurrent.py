"""Facts of recurrent layers that the ONNX rules (rules.onnx.recurrent) and the TensorFlow ops
of a recurrent layer (frameworks.tf_recurrent) share."""

from __future__ import annotations

GATES = {"LSTM": 4, "GRU": 3}  # ONNX W's row blocks: LSTM i, o, f, c; GRU z, r, h
# TFLite Micro's CONCATENATION takes at most 10 inputs (kernels/concatenation.cc kMaxInputNum:
# an 13-step Y failed to prepare): Y of a longer sequence is a Concat of Concats.
MAX_CONCAT_INPUTS = 10
