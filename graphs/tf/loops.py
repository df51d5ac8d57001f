"""Static trip counts of TensorFlow while loops (While / StatelessWhile), found in the patterns TensorFlow writes.

A loop's trip count is static when its condition is a conjunction (LogicalAnd) of constant trues and of
counter comparisons: a loop variable the body steps by a constant (``i + 1``, ``i - 2``), started at a known
value, compared (Less, LessEqual, Greater, GreaterEqual) with a known bound. That covers

- ``tf.while_loop(..., maximum_iterations=N)``: while_v2's loop counter (variable 0, stepped by 1 from 0)
  compared with variable 1, the maximum (passed through the body), ANDed with the user's condition;
- autograph's ``for i in tf.range(start, limit, delta)``: ``i < limit`` (``i > limit`` for a negative delta)
  with ``i`` stepped by ``delta``, both passed in as loop variables;
- a plain counter: ``tf.while_loop(lambda i, x: i < 10, lambda i, x: (i + 1, ...), (0, x))``;
- the gradient of such a loop: its own counter compared with the forward loop's final counter (the forward
  While's output 0), which is known once the forward loop's trip count is.

"Known" is a scalar integer constant, or a value the caller found static (``initial``): a function's argument,
a loop's invariant, an earlier loop's output; or the shape arithmetic a bound is often written in
(``static_outputs``), such as ``for i in tf.range(tf.shape(x)[0] - 1)`` or ``i < tf.shape(h)[1]`` in a cond:
``Shape``/``ShapeN``/``Size``/``Rank`` of a tensor whose dims are static (the batch where the step left it
open, as its costs count it: ``graphs.tf.flatten``), one element of such a vector (``StridedSlice`` ``v[k]``,
``Gather``), an integer ``Cast``, and ``Add``/``Sub``/``Mul``/``FloorDiv``/``Maximum``/``Minimum`` of integer
scalars. Only integers and booleans are kept, vectors of at most MAX_VECTOR_LENGTH. Any other condition (one
computed from the loop's data, a variable the body changes another way, a bound computed at run time, a dim
not static) leaves the trip count unknown: the loop may stop early, so it is not costed by a count
(``graphs.tf.flatten`` counts its body once).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

COMPARISONS = frozenset({"Less", "LessEqual", "Greater", "GreaterEqual"})
FLIPPED = {"Less": "Greater", "Greater": "Less", "LessEqual": "GreaterEqual", "GreaterEqual": "LessEqual"}
PASS_THROUGH_KINDS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient"})  # identities
INTEGER_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
MAX_VECTOR_LENGTH = 8  # the longest integer vector (a shape, a slice's begin) kept as a static value
ELEMENT_KINDS = frozenset({"StridedSlice", "GatherV2", "Gather"})
SCALAR_ARITHMETIC = {
    "Add": operator.add, "AddV2": operator.add, "Sub": operator.sub, "Mul": operator.mul,
    "FloorDiv": operator.floordiv, "Maximum": max, "Minimum": min,
}
EVALUATED_KINDS = frozenset({"Shape", "ShapeN", "Size", "Rank", "Cast"} | ELEMENT_KINDS | SCALAR_ARITHMETIC.keys())
MAX_DEPTH = 16  # the deepest shape arithmetic _known follows inside a cond or body


@dataclass(frozen=True)
class LoopCount:
    trips: int | None  # iterations the body runs, None when not static
    invariant_values: list  # per loop variable: its value inside cond and body when static (an invariant), else None
    output_values: list  # per While output: its static value after the loop, else None


@dataclass(frozen=True)
class _Known:
    inside: list  # per loop variable: its static value inside cond and body (an invariant's), else None
    dims_of: Callable  # a tensor's static dims (None for an unknown dim), or None (see loop_count)


def loop_count(cond, body, initial: list, dims_of: Callable = lambda tensor: None) -> LoopCount:
    """The trip count of a While whose condition and body are the FuncGraphs ``cond`` and ``body`` (their
    ``arg_index`` maps argument tensor names to loop-variable positions), its inputs' static values ``initial``
    (None where unknown), and the static values that follow from it. ``dims_of`` gives the static dims of
    a tensor of cond or body that a bound's shape arithmetic may read (None: none to read)."""
    n = len(initial)
    if len(body.outputs) != n or len(cond.inputs) != n or len(cond.outputs) != 1:
        return LoopCount(trips=None, invariant_values=[None] * n, output_values=[None] * n)
    invariant = {i for i in range(n) if _loop_variable(body, body.outputs[i]) == i}
    inside = [initial[i] if i in invariant else None for i in range(n)]
    known = _Known(inside, dims_of)
    steps = {i: _step(body, i, known) for i in range(n) if i not in invariant}
    counters = {i: (initial[i], step) for i, step in steps.items() if step is not None and _is_int(initial[i])}
    trips = _trips(cond, counters, known)
    outputs = list(inside)
    if trips is not None:
        for i, (start, step) in counters.items():
            outputs[i] = start + trips * step
    return LoopCount(trips=trips, invariant_values=inside, output_values=outputs)


