"""Devices that leave a running search (``placer search --remove-device NAME@MEASUREMENTS|NAME@node-lost``).

The policy is built once and placed phase by phase; between phases devices leave::

    phase 1: policy.place(problem, ..., budget = first removal's count)        every device
    device NAME leaves: reduced problem (make_problem on machine.without_devices, same grouping)
    phase 2: policy.place(reduced problem, ..., the budget left)               the devices left
    ...

A phase ends when the policy has spent its measurements, or stopped on its own earlier (a heuristic
after its one measurement, a search whose next batch would overrun, a converged search or learner: the device then
leaves at that count), or, for ``NAME@node-lost``, once the measurer pool reports its first lost GPU node
(``cluster.pool.MeasurerPool.lost_nodes``): every ``@node-lost`` device leaves at the count then reached
(a learner stops between batches through its RunContext's stop flag, a search or heuristic is cut short
after the batch that saw it). A time limit or a stop request ends the search.

Before a phase after a removal, a policy that takes a warm start gets one: the best placement measured so
far, each of its units (groups) with an op on a removed device moved whole to the allowed device left
that the cost model says runs the unit fastest (``PlacementProblem.unit_time_s``), re-indexed to the
reduced machine (``moved_placement``). Policies whose network has one output per device of the machine
(FIXED_DEVICE_POLICIES), and ``device:K`` (a fixed device index), cannot go on and are refused up front.
A learner's time limit spans all phases; ``exact``'s solver limit applies to each phase's solve. A run
with removals keeps no learner checkpoint (it cannot be resumed).

Measuring: one pool and one run log on the ORIGINAL machine. ``ReducedMachineMeasurer`` maps a reduced
placement's device i to ``kept[i]`` (``Machine.kept_device_indices``), so log rows keep the original
indices and never name a removed device after its removal; a device never used adds nothing to the
simulated step (links touching it carry nothing), so the time is the reduced machine's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from cluster.jobs.config import SearchConfig
from graphs.errors import PlacerError
from measurers.base import Measurement

NODE_LOST = "node-lost"
FIXED_DEVICE_POLICIES = ("reinforce", "ppo", "hierarchical", "post")
"""Policies whose network has one output per device of the machine: they cannot go on without a device."""


@dataclass(frozen=True)
class DeviceRemoval:
    """One ``--remove-device`` flag, parsed."""
    device: str
    at_measurement: int | None  # the policy's measurement count; None: at the first node loss
    text: str  # as given

    @property
    def trigger(self) -> str:
        return NODE_LOST if self.at_measurement is None else "measurements"


def parse_removal(text: str) -> DeviceRemoval:
    """``NAME@MEASUREMENTS`` (an integer >= 1) or ``NAME@node-lost``; PlacerError for anything else."""
    name, sep, when = str(text).rpartition("@")
    shape = f"--remove-device {text!r}: expected NAME@MEASUREMENTS (e.g. gpu:1@200) or NAME@{NODE_LOST}"
    if not sep or not name.strip() or not when.strip():
        raise PlacerError(shape)
    if when == NODE_LOST:
        return DeviceRemoval(name, None, text)
    if not (when.isascii() and when.removeprefix("-").isdigit()):  # int() took "+5", " 5" and other scripts' digits
        raise PlacerError(f"{shape}; {when!r} is not a measurement count")
    count = int(when)
    if count < 1:
        raise PlacerError(f"--remove-device {text!r}: MEASUREMENTS must be at least 1, got {count} (to search "
                          f"without a device from the start, use a machine file without it)")
    return DeviceRemoval(name, count, text)


def check_removals(config: SearchConfig, machine) -> tuple[DeviceRemoval, ...]:
    """``config.remove_devices`` parsed and checked against the policy, the budget and the machine (before
    anything starts): PlacerError for a malformed spec, a resumed run, a policy that cannot go on, an
    unknown device, a device named twice, a count not below the budget, or no device left."""
    from policies.registry import POLICIES

    if not config.remove_devices:
        return ()
    if config.resume:
        raise PlacerError("--remove-device is not supported for resumed runs (start a new run)")
    removals = tuple(parse_removal(text) for text in config.remove_devices)
    if config.policy in FIXED_DEVICE_POLICIES or config.policy.startswith("device:"):
        able = [name for name in POLICIES if name not in FIXED_DEVICE_POLICIES]
        why = ("places everything on one device index" if config.policy.startswith("device:") else
               "has one network output per device of the machine")
        raise PlacerError(f"--remove-device: policy {config.policy!r} {why} and cannot go on without a device; "
                          f"policies that can: {', '.join(able)}")
    seen: set[str] = set()
    for removal in removals:
        if removal.device in seen:
            raise PlacerError(f"--remove-device: device {removal.device!r} is named twice")
        seen.add(removal.device)
        try:
            machine.device_index(removal.device)
        except PlacerError as exc:
            raise PlacerError(f"--remove-device {removal.text!r}: {exc}") from None
        if removal.at_measurement is not None and removal.at_measurement >= config.budget:
            raise PlacerError(f"--remove-device {removal.text!r}: {removal.at_measurement} measurements is not below "
                              f"the budget of {config.budget}: the device would never leave")
    try:
        machine.without_devices([r.device for r in removals])
    except PlacerError as exc:
        raise PlacerError(f"--remove-device: {exc}") from None
    return removals


def check_removals_for_problem(problem, removals: Sequence[DeviceRemoval]) -> None:
    """Every unit has an allowed device on the machine (the graph's ops need their kinds; checked here with none
    removed too, before the progress bar: it was first found inside the policy) and keeps one once all
    ``removals`` have left."""
    allowed = problem.unit_allowed  # (U, D) bool: a unit with no allowed device at all raises here
    if not removals:
        return
    kept = problem.machine.kept_device_indices([r.device for r in removals])
    stranded = np.flatnonzero(~allowed[:, kept].any(axis=1))
    if len(stranded):
        names = ", ".join(r.device for r in removals)
        left = ", ".join(problem.machine.devices[i].name for i in kept)
        raise PlacerError(f"--remove-device: without {names}, group {int(stranded[0])} of graph "
                          f"{problem.graph.name!r} has no device its ops may run on (left: {left})")


def reduced_problem(problem, names: Sequence[str]):
    """The problem on ``machine.without_devices(names)``, with the same units (grouping)."""
    from policies.problem import make_problem

    smaller = make_problem(problem.graph, problem.machine.without_devices(names))
    return replace(smaller, op_unit=problem.op_unit, grouping=problem.grouping)


def moved_placement(problem, op_placement: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """(N,) op placement on ``problem``'s machine -> (N,) on the machine of devices ``kept`` (indices into
    it). The units with an op on a device not kept move together, as they were together before, to the one
    kept device allowed for all of them that the cost model runs them fastest on. (Each to its own fastest
    device splits what ran on one device, often across the CPU; weighing in the work already on a device
    sent them to a slow one whose links cost more: bench_giph's removal table, BENCHMARKS.md issue 15.)
    When no kept device is allowed for all of them, each goes to its own fastest allowed device. The rest
    stay. Re-indexed: kept[i] becomes i."""
    placement = np.asarray(op_placement, dtype=np.int64).copy()  # (N,)
    gone = ~np.isin(placement, kept)  # (N,)
    units = np.unique(problem.op_unit[gone])
    if len(units):
        times_s = problem.unit_time_s[np.ix_(units, kept)]  # (U', K): inf where a unit may not run
        together_s = times_s.sum(axis=0)  # (K,)
        target = np.full(problem.num_units, -1, dtype=np.int64)
        if np.isfinite(together_s).any():
            target[units] = kept[np.argmin(together_s)]
        else:
            target[units] = kept[np.argmin(times_s, axis=1)]
        moving = target[problem.op_unit] >= 0
        placement[moving] = target[problem.op_unit][moving]
    index = np.full(problem.num_devices, -1, dtype=np.int64)
    index[kept] = np.arange(len(kept))
    return index[placement]


class NodeLeft(Exception):
    """Raised out of a search's ``place`` when the pool saw a node leave (the job catches it)."""


class ReducedMachineMeasurer:
    """A Measurer for placements on a reduced machine, measured by ``measurer`` on the original: device i
    is ``kept[i]`` there. Peaks come back per kept device. ``on_batch(op placements on the original,
    measurements)`` sees every batch; ``interrupt()`` true after a batch raises NodeLeft."""

    def __init__(self, measurer, kept: np.ndarray, num_devices: int,
                 on_batch: Callable[[list, list], None] | None = None,
                 interrupt: Callable[[], bool] | None = None):
        self.measurer, self.kept, self.num_devices = measurer, np.asarray(kept, dtype=np.int64), num_devices
        self.on_batch, self.interrupt = on_batch, interrupt
        self.measured = 0

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        batch = [self.kept[np.asarray(p, dtype=np.int64)] for p in placements]  # B x (N,) original indices
        results = list(self.measurer.measure(batch))
        self.measured += len(batch)
        if self.on_batch is not None:
            self.on_batch(batch, results)
        if self.interrupt is not None and self.interrupt():
            raise NodeLeft()
        return [self._reduced(m) for m in results]

    def _reduced(self, measurement: Measurement) -> Measurement:
        if len(measurement.peak_bytes) != self.num_devices:
            return measurement
        return replace(measurement, peak_bytes=tuple(measurement.peak_bytes[i] for i in self.kept))


@dataclass
class BestByDevices:
    """The fastest ok placement for each set of devices used: the best so far, and the best on any device
    set (a placement measured before a removal that never used the removed device still counts)."""
    best: dict[frozenset, tuple[float, int, np.ndarray]] = field(default_factory=dict)  # (step, order, placement)
    recorded: int = 0  # placements recorded so far: a tie goes to the one measured first, as the run log's

    def record(self, placements: Sequence[np.ndarray], measurements: Sequence[Measurement]) -> None:
        for placement, m in zip(placements, measurements):
            self.recorded += 1
            if not (m.ok and math.isfinite(m.runtime_s)):
                continue
            used = frozenset(np.unique(placement).tolist())
            if used not in self.best or m.runtime_s < self.best[used][0]:
                self.best[used] = (float(m.runtime_s), self.recorded, np.asarray(placement, dtype=np.int64))

    def fastest(self, devices: Sequence[int] | None = None) -> tuple[float, np.ndarray | None]:
        """(runtime_s, (N,) op placement) of the fastest using only ``devices`` (None: any), of those that tie
        the one measured first (best_placement.json's; the set of devices first used won: another search
        result than the file `placer apply` reads); (inf, None)."""
        allowed = None if devices is None else set(int(d) for d in devices)
        found = [v for used, v in self.best.items() if allowed is None or used <= allowed]
        if not found:
            return math.inf, None
        runtime_s, _, placement = min(found, key=lambda v: v[:2])
        return runtime_s, placement


@dataclass
class PhasedOutcome:
    """What ``place_with_removals`` found, over every phase."""
    first: object | None  # the first phase's PolicyResult (None: cut short by a node loss)
    last: object | None  # the last phase's that finished
    measurements: int
    stop_reason: str
    best_runtime_s: float  # the policy's fastest ok placement on the final device set
    best_op_placement: np.ndarray | None  # (N,) original device indices
    removals: list[dict]  # one record per --remove-device, "removed" false when it never came
    kept: np.ndarray  # (D',) the final devices, indices into the original machine


def place_with_removals(name: str, problem, measurer, budget: int, seed: int, options: dict,
                        removals: Sequence[DeviceRemoval], node_lost: Callable[[], bool],
                        on_removal: Callable[[list[dict], list[int]], None]) -> PhasedOutcome:
    """Run policy ``name`` (built once, ``options`` to its constructor) for ``budget`` measurements on
    ``problem``, devices leaving as ``removals`` say (the module docstring); ``measurer`` measures on the
    original machine; ``on_removal(records, device indices)`` is told of each removal as it happens."""
    from policies.registry import make_policy, policy_entry

    entry, policy = policy_entry(name), make_policy(name, **options)
    context = options.get("context")
    user_stop = context.should_stop if context is not None else None
    time_limit_s, started = (context.time_limit_s if context is not None else None), time.perf_counter()
    state = _Phases(problem, removals, options.get("warm_start"))
    first = last = None
    stop = "budget"
    while state.used < budget:
        limit = min(state.next_count(), budget)
        lost = state.watching_nodes(node_lost)
        wrapper = ReducedMachineMeasurer(measurer, state.kept, problem.num_devices, state.best.record,
                                         interrupt=None if entry.learned else lost)
        if context is not None:  # a learner stops between batches: on a node loss, a stop request, the time
            context.should_stop = lambda: lost() or (user_stop is not None and user_stop())
            if time_limit_s is not None:
                context.time_limit_s = time_limit_s - (time.perf_counter() - started)
                if context.time_limit_s <= 0:
                    stop = "time_limit"
                    break
        target = state.problem if entry.places_groups else state.problem.at_op_level()
        try:
            result = policy.place(target, wrapper, limit - state.used, seed)
            first, last, stop = (result if first is None else first), result, result.stop_reason
        except NodeLeft:
            stop = NODE_LOST
        state.used += wrapper.measured
        # a time limit ends the search, but exact's own solver limit with session time left is a policy stopping
        # on its own: the device leaves at that count and the next phase solves again
        session_over = time_limit_s is not None and time.perf_counter() - started >= time_limit_s
        if stop == "time_limit" and (session_over or not entry.takes_time_limit) \
                or (stop == "should_stop" and user_stop is not None and user_stop()):
            break
        due = state.due(limit, node_lost_seen=lost())
        if not due:
            break  # the policy finished on its own, nothing left to remove
        records = state.remove(due)
        on_removal(records, [r["index"] for r in records])
        if entry.takes_warm_start:
            policy.warm_start = state.warm_start()
    if stop == NODE_LOST or (stop == "should_stop" and not (user_stop is not None and user_stop())):
        stop = "budget"  # cut short by a node loss, then went on to the end of the budget
    runtime_s, placement = state.best.fastest(state.kept)
    return PhasedOutcome(first, last, state.used, stop, runtime_s, placement, state.records(), state.kept)


class _Phases:
    """The device set as removals happen: what is left, what is still to come, the best so far."""

    def __init__(self, problem, removals: Sequence[DeviceRemoval], warm_start: Sequence[np.ndarray] | None):
        self.original, self.problem = problem, problem
        self.initial_warm = list(warm_start or [])  # (N,) op placements on the original machine
        self.kept = np.arange(problem.num_devices, dtype=np.int64)
        self.pending = sorted((r for r in removals if r.at_measurement is not None), key=lambda r: r.at_measurement)
        self.waiting = [r for r in removals if r.at_measurement is None]
        self.done: list[dict] = []
        self.removals = list(removals)
        self.best = BestByDevices()
        self.used = 0

    def next_count(self) -> float:
        return self.pending[0].at_measurement if self.pending else math.inf

    def watching_nodes(self, node_lost: Callable[[], bool]) -> Callable[[], bool]:
        waiting = bool(self.waiting)
        return lambda: waiting and node_lost()

    def due(self, limit: float, node_lost_seen: bool) -> list[DeviceRemoval]:
        """The removals that happen now: on a node loss the @node-lost ones (and any count reached); else the
        next count's (the policy spent it, or stopped on its own before it)."""
        if node_lost_seen:
            due = self.waiting + [r for r in self.pending if r.at_measurement <= self.used]
        else:
            due = [r for r in self.pending if r.at_measurement == limit]
        self.waiting = [r for r in self.waiting if r not in due]
        self.pending = [r for r in self.pending if r not in due]
        return due

    def remove(self, due: Sequence[DeviceRemoval]) -> list[dict]:
        machine = self.original.machine
        gone = [d["device"] for d in self.done] + [r.device for r in due]
        self.problem = reduced_problem(self.original, gone)
        self.kept = machine.kept_device_indices(gone)
        records = [{"device": r.device, "index": machine.device_index(r.device), "trigger": r.trigger,
                    "requested": r.text, "at_measurement": self.used, "machine_after": self.problem.machine.name}
                   for r in due]
        self.done.extend(records)
        return records

    def warm_start(self) -> list[np.ndarray] | None:
        """The best so far (else the search's own warm start's candidates), moved onto the devices left."""
        _, best = self.best.fastest()
        candidates = [best] if best is not None else self.initial_warm
        if not candidates:
            return None
        return [moved_placement(self.original, _on_original(c, self.original), self.kept) for c in candidates]

    def records(self) -> list[dict]:
        removed = {d["device"] for d in self.done}
        never = [{"device": r.device, "index": self.original.machine.device_index(r.device), "trigger": r.trigger,
                  "requested": r.text, "at_measurement": None, "removed": False}
                 for r in self.removals if r.device not in removed]
        return [{**d, "removed": True} for d in self.done] + never


def _on_original(placement: np.ndarray, problem) -> np.ndarray:
    """A warm-start candidate is an (N,) op placement on the original machine (the search's own)."""
    placement = np.asarray(placement, dtype=np.int64)
    if len(placement) != problem.graph.num_ops:
        raise PlacerError(f"a warm start of {len(placement)} entries; graph {problem.graph.name!r} has "
                          f"{problem.graph.num_ops} ops")
    return placement
