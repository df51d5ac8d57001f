"""``exact``: joint placement and scheduling of the coarse groups, by CP-SAT (policies/exact/cpsat.py) or
HiGHS (``solver``, below: HiGHS is the default for coarse groups).

The policy builds the model of the problem's groups (scheduled as pieces, or as Moirai's blocks where the
pieces would be many: policies/exact/quotient.py), solves it within ``time_limit_s`` (the whole schedule
hinted from ``warm_start``'s first candidate, else from the best single GPU), and measures the placement
with the measurer as every policy does. The model only approximates the measurer (pieces run as blocks,
activations are not in its memory model), so while time and budget remain, the last solve was optimal
and its bound is below the best measured step, it forbids the measured placement (a no-good cut) and
solves again, keeping the best measured; it stops when a proven bound reaches the best measured step (with
the dispatch rule the free-order model's, below), else at the budget or the time limit. On
single-op groups, where the model is a relaxation of the simulator (or, with the dispatch rule, equal to
it), this makes ``exact`` exact with respect to the simulator.

``solver="highs"`` instead takes its placements from the simulator's relaxation (policies/exact/
relaxed_search.py): the relaxation's bound holds for the measurer itself (every placement of the groups),
where CP-SAT's bound holds for its model of whole groups only. ``solver="auto"`` (the default) picks by
measurement (BENCHMARKS.md, issue 16): CP-SAT where every group is one op and there are at most
DISPATCH_MAX_GROUPS of them (its model with the dispatch rule is then the simulator itself), HiGHS
otherwise (on 32 coarse groups of nmt-2, nmt-4, rnnlm and inception-v3 its placements measured 14-44%
faster than CP-SAT's on all eight rows at a 60 s limit).

The dispatch rule's model rounds durations down to ticks, which can reorder ready times closer than a
tick, so its bound proves nothing; the bound reported with it comes from one more solve of the free-order
model (a relaxation of the simulator for single-op groups), and "proven best" is said only when that bound
reaches the best measured step (within the ticks' rounding). A step measured below a bound is no proof:
the measurer is not the noise-free simulator the bound holds for (``--noise``, a real measurer).

CP-SAT can take seconds to find a first schedule under the dispatch rule (12 ops on 8 GPUs: none in 5 s),
so the dispatch rule's model gets three quarters of the limit and, when it finds nothing, the free-order
model (solved in under a second there) the rest.

A solver that stops at its limit without a solution is no error: the policy returns the warm start (or
the best single GPU), repaired to fit in memory where it overflows, measured, and says so in ``notes`` and
``solver_status`` ("no solution"), so a search that runs several policies goes on with the others.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, replace

import numpy as np

from graphs.errors import PlacerError
from policies.base import BudgetedMeasurer, DecisionClock, PolicyResult, check_budget, search_result
from policies.exact.cpsat import ExactModel, Solution, model_size, ticks_fit
from policies.exact.quotient import SPLITS, QuotientGraph, quotient_graph
from policies.exact.refute import Refutation, measured_refutation, refuting_step
from policies.exact.relaxation import proven_s, relaxed_step_s
from policies.exact.relaxed_search import RelaxedRun, relaxed_search
from policies.problem import PlacementProblem
from policies.spill import STILL_OUT_OF_MEMORY, fit_units_in_memory
from policies.simple import best_single_device, single_device_units

SOLVERS = ("auto", "cpsat", "highs")
FREE_ORDER_RESERVE = 0.25  # of the time limit, for the free-order model when the dispatch rule's finds nothing
MAX_GROUPS = 1000  # above this the model (and CP-SAT's memory) grows past what a workstation holds
RELAXED_STEP_LIMIT_S = 10.0  # the chosen placement's relaxed step: an LP in effect (x fixed), ms at 32 groups,
MIN_RELAXED_STEP_S = 1.0  # under a second at 990 (a reviewer's runs): the time left, within these
MAX_MODEL_SIZE = 2_000_000  # cpsat.model_size: variables and intervals, a few hundred bytes each in CP-SAT
DISPATCH_MAX_GROUPS = 16  # "auto": the simulator's dispatch rule for single-op groups up to this many
MAX_PIECES_PER_GROUP = 2.0  # split "auto": rounds while they give at most this many pieces per group, else blocks
MIN_SOLVE_S = 1e-3  # the least time limit a CP-SAT solve is given (the loop checked the deadline just before)


@dataclass
class ExactPolicy:
    name: str = "exact"
    time_limit_s: float = 60.0  # solver wall time, all solves together
    solver: str = "auto"  # "cpsat", "highs", or "auto" (see the module docstring)
    warm_start: list | None = None  # op placements (N,), best first: the first is the solver's hint
    num_workers: int | None = None  # CP-SAT workers; None: os.cpu_count() capped at 8 (HiGHS: always one)
    work_limit: float | None = None  # CP-SAT deterministic time per solve: with num_workers=1, reproducible runs
    # (HiGHS stops on wall time: its runs repeat only when every solve finishes within its share)
    dispatch: str = "auto"  # "on": the simulator's FIFO dispatch; "off": free order; "auto": DISPATCH_MAX_GROUPS
    split: str = "auto"  # groups as pieces: "rounds", "none" (Moirai's blocks); "auto": MAX_PIECES_PER_GROUP
    max_rounds: int | None = None  # split "rounds": at most this many pieces per group (quotient.py)
    noise_free: bool = True  # the measurer is the noise-free simulator the bounds hold for: else a step at the
    # bound is no proof of the best (a noisy step lands above or below it), and the run never stops there

    def place(self, problem: PlacementProblem, measurer, budget, seed, on_measurement=None) -> PolicyResult:
        check_budget(budget)
        self._check_options()
        clock = DecisionClock()
        counter = BudgetedMeasurer(measurer, int(budget), problem.capacity_bytes(), clock, on_measurement)
        use_cpsat = self.solver == "cpsat" or (self.solver == "auto" and cpsat_is_exact(problem))
        quotient = self._quotient(problem) if use_cpsat else None
        if not use_cpsat or (self.solver == "auto" and not ticks_fit(quotient, problem.machine)):
            return self._place_relaxed(problem, counter, clock.started + float(self.time_limit_s))
        check_size(quotient)
        warm = self._measured_warm_start(problem, counter)
        warm_s = math.nan if warm is None else warm.runtime_s
        dispatch = self.dispatch == "on" or (self.dispatch == "auto" and quotient.single_op
                                             and quotient.num_groups <= DISPATCH_MAX_GROUPS)
        model = ExactModel(quotient, problem.machine, problem.capacity_bytes(), dispatch=dispatch)
        deadline = clock.started + float(self.time_limit_s)
        reserve_s = FREE_ORDER_RESERVE * float(self.time_limit_s) if dispatch else 0.0
        proof_deadline = deadline if dispatch else None  # the dispatch rule's bound proves nothing: see below
        run = self._solve_and_measure(problem, model, counter, deadline - reserve_s, seed, proof_deadline)
        if run.chosen is None and dispatch:  # CP-SAT can miss a first dispatch-rule schedule for seconds
            dispatch = False
            model = ExactModel(quotient, problem.machine, problem.capacity_bytes(), dispatch=False)
            run = self._solve_and_measure(problem, model, counter, deadline, seed)
        if run.chosen is None:
            return replace(self._fallback(problem, counter, run.first, quotient), warm_start_runtime_s=warm_s)
        if dispatch and run.proof is None:  # a proof needs the free-order model: rounded ticks reorder near-ties
            run.proof = self._free_order_bound(problem, quotient, run, deadline, seed)
        return replace(self._result(problem, counter, run, quotient, dispatch), warm_start_runtime_s=warm_s)

    def _solve_and_measure(self, problem, model: ExactModel, counter: BudgetedMeasurer, deadline: float,
                           seed: int, proof_deadline: float | None = None) -> "SolveRun":
        """Solve, measure, cut the placement and solve again until the bound reaches the best measured step
        (or time or budget run out). ``proof_deadline``: the model has the dispatch rule, whose bound proves
        nothing; the free-order model's bound (solved once, by then) is the one that must reach it."""
        run, hint = SolveRun(), self._hint(problem)[0]
        q = model.quotient
        run.tolerance_s = (q.num_pieces + 2 * q.num_edges + 1) * model.tick_s  # ticks rounded down
        while counter.left > 0 and time.perf_counter() < deadline:
            solution = model.solve(max(deadline - time.perf_counter(), MIN_SOLVE_S), hint, self.num_workers, seed,
                                   self.work_limit)  # never a negative limit: CP-SAT calls that MODEL_INVALID
            run.solves += 1
            run.first = solution if run.first is None else run.first
            if solution.unit_placement is None:
                run.converged = solution.status == "infeasible" and run.chosen is not None  # all others cut
                break
            fitted, _ = fit_units_in_memory(problem, solution.unit_placement)  # its memory rows: parameters
            cost = counter.measure([problem.expand(fitted)])[0]
            if run.chosen is None or cost < run.chosen_cost_s:  # as the counter keeps its best: strictly better
                run.chosen, run.chosen_cost_s, run.chosen_measured = solution, cost, fitted
            if self._bound_reached(problem, model.quotient, run, solution, counter, proof_deadline, seed):
                run.converged = solution.status == "optimal" or proof_deadline is not None
                break
            if solution.status != "optimal":
                break  # stopped at its limit: no time left for another solve
            model.forbid(solution.unit_placement)
            hint = None
        return run

    def _bound_reached(self, problem, quotient: QuotientGraph, run: "SolveRun", solution: Solution,
                       counter: BudgetedMeasurer, proof_deadline: float | None, seed: int) -> bool:
        """The best measured step reached the bound: the model's own, or with the dispatch rule
        (``proof_deadline`` given) the free-order model's, solved the first time the dispatch rule's bound
        reaches it (that bound alone can be twice the optimum: tests/policies/test_exact_relaxed.py
        ``near_tie_problem``)."""
        target_s = counter.best_cost_s - run.tolerance_s

        def below(bound_s: float) -> bool:  # under a bound that holds for the simulator: a noisy or real measurer
            return quotient.single_op and counter.best_cost_s < bound_s - run.tolerance_s

        if solution.bound_s < target_s or not self.noise_free or run.refuted is not None:
            return False
        if proof_deadline is None:
            reached = not below(solution.bound_s)
        else:
            if run.proof is None:
                run.proof = self._free_order_bound(problem, quotient, run, proof_deadline, seed)
            reached = run.proof is not None and run.proof.bound_s >= target_s and not below(run.proof.bound_s)
        if reached and quotient.single_op:  # a bound CP-SAT called proven that a placement undercuts: no stop
            run.refuted = measured_refutation(problem, counter, run.bound_s(proof_deadline is not None),
                                              [solution.unit_placement, *_measured_best(problem, counter)])
        return reached and run.refuted is None

    def _place_relaxed(self, problem: PlacementProblem, counter: BudgetedMeasurer, deadline: float) -> PolicyResult:
        """solver "highs": placements of the simulator's relaxation, measured (policies/exact/relaxed_search.py)."""
        if problem.num_units > MAX_GROUPS:
            raise PlacerError(f"exact: {problem.num_units} groups is more than the solver can hold (at most "
                              f"{MAX_GROUPS} groups): place fewer, coarser groups (--groups)")
        warm = self._measured_warm_start(problem, counter)
        measured = [] if warm is None else [warm.unit_placement]
        run = relaxed_search(problem, counter, deadline, self._hint(problem)[0], measured,
                             proof_holds=self.noise_free)
        warm_s = math.nan if warm is None else warm.runtime_s
        bound_s, bound = _relaxed_bound(problem, run)
        if counter.best_placement is None:
            hint, hint_name = self._fitted_hint(problem)
            counter.measure([problem.expand(hint)])
            infeasible = run.bound_status == "infeasible"  # proven: no point searching longer
            notes = (f"no placement of the {problem.num_units} groups fits in device memory (HiGHS proved the "
                     f"relaxation infeasible): returning {hint_name}" if infeasible else
                     f"the relaxation gave no placement of the {problem.num_units} groups in {run.solve_s:.3g} s "
                     f"of solving ({bound}): returning {hint_name}")
            return replace(search_result(self.name, problem, counter, notes=notes),
                           stop_reason="converged" if infeasible else "time_limit", warm_start_runtime_s=warm_s,
                           solver_status=f"{run.bound_status}, no solution", solver_bound_s=bound_s,
                           solver_bound_every_placement=True)
        result = search_result(self.name, problem, counter)
        measured = f"{result.best.runtime_s:.6g} s" if result.best.ok else result.best.status
        refuted = run.refuted or refuting_step(problem, bound_s, _measured_best(problem, counter))
        converged = run.converged and (refuted is None or run.refuted is not None)  # refuted early: the search
        # never stopped at the bound, so a run that converged measured every placement
        below = counter.best_cost_s < bound_s
        model_s, chosen = self._chosen(problem, run, result.group_placement, deadline)
        notes = (f"relaxation (HiGHS, {problem.num_units} groups, {run.solves} solve(s) in {run.solve_s:.3g} s): "
                 f"{bound} for every placement of these groups; {chosen}; measured {measured}"
                 + (f" ({_refuted_text(refuted, 'HiGHS')})" if refuted is not None else f" ({BELOW_BOUND})" if below
                    else f" ({NO_PROOF})" if not self.noise_free
                    else " (proven best for the measurer)" if converged else "")
                 + _overrun(time.perf_counter() - deadline))
        return replace(result, notes=notes, stop_reason=_stop_reason(converged, counter),
                       warm_start_runtime_s=warm_s, solver_makespan_s=model_s,
                       solver_bound_s=math.nan if refuted is not None else bound_s,
                       solver_status=run.bound_status, solver_bound_every_placement=refuted is None)

    @staticmethod
    def _chosen(problem: PlacementProblem, run: RelaxedRun, group_placement, deadline: float) -> tuple[float, str]:
        """(the solver's makespan of the chosen placement, what the notes say of it). A solve's point measured
        as it was gets the relaxation's least step for it (``relaxed_step_s``): the w HiGHS held there was no
        step of that placement (nothing minimised it; it could exceed the measured step)."""
        weight = run.weight(group_placement)
        if math.isfinite(run.model_s(group_placement)):
            limit_s = min(RELAXED_STEP_LIMIT_S, max(MIN_RELAXED_STEP_S, deadline - time.perf_counter()))
            model_s = relaxed_step_s(problem, group_placement, limit_s)
            step = (f"takes at least {model_s:.6g} s in the relaxation" if math.isfinite(model_s) else
                    f"has no relaxed step proven in {limit_s:.3g} s")
            return model_s, f"the chosen placement, a solve's (communication weight {weight:g}), {step}"
        if math.isfinite(weight):
            return math.nan, (f"the chosen placement is a solve's (communication weight {weight:g}), repaired to "
                              "fit in memory")
        return math.nan, "the chosen placement is the warm start"

    def _measured_warm_start(self, problem: PlacementProblem, counter: BudgetedMeasurer):
        """The first warm-start candidate collapsed onto the groups, measured inside the budget (so the best is
        never worse than it): its WarmStart, or None without one or when it did not run ok."""
        if not self.warm_start:
            return None
        from policies.rl.warm_start import measure_warm_start

        return measure_warm_start(problem, counter, list(self.warm_start)[:1])

    def _free_order_bound(self, problem, quotient: QuotientGraph, run: "SolveRun", deadline: float,
                          seed: int) -> Solution | None:
        """The free-order model's solve (a relaxation of the simulator for single-op groups), hinted with
        the chosen placement, in the time left; None when none is left."""
        left_s = deadline - time.perf_counter()
        if left_s <= 0:
            return None
        model = ExactModel(quotient, problem.machine, problem.capacity_bytes(), dispatch=False)
        run.solves += 1
        return model.solve(left_s, run.chosen.unit_placement, self.num_workers, seed, self.work_limit)

    def _quotient(self, problem: PlacementProblem) -> QuotientGraph:
        if self.split != "auto":
            return quotient_graph(problem, self.split, self.max_rounds)
        rounds = quotient_graph(problem, "rounds")
        if rounds.num_pieces <= MAX_PIECES_PER_GROUP * rounds.num_groups:
            return rounds
        return quotient_graph(problem, "none")

    def _check_options(self) -> None:
        limit = self.time_limit_s
        if isinstance(limit, bool) or not (isinstance(limit, numbers.Real) and limit > 0 and math.isfinite(limit)):
            raise PlacerError(f"exact: time_limit_s must be a positive number of seconds, got {self.time_limit_s!r}")
        if self.solver not in SOLVERS:
            raise PlacerError(f"exact: unknown solver {self.solver!r} (known: {', '.join(SOLVERS)})")
        if self.dispatch not in ("auto", "on", "off"):
            raise PlacerError(f"exact: dispatch must be auto, on or off, got {self.dispatch!r}")
        if self.split not in ("auto", *SPLITS):
            raise PlacerError(f"exact: split must be auto, {' or '.join(SPLITS)}, got {self.split!r}")
        if self.max_rounds is not None and not _is_count(self.max_rounds):
            raise PlacerError(f"exact: max_rounds must be at least 1, got {self.max_rounds!r}")
        work = self.work_limit
        if work is not None and (isinstance(work, bool) or not (isinstance(work, numbers.Real) and work > 0
                                                                and math.isfinite(work))):
            raise PlacerError(f"exact: work_limit must be a positive finite number, got {self.work_limit!r}")
        if self.num_workers is not None and not _is_count(self.num_workers):
            raise PlacerError(f"exact: num_workers must be at least 1, got {self.num_workers!r}")

    def _hint(self, problem: PlacementProblem) -> tuple[np.ndarray, str]:
        """(U,) the solver's starting placement: the first warm-start candidate, else the best single GPU."""
        if self.warm_start:
            from policies.rl.warm_start import check_warm_start, distinct_unit_placements

            return distinct_unit_placements(problem, check_warm_start(problem, self.warm_start))[0][0], "the warm start"
        kind = "gpu" if problem.gpu_indices() else None
        return single_device_units(problem, best_single_device(problem, kind)), "the best single GPU"

    def _fitted_hint(self, problem: PlacementProblem) -> tuple[np.ndarray, str]:
        """The hint as a solver that found nothing returns it: repaired to fit in memory where it overflows (the
        best single GPU of a graph larger than one GPU ran out of memory, and the run had no result of its own)."""
        hint, hint_name = self._hint(problem)
        fitted, notes = fit_units_in_memory(problem, hint)
        if STILL_OUT_OF_MEMORY in notes:
            return fitted, f"{hint_name}, which the memory repair could not make fit"
        return fitted, (f"{hint_name}, repaired to fit in memory" if notes else hint_name)

    def _fallback(self, problem, counter: BudgetedMeasurer, first: Solution | None,
                  quotient: QuotientGraph) -> PolicyResult:
        hint, hint_name = self._fitted_hint(problem)
        if counter.best_placement is None:  # a warm start that ran ok was measured already: it is the hint
            counter.measure([problem.expand(hint)])
        status = first.status if first is not None else "unknown"
        bound_s = first.bound_s if first is not None and status != "unknown" else math.nan  # unknown: CP-SAT's is 0
        if first is None and counter.left <= 0:  # the warm start took the budget: no solve ran
            notes = (f"the budget was spent measuring the warm start before any solve of the {quotient.num_groups} "
                     "groups: returning it as measured")
            stop_reason = "budget"
        elif status == "infeasible":  # proved at once, not cut short: no placement's parameters fit
            notes = (f"no placement of the {quotient.num_groups} groups fits in device memory (CP-SAT proved its "
                     f"model infeasible): returning {hint_name}")
            stop_reason = "converged"
        else:
            notes = (f"the solver found no placement of the {quotient.num_groups} groups within "
                     f"{self.time_limit_s:g} s ({status}): returning {hint_name}")
            stop_reason = "time_limit"
        result = search_result(self.name, problem, counter, notes=notes)
        return replace(result, stop_reason=stop_reason, solver_status=f"{status}, no solution",
                       solver_bound_s=bound_s)

    def _result(self, problem, counter: BudgetedMeasurer, run: "SolveRun", quotient: QuotientGraph,
                dispatch: bool) -> PolicyResult:
        result = search_result(self.name, problem, counter)
        measured = f"{result.best.runtime_s:.6g} s" if result.best.ok else result.best.status
        model = (f"{quotient.num_groups} groups as {quotient.num_pieces} pieces, "
                 f"{'dispatch rule' if dispatch else 'free order'}")
        bound_s = run.bound_s(dispatch)
        if quotient.single_op and run.refuted is None:  # its bound is the run's proven one (the job takes it)
            run.refuted = refuting_step(problem, bound_s, [run.chosen.unit_placement, *_measured_best(problem, counter)])
        proof = ""
        if run.refuted is not None:
            proof = f" ({_refuted_text(run.refuted, 'CP-SAT')})"
        elif counter.best_cost_s < bound_s - run.tolerance_s:  # a relaxation only for single ops: blocks run whole
            proof = f" ({BELOW_BOUND if quotient.single_op else BELOW_BLOCKS_BOUND})"
        elif not self.noise_free:
            proof = f" ({NO_PROOF})"
        elif quotient.single_op and bound_s >= counter.best_cost_s - run.tolerance_s:
            # within the ticks' rounding: a slow link's worst case makes the horizon, and so the tick, long
            proof = f" (proven best for the measurer to within {run.tolerance_s:.2g} s, the model's rounding to ticks)"
        elif run.converged:
            proof = " (model solved, bound reached)"
        solver_best = np.array_equal(result.group_placement, run.chosen.unit_placement)
        fitted = not solver_best and np.array_equal(result.group_placement, run.chosen_measured)
        repaired = "repaired to fit in memory" if result.best.ok else "moved by the memory repair, still over memory"
        chosen = ("" if solver_best else f" (the solver's, {repaired})" if fitted else
                  f" (the warm start's; the solver's placement measured {run.chosen_cost_s:.6g} s)")
        notes = (f"solver ({model}, {run.solves} solve(s)): makespan {run.chosen.makespan_s:.6g} s, bound "
                 f"{bound_s:.6g} s{' (free order)' if dispatch else ''}, {run.first.status}; "
                 f"measured {measured}{chosen}{proof}")
        return replace(result, notes=notes, stop_reason=_stop_reason(run.converged, counter),
                       solver_makespan_s=float(run.chosen.makespan_s) if solver_best else math.nan,
                       solver_bound_s=math.nan if run.refuted is not None else float(bound_s),
                       solver_status=run.first.status,
                       solver_bound_every_placement=quotient.single_op and run.refuted is None)


