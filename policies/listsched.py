"""Shared pieces of the list schedulers (m-ETF, m-SCT, HEFT): candidate devices, data-arrival times
(``TransferBook``: the simulator's transfers, on channels that serve them in order of request time,
``FifoQueue``; ``SendAhead`` books them as soon as both ends are known), the schedule's makespan
(``replay_finish_s``: the decisions replayed through that model), memory reservation per unit, and the
static priority (bottom level).

The schedulers place *ops*, one at a time, under the unit constraint: the first op of a unit to be
scheduled picks the device and reserves the whole unit's memory there; the unit's later ops follow it.
This is how Baechi treats TensorFlow colocation groups.
"""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np

from graphs.errors import PlacerError
from measurers.sim.links import LinkTable, link_table
from policies.problem import PlacementProblem, unit_memory_bytes
from policies.spill import fit_in_memory


CANDIDATE_SETS = ("auto", "gpus", "all")  # candidate_devices' ``use``


def candidate_devices(problem: PlacementProblem, use: str) -> np.ndarray:
    """(N, D) bool: devices an op may be scheduled on. ``gpus``: the GPUs (Baechi places on GPUs only),
    plus the allowed devices of an op no GPU may run; ``all``: every allowed device; ``auto``: the GPUs
    when the model's memory estimate fits in them, else every device (host memory takes the spill). An op may
    go where every op of its unit may (a GPU-capable op colocated with a CPU-only one is stranded too: given
    the GPUs, HEFT crashed on it and m-ETF put the CPU-only op on a GPU)."""
    if use not in CANDIDATE_SETS:  # a typo ran as "gpus"
        raise PlacerError(f"unknown devices {use!r} (known: {', '.join(CANDIDATE_SETS)})")
    allowed = problem.unit_allowed[problem.op_unit]  # (N, D)
    if use == "auto":
        use = "gpus" if gpus_hold_the_model(problem) else "all"
    if use == "all" or not problem.gpu_indices():
        return allowed.copy()
    gpu = np.zeros(problem.num_devices, dtype=bool)
    gpu[problem.gpu_indices()] = True
    cand = allowed & gpu[None, :]
    stranded = ~cand.any(axis=1)
    cand[stranded] = allowed[stranded]
    return cand


def gpus_hold_the_model(problem: PlacementProblem) -> bool:
    gpus = problem.gpu_indices()
    unit_bytes, _ = unit_memory_bytes(problem, "auto", gpus)
    return bool(gpus) and unit_bytes.sum() <= problem.usable_bytes()[gpus].sum(dtype=np.float64)


def memory_model_devices(problem: PlacementProblem, cand: np.ndarray) -> np.ndarray:
    """(K,) devices whose memory the memory model must fit in: the candidates of the ops that may run on a
    GPU. A device that is a candidate only for ops no GPU may run (the CPU of a CPU-only op, which
    ``candidate_devices`` adds) holds those ops, not the model: counting its memory would pick a model the
    GPUs cannot hold (``gpus_hold_the_model`` counts the GPUs too)."""
    on_gpu = cand[:, problem.gpu_indices()].any(axis=1)  # (N,) bool
    return np.flatnonzero(cand[on_gpu].any(axis=0) if on_gpu.any() else cand.any(axis=0))


def bottom_level_s(problem: PlacementProblem, op_cost_s: np.ndarray, edge_cost_s: np.ndarray) -> np.ndarray:
    """(N,) longest path (op + edge costs) from each op to an exit, the op's own cost included."""
    graph = problem.graph
    level = op_cost_s.astype(np.float64).copy()
    offsets, _ = graph.succ_csr
    for op in graph.topo_order[::-1]:
        lo, hi = offsets[op], offsets[op + 1]
        if hi > lo:
            succ = graph.edge_dst[lo:hi]
            level[op] = op_cost_s[op] + float(np.max(edge_cost_s[lo:hi] + level[succ]))
    return level


