"""``gdp`` and ``placeto`` as registry policies (policies/rl/gnn/policy.py) and their trainer
(trainer.py): the budget is kept, fine-tuning never ends worse than the zero-shot or warm-start
placement, runs repeat under a seed, imitation reaches its target, and a run resumes from its own
checkpoint instead of starting over."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import check_a_resume_inside_a_stall, check_stall_count_in_learner_state, with_gpu_memory
from graphs.errors import PlacerError
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
from policies.base import BudgetedMeasurer, CountingMeasurer, DecisionClock, RunContext
from policies.problem import make_problem
from policies.registry import make_policy, place
from policies.rl.gnn.config import GnnConfig
from policies.rl.gnn.problems import Slot

torch.set_num_threads(1)
SMALL = {"init": "scratch", "hidden_size": 8, "num_layers": 1, "batch_size": 4}
KINDS = ("gdp", "placeto")
SEED_WHOSE_SECOND_PASS_MOVES = 25  # a scratch network whose second greedy pass moves groups


@pytest.fixture(scope="module")
def setup():
    graph, machine = load_graph("synthetic:200"), load_machine("paper-2gpu")
    return make_problem(graph, machine, max_groups=8), SimulatorMeasurer(graph, machine)


def _runtime_s(problem, measurer, units: np.ndarray) -> float:
    [result] = measurer.measure([problem.expand(np.asarray(units))])
    assert result.ok
    return result.runtime_s


def _greedy(kind: str, problem, seed: int = 0) -> np.ndarray:
    """The zero-shot placement of a scratch network built as the policy builds it."""
    from policies.rl.gnn.trainer import GnnTrainer
    from policies.rl.loop import deterministic_torch

    config = make_policy(kind, **SMALL).config(seed)
    with deterministic_torch():
        trainer = GnnTrainer(config)
        return trainer.greedy(Slot(problem, counter=None))


@pytest.mark.parametrize("kind", (*KINDS, "giph"))
def test_a_time_limit_spent_before_the_start_measures_nothing(setup, kind, tmp_path):
    """`--time-limit 0.5` spent by the job's start: reinforce measured nothing, gdp, placeto and giph their zero
    shot (giph's walk: up to 1 + episode_steps placements), and only then saw the limit. Nor is a learner saved,
    which a resume would take for one that had begun, and never measure the zero shot."""
    problem, measurer = setup
    counted = CountingMeasurer(measurer)
    stopped = make_policy(kind, context=RunContext(checkpoint_dir=tmp_path, time_limit_s=0.0), **SMALL)
    result = stopped.place(problem, counted, 50, 0)
    assert counted.used == 0 and result.measurements == 0 and result.stop_reason == "time_limit"
    assert list(tmp_path.iterdir()) == []
    resumed = make_policy(kind, context=RunContext(checkpoint_dir=tmp_path), **SMALL).place(problem, counted, 1, 0)
    assert resumed.measurements == 1 and "weights: scratch" in resumed.notes


@pytest.mark.parametrize("kind", KINDS)
def test_budget_of_one_measures_the_zero_shot_placement_once(setup, kind):
    problem, measurer = setup
    counted = CountingMeasurer(measurer)
    result = place(kind, problem, counted, 1, 0, **SMALL)
    assert counted.used == 1 and result.measurements == 1
    greedy = _greedy(kind, problem)
    np.testing.assert_array_equal(result.group_placement, greedy)
    assert result.best.runtime_s == pytest.approx(_runtime_s(problem, measurer, greedy), rel=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_a_zero_shot_placement_that_overflows_memory_is_repaired_before_it_is_measured(kind, monkeypatch):
    """Where the network's placement would overflow a GPU, the one measurement goes to the heuristics'
    memory repair of it (groups moved off that GPU), not to a placement that fails."""
    from policies.rl.gnn.trainer import GnnTrainer

    graph = load_graph("synthetic:200")
    roomy = make_problem(graph, load_machine("paper-2gpu"), max_groups=8)
    machine = with_gpu_memory(roomy.machine, 0.95 * roomy.single_device_peak_bytes)  # a GPU holds 95%
    problem, measurer = make_problem(graph, machine, max_groups=8), SimulatorMeasurer(graph, machine)
    one_gpu = problem.repair_allowed(np.full(problem.num_units, problem.gpu_indices()[0]))  # (G,)
    [overflowing] = measurer.measure([problem.expand(one_gpu)])
    assert not overflowing.ok
    monkeypatch.setattr(GnnTrainer, "greedy", lambda self, slot, start=None: one_gpu.copy())
    counted = CountingMeasurer(measurer)
    result = place(kind, problem, counted, 1, 0, **SMALL)
    assert counted.used == 1 and result.best.ok
    moved = result.group_placement != one_gpu
    assert moved.any() and (one_gpu[moved] == problem.gpu_indices()[0]).all()  # moved off the full GPU only


@pytest.mark.parametrize("kind", KINDS)
def test_fine_tuning_keeps_the_budget_and_beats_zero_shot(setup, kind):
    problem, measurer = setup
    counted = CountingMeasurer(measurer)
    result = place(kind, problem, counted, 40, 0, **SMALL)
    assert counted.used <= 40 and result.measurements == counted.used
    assert result.measurements > 1
    zero_shot_s = _runtime_s(problem, measurer, _greedy(kind, problem))
    assert result.best.ok and result.best.runtime_s <= zero_shot_s
    assert result.best.runtime_s == pytest.approx(_runtime_s(problem, measurer, result.group_placement), rel=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_placement(setup, kind):
    problem, measurer = setup
    first = place(kind, problem, measurer, 24, 3, **SMALL)
    second = place(kind, problem, measurer, 24, 3, **SMALL)
    np.testing.assert_array_equal(first.op_placement, second.op_placement)
    assert first.best.runtime_s == second.best.runtime_s and first.measurements == second.measurements


@pytest.mark.parametrize("kind", KINDS)
def test_warm_start_is_never_lost(setup, kind):
    problem, measurer = setup
    warm = place("m-etf", problem, measurer, 1, 0).op_placement
    warm_s = _runtime_s(problem, measurer, problem.collapse(warm))
    counted = CountingMeasurer(measurer)
    result = make_policy(kind, warm_start=[warm], **SMALL).place(problem, counted, 12, 0)
    assert counted.used <= 12
    assert result.best.ok and result.best.runtime_s <= warm_s * (1 + 1e-9)
    assert result.warm_start_runtime_s == pytest.approx(warm_s)  # the search's "warm start on the searched groups"


def test_a_warm_start_that_takes_the_whole_budget_says_no_zero_shot_was_measured(setup):
    """`--budget 1 --warm-start single-gpu`: the one measurement was the warm start's, and the result read as
    the policy's zero shot. Where the zero shot is the warm start itself (gdp imitates it first), the memo
    has its step, and nothing is said."""
    problem, measurer = setup
    warm = place("single-gpu", problem, measurer, 1, 0).op_placement
    counted = CountingMeasurer(measurer)
    result = make_policy("placeto", warm_start=[warm], **SMALL).place(problem, counted, 1, 0)
    assert counted.used == 1 and "no zero-shot placement measured" in result.notes
    result = make_policy("placeto", warm_start=[warm], **SMALL).place(problem, CountingMeasurer(measurer), 2, 0)
    assert "no zero-shot" not in result.notes
    gdp = make_policy("gdp", warm_start=[warm], **SMALL)
    result = gdp.place(problem, CountingMeasurer(measurer), 1, 0)
    assert np.array_equal(result.op_placement, warm) and "no zero-shot" not in result.notes


def test_every_warm_start_candidate_measured_is_in_the_memo(setup):
    """Only the best used to be: a candidate sampled again later was measured again, and paid for twice."""
    problem, measurer = setup
    counter = BudgetedMeasurer(CountingMeasurer(measurer), 10, problem.capacity_bytes(), DecisionClock())
    slot = Slot(problem, counter)
    candidates = [place(name, problem, measurer, 1, 0).op_placement for name in ("m-etf", "single-gpu")]
    runtimes = [_runtime_s(problem, measurer, problem.collapse(c)) for c in candidates]
    warm = slot.measure_warm_start(candidates)
    assert counter.used == 2 and warm.runtime_s == min(runtimes) == slot.warm_start_runtime_s
    again = slot.measure(np.stack([problem.collapse(c) for c in candidates]))
    assert counter.used == 2 and again.tolist() == pytest.approx(runtimes)


@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_run_reports_its_warm_start(setup, kind, tmp_path):
    problem, measurer = setup
    warm = place("m-etf", problem, measurer, 1, 0).op_placement
    warm_s = _runtime_s(problem, measurer, problem.collapse(warm))
    context = RunContext(checkpoint_dir=tmp_path)
    first = make_policy(kind, context=context, warm_start=[warm], **SMALL).place(problem, measurer, 12, 0)
    resumed = make_policy(kind, context=context, warm_start=[warm], **SMALL).place(problem, measurer, 24, 0)
    assert resumed.warm_start_runtime_s == pytest.approx(warm_s)
    # the note "warm start: candidate 0 at S s" was written only by the session that measured the candidates
    note = f"warm start: candidate 0 at {warm_s:.4f} s"
    assert note in first.notes and note in resumed.notes


def test_a_learner_to_resume_missing_a_section_is_refused_naming_it(setup, tmp_path):
    problem, measurer = setup
    context = RunContext(checkpoint_dir=tmp_path)
    make_policy("placeto", context=context, **SMALL).place(problem, measurer, 8, 0)
    path = tmp_path / "learner.pt"
    state = torch.load(path, weights_only=True)
    del state["worst_ok_s"]
    torch.save(state, path)
    with pytest.raises(PlacerError, match="cannot be restored.*worst_ok_s") as error:
        make_policy("placeto", context=context, **SMALL).place(problem, measurer, 16, 0)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("kind", KINDS)
def test_imitation_reaches_its_target(setup, kind):
    from policies.rl.gnn.trainer import GnnTrainer

    problem, measurer = setup
    trainer = GnnTrainer(GnnConfig(kind=kind, hidden_size=8, num_layers=1, batch_size=4, seed=0))
    slot = Slot(problem, BudgetedMeasurer(measurer, 10, problem.capacity_bytes(), DecisionClock()))
    target = np.array([1, 2, 2, 1, 0, 1, 2, 2])
    assert not np.array_equal(trainer.greedy(slot), target)
    loss = trainer.imitate([slot], [target], 150)
    np.testing.assert_array_equal(trainer.greedy(slot), target)
    assert loss < 0.5
    assert slot.counter.used == 0  # imitation measures nothing


@pytest.mark.parametrize("kind", KINDS)
def test_run_resumes_from_its_own_checkpoint(setup, kind, tmp_path):
    problem, measurer = setup
    context = RunContext(checkpoint_dir=tmp_path)
    measured: list[bytes] = []

    class Recording:
        def measure(self, placements):
            measured.extend(np.asarray(p, dtype=np.int64).tobytes() for p in placements)
            return measurer.measure(placements)
    counted = CountingMeasurer(Recording())
    first = make_policy(kind, context=context, **SMALL).place(problem, counted, 20, 0)
    saved = torch.load(tmp_path / "learner.pt", weights_only=True)
    assert saved["policy"] == kind and saved["measurements_used"] == first.measurements == counted.used
    assert saved["best_runtime_s"] == pytest.approx(first.best.runtime_s)
    counted.used = 0
    second = make_policy(kind, context=context, **SMALL).place(problem, counted, 40, 0)
    assert 0 < counted.used <= 40 - first.measurements  # the first run's measurements count, not restart
    assert second.measurements == first.measurements + counted.used
    assert second.best.runtime_s <= first.best.runtime_s
    assert torch.load(tmp_path / "learner.pt", weights_only=True)["measurements_used"] == second.measurements
    assert len(set(measured)) == len(measured) == second.measurements  # nothing measured twice across the resume


@pytest.mark.parametrize("kind", KINDS + ("giph",))
def test_a_run_cut_inside_a_stall_and_resumed_stops_at_the_update_one_run_does(setup, kind, tmp_path, monkeypatch):
    """learner.pt keeps the stall count (conftest.check_a_resume_inside_a_stall)."""
    from policies.rl.gnn import policy as gnn_policy

    monkeypatch.setattr(gnn_policy, "STALL_ITERATIONS", 6)  # short stalls: a fast test
    graph, machine = setup[0].graph, setup[0].machine
    problem, measurer = make_problem(graph, machine, max_groups=4), setup[1]  # 16 placements: it converges
    check_a_resume_inside_a_stall(lambda context: make_policy(kind, context=context, **SMALL), problem, measurer,
                                  tmp_path, stall_iterations=6)


def test_a_second_place_counts_its_stalls_from_nothing(setup, monkeypatch):
    """A kept trainer (a device left the machine) carries no stall count into the next problem: the second
    call updates for a whole stall, as it did when the count was the loop's own."""
    from policies.rl.gnn import policy as gnn_policy

    monkeypatch.setattr(gnn_policy, "STALL_ITERATIONS", 6)
    problem, measurer = setup
    gdp = make_policy("gdp", **SMALL)
    assert gdp.place(problem, measurer, 20, 0).stop_reason == "budget"
    gdp.trainer.stalled = 6  # as a first run that spent its budget at a stall's end leaves it
    before = gdp.trainer.iteration
    gdp.place(problem, measurer, 1000, 0)
    assert gdp.trainer.iteration >= before + 6


def test_the_learner_state_keeps_the_stall_count_and_one_written_before_it_loads_as_zero():
    from policies.rl.gnn.trainer import GnnTrainer

    config = make_policy("gdp", **SMALL).config(0)
    check_stall_count_in_learner_state(GnnTrainer(config), GnnTrainer(config))


def test_a_learner_trained_on_another_feature_layout_is_not_resumed(setup, tmp_path):
    """An --init checkpoint of another layout was refused, a resumed run's own learner.pt was not: its weights
    loaded whatever the features now mean, as long as the column count was the same."""
    problem, measurer = setup
    context = RunContext(checkpoint_dir=tmp_path)
    make_policy("placeto", context=context, **SMALL).place(problem, measurer, 8, 0)
    path = tmp_path / "learner.pt"
    state = torch.load(path, weights_only=True)
    state["feature_layout"]["pair"] = [f"renamed_{column}" for column in state["feature_layout"]["pair"]]
    torch.save(state, path)
    with pytest.raises(PlacerError, match="another feature layout") as error:
        make_policy("placeto", context=context, **SMALL).place(problem, measurer, 16, 0)
    assert str(path) in str(error.value)


def test_another_policys_learner_is_refused(setup, tmp_path):
    problem, measurer = setup
    make_policy("gdp", context=RunContext(checkpoint_dir=tmp_path), **SMALL).place(problem, measurer, 4, 0)
    with pytest.raises(PlacerError, match="learner.pt"):
        make_policy("placeto", context=RunContext(checkpoint_dir=tmp_path), **SMALL).place(problem, measurer, 4, 0)


def test_unknown_option_is_refused():
    with pytest.raises(PlacerError, match="hidden_sise"):
        make_policy("gdp", init="scratch", hidden_sise=8)


def test_slot_measures_each_placement_once(setup):
    problem, measurer = setup
    counted = CountingMeasurer(measurer)
    slot = Slot(problem, BudgetedMeasurer(counted, 3, problem.capacity_bytes(), DecisionClock()))
    a, b, c = np.full(8, 1), np.full(8, 2), np.array([1, 2] * 4)
    first = slot.measure(np.stack([a, b, a]))
    assert counted.used == 2 and slot.counter.used == 2 and first[0] == first[2]
    second = slot.measure(np.stack([b, c, np.full(8, 0)]))  # one new within budget, the last past it
    assert counted.used == 3 and second[0] == first[1] and np.isfinite(second[1]) and np.isinf(second[2])
    assert slot.best_runtime_s == min(first.min(), second[1])
    np.testing.assert_array_equal(slot.best_units, [a, b, c][int(np.argmin([first[0], first[1], second[1]]))])


@pytest.mark.parametrize("order", ["topo", "reverse-topo", "bfs", "random"])
def test_visit_orders_visit_every_group_once(setup, order):
    from policies.rl.gnn.problems import visit_order

    slot = Slot(setup[0], counter=None)
    visited = visit_order(slot, order, np.random.default_rng(0))
    assert sorted(visited.tolist()) == list(range(slot.num_groups))
    if order == "reverse-topo":
        np.testing.assert_array_equal(visited, visit_order(slot, "topo", np.random.default_rng(0))[::-1])


@pytest.mark.parametrize("options, word", [({"kind": "seq2seq"}, "seq2seq"), ({"order": "dfs"}, "dfs"),
                                           ({"batch_size": 1}, "batch_size"), ({"hidden_size": 2}, "hidden_size"),
                                           ({"lr": 0.0}, "lr"), ({"failure_factor": 1.0}, "failure_factor"),
                                           ({"greedy_passes": 0}, "greedy_passes"), ({"grad_clip": 0.0}, "grad_clip"),
                                           ({"grad_clip": -1.0}, "grad_clip"),
                                           ({"grad_clip": float("nan")}, "grad_clip"),
                                           ({"imitation_steps": -5}, "imitation_steps"),
                                           ({"batch_size": 2.5}, "batch_size.*whole number"),
                                           ({"num_layers": 2.0}, "num_layers.*whole number")])
def test_bad_settings_are_refused(options, word):
    with pytest.raises(PlacerError, match=word):
        GnnConfig(**options)


@pytest.mark.parametrize("kind", KINDS)
def test_placements_keep_to_allowed_devices(make_graph, kind):
    graph = make_graph([(i, i + 1, 4096) for i in range(5)], flops=[1e9] * 6, allowed_mask=[3, 3, 1, 3, 3, 3])
    machine = load_machine("paper-2gpu")
    problem = make_problem(graph, machine)
    allowed = Slot(problem, counter=None).inputs.allowed  # (G, D)
    assert not allowed.all()
    counted = CountingMeasurer(SimulatorMeasurer(graph, machine))
    seen = []
    result = place(kind, problem, counted, 12, 0, on_measurement=lambda op, m: seen.append(op), **SMALL)
    assert result.best.ok and counted.used == result.measurements == len(seen) <= 12
    assert all(op[2] == 0 for op in seen)  # nothing measured puts the CPU-only op elsewhere
    assert allowed[np.arange(problem.num_units), result.group_placement].all()
    assert result.op_placement[2] == 0  # the CPU-only op is on the CPU


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_checkpoint_is_picked_up_by_default_and_places_zero_shot(kind, setup):
    """`placer search --policy gdp|placeto` without --init reads policies/rl/gnn/pretrained/KIND.pt: it
    exists, passes every check of this version (feature layout included) and places a graph it never saw
    with one measurement, every group on a device it may use."""
    from policies.rl.gnn.checkpoint import pretrained_path, read_checkpoint

    state = read_checkpoint(pretrained_path(kind), kind)
    progress = state["progress"]
    assert progress["measurements_used"] > 0 and not any("synthetic" in p for p in progress["problems"])
    problem, measurer = setup
    result = place(kind, problem, measurer, 1, 0)
    assert result.measurements == 1 and result.best.ok
    assert problem.unit_allowed[np.arange(problem.num_units), result.group_placement].all()
    named = place(kind, problem, measurer, 1, 0, init=str(pretrained_path(kind)))
    scratch = place(kind, problem, measurer, 1, 0, init="scratch")
    assert np.array_equal(result.group_placement, named.group_placement)  # the committed weights, by default
    assert not np.array_equal(result.group_placement, scratch.group_placement)  # not a fresh network's
    assert str(pretrained_path(kind)) in result.notes


def test_a_checkpoint_is_used_in_the_order_it_was_trained_in_unless_told_otherwise(tmp_path):
    """A Placeto network trained visiting bfs decides in that order: `--init` with it visits bfs by default;
    an explicit `--order` still wins, and from scratch the order is GnnConfig's default."""
    from policies.rl.gnn.checkpoint import write_checkpoint
    from policies.rl.gnn.trainer import GnnTrainer

    trained = GnnConfig(kind="placeto", hidden_size=8, num_layers=1, batch_size=4, order="bfs")
    path = tmp_path / "bfs.pt"
    write_checkpoint(path, "placeto", GnnTrainer(trained).state(), {"measurements_used": 0})
    assert make_policy("placeto", init=str(path)).config(0).order == "bfs"
    assert make_policy("placeto", init=str(path), order="random").config(0).order == "random"
    assert make_policy("placeto", init="scratch").config(0).order == GnnConfig.order


def _one_device(problem):
    """``problem``'s graph on the first device of its machine alone: one placement in all."""
    from measurers.machine import Machine

    machine = Machine("one-gpu", problem.machine.devices[:1], ())
    return make_problem(problem.graph, machine, max_groups=8), SimulatorMeasurer(problem.graph, machine)


def test_a_machine_with_one_allowed_device_per_group_measures_once_and_stops(setup, monkeypatch):
    """Nothing to choose: the zero-shot placement is the only one, and the run ends "converged" without an
    update (it went on for STALL_ITERATIONS updates that could find nothing: 3 minutes)."""
    from policies.rl.gnn import policy as gnn_policy

    monkeypatch.setattr(gnn_policy, "STALL_ITERATIONS", 2)  # the old way: 2 updates for nothing, not 30
    problem, measurer = _one_device(setup[0])
    gdp = make_policy("gdp", **SMALL)
    result = gdp.place(problem, measurer, 100, 0)
    assert result.measurements == 1 and result.stop_reason == "converged"
    assert gdp.trainer.iteration == 0


@pytest.mark.parametrize("edit, message", [
    (lambda t: t["net"].update({next(iter(t["net"])): torch.zeros(3, 3)}), "do not fit its architecture"),
    (lambda t: next(iter(t["net"].values())).fill_(float("nan")), "NaN or infinite"),
    (lambda t: t["config"].update(hidden_size="8"), "needs whole numbers"),
    (lambda t: t["net"].update({(k := next(iter(t["net"]))): t["net"][k].to_sparse()}), "not a dense CPU tensor"),
    (lambda t: t["net"].update({(k := next(iter(t["net"]))): torch.empty_like(t["net"][k], device="meta")}),
     "not a dense CPU tensor"),
])
def test_a_learner_to_resume_with_weights_the_run_cannot_use_is_refused_naming_it(setup, tmp_path, edit, message):
    """Checked as an --init checkpoint is, when the policy is made (a search makes it before it changes its
    run folder): loading it failed later, a size mismatch or an invalid multinomial distribution."""
    problem, measurer = setup
    context = RunContext(checkpoint_dir=tmp_path)
    make_policy("gdp", context=context, **SMALL).place(problem, measurer, 4, 0)
    path = tmp_path / "learner.pt"
    state = torch.load(path, weights_only=True)
    edit(state["trainer"])
    torch.save(state, path)
    with pytest.raises(PlacerError, match=message) as error:
        make_policy("gdp", context=context, **SMALL)
    assert str(path) in str(error.value)


def test_placeto_zero_shot_passes_chain_from_where_the_last_pass_ended(setup):
    """Each greedy pass starts at the placement the pass before ended at (no measurement in between), and
    ``placer search`` decodes placeto's zero shot with two."""
    from dataclasses import replace

    from policies.rl.gnn.trainer import GnnTrainer
    from policies.rl.loop import deterministic_torch

    problem = setup[0]
    config = make_policy("placeto", **SMALL).config(SEED_WHOSE_SECOND_PASS_MOVES)
    assert config.greedy_passes == 2
    slot = Slot(problem, counter=None)
    with deterministic_torch():
        trainer = GnnTrainer(replace(config, greedy_passes=1))
    passes = [slot.fastest_device_start()]
    for _ in range(3):
        passes.append(trainer.greedy(slot, passes[-1]))
    assert not np.array_equal(passes[1], passes[2]) and not np.array_equal(passes[2], passes[3])
    for count in (2, 3):
        trainer.config = replace(config, greedy_passes=count)
        np.testing.assert_array_equal(trainer.greedy(slot), passes[count])


def _captured_batches(monkeypatch) -> list[dict]:
    """The batches ``GnnTrainer`` hands its learner from now on (each update still made)."""
    from policies.rl.gnn.trainer import GnnTrainer

    batches, update = [], GnnTrainer._update
    monkeypatch.setattr(GnnTrainer, "_update",
                        lambda self, slot, batch: batches.append(batch) or update(self, slot, batch))
    return batches


def test_gdp_batch__the_faster_a_sample_the_larger_its_advantage(setup, monkeypatch):
    """GDP's advantage of a sampled placement is its rank among the batch's runtimes, fastest +0.5, slowest
    -0.5 (ties share their mean rank). Reversed (the slowest +0.5), every update would learn towards slower
    placements."""
    from policies.base import FAILED_COST_S
    from policies.rl.gnn.module import ACTIONS, ADVANTAGES
    from policies.rl.gnn.trainer import GnnTrainer

    problem, measurer = setup
    batches = _captured_batches(monkeypatch)
    trainer = GnnTrainer(GnnConfig(kind="gdp", hidden_size=8, num_layers=1, batch_size=8, seed=0))
    slot = Slot(problem, BudgetedMeasurer(measurer, 1000, problem.capacity_bytes(), DecisionClock()))
    trainer.iterate(slot)
    [batch] = batches
    runtimes = slot.measure(batch[ACTIONS])  # each measured in the update already: from the memo
    assert (runtimes < FAILED_COST_S).all() and len(np.unique(runtimes)) > 2  # the premise: runs that differ
    slower = (runtimes[None, :] > runtimes[:, None]).sum(axis=1)
    ties = (runtimes[None, :] == runtimes[:, None]).sum(axis=1) - 1
    expected = (slower + ties / 2) / (len(runtimes) - 1) - 0.5
    np.testing.assert_allclose(batch[ADVANTAGES], expected, atol=1e-6)
    assert batch[ADVANTAGES][np.argmin(runtimes)] > 0 > batch[ADVANTAGES][np.argmax(runtimes)]


def test_placeto_batch__an_episode_that_ends_faster_gets_the_larger_first_step_advantage(setup, monkeypatch):
    """Placeto's return from an episode's first step is the whole episode's gain, (start - final step time) /
    start; its advantage is that less the batch's mean: -(final - mean final) / start. A reversed sign would
    favour the episodes that ended slower."""
    from policies.base import FAILED_COST_S
    from policies.rl.gnn.module import ACTIONS, ADVANTAGES, TARGETS
    from policies.rl.gnn.trainer import GnnTrainer

    problem, measurer = setup
    batches = _captured_batches(monkeypatch)
    trainer = GnnTrainer(GnnConfig(kind="placeto", hidden_size=8, num_layers=1, batch_size=4, seed=0))
    slot = Slot(problem, BudgetedMeasurer(measurer, 1000, problem.capacity_bytes(), DecisionClock()))
    start = slot.fastest_device_start()
    trainer.iterate(slot, start)
    [batch] = batches
    final = np.repeat(start[None], len(batch[ACTIONS]), axis=0)
    rows = np.arange(len(final))
    for step in range(batch[TARGETS].shape[1]):
        final[rows, batch[TARGETS][:, step]] = batch[ACTIONS][:, step]
    final_s, start_s = slot.measure(final), slot.measure(start[None])[0]  # from the memo
    assert (final_s < FAILED_COST_S).all() and start_s < FAILED_COST_S and final_s.max() > final_s.min()
    np.testing.assert_allclose(batch[ADVANTAGES][:, 0], -(final_s - final_s.mean()) / start_s, rtol=1e-4, atol=1e-7)
    assert np.argmax(batch[ADVANTAGES][:, 0]) == np.argmin(final_s)


def test_gdp_training__moves_probability_off_the_slow_cpu(setup):
    """On paper-2gpu the CPU runs a group several times slower than a GPU: 25 GDP updates (seeded) take the
    network's mean probability of the CPU from a third to under 0.2 (0.07 here). A rising share (0.99 with
    the reward's sign reversed) would mean training learns towards slower placements."""
    from policies.rl.gnn.trainer import GnnTrainer
    from policies.rl.loop import deterministic_torch

    problem, measurer = setup
    assert [d.name for d in problem.machine.devices] == ["cpu:0", "gpu:0", "gpu:1"]
    config = GnnConfig(kind="gdp", hidden_size=8, num_layers=1, batch_size=8, lr=1e-2, entropy_coeff=0.0, seed=0)
    with deterministic_torch():
        trainer = GnnTrainer(config)
        slot = Slot(problem, BudgetedMeasurer(measurer, 100_000, problem.capacity_bytes(), DecisionClock()))

        def cpu_share() -> float:
            with torch.no_grad():
                return float(torch.softmax(trainer.net(slot.tensors), dim=-1)[:, 0].mean())

        before = cpu_share()
        for _ in range(25):
            trainer.iterate(slot)
        after = cpu_share()
    assert before == pytest.approx(1 / 3, abs=0.02)
    assert after < 0.2
