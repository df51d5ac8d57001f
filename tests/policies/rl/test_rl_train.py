"""train_placer end to end with an in-process RLlib Learner (no Ray cluster needed) on a toy problem."""

from __future__ import annotations

import math
import os
import re

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")


import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from graphs.errors import PlacerError  # noqa: E402
from graphs.grouping import Grouping  # noqa: E402
from measurers.base import Measurement  # noqa: E402
from measurers.machine import Device, Link, Machine  # noqa: E402
from policies.rl.config import RLConfig  # noqa: E402
from policies.rl.loop import train_placer  # noqa: E402

G = 10  # groups, two ops each


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """Every test here runs on one torch thread (see conftest)."""


def _machine() -> Machine:
    devices = (Device("cpu:0", "cpu", "X", 1e11, 1e10, 2**34, 1e-6),
               Device("gpu:0", "gpu", "Y", 1e13, 1e11, 2**34, 1e-6))
    return Machine("toy2", devices, (Link("cpu:0", "gpu:0", 1e10, 1e-5, "pcie"),
                                     Link("gpu:0", "cpu:0", 1e10, 1e-5, "pcie")))


class _ToyMeasurer:
    """runtime_s = each group's cost on its device + 0.3 s per device switch along the chain.

    Each group has one clearly cheaper device, so the single best placement is known. With
    ``oom_all_cpu`` a placement with every group on the cpu runs out of memory.
    """

    def __init__(self, seed: int = 0, oom_all_cpu: bool = False):
        self.oom_all_cpu = oom_all_cpu
        rng = np.random.default_rng(seed)
        cheap = rng.integers(0, 2, G)  # (G,) the better device of each group
        self.cost = np.where(np.arange(2)[None, :] == cheap[:, None], 0.1, 1.0)  # (G, 2)
        self.best_runtime_s = self.runtime_s(cheap)
        self.batch_sizes: list[int] = []
        self.measured: list[bytes] = []  # every group placement sent to measure, in order

    def runtime_s(self, group_placement: np.ndarray) -> float:
        return float(self.cost[np.arange(G), group_placement].sum() + 0.3 * np.count_nonzero(np.diff(group_placement)))

    def measure(self, placements):
        self.batch_sizes.append(len(placements))
        self.measured += [bytes(p[::2].astype(np.int64)) for p in placements]
        out = []
        for op_placement in placements:
            group_placement = op_placement[::2]
            runtime_s = self.runtime_s(group_placement)
            status = "oom" if self.oom_all_cpu and (group_placement == 0).all() else "ok"
            out.append(Measurement(runtime_s, (runtime_s,), status, (0, 0), 0.0))
        return out


def _train(budget: int, measurer=None, **kwargs):
    config = RLConfig(**{"batch_size": 8, "hidden_size": 32, "seed": 0, "noise_stop_iteration": 5,
                         "torch_threads": 1, **kwargs.pop("config", {})})
    grouping = Grouping(np.repeat(np.arange(G), 2), G, np.full(G, 3, np.uint8))
    features = np.random.default_rng(0).normal(size=(G, 6)).astype(np.float32)
    measurer = measurer or _ToyMeasurer()
    result = train_placer(None, _machine(), grouping, measurer, budget_measurements=budget, config=config,
                          features=features, **kwargs)
    return result, measurer


def test_train_placer__reinforce_best_improves_over_its_first_batch():
    result, measurer = _train(8 * 25, config={"trainer": "reinforce"})
    first = result.history[0]
    assert result.best_runtime_s < first.batch_best_runtime_s
    assert np.median([m.mean_reward for m in result.history[-5:]]) > first.mean_reward + 0.3
    assert result.best_runtime_s <= measurer.best_runtime_s + 0.6  # the optimum or within two device switches
    # one measure call per batch, holding only placements not measured before (the searches' accounting):
    assert all(1 <= size <= 8 for size in measurer.batch_sizes) and len(measurer.batch_sizes) <= result.iterations
    assert len(set(measurer.measured)) == len(measurer.measured) == result.measurements_used
    assert result.measurements_used == 8 * 25 or result.stop_reason == "converged"
    assert measurer.runtime_s(result.best_group_placement) == pytest.approx(result.best_runtime_s)
    np.testing.assert_array_equal(result.best_op_placement, np.repeat(result.best_group_placement, 2))


