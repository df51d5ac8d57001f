"""A bound CP-SAT calls proven is checked against placements the simulator steps faster (policies/exact/refute.py),
and ``exact`` claims no proven best for a measurer that is not the noise-free simulator."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.opgraph import OpGraph
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.machine_json import machine_from_json
from measurers.sim.measurer import SimulatorMeasurer
from policies.exact.bound import proven_bound
from policies.exact.refute import refuting_step
from policies.problem import make_problem
from policies.registry import place

FAST_PLACEMENT = np.array([1, 0, 1, 1, 1])  # op 1 on the CPU, the rest on the GPU: 0.002111 s simulated


@pytest.fixture(scope="module")
def problem():
    """A reviewer's 5-op graph: CP-SAT 9.15 with one worker called 0.002997 s optimal for its free-order model,
    which with FAST_PLACEMENT fixed solves to 0.002107 s (the simulator steps it in 0.002111 s)."""
    graph = OpGraph(name="g94", framework="manual", op_names=np.array([f"op{i}" for i in range(5)], dtype=object),
                    op_kinds=np.array(["MatMul"] * 5, dtype=object),
                    flops=np.array([1e8, 1e6, 0, 1e9, 1e9]), bytes_accessed=np.array([1e5, 1e7, 1e5, 0, 1e7]),
                    out_bytes=np.array([10_000_000, 1_000_000, 0, 1_000_000, 10_000_000]),
                    param_bytes=np.array([1_000_000, 0, 0, 1_000_000, 0]),
                    edge_src=np.array([0, 1, 1, 2]), edge_dst=np.array([2, 3, 4, 3]),
                    edge_bytes=np.array([50_000_000, 1_000_000, 1_000_000, 100_000]))
    device = {"op_overhead_s": 0.0, "compute_efficiency": 1.0, "memory_efficiency": 1.0}
    machine = machine_from_json({"name": "m94", "devices": [
        {"name": "cpu:0", "model": "Xeon-E5-2699v3", "peak_flops": 1e11, "mem_bandwidth_Bps": 1e11,
         "memory_bytes": 250_000_000, **device},
        {"name": "gpu:1", "model": "K80", "peak_flops": 1e12, "mem_bandwidth_Bps": 1e10,
         "memory_bytes": 10**12, **device}], "links": [
        {"src": "cpu:0", "dst": "gpu:1", "bandwidth_Bps": 1e11, "latency_s": 1e-6, "channel": "b"},
        {"src": "gpu:1", "dst": "cpu:0", "bandwidth_Bps": 1e6, "latency_s": 1e-6, "channel": "c"}]})
    return make_problem(graph, machine, max_groups=5)


def _fast_step_s(problem) -> float:
    return problem.simulator().run(problem.expand(FAST_PLACEMENT)).runtime_s


def test_refuting_step__finds_a_placement_below_a_bound_too_high_and_none_below_a_sound_one(problem):
    step_s = _fast_step_s(problem)
    assert step_s == pytest.approx(0.002111)
    refuted = refuting_step(problem, 0.002997)
    assert refuted is not None and refuted.step_s < 0.002997
    assert refuted.step_s == problem.simulator().run(problem.expand(refuted.unit_placement)).runtime_s
    assert refuting_step(problem, step_s) is None  # the optimum itself: nothing below it (every placement: 32)
    steps = [problem.simulator().run(problem.expand(np.array([(k >> i) & 1 for i in range(5)]))).runtime_s
             for k in range(32)]
    assert min(steps) == step_s


def test_proven_bound__never_above_a_placements_simulated_step(problem):
    """The bound `placer bound` printed, 0.002997 s "optimal", was CP-SAT's, 42% above this placement's step:
    refuted now, it is left out and its status says by what."""
    report = proven_bound(problem, 5.0)
    assert report.best_s <= _fast_step_s(problem)
    if report.exact_s is not None and report.exact_s > _fast_step_s(problem):  # (a CP-SAT that errs so)
        assert report.exact_status.startswith("refuted: a placement of these groups simulates 0.002111 s")


def test_exact__a_bound_refuted_is_no_proof_and_no_bound_of_the_run(problem, monkeypatch):
    """CP-SAT's error made to happen (every solve's bound raised to the 0.002997 s it once proved): the run
    measures the refuting placement, claims no proof, does not stop at the bound, and gives the job no bound
    (a single-op run's bound raises the run's proven bound)."""
    from dataclasses import replace

    from policies.exact.cpsat import ExactModel

    solve = ExactModel.solve
    monkeypatch.setattr(ExactModel, "solve", lambda *a, **k: replace(solve(*a, **k), bound_s=0.002997))
    result = place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 20, 0, time_limit_s=10,
                   num_workers=1)
    assert result.best.runtime_s <= _fast_step_s(problem) and result.stop_reason != "converged"
    assert "(the solver's bound is refuted: a placement of these groups simulates 0.002111 s" in result.notes
    assert np.isnan(result.solver_bound_s) and not result.solver_bound_every_placement


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
def test_exact__no_proven_best_for_a_measurer_that_is_not_the_noise_free_simulator(solver):
    """With --noise, a step measured just above the bound was called "proven best for the measurer" and the
    run stopped as converged after one measurement."""
    small = make_problem(synthetic_graph(4, 0), load_machine("paper-2gpu"))
    measurer = SimulatorMeasurer(small.graph, small.machine)
    proven = place("exact", small, measurer, 8, 0, time_limit_s=5, num_workers=1, solver=solver)
    assert proven.stop_reason == "converged" and "proven best" in proven.notes and proven.measurements == 1
    noisy = place("exact", small, measurer, 8, 0, time_limit_s=5, num_workers=1, solver=solver, noise_free=False)
    assert noisy.stop_reason != "converged" and "proven best" not in noisy.notes and noisy.measurements > 1


def test_proven_bound__a_mip_bound_highs_presolve_put_above_a_placement_is_refuted():
    """A reviewer's 7-op graph with given op times: HiGHS 1.16 called its relaxation's optimum 6.001 s with
    presolve (6.000001 s without), above placement (1, 0, 1, 0, 0)'s simulated 6.0000010001 s."""
    from dataclasses import replace

    from measurers.machine import Device, Link, Machine
    from measurers.sim.lower_bound import lower_bound_from_times

    graph = OpGraph(name="g", framework="manual", op_names=[f"op{i}" for i in range(7)],
                    op_kinds=["Add", "Reshape", "Variable", "Reshape", "Placeholder", "Placeholder", "Reshape"],
                    flops=[0.0] * 7, bytes_accessed=[0.0] * 7, out_bytes=[0, 10**9, 10**6, 1, 0, 10**9, 0],
                    param_bytes=[1, 0, 10**10, 10**6, 0, 10**10, 0], edge_src=[1, 1, 2, 3, 5, 5],
                    edge_dst=[3, 4, 1, 4, 0, 4], edge_bytes=[10**6, 0, 1000, 1, 0, 1],
                    colocation=[4, 1, 2, 3, 4, 5, 4], allowed_mask=[3, 3, 3, 3, 3, 1, 3])

    def link(a, b, bandwidth_Bps, latency_s):
        return Link(f"cpu:{a}", f"cpu:{b}", bandwidth_Bps, latency_s, "bus")

    machine = Machine("m", tuple(Device(f"cpu:{i}", "cpu", "x", 1e9, 1e9, memory, 0.0)
                                 for i, memory in enumerate([10**12, 2**62, 10**10])),
                      (link(0, 1, 1e9, 0.0), link(0, 2, 1e9, 1.0), link(1, 0, 1e10, 0.0), link(1, 2, 1e9, 0.0),
                       link(2, 0, 1e9, 0.0), link(2, 1, 1e10, 0.5)))
    times = np.array([[0, 1, 2], [3, 3, 3], [.5, 1, .5], [3, 2, 2], [.5, 3, 3], [3, 0, 2], [1, .5, .5]], dtype=float)
    problem = make_problem(graph, machine)
    problem = replace(problem, op_time_s=times, lower_bound_s=lower_bound_from_times(graph, times, 3))
    placed = problem.simulator().run(problem.expand(np.array([1, 0, 1, 0, 0])))
    assert placed.status == "ok" and placed.runtime_s == pytest.approx(6.0000010001)
    report = proven_bound(problem, 10.0)
    assert report.best_s <= placed.runtime_s
    if report.mip_s is not None and report.mip_s > placed.runtime_s:  # (a HiGHS that errs so)
        assert report.mip_status.startswith("refuted: a placement of these groups simulates") and "HiGHS" in \
            report.mip_status