def mean_times(problem: PlacementProblem, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N,) mean op time over its candidate devices and (E,) mean transfer time (the simulator's links,
    ``LinkTable.transfer_matrix_s``) over distinct device pairs of the candidates (HEFT's average costs;
    Baechi's single-device-type costs when GPUs are alike)."""
    times = np.where(cand, problem.op_time_s, 0.0)
    op_mean = times.sum(axis=1) / np.maximum(cand.sum(axis=1), 1)
    used = np.flatnonzero(cand.any(axis=0))
    if len(used) < 2:
        return op_mean, np.zeros(problem.graph.num_edges)
    links = link_table(problem.machine)
    pair = links.link_of[np.ix_(used, used)] >= 0  # (K, K) distinct pairs with a link
    edge_mean = np.zeros(problem.graph.num_edges)
    chunk = 65536  # (chunk, K, K) float64 at a time
    for lo in range(0, problem.graph.num_edges, chunk):
        nbytes = problem.graph.edge_bytes[lo:lo + chunk]
        matrix = links.transfer_matrix_s(nbytes)[:, used][:, :, used]  # (chunk, K, K)
        edge_mean[lo:lo + chunk] = matrix[:, pair].mean(axis=1)
    return op_mean, edge_mean


class Reservations:
    """Which device each unit is on, and the memory the placed units hold per device."""

    def __init__(self, problem: PlacementProblem, cand: np.ndarray, memory_model: str = "auto"):
        self.problem = problem
        self.static = cand & problem.unit_allowed[problem.op_unit]  # (N, D) bool
        self.unit_device = np.full(problem.num_units, -1, dtype=np.int64)  # (U,), -1 while unplaced
        self.used_bytes = np.zeros(problem.num_devices, dtype=np.int64)  # (D,)
        self.model_devices = memory_model_devices(problem, cand)  # (K,)
        self.unit_bytes, self.model_used = unit_memory_bytes(problem, memory_model, self.model_devices)  # (U,)
        self.capacity = problem.usable_bytes()  # (D,)
        self.overflowed = 0  # units placed although no candidate device had room

    def feasible(self, ops: np.ndarray, extra_bytes: np.ndarray | None = None) -> np.ndarray:
        """(R, D) bool: devices each op may go to now: its unit's device if placed, else the candidates
        where its unit (plus ``extra_bytes`` (R,), e.g. parameters it will pull along) fits."""
        device = self.unit_device[self.problem.op_unit[ops]]  # (R,)
        need = np.where(device >= 0, 0, self.unit_bytes[self.problem.op_unit[ops]])
        if extra_bytes is not None:
            need = need + extra_bytes
        mask = self.static[ops] & (self.used_bytes[None, :] + need[:, None] <= self.capacity[None, :])
        return self._force_placed(mask, device)

    def fallback(self, ops: np.ndarray) -> np.ndarray:
        """(R, D) bool when nothing fits: any candidate device of the unit (the result may be oom)."""
        device = self.unit_device[self.problem.op_unit[ops]]
        return self._force_placed(self.static[ops].copy(), device)

    @staticmethod
    def _force_placed(mask: np.ndarray, device: np.ndarray) -> np.ndarray:
        placed = np.flatnonzero(device >= 0)
        if len(placed):
            mask[placed] = False
            mask[placed, device[placed]] = True
        return mask

    def place(self, op: int, device: int) -> None:
        unit = self.problem.op_unit[op]
        if self.unit_device[unit] < 0:
            self.unit_device[unit] = device
            self.used_bytes[device] += self.unit_bytes[unit]
            if self.used_bytes[device] > self.capacity[device]:
                self.overflowed += 1

    def notes(self) -> str:
        text = f"memory model {self.model_used}"
        return text + (f"; {self.overflowed} groups placed over capacity" if self.overflowed else "")

    def fit_in_memory(self, op_placement: np.ndarray) -> tuple[np.ndarray, str]:
        """The schedule's (N,) op placement, units moved off devices the simulator's peak overflows
        (``policies.spill.fit_in_memory``: the devices the memory model was fitted to first), and a note on
        it ("" when it fitted: then ``op_placement`` itself)."""
        return fit_in_memory(self.problem, op_placement, self.unit_bytes, self.model_devices)


def free_sources(problem: PlacementProblem, cand: np.ndarray) -> np.ndarray:
    """(N,) bool: ops with no inputs that cost nothing on every candidate device (parameters, inputs,
    constants). A list scheduler would place them all at time 0 by tie-breaking; instead they follow the
    first consumer that is scheduled, so weights start where they are used."""
    has_input = np.bincount(problem.graph.edge_dst, minlength=problem.graph.num_ops) > 0
    costless = np.all(np.where(cand, problem.op_time_s, 0.0) == 0.0, axis=1)
    return ~has_input & costless


class FreeSourceTracker:
    """Places free sources next to their first scheduled consumer (see ``free_sources``)."""

    def __init__(self, problem: PlacementProblem, cand: np.ndarray, reservations: Reservations):
        self.problem, self.reservations = problem, reservations
        self.free = free_sources(problem, cand)  # (N,) bool
        graph = problem.graph
        self.has_free_input = np.bincount(graph.edge_dst[self.free[graph.edge_src]],
                                          minlength=graph.num_ops) > 0  # (N,) bool

    def pending_bytes(self, op: int) -> int:
        """Memory of the still unplaced units of op's free inputs (they will follow op)."""
        if not self.has_free_input[op]:
            return 0
        graph, res = self.problem.graph, self.reservations
        offsets, ids = graph.pred_csr
        src = graph.edge_src[ids[offsets[op]:offsets[op + 1]]]
        units = np.unique(self.problem.op_unit[src[self.free[src]]])
        units = units[res.unit_device[units] < 0]
        return int(res.unit_bytes[units].sum())

    def follow(self, op: int, device: int, finish_s: np.ndarray, device_of: np.ndarray) -> int:
        """Place op's unplaced free inputs on ``device`` (at time 0); returns how many were placed."""
        if not self.has_free_input[op]:
            return 0
        graph, res = self.problem.graph, self.reservations
        offsets, ids = graph.pred_csr
        placed = 0
        for src in graph.edge_src[ids[offsets[op]:offsets[op + 1]]]:
            if self.free[src] and device_of[src] < 0:
                unit = self.problem.op_unit[src]
                unit_device = res.unit_device[unit]
                target = unit_device if unit_device >= 0 else device
                if not self.problem.unit_allowed[unit, target]:  # e.g. a CPU-only input read on a GPU
                    options = np.flatnonzero(self.problem.unit_allowed[unit])
                    target = options[np.argmin(res.used_bytes[options])]
                res.place(int(src), int(target))
                device_of[src], finish_s[src] = target, 0.0
                placed += 1
        return placed


class Job:
    """One piece of work for a ``FifoQueue``: requested at ``key[0]``, served for ``duration_s``."""

    __slots__ = ("key", "duration_s", "start_s", "end_s", "pinned")

    def __init__(self, key: tuple, duration_s: float):
        self.key = key  # (request time s, tie-breakers...): the order of service
        self.duration_s = duration_s
        self.start_s = self.end_s = 0.0
        self.pinned = False


class Booking(Job):
    """One booked transfer: the output of ``producer`` sent to device ``dst`` on ``channel``."""

    __slots__ = ("producer", "dst", "channel")

    def __init__(self, key: tuple[float, int, int], producer: int, dst: int, channel: int, duration_s: float):
        super().__init__(key, duration_s)  # key: (request s, producer's topological position, dst device)
        self.producer, self.dst, self.channel = producer, dst, channel


class FifoQueue:
    """A server that does one job at a time, in order of key (request time first), without waiting while
    a job is requested: a job starts at max(its request, the end of the job before it). This is how the
    simulator serves a channel's transfers and a device's ready ops (``measurers.sim.reference``).

    A job requested before some queued ones goes ahead of them, and they start later; ``plan`` times new
    jobs without queueing them, ``add`` queues them. ``pin`` keeps a job and those before it where they
    are: new jobs queue after them, whatever their request time."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []  # in order of service: jobs[pinned:] sorted by key
        self.keys: list[tuple] = []  # their keys
        self.pinned = 0  # jobs[:pinned] keep their times: no new job goes ahead of them (``pin``)

    def pin(self, job: Job) -> None:
        """Keep queued ``job`` and the jobs before it where they are (something was timed from its end)."""
        if not job.pinned:
            index = bisect.bisect_left(self.keys, job.key, lo=self.pinned)
            for earlier in self.jobs[self.pinned:index + 1]:
                earlier.pinned = True
            self.pinned = index + 1

    @property
    def free_s(self) -> float:
        return self.jobs[-1].end_s if self.jobs else 0.0

    def idle_slot(self, job: Job) -> int | None:
        """Where among the pinned jobs ``job`` would run if it fits there: it starts at the first time at or
        after its request when the server is idle (a pinned job starting then goes first if requested before
        it) and must end before the next pinned job starts; None when the pinned jobs end first or it does
        not fit (served first, it would push a pinned job later). Times ``job`` when it fits."""
        jobs, pinned, request_s = self.jobs, self.pinned, job.key[0]
        if not pinned or jobs[pinned - 1].end_s <= request_s:
            return None
        i = bisect.bisect_right(jobs, request_s, lo=0, hi=pinned, key=lambda queued: queued.start_s)
        free = max(request_s, jobs[i - 1].end_s) if i else request_s
        while i < pinned and (jobs[i].start_s < free or (jobs[i].start_s == free and jobs[i].key < job.key)):
            free = max(free, jobs[i].end_s)
            i += 1
        if i == pinned or free + job.duration_s > jobs[i].start_s:
            return None
        job.start_s, job.end_s = free, free + job.duration_s
        return i

    def insert_pinned(self, index: int, job: Job) -> None:
        """Queue ``job`` (timed by ``idle_slot``) at ``index`` among the pinned jobs; it is pinned too."""
        self.jobs.insert(index, job)
        self.keys.insert(index, job.key)
        job.pinned = True
        self.pinned += 1

    def plan(self, new: list[Job], moved: dict[Job, float] | None) -> None:
        """Time ``new`` (sorted by key) as if queued and record in ``moved`` {queued job: its new start} of
        the jobs they push later; stops at the first queued job after them that keeps its time (right
        after the last new job when ``moved`` is None)."""
        jobs, keys = self.jobs, self.keys
        i = bisect.bisect_right(keys, new[0].key, lo=self.pinned)
        free = jobs[i - 1].end_s if i else 0.0
        num_jobs = len(jobs)
        for job in new:  # the new jobs, and the queued ones between them
            while i < num_jobs and keys[i] < job.key:
                queued = jobs[i]
                i += 1
                request_s = queued.key[0]
                start_s = request_s if request_s > free else free
                if moved is not None and start_s != queued.start_s:
                    moved[queued] = start_s
                free = start_s + queued.duration_s
            job.start_s = max(job.key[0], free)
            free = job.end_s = job.start_s + job.duration_s
        if moved is None:
            return
        for k in range(i, num_jobs):  # the queued ones after them, until one keeps its time (indexing, not
            queued = jobs[k]  # islice: that would step over the first i jobs on every call)
            request_s = queued.key[0]
            start_s = request_s if request_s > free else free
            if start_s == queued.start_s:
                break
            moved[queued] = start_s
            free = start_s + queued.duration_s

    def add(self, new: list[Job], moved: dict[Job, float]) -> None:
        """Queue ``new`` (timed by ``plan``) and move the jobs ``plan`` recorded in ``moved``."""
        for job in new:
            index = bisect.bisect_right(self.keys, job.key, lo=self.pinned)
            self.keys.insert(index, job.key)
            self.jobs.insert(index, job)
        for job, start_s in moved.items():
            job.start_s, job.end_s = start_s, start_s + job.duration_s


class TransferBook:
    """Transfers as the simulator makes them (``measurers.sim.reference``): one per (producer, destination
    device), of the largest edge to a reader there (or one still to place: ``transfer_bytes``), on its
    link's channel, timed by ``LinkTable.transfer_s``. A channel
    serves one transfer at a time in order of request time (the producer's end; ties: the producer's
    topological position, then the destination device): a transfer starts at max(its request, the end of
    the transfer before it in that order) (``FifoQueue``).

    ``arrival_s`` asks, without committing, when an op's inputs would all be on a device; ``commit`` books
    those transfers once the op is placed there; ``send`` books one before any reader is placed. A
    transfer requested before some booked ones goes ahead of them, as the simulator would have served it
    first, and they start later -- unless a placed op reads one of them: then that one and those before it
    keep their times (they are pinned), so the schedule never relies on a time that changes later.
    Booked transfers only move later, so an arrival time asked earlier is meant to be a lower bound of the
    one asked now (``version`` counts the commits); it nearly always is (see ``EtfScheduler`` for the
    exception found). ``replay_finish_s`` serves each channel in request order
    again once all decisions are made.
    """

    def __init__(self, problem: PlacementProblem, finish_s: np.ndarray, device_of: np.ndarray):
        self.problem, self.finish_s, self.device_of = problem, finish_s, device_of  # shared (N,) arrays
        self.links: LinkTable = link_table(problem.machine)
        self.channel_of = self.links.channel_of.tolist()  # [D][D], -1 on the diagonal
        self.channels = [FifoQueue() for _ in range(self.links.num_channels)]
        self.booked: dict[tuple[int, int], Booking] = {}  # (producer, dst device) -> its transfer
        self.version = 0
        self.position = problem.graph.topo_position.tolist()  # (N,) topological position of each op
        self.inputs = _inputs_by_producer(problem)  # per op: [(producer, bytes)] in topological order
        self.outputs = _outputs_by_size(problem)  # per op: [(bytes, reader)], largest first
        self.on_booked: Callable[[int], None] | None = None  # called with the producer of each new transfer

    @property
    def channel_free_s(self) -> list[float]:
        """When each channel has served every transfer booked on it."""
        return [channel.free_s for channel in self.channels]

    def arrival_s(self, op: int, device: int) -> float:
        """When op's last placed input would be on ``device`` if op were placed there now."""
        ready, _, _ = self._plan(op, device)
        return ready

    def inputs_done_s(self, op: int) -> float:
        """When op's last placed input ends: a lower bound of ``arrival_s`` on every device."""
        finish_s, device_of = self.finish_s, self.device_of
        return max((float(finish_s[p]) for p, _ in self.inputs[op] if device_of[p] >= 0), default=0.0)

    def arrival_all_s(self, op: int) -> np.ndarray:
        """(D,) ``arrival_s`` on every device."""
        return np.array([self._plan(op, d)[0] for d in range(self.problem.num_devices)])

    def invalidate(self) -> None:
        """Producers were placed outside ``commit`` (free sources): arrival times asked before may be stale."""
        self.version += 1

    def commit(self, op: int, device: int) -> float:
        """Book op's new input transfers to ``device``; returns when its inputs are all there."""
        ready, new, moved = self._plan(op, device)
        self._book(new, moved)
        for producer, _ in self.inputs[op]:  # op is timed from these: they keep their times
            booking = self.booked.get((producer, device))
            if booking is not None:
                self.channels[booking.channel].pin(booking)
        return ready

    def send(self, producer: int, device: int, nbytes: int = 0) -> None:
        """Book the transfer of a placed producer's output to ``device`` now, before any reader there is
        placed (the simulator sends it when the producer ends, wherever its readers are in the schedule);
        of ``nbytes`` at least (``transfer_bytes``)."""
        if (producer, device) in self.booked or self.device_of[producer] in (-1, device):
            return
        src = int(self.device_of[producer])
        key = (float(self.finish_s[producer]), self.position[producer], device)
        nbytes = max(nbytes, self.transfer_bytes(producer, device))
        booking = Booking(key, producer, device, self.channel_of[src][device],
                          self.links.transfer_s(src, device, nbytes))
        moved: dict[Booking, float] = {}
        self.channels[booking.channel].plan([booking], moved)
        self._book([booking], moved)

    def transfer_bytes(self, producer: int, device: int) -> int:
        """Bytes of the transfer of ``producer``'s output to ``device``: its largest edge to a reader there or
        not placed yet. The simulator sends one transfer to all the readers on a device, of their largest
        edge; booked with the first reader's edge, it came too early when a later reader's was larger."""
        device_of = self.device_of
        for nbytes, reader in self.outputs[producer]:
            if device_of[reader] < 0 or device_of[reader] == device:
                return nbytes
        return 0

    def _book(self, new: list[Booking], moved: dict[Job, float]) -> None:
        for channel in {booking.channel for booking in new}:
            self.channels[channel].add([booking for booking in new if booking.channel == channel], {})
        for job, start_s in moved.items():
            job.start_s, job.end_s = start_s, start_s + job.duration_s
        for booking in new:
            self.booked[booking.producer, booking.dst] = booking
            if self.on_booked is not None:
                self.on_booked(booking.producer)
        if new:
            self.version += 1

    def _plan(self, op: int, device: int) -> tuple[float, list[Booking], dict[Booking, float]]:
        """(inputs-ready time, the transfers op would add (timed), {booked transfer: its new start} of
        those the new ones would push later)."""
        finish_s, device_of, booked = self.finish_s, self.device_of, self.booked
        ready, new, needed = 0.0, [], []
        for producer, _ in self.inputs[op]:
            src = int(device_of[producer])
            if src < 0:  # a free source not placed yet: it will follow op (no transfer)
                continue
            if src == device:
                ready = max(ready, float(finish_s[producer]))
            elif (producer, device) in booked:
                needed.append(booked[producer, device])
            else:
                key = (float(finish_s[producer]), self.position[producer], device)
                nbytes = self.transfer_bytes(producer, device)
                new.append(Booking(key, producer, device, self.channel_of[src][device],
                                   self.links.transfer_s(src, device, nbytes)))
        moved: dict[Booking, float] = {}
        for channel in {booking.channel for booking in new}:
            queued = sorted((b for b in new if b.channel == channel), key=lambda b: b.key)
            self.channels[channel].plan(queued, moved)
        for booking in new:
            ready = max(ready, booking.end_s)
        for booking in needed:
            ready = max(ready, moved[booking] + booking.duration_s if booking in moved else booking.end_s)
        return ready, new, moved


class SendAhead:
    """Books a transfer as soon as both ends are known, instead of when its reader is placed: the simulator
    sends an output when its producer ends, and a reader's device is known early when its unit (group) is
    placed already. Booked earlier, a transfer is queued among the transfers requested near the same time,
    and fewer transfers that placed ops rely on are pushed later (``TransferBook``)."""

    def __init__(self, problem: PlacementProblem, book: TransferBook, reservations: Reservations):
        self.problem, self.book, self.reservations = problem, book, reservations
        graph = problem.graph
        self.succ_offsets, _ = graph.succ_csr
        self.pred_offsets, self.pred_ids = graph.pred_csr
        order = np.argsort(problem.op_unit, kind="stable")
        bounds = np.searchsorted(problem.op_unit[order], np.arange(problem.num_units + 1))
        self.unit_ops = [order[bounds[u]:bounds[u + 1]] for u in range(problem.num_units)]  # ops of each unit

    def send_placed(self, op: int, new_unit: bool, followers: int = 0) -> None:
        """``op`` was just placed: send its output to readers whose device is known; if it placed its unit,
        send the placed producers' outputs that the unit's other ops read; with ``followers``, op's free
        inputs were placed along with it: send theirs too."""
        graph, res, book = self.problem.graph, self.reservations, self.book
        if followers:
            for edge in self.pred_ids[self.pred_offsets[op]:self.pred_offsets[op + 1]].tolist():
                producer = int(graph.edge_src[edge])
                if book.finish_s[producer] == 0.0 and book.device_of[producer] >= 0:
                    self.send_placed(producer, False)
        lo, hi = self.succ_offsets[op], self.succ_offsets[op + 1]
        reader_device = res.unit_device[self.problem.op_unit[graph.edge_dst[lo:hi]]]
        for device, nbytes in zip(reader_device.tolist(), graph.edge_bytes[lo:hi].tolist()):
            if device >= 0:
                book.send(op, device, nbytes)
        if not new_unit:
            return
        device = int(book.device_of[op])
        for other in self.unit_ops[self.problem.op_unit[op]].tolist():
            if book.device_of[other] >= 0:
                continue
            for edge in self.pred_ids[self.pred_offsets[other]:self.pred_offsets[other + 1]].tolist():
                producer = int(graph.edge_src[edge])
                if book.device_of[producer] >= 0:
                    book.send(producer, device, int(graph.edge_bytes[edge]))


REPLAY_ROUNDS = 8  # at most: channel orders re-sorted by the replayed request times until they settle


def replay_finish_s(problem: PlacementProblem, book: TransferBook, device_order: list[list[int]]) -> np.ndarray:
    """(N,) when every op ends when the scheduler's decisions are carried out in its own timing model:
    ops on ``book.device_of``, each device running its ops in ``device_order`` with the ops not listed there
    (free sources, ready at 0) where the simulator dispatches them (``_with_unlisted_sources``), each channel
    serving the booked transfers one at a time in order of request time: the producers' ends as replayed
    (the ``TransferBook`` keys, the ends as scheduled, are the first guess; ``REPLAY_ROUNDS``).

    While scheduling, a transfer may have queued behind pinned transfers requested later, and one that
    went ahead of others pushed them, and possibly the ops reading them, later; this gives every op and
    transfer its final time: a longest path through the data, device-order and channel-order edges, each
    transfer one per (producer, device), of the largest edge bytes to that device, as the simulator sends
    it. (The devices keep the scheduler's order: the simulator's own dispatch may differ.)
    """
    graph, device_of = problem.graph, book.device_of.tolist()
    n = graph.num_ops
    duration = [float(problem.op_time_s[op, device_of[op]]) for op in range(n)]
    listed = np.zeros(n, dtype=bool)
    for order in device_order:
        listed[order] = True
    position = graph.topo_position  # (N,) each op's topological position
    is_source = np.bincount(graph.edge_dst, minlength=n) == 0  # (N,) bool
    succ: list[list[int]] = [[] for _ in range(n)]  # op -> ops or transfer nodes (n + k) after it
    for d, order in enumerate(device_order):
        unlisted = [op for op in graph.topo_order.tolist() if not listed[op] and device_of[op] == d]
        sequence = _with_unlisted_sources(list(order), unlisted, position, is_source)
        for a, b in zip(sequence, sequence[1:]):
            succ[a].append(b)
    transfers = {key: k for k, key in enumerate(book.booked)}  # (producer, dst) -> transfer node n + k
    transfer_bytes = [0] * len(transfers)
    readers: list[list[int]] = [[] for _ in transfers]
    for u, v, nbytes in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist()):
        if device_of[u] == device_of[v]:
            succ[u].append(v)
            continue
        k = transfers.get((u, device_of[v]))
        if k is None:
            raise AssertionError(f"op {v} reads op {u} from another device without a booked transfer")
        transfer_bytes[k] = max(transfer_bytes[k], nbytes)
        readers[k].append(v)
    succ += readers
    for (u, _), k in transfers.items():
        succ[u].append(n + k)
    duration += [book.links.transfer_s(device_of[u], dst, nbytes)
                 for (u, dst), nbytes in zip(book.booked, transfer_bytes)]
    request_key = {(job.producer, job.dst): job.key for channel in book.channels for job in channel.jobs}
    ends = None
    for _ in range(REPLAY_ROUNDS):
        queued = [sorted(((request_key[job.producer, job.dst], n + transfers[job.producer, job.dst])
                          for job in channel.jobs)) for channel in book.channels]  # the order each serves them in
        with_channels = [list(nexts) for nexts in succ]
        for jobs in queued:
            for (_, a), (_, b) in zip(jobs, jobs[1:]):
                with_channels[a].append(b)
        ends = _longest_path_ends(with_channels, duration)
        # the simulator queues a transfer when its producer ends: a free source ran later than the time 0 it
        # was scheduled at (or a transfer ahead pushed a producer) requests it later than its booking says
        replayed = {key: (float(ends[key[0]]), *request_key[key][1:]) for key in request_key}
        if replayed == request_key:
            break
        request_key = replayed
    return ends[:n]