def test_train_placer__ppo_trains_and_cuts_the_last_batch_to_the_budget():
    result, measurer = _train(8 * 3 + 5, config={"trainer": "ppo", "ppo_epochs": 2})
    assert sum(measurer.batch_sizes) == result.measurements_used == 29 and result.stop_reason == "budget"
    assert max(measurer.batch_sizes) <= 8 and result.iterations == len(result.history) >= 4
    assert result.history[-1].batch_size <= 29 - result.history[-2].measurements_used < 8  # the last batch cut
    assert all(np.isfinite([m.loss, m.entropy, m.baseline]).all() for m in result.history)
    assert result.greedy_group_placement.shape == (G,)
    assert result.seconds_per_update > 0


def test_train_placer__a_ppo_batch_of_one_warns_of_nothing():
    """A budget's last batch of one placement: RLlib took the variance of one value and torch printed two
    UserWarnings ("degrees of freedom is <= 0") on the user's terminal."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, _ = _train(10, config={"trainer": "ppo", "ppo_epochs": 1})
    assert result.history[-1].batch_size == 1  # 8, 3 (some measured before), then 1
    assert not [w for w in caught if "degrees of freedom" in str(w.message)]


def test_train_placer__same_seed_and_measurer_give_the_same_run():
    a, _ = _train(24)
    b, _ = _train(24)
    c, _ = _train(24, config={"seed": 1})
    assert [m.mean_reward for m in a.history] == [m.mean_reward for m in b.history]
    np.testing.assert_array_equal(a.best_group_placement, b.best_group_placement)
    assert [m.mean_reward for m in a.history] != [m.mean_reward for m in c.history]


@pytest.mark.parametrize("trainer", ["reinforce", "ppo"])
def test_train_placer__resume_continues_exactly_where_the_run_stopped(tmp_path, trainer):
    straight, _ = _train(40, config={"trainer": trainer})
    done = []  # the first session stops after two batches, as a killed run does (between batches)
    first, _ = _train(40, config={"trainer": trainer}, checkpoint_dir=tmp_path, should_stop=lambda: len(done) >= 2,
                      on_iteration=done.append)
    batches = []
    resumed, measurer = _train(40, config={"trainer": trainer}, resume_from=tmp_path,
                               on_batch=lambda it, gp, op, ms, rw: batches.append(it))
    assert batches == list(range(first.iterations, straight.iterations))  # numbering goes on
    assert sum(measurer.batch_sizes) == 40 - first.measurements_used  # repeats of the first part not measured
    assert resumed.measurements_used == 40 and resumed.iterations == straight.iterations
    assert [m.mean_reward for m in resumed.history] == [m.mean_reward for m in straight.history[first.iterations:]]
    assert resumed.best_runtime_s == straight.best_runtime_s


def test_train_placer__trains_with_deterministic_torch_and_restores_the_setting_after():
    seen = []
    assert not torch.are_deterministic_algorithms_enabled()
    result, _ = _train(16, on_iteration=lambda m: seen.append(torch.are_deterministic_algorithms_enabled()))
    assert seen == [True] * result.iterations and len(seen) >= 2 and not torch.are_deterministic_algorithms_enabled()


def test_checkpoint_progress__iterations_and_measurements_of_the_checkpoint(tmp_path):
    from policies.rl.learner_file import checkpoint_progress

    assert checkpoint_progress(tmp_path) == (0, 0)  # no checkpoint: a run starts at the beginning
    _train(8 * 2 + 5, checkpoint_dir=tmp_path)
    assert checkpoint_progress(tmp_path) == (3, 21)


def test_train_placer__resume_rejects_a_checkpoint_of_another_model(tmp_path):
    _train(8, checkpoint_dir=tmp_path)
    with pytest.raises(PlacerError, match="hidden_size"):
        _train(16, config={"hidden_size": 16}, resume_from=tmp_path)
    with pytest.raises(PlacerError, match=r"was trained with temperature=.*this run has 0\.5"):
        _train(16, config={"temperature": 0.5}, resume_from=tmp_path)  # every logit would mean another thing
    with pytest.raises(PlacerError, match="no learner checkpoint"):
        _train(16, resume_from=tmp_path / "missing")


def test_train_placer__on_batch_sees_every_measured_placement():
    seen = []
    result, measurer = _train(16, on_batch=lambda it, gp, op, ms, rw: seen.append((it, gp.shape, op.shape, len(ms),
                                                                                    rw.shape)))
    sizes = [m.batch_size for m in result.history]  # sampled per iteration: repeats included
    assert seen == [(it, (b, G), (b, 2 * G), b, (b,)) for it, b in enumerate(sizes)]
    assert sizes[:2] == [8, 8] and sum(measurer.batch_sizes) == result.measurements_used == 16


def test_train_placer__stops_when_asked_or_out_of_time():
    calls = []
    result, _ = _train(80, should_stop=lambda: len(calls) >= 2, on_iteration=calls.append)
    assert result.iterations == 2 and result.stop_reason == "should_stop"
    result, measurer = _train(80, time_limit_s=0.0)
    assert result.iterations == 0 and result.stop_reason == "time_limit" and measurer.batch_sizes == []
    assert result.best_group_placement is None and result.best_runtime_s == float("inf")


def test_rl_config__rejects_bad_settings():
    with pytest.raises(PlacerError, match="unknown trainer"):
        RLConfig(trainer="dqn")
    with pytest.raises(PlacerError, match="batch_size"):
        RLConfig(batch_size=1)


NAN = float("nan")


@pytest.mark.parametrize("options, message", [
    ({"checkpoint_every": 0}, "checkpoint_every must be a whole number >= 1, got 0"),  # a ZeroDivisionError
    ({"lr": NAN}, "lr must be a finite number above 0, got nan"),  # NaN probabilities on the 2nd iteration
    ({"temperature": NAN}, "temperature must be a finite number above 0, got nan"),
    ({"ce_window": 2.5}, "ce_window must be a whole number >= 1, got 2.5"),  # a TypeError
    ({"seed": 1.5}, "seed must be a whole number"),
    ({"baseline_decay": 1.5}, "baseline_decay must lie in [0, 1), got 1.5"),  # a ValueError from RLlib's build
    ({"entropy_coeff": NAN}, "entropy_coeff must be a finite number >= 0, got nan"),  # these: accepted, and a
    ({"lr": -1e-3}, "lr must be a finite number above 0, got -0.001"),  # NaN loss or gradient ascent followed
    ({"batch_size": 8.5}, "batch_size must be a whole number >= 2, got 8.5"),
    ({"ppo_epochs": 0}, "ppo_epochs must be a whole number >= 1, got 0"),
    ({"penalty_runtime_s": float("inf")}, "penalty_runtime_s must be a finite number above 0, got inf"),
])
def test_rl_config__a_nan_a_fraction_or_a_negative_rate_is_refused_before_training(options, message):
    with pytest.raises(PlacerError, match=re.escape(message)):
        RLConfig(**options)


def test_rl_config__the_settings_that_may_be_none_may_be():
    config = RLConfig(lr=None, warm_entropy_coeff=None, ppo_minibatch_size=None, torch_threads=None)
    assert config.for_warm_start().entropy_coeff == config.entropy_coeff


def test_reinforce_policy__places_a_real_problem_through_the_policy_protocol():
    from graphs.synthetic import synthetic_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.rl.seq2seq.policy import PPOPolicy, ReinforcePolicy

    graph, machine = synthetic_graph(120, seed=3), load_machine("paper-2gpu")
    problem = make_problem(graph, machine, max_groups=12)
    measurer = SimulatorMeasurer(graph, machine)
    seen = []
    options = {"batch_size": 4, "hidden_size": 16, "torch_threads": 1}
    result = ReinforcePolicy(**options).place(problem, measurer, budget=10, seed=0,
                                              on_measurement=lambda p, m: seen.append(m))
    assert result.policy == "reinforce" and result.measurements == 10 and len(seen) == 10
    assert result.op_placement.shape == (graph.num_ops,)
    assert result.best.runtime_s == min(m.runtime_s for m in seen if m.ok)
    assert measurer.measure([result.op_placement])[0].runtime_s == result.best.runtime_s
    assert problem.unit_allowed[np.arange(problem.num_units), result.group_placement].all()
    assert PPOPolicy(**options).place(problem, measurer, budget=4, seed=0).measurements == 4


def test_reinforce__beats_random_search_at_the_same_budget_on_a_small_graph():
    from graphs.synthetic import synthetic_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import make_policy
    from policies.rl.seq2seq.policy import ReinforcePolicy

    graph, machine = synthetic_graph(400, seed=1), load_machine("paper-2gpu")
    problem = make_problem(graph, machine, max_groups=16)
    measurer = SimulatorMeasurer(graph, machine)
    budget = 320
    learned = ReinforcePolicy(batch_size=16, hidden_size=32, torch_threads=1).place(problem, measurer, budget, seed=0)
    searched = make_policy("random").place(problem, measurer, budget, seed=0)
    assert learned.measurements == searched.measurements == budget
    assert learned.best.runtime_s < 0.97 * searched.best.runtime_s


def test_centered_ranks__orders_the_batch_and_shares_ties():
    from policies.rl.reinforce import centered_ranks

    ranks = centered_ranks(torch.tensor([-3.0, -1.0, -2.0, -1.0]))
    assert torch.allclose(ranks, torch.tensor([-0.5, 0.5 - 1 / 6, -0.5 + 1 / 3, 0.5 - 1 / 6]))
    assert torch.equal(centered_ranks(torch.tensor([2.0])), torch.zeros(1))


def test_train_placer__repeats_cost_nothing_and_a_run_with_nothing_new_stops_converged():
    """One group on two devices: two placements exist; after both are measured every batch is repeats,
    measured never again, and the run stops as converged instead of spinning until the budget."""
    from policies.rl.loop import STALL_ITERATIONS

    class Constant:
        calls: list[int] = []

        def measure(self, placements):
            self.calls.append(len(placements))
            return [Measurement(1.0, (1.0,), "ok", (0, 0), 0.0) for _ in placements]

    measurer = Constant()
    grouping = Grouping(np.zeros(2, dtype=np.int64), 1, np.full(1, 3, np.uint8))
    features = np.ones((1, 6), dtype=np.float32)
    result = train_placer(None, _machine(), grouping, measurer, budget_measurements=1000, features=features,
                          config=RLConfig(batch_size=4, hidden_size=8, seed=0, torch_threads=1))
    assert result.stop_reason == "converged" and result.measurements_used == sum(measurer.calls) <= 2
    assert result.iterations >= STALL_ITERATIONS and result.iterations < 1000 // 4


def _one_group_run(measurer, tmp_path, budget: int = 1000, **kwargs):
    """One group on the toy machine's two devices, checkpointed every iteration into ``tmp_path``."""
    grouping = Grouping(np.zeros(2, dtype=np.int64), 1, np.full(1, 3, np.uint8))
    return train_placer(None, _machine(), grouping, measurer, budget_measurements=budget,
                        features=np.ones((1, 6), dtype=np.float32), checkpoint_dir=tmp_path,
                        config=RLConfig(batch_size=4, hidden_size=8, seed=0, torch_threads=1, checkpoint_every=1),
                        **kwargs)


