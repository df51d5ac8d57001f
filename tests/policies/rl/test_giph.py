"""``giph`` (policies/rl/gnn/giph.py, GiphNet, GiphPolicy): its moves relocate a group to another allowed
device, the learner's log-probabilities are those the episodes were sampled with, a short training
improves, the checkpoint round-trips, a second place() on a machine with a device fewer keeps the network
and starts at the warm start, and `placer search --policy giph` runs end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from graphs.errors import PlacerError
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
from policies.base import BudgetedMeasurer, CountingMeasurer, DecisionClock
from policies.problem import make_problem
from policies.rl.gnn.checkpoint import read_checkpoint
from policies.rl.gnn.config import GnnConfig
from policies.rl.gnn.family import TrainProblem, train_family
from policies.rl.gnn.giph import giph_batch, random_placement, run_episodes
from policies.rl.gnn.network import full_placement_state, placement_state
from policies.rl.gnn.policy import GiphPolicy
from policies.rl.gnn.problems import Slot

torch.set_num_threads(1)
SMALL = GnnConfig(kind="giph", hidden_size=8, num_layers=1, batch_size=4, episode_steps=6, seed=0)
SMALL_OPTIONS = {"init": "scratch", "hidden_size": 8, "num_layers": 1}


@pytest.fixture(scope="module")
def setup():
    graph, machine = load_graph("synthetic:200"), load_machine("hetero:1")
    return make_problem(graph, machine, max_groups=8), SimulatorMeasurer(graph, machine)


def _trainer(config: GnnConfig = SMALL):
    from policies.rl.gnn.trainer import GnnTrainer
    return GnnTrainer(config)


def _slot(problem, measurer, budget: int = 10_000) -> Slot:
    return Slot(problem, BudgetedMeasurer(measurer, budget, problem.capacity_bytes(), DecisionClock()))


def test_moves_leave_the_current_device_for_an_allowed_one(setup):
    problem, measurer = setup
    slot = _slot(problem, measurer)
    rng = np.random.default_rng(3)
    allowed = slot.inputs.allowed.copy()
    allowed &= rng.random(allowed.shape) < 0.6
    allowed[np.arange(slot.num_groups), rng.integers(0, allowed.shape[1], slot.num_groups)] = True
    slot.inputs.allowed[:] = allowed  # fewer allowed pairs than the problem's: the mask must keep to them
    slot.tensors["allowed"] = torch.from_numpy(allowed)
    start = random_placement(slot, rng)
    assert allowed[np.arange(slot.num_groups), start].all()
    trainer = _trainer()
    episodes = run_episodes(trainer.net, slot, start, 8, 30, trainer.generator, measure=False)
    assert episodes.steps == 30
    devices = problem.num_devices
    for b in range(8):
        placement = start.copy()
        for move in episodes.actions[b]:
            group, device = divmod(int(move), devices)
            assert device != placement[group] and allowed[group, device]
            placement[group] = device
        np.testing.assert_array_equal(placement, episodes.final[b])


def test_greedy_moves_never_return_to_a_visited_placement(setup):
    problem, measurer = setup
    slot = _slot(problem, measurer)
    trainer = _trainer()
    start = slot.fastest_device_start()
    episodes = run_episodes(trainer.net, slot, start, 1, 40, trainer.generator, greedy=True, measure=False)
    placement, seen = start.copy(), {start.tobytes()}
    for move in episodes.actions[0]:
        group, device = divmod(int(move), problem.num_devices)
        placement[group] = device
        assert placement.tobytes() not in seen
        seen.add(placement.tobytes())
    assert len(seen) == 41


def test_full_state_matches_placetos_state_of_each_group(setup):
    problem, measurer = setup
    slot = _slot(problem, measurer)
    placements = torch.from_numpy(np.stack([random_placement(slot, np.random.default_rng(s)) for s in range(3)]))
    full = full_placement_state(placements, slot.adjacency, slot.work, slot.total_work_s)  # (3, G, D, 3)
    for g in range(slot.num_groups):
        one = placement_state(placements, torch.full((3,), g), slot.adjacency, slot.work, slot.total_work_s)
        torch.testing.assert_close(full[:, g], one)


def test_learner_log_prob_is_the_sampling_log_prob(setup):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from policies.rl.gnn.module import ACTIONS, GRAPH_KEYS, LOGITS, decision_logp
    problem, measurer = setup
    slot = _slot(problem, measurer)
    trainer = _trainer()
    start = slot.fastest_device_start()
    batch, _, _ = giph_batch(trainer.net, slot, start, 4, 6, 0.9, trainer.generator)
    graph = {key: np.repeat(slot.tensors[key].numpy()[None], 4, axis=0) for key in GRAPH_KEYS}
    module = trainer.learner.module[DEFAULT_MODULE_ID].unwrapped()
    with torch.no_grad():
        logits = module._forward_train({k: torch.as_tensor(v) for k, v in {**graph, **batch}.items()})[LOGITS]
        learner_logp = decision_logp(logits, torch.as_tensor(batch[ACTIONS]))  # (B, S)
        devices = problem.num_devices
        for b in range(4):  # replay episode b move by move
            placement = torch.from_numpy(start.copy())
            groups, device_embed = trainer.net.embed(slot.tensors)
            for s, move in enumerate(batch[ACTIONS][b]):
                state = full_placement_state(placement, slot.adjacency, slot.work, slot.total_work_s)
                step = trainer.net.step_logits(groups, device_embed, slot.tensors, torch.arange(slot.num_groups), state)
                expected = torch.log_softmax(step, dim=-1)[int(move)]
                assert abs(float(learner_logp[b, s]) - float(expected)) < 1e-4
                assert float(expected) > -30  # a sampled move was never a masked one
                placement[int(move) // devices] = int(move) % devices


def test_short_training_improves_the_moves(setup):
    from policies.rl.loop import deterministic_torch
    problem, measurer = setup
    config = GnnConfig(kind="giph", hidden_size=16, num_layers=1, batch_size=8, episode_steps=4, lr=3e-3,
                       entropy_coeff=0.0, seed=1)
    slot = _slot(problem, measurer, budget=100_000)
    start = slot.fastest_device_start()
    with deterministic_torch():
        trainer = _trainer(config)

        def mean_gain(episodes: int = 64) -> float:
            runs = run_episodes(trainer.net, slot, start, episodes, 4, trainer.generator)
            return float(np.mean(slot.scored(measurer_runtime(slot, start)) - slot.scored(runs.runtimes).min(axis=1)))

        before = mean_gain()
        for _ in range(60):
            trainer.iterate(slot, start)
        after = mean_gain()
    assert after > before * 1.2 and after > 0


def measurer_runtime(slot: Slot, units: np.ndarray) -> np.ndarray:
    return slot.measure(np.asarray(units)[None])


def test_checkpoint_round_trips_and_a_policy_starts_from_it(setup, tmp_path):
    problem, measurer = setup
    other_graph, other_machine = load_graph("synthetic:200"), load_machine("paper-2gpu")
    problems = [TrainProblem("s@hetero:1", problem, measurer),
                TrainProblem("s@paper-2gpu", make_problem(other_graph, other_machine, max_groups=6),
                             SimulatorMeasurer(other_graph, other_machine))]
    out = tmp_path / "giph.pt"
    result = train_family(problems, SMALL, 300, out)
    assert result.updates > 2 and result.measurements_used <= 300
    state = read_checkpoint(out, "giph")
    assert state["architecture"] == {"kind": "giph", "hidden_size": 8, "num_layers": 1}
    with pytest.raises(PlacerError, match="giph checkpoint, not placeto"):
        read_checkpoint(out, "placeto")
    policy = GiphPolicy(init=str(out))
    found = policy.place(problem, CountingMeasurer(measurer), 1, 0)
    trained = _trainer(policy.config(0))  # the search's episode length, the checkpoint's network
    trained.load_state(state["trainer"], weights_only=True)
    np.testing.assert_array_equal(found.group_placement, trained.greedy(_slot(problem, measurer)))
    with pytest.raises(PlacerError, match="rewards only"):
        trained.imitate([_slot(problem, measurer)], [found.group_placement], 2)


def test_every_budget_above_one_measures_the_zero_shot_placement(setup):
    """Budget 1 measures the end of the greedy walk; budgets 2-3 (fewer than the walk's start and its 3
    moves) measured the start and the first moves only, and found worse than budget 1 did."""
    problem, measurer = setup
    placements = {}
    for budget in (1, 2, 3, 4, 6):
        measured = []
        GiphPolicy(**SMALL_OPTIONS).place(problem, measurer, budget, 0,
                                          on_measurement=lambda placement, *rest: measured.append(tuple(placement)))
        placements[budget] = measured
    (zero_shot,) = placements[1]
    assert all(zero_shot in measured for measured in placements.values()), placements


def test_a_walk_that_ends_overflowing_memory_is_repaired_at_every_budget(monkeypatch):
    """Budget 1 measured the repaired end of the greedy walk; a budget that holds the walk measured its end
    as it was, out of memory, and never the zero-shot answer."""
    from conftest import with_gpu_memory
    from policies.rl.gnn.trainer import GnnTrainer

    graph = load_graph("synthetic:200")
    roomy = make_problem(graph, load_machine("paper-2gpu"), max_groups=8)
    machine = with_gpu_memory(roomy.machine, 0.95 * roomy.single_device_peak_bytes)  # a GPU holds 95%
    problem, measurer = make_problem(graph, machine, max_groups=8), SimulatorMeasurer(graph, machine)
    last_gpu = problem.gpu_indices()[-1]  # not the start's GPU, so its repair is not the start
    one_gpu = problem.repair_allowed(np.full(problem.num_units, last_gpu))  # (G,) overflows
    monkeypatch.setattr(GnnTrainer, "greedy", lambda self, slot, start=None: one_gpu.copy())
    monkeypatch.setattr(GnnTrainer, "giph_rollout", lambda self, slot, start, measure=True: one_gpu.copy())
    measured = {}
    for budget in (1, 20):
        seen = []
        GiphPolicy(**SMALL_OPTIONS, episode_steps=3).place(
            problem, measurer, budget, 0, on_measurement=lambda placement, *rest: seen.append(tuple(placement)))
        measured[budget] = seen
    (zero_shot,) = measured[1]
    assert zero_shot != tuple(problem.expand(one_gpu))  # repaired
    assert zero_shot in measured[20]


def test_second_place_on_a_smaller_machine_keeps_the_network_and_starts_at_the_warm_start(setup):
    problem, measurer = setup
    graph, machine = problem.graph, problem.machine
    policy = GiphPolicy(**SMALL_OPTIONS)
    first = policy.place(problem, measurer, 60, 0)
    trainer = policy.trainer
    assert trainer.iteration > 0
    trained = {k: v.clone() for k, v in trainer.net.state_dict().items()}
    gpu = next(d.name for d in machine.devices if d.kind == "gpu")
    smaller = machine.without_devices([gpu])
    kept = machine.kept_device_indices([gpu])
    small_problem = make_problem(graph, smaller, max_groups=8)
    units = first.group_placement.copy()
    gone = ~np.isin(units, kept)
    units[gone] = kept[0]  # the removed GPU's groups to the first kept device
    warm_units = np.searchsorted(kept, units)
    warm_ops = small_problem.expand(warm_units)
    policy.warm_start = [warm_ops]
    measured = []
    second = policy.place(small_problem, SimulatorMeasurer(graph, smaller), 1, 0,
                          on_measurement=lambda placement, *rest: measured.append(np.array(placement)))
    assert policy.trainer is trainer
    for key, value in trainer.net.state_dict().items():
        torch.testing.assert_close(value, trained[key])  # not reloaded from init (scratch would differ)
    np.testing.assert_array_equal(measured[0], warm_ops)
    np.testing.assert_array_equal(second.op_placement, warm_ops)
    fresh = GiphPolicy(**SMALL_OPTIONS)
    fresh.place(small_problem, SimulatorMeasurer(graph, smaller), 1, 0)
    assert any(not torch.equal(value, trained[k]) for k, value in fresh.trainer.net.state_dict().items())


@pytest.mark.slow  # starts Ray
def test_placer_search_runs_giph_on_a_held_out_machine(tmp_path, capsys):
    from cluster.cli import main

    code = main(["search", "--policy", "giph", "--graph", "synthetic:200", "--machine", "hetero:1000",
                 "--budget", "40", "--groups", "8", "--workers", "1", "--out", str(tmp_path), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and 1 <= result["measurements"] <= 40
    assert np.isfinite(result["overall_best_runtime_s"])


def test_placer_train_refuses_a_teacher_for_giph(tmp_path, capsys):
    from cluster.cli import main

    code = main(["train", "--policy", "giph", "--graphs", "synthetic:200", "--machines", "hetero:1", "--budget", "50",
                 "--teacher-budget", "8", "-o", str(tmp_path / "giph.pt")])
    assert code == 2 and "rewards only" in capsys.readouterr().err
    assert not (tmp_path / "giph.pt").exists()


@pytest.mark.parametrize("flag", ["--episode-steps", "--discount"])
def test_placer_train_refuses_giphs_flags_for_the_other_placers(tmp_path, capsys, flag):
    from cluster.cli import main

    code = main(["train", "--policy", "placeto", "--graphs", "synthetic:200", "--machines", "hetero:1",
                 "--budget", "50", flag, "8", "-o", str(tmp_path / "placeto.pt")])
    assert code == 2 and f"{flag}: only for --policy giph" in capsys.readouterr().err
    assert not (tmp_path / "placeto.pt").exists()
