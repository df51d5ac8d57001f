"""The graph's recorded bytes against the model file's, op by op: a model changed since the import is refused.

``match_ops`` matches ops to nodes by name and type only, so a file re-exported to the same path with wider
layers (same node and tensor names) was timed and reported as the imported graph, status ok (a review: 5x
the step). ``check_sizes`` compares, for each op, what the graph recorded at import with what the model the
measurer read from the file gives, after the measurer sized its inputs as the import did (``meta
["input_shapes"]``, graphs.inference.openvino_import.size_inputs), before anything compiles:

- output bytes (``out_bytes``): each output's static shape times its element type's size. An IR op: its
  node's outputs that something reads (the importer's rule: MaxPool's unread indices are none); an ONNX op: its
  own output tensors (measurers.openvino.onnx_ops), found by name on OpenVINO's nodes.
- weights. An ONNX op: the weight bytes it owns (``param_bytes``), counted from the file as the importer
  counted them (the first op to list a weight owns it). An IR op: the bytes it reads (``bytes_accessed`` less
  ``out_bytes``: its inputs and weights, each distinct source once), what the importer summed per op; its
  rule of which reader owns a stored weight shared by several (data pointers, ShapeOf readers) is not redone.

Only what is reliably comparable is compared, so a correct pairing is never refused: an op with no node
(ONNX shape arithmetic OpenVINO folds at the sized inputs, an elided Identity or Dropout) has no outputs to
compare; nor has an output of a dynamic shape, or of an element type without a whole byte size (string, u4),
or (ONNX) one OpenVINO's reader dropped (an unread mask); nor an ONNX op of a type some output of which the
import could not size (``meta["unsized_tensors_by_op"]``: it counted a symbolic dim as 1, an unknown shape as
0 bytes) or a sequence copy (flops.SEQUENCE_COPIES: its out bytes are its tensor side's). The weights of an
ONNX graph with subgraph ops (their bodies read weights they do not list) and an IR subgraph op's reads (its
bytes accessed are its bodies') are not compared either. The model is compared as read, before
``compile_model``: the plugins' fusions and precisions come after. A float16-compressed IR's weights are read
through their decompression Converts, in f32, as the importer counted them.
"""

from __future__ import annotations

from typing import Iterator

from graphs.errors import PlacerError
from graphs.inference.flops import SEQUENCE_COPIES
from graphs.inference.openvino_import import SUBGRAPH_OPS as IR_SUBGRAPH_OPS
from graphs.opgraph import OpGraph
from measurers.openvino.onnx_ops import OnnxOps

# (op, what the model has, as a template for its bytes, those bytes or None: not comparable, the graph's bytes)
Sizes = Iterator[tuple[int, str, int | None, int]]


def check_sizes(model, graph: OpGraph, model_file: str, matched: dict[str, int], onnx: OnnxOps | None) -> None:
    """PlacerError naming the first op (in graph order) whose bytes in ``model`` (the ``ov.Model`` read from
    ``model_file`` and sized) differ from those ``graph`` records; ``matched`` is ``match_ops``'s answer,
    ``onnx`` the file's ONNX ops (None for an IR)."""
    sizes = _ir_sizes(model, graph, matched) if onnx is None else _onnx_sizes(model, graph, matched, onnx)
    for op, what, found, recorded in sizes:
        if found is not None and found != recorded:
            raise PlacerError(f"graph {graph.name!r} does not match model file {model_file!r}: its op "
                              f"{graph.op_names[op]!r} {what.format(f'{found:,}')}, {recorded:,} in the graph "
                              "(the model changed since the import?)")


def _ir_sizes(model, graph: OpGraph, matched: dict[str, int]) -> Sizes:
    """Each matched op's used outputs, then (a subgraph op aside) its distinct sources."""
    node_of = {matched[node.get_name()]: node for node in model.get_ordered_ops() if node.get_name() in matched}
    for op in sorted(node_of):
        node, out_bytes = node_of[op], int(graph.out_bytes[op])
        yield op, "outputs {} bytes", _total([out for out in node.outputs() if out.get_target_inputs()]), out_bytes
        if graph.op_kinds[op] not in IR_SUBGRAPH_OPS:
            read_bytes = int(graph.bytes_accessed[op]) - out_bytes
            yield op, "reads {} bytes (inputs and weights)", _total(_distinct_sources(node)), read_bytes


def _onnx_sizes(model, graph: OpGraph, matched: dict[str, int], onnx: OnnxOps) -> Sizes:
    """Each op's own output tensors where it has a node and the import sized its type, then its owned weights."""
    tensors = _tensor_bytes(model)
    has_node = set(matched.values())
    unsized = set(graph.meta.get("unsized_tensors_by_op", {})) | set(SEQUENCE_COPIES)
    for op in range(graph.num_ops):
        if op in has_node and graph.op_kinds[op] not in unsized:
            found = [tensors.get(tensor) for tensor in onnx.outputs[op]]
            yield op, "outputs {} bytes", None if None in found else sum(found), int(graph.out_bytes[op])
        if onnx.param_bytes is not None:
            yield op, "holds {} bytes of weights", onnx.param_bytes[op], int(graph.param_bytes[op])


def _tensor_bytes(model) -> dict[str, int | None]:
    """Tensor name -> its bytes (None: not comparable), for every named output of the model's nodes (a name on
    two outputs keeps the first's, in topological order: the producer's)."""
    found: dict[str, int | None] = {}
    for node in model.get_ordered_ops():
        for output in node.outputs():
            size = _bytes(output)
            for name in output.get_names():
                found.setdefault(name, size)
    return found


def _total(outputs: list) -> int | None:
    sizes = [_bytes(output) for output in outputs]
    return None if None in sizes else sum(sizes)


def _bytes(output) -> int | None:
    """An output's bytes (its elements times its element type's size); None for a dynamic shape or an element
    type without a whole byte size. The tensor descriptor's ``size`` says it in one call: ``math.prod`` over
    an ``ov.Shape`` read its dims one binding call each, 15 ms for inception-v3-infer's 564 outputs."""
    if output.get_partial_shape().is_dynamic or not _whole_bytes(output.get_element_type()):
        return None
    return int(output.get_tensor().size)


def _whole_bytes(kind) -> bool:
    """An element type of a fixed whole number of bytes: not u4 or u1, nor a string (0 bytes to the ONNX
    importer, a std::string's size to OpenVINO), nor a dynamic one."""
    return not (kind.is_dynamic() or kind.bitwidth % 8 or kind.get_type_name() == "string")


def _distinct_sources(node) -> list:
    """The outputs ``node`` reads, each once (``Multiply(y, y)`` reads y once), as the importer counts them."""
    return list(dict.fromkeys(node.input_values()))  # an ov.Output hashes and compares as (node, index)
