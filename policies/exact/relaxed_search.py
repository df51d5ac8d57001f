"""``exact`` with HiGHS: placements from the simulator's relaxation (policies/exact/relaxation.py), measured.

1. The relaxation of every placement of the coarsening, solved for half the time: HiGHS's dual bound is a
   proven lower bound on the simulated step of every such placement that fits in memory (the policy's
   ``solver_bound_s``), and its best integer point is the first candidate.
2. Then, while time and budget remain: the relaxation with a small tie-breaking cost (unit time on its
   device, least copy time of cut edges: policies/exact/relaxation.py ``_placement_cost``) and a no-good cut
   on every placement measured so far; each new integer point is measured. The relaxation sees no
   queueing, so many placements share its optimum; the tie-break and the cuts walk through them.

Stops early when the best measured step reaches the proven bound (the placement is then optimal for the
coarsening).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from policies.base import BudgetedMeasurer
from policies.exact.relaxation import solve_relaxation
from policies.problem import PlacementProblem

PLACEMENT_WEIGHT = 0.01  # tie-breaking cost per millisecond of unit time and copy time, against 1 per ms of w
BOUND_SHARE = 0.5  # of the time limit, for the relaxation of every placement
MIN_SOLVE_S = 1.0  # no new solve with less time than this left


@dataclass
class RelaxedRun:
    bound_s: float = math.nan  # proven, for every placement of the coarsening (step 1)
    bound_status: str = "unknown"
    model_s_of: dict[bytes, float] = field(default_factory=dict)  # unit placement bytes -> relaxation's w
    solves: int = 0
    converged: bool = False  # the best measured step reached the proven bound

    def model_s(self, unit_placement: np.ndarray | None) -> float:
        if unit_placement is None:
            return math.nan
        return self.model_s_of.get(np.asarray(unit_placement, dtype=np.int64).tobytes(), math.nan)


def relaxed_search(problem: PlacementProblem, counter: BudgetedMeasurer, deadline: float) -> RelaxedRun:
    """Steps 1 and 2 of the module docstring; the measured placements are in ``counter``. HiGHS runs on one
    thread, as ``placer bound`` does: its task scheduler is one per process and takes one thread count."""
    threads = 1
    run = RelaxedRun()
    first = solve_relaxation(problem, BOUND_SHARE * (deadline - time.perf_counter()), threads=threads)
    run.solves, run.bound_status = 1, first.status
    run.bound_s = first.bound_s if first.bound_s is not None else math.nan
    forbidden: list[np.ndarray] = []
    placement, model_s = first.unit_placement, first.makespan_s
    while placement is not None and counter.left > 0:
        run.model_s_of[placement.tobytes()] = model_s
        counter.measure([problem.expand(placement)])
        forbidden.append(placement)
        if counter.best_cost_s <= run.bound_s * (1 + 1e-6):
            run.converged = True
            break
        left_s = deadline - time.perf_counter()
        if left_s < MIN_SOLVE_S or counter.left == 0:
            break
        found = solve_relaxation(problem, left_s, threads=threads, placement_weight=PLACEMENT_WEIGHT,
                                 forbidden=forbidden)
        run.solves += 1
        placement, model_s = found.unit_placement, found.makespan_s
    return run
