"""Warm start: candidates checked, measured in the budget, imitated, and never reported worse than they ran."""

from __future__ import annotations

import os

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import build_graph  # noqa: E402

from graphs.errors import PlacerError  # noqa: E402
from graphs.grouping import Grouping  # noqa: E402
from graphs.opgraph import kind_bit  # noqa: E402
from measurers.catalog import load_machine  # noqa: E402
from measurers.sim.measurer import SimulatorMeasurer  # noqa: E402
from policies.base import BudgetedMeasurer, DecisionClock, RunContext  # noqa: E402
from policies.problem import make_problem  # noqa: E402
from policies.rl.warm_start import check_warm_start, measure_warm_start  # noqa: E402

OPTIONS = {"batch_size": 4, "hidden_size": 16, "torch_threads": 1}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """Every test here runs on one torch thread (see conftest)."""


@pytest.fixture(scope="module")
def tiny():
    """Six ops in a chain on paper-2gpu (cpu:0, gpu:0, gpu:1); op 0 only on the cpu, ops 2 and 3 colocated."""
    machine = load_machine("paper-2gpu")
    mask = [kind_bit("cpu")] + [kind_bit("cpu") | kind_bit("gpu")] * 5
    graph = build_graph([(i, i + 1) for i in range(5)], colocation=[0, 1, 2, 2, 3, 4], allowed_mask=mask)
    return make_problem(graph, machine)


@pytest.fixture(scope="module")
def nmt():
    from graphs.registry import load_graph

    graph = load_graph("nmt-2")
    return make_problem(graph, load_machine("paper-2gpu"), max_groups=8)


def test_check_warm_start__returns_int64_copies(tiny):
    placement = np.array([0, 1, 1, 1, 2, 2], dtype=np.int32)
    (checked,) = check_warm_start(tiny, [placement])
    assert checked.dtype == np.int64 and checked is not placement
    np.testing.assert_array_equal(checked, placement)


@pytest.mark.parametrize("placement, message", [
    ([0, 1, 1, 1, 2], r"shape \(5,\), expected \(6,\)"),
    ([0, 1, 1, 1, 2, 3], "names device 3, outside 0..2"),
    ([0, 1, 1, 1, 2, -1], "names device -1"),
    ([1, 1, 1, 1, 2, 2], "puts op 0 on gpu:0, a device kind it may not use"),
    ([0, 1, 1, 2, 2, 2], "splits colocation group 2"),
    ([0.0, 1, 1, 1, 2, 2], "integer device indices"),
])
def test_check_warm_start__names_the_problem(tiny, placement, message):
    with pytest.raises(PlacerError, match=message) as error:
        check_warm_start(tiny, [np.zeros(6, dtype=np.int64), np.asarray(placement)])
    assert "warm-start candidate 1" in str(error.value) and "'tiny'" in str(error.value)


class _Counting:
    def __init__(self, measurer):
        self.measurer, self.calls = measurer, []

    def measure(self, placements):
        self.calls.append(len(placements))
        return self.measurer.measure(placements)


