"""The values shape folding computes on known integer tensors (the ops of torch.onnx's ``expand(a, -1)``, of
its floor division, ``repeat_interleave`` and ``F.pad`` by sizes), and exported models' ops sized by them."""

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


def _scalars(**values) -> dict[str, np.ndarray]:
    """0-d int64 initializers."""
    return {name: np.array(value, np.int64) for name, value in values.items()}


def test_known_values__expand_broadcasts_both_ways_and_tile_repeats_each_axis():
    node = helper.make_node
    values = _values([node("Expand", ["column", "row_target"], ["grid"]),  # (2, 1) to [1, 3]: (2, 3)
                      node("Expand", ["row", "column_target"], ["rows"]),  # (3,) to [2, 1]: (2, 3)
                      node("Tile", ["pair", "twice_each"], ["tiled"]),
                      node("Expand", ["row", "huge"], ["too_large"]), node("Expand", ["row", "bad"], ["mismatch"])],
                     {"column": np.array([[1], [2]], np.int64), "row_target": np.array([1, 3], np.int64),
                      "row": np.array([7, 8, 9], np.int64), "column_target": np.array([2, 1], np.int64),
                      "pair": np.array([[1, 2]], np.int64), "twice_each": np.array([2, 2], np.int64),
                      "huge": np.array([1 << 40, 3], np.int64), "bad": np.array([2], np.int64)})
    assert values == {"grid": [[1, 1, 1], [2, 2, 2]], "rows": [[7, 8, 9], [7, 8, 9]],
                      "tiled": [[1, 2, 1, 2], [1, 2, 1, 2]]}  # no 2**40 rows made, nor a (3,) against (2,)


def test_known_values__range_counts_up_to_the_limit_in_steps_of_delta():
    node = helper.make_node
    values = _values([node("Range", ["zero", "ten", "three"], ["up"]),
                      node("Range", ["ten", "four", "minus_two"], ["down"]),
                      node("Range", ["ten", "four", "three"], ["empty"]),
                      node("Range", ["zero_f", "one_f", "quarter_f"], ["quarters"]),
                      node("Range", ["zero", "ten", "zero"], ["no_step"]),
                      node("Range", ["zero", "huge", "three"], ["too_long"])],
                     {**_scalars(zero=0, ten=10, three=3, four=4, minus_two=-2, huge=1 << 40),
                      "zero_f": np.array(0.0, np.float32), "one_f": np.array(1.0, np.float32),
                      "quarter_f": np.array(0.25, np.float32)})
    assert values == {"up": [0, 3, 6, 9], "down": [10, 8, 6], "empty": [], "quarters": [0.0, 0.25, 0.5, 0.75]}


def test_known_values__comparisons_and_logical_ops_broadcast():
    node = helper.make_node
    comparisons = ("Less", "Greater", "LessOrEqual", "GreaterOrEqual")
    values = _values([node(op, ["sizes", "four"], [op]) for op in comparisons]
                     + [node("Not", ["Less"], ["Not"])]
                     + [node(op, ["Less", "Greater"], [op]) for op in ("And", "Or", "Xor")],
                     {"sizes": np.array([3, 4, 5], np.int64), "four": np.array(4, np.int64)})
    assert values == {"Less": [True, False, False], "Greater": [False, False, True],
                      "LessOrEqual": [True, True, False], "GreaterOrEqual": [False, True, True],
                      "Not": [False, True, True], "And": [False, False, False], "Or": [True, False, True],
                      "Xor": [True, False, True]}


