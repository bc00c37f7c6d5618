"""Tiny models with unusual signatures, written into each test's folder (recipes name them)."""

MODELS = '''
import torch
from torch import nn


class RateNet(nn.Module):
    """Branches on a 0-D int64 sample rate: torch.cond becomes an ONNX If."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x, sample_rate):
        return torch.cond(
            sample_rate == 16000, lambda x: self.lin(x), lambda x: self.lin(x * 0.5), (x,)
        )


class Gain(nn.Module):
    """A fed 0-D float input scales the output; a window weighs the features."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x, gain, window):
        return self.lin(x * window) * gain


class Stateful(nn.Module):
    """A recurrent cell's state [layers, batch, features]: the batch on axis 1."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x, state):
        new_state = torch.tanh(self.lin(x)[None] + 0.5 * state)
        return self.head(new_state.sum(0)), new_state
'''


def reshape_model(batch: int | str = -1, features: int = 4, rate: bool = False):
    """x[batch, 3, features] -> Shape -> Gather(0) -> Concat([b, -1]) -> Reshape -> Relu;
    `rate`: with an (unused) 0-D int64 input 'rate' beside it."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3 * features])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
        helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
    ]
    inputs = [x]
    if rate:
        inputs.append(helper.make_tensor_value_info("rate", TensorProto.INT64, []))
    graph = helper.make_graph(nodes, "reshape", inputs, [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
