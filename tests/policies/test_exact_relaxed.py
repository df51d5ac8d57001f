"""``exact --solver highs`` (policies/exact/relaxed_search.py): placements of the simulator's relaxation,
measured, with no-good cuts between solves; the first solve's bound holds for every placement."""

from __future__ import annotations

import itertools
import math
import re
import time

import numpy as np
import pytest

from measurers.sim.measurer import SimulatorMeasurer
from measurers.sim.reference import Simulator
from policies.exact.relaxation import solve_relaxation
from policies.problem import make_problem
from policies.registry import place
from conftest import build_graph
from test_exact import exhaustive_optimum_s, own_channels_machine, random_dag, tight_memory_problem
from test_relaxation_bound import random_training_graph, staging_machine, without_window_rows


def test_relaxation__returns_its_integer_point_and_a_cut_placement_is_never_returned_again():
    graph, machine = random_dag(7, 5), own_channels_machine()
    problem = make_problem(graph, machine)
    first = solve_relaxation(problem, 20)
    assert first.status == "optimal" and first.unit_placement is not None
    assert first.makespan_s == pytest.approx(first.bound_s, rel=1e-6)  # optimal: w at the point is the bound
    second = solve_relaxation(problem, 20, forbidden=[first.unit_placement])
    assert second.unit_placement is not None and not np.array_equal(second.unit_placement, first.unit_placement)
    assert second.bound_s is None  # with cuts it is no longer a relaxation of every placement
    assert solve_relaxation(problem, 20, placement_weight=0.01).bound_s is None


def test_exact_highs__measures_distinct_placements_never_below_its_bound():
    graph, machine = random_dag(7, 6), own_channels_machine()
    problem = make_problem(graph, machine)
    measured = []
    result = place("exact", problem, SimulatorMeasurer(graph, machine), 6, 0, time_limit_s=30, solver="highs",
                   on_measurement=lambda placement, _m: measured.append(placement.tobytes()))
    optimum_s = exhaustive_optimum_s(graph, machine)
    assert len(measured) == len(set(measured)) == result.measurements >= 1
    assert result.solver_bound_s <= optimum_s <= result.best.runtime_s * (1 + 1e-6)  # HiGHS's slack taken off
    assert (result.measurements, result.stop_reason) == (6, "budget") or result.stop_reason == "converged"
    assert "relaxation (HiGHS" in result.notes


@pytest.mark.parametrize("seed", [0, 5])
def test_exact_highs__every_placement_measured_is_converged_and_proven_best(seed):
    """Two groups of three ops on three devices: 9 placements, every one measured in well under the limit, the
    best above the relaxation's bound (it sees a group's ops as one block). The run said "time_limit" and
    claimed nothing, as if more time could help."""
    dag = random_dag(6, seed)
    graph = build_graph(list(zip(dag.edge_src, dag.edge_dst, dag.edge_bytes)), 6, flops=dag.flops,
                        out_bytes=dag.out_bytes, bytes_accessed=dag.bytes_accessed, colocation=[0, 0, 0, 1, 1, 1],
                        name=f"two-groups-{seed}")
    machine = own_channels_machine()
    problem = make_problem(graph, machine)
    started = time.perf_counter()
    result = place("exact", problem, SimulatorMeasurer(graph, machine), 100, 0, time_limit_s=60, solver="highs")
    assert time.perf_counter() - started < 30 and result.measurements == 9
    assert result.best.runtime_s > result.solver_bound_s * 1.001  # not converged by reaching the bound
    assert result.stop_reason == "converged" and result.notes.endswith("(proven best for the measurer)")
    simulator = Simulator(graph, machine)
    every_s = [simulator.run(problem.expand(np.array(p))).runtime_s for p in itertools.product(range(3), repeat=2)]
    assert result.best.runtime_s == pytest.approx(min(every_s), rel=1e-9)


def test_exact_highs__time_limit_and_bound_on_32_groups():
    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    problem = make_problem(load_graph("rnnlm"), load_machine("paper-2gpu"), max_groups=32)
    started = time.perf_counter()
    result = place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 10, 0, time_limit_s=6,
                   solver="highs")
    assert time.perf_counter() - started < 6 + 6.0  # building the model, one measurement past the last solve
    assert result.best.ok and problem.lower_bound_s <= result.solver_bound_s <= result.best.runtime_s
    assert np.array_equal(problem.expand(result.group_placement), result.op_placement)


