"""How long the sequences a SequenceMap maps are, followed through the ops that make sequences."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graphs.inference.onnx_trips import sequence_lengths
from graphs.inference.shape_folding import known_values, tensor_dims


def _lengths(nodes, initializers=()) -> dict[str, int]:
    """The sequence lengths of a graph of ``nodes`` reading a (5,2), b (5,2), u (?,2), and k (4,) and step (),
    splits of unknown values."""
    value = helper.make_tensor_value_info
    inputs = [value("a", TensorProto.FLOAT, [5, 2]), value("b", TensorProto.FLOAT, [5, 2]),
              value("u", TensorProto.FLOAT, ["n", 2]), value("k", TensorProto.INT64, [4]),
              value("step", TensorProto.INT64, [])]
    graph = helper.make_graph(nodes, "sequences", inputs, [], list(initializers))
    return sequence_lengths(graph, known_values(graph), tensor_dims(graph))


def test_sequence_lengths__of_the_ops_that_make_sequences():
    node = helper.make_node
    lengths = _lengths([
        node("SequenceEmpty", [], ["empty"]),
        node("SequenceConstruct", ["a", "b"], ["pair"]),
        node("SequenceInsert", ["pair", "a"], ["three"]),
        node("SequenceErase", ["three"], ["two"]),
        node("Identity", ["two"], ["same"]),
        node("SplitToSequence", ["a"], ["rows"]),  # no split: one tensor per row of axis 0
        node("SplitToSequence", ["a"], ["columns"], axis=1),
        node("SplitToSequence", ["a", "two_rows"], ["by_two"]),  # a scalar split: 2, 2 and the 1 left
        node("SplitToSequence", ["a", "sizes"], ["by_sizes"]),  # a 1-D split: one tensor per entry
        node("SplitToSequence", ["a", "k"], ["by_unknown_sizes"]),  # its values unknown, not its length
        node("SequenceMap", ["by_two"], ["mapped"], body=helper.make_graph(
            [node("Neg", ["t"], ["n"])], "negate", [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("n", TensorProto.FLOAT, None)])),
    ], [numpy_helper.from_array(np.array(2, np.int64), "two_rows"),
        numpy_helper.from_array(np.array([1, 4], np.int64), "sizes")])
    assert lengths == {"empty": 0, "pair": 2, "three": 3, "two": 2, "same": 2, "rows": 5, "columns": 2, "by_two": 3,
                       "by_sizes": 2, "by_unknown_sizes": 4, "mapped": 3}


def test_sequence_lengths__unknown_where_the_split_axis_or_the_split_is():
    node = helper.make_node
    assert _lengths([node("SplitToSequence", ["u"], ["rows"]),  # u's rows: data-dependent
                     node("SequenceInsert", ["rows", "a"], ["more"]),
                     node("SplitToSequence", ["a", "step"], ["by_step"])]) == {}  # step: a graph input


def _appending_loop(run: list, trips: str = "five", initial: str = "pair"):
    """A Loop of ``trips`` runs carrying the sequence ``initial`` (s_in in its body, ``run``'s s_out after a run)
    into "after"; its condition passed through, as torch.onnx writes a for loop."""
    value = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]), *run], "run",
                             [value("i", TensorProto.INT64, []), value("c_in", TensorProto.BOOL, []),
                              helper.make_tensor_sequence_value_info("s_in", TensorProto.FLOAT, None)],
                             [value("c_out", TensorProto.BOOL, []),
                              helper.make_tensor_sequence_value_info("s_out", TensorProto.FLOAT, None)])
    return helper.make_node("Loop", [trips, "", initial], ["after"], body=body)


def test_sequence_lengths__a_loop_adds_what_each_run_of_its_body_inserts_times_its_trip_count():
    """A list appended in a loop: the initial pair, and per run two inserts (or an insert and an erase, or
    nothing) for five runs."""
    node = helper.make_node
    five = [numpy_helper.from_array(np.array(5, np.int64), "five")]
    pair = node("SequenceConstruct", ["a", "b"], ["pair"])
    runs = {12: [node("SequenceInsert", ["s_in", "a"], ["s_1"]), node("SequenceInsert", ["s_1", "b"], ["s_out"])],
            2: [node("SequenceInsert", ["s_in", "a"], ["s_1"]), node("SequenceErase", ["s_1"], ["s_out"])],
            7: [node("SequenceInsert", ["s_in", "a"], ["s_1"]), node("Identity", ["s_1"], ["s_out"])]}
    for length, run in runs.items():
        assert _lengths([pair, _appending_loop(run)], five)["after"] == length
    assert _lengths([pair, _appending_loop([node("Identity", ["s_in"], ["s_out"])])], five)["after"] == 2


def test_sequence_lengths__of_a_loop_unknown_for_a_trip_count_at_run_time_or_a_sequence_built_anew():
    node = helper.make_node
    pair, five = node("SequenceConstruct", ["a", "b"], ["pair"]), [numpy_helper.from_array(np.array(5, np.int64),
                                                                                            "five")]
    insert = [node("SequenceInsert", ["s_in", "a"], ["s_out"])]
    assert "after" not in _lengths([pair, _appending_loop(insert, trips="step")], five)  # step: a graph input
    assert "after" not in _lengths([node("SplitToSequence", ["u"], ["u_rows"]),  # its initial length unknown
                                    _appending_loop(insert, initial="u_rows")], five)
    anew = [node("SequenceConstruct", ["a"], ["s_out"])]  # the same length each run, but not the initial one's
    assert "after" not in _lengths([pair, _appending_loop(anew)], five)


def test_size_loop_carried_outputs__only_where_the_value_keeps_one_static_shape():
    """A Loop carrying "kept" (2,4 before and after a run), "grown" ((2,4) before, (4,4) after: Concat of it with
    itself) and "unknown" (its initial value's first dim not sized): only "kept" takes the shape."""
    from onnx import shape_inference

    from graphs.inference.onnx_trips import size_loop_carried_outputs

    value = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Neg", ["k_in"], ["k_out"]),
         helper.make_node("Concat", ["g_in", "g_in"], ["g_out"], axis=0), helper.make_node("Neg", ["u_in"], ["u_out"])],
        "run", [value("i", TensorProto.INT64, []), value("c_in", TensorProto.BOOL, []),
                value("k_in", TensorProto.FLOAT, [2, 4]), value("g_in", TensorProto.FLOAT, [2, 4]),
                value("u_in", TensorProto.FLOAT, [2, 4])],
        [value("c_out", TensorProto.BOOL, []), value("k_out", TensorProto.FLOAT, [2, 4]),
         value("g_out", TensorProto.FLOAT, [4, 4]), value("u_out", TensorProto.FLOAT, [2, 4])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["steps", "", "a", "a", "u"], ["kept", "grown", "unknown"], body=body),
         helper.make_node("Identity", ["kept"], ["k"]), helper.make_node("Identity", ["grown"], ["g"]),
         helper.make_node("Identity", ["unknown"], ["z"])], "loop",
        [value("steps", TensorProto.INT64, []), value("a", TensorProto.FLOAT, [2, 4]),
         value("u", TensorProto.FLOAT, ["n", 4])],
        [value("k", TensorProto.FLOAT, None), value("g", TensorProto.FLOAT, None), value("z", TensorProto.FLOAT, None)])
    model = shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert size_loop_carried_outputs(model.graph)
    assert tensor_dims(model.graph)["kept"] == (2, 4)
    assert tensor_dims(model.graph).get("grown") in (None, ())
    assert tensor_dims(model.graph).get("unknown") in (None, ())
