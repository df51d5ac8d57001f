"""HEFT: heterogeneous earliest finish time (Topcuoglu, Hariri, Wu 2002), with memory limits.

1. Rank every op by its upward rank: its mean time over the devices plus the longest (mean transfer +
   rank) path through its successors. Higher rank first (ties: topological order) is a valid order.
2. Take ops in that order; put each on the device where it would *finish* earliest. The paper uses the
   earliest idle slot long enough for it after its inputs arrive (insertion-based: ``timeline="insertion"``);
   the simulator, like a real executor, runs a device's ops in order of input arrival and never leaves
   the device idle while one is ready, so by default (``timeline="fifo"``) a device is such a queue: an
   op that becomes ready before ops already queued runs before them and pushes them later -- unless a
   placed reader or a booked transfer was timed from their ends: then they keep their times, and the op
   runs before them only in an idle stretch it fits in (``FifoDevice``).

Unlike ETF, HEFT compares finish times, so a slow CPU is used only when it actually finishes an op first;
it therefore considers every allowed device. Units (groups) stay together: the first op of a unit picks
the device among those where the unit's memory fits, and the rest of the unit follows. Inputs arrive as
the simulator moves them (``policies.listsched.TransferBook``): one transfer per (producer, device), queued
on its link's channel in order of request time, booked as soon as its reader's device is known
(``SendAhead``). The scheduled makespan is the replay of the decisions through that model
(``replay_finish_s``).

Which devices: ``devices="all"`` lets every allowed device take ops; ``"gpus"`` keeps to the GPUs (the CPU
only for ops no GPU runs). Neither wins everywhere: the host's memory lets "all" pick a cautious memory model
whose GPU share fills early and sends much of an RNN to the slow CPU (nmt-4 at 3.4-3.6x the expert's step), while
"gpus" spreads a small model over every GPU where one or two would do. Both schedules agree with the
simulator within 10% on the benchmark graphs on paper-2gpu and paper-4gpu (not everywhere: the pinned ops
above keep an order the simulator does not follow; BENCHMARKS.md, issue 16, "Other machines"), so by
default (``"best"``) HEFT makes both and keeps the one with the lower makespan of its own.
Where its memory estimate placed units over capacity in either, the memory repair runs on both (the
simulator's liveness model, ``policies.spill``) and the one whose repaired placement fits and simulates
faster is kept: dropping every schedule the estimate overflowed kept a step 3-4x slower than the repaired
GPU-only one, under GPUs that hold about half the model (nmt-2, rnnlm, a family RNN; BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.errors import PlacerError
from policies.base import DecisionClock, check_budget, finish, joined_notes
from policies.problem import PlacementProblem
from policies.listsched import (FifoQueue, FreeSourceTracker, Job, Reservations, SendAhead, TransferBook,
                                bottom_level_s, candidate_devices, makespan_note, mean_times, replay_finish_s)


@dataclass
class HeftPolicy:
    name: str = "heft"
    memory_model: str = "auto"
    devices: str = "best"  # one of DEVICE_SETS

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        run, makespan_s = chosen_heft_run(problem, self.memory_model, self.devices)
        placed, fit_note = run.fitted()
        notes = f"{makespan_note(makespan_s, run.device_of, placed)}; {run.notes}"
        return finish(self.name, problem, None, clock, measurer, on_measurement, op_placement=placed,
                      notes=joined_notes(notes, fit_note))


TIMELINES = ("fifo", "insertion")  # how a device's time is modelled (heft_schedule)
DEVICE_SETS = ("best", "all", "gpus")  # "best": the better of the other two by HEFT's own makespan


def heft_schedule(problem: PlacementProblem, memory_model: str = "auto", devices: str = "best",
                  timeline: str = "fifo") -> tuple[np.ndarray, float, str]:
    """(N,) device of every op, the schedule's own makespan, and notes.

    ``timeline="fifo"``: a device runs its ops in order of input arrival (ties: topological position), as
    the simulator dispatches; an op that becomes ready before ops already queued on a device runs before
    them and pushes them later (not those something was timed from). ``"insertion"``: the paper's
    insertion into the earliest idle slot, an order the simulator does not follow (it under-estimates the
    step). The makespan is the replay of the decisions (``replay_finish_s``)."""
    run, makespan_s = chosen_heft_run(problem, memory_model, devices, timeline)
    return run.device_of, makespan_s, run.notes


def chosen_heft_run(problem: PlacementProblem, memory_model: str = "auto", devices: str = "best",
                    timeline: str = "fifo") -> tuple["HeftRun", float]:
    """HEFT's run on ``devices`` (``DEVICE_SETS``) and its replayed makespan. ``"best"`` schedules on every
    allowed device and on the GPUs alone (when that is another set) and keeps the lower makespan (ties:
    every device); where either placed a unit over capacity, the run whose repaired placement fits and
    simulates fastest (``_repaired_keys``)."""
    if devices not in DEVICE_SETS:
        raise PlacerError(f"unknown HEFT device set {devices!r} (known: {', '.join(DEVICE_SETS)})")
    sets = [devices] if devices != "best" else ["all", "gpus"]
    if len(sets) == 2 and np.array_equal(candidate_devices(problem, "all"), candidate_devices(problem, "gpus")):
        sets = ["all"]
    runs = [heft_run(problem, memory_model, use, timeline) for use in sets]
    makespans_s = [replayed_makespan_s(problem, run) for run in runs]
    repaired = len(runs) == 2 and any(run.reservations.overflowed for run in runs)
    keys = _repaired_keys(problem, runs) if repaired else [(False, makespan_s) for makespan_s in makespans_s]
    pick = min(range(len(runs)), key=keys.__getitem__)
    run = runs[pick]
    if len(runs) == 2:
        kept = "GPUs-only" if sets[pick] == "gpus" else "every-device"
        after = (f"; after the memory repair, simulated: {keys[0][1]:.4g} s and {keys[1][1]:.4g} s"
                 if repaired else "")
        run.notes = (f"{kept} schedule kept (every device: {makespans_s[0]:.4g} s, GPUs only: "
                     f"{makespans_s[1]:.4g} s{after}); {run.notes}")
    return run, makespans_s[pick]


def _repaired_keys(problem: PlacementProblem, runs: list["HeftRun"]) -> list[tuple[bool, float]]:
    """Per run: (its repaired placement still overflows, that placement's simulated step). The estimate
    alone cannot rank a schedule it overflowed: the repair may fit it with a few moves, or send much of it
    to the host."""
    simulator = problem.simulator()  # the op times HEFT scheduled with
    keys = []
    for run in runs:
        result = simulator.run(run.fitted()[0])
        keys.append((bool((result.peak_bytes > problem.capacity_bytes()).any()), float(result.runtime_s)))
    return keys


def replayed_makespan_s(problem: PlacementProblem, run: "HeftRun") -> float:
    """The makespan of the run's decisions replayed (``replay_finish_s``)."""
    replayed_s = replay_finish_s(problem, run.book, [t.order() for t in run.timelines])  # (N,)
    return float(replayed_s.max(initial=0.0))


@dataclass
class HeftRun:
    """HEFT's decisions and its own timing of them (before the replay)."""

    device_of: np.ndarray  # (N,) int64
    finish_s: np.ndarray  # (N,) when each op ends in the schedule (0 for free sources)
    book: TransferBook
    timelines: list  # per device: FifoDevice or DeviceSlots
    notes: str
    reservations: Reservations  # the units' memory estimate (``Reservations.fit_in_memory``)
    _fitted: tuple[np.ndarray, str] | None = None

    def fitted(self) -> tuple[np.ndarray, str]:
        """The (N,) placement made to fit the simulator's memory, and the repair's note (made once)."""
        if self._fitted is None:
            self._fitted = self.reservations.fit_in_memory(self.device_of)
        return self._fitted


def heft_run(problem: PlacementProblem, memory_model: str = "auto", devices: str = "all",
             timeline: str = "fifo") -> HeftRun:
    """Schedule every op (``heft_schedule``), without the replay."""
    if timeline not in TIMELINES:
        raise PlacerError(f"unknown HEFT timeline {timeline!r} (known: {', '.join(TIMELINES)})")
    graph = problem.graph
    cand = candidate_devices(problem, devices)  # (N, D)
    op_mean, edge_mean = mean_times(problem, cand)
    rank = bottom_level_s(problem, op_mean, edge_mean)  # upward rank
    times = np.where(problem.op_allowed, problem.op_time_s, np.inf)  # (N, D)
    reservations = Reservations(problem, cand, memory_model)
    sources = FreeSourceTracker(problem, cand, reservations)
    finish_s = np.zeros(graph.num_ops)
    device_of = np.full(graph.num_ops, -1, dtype=np.int64)
    book = TransferBook(problem, finish_s, device_of)
    sender = SendAhead(problem, book, reservations)
    position = graph.topo_position  # (N,)
    timelines = [FifoDevice(position, finish_s) if timeline == "fifo" else DeviceSlots()
                 for _ in range(problem.num_devices)]
    book.on_booked = lambda producer: timelines[device_of[producer]].pin(producer)  # timed from its end
    order = np.lexsort((position, -rank))
    for op in order[~sources.free[order]].tolist():
        ops = np.array([op])
        mask = reservations.feasible(ops, np.array([sources.pending_bytes(op)]))[0]
        if not mask.any():
            mask = reservations.fallback(ops)[0]
        best = (np.inf, -1)
        for device in np.flatnonzero(mask).tolist():
            _, end = timelines[device].slot(op, book.arrival_s(op, device), times[op, device])
            best = min(best, (end, device))
        device = best[1]
        followers = sources.follow(op, device, finish_s, device_of)  # HEFT asks each arrival once
        ready_s = book.commit(op, device)  # later than asked only if a free input went elsewhere
        for producer, _ in book.inputs[op]:  # op is timed from their ends: they keep them
            if device_of[producer] >= 0:
                timelines[device_of[producer]].pin(producer)
        new_unit = reservations.unit_device[problem.op_unit[op]] < 0
        _, finish_s[op] = timelines[device].add(op, ready_s, times[op, device])
        device_of[op] = device
        reservations.place(op, device)
        sender.send_placed(op, new_unit, followers)
    for op in np.flatnonzero(device_of < 0):  # free sources nobody consumes
        unit_device = reservations.unit_device[problem.op_unit[op]]
        device_of[op] = unit_device if unit_device >= 0 else int(np.argmin(np.where(cand[op], 0, 1)))
        reservations.place(int(op), int(device_of[op]))
    return HeftRun(device_of, finish_s, book, timelines, reservations.notes(), reservations)


class FifoDevice:
    """A device that runs its ops in order of input arrival (ties: topological position), one at a time.

    An op queued ahead of others pushes them later and their ends in ``finish_s`` move with them; an op
    something was timed from (a reader, a transfer of its output) is pinned first (``pin``), so only ops
    nothing depends on yet ever move. An op that becomes ready while the device is idle before a pinned op
    and ends before it starts runs there, as the simulator would run it (it would not wait for the pinned
    ops); else it queues after them. ``slot``, which the device choice asks, always queues after them: a
    choice that counted those idle stretches drew ops onto the CPU and idle GPUs, away from their inputs
    (simulated steps 29-48% longer on nmt and rnnlm)."""

    def __init__(self, position: np.ndarray, finish_s: np.ndarray | None = None):
        self.position = position  # (N,) topological position of each op
        self.finish_s = finish_s  # (N,) shared: the end of every queued op, kept up to date
        self.queue = FifoQueue()
        self.op_of: dict[Job, int] = {}
        self.job_of: dict[int, Job] = {}

    def slot(self, op: int, ready_s: float, duration_s: float) -> tuple[float, float]:
        """(start, end) op would get if queued now after the pinned ops (``add`` may run it earlier, in an idle
        stretch before them: the device choice stays conservative)."""
        job = Job((ready_s, int(self.position[op])), duration_s)
        self.queue.plan([job], None)
        return job.start_s, job.end_s

    def add(self, op: int, ready_s: float, duration_s: float) -> tuple[float, float]:
        """Queue op (the ops after it may start later); returns its (start, end)."""
        job = Job((ready_s, int(self.position[op])), duration_s)
        moved: dict[Job, float] = {}
        index = self.queue.idle_slot(job)
        if index is not None:  # ready in an idle stretch before a pinned op and ends first: nothing moves
            self.queue.insert_pinned(index, job)
        else:
            self.queue.plan([job], moved)
            self.queue.add([job], moved)
        self.op_of[job] = op
        self.job_of[op] = job
        if self.finish_s is not None:
            for pushed in moved:
                self.finish_s[self.op_of[pushed]] = pushed.end_s
        return job.start_s, job.end_s

    def pin(self, op: int) -> None:
        """Keep queued ``op`` and the ops before it where they are (a time was taken from its end)."""
        job = self.job_of.get(op)
        if job is not None:
            self.queue.pin(job)

    def order(self) -> list[int]:
        return [self.op_of[job] for job in self.queue.jobs]


class DeviceSlots:
    """Busy intervals of one device, sorted by start, for insertion-based scheduling."""

    def __init__(self) -> None:
        self.starts = np.zeros(0)  # (K,) float64
        self.ends = np.zeros(0)  # (K,) float64, sorted too: intervals do not overlap
        self.ops: list[int] = []  # (K,) the op of each interval

    def earliest_start(self, ready_s: float, duration_s: float) -> float:
        """Earliest start >= ready_s of an idle gap of at least duration_s."""
        i = int(np.searchsorted(self.ends, ready_s, side="right"))  # intervals i.. end after ready_s
        if i == len(self.starts):
            return ready_s
        gap_start = np.maximum(np.concatenate(([ready_s], self.ends[i:-1])), ready_s)  # before interval j
        fits = np.flatnonzero(gap_start + duration_s <= self.starts[i:])
        return float(gap_start[fits[0]]) if len(fits) else max(ready_s, float(self.ends[-1]))

    def slot(self, op: int, ready_s: float, duration_s: float) -> tuple[float, float]:
        start = self.earliest_start(ready_s, duration_s)
        return start, start + duration_s

    def add(self, op: int, ready_s: float, duration_s: float) -> tuple[float, float]:
        start, end = self.slot(op, ready_s, duration_s)
        self.insert(start, end, op)
        return start, end

    def order(self) -> list[int]:
        return list(self.ops)

    def pin(self, op: int) -> None:
        """Nothing to do: an inserted op never moves the ones already there."""

    def insert(self, start_s: float, end_s: float, op: int = -1) -> None:
        # a zero-length op goes after the zero-length ones (its producers may be among them) and before the
        # real ones starting at the same time; a real one after all of them
        i = int(np.searchsorted(self.starts, start_s, side="left" if end_s == start_s else "right"))
        while end_s == start_s and i < len(self.starts) and self.starts[i] == start_s == self.ends[i]:
            i += 1
        self.starts = np.insert(self.starts, i, start_s)
        self.ends = np.insert(self.ends, i, end_s)
        self.ops.insert(i, op)