def test_relaxed_bound__the_closed_form_where_highs_stopped_below_it():
    """HiGHS stopped at its limit before its dual bound passed the closed form (a loaded machine, a short
    limit): exact reports the closed form, which holds for every placement, and says so."""
    from policies.exact.policy import _relaxed_bound
    from policies.exact.relaxation import proven_s
    from policies.exact.relaxed_search import RelaxedRun

    graph, machine = random_dag(7, 6), own_channels_machine()
    problem = make_problem(graph, machine)
    closed_s = problem.lower_bound_s
    bound_s, words = _relaxed_bound(problem, RelaxedRun(bound_s=0.5 * closed_s, bound_status="time_limit"))
    assert bound_s == closed_s and "the closed form's" in words and "time_limit" in words
    bound_s, words = _relaxed_bound(problem, RelaxedRun(bound_s=2 * closed_s, bound_status="optimal"))
    assert bound_s == proven_s(2 * closed_s) < 2 * closed_s and "closed form" not in words
    bound_s, words = _relaxed_bound(problem, RelaxedRun(bound_status="infeasible"))
    assert math.isnan(bound_s) and words == "no bound (infeasible)"


def test_exact_auto__cpsat_for_few_single_op_groups_highs_for_coarse_groups():
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from policies.exact.policy import cpsat_is_exact

    graph, machine = random_dag(7, 6), own_channels_machine()
    assert cpsat_is_exact(make_problem(graph, machine))
    assert not cpsat_is_exact(make_problem(load_graph("rnnlm"), load_machine("paper-2gpu"), max_groups=32))
    result = place("exact", make_problem(graph, machine), SimulatorMeasurer(graph, machine), 5, 0, time_limit_s=20)
    assert "dispatch rule" in result.notes  # CP-SAT's model


def test_exact_registry_limit_is_the_policys():
    from policies.exact.policy import MAX_GROUPS
    from policies.registry import policy_entry

    assert policy_entry("exact").max_groups == MAX_GROUPS


def test_proven_bound__adds_the_exact_solvers_bound_where_its_model_is_the_simulator():
    """On a few single-op groups CP-SAT's dispatch-rule model is the simulator: its bound is the optimum
    over every placement (enumerated), at least the relaxations', and it is the best proven bound."""
    from policies.exact.bound import SKIPPED, proven_bound

    graph, machine = random_dag(7, 6), own_channels_machine()
    report = proven_bound(make_problem(graph, machine), 30)
    optimum_s = exhaustive_optimum_s(graph, machine)
    assert report.exact_status == "optimal"
    assert report.exact_s == pytest.approx(optimum_s, rel=1e-3) and report.exact_s <= optimum_s * (1 + 1e-9)
    assert report.best_s == report.exact_s >= report.mip_s * (1 - 1e-9)
    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    coarse = proven_bound(make_problem(load_graph("rnnlm"), load_machine("paper-2gpu"), max_groups=8), 5)
    assert coarse.exact_status == SKIPPED and coarse.exact_s is None


def near_tie_problem():
    """The reviewer's counterexample: ready times closer than one tick (1e-10 s) on a 3-device machine with
    a channel per link. P1 -> A, P2 -> B -> C; P1, P2, C GPU-only, A, B CPU-only. Rounded to ticks, the
    dispatch rule's FIFO order swaps A and B, and that model's makespan of every placement is about twice
    the simulated step."""
    import dataclasses

    from conftest import build_graph
    from graphs.opgraph import kind_bit
    from measurers.machine import Link
    from measurers.sim.reference import output_alloc_bytes, simulate_reference

    base = own_channels_machine()
    names = [d.name for d in base.devices]
    links = tuple(Link(a, b, 10e9, 5e-6, f"{a}>{b}") for a in names for b in names if a != b)
    machine = dataclasses.replace(base, name="even-links", links=links)
    gpu, cpu = kind_bit("gpu"), kind_bit("cpu")
    graph = build_graph([(0, 2, 1000), (1, 3, 1000), (3, 4, 1000)], 5, allowed_mask=[gpu, gpu, cpu, cpu, gpu])
    times = np.full((5, 3), np.inf)
    times[[0, 1, 4], 1:] = [[1e-5 + 0.9e-10] * 2, [1e-5 + 0.5e-10] * 2, [1e-3] * 2]
    times[[2, 3], 0] = [1e-3, 1e-6]
    problem = dataclasses.replace(make_problem(graph, machine), op_time_s=times)
    alloc = output_alloc_bytes(graph)
    steps = [simulate_reference(graph, machine, np.array(p), times, alloc)
             for p in itertools.product(range(3), repeat=5) if np.isfinite(times[np.arange(5), list(p)]).all()]
    return problem, min(r.runtime_s for r in steps if r.status == "ok")