def test_measure_warm_start__one_call_in_the_budget_duplicates_dropped_best_returned(nmt):
    measurer = _Counting(SimulatorMeasurer(nmt.graph, nmt.machine))
    seen = []
    counter = BudgetedMeasurer(measurer, 10, nmt.capacity_bytes(), DecisionClock(), lambda p, m: seen.append(m))
    one_gpu = nmt.expand(np.full(nmt.num_units, 1))
    split = nmt.expand(np.array([1, 2] * (nmt.num_units // 2)))
    warm = measure_warm_start(nmt, counter, [split, one_gpu, split.copy()])
    assert measurer.calls == [2] and counter.used == 2 and len(seen) == 2
    runtimes = [m.runtime_s for m in seen]
    assert warm.runtime_s == min(runtimes)
    assert warm.candidate == int(np.argmin(runtimes))
    np.testing.assert_array_equal(warm.op_placement, nmt.expand(warm.unit_placement))


def test_measure_warm_start__none_without_budget_or_candidates(nmt):
    counter = BudgetedMeasurer(SimulatorMeasurer(nmt.graph, nmt.machine), 0, nmt.capacity_bytes(), DecisionClock())
    assert measure_warm_start(nmt, counter, [nmt.expand(np.ones(nmt.num_units, dtype=np.int64))]) is None
    assert measure_warm_start(nmt, counter, []) is None and counter.used == 0


def test_reinforce__warm_started_run_never_reports_worse_than_its_warm_start(nmt):
    from policies.registry import place

    measurer = _Counting(SimulatorMeasurer(nmt.graph, nmt.machine))
    round_robin = nmt.expand(np.arange(nmt.num_units) % 2 + 1)
    seen = []
    result = place("reinforce", nmt, measurer, 10, 0, lambda p, m: seen.append(m), warm_start=[round_robin],
                   **OPTIONS)
    warm_runtime_s = seen[0].runtime_s
    assert measurer.calls[0] == 1 and sum(measurer.calls) == 10 == result.measurements
    assert result.best.runtime_s <= warm_runtime_s
    assert "warm start: candidate 0" in result.notes
    large = place("reinforce", nmt, _Counting(SimulatorMeasurer(nmt.graph, nmt.machine)), 6, 0,
                  **{**OPTIONS, "batch_size": 100000})
    assert "1 iterations of 6, " in large.notes  # the batch sampled, not the --batch asked for


def _toy_trainer(config):
    from policies.rl.env import PlacementEnv
    from policies.rl.loop import _Trainer, deterministic_torch

    groups = 12
    machine = load_machine("paper-2gpu")
    grouping = Grouping(np.arange(groups), groups, np.full(groups, 3, np.uint8))
    features = np.random.default_rng(0).normal(size=(groups, 5)).astype(np.float32)
    env = PlacementEnv(None, machine, grouping, None, features=features)
    with deterministic_torch():  # building a learner seeds torch and turns deterministic kernels on: restored here
        return _Trainer(env, config)


def test_imitate__greedy_placement_becomes_the_target_and_stops_early():
    from ray.rllib.core.columns import Columns
    import torch

    from policies.rl.config import RLConfig

    trainer = _toy_trainer(RLConfig(hidden_size=16, batch_size=4, torch_threads=1))
    target = np.random.default_rng(3).integers(0, 3, 12)
    steps = trainer.imitate(target[None], 400, stop_prob=0.9)
    greedy = np.empty(12, dtype=np.int64)
    decoded = trainer.module.forward_inference({Columns.OBS: torch.from_numpy(trainer.obs[None])})[Columns.ACTIONS]
    greedy[trainer.order] = decoded[0].numpy()
    np.testing.assert_array_equal(greedy, target)
    assert 0 < steps < 400


class _SumMeasurer:
    """runtime_s = 1 + the sum of the device indices (ops = groups here): all on device 0 is best."""

    def measure(self, placements):
        from measurers.base import Measurement

        return [Measurement(1.0 + float(np.sum(p)), (), "ok", (0, 0, 0), 0.0) for p in placements]


def test_train_placer__warm_start_counts_before_and_a_resumed_run_does_not_imitate_again(tmp_path):
    import torch

    from policies.rl.config import RLConfig
    from policies.rl.loop import CHECKPOINT_FILE, train_placer
    from policies.rl.warm_start import WarmStart

    groups = 12
    grouping = Grouping(np.arange(groups), groups, np.full(groups, 3, np.uint8))
    features = np.random.default_rng(0).normal(size=(groups, 5)).astype(np.float32)
    target = np.zeros(groups, dtype=np.int64)
    warm = WarmStart(target, target.copy(), 0.5, 0)  # better than anything the measurer can return
    config = RLConfig(hidden_size=16, batch_size=4, torch_threads=1, checkpoint_every=1)

    def run(budget, **kwargs):
        return train_placer(None, load_machine("paper-2gpu"), grouping, _SumMeasurer(), budget_measurements=budget,
                            config=config, features=features, checkpoint_dir=tmp_path, **kwargs)

    first = run(9, warm_start=warm, measurements_before=1)
    assert first.measurements_used == 9 and first.iterations == 2  # 1 before, then batches of 4 and 4
    assert first.best_runtime_s == 0.5
    np.testing.assert_array_equal(first.best_group_placement, target)
    imitated = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["imitation_steps"]
    assert imitated > 0
    resumed = run(17, warm_start=warm, measurements_before=1, resume_from=tmp_path)
    assert resumed.measurements_used == 17 and resumed.best_runtime_s == 0.5
    assert torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["imitation_steps"] == imitated
    assert first.warm_start_note == "warm start: candidate 0 at 0.5000 s"
    # a resumed search passes no warm start (its candidates were measured before): the note is the checkpoint's,
    # so the result says what a run never stopped says (it lost "; warm start: ..." from its notes)
    again = run(21, measurements_before=1, resume_from=tmp_path)
    assert again.warm_start_note == first.warm_start_note and again.warm_start_runtime_s == 0.5


class _Recording(_SumMeasurer):
    def __init__(self):
        self.measured: list[tuple[int, ...]] = []

    def measure(self, placements):
        self.measured += [tuple(int(d) for d in p) for p in placements]
        return super().measure(placements)


def _two_group_run(tmp_path, warm, measurer, budget: int, **kwargs):
    from policies.rl.config import RLConfig
    from policies.rl.loop import train_placer

    grouping = Grouping(np.arange(2), 2, np.full(2, 3, np.uint8))
    config = RLConfig(hidden_size=16, batch_size=4, torch_threads=1, checkpoint_every=1)
    return train_placer(None, load_machine("paper-2gpu"), grouping, measurer, budget_measurements=budget,
                        config=config, features=np.ones((2, 5), dtype=np.float32), checkpoint_dir=tmp_path,
                        warm_start=warm, **kwargs)


def test_train_placer__the_warm_start_candidates_it_samples_again_are_not_measured_again(tmp_path):
    from measurers.base import Measurement
    from policies.rl.loop import resumed_warm_started
    from policies.rl.warm_start import WarmStart

    start, other, failed = np.array([1, 1]), np.array([2, 2]), np.array([0, 0])
    known = [(units, Measurement(1.0 + units.sum(), (), "ok", (0, 0, 0), 0.0)) for units in (start, other)]
    known.append((failed, Measurement(float("nan"), (), "timeout", (), 5.0, "timed out")))  # measured all the same
    warm = WarmStart(start, start.copy(), 3.0, 0)
    measurer = _Recording()
    result = _two_group_run(tmp_path, warm, measurer, budget=9, measurements_before=3, known=known)
    assert result.measurements_used == 9 == 3 + len(measurer.measured)  # every one of the 9 placements once
    assert not {(1, 1), (2, 2), (0, 0)} & set(measurer.measured)  # the imitated start is sampled again
    assert resumed_warm_started(tmp_path, given=False)


def test_resumed_warm_started__as_the_run_began_or_as_given_for_an_older_checkpoint(tmp_path):
    import torch

    from policies.rl.loop import CHECKPOINT_FILE, resumed_warm_started

    _two_group_run(tmp_path, None, _Recording(), budget=4)  # given no candidate that ran: the plain settings
    assert not resumed_warm_started(tmp_path, given=True)
    state = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    del state["warm_started"]
    torch.save(state, tmp_path / CHECKPOINT_FILE)
    assert resumed_warm_started(tmp_path, given=True) and not resumed_warm_started(tmp_path, given=False)
    _two_group_run(tmp_path, None, _Recording(), budget=8, resume_from=tmp_path, warm_started=True)
    assert resumed_warm_started(tmp_path, given=False)  # what the resume was told, kept for the next one


@pytest.mark.parametrize("policy", ["reinforce", "hierarchical"])
def test_a_resumed_session_that_runs_no_iteration_times_none(nmt, tmp_path, policy):
    """A resume the time limit (or a spent budget) stopped before its first iteration reported 0 s learner
    time per iteration (seconds_per_update 0.0), where the run had measured 0.098 s."""
    from policies.registry import place

    options = {**OPTIONS, **({"num_groups": 8} if policy == "hierarchical" else {})}
    context = RunContext(checkpoint_dir=tmp_path)
    first = place(policy, nmt, SimulatorMeasurer(nmt.graph, nmt.machine), 8, 0, context=context, **options)
    assert first.seconds_per_update > 0 and "s learner time per iteration" in first.notes
    again = place(policy, nmt, SimulatorMeasurer(nmt.graph, nmt.machine), 8, 0, context=context, **options)
    assert math.isnan(again.seconds_per_update) and "no iteration timed this session" in again.notes
