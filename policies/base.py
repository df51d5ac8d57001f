"""The policy protocol: a problem goes in, a placement (and how it was found) comes out.

A ``PlacementProblem`` (policies/problem.py) bundles what every policy may read: the graph, the machine, the units it places
(the groups of a ``Grouping``, or the graph's colocation groups when there is no grouping), the cost
model's op-time matrix and the lower bound (transfer times: the machine's links, measurers/sim/links.py). A policy answers
``place(problem, measurer, budget, seed, on_measurement=None) -> PolicyResult``; it may spend at most
``budget`` measurements (heuristics spend one: the score of their answer). A tiny new policy::

    @dataclass
    class AllOnLastDevicePolicy:
        name: str = "last-device"

        def place(self, problem, measurer, budget, seed, on_measurement=None):
            clock = DecisionClock()
            units = np.full(problem.num_units, problem.machine.num_devices - 1, dtype=np.int64)
            units = problem.repair_allowed(units)            # allowed device kinds, always
            return finish(self.name, problem, units, clock, measurer, on_measurement)

and ``register_policy(PolicyEntry("last-device", "my_module:AllOnLastDevicePolicy", "heuristic", "..."))``
(policies/registry.py) makes ``make_policy`` and ``place`` find it.

``placement_time_s`` in a result is wall time spent deciding, with the time spent inside
``measurer.measure`` excluded; that time is reported separately as ``measure_time_s``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from graphs.errors import PlacerError, is_whole_number
from measurers.base import Measurement, Measurer
from policies.problem import PlacementProblem

FAILED_COST_S = 1e6  # cost of a failed (oom/error) placement; ranks below every runtime a step can have
FAILURE_FACTOR = 3.0  # the learners score a failure as at least this many times the slowest ok step measured
OnMeasurement = Callable[[np.ndarray, Measurement], None]


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    op_placement: np.ndarray  # (N,) int64
    group_placement: np.ndarray | None  # (U,) int64 when the policy placed units
    placement_time_s: float  # wall time spent deciding, measurement time excluded
    measure_time_s: float  # wall time spent inside measurer.measure
    measurements: int  # placements measured (at most the budget)
    best: Measurement  # the measurement of op_placement
    notes: str = ""  # what the policy wants a reader to know (memory model used, fallbacks)
    stop_reason: str = "budget"  # "budget" | "time_limit" | "should_stop" | "converged" (nothing new sampled)
    seconds_per_update: float = math.nan  # learned policies: learner time per iteration, measuring excluded
    warm_start_runtime_s: float = math.nan  # warm-started learners: the start as measured on their own units
    solver_makespan_s: float = math.nan  # exact: the solver's own makespan of the placement (its model, not measured)
    solver_bound_s: float = math.nan  # exact: the solver's proven lower bound on its model's makespan
    solver_status: str = ""  # exact: optimal | feasible | infeasible | unknown, "" for other policies
    solver_bound_every_placement: bool = False  # exact: solver_bound_s holds for every placement of the groups
    # (in the noise-free simulator, that fit in memory), not for its model alone: HiGHS's relaxation, CP-SAT's
    # free order on single-op groups


@dataclass
class RunContext:
    """What a long-running policy may use beyond the protocol's arguments: a learner all of it, the searches
    random, cem and annealing the time limit and stop flag; heuristics take none. ``placer search`` fills
    it from its run folder and flags."""
    checkpoint_dir: Path | None = None  # save the learner here; continue from it when it holds a checkpoint
    time_limit_s: float | None = None  # stop between batches after this many seconds
    should_stop: Callable[[], bool] | None = None  # polled between batches
    on_iteration: Callable[[int, dict[str, float]], None] | None = None  # learner metrics per iteration
    before_checkpoint: Callable[[], None] | None = None  # called before every save (flush what it counts)


def early_stop(started: float, time_limit_s: float | None, should_stop: Callable[[], bool] | None) -> str | None:
    """What every learner and search checks between batches: "time_limit" once ``time_limit_s`` seconds have passed
    since ``started`` (``time.perf_counter()``), "should_stop" when ``should_stop()`` says so, else None."""
    if time_limit_s is not None and time.perf_counter() - started >= time_limit_s:
        return "time_limit"
    if should_stop is not None and should_stop():
        return "should_stop"
    return None


def stopped_before_start(context: RunContext) -> bool:
    """Whether a policy must not measure even its first batch (a zero shot, a warm start): the time the job left
    it is spent already (``time_limit_s`` 0), or the stop flag is up. gdp, placeto and giph measured their zero
    shot first and checked only then."""
    return early_stop(time.perf_counter(), context.time_limit_s, context.should_stop) is not None


class Policy(Protocol):
    name: str

    def place(self, problem: PlacementProblem, measurer: Measurer, budget: int, seed: int,
              on_measurement: OnMeasurement | None = None) -> PolicyResult: ...


def measurement_cost_s(measurement: Measurement, capacity_bytes: np.ndarray) -> float:
    """What searches minimise: the runtime when ok; out of memory, FAILED_COST_S plus the memory overflow
    ratio, so that among those the one closest to fitting ranks first; any other failure (an error, a
    timeout, a crash: nothing says how close it came) twice FAILED_COST_S, wherever it was reported (a
    measurer's own error, with zero peaks, cost FAILED_COST_S and ranked ahead of every overflow, where the
    pool's cost twice that)."""
    if measurement.ok:
        return float(measurement.runtime_s)
    peaks = np.asarray(measurement.peak_bytes, dtype=np.float64)
    if measurement.status != "oom" or len(peaks) != len(capacity_bytes):
        return FAILED_COST_S * 2
    overflow = np.maximum(peaks - capacity_bytes, 0.0).sum() / np.sum(capacity_bytes, dtype=np.float64)
    return FAILED_COST_S * (1.0 + float(overflow))


@dataclass
class DecisionClock:
    """Wall time of a policy run, split into deciding and measuring."""
    started: float = field(default_factory=time.perf_counter)
    measure_s: float = 0.0

    @property
    def decide_s(self) -> float:
        return time.perf_counter() - self.started - self.measure_s


class CountingMeasurer:
    """A Measurer passing measure calls through and counting the placements measured (no budget: a
    ``BudgetedMeasurer`` enforces one, and reports costs rather than Measurements)."""

    def __init__(self, measurer: Measurer):
        self.measurer, self.used = measurer, 0

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        results = list(self.measurer.measure(placements))
        self.used += len(results)
        return results


class LastResults:
    """A Measurer passing measure calls through and keeping the last Measurements: a BudgetedMeasurer
    reports only costs, and a learner needs the measurements themselves (statuses, peaks)."""

    def __init__(self, measurer: Measurer):
        self.measurer, self.last = measurer, []

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        self.last = list(self.measurer.measure(placements))
        return self.last


class CounterView:
    """A Measurer measuring through a BudgetedMeasurer (timing, budget, on_measurement, best kept there) whose
    measurer is ``capture``, returning the Measurements themselves, as a learner needs them."""

    def __init__(self, counter: "BudgetedMeasurer", capture: LastResults):
        self.counter, self.capture = counter, capture

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        self.capture.last = []
        self.counter.measure(placements)
        return list(self.capture.last)


@dataclass
class BudgetedMeasurer:
    """Wraps a measurer: never exceeds ``budget``, times the calls, reports each measurement, keeps the
    best (by ``measurement_cost_s``). Searches measure whole batches through it."""
    measurer: Measurer
    budget: int
    capacity_bytes: np.ndarray  # (D,)
    clock: DecisionClock
    on_measurement: OnMeasurement | None = None
    used: int = 0
    best_cost_s: float = float("inf")
    best_placement: np.ndarray | None = None
    best_measurement: Measurement | None = None

    @property
    def left(self) -> int:
        return self.budget - self.used

    def measure(self, op_placements: Sequence[np.ndarray]) -> list[float]:
        """Measure up to ``left`` placements (the rest are dropped) and return their costs."""
        batch = [np.asarray(p, dtype=np.int64) for p in op_placements][: self.left]
        if not batch:
            return []
        start = time.perf_counter()
        results = self.measurer.measure(batch)
        self.clock.measure_s += time.perf_counter() - start
        if len(results) != len(batch):
            raise PlacerError(f"measurer returned {len(results)} results for {len(batch)} placements")
        self.used += len(batch)
        costs = []
        for placement, measurement in zip(batch, results):
            if self.on_measurement is not None:
                self.on_measurement(placement, measurement)
            cost = measurement_cost_s(measurement, self.capacity_bytes)
            costs.append(cost)
            if cost < self.best_cost_s:
                self.best_cost_s, self.best_placement, self.best_measurement = cost, placement, measurement
        return costs


def check_budget(budget: int) -> None:
    if not is_whole_number(budget) or budget < 1:
        raise PlacerError(f"a policy needs a budget of a whole number of at least 1 measurement, got {budget!r}")


def check_option_names(policy: str, options, config_class) -> None:
    """Every option is a field of ``config_class`` (a dataclass): else one PlacerError naming the unknown ones."""
    unknown = sorted(set(options) - {f.name for f in fields(config_class)})
    if unknown:
        raise PlacerError(f"policy {policy!r} takes no option {', '.join(map(repr, unknown))} (its options are "
                          f"{config_class.__name__}'s fields)")


def joined_notes(*parts: str) -> str:
    """Notes of several steps in one line, the empty ones left out: ``joined_notes("a", "", "b") == "a; b"``."""
    return "; ".join(part for part in parts if part)


def finish(name: str, problem: PlacementProblem, unit_placement: np.ndarray | None, clock: DecisionClock,
           measurer: Measurer, on_measurement: OnMeasurement | None = None,
           op_placement: np.ndarray | None = None, notes: str = "") -> PolicyResult:
    """Score a heuristic's answer with one measurement and wrap it up."""
    if op_placement is None:
        op_placement = problem.expand(unit_placement)
    decide_s = clock.decide_s
    counter = BudgetedMeasurer(measurer, 1, problem.capacity_bytes(), clock, on_measurement)
    counter.measure([op_placement])
    return PolicyResult(name, np.asarray(op_placement, dtype=np.int64), unit_placement, decide_s,
                        clock.measure_s, counter.used, counter.best_measurement, notes)


def search_result(name: str, problem: PlacementProblem, counter: BudgetedMeasurer, notes: str = "",
                  stop_reason: str = "budget") -> PolicyResult:
    best = counter.best_placement
    groups = None if best is None else problem.collapse(best)
    return PolicyResult(name, best, groups, counter.clock.decide_s, counter.clock.measure_s,
                        counter.used, counter.best_measurement, notes, stop_reason=stop_reason)


def with_run_best(found: PolicyResult, problem: PlacementProblem, run_best_op_placement: np.ndarray | None,
                  run_best_runtime_s: float, **fields) -> PolicyResult:
    """A learner's result over its whole run: a resumed run's best may predate the resume (its checkpoint
    keeps the placement and runtime, not the whole Measurement), and ``fields`` (the run's measurement
    count, stop reason, ...) replace this session's."""
    best, placement = found.best, found.op_placement
    if run_best_op_placement is not None and (best is None or not best.ok or run_best_runtime_s < best.runtime_s):
        placement = run_best_op_placement
        best = Measurement(run_best_runtime_s, (run_best_runtime_s,), "ok", (0,) * problem.num_devices, 0.0)
    return replace(found, op_placement=placement, best=best,
                   group_placement=None if placement is None else problem.collapse(placement), **fields)