def static_scalar(op):
    """The value of a scalar integer or boolean Const op, else None."""
    value = static_constant(op)
    return None if isinstance(value, tuple) else value


def static_constant(op):
    """The value of an integer or boolean Const op: a scalar, or a tuple for a vector of at most
    MAX_VECTOR_LENGTH integers (a StridedSlice's begin, end and strides); else None."""
    import tensorflow as tf

    if op.type not in ("Const", "HostConst") or op.outputs[0].shape.rank not in (0, 1):
        return None
    dtype = op.outputs[0].dtype
    if dtype.name not in INTEGER_DTYPES and (dtype != tf.bool or op.outputs[0].shape.rank != 0):
        return None
    if op.outputs[0].shape.rank == 1 and not 0 < op.outputs[0].shape[0] <= MAX_VECTOR_LENGTH:
        return None
    value = tf.make_ndarray(op.get_attr("value"))
    if value.ndim == 1:
        return tuple(int(v) for v in value)
    return bool(value) if dtype == tf.bool else int(value)


def static_outputs(op, input_values: list, dims_of) -> list:
    """The static values of ``op``'s outputs (None where unknown) for the shape arithmetic a loop bound is
    written in: ``Shape``/``ShapeN``/``Size``/``Rank`` of tensors whose ``dims_of`` (static dims, None for an
    unknown one; None for an unknown rank) are known enough, one element of a known vector (``StridedSlice``
    shrinking one axis, ``Gather``), an integer ``Cast`` and integer scalar arithmetic (SCALAR_ARITHMETIC).
    ``input_values``: the inputs' static values (int, bool, tuple of ints, or None)."""
    n = len(op.outputs)
    if op.type in ("Shape", "ShapeN"):
        return [_shape_value(dims_of(t)) for t in op.inputs][:n]
    if op.type in ("Size", "Rank") and n == 1:
        value = _size_or_rank(op.type, dims_of(op.inputs[0]))
        return [value if value is not None and _fits(value, op.outputs[0]) else None]
    if n == 1 and op.type in ELEMENT_KINDS | {"Cast"} | SCALAR_ARITHMETIC.keys():
        return [_scalar_output(op, input_values)]
    return [None] * n


def _shape_value(dims: list | None) -> tuple | None:
    if dims is None or None in dims or len(dims) > MAX_VECTOR_LENGTH:
        return None
    return tuple(dims)


def _size_or_rank(kind: str, dims: list | None) -> int | None:
    if dims is None:
        return None
    if kind == "Rank":
        return len(dims)
    return None if None in dims else math.prod(dims)


def _scalar_output(op, values: list) -> int | None:
    """The value of a one-output op of ELEMENT_KINDS, Cast or SCALAR_ARITHMETIC on known inputs, else None."""
    if op.outputs[0].dtype.name not in INTEGER_DTYPES or op.outputs[0].shape.rank != 0:
        return None
    if op.type in ELEMENT_KINDS:
        return _element(op, values)
    if not values or not all(_is_int(v) for v in values):
        return None
    if op.type == "Cast":
        return values[0] if op.inputs[0].dtype.name in INTEGER_DTYPES and _fits(values[0], op.outputs[0]) else None
    if len(values) != 2 or op.type == "FloorDiv" and values[1] == 0:
        return None
    result = SCALAR_ARITHMETIC[op.type](*values)
    return result if _fits(result, op.outputs[0]) else None