class _GpuOkCpuTimesOut:
    """The gpu placement runs in 1 s; the cpu one times out with no peaks, as the pool reports a timeout."""

    def measure(self, placements):
        return [Measurement(1.0, (1.0,), "ok", (0, 0), 0.0) if p[0] == 1
                else Measurement(float("nan"), (), "timeout", (), 5.0, "timed out") for p in placements]


def test_train_placer__a_measurement_without_peaks_is_checkpointed_and_read_back(tmp_path):
    """A pool's timeout, crash or error has no peaks: the memo's checkpoint used to fail on it."""
    from policies.rl.loop import CHECKPOINT_FILE, memo_from_state

    result = _one_group_run(_GpuOkCpuTimesOut(), tmp_path, budget=8)
    assert result.measurements_used == 2 and result.best_runtime_s == 1.0
    memo = memo_from_state(torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["memo"])
    by_device = {np.frombuffer(key, dtype=np.int64)[0]: m for key, m in memo.items()}
    assert by_device[0].status == "timeout" and by_device[0].peak_bytes == ()
    assert by_device[1].status == "ok" and by_device[1].peak_bytes == (0, 0)


def test_train_placer__a_resumed_run_converges_at_the_iteration_one_run_does(tmp_path):
    from policies.rl.loop import STALL_ITERATIONS

    whole = _one_group_run(_GpuOkCpuTimesOut(), tmp_path / "whole")
    assert whole.stop_reason == "converged"
    iterations = []
    stop_at = whole.iterations - STALL_ITERATIONS // 2  # well inside the stall
    first = _one_group_run(_GpuOkCpuTimesOut(), tmp_path / "cut", should_stop=lambda: len(iterations) >= stop_at,
                           on_iteration=iterations.append)
    assert first.stop_reason == "should_stop" and first.iterations == stop_at
    resumed = _one_group_run(_GpuOkCpuTimesOut(), tmp_path / "cut", resume_from=tmp_path / "cut")
    assert resumed.stop_reason == "converged" and resumed.iterations == whole.iterations
    again = _one_group_run(_GpuOkCpuTimesOut(), tmp_path / "cut", budget=2000, resume_from=tmp_path / "cut")
    assert again.iterations == whole.iterations + STALL_ITERATIONS  # a larger budget: it samples again


