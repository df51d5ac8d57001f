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
a loop's invariant, an earlier loop's output. Any other condition (one computed from the loop's data, a variable
the body changes another way, a bound computed at run time) leaves the trip count unknown: the loop may stop
early, so it is not costed by a count (``graphs.tf.flatten`` counts its body once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

COMPARISONS = frozenset({"Less", "LessEqual", "Greater", "GreaterEqual"})
FLIPPED = {"Less": "Greater", "Greater": "Less", "LessEqual": "GreaterEqual", "GreaterEqual": "LessEqual"}
PASS_THROUGH_KINDS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient"})  # as flatten
INTEGER_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})


@dataclass(frozen=True)
class LoopCount:
    trips: int | None  # iterations the body runs, None when not static
    invariant_values: list  # per loop variable: its value inside cond and body when static (an invariant), else None
    output_values: list  # per While output: its static value after the loop, else None


def loop_count(cond, body, initial: list) -> LoopCount:
    """The trip count of a While whose condition and body are the FuncGraphs ``cond`` and ``body`` (their
    ``arg_index`` maps argument tensor names to loop-variable positions), its inputs' static values ``initial``
    (None where unknown), and the static values that follow from it."""
    n = len(initial)
    if len(body.outputs) != n or len(cond.inputs) != n or len(cond.outputs) != 1:
        return LoopCount(trips=None, invariant_values=[None] * n, output_values=[None] * n)
    invariant = {i for i in range(n) if _loop_variable(body, body.outputs[i]) == i}
    inside = [initial[i] if i in invariant else None for i in range(n)]
    steps = {i: _step(body, i, inside) for i in range(n) if i not in invariant}
    counters = {i: (initial[i], step) for i, step in steps.items() if step is not None and _is_int(initial[i])}
    trips = _trips(cond, counters, inside)
    outputs = list(inside)
    if trips is not None:
        for i, (start, step) in counters.items():
            outputs[i] = start + trips * step
    return LoopCount(trips=trips, invariant_values=inside, output_values=outputs)


def static_scalar(op):
    """The value of a scalar integer or boolean Const op, else None."""
    import tensorflow as tf

    if op.type not in ("Const", "HostConst") or op.outputs[0].shape.rank != 0:
        return None
    dtype = op.outputs[0].dtype
    if dtype.name not in INTEGER_DTYPES and dtype != tf.bool:
        return None
    value = tf.make_ndarray(op.get_attr("value"))
    return bool(value) if dtype == tf.bool else int(value)


def _trips(cond, counters: dict[int, tuple[int, int]], inside: list) -> int | None:
    """The iterations the condition allows (the fewest over its conjuncts), None unless every conjunct is a
    constant or a counter's comparison with a known bound, and one of them ends the loop."""
    runs = math.inf
    for term in _conjuncts(_source(cond.outputs[0])):
        term_runs = _term_trips(cond, term, counters, inside)
        if term_runs is None:
            return None
        runs = min(runs, term_runs)
    return None if runs == math.inf else int(runs)


def _conjuncts(tensor) -> list:
    """The terms of a LogicalAnd tree (the tensor itself when it is not one)."""
    if tensor.op.type != "LogicalAnd":
        return [tensor]
    return _conjuncts(_source(tensor.op.inputs[0])) + _conjuncts(_source(tensor.op.inputs[1]))


def _term_trips(cond, tensor, counters: dict[int, tuple[int, int]], inside: list) -> float | None:
    """Iterations for which one conjunct holds from the first on: math.inf for a constant true or a counter
    stepping away from its bound, None when the conjunct is not understood."""
    constant = static_scalar(tensor.op)
    if isinstance(constant, bool):
        return math.inf if constant else 0
    if tensor.op.type not in COMPARISONS:
        return None
    kind = tensor.op.type
    left, right = (_source(t) for t in tensor.op.inputs)
    counter, bound = _loop_variable(cond, left), _known(cond, right, inside)
    if counter not in counters or not _is_int(bound):  # maybe written the other way round: bound < i
        kind, counter, bound = FLIPPED[kind], _loop_variable(cond, right), _known(cond, left, inside)
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


def _step(body, i: int, inside: list) -> int | None:
    """The constant the body adds to loop variable ``i`` each iteration (negative for a subtraction), if any."""
    out = _source(body.outputs[i])
    if out.op.type not in ("Add", "AddV2", "Sub"):
        return None
    left, right = (_source(t) for t in out.op.inputs)
    if _loop_variable(body, left) == i and _is_int(_known(body, right, inside)):
        return _known(body, right, inside) * (-1 if out.op.type == "Sub" else 1)
    if out.op.type != "Sub" and _loop_variable(body, right) == i and _is_int(_known(body, left, inside)):
        return _known(body, left, inside)
    return None


def _known(graph, tensor, inside: list):
    """The static value of ``tensor`` in a loop's cond or body: a scalar constant or a known invariant."""
    variable = _loop_variable(graph, tensor)
    if variable is not None:
        return inside[variable] if variable < len(inside) else None
    return static_scalar(tensor.op)


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
