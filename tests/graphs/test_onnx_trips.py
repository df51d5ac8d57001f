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