def test_bounds_stay_below_the_optimum_when_ready_times_tie_within_a_tick():
    from policies.exact.bound import proven_bound
    from policies.exact.cpsat import ExactModel
    from policies.exact.quotient import quotient_graph

    problem, optimum_s = near_tie_problem()
    assert proven_bound(problem, 20).best_s <= optimum_s * (1 + 1e-9)
    free = ExactModel(quotient_graph(problem), problem.machine, problem.capacity_bytes(), dispatch=False).solve(20)
    assert free.bound_s <= optimum_s * (1 + 1e-9)
    dispatch = ExactModel(quotient_graph(problem), problem.machine, problem.capacity_bytes(), dispatch=True).solve(20)
    assert dispatch.bound_s > optimum_s * 1.5  # why its bound is never reported: rounding reorders the tie


class OwnTimesMeasurer:
    """The reference simulator with the problem's own op times (near_tie_problem overrides the cost model's)."""

    def __init__(self, problem):
        from measurers.sim.reference import output_alloc_bytes

        self.problem, self.alloc = problem, output_alloc_bytes(problem.graph)

    def measure(self, placements):
        from measurers.base import Measurement
        from measurers.sim.reference import simulate_reference

        p, out = self.problem, []
        for placement in placements:
            r = simulate_reference(p.graph, p.machine, np.asarray(placement), p.op_time_s, self.alloc)
            out.append(Measurement(runtime_s=r.runtime_s, status=r.status, samples_s=[r.runtime_s],
                                   peak_bytes=r.peak_bytes, measure_s=0.0))
        return out


def test_exact_dispatch_rule__does_not_stop_on_its_own_bound_when_a_near_tie_makes_it_twice_the_optimum():
    """The dispatch rule's model says every placement of near_tie_problem takes about twice the optimum, so
    its bound 'reached' the first placement measured (2.02 ms, said converged); only the free-order bound may
    stop the cuts, and they go on to the optimum (1.02 ms)."""
    problem, optimum_s = near_tie_problem()
    result = place("exact", problem, OwnTimesMeasurer(problem), 20, 0, time_limit_s=20)
    assert "dispatch rule" in result.notes
    assert result.best.runtime_s == pytest.approx(optimum_s, rel=1e-9), result.notes
    assert result.stop_reason == "converged" and "(proven best for the measurer to within" in result.notes


def test_exact_highs__no_solve_after_the_budget_is_spent():
    graph, machine = random_dag(7, 6), own_channels_machine()
    result = place("exact", make_problem(graph, machine), SimulatorMeasurer(graph, machine), 2, 0, time_limit_s=30,
                   solver="highs")
    solves = int(re.search(r"(\d+) solve\(s\)", result.notes).group(1))
    assert 1 <= solves <= result.measurements <= 2, result.notes  # every solve's placement was measured
    assert result.stop_reason == "converged" or (result.stop_reason, result.measurements) == ("budget", 2)
    one = place("exact", make_problem(graph, machine), SimulatorMeasurer(graph, machine), 1, 0, time_limit_s=30,
                solver="highs")
    assert (one.measurements, one.stop_reason) == (1, "budget")  # not "time_limit": 30 s were far from spent


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relaxation_bound__below_every_placement_of_multi_op_units(seed):
    """The channel-load and precedence rows count bytes per producer op and consumer unit: with several ops
    per unit, the MIP bound stays at or below the best simulated step over every placement of the units."""
    import dataclasses

    from measurers.catalog import load_machine

    graph, machine = random_dag(10, 40 + seed), load_machine("paper-2gpu")
    base = make_problem(graph, machine)
    op_unit = np.array([0, 0, 1, 1, 1, 2, 2, 3, 3, 3])  # 4 units of consecutive ops (a DAG's order)
    problem = dataclasses.replace(base, op_unit=op_unit)
    simulator = Simulator(graph, machine)
    steps = [simulator.run(problem.expand(np.array(units)))
             for units in itertools.product(range(machine.num_devices), repeat=4)]
    best_s = min(r.runtime_s for r in steps if r.status == "ok")
    bound = solve_relaxation(problem, 30)
    assert bound.status == "optimal" and problem.lower_bound_s * (1 - 1e-9) <= bound.bound_s <= best_s * (1 + 1e-6)


