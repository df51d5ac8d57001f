"""ONNX shape inference, helped through the shape arithmetic the onnx package's data propagation leaves unknown.

Older torch.onnx exports (e.g. BERT's attention) compute a Reshape's target at run time from its input's
shape: ``Shape -> Gather -> (Div by the head count) -> Unsqueeze -> Concat -> Reshape``. onnx 1.23's
inference reads such a computed target only from Reshape-14 on (Reshape-5 and -13 leave even the output's
rank unknown), and its data propagation does not cover Div, so those tensors came out unsized. So with an
expand to sizes read at run time (a ViT's ``token.expand(x.size(0), -1, -1)``): torch.onnx stacks the sizes
(``Concat -> Reshape`` to [-1]) and makes each -1 a 1 (``Equal`` to -1, ``Where``), none of which it propagates.
Nor does it cover what torch 2.13's TorchScript exporter writes for a floor division of a size
(``torch.div(n, 2, rounding_mode="floor")``: Div, then a fix-up on the signs through Less, Xor, Mod, Equal,
Not, And and Where), a ``repeat_interleave`` by a size (a OneHot as Tile's repeats), a ``clamp`` of one (Clip)
or an ``F.pad`` by a computed amount (``(4 - n % 4) % 4``: Mod, then the pads transposed into ONNX's order).

``infer_with_folded_shapes`` infers as the importer always did; then, while a shape-taking input
(``TARGET_INPUTS``: Reshape's target, Expand's and Tile's, Slice's starts and axes, Pad's pads, TopK's K,
which torch.onnx reads from the shape for a ``torch.sort`` even at fixed sizes, ...) of a node
whose output is still not fully sized has a value numpy can compute from what is known (static shapes, small
initializers, Constants) through the ops of ``FOLDERS``, it gives that input its value as an initializer on a
slimmed copy of the model (of the node's own graph, a subgraph body's too: onnx's inference of a body sees the outer
graph's tensors' types and the values its data propagation computed, not the outer initializers' or Constants'
values, which torch.onnx hoists out of a Loop body, e.g. a Slice's axes) and infers again (at most
``MAX_ROUNDS`` times: a chain that starts from a tensor sized in the previous round, like the next layer's,
takes one round each). The importer still reads the model's own nodes: only the
inferred value_info and output types come from the copy. A model with no such input is left exactly as the
first inference gave it.

``shape_conflict`` asks onnx's strict inference which node's input shapes contradict each other (sizes given
to a U-Net that its pooled and upsampled halves no longer match), which the lenient one leaves unsized.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np

from graphs.opgraph import unique_name

TARGET_INPUTS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
                 "Slice": (1, 2, 3, 4), "Pad": (1, 3), "TopK": (1,)}
MAX_ROUNDS = 64  # one round a layer whose chain starts from the previous layer's output
MAX_ELEMENTS = 1024  # a value (or initializer) larger than this is no shape: neither read nor computed
DEFAULT_DOMAINS = ("", "ai.onnx")


class _Unknown(Exception):
    """An input of a folded node has no known value (or the op is used in a way not folded)."""


def infer_with_folded_shapes(model):
    """``onnx.shape_inference.infer_shapes(model, data_prop=True)``, with the shape-taking inputs whose values
    can be folded given those values (see the module docstring); ``model`` itself is not changed."""
    from onnx.shape_inference import infer_shapes

    inferred = infer_shapes(model, data_prop=True)
    folded, targets = inferred, {}
    for _ in range(MAX_ROUNDS):
        found = _new_targets(folded.graph, targets)
        if not found:
            break
        targets.update(found)
        folded = infer_shapes(_slim_copy(model, targets), data_prop=True)
    if targets:
        for graph, folded_graph in zip(graphs_within(inferred.graph), graphs_within(folded.graph)):
            _take_types(graph, folded_graph)
    return inferred


@dataclass(frozen=True)
class ShapeConflict:
    """A node whose input shapes contradict each other (or its own checks), as onnx's inference says it."""
    op_type: str
    node_name: str  # "" for a node without a name
    reason: str


