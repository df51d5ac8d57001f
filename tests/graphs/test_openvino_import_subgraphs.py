"""The OpenVINO IR importer on subgraph ops (Loop, TensorIterator, If): ONNX models built by hand with
onnx.helper, converted with openvino.convert_model and saved as IR; figures checked by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import openvino as ov
import openvino.opset13 as ops
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphs.errors import PlacerError
from graphs.inference.openvino_import import import_openvino_ir

F32 = 4
VALUE = helper.make_tensor_value_info


def _ir_of(tmp_path, nodes, inputs, outputs, initializers=()) -> str:
    """The IR OpenVINO converts an opset-17 ONNX model of ``nodes`` to; its .xml path."""
    graph = helper.make_graph(nodes, "small", inputs, outputs, list(initializers))
    onnx_path, xml_path = tmp_path / "small.onnx", tmp_path / "small.xml"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(onnx_path))
    ov.save_model(ov.convert_model(str(onnx_path)), str(xml_path), compress_to_fp16=False)
    return str(xml_path)


def _loop_ir(tmp_path, trips_input: str = "M", extra_inputs=(), trips: int = 5) -> str:
    """x (2,4) -> Loop over a body h @ W (4,4) + b (4), its condition passed through; M = ``trips`` (5)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["h2"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [VALUE("i", TensorProto.INT64, []), VALUE("cond_in", TensorProto.BOOL, []),
         VALUE("h", TensorProto.FLOAT, [2, 4])],
        [VALUE("cond_out", TensorProto.BOOL, []), VALUE("h2", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "b")])
    loop = helper.make_node("Loop", [trips_input, "", "x"], ["y"], name="loop", body=body)
    return _ir_of(tmp_path, [loop], [VALUE("x", TensorProto.FLOAT, [2, 4]), *extra_inputs],
                  [VALUE("y", TensorProto.FLOAT, [2, 4])],
                  [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
                   numpy_helper.from_array(np.array(trips, np.int64), "M")])


def test_import_openvino_ir__a_huge_static_trip_count_is_one_error_naming_the_loop(tmp_path):
    """Its error said to check --input-shape, which this model has none of."""
    path = _loop_ir(tmp_path, trips=10**18)
    with pytest.raises(PlacerError, match=r"^OpenVINO IR .*small\.xml: Loop '.*' runs its body 1000000000000000000 "
                                          r"times \(its static trip count\), \d+ bytes accessed in each run: .* "
                                          r"bytes, more than a graph counts \(2\*\*62\)$"):
        import_openvino_ir(path)


def test_import_openvino_ir__a_loop_with_a_static_trip_count_costs_its_body_times_the_trips(tmp_path):
    graph = import_openvino_ir(_loop_ir(tmp_path))
    assert graph.op_kinds.tolist() == ["Loop"]
    assert graph.flops.tolist() == [5 * (2 * 8 * 4 + 8)]  # MatMul + Add, 5 times
    body_bytes = (8 + 16 + 8) * F32 + (8 + 4 + 8) * F32  # MatMul h, W, m; Add m, b, h2 (W and b Constants in it)
    assert graph.bytes_accessed.tolist() == [5 * body_bytes]  # its own x and y among them, not counted again
    assert graph.param_bytes.tolist() == [8 + 1 + (16 + 4) * F32]  # W and b, inside its body, resident once
    assert graph.num_params == 16 + 4
    assert graph.meta["ops_without_flops"] == {} and "bodies_not_costed" not in graph.meta


def test_import_openvino_ir__a_loop_without_a_static_trip_count_is_listed_and_says_why(tmp_path):
    graph = import_openvino_ir(_loop_ir(tmp_path, "steps", [VALUE("steps", TensorProto.INT64, [])]))
    (name,) = graph.op_names.tolist()
    assert graph.flops.tolist() == [0.0] and graph.meta["ops_without_flops"] == {"Loop": 1}
    assert graph.meta["bodies_not_costed"] == {name: "Loop: OpenVINO gives no static iteration count (a trip count "
                                                     "or a condition computed at run time)"}