@pytest.mark.parametrize("solver", ["highs", "cpsat"])
def test_exact__no_placement_that_fits_in_memory_is_said_so_not_a_time_out(solver):
    """CP-SAT proved its model infeasible at once and the run said it had found nothing within its limit."""
    import dataclasses

    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    graph, base = load_graph("synthetic:60:1"), load_machine("paper-2gpu")
    machine = dataclasses.replace(base, devices=tuple(dataclasses.replace(d, memory_bytes=10**6)
                                                      for d in base.devices))  # below the graph's parameters
    problem = make_problem(graph, machine, max_groups=8)
    result = place("exact", problem, SimulatorMeasurer(graph, machine), 5, 0, time_limit_s=10, solver=solver)
    assert f"no placement of the {problem.num_units} groups fits in device memory" in result.notes
    assert result.stop_reason == "converged" and result.solver_status == "infeasible, no solution"


def test_exact_highs__measures_the_warm_start_first_and_is_never_worse_than_it():
    """The warm start was ignored by HiGHS's path (search --warm-start m-etf: exact's best 0.005759 s, the
    warm start 0.005599 s): it is measured first, collapsed onto the groups, and HiGHS starts from it."""
    graph, machine = random_dag(7, 6), own_channels_machine()
    problem = make_problem(graph, machine)
    start = np.array([1, 2, 1, 2, 1, 2, 1])  # alternating GPUs: a valid placement, not the relaxation's
    measured = []
    result = place("exact", problem, SimulatorMeasurer(graph, machine), 3, 0, time_limit_s=20, solver="highs",
                   warm_start=[start], on_measurement=lambda placement, _m: measured.append(placement.copy()))
    start_s = Simulator(graph, machine).run(start).runtime_s
    assert np.array_equal(measured[0], start) and result.warm_start_runtime_s == pytest.approx(start_s)
    assert result.best.runtime_s <= start_s
    assert len({p.tobytes() for p in measured}) == len(measured)  # the warm start is not measured again


def test_exact_highs__a_first_solve_without_an_integer_point_goes_on_with_the_time_left(monkeypatch):
    """The first solve had half the limit; without an integer point by then exact returned the best single
    GPU with the other half unused (nmt-2, 32 groups, 3 s). With a share too small to build the model in,
    it goes on until it has one."""
    import policies.exact.relaxed_search as relaxed_search

    monkeypatch.setattr(relaxed_search, "BOUND_SHARE", 1e-9)
    graph, machine = random_dag(7, 6), own_channels_machine()
    result = place("exact", make_problem(graph, machine), SimulatorMeasurer(graph, machine), 3, 0, time_limit_s=20,
                   solver="highs")
    assert "no solution" not in result.solver_status and "gave no placement" not in result.notes, result.notes
    assert math.isfinite(result.solver_bound_s) and result.best.ok


@pytest.mark.parametrize("in_candidates", [True, False])
def test_exact_highs__window_rows_always_in_the_bound_solve_in_the_candidates_as_set(in_candidates, monkeypatch):
    """Constraint 7 raises the proven bound (3.7% on this graph), so the first solve, which gives the bound,
    always carries the rows; the solves with a weight and the cuts carry them as
    ``CANDIDATE_WINDOW_ROWS`` says (True: leaving them out was measured and not kept, BENCHMARKS.md issue 16)."""
    import policies.exact.relaxation as relaxation
    import policies.exact.relaxed_search as relaxed_search

    problem = make_problem(random_training_graph(2), staging_machine(num_gpus=2))
    with_rows = []  # per model built: whether constraint 7 was added
    build, add_windows = relaxation._build, relaxation._add_window_rows
    monkeypatch.setattr(relaxed_search, "CANDIDATE_WINDOW_ROWS", in_candidates)
    monkeypatch.setattr(relaxation, "_add_window_rows", lambda *args: with_rows.__setitem__(-1, True) or
                        add_windows(*args))
    monkeypatch.setattr(relaxation, "_build", lambda *args, **kwargs: with_rows.append(False) or
                        build(*args, **kwargs))
    result = place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 12, 0, time_limit_s=30,
                   solver="highs")
    assert result.measurements == 12 and len(with_rows) > 3
    # the last model built: the chosen placement's relaxed step (relaxed_step_s), with every valid row
    assert with_rows == [True] + [in_candidates] * (len(with_rows) - 2) + [True]
    monkeypatch.undo()
    assert relaxed_search.CANDIDATE_WINDOW_ROWS  # today's setting
    assert result.solver_bound_s <= solve_relaxation(problem, 30.0).bound_s * (1 + 1e-6)  # HiGHS's MIP gap
    assert result.solver_bound_s > without_window_rows(problem, monkeypatch).bound_s * 1.03