def test_resumed_stall_count_goes_on_from_a_cut_run_and_starts_over_after_a_converged_one():
    """What a resumed seq2seq / post / ppo / hierarchical run counts its stall from: where it stopped, 0 for a
    converged run (a larger budget samples again) and for a learner.pt written before the count was saved."""
    from policies.rl.loop import STALL_ITERATIONS, resumed_stall_count

    assert resumed_stall_count({"stalled": STALL_ITERATIONS - 1}) == STALL_ITERATIONS - 1
    assert resumed_stall_count({"stalled": STALL_ITERATIONS}) == 0
    assert resumed_stall_count({}) == 0


class _SlowGpuCpuTimesOut:
    """The gpu placement runs in 150 s (a real CPU step can last longer than the 100 s penalty); the cpu
    one times out."""

    def measure(self, placements):
        return [Measurement(150.0, (150.0,), "ok", (0, 0), 0.0) if p[0] == 1
                else Measurement(float("nan"), (), "timeout", (), 5.0, "timed out") for p in placements]


def test_train_placer__a_failure_scores_worse_than_a_step_slower_than_the_penalty(tmp_path):
    """A failure scores 3x the slowest step measured when that is above the 100 s penalty, in a resumed
    run too, whose memo answers every placement without measuring it again."""
    scored = []  # per run: {(status, reward)}
    iterations = []

    def keep(iteration, group_placements, op_placements, measurements, rewards):
        scored[-1].update((m.status, round(float(r), 6)) for m, r in zip(measurements, rewards))

    expected = {("ok", round(-math.sqrt(150.0), 6)), ("timeout", round(-math.sqrt(450.0), 6))}
    scored.append(set())
    first = _one_group_run(_SlowGpuCpuTimesOut(), tmp_path, on_batch=keep, on_iteration=iterations.append,
                           should_stop=lambda: len(iterations) >= 3)
    assert first.measurements_used == 2 and scored[-1] == expected
    scored.append(set())
    resumed = _one_group_run(_SlowGpuCpuTimesOut(), tmp_path, on_batch=keep, resume_from=tmp_path, budget=40)
    assert resumed.measurements_used == 2 and resumed.iterations > 3 and scored[-1] == expected


