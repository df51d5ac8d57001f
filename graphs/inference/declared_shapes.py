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
model whose declarations agree with its inputs is inferred as before. A Reshape's output declared with another
number of elements than its input holds (its target computed at run time through an op no folding knows) is
no hint: it was written at the export's sizes, and so were the declarations of what is computed from it;
those stay unsized, and counted so. Whether the inputs alone left a node
output unsized is what tells the importer to ask onnx's strict inference for a conflict (shape_conflict): a
declaration must not hide sizes the model cannot take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from graphs.inference.shape_folding import (bodies, graphs_within, infer_with_folded_shapes, static_dim,
                                            static_shapes)


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
    stale = _computed_from(from_inputs.graph, _stale_reshape_declarations(from_inputs.graph, declared))
    hints = [_hints({name: type_ for name, type_ in graph_declared.items() if name not in stale},
                    _inferred_types(inferred))
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


def _stale_reshape_declarations(graph, declared: list[dict]) -> set[str]:
    """The outputs of the Reshapes of ``graph`` (inferred from the inputs' sizes) and its bodies that the inputs'
    sizes left unsized (a target computed at run time through an op neither onnx nor
    graphs.inference.shape_folding folds) and whose declared shape holds another number of elements than the
    Reshape's input: written at the export's sizes. Such a declaration sized the output, and the ops after it,
    at the export's batch; left out, the output stays unsized, and counted so."""
    shapes = {name: dims for body in graphs_within(graph) for name, dims in static_shapes(body).items()}
    declared_dims = {name: _declared_size(value_type) for graph_declared in declared
                     for name, value_type in graph_declared.items()}
    return {node.output[0] for body in graphs_within(graph) for node in body.node
            if node.op_type == "Reshape" and node.input and node.output and node.input[0] in shapes
            and node.output[0] not in shapes
            and declared_dims.get(node.output[0]) not in (None, math.prod(shapes[node.input[0]]))}


def _computed_from(graph, tensors: set[str]) -> set[str]:
    """``tensors`` and every tensor of ``graph`` and its bodies computed from them (a subgraph op's outputs
    from anything its bodies read or give back): their declarations were written from the stale ones."""
    reached, graphs = set(tensors), graphs_within(graph)
    while reached:
        count = len(reached)
        for body in graphs:
            reached.update(out for node in body.node if not reached.isdisjoint(_reads_within(node))
                           for out in node.output if out)
        if len(reached) == count:
            break
    return reached


def _reads_within(node) -> set[str]:
    """What a node reads: its inputs, and its bodies' nodes' inputs and its bodies' outputs (nested ones' too)."""
    reads = set(node.input)
    for body in bodies(node):
        reads.update(value.name for value in body.output)
        for inner in body.node:
            reads |= _reads_within(inner)
    return reads


def _declared_size(value_type) -> int | None:
    """The number of elements of a declared tensor type, None unless every dim has a size."""
    dims = value_type.tensor_type.shape.dim
    return math.prod(d.dim_value for d in dims) if all(static_dim(d) for d in dims) else None


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