def test_known_values__mod_takes_the_divisors_sign_and_with_fmod_the_dividends():
    node = helper.make_node
    values = _values([node("Mod", ["minus_seven", "three"], ["python_mod"]),
                      node("Mod", ["seven", "minus_three"], ["python_mod_neg"]),
                      node("Mod", ["minus_seven", "three"], ["c_fmod"], fmod=1),
                      node("Mod", ["seven", "minus_three"], ["c_fmod_neg"], fmod=1),
                      node("Mod", ["minus_half_f", "two_f"], ["float_fmod"], fmod=1),
                      node("Mod", ["minus_half_f", "two_f"], ["float_without_fmod"]),
                      node("Mod", ["seven", "zero"], ["by_zero"])],
                     {**_scalars(minus_seven=-7, seven=7, three=3, minus_three=-3, zero=0),
                      "minus_half_f": np.array(-7.5, np.float32), "two_f": np.array(2.0, np.float32)})
    assert values == {"python_mod": 2, "python_mod_neg": -2, "c_fmod": -1, "c_fmod_neg": 1, "float_fmod": -1.5}
    # fmod 0 is for integers only, and an integer division by zero is undefined: neither folded


def test_known_values__torchs_floor_division_of_a_size_rounds_down_as_python_does():
    """``torch.div(a, b, rounding_mode="floor")`` as torch 2.13's TorchScript exporter writes it (opset 10 on):
    Div truncates; where the signs differ (Less, Xor) and the division is not exact (Mod, Equal, Not, And), the
    quotient less one (Sub, Where)."""
    node = helper.make_node
    for a, b in [(7, 2), (-7, 2), (7, -2), (-7, -2), (-8, 2), (0, 3)]:
        values = _values([node("Div", ["a", "b"], ["div"]),
                          node("Less", ["a", "zero"], ["a_negative"]), node("Less", ["b", "zero"], ["b_negative"]),
                          node("Xor", ["a_negative", "b_negative"], ["negative"]),
                          node("Mod", ["a", "b"], ["mod"], fmod=0), node("Equal", ["mod", "zero"], ["exact"]),
                          node("Not", ["exact"], ["inexact"]), node("And", ["negative", "inexact"], ["fix_up"]),
                          node("Sub", ["div", "one"], ["less_one"]),
                          node("Where", ["fix_up", "less_one", "div"], ["floor"])],
                         _scalars(a=a, b=b, zero=0, one=1))
        assert values["floor"] == a // b, (a, b)


def test_known_values__max_min_of_any_count_floor_neg_abs_and_clip():
    node = helper.make_node
    values = _values([node("Max", ["sizes", "four", "column"], ["max"]), node("Min", ["sizes"], ["min_of_one"]),
                      node("Min", ["sizes", "four"], ["min"]), node("Floor", ["halves"], ["floor"]),
                      node("Neg", ["sizes"], ["neg"]), node("Abs", ["neg"], ["abs"]),
                      node("Clip", ["sizes", "four", "five"], ["clip"]),
                      node("Clip", ["sizes", "", "four"], ["clip_max"]),
                      node("Clip", ["sizes"], ["clip_unbounded"])],
                     {"sizes": np.array([3, 6, 5], np.int64), "four": np.array(4, np.int64),
                      "five": np.array(5, np.int64), "column": np.array([[0], [7]], np.int64),
                      "halves": np.array([2.5, -2.5], np.float32)})
    assert values == {"max": [[4, 6, 5], [7, 7, 7]], "min_of_one": [3, 6, 5], "min": [3, 4, 4],
                      "floor": [2.0, -3.0], "neg": [-3, -6, -5], "abs": [3, 6, 5], "clip": [4, 5, 5],
                      "clip_max": [3, 4, 4], "clip_unbounded": [3, 6, 5]}