def test_relaxation__keeps_the_integer_points_found_before_its_best():
    """``earlier``: the MIP's integer points before its best, oldest first, each no worse in the model than the
    one before (weight 0: w), each once, none of them the best; exact measures them too."""
    problem = make_problem(random_training_graph(2), staging_machine(num_gpus=2))
    found = solve_relaxation(problem, 30.0)
    w_s = [model_s for _, model_s in found.earlier] + [found.makespan_s]
    assert found.status == "optimal" and len(found.earlier) >= 2
    assert all(a >= b for a, b in zip(w_s, w_s[1:])) and w_s[0] > w_s[-1]  # HiGHS can report ties
    points = [placement.tobytes() for placement, _ in found.earlier] + [found.unit_placement.tobytes()]
    assert len(set(points)) == len(points)
    for placement, _ in found.earlier:
        assert placement.shape == found.unit_placement.shape
        assert problem.unit_allowed[np.arange(len(placement)), placement].all()


def _cut_copy_ms(problem, unit_placement: np.ndarray) -> float:
    """The placement cost's copy part: each cut pair of units' least copy time (milliseconds)."""
    import policies.exact.relaxation as relaxation
    from measurers.sim.links import link_table

    layout = relaxation._layout(problem)
    cost = relaxation._placement_cost(problem, layout, link_table(problem.machine))
    cut = unit_placement[layout.pair_a] != unit_placement[layout.pair_b]
    return float(cost[layout.z_col][cut].sum())


def test_relaxation__a_heavier_communication_weight_trades_balance_for_fewer_copies():
    """Solved to optimality, w + weight * cost has no more copy time on cut pairs than the relaxation's own
    optimum and no smaller w (the sweep's trade); on this graph, with weight 100, strictly: 4.66 ms of
    copies to 0.08 ms, w 0.253 s to 0.314 s."""
    problem = make_problem(random_training_graph(1), staging_machine(num_gpus=2))
    plain = solve_relaxation(problem, 30.0)
    heavy = solve_relaxation(problem, 30.0, placement_weight=100.0)
    assert plain.status == heavy.status == "optimal"
    assert _cut_copy_ms(problem, heavy.unit_placement) < 0.1 * _cut_copy_ms(problem, plain.unit_placement)
    assert heavy.makespan_s > 1.1 * plain.makespan_s


def _record_solves(monkeypatch) -> list:
    """Every solve exact's relaxed search makes from now on, as (weight, placements cut, its (U,) integer
    points in the order they are measured: its best, then the earlier ones newest first), in order."""
    import policies.exact.relaxed_search as relaxed_search

    solves = []

    def recording(problem, time_limit_s, **kwargs):
        found = solve_relaxation(problem, time_limit_s, **kwargs)
        points = [placement for placement, _ in relaxed_search._points(found)]
        solves.append((kwargs.get("placement_weight", 0.0), len(kwargs.get("forbidden", ())), points))
        return found

    monkeypatch.setattr(relaxed_search, "solve_relaxation", recording)
    return solves


def _new_points(solves: list) -> list[tuple[bytes, int]]:
    """(placement bytes, index of the solve that found it first), for every distinct point, in finding order."""
    seen = {}
    for k, (_, _, points) in enumerate(solves):
        for placement in points:
            seen.setdefault(placement.tobytes(), k)
    return list(seen.items())


def test_exact_highs__sweeps_the_communication_weights_then_cuts_at_the_best_measured(monkeypatch):
    """After the bound solve, one solve per weight of COMM_WEIGHTS (heaviest first), then the weight whose
    placement measured best; every solve measures each new integer point it found, and every solve after the
    first cuts every placement measured so far."""
    import policies.exact.relaxed_search as relaxed_search

    problem = make_problem(random_training_graph(2), staging_machine(num_gpus=2))
    solves = _record_solves(monkeypatch)
    measured = []
    result = place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 40, 0, time_limit_s=60,
                   solver="highs", on_measurement=lambda placement, m: measured.append((placement.copy(), m)))
    sweep = list(relaxed_search.COMM_WEIGHTS)
    assert [w for w, _, _ in solves[:len(sweep) + 1]] == [0.0] + sweep
    found = _new_points(solves)
    assert result.measurements == len(measured) == 40 <= len(found)  # the budget can end inside a solve's points
    found = found[:40]
    assert [problem.expand(np.frombuffer(units, dtype=np.int64)).tobytes() for units, _ in found] == \
        [placement.tobytes() for placement, _ in measured]  # each point once, in the order found
    assert any(len(points) > 1 for _, _, points in solves)  # earlier points measured too, on this graph
    assert [cut for _, cut, _ in solves] == [sum(k < j for _, k in found) for j in range(len(solves))]
    best_s = min(m.runtime_s for _, m in measured)
    first_best = next(k for k, (_, m) in enumerate(measured) if m.runtime_s == best_s)
    best_weight = solves[found[first_best][1]][0] or relaxed_search.PLACEMENT_WEIGHT
    assert len(solves) > len(sweep) + 1 and all(w == best_weight for w, _, _ in solves[len(sweep) + 1:])
    assert result.best.runtime_s == best_s
    assert f"(communication weight {solves[found[first_best][1]][0]:g})" in result.notes


