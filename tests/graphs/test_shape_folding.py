"""The values shape folding computes on known integer tensors (the ops of torch.onnx's ``expand(a, -1)``), and
an exported model's Expand sized by them."""

from __future__ import annotations

import tracemalloc

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from graphs.inference.onnx_import import import_onnx
from graphs.inference.shape_folding import MAX_ELEMENTS, known_values

F32 = 4  # bytes per float32


def _values(nodes, constants: dict[str, np.ndarray]) -> dict[str, list]:
    """The folded values (as lists) of a graph of ``nodes`` over the initializers ``constants`` and an input x
    (2, 3, 4)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    graph = helper.make_graph(nodes, "fold", [x], [],
                              [numpy_helper.from_array(value, name) for name, value in constants.items()])
    return {name: value.tolist() for name, value in known_values(graph).items() if name not in constants}


def test_known_values__equal_and_where_broadcast_as_numpy_does():
    node = helper.make_node
    values = _values([node("Equal", ["size", "minus_one"], ["keep"]),  # (3,) against a scalar
                      node("Where", ["keep", "one", "size"], ["target"]),
                      node("Equal", ["column", "size"], ["grid"]),  # (2, 1) against (3,): (2, 3)
                      node("Where", ["grid", "size", "zero"], ["picked"])],
                     {"size": np.array([5, -1, -1], np.int64), "minus_one": np.array(-1, np.int64),
                      "one": np.array(1, np.int64), "zero": np.array(0, np.int64),
                      "column": np.array([[5], [-1]], np.int64)})
    assert values == {"keep": [False, True, True], "target": [5, 1, 1],
                      "grid": [[True, False, False], [False, True, True]], "picked": [[5, 0, 0], [0, -1, -1]]}


def test_known_values__reshape_copies_a_zero_infers_a_minus_one_and_keeps_a_zero_when_allowed():
    node = helper.make_node
    values = _values([node("Reshape", ["pair", "flat"], ["flat_pair"]),
                      node("Reshape", ["grid", "copy_first"], ["copied"]),
                      node("Reshape", ["empty", "zero_rows"], ["none_copied"]),
                      node("Reshape", ["empty", "zero_rows"], ["zero_kept"], allowzero=1)],
                     {"pair": np.array([[4], [-1]], np.int64), "flat": np.array([-1], np.int64),
                      "grid": np.arange(6, dtype=np.int64).reshape(2, 3), "copy_first": np.array([0, 3], np.int64),
                      "empty": np.zeros((2, 0), np.int64), "zero_rows": np.array([0, 5], np.int64)})
    assert values == {"flat_pair": [4, -1], "copied": [[0, 1, 2], [3, 4, 5]], "zero_kept": []}
    # "none_copied": the 0 copies x's 2 rows, and (2, 5) holds 10 elements where (2, 0) holds none: not folded


def test_known_values__torch_expands_keep_this_dim_target():
    """``t.expand(x.size(0), -1, -1)`` as torch.onnx writes it: the sizes stacked (Unsqueeze, Concat), reshaped
    to [-1], each -1 made a 1 (Equal to ones times -1, Where), for Expand's two-way broadcast."""
    node = helper.make_node
    one = numpy_helper.from_array(np.array([1], np.int64), "fill")
    values = _values([node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "at0"], ["batch"]),
                      node("Unsqueeze", ["batch", "axis0"], ["batch_1"]),
                      node("Concat", ["batch_1", "keep", "keep"], ["stacked"], axis=0),
                      node("Reshape", ["stacked", "flat"], ["size"]), node("Shape", ["size"], ["rank"]),
                      node("ConstantOfShape", ["rank"], ["ones"], value=one),
                      node("Mul", ["ones", "minus_one"], ["neg"]),
                      node("Equal", ["size", "neg"], ["kept"]), node("Where", ["kept", "ones", "size"], ["target"])],
                     {"at0": np.array(0, np.int64), "axis0": np.array([0], np.int64), "keep": np.array([-1], np.int64),
                      "flat": np.array([-1], np.int64), "minus_one": np.array(-1, np.int64)})
    assert values["target"] == [2, 1, 1]


def test_known_values__a_broadcast_larger_than_max_elements_is_never_computed():
    """A Where of three 100-element vectors along different axes would be (100, 100, 100): a million elements
    (8 MB of int64) that no shape holds. It is not folded, and not made to be thrown away."""
    node = helper.make_node
    axes = {"condition": (100, 1, 1), "x": (1, 100, 1), "y": (1, 1, 100)}
    constants = {name: np.arange(100, dtype=np.int64).reshape(shape) for name, shape in axes.items()}
    assert all(value.size <= MAX_ELEMENTS for value in constants.values())
    tracemalloc.start()
    try:
        values = _values([node("Where", ["condition", "x", "y"], ["picked"]), node("Add", ["x", "y"], ["sum"])],
                         constants)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "picked" not in values and "sum" not in values  # (1, 100, 100): 10,000 elements, no shape either
    assert peak_bytes < 1_000_000


class ClassToken(nn.Module):
    """A ViT's class token: a (1, 1, 8) parameter expanded to the batch, put before the tokens, a Linear after."""

    def __init__(self):
        super().__init__()
        self.token, self.linear = nn.Parameter(torch.randn(1, 1, 8)), nn.Linear(8, 16)

    def forward(self, x):
        return self.linear(torch.cat([self.token.expand(x.size(0), -1, -1), x], 1))


def test_import_onnx__an_exported_expand_to_the_batch_and_minus_ones_is_sized_and_so_is_what_reads_it(tmp_path):
    """Exported batch-dynamic at batch 2, imported at x (4, 5, 8): the Expand writes (4, 1, 8), the Concat
    (4, 6, 8), and the Linear is a (24, 8) @ (8, 16) MatMul and its bias Add. Without Reshape, Equal and Where
    folded, Expand's target stayed unknown: the Expand, Concat, MatMul and Add unsized, the MatMul at 1024
    FLOPs."""
    torch.manual_seed(0)
    path = tmp_path / "token.onnx"
    torch.onnx.export(ClassToken().eval(), (torch.randn(2, 5, 8),), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    graph = import_onnx(str(path), input_shapes={"x": (4, 5, 8)})
    assert "unsized_tensors_by_op" not in graph.meta and "tensors_without_size" not in graph.meta
    assert graph.out_bytes[graph.op_kinds == "Expand"].tolist() == [4 * 1 * 8 * F32]
    assert graph.out_bytes[graph.op_kinds == "Concat"].tolist() == [3 * 8, 4 * 6 * 8 * F32]  # the sizes, the tokens
    flops = dict(zip(graph.op_kinds.tolist(), graph.flops.tolist()))
    assert flops["MatMul"] == 2 * 4 * 6 * 8 * 16 and flops["Add"] == 4 * 6 * 16