def test_known_values__one_hot_writes_torchs_repeat_interleave_repeats_and_transpose_its_pads():
    """``repeat_interleave(x, n, dim=1)`` of an (a, b, c) x: Tile's repeats are a one-hot of axis 2 among 4,
    on-value n, off-value 1. ``F.pad``'s pads computed at run time are (begin, end) rows, transposed."""
    node = helper.make_node
    values = _values([node("OneHot", ["axis2", "depth", "off_on"], ["repeats"]),
                      node("OneHot", ["from_end", "depth", "off_on"], ["last"]),
                      node("OneHot", ["two_indices", "depth", "off_on"], ["columns"], axis=0),
                      node("OneHot", ["axis2", "huge", "off_on"], ["too_deep"]),
                      node("Transpose", ["grid"], ["reversed"]),
                      node("Transpose", ["cube"], ["moved"], perm=[2, 0, 1])],
                     {"axis2": np.array([2], np.int64), "depth": np.array(4, np.int64),
                      "off_on": np.array([1, 5], np.int64), "from_end": np.array([-1], np.int64),
                      "two_indices": np.array([0, 3], np.int64), "huge": np.array(1 << 40, np.int64),
                      "grid": np.array([[0, 0], [1, 2]], np.int64),
                      "cube": np.arange(6, dtype=np.int64).reshape(1, 2, 3)})
    assert values == {"repeats": [[1, 1, 5, 1]], "last": [[1, 1, 1, 5]],
                      "columns": [[5, 1], [1, 1], [1, 1], [1, 5]], "reversed": [[0, 1], [0, 2]],
                      "moved": [[[0, 3]], [[1, 4]], [[2, 5]]]}


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


class RepeatEachByBatch(nn.Module):
    """Each token repeated as many times as the batch is large (``repeat_interleave`` by a size read at run
    time: torch.onnx writes Tile's repeats as a OneHot), then a Linear."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 16)

    def forward(self, x):
        return self.linear(torch.repeat_interleave(x, x.size(0), dim=1))


class FloorHalfPairs(nn.Module):
    """Token pairs merged (``torch.div(seq, 2, rounding_mode="floor")`` of the length read at run time), then a
    Linear over each pair."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 32)

    def forward(self, x):
        return self.linear(x.reshape(x.size(0), torch.div(x.size(1), 2, rounding_mode="floor"), 16))


