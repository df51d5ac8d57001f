"""The shapes an ONNX model declares for its intermediate tensors and outputs (``value_info``, the outputs'
types, the same inside subgraph bodies) are hints written at the sizes it was exported at, not facts at the
sizes it is imported at.

An export at batch 1 whose input was made dynamic afterwards (``onnx.tools.update_model_dims``, or a tool
that annotates shapes, run at batch 1) still declares its intermediates at batch 1. onnx's lenient inference
keeps a declaration that contradicts what it infers (the node's inference fails, the declaration stays, and
the nodes after it read it), so at ``--input-shape x=32,...`` every op was costed at batch 1.

``infer_preferring_inputs`` infers from the inputs' sizes alone first (graphs.inference.shape_folding, every
such declaration set aside; a body's inputs, a Loop's carried values, keep theirs: onnx needs them); a
declaration then gives only what that leaves unknown (a dim without a size, the shape of an output of an op
onnx does not know) and the model is inferred once more from there, so the ops after it are sized too. A
model whose declarations agree with its inputs is inferred as before. Whether the inputs alone left a node
output unsized is what tells the importer to ask onnx's strict inference for a conflict (shape_conflict): a
declaration must not hide sizes the model cannot take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graphs.inference.shape_folding import graphs_within, infer_with_folded_shapes, static_dim, static_shapes


@dataclass(frozen=True)
class Inference:
    model: object  # the inferred onnx ModelProto the importer reads
    unsized_from_inputs: bool  # whether the inputs' sizes alone left a node output without a full shape (maybe
    # sizes the model cannot take: where onnx's strict inference is asked which node says so)


def infer_preferring_inputs(model, infer: Callable = infer_with_folded_shapes) -> Inference:
    """``model`` (its inputs sized) inferred by ``infer`` from its inputs' sizes, a declared shape filling in
    only what they leave unknown. ``model``'s declarations are replaced (in place) by the ones that filled
    something in."""
    graphs = graphs_within(model.graph)
    declared = [_take_declarations(graph) for graph in graphs]
    from_inputs = infer(model)
    unsized = _has_unsized_outputs(from_inputs.graph)
    hints = [_hints(graph_declared, _inferred_types(inferred))
             for graph_declared, inferred in zip(declared, graphs_within(from_inputs.graph))]
    if not any(hints):
        return Inference(from_inputs, unsized)
    del from_inputs  # its copy of the weights, before the next inference makes another
    for graph, graph_hints in zip(graphs, hints):
        _declare(graph, graph_hints)
    return Inference(infer(model), unsized)


def _has_unsized_outputs(graph) -> bool:
    """Whether a node of ``graph`` (an inferred one) has an output whose shape is not fully sized."""
    sized = static_shapes(graph)
    return any(tensor and tensor not in sized for node in graph.node for tensor in node.output)


def _take_declarations(graph) -> dict:
    """{tensor: declared type} of the graph's value_info and outputs with a tensor shape: the value_info of
    those is removed, and the outputs keep their element type only."""
    declared = {value.name: _copied(value.type) for value in [*graph.value_info, *graph.output]
                if _has_shape(value.type)}
    kept = [value for value in graph.value_info if value.name not in declared]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    for value in graph.output:
        if _has_shape(value.type):
            value.type.tensor_type.ClearField("shape")
    return declared


def _inferred_types(graph) -> dict:
    return {value.name: value.type for value in [*graph.value_info, *graph.output]}


def _hints(declared: dict, inferred: dict) -> dict:
    """{tensor: its inferred type with what its declaration adds}, for the tensors whose declaration adds
    something; a declaration of another rank than the inferred shape adds nothing."""
    hints = {}
    for name, declared_type in declared.items():
        inferred_type = inferred.get(name)
        if inferred_type is None or not _has_shape(inferred_type):
            hint = _copied(declared_type)
            if inferred_type is not None and inferred_type.tensor_type.elem_type:
                hint.tensor_type.elem_type = inferred_type.tensor_type.elem_type
            hints[name] = hint
            continue
        dims = inferred_type.tensor_type.shape.dim
        declared_dims = declared_type.tensor_type.shape.dim
        if len(dims) != len(declared_dims):
            continue
        filled = [axis for axis, (dim, hint_dim) in enumerate(zip(dims, declared_dims))
                  if not static_dim(dim) and (static_dim(hint_dim) or (hint_dim.dim_param and not dim.dim_param))]
        if filled:
            hint = _copied(inferred_type)
            for axis in filled:
                hint.tensor_type.shape.dim[axis].CopyFrom(declared_dims[axis])
            hints[name] = hint
    return hints


def _declare(graph, hints: dict) -> None:
    """The hints as the graph's declarations: an output's type, any other tensor's value_info."""
    outputs = {value.name: value for value in graph.output}
    for name, hint in hints.items():
        if name in outputs:
            outputs[name].type.CopyFrom(hint)
        else:
            graph.value_info.add(name=name).type.CopyFrom(hint)


def _has_shape(value_type) -> bool:
    return value_type.HasField("tensor_type") and value_type.tensor_type.HasField("shape")


def _copied(value_type):
    copy = type(value_type)()
    copy.CopyFrom(value_type)
    return copy