def test_exact_highs__a_small_budget_still_measures_one_point_of_every_sweep_solve(monkeypatch):
    """Earlier integer points leave one measurement for each sweep solve to come: with a budget of one per
    solve, every weight is solved and each solve's best is what gets measured."""
    import policies.exact.relaxed_search as relaxed_search

    problem = make_problem(random_training_graph(2), staging_machine(num_gpus=2))
    solves = _record_solves(monkeypatch)
    measured = []
    budget = len(relaxed_search.COMM_WEIGHTS) + 1
    result = place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), budget, 0,
                   time_limit_s=60, solver="highs", on_measurement=lambda placement, m: measured.append(placement))
    assert [w for w, _, _ in solves] == [0.0] + list(relaxed_search.COMM_WEIGHTS)
    assert any(len(points) > 1 for _, _, points in solves)  # earlier points were there, and left unmeasured
    assert result.measurements == budget
    assert [placement.tobytes() for placement in measured] == [problem.expand(points[0]).tobytes()
                                                               for _, _, points in solves]


def test_exact_highs__cuts_at_the_weight_of_its_own_best_when_the_warm_start_is_better(monkeypatch):
    """Step 3's weight is that of the best placement the search itself found: with the best placement of a
    cold run as the warm start (nothing beats it), step 3 used to run at the tie-break weight whatever the
    sweep had found."""
    import policies.exact.relaxed_search as relaxed_search

    problem = make_problem(random_training_graph(2), staging_machine(num_gpus=2))
    measurer = SimulatorMeasurer(problem.graph, problem.machine)
    cold = place("exact", problem, measurer, 40, 0, time_limit_s=60, solver="highs")
    solves = _record_solves(monkeypatch)
    cost_s = {}
    warm = place("exact", problem, measurer, 40, 0, time_limit_s=60, solver="highs", warm_start=[cold.op_placement],
                 on_measurement=lambda placement, m: cost_s.setdefault(placement.tobytes(), m.runtime_s))
    placed = [(problem.expand(np.frombuffer(units, dtype=np.int64)).tobytes(), k) for units, k in _new_points(solves)]
    own = [(cost_s[op], k) for op, k in placed if op != cold.op_placement.tobytes() and op in cost_s]
    assert warm.best.runtime_s == cold.best.runtime_s <= min(own)[0]
    best_weight = solves[min(own)[1]][0] or relaxed_search.PLACEMENT_WEIGHT
    step3 = [w for w, _, _ in solves[len(relaxed_search.COMM_WEIGHTS) + 1:]]
    assert step3 and all(w == best_weight for w in step3), (best_weight, step3)
    assert best_weight != relaxed_search.PLACEMENT_WEIGHT  # the sweep's weight, not the fallback
    # HiGHS, started from the warm start, reports it among its points: it is not credited to the bound solve
    assert "the chosen placement is the warm start" in warm.notes and "communication weight" not in warm.notes


def test_exact_highs__stops_measuring_a_solves_points_once_the_bound_is_reached(monkeypatch):
    """A measured step at the proven bound is optimal: the solve's other points are not measured."""
    import dataclasses

    import policies.exact.relaxed_search as relaxed_search

    problem = make_problem(random_training_graph(2), staging_machine(num_gpus=2))
    measurer = SimulatorMeasurer(problem.graph, problem.machine)
    solves = []

    def bound_at_its_best(problem, time_limit_s, **kwargs):  # the bound solve's bound made tight at its best
        found = solve_relaxation(problem, time_limit_s, **kwargs)
        solves.append(len(found.earlier))
        best_s = measurer.measure([problem.expand(found.unit_placement)])[0].runtime_s
        return dataclasses.replace(found, bound_s=best_s) if len(solves) == 1 else found

    monkeypatch.setattr(relaxed_search, "solve_relaxation", bound_at_its_best)
    # the made-up bound is no bound: placements the simulator steps faster refute it (policies/exact/refute.py)
    for where in ("policies.exact.policy", "policies.exact.refute"):
        monkeypatch.setattr(f"{where}.refuting_step", lambda *args, **kwargs: None)
    result = place("exact", problem, measurer, 40, 0, time_limit_s=20, solver="highs")
    assert solves[0] >= 1 and len(solves) == 1  # it had earlier points, and nothing was solved after it
    assert (result.measurements, result.stop_reason) == (1, "converged")


