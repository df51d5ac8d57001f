"""Live Python reads in a captured step: arithmetic on a read value is recorded as an expression, and a
replay reads the tensor again and recomputes the arguments made from it, where a plain capture repeats
the captured number."""

import pytest
import torch

from measurers.torch.live_scalars import LiveFloat, ScalarExpr
from measurers.torch.program import PlacedReplay, capture_step


def test_live_float__arithmetic_evaluates_to_its_value_and_follows_new_reads():
    step = LiveFloat(2.0, ScalarExpr("read", (0,)))
    step_size = -(0.001 / (1 - 0.9 ** step))  # Adam's step size, written as Adam writes it
    root = (1 - 0.999 ** step) ** 0.5
    assert isinstance(step_size, LiveFloat) and isinstance(root, LiveFloat)
    assert step_size.expr.evaluate([2.0]) == float(step_size) == -(0.001 / (1 - 0.9 ** 2.0))
    assert step_size.expr.evaluate([3.0]) == pytest.approx(-(0.001 / (1 - 0.9 ** 3)), rel=1e-15)
    assert root.expr.evaluate([5.0]) == pytest.approx((1 - 0.999 ** 5) ** 0.5, rel=1e-15)


def counter_step(counter: torch.Tensor, weight: torch.Tensor):
    """A step that reads its counter in Python, as Adam does, and scales by a number made from it."""
    def step_fn():
        counter.add_(1)
        scale = 1.0 / (1 + counter.item())
        weight.mul_(scale)
        return weight.sum()
    return step_fn


def replayed_sums(live: bool, runs: int) -> list[float]:
    counter, weight = torch.zeros(()), torch.ones(3)
    program = capture_step(counter_step(counter, weight), {id(counter): "c", id(weight): "w"}, {}, live_scalars=live)
    leaves = {slot: 0 for slot in program.leaf_values}
    replay = PlacedReplay(program, [0] * len(program.counted_kinds), [torch.device("cpu")], leaves)
    return [float(replay.run()) for _ in range(runs)]


def test_capture_step__live_scalars_recompute_what_a_read_feeds_on_every_replay():
    counter, weight = torch.zeros(()), torch.ones(3)
    eager = counter_step(counter, weight)
    expected = [float(eager()) for _ in range(3)]  # 3/2, 3/2/3, 3/2/3/4
    assert replayed_sums(live=True, runs=3) == pytest.approx(expected, rel=1e-6)
    assert replayed_sums(live=False, runs=3) == pytest.approx([1.5, 0.75, 0.375], rel=1e-6)  # baked 1/2