class PadToWindows(nn.Module):
    """A Swin window padding: the length padded up to a multiple of 4 (``(4 - seq % 4) % 4`` rows, an ``F.pad``
    by a size read at run time), then a Linear."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 16)

    def forward(self, x):
        return self.linear(nn.functional.pad(x, (0, 0, 0, (4 - x.size(1) % 4) % 4)))


def _static_and_folded(tmp_path, module: nn.Module, export_shape: tuple, import_shape: tuple, dynamic: dict):
    """The module exported at ``import_shape`` (every size a constant), and exported at ``export_shape`` with the
    ``dynamic`` axes then imported at ``import_shape``."""
    torch.manual_seed(0)
    static, dynamic_path = tmp_path / "static.onnx", tmp_path / "dynamic.onnx"
    torch.onnx.export(module.eval(), (torch.randn(*import_shape),), str(static), dynamo=False, opset_version=17,
                      input_names=["x"])
    torch.onnx.export(module.eval(), (torch.randn(*export_shape),), str(dynamic_path), dynamo=False,
                      opset_version=17, input_names=["x"], dynamic_axes={"x": dynamic})
    return import_onnx(str(static)), import_onnx(str(dynamic_path), input_shapes={"x": import_shape})


def _costs(graph, kinds: tuple[str, ...]) -> dict[str, list[tuple[float, int]]]:
    """{op kind: sorted (FLOPs, output bytes) of its ops} for ``kinds``."""
    return {kind: sorted(zip(graph.flops[graph.op_kinds == kind].tolist(),
                             graph.out_bytes[graph.op_kinds == kind].tolist())) for kind in kinds}


def test_import_onnx__repeat_interleave_by_the_batch_is_sized_as_the_static_export(tmp_path):
    """Exported at batch 2, imported at x (3, 5, 8): Tile writes (3, 5, 3, 8), the Linear a (45, 8) @ (8, 16)
    MatMul. Without OneHot folded, Tile's repeats stayed unknown: Tile, the Reshape after it, MatMul and Add
    unsized (the MatMul at 32 FLOPs)."""
    static, folded = _static_and_folded(tmp_path, RepeatEachByBatch(), (2, 5, 8), (3, 5, 8), {0: "batch"})
    assert "unsized_tensors_by_op" not in folded.meta and "tensors_without_size" not in folded.meta
    kinds = ("Tile", "MatMul", "Add")
    assert _costs(folded, kinds) == _costs(static, kinds)
    assert _costs(folded, ("Tile",))["Tile"] == [(0.0, 3 * 5 * 3 * 8 * F32)]
    assert _costs(folded, ("MatMul",))["MatMul"] == [(2 * 3 * 15 * 8 * 16, 3 * 15 * 16 * F32)]


def test_import_onnx__a_floor_division_of_the_length_is_sized_as_the_static_export(tmp_path):
    """Exported at length 6, imported at x (2, 10, 8): the Reshape writes (2, 5, 16), the Linear a (10, 16) @
    (16, 32) MatMul. torch writes the floor division as Div with a fix-up on the signs (Less, Xor, Mod, Equal,
    Not, And, Sub, Where); without those folded the Reshape's target stayed unknown: it, MatMul and Add
    unsized."""
    static, folded = _static_and_folded(tmp_path, FloorHalfPairs(), (2, 6, 8), (2, 10, 8), {1: "seq"})
    assert {"Less", "Xor", "Mod", "Not", "And", "Where"} <= set(folded.op_kinds.tolist())
    assert "unsized_tensors_by_op" not in folded.meta and "tensors_without_size" not in folded.meta
    kinds = ("MatMul", "Add")
    assert _costs(folded, kinds) == _costs(static, kinds)
    assert _costs(folded, ("MatMul",))["MatMul"] == [(2 * 2 * 5 * 16 * 32, 2 * 5 * 32 * F32)]
    assert folded.out_bytes[folded.op_kinds == "Reshape"].max() == 2 * 5 * 16 * F32


def test_import_onnx__a_pad_to_a_multiple_of_the_window_is_sized_as_the_static_export(tmp_path):
    """Exported at length 6, imported at x (2, 10, 8): 2 rows padded, Pad writes (2, 12, 8), the Linear a
    (24, 8) @ (8, 16) MatMul. Without Mod and Transpose folded and Pad's pads a shape-taking input, Pad, MatMul
    and Add stayed unsized."""
    static, folded = _static_and_folded(tmp_path, PadToWindows(), (2, 6, 8), (2, 10, 8), {1: "seq"})
    assert "unsized_tensors_by_op" not in folded.meta and "tensors_without_size" not in folded.meta
    kinds = ("Pad", "MatMul", "Add")
    assert _costs(folded, kinds) == _costs(static, kinds)
    assert _costs(folded, ("Pad",))["Pad"] == [(0.0, 2 * 12 * 8 * F32)]
    assert _costs(folded, ("MatMul",))["MatMul"] == [(2 * 24 * 8 * 16, 24 * 16 * F32)]


class SortThenLinear(nn.Module):
    """``torch.sort`` along the tokens, then a Linear: torch.onnx writes a TopK whose K is the length read from
    the input's shape (``Shape -> Gather``), even in an export at fixed sizes."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 32)

    def forward(self, x):
        return self.linear(torch.sort(x, dim=1).values)


def test_import_onnx__a_sort_is_sized_and_so_is_the_linear_after_it(tmp_path):
    """At x (4, 8, 16): TopK writes (4, 8, 16) values and indices, the Linear a (32, 16) @ (16, 32) MatMul. With
    TopK's K not folded, both TopK outputs and the MatMul were unsized, the MatMul at 64 FLOPs (OpenVINO, on the
    same model converted, counted 32,768); imported at another length, the dynamic export is sized alike."""
    static, folded = _static_and_folded(tmp_path, SortThenLinear(), (4, 6, 16), (4, 8, 16), {1: "seq"})
    for graph in (static, folded):
        assert "unsized_tensors_by_op" not in graph.meta and "tensors_without_size" not in graph.meta
        assert _costs(graph, ("MatMul",))["MatMul"] == [(2 * 4 * 8 * 16 * 32, 4 * 8 * 32 * F32)]
        assert graph.out_bytes[graph.op_kinds == "TopK"].tolist() == [4 * 8 * 16 * (F32 + 8)]  # values, int64 indices
