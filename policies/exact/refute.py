"""A check of a bound a solver calls proven, against placements of the groups the simulator steps faster.

CP-SAT 9.15 (one worker) called 0.002997 s optimal on a 5-op graph (tests/policies/test_refute.py) where a
placement of those ops simulates 0.002111 s and its model, with that placement fixed, solves to 0.002107 s:
a solver error, not the model's (the same model with two workers or another seed says 0.002107 s). HiGHS
1.16's presolve likewise cut off a 7-op relaxation's optimum (6.001 s "optimal" where a placement steps
6.000001 s; without presolve it proves 6.000001 s). A bound above a placement's simulated step is no
bound, so before one is reported as proven, ``refuting_step`` looks for such a placement: every
single-device placement and the given ``starts``, each moved one group at a time while a move lowers its
step. It finds none for a sound bound, and a placement it finds disproves the bound; finding none proves
nothing more than the solver did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from policies.problem import PlacementProblem
from policies.simple import single_device_units

MAX_SIMULATIONS = 2000  # a few tenths of a second on the at most 16 single-op groups CP-SAT's bound is used for
MAX_SIMULATED_OPS = 200_000  # and ops simulated in all, past the starts: on a graph of thousands of ops the moves
# are few (the starts alone, on 32 scope groups of nmt-2), on tens of ops the 2,000 simulations
REFUTED_REL = 1e-9  # a step this far below the bound refutes it (the simulator's sums against the ticks')


@dataclass(frozen=True)
class Refutation:
    unit_placement: np.ndarray  # (U,) a placement of the groups that fits in memory
    step_s: float  # its simulated step, below the bound


def refuting_step(problem: PlacementProblem, bound_s: float,
                  starts: Sequence[np.ndarray] = ()) -> Refutation | None:
    """A placement of ``problem``'s groups that fits in memory and simulates below ``bound_s``; None when
    none is found within MAX_SIMULATIONS and MAX_SIMULATED_OPS (see the module docstring)."""
    if not math.isfinite(bound_s):
        return None
    simulator, seen = problem.simulator(), {}

    def step_s(units: np.ndarray) -> float:
        key = units.tobytes()
        if key not in seen:
            result = simulator.run(problem.expand(units))
            seen[key] = result.runtime_s if result.status == "ok" else math.inf
        return seen[key]

    below_s = bound_s * (1 - REFUTED_REL)
    most = min(MAX_SIMULATIONS, MAX_SIMULATED_OPS // max(problem.graph.num_ops, 1))
    candidates = [single_device_units(problem, d) for d in range(problem.num_devices)]
    candidates += [np.asarray(s, dtype=np.int64) for s in starts]
    for best in sorted(candidates, key=step_s):  # each descends to its own local optimum: the fastest start's
        while step_s(best) >= below_s and len(seen) < most:  # missed (0.003 s, moves all slower)
            moved = _best_move(problem, best, step_s, most - len(seen))
            if moved is None or step_s(moved) >= step_s(best):
                break
            best = moved
        if step_s(best) < below_s:
            return Refutation(best.copy(), float(step_s(best)))
    return None


def measured_refutation(problem: PlacementProblem, counter, bound_s: float,
                        starts: Sequence[np.ndarray] = ()) -> Refutation | None:
    """``refuting_step``, and its placement measured by ``counter`` (a BudgetedMeasurer) while the budget lasts:
    the best a search returns is then never worse than the placement that disproved its solver."""
    refuted = refuting_step(problem, bound_s, starts)
    if refuted is not None and counter.left > 0:
        counter.measure([problem.expand(refuted.unit_placement)])
    return refuted


def _best_move(problem: PlacementProblem, units: np.ndarray, step_s, most: int) -> np.ndarray | None:
    """The fastest placement one group's move away from ``units`` (at most ``most`` new ones simulated)."""
    best, tried = None, 0
    for unit in range(problem.num_units):
        for device in np.flatnonzero(problem.unit_allowed[unit]).tolist():
            if device == units[unit] or tried >= most:
                continue
            moved = units.copy()
            moved[unit] = device
            tried += 1
            if best is None or step_s(moved) < step_s(best):
                best = moved
    return best