def test_exact_highs__a_bound_refuted_is_no_proof_and_no_bound_of_the_run(problem, monkeypatch):
    """HiGHS's presolve error made to happen on the relaxed path (its first solve's bound raised to 0.002997 s):
    no proven best, no bound handed to the run."""
    from dataclasses import replace

    import policies.exact.relaxed_search as relaxed_search

    solve = relaxed_search.solve_relaxation
    raised = []

    def raised_first(*args, **kwargs):  # to its own point's step: a best measured there is "at the bound"
        found = solve(*args, **kwargs)
        raised.append(found)
        first_s = problem.simulator().run(problem.expand(found.unit_placement)).runtime_s
        return replace(found, bound_s=first_s) if len(raised) == 1 else found

    monkeypatch.setattr(relaxed_search, "solve_relaxation", raised_first)
    result = place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 20, 0, time_limit_s=10,
                   solver="highs")
    assert "(the solver's bound is refuted: a placement of these groups simulates" in result.notes
    assert "a HiGHS error" in result.notes and result.measurements > 1  # it stopped at its first point's step
    assert result.best.runtime_s == pytest.approx(_fast_step_s(problem))  # the refuting placement measured, and on
    assert np.isnan(result.solver_bound_s) and not result.solver_bound_every_placement


def test_proven_bound__each_bound_a_placement_undercuts_is_refuted_not_only_the_highest(problem, monkeypatch):
    """CP-SAT's bound raised to 0.00312 s and the MIP's to 0.003 s: the step that refuted CP-SAT's (0.003 s)
    was no refutation of the MIP's, which became the best "proven" bound above a 0.002111 s placement."""
    from dataclasses import replace

    import policies.exact.relaxation as relaxation
    from policies.exact.cpsat import ExactModel

    solve_cpsat, solve_highs = ExactModel.solve, relaxation.solve_relaxation
    monkeypatch.setattr(ExactModel, "solve", lambda *a, **k: replace(solve_cpsat(*a, **k), bound_s=0.00312))

    def raised_mip(problem, time_limit_s, integer=True, **kwargs):
        found = solve_highs(problem, time_limit_s, integer=integer, **kwargs)
        return replace(found, bound_s=0.003) if integer else found

    monkeypatch.setattr(relaxation, "solve_relaxation", raised_mip)
    report = proven_bound(problem, 5.0)
    assert report.best_s <= _fast_step_s(problem)
    assert report.mip_status.startswith("refuted") and report.exact_status.startswith("refuted")


def test_exact_highs__every_placement_measured_with_noise_is_no_proven_best():
    """2 ops on paper-2gpu: HiGHS ran out of placements to cut (every one measured) and called the best "proven
    best for the measurer" under a noisy measurer, where CP-SAT's path said there was no proof."""
    small = make_problem(synthetic_graph(2, 0), load_machine("paper-2gpu"))
    measurer = SimulatorMeasurer(small.graph, small.machine)
    result = place("exact", small, measurer, 16, 0, time_limit_s=5, solver="highs", noise_free=False)
    assert "proven best" not in result.notes and "no proof of the best" in result.notes