def _with_unlisted_sources(order: list[int], unlisted: list[int], position: np.ndarray,
                           is_source: np.ndarray) -> list[int]:
    """One device's ops in the order the simulator runs them: ``unlisted`` (sources the scheduler took as done
    at time 0, in topological order) are ready at 0, so they run before any listed op that becomes ready
    later, but after a listed source (also ready at 0) earlier in topological order. Putting them all first
    made a 1.4 s source on the device run after a 0 s variable read later in the order, and the scheduled
    makespan 3.8 s where the simulated step was 5.2 s (a reviewer's 7-op graph)."""
    sequence, waiting = [], list(unlisted)
    for op in order:
        while waiting and not (is_source[op] and position[op] < position[waiting[0]]):
            sequence.append(waiting.pop(0))
        sequence.append(op)
    return sequence + waiting


def _longest_path_ends(succ: list[list[int]], duration_s: list[float]) -> np.ndarray:
    """(V,) end time of every node of a DAG (start = latest end of its predecessors, 0 without any)."""
    indegree = [0] * len(succ)
    for nexts in succ:
        for b in nexts:
            indegree[b] += 1
    start = [0.0] * len(succ)
    end = [0.0] * len(succ)
    stack = [a for a, degree in enumerate(indegree) if degree == 0]
    done = 0
    while stack:
        a = stack.pop()
        done += 1
        end[a] = start[a] + duration_s[a]
        for b in succ[a]:
            start[b] = max(start[b], end[a])
            indegree[b] -= 1
            if indegree[b] == 0:
                stack.append(b)
    if done != len(succ):
        raise AssertionError("the schedule's device and channel orders contradict its data edges")
    return np.array(end)