def test_import_openvino_ir__a_scan_is_a_tensor_iterator_costing_its_body_times_its_length(tmp_path):
    body = helper.make_graph(
        [helper.make_node("MatMul", ["xt", "W"], ["m"]), helper.make_node("Add", ["s", "m"], ["s2"]),
         helper.make_node("Identity", ["s2"], ["o"])], "scan_body",
        [VALUE("s", TensorProto.FLOAT, [2, 4]), VALUE("xt", TensorProto.FLOAT, [2, 3])],
        [VALUE("s2", TensorProto.FLOAT, [2, 4]), VALUE("o", TensorProto.FLOAT, [2, 4])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["s_last", "os"], name="scan", body=body, num_scan_inputs=1)
    path = _ir_of(tmp_path, [scan], [VALUE("s0", TensorProto.FLOAT, [2, 4]), VALUE("xs", TensorProto.FLOAT, [7, 2, 3])],
                  [VALUE("s_last", TensorProto.FLOAT, [2, 4]), VALUE("os", TensorProto.FLOAT, [7, 2, 4])],
                  [numpy_helper.from_array(np.ones((3, 4), np.float32), "W")])
    graph = import_openvino_ir(path)
    assert graph.op_kinds.tolist() == ["TensorIterator"]
    assert graph.flops.tolist() == [7 * (2 * 8 * 3 + 8)]
    assert graph.num_params == 12
    assert graph.meta["ops_without_flops"] == {}


def test_import_openvino_ir__an_if_costs_its_costlier_branch(tmp_path):
    then = helper.make_graph([helper.make_node("MatMul", ["h", "W"], ["t"])], "then", [],
                             [VALUE("t", TensorProto.FLOAT, [2, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else", [],
                              [VALUE("e", TensorProto.FLOAT, [2, 4])])
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=then, else_branch=other)]
    path = _ir_of(tmp_path, nodes, [VALUE("x", TensorProto.FLOAT, [2, 4]), VALUE("flag", TensorProto.BOOL, [])],
                  [VALUE("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(np.ones((4, 4), np.float32), "W")])
    graph = import_openvino_ir(path)
    flops = dict(zip(graph.op_kinds.tolist(), graph.flops.tolist()))
    assert flops == {"Relu": 8, "If": 2 * 8 * 4}  # the MatMul branch's, not the negation's 8
    assert graph.meta["ops_without_flops"] == {}


def test_import_openvino_ir__outputs_of_dynamic_shape_are_counted_by_op_type(tmp_path):
    """NonZero's output has a data-dependent dim: counted (as 1) in tensors_without_size, by the op that
    makes it. The importer used to hand a plain count where the assembly reads a {type: count}, and failed."""
    x = ops.parameter([2, 3], np.float32, name="x")
    nonzero = ops.non_zero(x, "i64")
    path = tmp_path / "nz.xml"
    ov.save_model(ov.Model([ops.result(ops.convert(nonzero, "f32"))], [x], "nz"), str(path), compress_to_fp16=False)
    graph = import_openvino_ir(str(path))
    assert graph.meta["unsized_tensors_by_op"] == {"Convert": 1, "NonZero": 1}
    assert graph.meta["tensors_without_size"] == 2


def _both(path: str):
    """The ONNX model ``_ir_of`` converted beside ``path``, imported by each importer: (onnx, openvino)."""
    from graphs.inference.onnx_import import import_onnx

    return import_onnx(str(Path(path).with_suffix(".onnx"))), import_openvino_ir(path)


def test_importers_agree__a_loops_scan_outputs_and_their_reader(tmp_path):
    """loop (M = 5): y, and ys stacking Relu(h2) (5,2,4); Neg(ys). OpenVINO sizes ys by the trip count; the ONNX
    importer counted its symbolic leading dim as 1, one iteration's bytes, and the Neg's FLOPs with them."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["h2"]), helper.make_node("Relu", ["h2"], ["r"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [VALUE("i", TensorProto.INT64, []), VALUE("cond_in", TensorProto.BOOL, []),
         VALUE("h", TensorProto.FLOAT, [2, 4])],
        [VALUE("cond_out", TensorProto.BOOL, []), VALUE("h2", TensorProto.FLOAT, [2, 4]),
         VALUE("r", TensorProto.FLOAT, [2, 4])])
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], name="loop", body=body),
             helper.make_node("Neg", ["ys"], ["z"], name="neg")]
    path = _ir_of(tmp_path, nodes, [VALUE("x", TensorProto.FLOAT, [2, 4])],
                  [VALUE("y", TensorProto.FLOAT, [2, 4]), VALUE("z", TensorProto.FLOAT, ["T", 2, 4])],
                  [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
                   numpy_helper.from_array(np.array(5, np.int64), "M")])
    onnx_graph, openvino_graph = _both(path)
    assert openvino_graph.op_kinds.tolist() == ["Loop", "Multiply"]  # Neg: a Multiply by -1
    for graph in (onnx_graph, openvino_graph):
        assert graph.flops.tolist() == [5 * (2 * 8 * 4 + 8), 5 * 8]
        assert graph.out_bytes.tolist() == [(8 + 5 * 8) * F32, 5 * 8 * F32]
        assert graph.edge_bytes.tolist() == [5 * 8 * F32]


def _nonzero_scan_ir(tmp_path, with_xs: bool) -> str:
    """s (4) carried over the rows of ft, the transpose of Cast(NonZero(mask (2,3))), (?, 2): its scan axis is
    data-dependent; and, ``with_xs``, over those of xs (2,3), as long, which says 2. Body: ReduceSum(the row of
    ft) -> t (1); with xs, MatMul(its row, W (3,4)) + t; s + that."""
    body_nodes = [helper.make_node("ReduceSum", ["fs"], ["t"], keepdims=1)]
    body_nodes += [helper.make_node("MatMul", ["xt", "W"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"]),
                   helper.make_node("Add", ["s", "a"], ["s2"])] if with_xs else [
        helper.make_node("Add", ["s", "t"], ["s2"])]
    body = helper.make_graph(body_nodes + [helper.make_node("Identity", ["s2"], ["o"])], "scan_body",
                             [VALUE("s", TensorProto.FLOAT, [4]), VALUE("fs", TensorProto.FLOAT, None)]
                             + ([VALUE("xt", TensorProto.FLOAT, None)] if with_xs else []),
                             [VALUE("s2", TensorProto.FLOAT, [4]), VALUE("o", TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Transpose", ["f"], ["ft"], perm=[1, 0]),
             helper.make_node("Scan", ["s0", "ft"] + (["xs"] if with_xs else []), ["s_last", "os"], name="scan",
                              body=body, num_scan_inputs=2 if with_xs else 1)]
    return _ir_of(tmp_path, nodes, [VALUE("mask", TensorProto.FLOAT, [2, 3]), VALUE("s0", TensorProto.FLOAT, [4])]
                  + ([VALUE("xs", TensorProto.FLOAT, [2, 3])] if with_xs else []),
                  [VALUE("s_last", TensorProto.FLOAT, [4]), VALUE("os", TensorProto.FLOAT, ["T", 4])],
                  [numpy_helper.from_array(np.ones((3, 4), np.float32), "W")] if with_xs else [])


def test_importers_agree__a_scan_whose_first_input_has_an_unsized_scan_axis_runs_as_long_as_another(tmp_path):
    """2 iterations, read from xs; the ONNX importer read the first scan input alone, and left the Scan uncosted
    for its unsized dim. A row of ft has 2 elements: ReduceSum 2, MatMul 2 x 4 x 3, two Adds 4 each."""
    onnx_graph, openvino_graph = _both(_nonzero_scan_ir(tmp_path, with_xs=True))
    assert openvino_graph.op_kinds.tolist()[-1] == "TensorIterator"
    for graph in (onnx_graph, openvino_graph):
        assert graph.flops.tolist()[-1] == 2 * (2 + 2 * 4 * 3 + 4 + 4)
        assert graph.meta["ops_without_flops"] == {} and "bodies_not_costed" not in graph.meta


def test_importers_agree__a_scan_of_unknown_length_is_not_costed_and_says_why(tmp_path):
    onnx_graph, openvino_graph = _both(_nonzero_scan_ir(tmp_path, with_xs=False))
    assert onnx_graph.meta["bodies_not_costed"] == {"scan": "Scan: the length of its scan inputs is not known "
                                                            "statically"}
    assert openvino_graph.meta["bodies_not_costed"] == {"os": "TensorIterator: OpenVINO gives no static iteration "
                                                              "count (its sliced inputs' length is not static)"}
    for graph, kind in ((onnx_graph, "Scan"), (openvino_graph, "TensorIterator")):
        assert graph.flops.tolist()[-1] == 0.0 and graph.meta["ops_without_flops"] == {kind: 1}