def _refuted_text(refuted: Refutation, solver: str) -> str:
    return (f"the solver's bound is refuted: a placement of these groups simulates {refuted.step_s:.6g} s, below "
            f"it; a {solver} error")


def _measured_best(problem: PlacementProblem, counter: BudgetedMeasurer) -> list[np.ndarray]:
    """[(U,) the best placement measured], or [] before one."""
    return [] if counter.best_placement is None else [problem.collapse(counter.best_placement)]


def _relaxed_bound(problem: PlacementProblem, run: RelaxedRun) -> tuple[float, str]:
    """HiGHS's bound, or the closed form where that is higher (HiGHS stopped at its limit before its dual bound
    passed it); nan without a HiGHS bound. With its words for the notes."""
    highs_s = proven_s(run.bound_s) if math.isfinite(run.bound_s) else math.nan  # less its tolerances
    if not math.isfinite(highs_s):
        return highs_s, f"no bound ({run.bound_status})"
    if highs_s < problem.lower_bound_s:
        return float(problem.lower_bound_s), (f"bound {problem.lower_bound_s:.6g} s (the closed form's: HiGHS "
                                              f"proved {highs_s:.6g} s, {run.bound_status})")
    return highs_s, f"bound {highs_s:.6g} s ({run.bound_status})"