def _inputs_by_producer(problem: PlacementProblem) -> list[list[tuple[int, int]]]:
    """Per op, its distinct producers with the largest edge bytes from each, sorted by topological position
    (the order in which the simulator queues transfers that are requested at the same time)."""
    graph = problem.graph
    order = np.lexsort((graph.topo_position[graph.edge_src], graph.edge_dst))  # by consumer, then producer position
    inputs: list[list[tuple[int, int]]] = [[] for _ in range(graph.num_ops)]
    for src, dst, nbytes in zip(graph.edge_src[order].tolist(), graph.edge_dst[order].tolist(),
                                graph.edge_bytes[order].tolist()):
        row = inputs[dst]
        if row and row[-1][0] == src:
            row[-1] = (src, max(row[-1][1], nbytes))
        else:
            row.append((src, nbytes))
    return inputs


def _outputs_by_size(problem: PlacementProblem) -> list[list[tuple[int, int]]]:
    """Per op, its (edge bytes, reader) pairs, largest first."""
    graph = problem.graph
    order = np.lexsort((-graph.edge_bytes, graph.edge_src))  # by producer, then bytes descending
    outputs: list[list[tuple[int, int]]] = [[] for _ in range(graph.num_ops)]
    for src, dst, nbytes in zip(graph.edge_src[order].tolist(), graph.edge_dst[order].tolist(),
                                graph.edge_bytes[order].tolist()):
        outputs[src].append((nbytes, dst))
    return outputs


def makespan_note(makespan_s: float, scheduled: np.ndarray, placed: np.ndarray) -> str:
    """"scheduled makespan ..." of a list schedule whose (N,) devices ``scheduled`` became ``placed`` (N,): where
    the memory repair moved ops, the makespan is the schedule's before it, not the returned placement's."""
    repaired = "" if np.array_equal(scheduled, placed) else " (the schedule's, before the memory repair moved ops)"
    return f"scheduled makespan {makespan_s:.4g} s{repaired}"
