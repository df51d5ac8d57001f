"""The best proven lower bound on a problem's step time, and what it holds for.

``proven_bound(problem, time_limit_s)`` gathers four bounds:

- the closed form, ``max(critical path, work / devices)`` (``measurers/sim/lower_bound.py``): it holds for
  every placement of the graph;
- the LP relaxation of ``policies/exact/relaxation.py`` and
- its mixed-integer relaxation (HiGHS's dual bound, optimal or cut short by the time limit): these hold
  for the placements that keep each unit of ``problem.op_unit`` on one device and fit in memory, i.e. for
  the coarsening searched, not for placements of finer groups;
- the exact solver's bound (CP-SAT, policies/exact/cpsat.py, free order) where its model is a relaxation
  of the simulator: a few single-op groups (``policies.exact.policy.cpsat_is_exact``), with the time the
  relaxations left (ticks rounded down keep it one; the dispatch rule's model is not used: rounding can
  reorder near-ties). On coarse groups its model (groups run whole) is no relaxation, so it is not used.
  CP-SAT, and HiGHS's presolve, have called a bound optimal that a placement's simulated step undercuts
  (policies/exact/refute.py): placements are simulated first, and a bound one of them refutes is left out,
  its status saying by what.

``best_s`` is the largest of them, the LP's and the MIP's rounded down by HiGHS's tolerances (1e-6
relative, ``SOLVER_SLACK``, and absolute: ``relaxation.proven_s``): the MIP's optimum of one group came out a
few ulps above the simulated step of that very placement, and on steps of nanoseconds up to 4% above. (The
closed form is the lower bound every table prints, already lowered by its summing margin; CP-SAT's ticks are
rounded down already.) ``holds_for`` says for which placements it holds. ``time_limit_s`` is shared: the LP
gets it, the MIP what the LP left; 0 gives the closed form alone.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from dataclasses import asdict, dataclass

from graphs.errors import PlacerError
from policies.exact.refute import REFUTED_REL, refuting_step
from policies.problem import PlacementProblem

EVERY_PLACEMENT = "every placement"
SKIPPED = "skipped"


@dataclass(frozen=True)
class BoundReport:
    graph: str
    machine: str
    closed_form_s: float  # holds for every placement
    lp_s: float | None  # HiGHS's value as solved (best_s takes it less its tolerances); None: not solved
    # (skipped, or cut short: an unfinished LP proves nothing)
    lp_status: str
    lp_wall_s: float
    mip_s: float | None  # HiGHS's dual bound as solved, a few ulps high at worst (best_s is lowered); None: none
    mip_status: str  # "optimal", "time limit", "infeasible" (no placement fits in memory), "skipped",
    # relaxation.NOT_SOLVED (building the model took the time left)
    mip_wall_s: float
    exact_s: float | None  # CP-SAT's bound where its model is the simulator; None: not solved (see above)
    exact_status: str
    exact_wall_s: float
    grouping: str  # the coarsening the LP and MIP bounds hold for, e.g. "the 32 scope groups of nmt-2"
    best_s: float  # the largest of them, the LP's and MIP's rounded down (see the module docstring)
    holds_for: str  # what best_s holds for: EVERY_PLACEMENT or "placements of <grouping>"
    time_limit_s: float
    wall_s: float

    def to_json(self) -> dict:
        return asdict(self)


def grouping_name(problem: PlacementProblem) -> str:
    """Which coarsening the problem places, in words."""
    return f"the {problem.num_units} {grouping_method(problem)} groups of {problem.graph.name}"


def grouping_method(problem: PlacementProblem) -> str:
    """The method that made the problem's groups: its grouping's (scope falls back to metis on a graph
    without scopes), "colocation" without one."""
    if problem.grouping is None:
        return "colocation"
    return getattr(problem.grouping, "method", "") or "searched"


def proven_bound(problem: PlacementProblem, time_limit_s: float, threads: int = 1,
                 stop: threading.Event | None = None) -> BoundReport:
    """The closed-form, LP, MIP and CP-SAT bounds of the module docstring within ``time_limit_s`` seconds, or
    until ``stop`` is set (by another thread: what was proven by then; the solve it ended says "stopped",
    those it kept from starting "skipped")."""
    from policies.exact.relaxation import proven_s, solve_relaxation

    if not isinstance(time_limit_s, numbers.Real) or not time_limit_s >= 0 or math.isinf(time_limit_s):
        raise PlacerError(f"the bound's time limit must be a finite number of seconds >= 0, got {time_limit_s}")
    began = time.perf_counter()
    closed_s = float(problem.lower_bound_s)
    lp = mip = None
    if time_limit_s > 0:
        lp = solve_relaxation(problem, time_limit_s, integer=False, threads=threads, stop=stop)
        left_s = time_limit_s - (time.perf_counter() - began)
        if left_s > 0 and not (stop is not None and stop.is_set()):
            mip = solve_relaxation(problem, left_s, integer=True, threads=threads, stop=stop)
    stopped = stop is not None and stop.is_set()
    exact = None if stopped else _exact_bound(problem, time_limit_s - (time.perf_counter() - began), threads, stop)
    solved = {"LP": None if lp is None or lp.bound_s is None else proven_s(lp.bound_s),
              "MIP": None if mip is None or mip.bound_s is None else proven_s(mip.bound_s),
              "CP-SAT": None if exact is None or not math.isfinite(exact.bound_s) else exact.bound_s}
    statuses = {"LP": SKIPPED if lp is None else lp.status, "MIP": SKIPPED if mip is None else mip.status,
                "CP-SAT": _exact_status(exact, stop)}
    grouping = grouping_name(problem)
    candidates = [(closed_s, EVERY_PLACEMENT)]
    starts, refuted, survived = _solution_starts(exact, mip), None, False
    for solver, bound_s in sorted(((k, b) for k, b in solved.items() if b is not None), key=lambda kb: -kb[1]):
        if not survived and (refuted is None or bound_s < refuted.step_s * (1 - REFUTED_REL)):  # highest first
            found = refuting_step(problem, bound_s, starts) if bound_s > closed_s else None
            refuted, survived = found or refuted, found is None  # (the bounds below a survivor cannot be best)
            starts += [] if found is None else [found.unit_placement]
        if refuted is not None and bound_s >= refuted.step_s * (1 - REFUTED_REL):
            statuses[solver] = (f"refuted: a placement of these groups simulates {refuted.step_s:.6g} s (a "
                                f"{'CP-SAT' if solver == 'CP-SAT' else 'HiGHS'} error)")
        else:
            candidates.append((bound_s, f"placements of {grouping}"))
    best_s, holds_for = max(candidates, key=lambda c: c[0])  # ties: the first, the wider claim
    return BoundReport(problem.graph.name, problem.machine.name, closed_s,
                       None if lp is None else lp.bound_s, statuses["LP"], 0.0 if lp is None else lp.wall_s,
                       None if mip is None else mip.bound_s, statuses["MIP"], 0.0 if mip is None else mip.wall_s,
                       solved["CP-SAT"], statuses["CP-SAT"], 0.0 if exact is None else exact.wall_s,
                       grouping, best_s, holds_for, float(time_limit_s), time.perf_counter() - began)


def _exact_bound(problem: PlacementProblem, left_s: float, threads: int, stop: threading.Event | None):
    """CP-SAT's Solution on the free-order model when it is a relaxation of the simulator and time is left
    (until ``stop`` is set: its bound by then)."""
    from policies.exact.policy import cpsat_is_exact

    if left_s <= 0 or not cpsat_is_exact(problem):
        return None
    from policies.exact.cpsat import ExactModel, ticks_fit
    from policies.exact.quotient import quotient_graph

    quotient = quotient_graph(problem)
    if not ticks_fit(quotient, problem.machine):
        return None
    model = ExactModel(quotient, problem.machine, problem.capacity_bytes(), dispatch=False)
    return model.solve(left_s, num_workers=threads, stop=stop)


def _solution_starts(exact, mip) -> list:
    """The (U,) placements the solves found, where a refutation of their bounds may begin."""
    return [p for p in (None if exact is None else exact.unit_placement, None if mip is None else mip.unit_placement)
            if p is not None]


def _exact_status(exact, stop: threading.Event | None) -> str:
    """CP-SAT's status; "stopped" where ``stop`` ended it short of optimal (as the relaxations say)."""
    from policies.exact.relaxation import STOPPED

    if exact is None:
        return SKIPPED
    return STOPPED if stop is not None and stop.is_set() and exact.status != "optimal" else exact.status
