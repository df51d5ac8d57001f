"""ONNX ``Constant`` nodes as weights, not ops.

An exporter may write a weight as an initializer or as a ``Constant`` node holding the same tensor (older
torch.onnx exports, and every shape constant of a BERT export). OpenVINO reads either as a Constant, which
graphs.inference.openvino_import counts as parameter bytes of its first reader; counting the ONNX node as an
op of no parameters made the two importers disagree on one model and gave the placer ops that run no kernel.
So a default-domain Constant is read as an initializer: its tensor (``value``, or the tensor ``value_float``,
``value_ints``, ... stand for) is weight bytes of each node that reads it and ``param_bytes`` of the first,
and not an op. The OpenVINO measurer's matching of ONNX nodes to ops (measurers.openvino.onnx_ops) leaves
them out by the same test. So are the nodes no graph output depends on (graphs.inference.onnx_live), which
OpenVINO's reader leaves out: ``op_nodes`` is what both the importer and the measurer count as the ops.
"""

from __future__ import annotations

from typing import NamedTuple

from graphs.inference.onnx_live import live_indices

DEFAULT_DOMAINS = ("", "ai.onnx")


class ConstantTensor(NamedTuple):
    """What the importer needs of a Constant's tensor, as of an initializer's (a TensorProto's fields)."""

    dims: tuple[int, ...]
    data_type: int  # onnx.TensorProto.DataType


def is_constant(node) -> bool:
    """A default-domain Constant node: a weight, not an op."""
    return node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS


def op_indices(graph) -> list[int]:
    """The indices in ``graph.node`` of the nodes that are ops, in order: those a graph output depends on
    (graphs.inference.onnx_live), Constants aside."""
    return [i for i in live_indices(graph) if not is_constant(graph.node[i])]


def op_nodes(graph) -> list:
    """The nodes of ``graph`` that are ops, in order: every node a graph output depends on but its Constants."""
    return [graph.node[i] for i in op_indices(graph)]


def constant_tensors(graph) -> dict[str, ConstantTensor]:
    """{output tensor name: its tensor's dims and type} of ``graph``'s Constant nodes (not its bodies')."""
    return {node.output[0]: _tensor_of(node) for node in graph.node
            if is_constant(node) and node.output and node.output[0]}


def _tensor_of(node) -> ConstantTensor:
    """The tensor a Constant holds, whichever attribute holds it; a STRING one has no fixed bytes (0)."""
    from onnx import AttributeProto, TensorProto

    scalars = {AttributeProto.FLOAT: TensorProto.FLOAT, AttributeProto.INT: TensorProto.INT64,
               AttributeProto.STRING: TensorProto.STRING}  # value_float, value_int, value_string
    vectors = {AttributeProto.FLOATS: TensorProto.FLOAT, AttributeProto.INTS: TensorProto.INT64,
               AttributeProto.STRINGS: TensorProto.STRING}  # value_floats, value_ints, value_strings
    for attribute in node.attribute:
        if attribute.type == AttributeProto.TENSOR:  # value
            return ConstantTensor(tuple(attribute.t.dims), attribute.t.data_type)
        if attribute.type == AttributeProto.SPARSE_TENSOR:  # sparse_value: the dense tensor it stands for
            return ConstantTensor(tuple(attribute.sparse_tensor.dims), attribute.sparse_tensor.values.data_type)
        if attribute.type in scalars:
            return ConstantTensor((), scalars[attribute.type])
        if attribute.type in vectors:
            values = {AttributeProto.FLOATS: attribute.floats, AttributeProto.INTS: attribute.ints,
                      AttributeProto.STRINGS: attribute.strings}[attribute.type]
            return ConstantTensor((len(values),), vectors[attribute.type])
    return ConstantTensor((0,), TensorProto.UNDEFINED)  # no value: onnx's checker refuses such a node
