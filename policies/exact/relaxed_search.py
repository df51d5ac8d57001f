"""``exact`` with HiGHS: placements from the simulator's relaxation (policies/exact/relaxation.py), measured.

1. The relaxation of every placement of the coarsening, solved for half the time (longer while it has no
   integer point: to the end of the limit if need be), started from the warm start, else the best single GPU:
   HiGHS's dual bound is a proven lower bound on the simulated step of every such placement that fits in
   memory (the policy's ``solver_bound_s``), and its best integer point is the first candidate.
2. A sweep of the communication weight: one solve per weight of ``COMM_WEIGHTS`` (heaviest first, each
   with an equal share of the time left), minimising w plus the weight times the placement cost (unit time
   on its device, least copy time of every cut pair of units: policies/exact/relaxation.py
   ``_placement_cost``), with a no-good cut on every placement measured so far; each new integer point is
   measured. The relaxation sees no queueing: its w-optimal placements balance the work over many cut
   edges, and the simulator's first-come dispatch then stalls them (nmt-2 / paper-2gpu: w 0.39 s, measured
   0.64-0.96 s). Heavier weights trade balance for fewer copies, and which trade the measurer rewards
   differs per graph, so the sweep measures each (BENCHMARKS.md, issue 16, "A sweep of the communication
   weight").
3. Then, while time and budget remain: the same solve at the weight whose placement measured best (a
   small tie-break, ``PLACEMENT_WEIGHT``, when that was step 1's), the cuts walking through its optimum.
   It runs on the time the sweep leaves: the sweep's last solve may take all that is left, and only a sweep
   whose solves end early (optimal, as on the 2-GPU rows) leaves any.
   Steps 2 and 3 also carry a cut from every placement measured so far (relaxation.py,
   ``_add_measured_rows``): w is at least its measured step less the reach of each unit moved off it. A
   no-good cut forbids the slow placement alone, and the next solve returns its neighbour, as loose in the
   relaxation and as slow; these lift the neighbourhood. Measured on the issue's eight rows at 600 s: lower
   on 4, the same on 2, higher on 2 (by up to 2.8%), 0.8% lower on the geometric mean (BENCHMARKS.md,
   issue 16, "Cuts from the measurements").
   Steps 2 and 3 carry the window rows too (constraint 7, ``CANDIDATE_WINDOW_ROWS``): leaving them out,
   measured on the issue's eight rows, found a faster placement on 2 and the same on 5 (BENCHMARKS.md,
   issue 16, 5 December 2026), short of the rule set beforehand for a switch.

Every solve's integer points are measured, not only its best: its best first, then the points HiGHS held
before it, newest first (``RelaxationResult.earlier``), while the budget lasts; the earlier points leave one
measurement for each sweep solve still to come, so a small budget still sees every weight. A 4-GPU solve cut
short at its limit ends with a few points only, and an earlier one, worse in the relaxation, can measure
faster (BENCHMARKS.md, issue 16, "Every integer point measured").

Stops early when the best measured step reaches the proven bound (the placement is then optimal for the
coarsening).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from policies.base import FAILED_COST_S, BudgetedMeasurer
from policies.exact.refute import Refutation, measured_refutation
from policies.exact.relaxation import proven_s, solve_relaxation
from policies.problem import PlacementProblem
from policies.spill import fit_units_in_memory

PLACEMENT_WEIGHT = 0.01  # tie-breaking cost per millisecond of unit time and copy time, against 1 per ms of w
COMM_WEIGHTS = (10.0, 3.0, 1.0, 0.3, 0.1)  # step 2's weights, heaviest (fastest to solve) first
BOUND_SHARE = 0.5  # of the time limit, for the relaxation of every placement
MIN_SOLVE_S = 1.0  # no new solve with less time than this left
CANDIDATE_WINDOW_ROWS = True  # constraint 7 in steps 2 and 3 too (always in step 1's: it is the bound)


REACHED_REL = 1e-4  # a best this close to the proven bound is the optimum, as far as the run says (reached)


@dataclass
class RelaxedRun:
    bound_s: float = math.nan  # proven, for every placement of the coarsening (step 1)
    bound_status: str = "unknown"
    model_s_of: dict[bytes, float] = field(default_factory=dict)  # unit placement bytes -> relaxation's w
    weight_of: dict[bytes, float] = field(default_factory=dict)  # unit placement bytes -> its solve's weight
    solves: int = 0
    solve_s: float = 0.0  # wall time of the solves, building the models included
    converged: bool = False  # the best measured step reached the proven bound, or every placement was measured
    proof_holds: bool = True  # the measurer is the noise-free simulator the bound holds for (else never reached)
    refuted: Refutation | None = None  # a placement the simulator steps below the bound: a HiGHS error
    steps: list[tuple[np.ndarray, float]] = field(default_factory=list)  # ((U,) placement, measured s), ok ones

    def model_s(self, unit_placement: np.ndarray | None) -> float:
        return _looked_up(self.model_s_of, unit_placement)

    def weight(self, unit_placement: np.ndarray | None) -> float:
        """The communication weight of the solve that gave ``unit_placement`` (0: step 1's); nan if none did."""
        return _looked_up(self.weight_of, unit_placement)

    def reached(self, counter: BudgetedMeasurer) -> bool:
        """The best measured step is at the proven bound: within ``REACHED_REL`` of the bound less HiGHS's
        tolerances (``proven_s``: HiGHS's own figure can sit 1 ns above the optimum, 1% of a step of 54 ns,
        and a best there was called proven while a faster placement existed; a window of 2e-6 alone never
        let a step under 2 ms converge). One below it proves nothing: the measurer is not the noise-free
        simulator the bound holds for (``--noise``, a real one), and with such a measurer (``proof_holds``
        False) nor does one above it: a noisy step at the bound was called the proven best."""
        if not self.proof_holds:
            return False
        proven = proven_s(self.bound_s)
        return proven * (1 - 1e-6) <= counter.best_cost_s <= proven + REACHED_REL * self.bound_s


def relaxed_search(problem: PlacementProblem, counter: BudgetedMeasurer, deadline: float,
                   start: np.ndarray | None = None, measured: Sequence[np.ndarray] = (),
                   proof_holds: bool = True) -> RelaxedRun:
    """Steps 1 to 3 of the module docstring; the measured placements are in ``counter``. ``start`` (U,):
    HiGHS's starting solution; ``measured``: (U,) placements measured already (the warm start), never
    measured again. HiGHS runs on one thread, as ``placer bound`` does: its task scheduler is one per
    process and takes one thread count."""
    threads = 1
    run = RelaxedRun(proof_holds=proof_holds)
    left_s = deadline - time.perf_counter()
    first = solve_relaxation(problem, left_s, threads=threads, incumbent_after_s=BOUND_SHARE * left_s, start=start)
    run.solves, run.bound_status, run.solve_s = 1, first.status, first.wall_s
    run.bound_s = first.bound_s if first.bound_s is not None else math.nan
    measured = [np.asarray(placement, dtype=np.int64) for placement in measured]
    measured += _check_bound(problem, counter, run, first)
    if first.unit_placement is None:
        run.converged = run.reached(counter)  # a measured warm start can sit at the bound
        return run
    sweep, best_weight, best_s = list(COMM_WEIGHTS), PLACEMENT_WEIGHT, math.inf
    found, weight = first, 0.0
    while counter.left > 0 and not run.reached(counter):
        for k, (point, model_s) in enumerate(_points(found)):
            if counter.left <= (len(sweep) if k else 0) or run.reached(counter):
                break  # the budget ends, what is left is the sweep's (one measurement per solve to come), or optimal
            cost_s = _measure_new(problem, counter, run, point, model_s, weight, measured)
            if cost_s < best_s:  # the best of this search's own placements (a warm start may be better)
                best_s, best_weight = cost_s, weight or PLACEMENT_WEIGHT  # step 1's placement: its tie-break
        left_s = deadline - time.perf_counter()
        if run.reached(counter) or left_s < MIN_SOLVE_S or counter.left == 0:
            break
        if not sweep and found.unit_placement is None:
            break  # the last solve had all the time left and found nothing (or every placement is cut)
        weight = sweep.pop(0) if sweep else best_weight
        share_s = min(left_s, max(left_s / (len(sweep) + 1), MIN_SOLVE_S))
        found = solve_relaxation(problem, share_s, threads=threads, placement_weight=weight,
                                 forbidden=measured, window_rows=CANDIDATE_WINDOW_ROWS,
                                 measured=run.steps)
        run.solves += 1
        run.solve_s += found.wall_s
        if found.status == "infeasible" and counter.best_measurement is not None and counter.best_measurement.ok:
            # every placement that fits is measured (cut by its no-good row; the cuts from the measurements only
            # lift w): the best measured is the best there is, however far above the bound (it said "time_limit")
            run.converged = True
            return run
    run.converged = run.reached(counter)
    return run


def _check_bound(problem: PlacementProblem, counter: BudgetedMeasurer, run: RelaxedRun, first) -> list:
    """Before the bound may end the search: a placement the simulator steps below it refutes it (HiGHS 1.16's
    presolve cut off a relaxation's optimum: policies/exact/refute.py); the search then never stops at it and
    measures that placement, in the budget. Returns [(U,) the placement measured], or []."""
    had_budget = counter.left > 0
    run.refuted = measured_refutation(problem, counter, run.bound_s,
                                      [] if first.unit_placement is None else [first.unit_placement])
    if run.refuted is None:
        return []
    run.proof_holds = False
    return [run.refuted.unit_placement] if had_budget else []


def _looked_up(of: dict[bytes, float], unit_placement: np.ndarray | None) -> float:
    """``of``'s value for the (U,) placement; nan for None or a placement no solve gave."""
    if unit_placement is None:
        return math.nan
    return of.get(np.asarray(unit_placement, dtype=np.int64).tobytes(), math.nan)


def _points(found) -> list[tuple[np.ndarray, float]]:
    """A solve's integer points in the order they are measured: its best, then the earlier ones newest first."""
    if found.unit_placement is None:
        return []
    return [(found.unit_placement, found.makespan_s)] + found.earlier[::-1]


def _measure_new(problem: PlacementProblem, counter: BudgetedMeasurer, run: RelaxedRun, placement: np.ndarray,
                 model_s: float, weight: float, measured: list[np.ndarray]) -> float:
    """Measure ``placement`` (U,) unless it was measured already (the warm start, which HiGHS reports among its
    points when started from it, or a point of this solve): its cost, else inf. Only a point measured here
    gets a model step and weight: the notes then never credit a warm start to a solve.

    The relaxation's memory rows hold parameters only; a point whose step overflows the simulator's memory
    model is repaired first, as the heuristics' placements are (``fit_units_in_memory``), and the repaired
    placement is measured (with no model step: the solve's is another placement's). Both are cut."""
    if any(np.array_equal(placement, seen) for seen in measured):
        return math.inf
    measured.append(placement)
    fitted, _ = fit_units_in_memory(problem, placement)
    if not np.array_equal(fitted, placement):
        if any(np.array_equal(fitted, seen) for seen in measured):
            return math.inf
        measured.append(fitted)
        model_s = math.nan
    run.model_s_of[fitted.tobytes()], run.weight_of[fitted.tobytes()] = model_s, weight
    cost_s = counter.measure([problem.expand(fitted)])[0]
    if cost_s < FAILED_COST_S:
        run.steps.append((fitted, cost_s))  # the placement measured (a cut says "P measured at T")
    return cost_s