# one error of onnx's strict inference: "(op_type:Concat, node name: cat): [ShapeInferenceError] Can't merge ...",
# "(op_type:Add): [ShapeInferenceError] ..." for a node without a name
_INFERENCE_ERROR = re.compile(r"\(op_type:([^,)]*)(?:, node name: ([^)]*))?\): \[(\w+)\] ([^\n]*)")


def shape_conflict(model) -> ShapeConflict | None:
    """The first node whose shapes contradict each other at ``model``'s input sizes (a Concat of tensors of
    different heights, an Add of sizes that do not broadcast), from onnx's strict inference on a slimmed copy
    without the shapes the model declares for its intermediate tensors and outputs (an annotation written at
    other sizes, a batch of 1, contradicts the sizes given, yet onnxruntime and OpenVINO run the model);
    None when it reports none. An error that follows from another's (an input left without a type, a
    TypeInferenceError) is no conflict of its own."""
    from onnx.shape_inference import infer_shapes

    copy = _slim_copy(model, {})
    del copy.graph.value_info[:]
    for value in copy.graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")
    try:
        infer_shapes(copy, strict_mode=True, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - InferenceError, and whatever else a foreign library raises
        for op_type, name, kind, reason in _INFERENCE_ERROR.findall(str(exc)):
            if kind == "ShapeInferenceError":
                return ShapeConflict(op_type, name.strip(), reason.strip())
    return None


def reshape_conflict(graphs) -> ShapeConflict | None:
    """The first Reshape of the inferred ``graphs`` (a model's and its bodies) whose fixed target holds another
    number of elements than its input: a target written as a constant at the export's sizes (``[1, 20]``)
    where the input now has other sizes. onnx's inference takes the target as the output's shape without
    counting, so everything after it would be sized at the export's batch; onnxruntime and OpenVINO refuse
    to run it."""
    for body in graphs:
        shapes, values = static_shapes(body), known_values(body)
        for node in body.node:
            if node.op_type != "Reshape" or len(node.input) < 2 or not node.output or node.input[1] not in values:
                continue  # a target computed at run time: the output's shape may be a declaration, not the target
            source, target = shapes.get(node.input[0]), shapes.get(node.output[0])
            if source is not None and target is not None and math.prod(source) != math.prod(target):
                return ShapeConflict("Reshape", node.name, (
                    f"it reshapes {list(source)} ({math.prod(source)} elements) to the fixed shape {list(target)} "
                    f"({math.prod(target)} elements), written at the sizes the model was exported at: export it at "
                    f"these sizes, or with these axes dynamic"))
    return None


def _new_targets(graph, taken: dict) -> dict[tuple[int, int, int], np.ndarray]:
    """{(graph index in ``graphs_within``, node index, input index): value} of the shape-taking inputs, neither
    given yet nor constant already, whose value is now known and whose node's outputs are not all sized. Inside a
    subgraph body, a value read from the graphs around it counts as computed: onnx's inference of a body sees
    the outer tensors' types, not their values (a Loop body's Slice of an outer tensor, its axes an outer
    Constant, was left without a shape)."""
    found = {}
    for g, (body, values) in enumerate(_graphs_with_values(graph)):
        static = static_shapes(body)
        constants = {init.name for init in body.initializer} | {
            t for node in body.node if node.op_type == "Constant" for t in node.output}
        computed = values.keys() - constants
        for i, node in enumerate(body.node):
            positions = TARGET_INPUTS.get(node.op_type, ()) if node.domain in DEFAULT_DOMAINS else ()
            if not positions or all(out in static for out in node.output if out):
                continue
            for j in positions:
                if (g, i, j) not in taken and j < len(node.input) and node.input[j] in computed:
                    found[(g, i, j)] = values[node.input[j]]
    return found


def _graphs_with_values(graph, outer: dict | None = None):
    """(graph, its known values) for ``graph`` and every subgraph inside it, in ``graphs_within``'s order; a
    body's values include those of the graphs around it."""
    values = known_values(graph, outer)
    yield graph, values
    for node in graph.node:
        for body in bodies(node):
            yield from _graphs_with_values(body, values)


def _slim_copy(model, targets: dict):
    """A copy of ``model`` whose ``targets`` inputs read initializers (of their own graph) holding their values,
    and whose large
    initializers are graph inputs of the same type and shape (inference reads only their shapes: the copy
    is not the weights' size)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    large = [init for init in graph.initializer if math.prod(init.dims) > MAX_ELEMENTS]
    inputs = list(graph.input) + [helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                                  for init in large if init.name not in {value.name for value in graph.input}]
    copy_graph = helper.make_graph(graph.node, graph.name, inputs, graph.output,
                                   [init for init in graph.initializer if math.prod(init.dims) <= MAX_ELEMENTS],
                                   value_info=graph.value_info)
    names = set().union(*map(_all_names, graphs_within(graph)))
    copies = graphs_within(copy_graph)
    for (g, i, j), value in sorted(targets.items()):
        node = copies[g].node[i]
        name = unique_name(f"{node.input[j]}_folded", names)
        copies[g].initializer.append(numpy_helper.from_array(value, name))  # in the body of the node reading it
        node.input[j] = name
    return helper.make_model(copy_graph, opset_imports=model.opset_import, ir_version=model.ir_version,
                             functions=model.functions)


def _take_types(graph, folded_graph) -> None:
    """``graph``'s inferred value_info and output types become ``folded_graph``'s (the same tensors, a body's
    too; the initializers the copy added have no value_info)."""
    del graph.value_info[:]
    graph.value_info.extend(folded_graph.value_info)
    folded_outputs = {value.name: value for value in folded_graph.output}
    for value in graph.output:
        value.type.CopyFrom(folded_outputs[value.name].type)


def _all_names(graph) -> set[str]:
    return ({value.name for value in [*graph.input, *graph.output, *graph.value_info]}
            | {init.name for init in graph.initializer} | {t for node in graph.node for t in node.output})


def bodies(node) -> list:
    """The subgraphs a node holds (If's branches, Loop's, Scan's and SequenceMap's body, any other op's graph
    attributes)."""
    import onnx

    graphs = []
    for attribute in node.attribute:
        graphs += [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
    return graphs


def graphs_within(graph) -> list:
    """``graph`` and every subgraph inside it, nested ones included (the same order for a model and its
    inferred copy)."""
    return [graph] + [inner for node in graph.node for body in bodies(node) for inner in graphs_within(body)]


def static_dim(dim) -> bool:
    """Whether a dim has a size: a set ``dim_value``, 0 included (a zero-size tensor, 0 bytes, not unknown)."""
    return dim.HasField("dim_value") and dim.dim_value >= 0


def static_shapes(graph) -> dict[str, tuple[int, ...]]:
    """{tensor: shape} of every tensor whose dims are all sized."""
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    shapes.update((name, dims) for name, dims in _typed_dims(graph) if None not in dims)
    return shapes


def tensor_dims(graph) -> dict[str, tuple[int | None, ...]]:
    """{tensor: dims, None where not sized} of every tensor of known rank (a Scan's length may be known when
    another of its input's dims is not)."""
    dims = {init.name: tuple(init.dims) for init in graph.initializer}
    dims.update(_typed_dims(graph))
    return dims


def _typed_dims(graph):
    """(tensor, dims with None where not sized) of the graph's inputs, outputs and value_info of known rank,
    in that order."""
    for value in [*graph.input, *graph.output, *graph.value_info]:
        tensor_type = value.type.tensor_type if value.type.HasField("tensor_type") else None
        if tensor_type is not None and tensor_type.HasField("shape"):
            yield value.name, tuple(d.dim_value if static_dim(d) else None for d in tensor_type.shape.dim)


def known_values(graph, outer: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """{tensor: value} of the small initializers and of the outputs of FOLDERS' ops whose inputs are known,
    in the graph's (topological) node order; ``outer``: the values a subgraph body reads from the graphs
    around it (the importer reads a Loop's trip count and condition so)."""
    from onnx import numpy_helper

    values = dict(outer or {})
    values.update({init.name: numpy_helper.to_array(init) for init in graph.initializer
                   if math.prod(init.dims) <= MAX_ELEMENTS})
    shapes = static_shapes(graph)
    for node in graph.node:
        fold = FOLDERS.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        if fold is None or not node.output:
            continue
        try:
            value = np.asarray(fold(node, values, shapes))
        except (_Unknown, ValueError, IndexError, TypeError, ArithmeticError, KeyError):
            continue
        if value.size <= MAX_ELEMENTS:
            values[node.output[0]] = value
    return values


def _inputs(node, values: dict) -> list:
    """The node's input values; None for an omitted optional input; _Unknown if one is not known."""
    if any(t and t not in values for t in node.input):
        raise _Unknown(node.name)
    return [values[t] if t else None for t in node.input]


def _attribute(node, name: str, default=None):
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _constant(node, values, shapes):
    from onnx import numpy_helper

    kinds = {"value_int": np.int64, "value_ints": np.int64, "value_float": np.float32, "value_floats": np.float32}
    for attribute in node.attribute:
        if attribute.name == "value" and math.prod(attribute.t.dims) <= MAX_ELEMENTS:  # not a weight
            return numpy_helper.to_array(attribute.t)
        if attribute.name in kinds:
            return np.array(_attribute(node, attribute.name), kinds[attribute.name])
    raise _Unknown(node.name)  # sparse or string constants: never a shape


def _shape(node, values, shapes):
    source = node.input[0]
    shape = values[source].shape if source in values else shapes.get(source)
    if shape is None:
        raise _Unknown(node.name)
    start, end = _attribute(node, "start", 0), _attribute(node, "end", None)
    return np.array(shape[start:end], np.int64)


def _gather(node, values, shapes):
    data, indices = _inputs(node, values)
    return np.take(data, indices, axis=_attribute(node, "axis", 0))


def _axes(node, inputs: list):
    """Unsqueeze's and Squeeze's axes: an attribute up to opset 12, the second input from 13."""
    axes = _attribute(node, "axes")
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        axes = inputs[1].tolist()
    return axes


def _unsqueeze(node, values, shapes):
    inputs = _inputs(node, values)
    data, axes = inputs[0], _axes(node, inputs)
    rank = data.ndim + len(axes)
    for axis in sorted(a % rank for a in axes):
        data = np.expand_dims(data, axis)
    return data


def _squeeze(node, values, shapes):
    inputs = _inputs(node, values)
    axes = _axes(node, inputs)
    return np.squeeze(inputs[0], axis=None if axes is None else tuple(axes))


def _concat(node, values, shapes):
    return np.concatenate(_inputs(node, values), axis=_attribute(node, "axis"))


def _slice(node, values, shapes):
    inputs = _inputs(node, values)
    data = inputs[0]
    if len(inputs) >= 3:  # opset 10 on: starts, ends, axes, steps as inputs
        starts, ends = inputs[1].tolist(), inputs[2].tolist()
        axes = inputs[3].tolist() if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
        steps = inputs[4].tolist() if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    else:
        starts, ends = _attribute(node, "starts"), _attribute(node, "ends")
        axes, steps = _attribute(node, "axes", list(range(len(starts)))), [1] * len(starts)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis % data.ndim] = slice(start, end, step)  # Python's clamping is ONNX's
    return data[tuple(index)]


def _cast(node, values, shapes):
    from onnx import helper

    (data,) = _inputs(node, values)
    return data.astype(helper.tensor_dtype_to_np_dtype(_attribute(node, "to")))


def _broadcast_inputs(node, values: dict) -> list:
    """The node's input values, once the shape they broadcast to (numpy's broadcasting is ONNX's multidirectional
    one) is known to hold at most MAX_ELEMENTS: a larger result is no shape, and is never computed (a Where of
    three 1024-element vectors along different axes would be a billion elements)."""
    inputs = _inputs(node, values)
    _check_size(node, np.broadcast_shapes(*(np.shape(value) for value in inputs if value is not None)))
    return inputs


def _check_size(node, shape) -> None:
    """_Unknown unless ``shape`` is a valid one of at most MAX_ELEMENTS elements, before anything of it is made."""
    if any(size < 0 for size in shape) or math.prod(shape) > MAX_ELEMENTS:
        raise _Unknown(node.name)


def _nonzero_integer_divisor(node, a, b) -> None:
    """_Unknown for an integer division by zero: ONNX leaves its result undefined (numpy would give 0)."""
    if np.issubdtype(a.dtype, np.integer) and np.any(b == 0):
        raise _Unknown(node.name)


def _div(node, values, shapes):
    a, b = _broadcast_inputs(node, values)
    _nonzero_integer_divisor(node, a, b)
    if np.issubdtype(a.dtype, np.integer):
        return (np.abs(a) // np.abs(b) * np.sign(a) * np.sign(b)).astype(a.dtype)  # truncates, as C does
    return np.divide(a, b)


def _mod(node, values, shapes):
    """ONNX's Mod: with ``fmod`` 0 (integers only) the result takes the divisor's sign, as Python's ``%`` (torch's
    ``//`` on sizes writes it to round a negative quotient down); with ``fmod`` 1 the dividend's, as C's fmod."""
    a, b = _broadcast_inputs(node, values)
    _nonzero_integer_divisor(node, a, b)
    if _attribute(node, "fmod", 0):
        return np.fmod(a, b)
    if not np.issubdtype(a.dtype, np.integer):
        raise _Unknown(node.name)  # fmod 0 is for integers: the model is invalid
    return np.mod(a, b)


def _constant_of_shape(node, values, shapes):
    from onnx import numpy_helper

    (shape,) = _inputs(node, values)
    _check_size(node, shape.tolist())
    tensor = _attribute(node, "value")
    fill = numpy_helper.to_array(tensor).reshape(-1) if tensor is not None else np.zeros(1, np.float32)
    return np.full(tuple(shape.tolist()), fill[0], fill.dtype)


def _reshape(node, values, shapes):
    """ONNX's Reshape: a target dim 0 copies the input's dim at that index (unless ``allowzero``), -1 is
    inferred; the target an attribute up to opset 4, the second input from 5 (torch.onnx writes an expand's
    ``(a, -1)`` as a stack of scalars reshaped to [-1])."""
    inputs = _inputs(node, values)
    data = inputs[0]
    target = inputs[1].tolist() if len(inputs) > 1 else _attribute(node, "shape")
    if target is None:
        raise _Unknown(node.name)
    if not _attribute(node, "allowzero", 0):
        target = [data.shape[i] if size == 0 else size for i, size in enumerate(target)]
    return data.reshape(target)


def _where(node, values, shapes):
    condition, x, y = _broadcast_inputs(node, values)
    return np.where(condition.astype(bool), x, y)


def _expand(node, values, shapes):
    """ONNX's Expand: the input broadcast both ways with the target (a target dim of 1 keeps the input's)."""
    data, target = _inputs(node, values)
    shape = np.broadcast_shapes(data.shape, tuple(target.tolist()))
    _check_size(node, shape)
    return np.broadcast_to(data, shape).copy()


def _tile(node, values, shapes):
    """ONNX's Tile: one repeat count per input axis (the repeats of torch's ``repeat_interleave``)."""
    data, repeats = _inputs(node, values)
    repeats = repeats.tolist()
    if len(repeats) != data.ndim:
        raise _Unknown(node.name)
    _check_size(node, [size * count for size, count in zip(data.shape, repeats)])
    return np.tile(data, repeats)


def _range(node, values, shapes):
    """ONNX's Range: ``start + i * delta`` for i below ``max(ceil((limit - start) / delta), 0)``, in the inputs'
    type; the count checked before any element is made."""
    start, limit, delta = (value.reshape(()) for value in _inputs(node, values))
    if delta == 0:
        raise _Unknown(node.name)
    if np.issubdtype(start.dtype, np.integer):
        count = -((int(start) - int(limit)) // int(delta))  # the exact ceiling
    else:
        count = math.ceil((float(limit) - float(start)) / float(delta))
    _check_size(node, [max(count, 0)])
    return (start + np.arange(max(count, 0)) * delta).astype(start.dtype)


def _one_hot(node, values, shapes):
    """ONNX's OneHot: ``values[1]`` where an index (negative ones from the end) meets its position along the new
    ``axis`` of length ``depth``, ``values[0]`` elsewhere. torch's ``repeat_interleave`` by a size read at run
    time writes its Tile's repeats so: a one-hot of the repeated axis, on-value the size, off-value 1."""
    indices, depth, off_on = _inputs(node, values)
    depth = int(depth.reshape(-1)[0])
    _check_size(node, [*indices.shape, depth])
    indices = indices.astype(np.int64)
    hot = np.where(indices < 0, indices + depth, indices)[..., None] == np.arange(depth)  # (*indices, depth)
    hot = np.moveaxis(hot, -1, _attribute(node, "axis", -1) % (indices.ndim + 1))
    return np.where(hot, off_on[1], off_on[0]).astype(off_on.dtype)


def _clip(node, values, shapes):
    """ONNX's Clip (torch's ``clamp`` of a size): bounds as inputs from opset 11, attributes before; either may
    be missing."""
    inputs = _inputs(node, values) + [None, None]
    data, low, high = inputs[:3]
    if len(node.input) == 1:
        low, high = _attribute(node, "min"), _attribute(node, "max")
    if low is not None:
        data = np.maximum(data, low).astype(data.dtype)
    if high is not None:
        data = np.minimum(data, high).astype(data.dtype)
    return data


def _transpose(node, values, shapes):
    """ONNX's Transpose (torch writes ``F.pad``'s pads computed at run time as (begin, end) rows, one an axis,
    transposed into ONNX's begins-then-ends order)."""
    (data,) = _inputs(node, values)
    return np.transpose(data, _attribute(node, "perm", None))


def _reduce(function):
    """ReduceProd's or ReduceSum's fold (a flatten's ``-1`` written as the product of the trailing dims): axes
    an attribute or, from ReduceSum-13 and ReduceProd-18, the second input; none given reduces every axis,
    unless ``noop_with_empty_axes``."""
    def fold(node, values, shapes):
        inputs = _inputs(node, values)
        axes = _axes(node, inputs)
        if not axes and _attribute(node, "noop_with_empty_axes", 0):
            return inputs[0]
        return function(inputs[0], axis=tuple(axes) if axes else None, keepdims=bool(_attribute(node, "keepdims", 1)))
    return fold


def _elementwise(function):
    """A fold of ``function`` applied to the node's inputs, broadcast (Max and Min: any number of them)."""
    def fold(node, values, shapes):
        return function(*_broadcast_inputs(node, values))
    return fold


def _variadic(function):
    return lambda *inputs: functools.reduce(function, inputs)


FOLDERS = {
    "Constant": _constant, "Shape": _shape, "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Concat": _concat, "Slice": _slice, "Cast": _cast, "Div": _div, "ConstantOfShape": _constant_of_shape,
    "Add": _elementwise(np.add), "Sub": _elementwise(np.subtract), "Mul": _elementwise(np.multiply),
    "Identity": _elementwise(lambda data: data), "ReduceProd": _reduce(np.prod), "ReduceSum": _reduce(np.sum),
    "Reshape": _reshape, "Equal": _elementwise(np.equal), "Where": _where,
    "Expand": _expand, "Tile": _tile, "Range": _range, "OneHot": _one_hot, "Clip": _clip, "Transpose": _transpose,
    "Less": _elementwise(np.less), "Greater": _elementwise(np.greater), "LessOrEqual": _elementwise(np.less_equal),
    "GreaterOrEqual": _elementwise(np.greater_equal), "Not": _elementwise(np.logical_not),
    "And": _elementwise(np.logical_and), "Or": _elementwise(np.logical_or), "Xor": _elementwise(np.logical_xor),
    "Max": _elementwise(_variadic(np.maximum)), "Min": _elementwise(_variadic(np.minimum)), "Mod": _mod,
    "Floor": _elementwise(np.floor), "Neg": _elementwise(np.negative), "Abs": _elementwise(np.abs),
}