@pytest.mark.parametrize("bound_s, reached", [(0.256, True), (0.974e-3, True), (75e-6, True), (36e-6, True),
                                              (54.93e-9, False)])
def test_relaxed_run__a_best_at_a_tight_bound_is_reached_but_not_one_within_highs_tolerance(bound_s, reached):
    """A best at HiGHS's own figure: on steps under 2 ms a window of 2e-6 around the bound less its 2 ns
    never held it (exact spent its whole budget), while at 54 ns HiGHS's figure was 1% above the optimum."""
    from types import SimpleNamespace

    from policies.exact.relaxed_search import RelaxedRun

    run = RelaxedRun(bound_s=bound_s)
    assert run.reached(SimpleNamespace(best_cost_s=bound_s)) is reached
    assert not run.reached(SimpleNamespace(best_cost_s=bound_s * 0.99))  # below: not the noise-free simulator
    assert not run.reached(SimpleNamespace(best_cost_s=bound_s * 1.01))
    assert not run.reached(SimpleNamespace(best_cost_s=float("inf")))  # nothing measured yet


def test_relaxation__a_measured_cut_lifts_w_by_what_stays_of_the_measured_placement():
    """A cut from a placement P measured at T: w >= T - the reach of every unit moved off P. Measured far above
    the model, the best point moves every unit that can move; measured at the model's own optimum, it binds
    nowhere else (every other point's w is at least that optimum already)."""
    graph, machine = random_dag(7, 5), own_channels_machine()
    problem = make_problem(graph, machine)
    first = solve_relaxation(problem, 20)
    assert first.status == "optimal"
    placement = first.unit_placement
    movable = problem.unit_allowed.sum(axis=1) > 1
    assert movable.sum() >= 3
    far = solve_relaxation(problem, 20, forbidden=[placement], measured=[(placement, 1e3)])
    assert far.unit_placement is not None and far.bound_s is None
    assert (far.unit_placement != placement)[movable].all()
    assert far.makespan_s > 1.0  # w is lifted above anything the relaxation alone gives
    plain = solve_relaxation(problem, 20, forbidden=[placement])
    at_optimum = solve_relaxation(problem, 20, forbidden=[placement], measured=[(placement, first.makespan_s)])
    assert at_optimum.makespan_s == pytest.approx(plain.makespan_s, rel=1e-6)


def test_exact_highs__every_candidate_solve_carries_a_cut_from_each_placement_measured_before_it(monkeypatch):
    import policies.exact.relaxed_search as relaxed_search

    problem = make_problem(random_training_graph(2), staging_machine(num_gpus=2))
    cuts_per_solve = []

    def recording(problem, time_limit_s, **kwargs):
        cuts_per_solve.append([(units.copy(), step_s) for units, step_s in kwargs.get("measured", ())])
        return solve_relaxation(problem, time_limit_s, **kwargs)

    monkeypatch.setattr(relaxed_search, "solve_relaxation", recording)
    measured = []
    place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 12, 0, time_limit_s=60,
          solver="highs", on_measurement=lambda placement, m: measured.append((placement.copy(), m.runtime_s)))
    assert len(cuts_per_solve) >= 3 and cuts_per_solve[0] == []  # the bound solve carries none
    for cuts in cuts_per_solve[1:]:
        assert 1 <= len(cuts) <= len(measured)
        assert [(problem.expand(units).tobytes(), step_s) for units, step_s in cuts] == \
            [(placement.tobytes(), step_s) for placement, step_s in measured[:len(cuts)]]
    assert [len(cuts) for cuts in cuts_per_solve] == sorted(len(cuts) for cuts in cuts_per_solve)


def test_exact_highs__a_point_that_overflows_memory_is_repaired_before_it_is_measured(monkeypatch):
    """The relaxation's memory rows hold parameters only: a point whose activations overflow a device was
    measured as it was and failed (nmt-2, 121 groups, 3 GB devices: 'none ok', where a fitting placement of
    those groups exists). It is repaired first, as the heuristics' placements are, and the repair measured."""
    import dataclasses

    import policies.exact.relaxed_search as relaxed_search

    problem, on_gpu = tight_memory_problem()
    machine = problem.machine

    def first_point_on_one_gpu(problem, time_limit_s, **kwargs):
        found = solve_relaxation(problem, time_limit_s, **kwargs)
        return dataclasses.replace(found, unit_placement=on_gpu, earlier=[]) if not kwargs.get("forbidden") else found

    monkeypatch.setattr(relaxed_search, "solve_relaxation", first_point_on_one_gpu)
    measured = []
    result = place("exact", problem, SimulatorMeasurer(problem.graph, machine), 1, 0, time_limit_s=20, solver="highs",
                   on_measurement=lambda placement, m: measured.append((placement.copy(), m.status)))
    assert len(measured) == 1 and measured[0][1] == "ok"
    assert not np.array_equal(measured[0][0], problem.expand(on_gpu))
    assert result.best.ok and "repaired to fit in memory" in result.notes and math.isnan(result.solver_makespan_s)


