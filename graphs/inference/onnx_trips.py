"""How many times an ONNX Loop, Scan or SequenceMap runs its body, where that is known statically, and the
leading dim that count gives a Loop's scan outputs.

- A Loop runs ``M`` times when M is a known value (graphs.inference.shape_folding.known_values: an
  initializer, a Constant, folded shape arithmetic) and its condition cannot stop it early.
- A Scan runs once per slice of its scan inputs along their scan axes. They are all as long, so one whose
  scan axis is sized is enough, whatever its other dims (an unsized one counts as 1 in the body, as anywhere).
- A SequenceMap runs once per tensor of its input sequence, whose length is followed through the ops that
  make sequences (``sequence_lengths``), a Loop included: a list appended in a loop, as torch.onnx writes it
  (the Loop carries a sequence, its body inserts into it), holds its initial length + the trip count x the
  tensors each run inserts.

onnx's shape inference gives a Loop's scan outputs (the body's outputs after its carried values, stacked over
the iterations) a symbolic leading dim even when the trip count is static; ``size_loop_scan_outputs`` gives
them the trip count, and inferring again sizes what reads them. It leaves a Loop's carried outputs without a
shape; ``size_loop_carried_outputs`` gives them the one their value has before the loop and after each run,
where the two are the same static shape. ``size_concat_from_sequences`` does the same for a
ConcatFromSequence's concatenated dim, from its sequence's length and its tensors' dims; and
``size_loop_sequences`` for the tensors of a sequence a Loop carries, which onnx leaves without a shape (the
tensors the body inserts have theirs).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from graphs.inference.shape_folding import bodies, known_values, static_dim, tensor_dims

DEFAULT_DOMAINS = ("", "ai.onnx")
Dims = tuple[int | None, ...]  # a tensor's dims, None where not sized


def loop_trips(node, values: Mapping[str, np.ndarray]) -> tuple[int | None, str]:
    """(the Loop's trip count, "") when it is static: its ``M`` input a known value in ``values`` and its
    condition true at every iteration (absent or a constant true, and the body's condition output its input
    passed through, maybe by Identity nodes, or a constant true, as torch.onnx writes a for loop); else (None,
    why). A loop that may stop early on a condition computed at run time has no static trip count, even with
    an ``M`` (which bounds the count only)."""
    trip_input = node.input[0] if node.input else ""
    if not trip_input:
        return None, "no trip count M, it runs while its condition holds"
    trips = _known_int(values.get(trip_input))
    if trips is None:
        return None, "its trip count M is computed at run time"
    body = graph_attribute(node, "body")
    condition = node.input[1] if len(node.input) > 1 else ""
    if condition and not _known_true(values.get(condition)):
        return None, "its initial condition is computed at run time"
    body_condition = _through_identities(body, body.output[0].name) if body.output else ""
    passed_through = len(body.input) > 1 and body_condition == body.input[1].name
    if not passed_through and not _known_true(known_values(body, dict(values)).get(body_condition)):
        return None, "its body computes its condition, so it may stop before its trip count M"
    return max(trips, 0), ""


def scan_trips(node, dims: Mapping[str, Dims], opset: int) -> tuple[int | None, str]:
    """(the Scan's iterations, "") when a scan input's size along its scan axis is static; else (None, why).
    Opset 8's Scan (a batch axis first, per-example lengths) is not costed."""
    if opset < 9:
        return None, "a Scan of opset 8 (batched, per-example sequence lengths) is not costed"
    num_scan = _attribute(node, "num_scan_inputs", 0)
    scan_inputs = node.input[len(node.input) - num_scan:] if 0 < num_scan <= len(node.input) else []
    axes = _attribute(node, "scan_input_axes") or [0] * len(scan_inputs)
    for tensor, axis in zip(scan_inputs, axes):
        shape = dims.get(tensor)
        if shape and shape[axis % len(shape)] is not None:
            return shape[axis % len(shape)], ""
    return None, "the length of its scan inputs is not known statically"


def sequence_map_trips(node, lengths: Mapping[str, int]) -> tuple[int | None, str]:
    """(the length of the SequenceMap's input sequence, "") when it is static (``sequence_lengths``); else
    (None, why)."""
    length = lengths.get(node.input[0]) if node.input else None
    if length is None:
        return None, "the length of its input sequence is not known statically"
    return length, ""


def sequence_lengths(graph, values: Mapping[str, np.ndarray], dims: Mapping[str, Dims],
                     outer: Mapping[str, int] | None = None) -> dict[str, int]:
    """{sequence: how many tensors it holds} of the sequences ``graph``'s nodes make, in their (topological)
    order, where that is static: SequenceEmpty's, SequenceConstruct's, SplitToSequence's of a known split or
    a sized axis, and SequenceInsert's, SequenceErase's, Identity's and SequenceMap's of a sequence of known
    length. ``outer``: the lengths of the sequences of the graphs around it (a body reads them by name)."""
    lengths = dict(outer or {})
    for node in graph.node:
        if node.domain in DEFAULT_DOMAINS and node.op_type == "Loop":
            lengths.update(_loop_sequence_lengths(node, lengths, values))
            continue
        length = _sequence_length(node, lengths, values, dims) if node.domain in DEFAULT_DOMAINS else None
        if length is not None:
            lengths.update({tensor: length for tensor in node.output if tensor})
    return lengths


def _loop_sequence_lengths(node, lengths: Mapping[str, int], values) -> dict[str, int]:
    """{Loop output: length} of the sequences a Loop of a static trip count carries, where each run of its body
    adds the same number of tensors (``_carried_chain``): the initial length + the trip count x that number."""
    trips, _ = loop_trips(node, values)
    found = {}
    for initial, chain, output in _carried_sequences(node) if trips is not None else []:
        if chain is not None and initial in lengths:
            added = sum(+1 if link.op_type == "SequenceInsert" else -1 if link.op_type == "SequenceErase" else 0
                        for link in chain)
            if lengths[initial] + trips * added >= 0:
                found[output] = lengths[initial] + trips * added
    return found


def _carried_sequences(node) -> list[tuple[str, list | None, str]]:
    """(initial value, ``_carried_chain`` in the body, output) of each value a Loop carries."""
    body = graph_attribute(node, "body")
    carried = zip(node.input[2:], body.input[2:], body.output[1:], node.output)
    return [(initial, _carried_chain(body, inside.name, after.name), output)
            for initial, inside, after, output in carried if output]


def _carried_chain(body, start: str, end: str) -> list | None:
    """The body nodes that make its carried value ``end`` from its value ``start`` (the one before the run) by
    SequenceInsert, SequenceErase and Identity alone, in run order ([] when it is passed through as it is); None
    when anything else makes it (a sequence built anew, a Loop inside)."""
    producer = {out: n for n in body.node for out in n.output if out}
    chain, tensor = [], end
    while tensor != start:
        link = producer.get(tensor)
        if link is None or link.domain not in DEFAULT_DOMAINS or not link.input or link.op_type not in (
                "SequenceInsert", "SequenceErase", "Identity") or len(chain) > len(body.node):
            return None
        chain.append(link)
        tensor = link.input[0]
    return chain[::-1]


def _sequence_length(node, lengths: Mapping[str, int], values, dims) -> int | None:
    kind = node.op_type
    first = lengths.get(node.input[0]) if node.input else None
    if kind == "SequenceEmpty":
        return 0
    if kind == "SequenceConstruct":
        return len(node.input)
    if kind == "SplitToSequence":
        return _split_length(node, values, dims)
    if first is None:
        return None
    return {"SequenceInsert": first + 1, "SequenceErase": max(first - 1, 0), "Identity": first,
            "SequenceMap": first}.get(kind)


def _split_length(node, values, dims) -> int | None:
    """How many tensors SplitToSequence makes: one per entry of a 1-D ``split`` (its length known if not its
    values), the axis's size over a scalar ``split`` (rounded up), or the axis's size without one."""
    split = node.input[1] if len(node.input) > 1 else ""
    if split and split in values and values[split].ndim == 1:
        return len(values[split])
    if split and len(dims.get(split) or ()) == 1:
        return dims[split][0]
    shape = dims.get(node.input[0])
    size = shape[_attribute(node, "axis", 0) % len(shape)] if shape else None
    if size is None:
        return None
    if not split:
        return size
    step = _known_int(values.get(split))
    return math.ceil(size / step) if step is not None and step > 0 else None


def size_loop_scan_outputs(graph, outer: Mapping[str, np.ndarray] | None = None) -> bool:
    """Give the scan outputs of ``graph``'s Loops of a static trip count (those of the Loops inside its
    subgraph bodies too) that count as their leading dim where onnx's inference left it unsized, in their
    value_info or graph output entries (in place); whether it gave any."""
    values = known_values(graph, dict(outer or {}))
    entries = _entries_by_name(graph)
    changed = False
    for node in graph.node:
        for body in bodies(node):
            changed |= size_loop_scan_outputs(body, values)
        if node.op_type != "Loop" or node.domain not in DEFAULT_DOMAINS:
            continue
        trips, _ = loop_trips(node, values)
        carried = max(len(node.input) - 2, 0)
        for tensor in node.output[carried:] if trips is not None else []:
            for entry in entries.get(tensor, []):
                changed |= _lead_with(entry, trips)
    return changed


def size_loop_carried_outputs(graph, outer: Mapping[str, Dims] | None = None) -> bool:
    """Give the carried outputs of ``graph``'s Loops (those of the Loops inside its subgraph bodies too) the
    shape their value has before the loop and after each run of its body, where those are the same full static
    shape (onnx's inference leaves a Loop's carried outputs without a shape): the value after any number of
    runs, none included, has it, whether the trip count is static or not. In their value_info or graph output
    entries, in place, where they have no full shape; whether it gave any. ``outer``: the dims of the tensors
    of the graphs around ``graph`` (a body reads them by name)."""
    dims = {**(outer or {}), **tensor_dims(graph)}
    entries = _entries_by_name(graph)
    changed = False
    for node in graph.node:
        for body in bodies(node):
            changed |= size_loop_carried_outputs(body, dims)
        if node.op_type != "Loop" or node.domain not in DEFAULT_DOMAINS:
            continue
        body = graph_attribute(node, "body")
        body_dims = tensor_dims(body)
        for initial, after, output in zip(node.input[2:], body.output[1:], node.output):
            shape = dims.get(initial) if initial else None
            if not output or shape is None or None in shape or body_dims.get(after.name) != shape:
                continue
            for entry in entries.get(output, []):
                changed |= _size_all(entry, shape)
    return changed


def _size_all(value, dims: tuple[int, ...]) -> bool:
    """Give ``value`` (a ValueInfoProto of a tensor) the shape ``dims`` where it has no shape or one of that rank
    with dims not sized (those it sizes; a sized one that differs is left as it is); whether it sized any."""
    tensor_type = value.type.tensor_type if value.type.HasField("tensor_type") else None
    if tensor_type is None:
        return False
    if not tensor_type.HasField("shape"):
        for size in dims:
            tensor_type.shape.dim.add().dim_value = size
        return True
    if len(tensor_type.shape.dim) != len(dims):
        return False
    changed = False
    for dim, size in zip(tensor_type.shape.dim, dims):
        if not static_dim(dim):
            dim.dim_value = size  # replaces its dim_param (one of the two)
            changed = True
    return changed


def size_loop_sequences(graph) -> bool:
    """Give the sequences ``graph``'s Loops carry (those of the Loops inside its subgraph bodies too) the shape
    of their tensors where onnx's inference left it unknown (it does not carry a body's inserted tensors' shapes
    out, and a torch export declares the body's sequence without sizes): the shape of every tensor the body
    inserts (``_carried_chain``), when they all have the same one, fully sized, and so has the initial
    sequence's unless it is SequenceEmpty's. In place; whether it gave any."""
    changed = False
    entries = _entries_by_name(graph)
    initial_dims = {value.name: _element_dims(value) for value in [*graph.input, *graph.value_info]}
    empty = {out for node in graph.node if node.op_type == "SequenceEmpty" for out in node.output}
    for node in graph.node:
        for body in bodies(node):
            changed |= size_loop_sequences(body)
        if node.op_type != "Loop" or node.domain not in DEFAULT_DOMAINS:
            continue
        body = graph_attribute(node, "body")
        body_dims = tensor_dims(body)
        for initial, chain, output in _carried_sequences(node):
            shapes = {body_dims.get(link.input[1]) if len(link.input) > 1 else None
                      for link in chain or () if link.op_type == "SequenceInsert"}
            if initial not in empty:
                shapes.add(initial_dims.get(initial))
            shape = shapes.pop() if chain is not None and len(shapes) == 1 else None
            for entry in entries.get(output, []) if shape is not None and None not in shape else []:
                changed |= _size_elements(entry, shape)
    return changed


def _size_elements(value, dims: tuple[int, ...]) -> bool:
    """Give the tensors of ``value`` (a ValueInfoProto of a sequence) the shape ``dims`` unless they have a full
    one already; whether it did."""
    if not value.type.HasField("sequence_type") or not value.type.sequence_type.elem_type.HasField("tensor_type"):
        return False
    tensor_type = value.type.sequence_type.elem_type.tensor_type
    if tensor_type.HasField("shape") and all(static_dim(d) for d in tensor_type.shape.dim):
        return False
    tensor_type.ClearField("shape")
    for size in dims:
        tensor_type.shape.dim.add().dim_value = size
    return True


def size_concat_from_sequences(graph, outer: Mapping[str, np.ndarray] | None = None) -> bool:
    """Give the output of each of ``graph``'s ConcatFromSequence (those inside its subgraph bodies too) its
    concatenated dim where onnx's inference left it unsized and the sequence's length (``sequence_lengths``) and
    its tensors' dims (the sequence's inferred type) are known: length x the tensors' dim along ``axis``, or the
    length for a new axis (``new_axis``). In place; whether it sized any."""
    values = known_values(graph, dict(outer or {}))
    lengths = sequence_lengths(graph, values, tensor_dims(graph))
    elements = {value.name: _element_dims(value) for value in [*graph.input, *graph.output, *graph.value_info]}
    entries = _entries_by_name(graph)
    changed = False
    for node in graph.node:
        for body in bodies(node):
            changed |= size_concat_from_sequences(body, values)
        if node.op_type != "ConcatFromSequence" or node.domain not in DEFAULT_DOMAINS or not node.input:
            continue
        size = _concatenated(node, lengths.get(node.input[0]), elements.get(node.input[0]))
        for entry in entries.get(node.output[0], []) if size is not None else []:
            changed |= _size_dim(entry, size[0], size[1])
    return changed


def _entries_by_name(graph) -> dict[str, list]:
    """{tensor: its graph output and value_info entries}: where an inferred shape is written."""
    entries: dict[str, list] = {}
    for value in [*graph.output, *graph.value_info]:
        entries.setdefault(value.name, []).append(value)
    return entries


def _concatenated(node, length: int | None, element: Dims | None) -> tuple[int, int] | None:
    """(the output dim, its size) of a ConcatFromSequence of ``length`` tensors of dims ``element``, if known."""
    if length is None or not element:
        return None
    new_axis = bool(_attribute(node, "new_axis", 0))
    rank = len(element) + new_axis
    axis = _attribute(node, "axis", 0)
    if not -rank <= axis < rank:
        return None
    axis %= rank
    if new_axis:
        return axis, length
    return (axis, length * element[axis]) if element[axis] is not None else None


def _element_dims(value) -> Dims | None:
    """The dims of a sequence's tensors (None where not sized), from its type; None for anything else."""
    if not value.type.HasField("sequence_type"):
        return None
    element = value.type.sequence_type.elem_type
    if not element.HasField("tensor_type") or not element.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if static_dim(d) else None for d in element.tensor_type.shape.dim)


def _size_dim(value, index: int, size: int) -> bool:
    """Set dim ``index`` of ``value`` (a ValueInfoProto) to ``size`` if it has none; whether it did."""
    tensor_type = value.type.tensor_type if value.type.HasField("tensor_type") else None
    if tensor_type is None or not tensor_type.HasField("shape") or len(tensor_type.shape.dim) <= index:
        return False
    if static_dim(tensor_type.shape.dim[index]):
        return False
    tensor_type.shape.dim[index].dim_value = size  # replaces its dim_param (one of the two)
    return True


def _lead_with(value, size: int) -> bool:
    """Set the leading dim of ``value`` (a ValueInfoProto) to ``size`` if it has none; whether it did."""
    tensor_type = value.type.tensor_type if value.type.HasField("tensor_type") else None
    if tensor_type is None or not tensor_type.HasField("shape") or not tensor_type.shape.dim:
        return False
    if static_dim(tensor_type.shape.dim[0]):
        return False
    tensor_type.shape.dim[0].dim_value = size  # replaces its dim_param (one of the two)
    return True


def _through_identities(graph, tensor: str) -> str:
    """The tensor ``tensor`` copies through a chain of ``graph``'s Identity nodes (itself if none)."""
    copied_from = {node.output[0]: node.input[0] for node in graph.node
                   if node.op_type == "Identity" and node.domain in DEFAULT_DOMAINS and node.input and node.output}
    seen = set()
    while tensor in copied_from and tensor not in seen:
        seen.add(tensor)
        tensor = copied_from[tensor]
    return tensor


def _known_int(value) -> int | None:
    if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.integer):
        return None
    return int(value.reshape(-1)[0])


def _known_true(value) -> bool:
    return value is not None and value.size == 1 and bool(value.reshape(-1)[0])


def graph_attribute(node, name: str):
    return next(attribute.g for attribute in node.attribute if attribute.name == name)


def _attribute(node, name: str, default=None):
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
