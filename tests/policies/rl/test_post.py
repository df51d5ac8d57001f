"""Post: a factorized policy trained by PPO with cross-entropy minimization steps toward the elites."""

from __future__ import annotations

import os

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from graphs.grouping import Grouping  # noqa: E402
from measurers.catalog import load_machine  # noqa: E402
from measurers.sim.measurer import SimulatorMeasurer  # noqa: E402
from policies.problem import make_problem  # noqa: E402
from policies.rl.config import RLConfig  # noqa: E402

OPTIONS = {"batch_size": 4, "hidden_size": 16, "torch_threads": 1}
G = 10


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """Every test here runs on one torch thread (see conftest)."""


@pytest.fixture(scope="module")
def nmt():
    from graphs.registry import load_graph

    graph = load_graph("nmt-2")
    return make_problem(graph, load_machine("paper-2gpu"), max_groups=8)


def _trainer(**fields):
    from policies.rl.env import PlacementEnv
    from policies.rl.loop import _Trainer, deterministic_torch

    mask = np.full(G, 3, np.uint8)
    mask[0] = 1  # group 0 may only use the cpu
    grouping = Grouping(np.arange(G), G, mask)
    features = np.random.default_rng(0).normal(size=(G, 4)).astype(np.float32)
    env = PlacementEnv(None, load_machine("paper-2gpu"), grouping, None, features=features)
    config = RLConfig(**{"trainer": "ppo", "module": "factorized", "batch_size": 4, "torch_threads": 1,
                         "ce_every": 1, "ce_window": 1, "elite_fraction": 0.25, **fields})
    with deterministic_torch():  # building a learner seeds torch and turns deterministic kernels on: restored here
        return _Trainer(env, config)


def _probs(trainer) -> np.ndarray:
    """(G, D) device probabilities, group index order."""
    import torch
    from ray.rllib.core.columns import Columns

    flat = trainer.module.forward_inference({Columns.OBS: torch.from_numpy(trainer.obs[None])})
    probs = torch.softmax(flat[Columns.ACTION_DIST_INPUTS].view(G, -1), dim=-1).numpy()
    out = np.empty_like(probs)
    out[trainer.order] = probs
    return out


def test_factorized_module__uniform_over_allowed_devices_and_forbidden_ones_never_drawn():
    trainer = _trainer()
    probs = _probs(trainer)
    assert probs[0, 0] == pytest.approx(1.0) and probs[0, 1:].max() == 0.0
    np.testing.assert_allclose(probs[1:], 1 / 3, rtol=1e-5)


def test_cross_entropy_step__moves_the_distribution_toward_the_elites():
    trainer = _trainer(ce_steps=10)
    rng = np.random.default_rng(0)
    actions = rng.integers(1, 3, (4, G))  # (B, G): GPUs only
    actions[:, 0] = 0
    runtimes = np.array([2.0, 1.0, 3.0, np.inf])  # row 1 is the elite (top quarter), row 3 failed
    trainer.best_group_placement = actions[1].copy()
    before = _probs(trainer)
    trainer._cross_entropy_step(runtimes, actions)
    after = _probs(trainer)
    rows = np.arange(1, G)  # group 0 has one allowed device: probability 1 throughout
    assert (after[rows, actions[1][1:]] > before[rows, actions[1][1:]] + 0.01).all()
    other = rows[actions[2][1:] != actions[1][1:]]  # the worst ok placement's devices where it differs
    assert len(other) and (after[other, actions[2][other]] < before[other, actions[2][other]]).all()
    assert trainer.imitation_steps == 10


def test_cross_entropy_step__only_every_ce_every_iterations():
    trainer = _trainer(ce_every=3)
    actions = np.zeros((4, G), dtype=np.int64)
    for _ in range(2):
        trainer._cross_entropy_step(np.ones(4), actions)
        trainer.iteration += 1
    assert trainer.imitation_steps == 0
    trainer._cross_entropy_step(np.ones(4), actions)
    assert trainer.imitation_steps == trainer.config.ce_steps


class _Counting:
    def __init__(self, measurer):
        self.measurer, self.measured = measurer, 0

    def measure(self, placements):
        self.measured += len(placements)
        return self.measurer.measure(placements)


def _post(problem, seed: int, budget: int = 18, **options):
    from policies.registry import place

    measurer = _Counting(SimulatorMeasurer(problem.graph, problem.machine))
    seen = []
    result = place("post", problem, measurer, budget, seed, lambda p, m: seen.append(m.runtime_s),
                   **{**OPTIONS, **options})
    return result, measurer, seen


def test_post__stays_within_budget_and_returns_its_best_measurement(nmt):
    result, measurer, seen = _post(nmt, 0)
    assert measurer.measured == 18 == result.measurements == len(seen)
    assert result.best.runtime_s == pytest.approx(min(seen))
    assert result.policy == "post" and result.op_placement.shape == (nmt.graph.num_ops,)


def test_post__same_seed_same_run_other_seed_other_run(nmt):
    a = _post(nmt, 0)[2]
    b = _post(nmt, 0)[2]
    c = _post(nmt, 1)[2]
    assert a == b and a != c


def test_post__warm_started_run_starts_from_and_never_reports_worse_than_its_warm_start(nmt):
    one_gpu = nmt.expand(np.full(nmt.num_units, 1))
    result, measurer, seen = _post(nmt, 0, warm_start=[one_gpu])
    assert measurer.measured == 18 and result.best.runtime_s <= seen[0]


def test_elite_costs__runtime_when_ok_overflow_when_out_of_memory_inf_when_rejected():
    from measurers.base import Measurement

    trainer = _trainer()
    capacity = trainer.env.machine.devices[1].memory_bytes
    fits = Measurement(0.5, (0.5,), "ok", (0, 1, 1), 0.0)
    near = Measurement(float("nan"), (), "oom", (0, capacity + 1, 0), 0.0)
    far = Measurement(float("nan"), (), "oom", (0, 3 * capacity, 0), 0.0)
    rejected = Measurement(float("nan"), (), "error", (0, 0, 0), 0.0, "group 0 may not run on gpu:0")
    costs = trainer._elite_costs([fits, far, near, rejected])
    assert costs[0] == 0.5 and costs[0] < costs[2] < costs[1] < np.inf and costs[3] == np.inf


def test_post__uniform_mix_is_refused_for_the_seq2seq_module():
    from graphs.errors import PlacerError
    from policies.rl.config import RLConfig

    assert RLConfig(module="factorized", uniform_mix=0.05).uniform_mix == 0.05
    with pytest.raises(PlacerError, match="uniform_mix applies to the factorized module only"):
        RLConfig(module="seq2seq", uniform_mix=0.05)