def _element(op, values: list) -> int | None:
    """The one element of a known vector a StridedSlice (``v[k]``: one index, shrink_axis_mask 1, no other
    mask, stride 1) or a Gather (a scalar index, axis 0, batch_dims 0) selects, else None."""
    vector = values[0] if values else None
    if not isinstance(vector, tuple):
        return None
    if op.type == "StridedSlice":
        masks = [op.get_attr(key) for key in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask")]
        begin, end, strides = values[1:4]
        if op.get_attr("shrink_axis_mask") != 1 or any(masks) or strides != (1,) or not isinstance(begin, tuple) \
                or len(begin) != 1 or not isinstance(end, tuple) or len(end) != 1:
            return None
        index = begin[0]
    else:
        axis = values[2] if op.type == "GatherV2" and len(values) == 3 else 0
        batch_dims = op.get_attr("batch_dims") if "batch_dims" in op.node_def.attr else 0
        if axis != 0 or batch_dims != 0 or not _is_int(values[1]) or values[1] < 0:  # Gather refuses v[-1]
            return None
        index = values[1]
    return vector[index] if -len(vector) <= index < len(vector) else None


def _fits(value: int, tensor) -> bool:
    """``value`` is representable in ``tensor``'s integer dtype."""
    return tensor.dtype.min <= value <= tensor.dtype.max


def _trips(cond, counters: dict[int, tuple[int, int]], known: _Known) -> int | None:
    """The iterations the condition allows (the fewest over its conjuncts), None unless every conjunct is a
    constant or a counter's comparison with a known bound, and one of them ends the loop."""
    runs = math.inf
    for term in _conjuncts(_source(cond.outputs[0])):
        term_runs = _term_trips(cond, term, counters, known)
        if term_runs is None:
            return None
        runs = min(runs, term_runs)
    return None if runs == math.inf else int(runs)


def _conjuncts(tensor) -> list:
    """The terms of a LogicalAnd tree (the tensor itself when it is not one)."""
    if tensor.op.type != "LogicalAnd":
        return [tensor]
    return _conjuncts(_source(tensor.op.inputs[0])) + _conjuncts(_source(tensor.op.inputs[1]))


def _term_trips(cond, tensor, counters: dict[int, tuple[int, int]], known: _Known) -> float | None:
    """Iterations for which one conjunct holds from the first on: math.inf for a constant true or a counter
    stepping away from its bound, None when the conjunct is not understood."""
    constant = static_scalar(tensor.op)
    if isinstance(constant, bool):
        return math.inf if constant else 0
    if tensor.op.type not in COMPARISONS:
        return None
    kind = tensor.op.type
    left, right = (_source(t) for t in tensor.op.inputs)
    counter, bound = _loop_variable(cond, left), _known(cond, right, known)
    if counter not in counters or not _is_int(bound):  # maybe written the other way round: bound < i
        kind, counter, bound = FLIPPED[kind], _loop_variable(cond, right), _known(cond, left, known)
    if counter not in counters or not _is_int(bound):
        return None
    start, step = counters[counter]
    return _comparison_trips(kind, start, step, bound)


def _comparison_trips(kind: str, start: int, step: int, bound: int) -> float:
    """How many of start, start + step, ... in a row satisfy ``value <kind> bound`` (math.inf: all)."""
    if kind == "LessEqual":
        kind, bound = "Less", bound + 1
    elif kind == "GreaterEqual":
        kind, bound = "Greater", bound - 1
    if kind == "Greater":  # value > bound  <=>  -value < -bound
        start, step, bound = -start, -step, -bound
    if start >= bound:
        return 0
    if step <= 0:
        return math.inf
    return -(-(bound - start) // step)  # ceil((bound - start) / step)


def _step(body, i: int, known: _Known) -> int | None:
    """The constant the body adds to loop variable ``i`` each iteration (negative for a subtraction), if any."""
    out = _source(body.outputs[i])
    if out.op.type not in ("Add", "AddV2", "Sub"):
        return None
    left, right = (_source(t) for t in out.op.inputs)
    if _loop_variable(body, left) == i:
        step = _known(body, right, known)
        return step * (-1 if out.op.type == "Sub" else 1) if _is_int(step) else None
    if out.op.type != "Sub" and _loop_variable(body, right) == i:
        step = _known(body, left, known)
        return step if _is_int(step) else None
    return None


def _known(graph, tensor, known: _Known, depth: int = 0):
    """The static value of ``tensor`` in a loop's cond or body: a constant, a known invariant, or shape
    arithmetic on them and on static dims (``static_outputs``), at most MAX_DEPTH ops deep."""
    tensor = _source(tensor)
    variable = _loop_variable(graph, tensor)
    if variable is not None:
        return known.inside[variable] if variable < len(known.inside) else None
    constant = static_constant(tensor.op)
    if constant is not None or tensor.op.type not in EVALUATED_KINDS or depth >= MAX_DEPTH:
        return constant
    inputs = [_known(graph, t, known, depth + 1) for t in tensor.op.inputs]
    return static_outputs(tensor.op, inputs, known.dims_of)[tensor.value_index]


def _loop_variable(graph, tensor) -> int | None:
    """The loop-variable position of ``tensor`` if it is one of ``graph``'s arguments (maybe copied)."""
    return graph.arg_index.get(_source(tensor).name)


def _source(tensor):
    """The tensor ``tensor`` copies through identity-like ops (itself if none)."""
    while tensor.op.type in PASS_THROUGH_KINDS and tensor.op.inputs:
        tensor = tensor.op.inputs[tensor.value_index if tensor.op.type == "IdentityN" else 0]
    return tensor


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
