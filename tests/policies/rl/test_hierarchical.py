"""The hierarchical planner (grouper + seq2seq placer): budget, joint loss, allowed devices, seeding,
checkpoint resume, warm start and bad options, on nmt-2 with tiny networks."""

from __future__ import annotations

import os

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import dataclasses  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from graphs.errors import PlacerError  # noqa: E402
from graphs.opgraph import kind_bit  # noqa: E402
from measurers.catalog import load_machine  # noqa: E402
from measurers.sim.measurer import SimulatorMeasurer  # noqa: E402
from policies.base import BudgetedMeasurer, DecisionClock, RunContext  # noqa: E402
from policies.problem import make_problem  # noqa: E402
from policies.registry import make_policy, place  # noqa: E402

OPTIONS = {"batch_size": 4, "hidden_size": 16, "num_groups": 8, "torch_threads": 1}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """Every test here runs on one torch thread (see conftest)."""


@pytest.fixture(scope="module")
def problem():
    from graphs.registry import load_graph

    return make_problem(load_graph("nmt-2"), load_machine("paper-2gpu"), max_groups=None)


@pytest.fixture(scope="module")
def restricted_problem(problem):
    """Inputs CPU-only, softmax ops GPU-only: atoms that disagree on their devices."""
    graph = problem.graph
    inputs = np.isin(graph.colocation_ids, graph.colocation_ids[graph.op_kinds == "Input"])
    softmax = np.array([scope.startswith("softmax") for scope in graph.scopes]) & ~inputs
    mask = graph.allowed_mask.copy()
    mask[inputs], mask[softmax] = kind_bit("cpu"), kind_bit("gpu")
    return make_problem(dataclasses.replace(graph, allowed_mask=mask), problem.machine, max_groups=None)


class Counting:
    def __init__(self, problem):
        self.measurer, self.placements = SimulatorMeasurer(problem.graph, problem.machine), []

    def measure(self, placements):
        self.placements += [np.array(p, copy=True) for p in placements]
        return self.measurer.measure(placements)



@pytest.fixture(autouse=True)
def _torch_settings_restored():
    """Building an RLlib learner with a seed turns torch's deterministic mode on for the whole process
    (RLlib's set_torch_seed); the policy builds inside deterministic_torch(), and so do these tests."""
    from policies.rl.loop import deterministic_torch

    with deterministic_torch():
        yield


def _trainer(problem, measurer=None, **options):
    from policies.rl.hierarchical.config import HierarchicalConfig
    from policies.base import LastResults
    from policies.rl.hierarchical.trainer import HierarchicalTrainer

    capture = LastResults(measurer or Counting(problem))
    counter = BudgetedMeasurer(capture, 10**6, problem.capacity_bytes(), DecisionClock())
    return HierarchicalTrainer(problem, counter, capture, HierarchicalConfig(**{**OPTIONS, **options}))


def test_hierarchical__stays_within_budget_and_returns_a_measured_placement(problem):
    measurer = Counting(problem)
    result = place("hierarchical", problem, measurer, 10, 0, **OPTIONS)
    assert len(measurer.placements) == result.measurements == 10  # last batch cut to what is left
    assert result.best.ok and any(np.array_equal(result.op_placement, p) for p in measurer.placements)
    again = SimulatorMeasurer(problem.graph, problem.machine).measure([result.op_placement])[0]
    assert again.runtime_s == pytest.approx(result.best.runtime_s)
    assert result.seconds_per_update > 0
    large = place("hierarchical", problem, Counting(problem), 6, 0, **{**OPTIONS, "batch_size": 100000})
    assert "1 iterations of 6, " in large.notes  # the batch sampled, not the --batch asked for


class AllOutOfMemory(Counting):
    def measure(self, placements):
        from measurers.base import Measurement

        self.placements += [np.array(p, copy=True) for p in placements]
        return [Measurement(math.inf, (), "oom", (0,) * self.measurer.machine.num_devices, 0.0) for _ in placements]


def test_hierarchical__a_batch_that_all_failed_has_no_best_step(problem):
    """Its metrics gave the failure penalty (100 s) as the batch's best step beside best_runtime_s inf; every
    other learner gives inf: a failure ran no step."""
    metrics = _trainer(problem, AllOutOfMemory(problem)).iterate(4)
    assert metrics["num_failed"] == 4 and metrics["batch_best_runtime_s"] == math.inf == metrics["best_runtime_s"]


