"""Python numbers a training step reads from its tensors, kept as expressions so a replay recomputes them.

A captured step (`measurers.torch.program`) bakes every Python value into its aten calls. That is right for
a timing, but not for training: Adam reads its step count with ``.item()`` and passes
``lr / (1 - beta1 ** step)`` to ``addcdiv_`` as a plain float, so a replay that reuses the captured float
repeats the first step's bias correction forever. With ``capture_step(..., live_scalars=True)``:

- ``ScalarReads`` (a ``TorchFunctionMode``) answers ``Tensor.item()`` on a float tensor with a
  ``LiveFloat``: the same value, plus the expression ``read k`` (the k-th read of the step); the capture
  records the read as a step of its own, so the replay reads the tensor's value at the same point;
- arithmetic on a ``LiveFloat`` (``+ - * / **``, negation, ``abs``, either side) gives a ``LiveFloat``
  whose expression records it;
- when a torch call receives ``LiveFloat`` arguments, the aten calls it makes see plain floats (the C++
  boundary drops the subclass); a float argument of those aten calls equal to one of the call's live
  values is recorded as a ``LiveArg`` (its expression), which the replay evaluates with that run's reads.

Not followed: ``math`` functions (``math.sqrt(x)`` is a plain float), ``int`` and ``bool`` reads, and
Python control flow on read values; those stay as the capture saw them.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_OPERATORS: dict[str, Callable] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "pow": operator.pow, "neg": operator.neg, "abs": abs,
}


@dataclass(frozen=True)
class ScalarExpr:
    """``op`` applied to ``operands`` (ScalarExpr or numbers); ``op == "read"``: operand 0 is a read index."""

    op: str
    operands: tuple

    def evaluate(self, reads: list[float]) -> float:
        if self.op == "read":
            return reads[self.operands[0]]
        values = [x.evaluate(reads) if isinstance(x, ScalarExpr) else x for x in self.operands]
        return _OPERATORS[self.op](*values)


@dataclass(frozen=True)
class LiveArg:
    """A float argument of a recorded aten call that the replay recomputes from the step's reads."""

    expr: ScalarExpr

    def value(self, reads: list[float]) -> float:
        return float(self.expr.evaluate(reads))


class LiveFloat(float):
    """A float read from a tensor (or computed from one) that remembers how: ``expr``."""

    expr: ScalarExpr

    def __new__(cls, value: float, expr: ScalarExpr) -> "LiveFloat":
        live = super().__new__(cls, value)
        live.expr = expr
        return live


def _operand(x):
    return x.expr if isinstance(x, LiveFloat) else x


def _binary(name: str, reflected: bool):
    def method(self, other):
        if not isinstance(other, (int, float)):
            return NotImplemented
        left, right = (other, self) if reflected else (self, other)
        value = _OPERATORS[name](float(left), float(right))
        return LiveFloat(value, ScalarExpr(name, (_operand(left), _operand(right))))
    return method


def _unary(name: str):
    def method(self):
        return LiveFloat(_OPERATORS[name](float(self)), ScalarExpr(name, (self.expr,)))
    return method


for _name in ("add", "sub", "mul", "truediv", "pow"):
    setattr(LiveFloat, f"__{_name}__", _binary(_name, reflected=False))
    setattr(LiveFloat, f"__r{_name}__", _binary(_name, reflected=True))
for _name in ("neg", "abs"):
    setattr(LiveFloat, f"__{_name}__", _unary(_name))


class ScalarReads(TorchFunctionMode):
    """Live ``.item()`` reads and live arguments during a capture.

    ``record_read(tensor) -> k`` records the read in the capture and returns its index;
    ``live_values`` is the capture's view of the current call's live arguments ({value: expression}),
    set for the duration of each torch call that receives some."""

    def __init__(self, record_read: Callable[[torch.Tensor], int]):
        super().__init__()
        self.record_read = record_read
        self.live_values: dict[float, ScalarExpr] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.item:
            value = func(*args, **kwargs)
            if type(value) is not float:
                return value
            return LiveFloat(value, ScalarExpr("read", (self.record_read(args[0]),)))
        live = {float(x): x.expr for x in tree_flatten((args, kwargs))[0] if isinstance(x, LiveFloat)}
        if not live:
            return func(*args, **kwargs)
        outer, self.live_values = self.live_values, {**self.live_values, **live}
        try:
            return func(*args, **kwargs)
        finally:
            self.live_values = outer
