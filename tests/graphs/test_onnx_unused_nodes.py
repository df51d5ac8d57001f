"""ONNX nodes no graph output depends on are left out, as OpenVINO's reader leaves them out, and so are the
weights only they read (or none reads) from ``num_params``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphs.errors import PlacerError
from graphs.inference.onnx_import import import_onnx

value = helper.make_tensor_value_info


def _save(tmp_path, nodes, inputs, outputs, initializers=()) -> str:
    graph = helper.make_graph(nodes, "dead", inputs, outputs, list(initializers))
    path = tmp_path / "dead.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _reviewers_model(tmp_path) -> str:
    """MatMul -> Where (the output); a Relu of the MatMul's output that nothing reads; a weight nothing reads."""
    weights = [numpy_helper.from_array(np.ones((3, 3), np.float32), "w"),
               numpy_helper.from_array(np.ones(1000, np.float32), "unused")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["dead"]),
             helper.make_node("Where", ["c", "y", "x"], ["z"])]
    return _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 3]), value("c", TensorProto.BOOL, [2, 3])],
                 [value("z", TensorProto.FLOAT, [2, 3])], weights)


def test_import_onnx__a_node_no_output_depends_on_is_left_out_and_said_once(tmp_path, capsys):
    graph = import_onnx(_reviewers_model(tmp_path))
    assert graph.op_names.tolist() == ["MatMul_0", "Where_2"]  # the kept ones keep their names
    assert list(zip(graph.edge_src.tolist(), graph.edge_dst.tolist())) == [(0, 1)]
    assert (graph.meta["unused_nodes"], graph.meta["unused_nodes_by_op"]) == (1, {"Relu": 1})
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("placer:")]
    assert len(notes) == 1 and "1 node(s) no graph output depends on left out" in notes[0]
    assert notes[0].endswith("Relu (1)")


def test_import_onnx__params_count_the_weights_the_ops_read_as_param_bytes_do(tmp_path):
    graph = import_onnx(_reviewers_model(tmp_path))
    assert graph.num_params == 9 and int(graph.param_bytes.sum()) == 9 * 4


def test_openvino_matches_every_op_of_a_model_with_a_node_no_output_depends_on(tmp_path):
    """What ``placer measure --measurer openvino`` matches before measuring: it said "1 ops are not nodes"."""
    ov = pytest.importorskip("openvino")
    from measurers.openvino.affinity import match_ops
    from measurers.openvino.onnx_ops import onnx_tensor_ops

    path = _reviewers_model(tmp_path)
    graph = import_onnx(path)
    matched = match_ops(ov.Core().read_model(path), graph, path, onnx_tensor_ops(graph, path))
    assert sorted(set(matched.values())) == [0, 1]


def test_import_onnx__a_side_output_nothing_reads_keeps_its_node_but_a_chain_to_nowhere_goes(tmp_path):
    """The Split makes the output's half and one nothing reads: it runs. Neg -> NonZero leads nowhere: neither
    runs, and the NonZero's output of unknown length is no tensor without a size."""
    split = numpy_helper.from_array(np.array([2, 2], np.int64), "halves")
    nodes = [helper.make_node("Split", ["x", "halves"], ["left", "right"], name="split", axis=1),
             helper.make_node("Relu", ["left"], ["y"], name="relu"),
             helper.make_node("Neg", ["right"], ["negated"], name="neg"),
             helper.make_node("NonZero", ["negated"], ["where"], name="nonzero")]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 4])], [value("y", TensorProto.FLOAT, [2, 2])],
                 [split])
    graph = import_onnx(path)
    assert graph.op_names.tolist() == ["split", "relu"]
    assert graph.out_bytes.tolist() == [2 * 2 * 4 * 2, 2 * 2 * 4]  # both halves: the Split writes them
    assert graph.meta["unused_nodes_by_op"] == {"Neg": 1, "NonZero": 1}
    assert "tensors_without_size" not in graph.meta


def _branch(name: str, nodes: list, output: str, initializers=()):
    return helper.make_graph(nodes, name, [], [value(output, TensorProto.FLOAT, [4])], list(initializers))


def test_import_onnx__a_body_node_no_body_output_depends_on_is_left_out_with_what_only_it_reads(tmp_path):
    """The then branch's Add reads the outer Neg's output and the branch's own 100 floats, and nothing reads
    it: the Add, the Neg (nothing else reads it) and the 100 floats go; the If keeps the Relu's edge. An If
    whose output nothing reads goes whole."""
    own = numpy_helper.from_array(np.ones(100, np.float32), "own")
    then = _branch("then", [helper.make_node("Add", ["negated", "own"], ["unread"], name="add"),
                            helper.make_node("Mul", ["h", "h"], ["then_out"], name="square")], "then_out", [own])
    other = _branch("else", [helper.make_node("Identity", ["h"], ["else_out"])], "else_out")
    spare = _branch("spare", [helper.make_node("Identity", ["h"], ["spare_out"])], "spare_out")
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"), helper.make_node("Neg", ["x"], ["negated"]),
             helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=then, else_branch=other),
             helper.make_node("If", ["flag"], ["never"], name="unread_if", then_branch=spare, else_branch=other)]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [4]), value("flag", TensorProto.BOOL, [])],
                 [value("y", TensorProto.FLOAT, [4])])
    graph = import_onnx(path)
    assert graph.op_names.tolist() == ["relu", "choose"]
    assert list(zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist())) == [(0, 1, 16)]
    assert graph.flops[1] == 4  # the Mul: not the Add
    assert graph.num_params == 0 and graph.param_bytes.tolist() == [0, 0]
    assert graph.meta["unused_nodes_by_op"] == {"Add": 1, "If": 1, "Neg": 1}


def test_import_onnx__a_loop_body_node_feeding_only_its_condition_or_carried_value_is_kept(tmp_path):
    """A Loop body's outputs are its condition and carried values: what makes them runs every trip; its Neg,
    which makes neither, does not."""
    one = numpy_helper.from_array(np.ones(4, np.float32), "one")
    body = helper.make_graph(
        [helper.make_node("Add", ["v", "one"], ["v_out"], name="step"),
         helper.make_node("Not", ["cond_in"], ["flipped"]), helper.make_node("Not", ["flipped"], ["cond_out"]),
         helper.make_node("Neg", ["v"], ["unread"], name="neg")],
        "body", [value("i", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
                 value("v", TensorProto.FLOAT, [4])],
        [value("cond_out", TensorProto.BOOL, []), value("v_out", TensorProto.FLOAT, [4])])
    trips = numpy_helper.from_array(np.array(3, np.int64), "M")
    keep_going = numpy_helper.from_array(np.array(True), "go")
    nodes = [helper.make_node("Loop", ["M", "go", "x"], ["y"], name="loop", body=body)]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [4])], [value("y", TensorProto.FLOAT, [4])],
                 [trips, keep_going, one])
    graph = import_onnx(path)
    assert graph.op_names.tolist() == ["loop"] and graph.meta["unused_nodes_by_op"] == {"Neg": 1}
    assert graph.num_params == 4 and graph.param_bytes.tolist() == [4 * 4 + 8 + 1]  # one, M (int64), go (bool)


def test_import_onnx__a_model_no_node_of_which_makes_an_output_is_refused(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["unread"]), helper.make_node("Constant", [], ["k"], value_float=1.0)]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [4])], [value("x", TensorProto.FLOAT, [4])])
    with pytest.raises(PlacerError, match=r"dead.onnx: no graph output depends on any of its nodes \(Constants "
                                          r"aside\), so none would run$"):
        import_onnx(path)