def test_hierarchical__update_moves_both_grouper_and_placer(problem):
    trainer = _trainer(problem, entropy_coeff=0.0)  # only the log-probability terms give gradients
    grouper_before = [p.detach().clone() for p in trainer.module.grouper.parameters()]
    placer_before = [p.detach().clone() for p in trainer.module.placer.parameters()]
    metrics = trainer.iterate(4)
    assert np.isfinite(metrics["grouper_logp"]) and metrics["grouper_logp"] < 0
    assert any(not torch.equal(a, b) for a, b in zip(grouper_before, trainer.module.grouper.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(placer_before, trainer.module.placer.parameters()))


def test_hierarchical__joint_logp_is_grouper_plus_placer(problem):
    from policies.rl.hierarchical.module import grouping_logp
    from policies.rl.seq2seq.network import placement_logp

    trainer = _trainer(problem)
    assign, inputs, decoded, _ = trainer.sample(3)
    with torch.no_grad():
        logits = trainer.module.group_logits()
        manual = torch.log_softmax(logits, -1)[torch.arange(assign.shape[1]), assign].sum(dim=1)  # (B,)
        placer = placement_logp(trainer.module.placer.teacher(inputs.features, inputs.allowed, decoded), decoded)
    assert torch.allclose(grouping_logp(logits, assign), manual, rtol=1e-5)
    assert (placer < 0).all() and (manual < placer).all()  # the grouper's term is the larger one here


def test_hierarchical__sampled_placements_respect_allowed_devices(restricted_problem):
    problem = restricted_problem
    trainer = _trainer(problem)
    _, inputs, decoded, op_placements = trainer.sample(16)
    allowed = problem.op_allowed[np.arange(problem.graph.num_ops)[None, :], op_placements]  # (B, N)
    assert allowed.all()
    assert inputs.allowed.gather(2, decoded[..., None]).all()  # the placer never picks a masked device
    cpu_only = problem.unit_allowed.sum(axis=1) == 1
    assert cpu_only.any()


def test_hierarchical__group_mask_follows_the_majority_of_cost_and_atoms_fall_back():
    from policies.rl.hierarchical.features import Atoms, GroupBuilder

    allowed = np.array([[False, True], [True, False], [True, True]])  # atom 0 GPU-only, 1 CPU-only
    atoms = Atoms(np.zeros((3, 2), np.float32), np.array([3.0, 1.0, 1.0]), np.array([0.2, 0.5, 0.9]),
                  allowed, np.array([1, 0, 1]), np.array([0.0, 0.6, 0.8]))
    builder = GroupBuilder(atoms, 2)
    assign = torch.tensor([[0, 0, 1]])  # group 0 = atoms 0 (cost 3, GPU) and 1 (cost 1, CPU)
    inputs = builder.inputs(assign)
    assert inputs.order[0].tolist() == [0, 1]  # group index order (the default)
    assert inputs.allowed[0, 0].tolist() == [False, True]  # GPU allowed for 3/4 of the cost
    devices = builder.atom_devices(assign, torch.tensor([[1, 0]]), inputs.order)
    assert devices[0].tolist() == [1, 0, 0]  # the CPU-only atom falls back to its allowed device
    empty = builder.inputs(torch.tensor([[0, 0, 0]]))
    assert empty.allowed[0, 1].all() and empty.features[0, 1].abs().sum() == 0  # an empty group
    by_position = GroupBuilder(atoms, 2, by_position=True).inputs(torch.tensor([[1, 1, 0]]))
    assert by_position.order[0].tolist() == [1, 0]  # group 1's members sit earlier (0.35 against 0.9)


def test_hierarchical__same_seed_same_result(problem):
    first = place("hierarchical", problem, Counting(problem), 8, 5, **OPTIONS)
    second = place("hierarchical", problem, Counting(problem), 8, 5, **OPTIONS)
    assert np.array_equal(first.op_placement, second.op_placement)
    assert first.best.runtime_s == second.best.runtime_s


def test_hierarchical__checkpoint_resume_continues_the_counts(problem, tmp_path):
    from policies.rl.learner_file import checkpoint_progress

    first = place("hierarchical", problem, Counting(problem), 8, 0,
                  context=RunContext(checkpoint_dir=tmp_path), checkpoint_every=1, **OPTIONS)
    state = torch.load(tmp_path / "learner.pt", weights_only=True)
    assert (state["iteration"], state["measurements_used"]) == (2, 8)
    assert checkpoint_progress(tmp_path) == (2, 8)  # what the search job reads to resume its log
    measurer = Counting(problem)
    second = place("hierarchical", problem, measurer, 16, 0, context=RunContext(checkpoint_dir=tmp_path), **OPTIONS)
    assert len(measurer.placements) == 8 and second.measurements == 16
    assert torch.load(tmp_path / "learner.pt", weights_only=True)["iteration"] == 4
    assert second.best.runtime_s <= first.best.runtime_s


def test_hierarchical__a_resumed_run_says_what_its_warm_start_was(problem, tmp_path):
    """The note "warm start: candidate K at S s, imitated (...)" was written only by the session that measured
    the candidates: a resumed run's policy_notes lost it (the rest of its result was the same)."""
    trainer = _trainer(problem)
    trainer.warm_start_note = "warm start: candidate 0 at 0.0178 s, imitated (100% of ops on its device greedily); "
    trainer.save(tmp_path / "learner.pt")
    resumed = _trainer(problem)
    resumed.load(tmp_path / "learner.pt")
    assert resumed.warm_start_note == trainer.warm_start_note


def test_hierarchical__resume_refuses_a_checkpoint_trained_with_other_network_settings(problem, tmp_path):
    place("hierarchical", problem, Counting(problem), 4, 0, context=RunContext(checkpoint_dir=tmp_path),
          checkpoint_every=1, **OPTIONS)
    for setting, value in [("decode_order", "position"), ("temperature", 0.5), ("prior", "uniform")]:
        with pytest.raises(PlacerError, match=f"was trained with {setting}="):
            place("hierarchical", problem, Counting(problem), 8, 0, context=RunContext(checkpoint_dir=tmp_path),
                  **{**OPTIONS, setting: value})


def test_hierarchical__warm_start_best_never_worse_than_the_start(problem):
    expert = place("expert", problem, SimulatorMeasurer(problem.graph, problem.machine), 1, 0)
    measurer = Counting(problem)
    result = place("hierarchical", problem, measurer, 12, 0, warm_start=[expert.op_placement], **OPTIONS)
    assert np.array_equal(measurer.placements[0], expert.op_placement)  # measured inside the budget
    assert result.measurements == len(measurer.placements) == 12
    assert result.best.runtime_s <= expert.best.runtime_s + 1e-12
    assert "warm start" in result.notes


def test_hierarchical__imitation_reproduces_the_warm_start(problem):
    from policies.rl.hierarchical.imitation import target_grouping

    expert = place("expert", problem, SimulatorMeasurer(problem.graph, problem.machine), 1, 0)
    target = problem.collapse(expert.op_placement)  # (A,)
    trainer = _trainer(problem, imitation_steps=100, hidden_size=32)
    groups = target_grouping(problem, trainer.atoms.position, target, trainer.num_groups)
    assert groups.max() < trainer.num_groups
    for g in np.unique(groups):  # every target group on one device
        assert len(np.unique(target[groups == g])) == 1
    match = trainer.imitate(target, expert.best.runtime_s, expert.op_placement)
    assert match == 1.0  # the greedy grouping + placement is the warm start
    sampled = trainer.sample(8)[3]  # (B, N): exploration stays near it
    assert np.median((sampled == expert.op_placement[None]).mean(axis=1)) > 0.9


def test_hierarchical__grouper_starts_on_the_prior_grouping(problem):
    """Default: each atom starts in its scope group (numbered in decode order) and rarely leaves it;
    ``position`` keeps the soft topological prior, ``uniform`` the paper's even start."""
    from graphs.grouping import group_ops
    from policies.rl.hierarchical.config import HierarchicalConfig
    from policies.rl.hierarchical.module import topo_prior

    trainer = _trainer(problem)
    logits = trainer.module.group_logits().detach()  # (A, G)
    greedy = logits.argmax(dim=1).numpy()  # (A,)
    scope = np.zeros(problem.num_units, dtype=np.int64)
    scope[problem.op_unit] = group_ops(problem.graph, max_groups=trainer.num_groups, method="scope").op_group
    assert len(np.unique(scope)) > 1
    pairs = np.unique(np.stack([scope, greedy]), axis=1)  # the same partition of the atoms, renumbered
    assert pairs.shape[1] == len(np.unique(scope)) == len(np.unique(greedy))
    mean_position = [trainer.atoms.position[greedy == g].mean() for g in np.unique(greedy)]
    assert np.all(np.diff(mean_position) >= 0)  # numbered by position: the placer's decode order
    stay = torch.softmax(logits, dim=1).max(dim=1).values
    assert float(stay.min()) == pytest.approx(1.0 - HierarchicalConfig().move_prob, rel=1e-3)
    position = _trainer(problem, prior="position").module.atom_logits.detach()  # the grouper net aside
    expected = topo_prior(torch.from_numpy(trainer.atoms.quantile).float(), trainer.num_groups, 1.0)
    assert torch.allclose(position, expected)
    assert not torch.any(_trainer(problem, prior="uniform").module.atom_logits.detach())


def test_hierarchical__entropy_weight_scales_down_with_many_groups():
    from policies.rl.hierarchical.config import HierarchicalConfig

    assert HierarchicalConfig().effective_entropy_coeff(32) == pytest.approx(0.03)
    assert HierarchicalConfig().effective_entropy_coeff(8) == pytest.approx(0.03)
    assert HierarchicalConfig().effective_entropy_coeff(256) == pytest.approx(0.00375)
    assert HierarchicalConfig(entropy_coeff=0.01).effective_entropy_coeff(256) == 0.01


def test_hierarchical__bad_options_are_refused():
    with pytest.raises(PlacerError, match="num_groups"):
        make_policy("hierarchical", num_groups=0)
    with pytest.raises(PlacerError, match="batch_size"):
        make_policy("hierarchical", batch_size=1)
    with pytest.raises(PlacerError, match=r"unknown prior 'layers' \(known: metis, .*position, uniform\)"):
        make_policy("hierarchical", prior="layers")
    with pytest.raises(PlacerError, match="entropy_coeff must be a finite number >= 0, got -0.1"):
        make_policy("hierarchical", entropy_coeff=-0.1)
    with pytest.raises(PlacerError, match="move_prob"):
        make_policy("hierarchical", move_prob=1.0)


@pytest.mark.parametrize("options, message", [
    ({"batch_size": 2.5}, "batch_size must be a whole number >= 2, got 2.5"),  # these three were TypeErrors
    ({"imitation_steps": 2.5}, "imitation_steps must be a whole number >= 0, got 2.5"),
    ({"prior": "position", "prior_width": float("nan")}, "prior_width must be a finite number >= 0, got nan"),
    ({"num_groups": 2.5}, "num_groups must be a whole number >= 1, got 2.5"),  # was made 2 without a word
    ({"lr": float("nan")}, "lr must be a finite number above 0, got nan"),  # these two were accepted
    ({"temperature": 0}, "temperature must be a finite number above 0, got 0"),
])
def test_hierarchical__a_fraction_where_a_count_goes_or_a_nan_is_refused(options, message):
    from policies.rl.hierarchical.config import HierarchicalConfig

    with pytest.raises(PlacerError, match=re.escape(message)):
        HierarchicalConfig(**options)


class TimingOut(Counting):
    def measure(self, placements):
        from measurers.base import Measurement

        self.placements += [np.array(p, copy=True) for p in placements]
        return [Measurement(math.nan, (), "timeout", (), 5.0, "timed out") for _ in placements]


@pytest.mark.parametrize("measurer_class", [Counting, TimingOut])
def test_hierarchical__a_placement_sampled_again_costs_nothing_and_a_stalled_run_converges(measurer_class):
    """A one-device machine has one placement: it is measured once (the warm start, ok or timed out), never
    again, and the run stops as converged instead of spending its budget on repeats."""
    from graphs.registry import load_graph
    from measurers.machine import Machine
    from policies.rl.loop import STALL_ITERATIONS

    paper = load_machine("paper-2gpu")
    one_cpu = Machine("one-cpu", paper.devices[:1], ())
    problem = make_problem(load_graph("synthetic:60"), one_cpu, max_groups=None)
    measurer = measurer_class(problem)
    only = np.zeros(problem.graph.num_ops, dtype=np.int64)
    result = place("hierarchical", problem, measurer, 10**4, 0, warm_start=[only], **OPTIONS)
    assert len(measurer.placements) == 1 == result.measurements
    assert result.stop_reason == "converged" and f"{STALL_ITERATIONS} iterations" in result.notes


def test_hierarchical__a_run_cut_inside_a_stall_and_resumed_stops_at_the_iteration_one_run_does(tmp_path,
                                                                                                 monkeypatch):
    """learner.pt keeps the stall count (policies.rl.loop.resumed_stall_count): on a one-device machine every
    iteration after the first measurement stalls; a run cut 3 iterations before the end converges, resumed,
    where one run does, and a converged run resumed samples again for a whole stall."""
    from graphs.registry import load_graph
    from measurers.machine import Machine
    from policies.rl import loop

    monkeypatch.setattr(loop, "STALL_ITERATIONS", 6)  # short stalls: a fast test
    one_cpu = Machine("one-cpu", load_machine("paper-2gpu").devices[:1], ())
    problem = make_problem(load_graph("synthetic:60"), one_cpu, max_groups=None)

    def run(folder, stop_after=None):
        iterations = []
        context = RunContext(checkpoint_dir=folder, on_iteration=lambda i, metrics: iterations.append(i),
                             should_stop=None if stop_after is None else lambda: len(iterations) >= stop_after)
        place("hierarchical", problem, Counting(problem), 10**4, 0, context=context, **OPTIONS)
        return torch.load(folder / "learner.pt", weights_only=True)["iteration"]

    whole = run(tmp_path / "whole")
    assert whole == 1 + 6  # the first iteration measures the only placement, the next 6 stall
    assert run(tmp_path / "cut", stop_after=whole - 3) == whole - 3
    assert run(tmp_path / "cut") == whole
    assert run(tmp_path / "cut") == whole + 6


def test_hierarchical__a_resumed_run_keeps_its_memo(problem, tmp_path):
    """Every placement the first session measured is known to the second: none is measured twice."""
    first = Counting(problem)
    place("hierarchical", problem, first, 24, 0, context=RunContext(checkpoint_dir=tmp_path), checkpoint_every=1,
          warm_start=[place("expert", problem, SimulatorMeasurer(problem.graph, problem.machine), 1, 0).op_placement],
          **{**OPTIONS, "num_groups": 2})
    second = Counting(problem)
    result = place("hierarchical", problem, second, 48, 0, context=RunContext(checkpoint_dir=tmp_path),
                   **{**OPTIONS, "num_groups": 2})
    keys = {p.tobytes() for p in first.placements}
    assert len(keys) == len(first.placements) == 24
    assert not keys & {p.tobytes() for p in second.placements}
    assert result.measurements == 24 + len(second.placements)


class SlowOrOutOfMemory(Counting):
    """Steps 1,000x the simulator's (over the 100 s penalty); a placement with op 0 on device 0 runs out of
    memory."""

    def measure(self, placements):
        from measurers.base import Measurement

        out = []
        for p, m in zip(placements, super().measure(placements)):
            runtime_s = 1000.0 * m.runtime_s
            out.append(Measurement(runtime_s, (runtime_s,), "oom" if p[0] == 0 else "ok", m.peak_bytes, 0.0))
        return out


def test_hierarchical__a_failure_scores_worse_than_a_step_slower_than_the_penalty(problem):
    trainer = _trainer(problem, SlowOrOutOfMemory(problem))
    metrics = trainer.iterate(8)
    measured = list(trainer.memo.values())  # the batch's 8 placements, all different
    slowest_s = max(m.runtime_s for m in measured if m.ok)
    assert len(measured) == 8 and slowest_s > 100 and any(not m.ok for m in measured)
    scored = [m.runtime_s if m.ok else 3 * slowest_s for m in measured]
    assert metrics["mean_reward"] == pytest.approx(np.mean(-np.sqrt(scored)))