def test_ppo__the_critic_learns_rewards_below_minus_ten():
    """A failure scored above 100 s gives a reward below -10; the critic's squared error then exceeds 100
    (the old clip) and must still move its value towards the reward."""
    from ray.rllib.core.columns import Columns

    from policies.rl.env import PlacementEnv
    from policies.rl.loop import _Trainer

    grouping = Grouping(np.zeros(2, dtype=np.int64), 1, np.full(1, 3, np.uint8))
    env = PlacementEnv(None, _machine(), grouping, _SlowGpuCpuTimesOut(), features=np.ones((1, 6), np.float32))
    trainer = _Trainer(env, RLConfig(trainer="ppo", batch_size=4, hidden_size=8, seed=0, torch_threads=1))
    obs = np.repeat(trainer.obs[None], 4, axis=0)  # (B, G, F + D)

    def value() -> float:
        with torch.no_grad():
            return float(trainer.module.compute_values({Columns.OBS: torch.from_numpy(obs)}).mean())

    before = value()
    rewards = np.full(4, -math.sqrt(450.0))  # (B,) four timeouts scored 3x a 150 s step
    for _ in range(5):
        with torch.no_grad():
            out = trainer.module.forward_exploration({Columns.OBS: torch.from_numpy(obs)}, generator=trainer.generator)
        trainer._update(trainer._train_batch(obs, out[Columns.ACTIONS].numpy().astype(np.int64), rewards, out), 4)
    assert value() < before - 0.01