def test_exact_highs__the_solvers_makespan_is_the_relaxations_step_of_the_chosen_placement(monkeypatch):
    """An integer point's w is what HiGHS held there, which nothing minimised for that placement (an earlier
    point's, or one cut short): reported as the solver's makespan, it stood above the measured step, where the
    relaxation's step of any placement is at most its simulated step."""
    import dataclasses

    from policies.exact import relaxed_search
    from policies.exact.relaxation import relaxed_step_s

    problem = make_problem(random_training_graph(3), staging_machine(num_gpus=2))

    def inflated(problem, time_limit_s, **kwargs):
        found = solve_relaxation(problem, time_limit_s, **kwargs)
        return dataclasses.replace(found, makespan_s=found.makespan_s + 1.0,
                                   earlier=[(p, w + 1.0) for p, w in found.earlier])

    monkeypatch.setattr(relaxed_search, "solve_relaxation", inflated)
    result = place("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 4, 0, time_limit_s=10,
                   solver="highs")
    assert result.best.ok and "takes at least" in result.notes
    assert result.solver_makespan_s == relaxed_step_s(problem, result.group_placement, 10.0)
    assert result.solver_makespan_s <= result.best.runtime_s * (1 + 1e-6)


def test_exact_highs__a_run_past_its_time_limit_says_why(monkeypatch):
    """HiGHS checks its time limit nowhere in a MIP's set-up and presolve: on 506 groups of nmt-2 on
    dgx1-v100 a 5 s limit ran 25.6 s, and nothing said so."""
    import dataclasses

    import policies.exact.relaxed_search as relaxed_search

    def slow(problem, time_limit_s, **kwargs):  # a solve that overruns its limit, as HiGHS's presolve does
        found = solve_relaxation(problem, time_limit_s, **kwargs)
        time.sleep(time_limit_s + 1.5)
        return dataclasses.replace(found, wall_s=found.wall_s + time_limit_s + 1.5)

    graph, machine = random_dag(7, 6), own_channels_machine()
    problem = make_problem(graph, machine)
    monkeypatch.setattr(relaxed_search, "solve_relaxation", slow)
    result = place("exact", problem, SimulatorMeasurer(graph, machine), 1, 0, time_limit_s=1, solver="highs")
    assert re.search(r"ran [0-9.]+ s past the time limit: HiGHS cannot interrupt", result.notes), result.notes
    monkeypatch.undo()
    on_time = place("exact", problem, SimulatorMeasurer(graph, machine), 1, 0, time_limit_s=2, solver="highs")
    assert "past the time limit" not in on_time.notes


def test_exact_highs__a_repaired_candidate_is_recorded_as_the_placement_measured():
    """A candidate over memory is repaired and the repair measured, but run.steps paired the candidate with
    the repair's step, and the next solves' cuts ("P measured at T") said so of a placement never measured."""
    import dataclasses

    from graphs.synthetic import synthetic_graph
    from measurers.catalog import load_machine
    from policies.base import BudgetedMeasurer, DecisionClock
    from policies.exact.relaxed_search import RelaxedRun, _measure_new

    graph, base = synthetic_graph(60, 0), load_machine("paper-2gpu")
    peak_bytes = make_problem(graph, base, max_groups=6).single_device_peak_bytes
    machine = dataclasses.replace(base, devices=tuple(dataclasses.replace(d, memory_bytes=int(0.7 * peak_bytes))
                                                      for d in base.devices))
    problem = make_problem(graph, machine, max_groups=6)
    counter = BudgetedMeasurer(SimulatorMeasurer(graph, machine), 10, problem.capacity_bytes(), DecisionClock())
    run, measured = RelaxedRun(), []
    over = np.full(problem.num_units, problem.gpu_indices()[0], dtype=np.int64)  # everything on one GPU
    cost_s = _measure_new(problem, counter, run, over, 0.001, 0.0, measured)
    repaired = measured[-1]
    assert not np.array_equal(repaired, over) and np.isfinite(cost_s)
    assert [(placement.tolist(), step_s) for placement, step_s in run.steps] == [(repaired.tolist(), cost_s)]