BELOW_BOUND = "measured below the bound: the measurer is not the noise-free simulator it holds for"
NO_PROOF = "no proof of the best: the measurer is not the noise-free simulator the bound holds for"
BELOW_BLOCKS_BOUND = "measured below the model's bound, which holds for its groups run as whole blocks only"


OVERRUN_NOTE_S = 1.0  # a run this far past its time limit says why


def _overrun(past_s: float) -> str:
    """Words for a run that ended ``past_s`` seconds after its time limit ("" within OVERRUN_NOTE_S)."""
    if past_s <= OVERRUN_NOTE_S:
        return ""
    return (f"; ran {past_s:.3g} s past the time limit: HiGHS cannot interrupt a MIP's set-up and presolve, "
            f"which grow with the model (fewer groups keep to the limit)")


def _is_count(value) -> bool:
    """An integer of at least 1 (not a bool, a float or a string)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _stop_reason(converged: bool, counter: BudgetedMeasurer) -> str:
    """Why the solve-measure loop ended: the bound reached the best measured, the budget, else the time."""
    if converged:
        return "converged"
    return "budget" if counter.left <= 0 else "time_limit"


@dataclass
class SolveRun:
    """What the solve-measure-cut loop found."""
    first: Solution | None = None  # the first solve: its bound holds for every placement
    chosen: Solution | None = None  # the solve whose placement measured best
    chosen_cost_s: float = math.inf
    chosen_measured: np.ndarray | None = None  # (U,) what was measured of it: repaired where it overflowed
    solves: int = 0
    converged: bool = False  # the model's bound reached the best measured step
    tolerance_s: float = 0.0  # how far below the truth the model's rounded ticks can put its bound
    proof: Solution | None = None  # with the dispatch rule: the free-order model's solve, whose bound is valid
    refuted: Refutation | None = None  # a placement simulated below the bound CP-SAT proved: a solver error

    def bound_s(self, dispatch: bool) -> float:
        """The bound to report: the first solve's, or with the dispatch rule (whose rounded ticks can reorder
        near-ties, so its bound proves nothing) the free-order model's; nan without one."""
        if not dispatch:
            return float(self.first.bound_s)
        return float(self.proof.bound_s) if self.proof is not None else math.nan


def cpsat_is_exact(problem: PlacementProblem) -> bool:
    """Every group is one op and there are few: CP-SAT's model with the dispatch rule is the simulator."""
    return problem.num_units == problem.graph.num_ops and problem.num_units <= DISPATCH_MAX_GROUPS


def check_size(quotient: QuotientGraph) -> None:
    """PlacerError when the model would not fit the solver's memory (MAX_GROUPS, MAX_MODEL_SIZE)."""
    size = model_size(quotient)
    if quotient.num_groups > MAX_GROUPS or size > MAX_MODEL_SIZE:
        raise PlacerError(f"exact: {quotient.num_groups} groups on {quotient.num_devices} devices "
                          f"({quotient.num_edges} group edges, model size ~{size:,}) is more than the solver can "
                          f"hold (at most {MAX_GROUPS} groups and a model size of {MAX_MODEL_SIZE:,}): "
                          f"place fewer, coarser groups (--groups)")
