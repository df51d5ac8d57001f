"""Baechi's memory-constrained placers (Jeon et al., SoCC 2020): m-TOPO, m-ETF and m-SCT.

- m-TOPO: walk the ops in topological order and fill one device after another (the GPUs; the host too
  where the estimate does not fit them: ``m_topo_devices``), each up to an even share of the model's
  memory (total / the devices filled + the largest unit), never above its usable memory (``usable_bytes``,
  90% of its capacity).
- m-ETF: earliest-task-first list scheduling. Repeatedly start the (ready op, device) pair that can start
  earliest, where a device is allowed only if the op's unit fits in its remaining memory. On one device the
  candidate is the op whose inputs arrive first (ties: topological position), the order in which the
  simulator dispatches, so the schedule is one the step follows (Baechi's own pick, the longest path to the
  end among the ops already there, is ``EtfScheduler(dispatch="priority")``); between devices, ties go to
  the op with the longer path to the end of the graph, then to the device where it finishes first.
- m-SCT: m-ETF plus "favourite children". A linear program (the relaxation of Hanen-Munier's small
  communication time scheduling, as Baechi writes it) chooses for each op at most one child whose edge is
  kept on the same device: variables x_e in [0, 1] (0 = favourite edge: no transfer), start times s_i and
  the makespan w; minimise w subject to s_i + p_i + c_e x_e <= s_j for every edge e = (i, j),
  sum_{e out of i} x_e >= outdeg(i) - 1, sum_{e into j} x_e >= indeg(j) - 1, s_i + p_i <= w. Solved with
  HiGHS through ``scipy.optimize.linprog``; x_e < 1/2 rounds to a favourite edge (each op keeps at most one
  favourite child and one favourite parent). While scheduling, a favourite child goes to its parent's
  device (its edge carries no transfer), where it starts in the device's order like any other op. (Baechi
  instead holds the parent's device idle for the child, letting "urgent" ops through; the simulator -- and
  a real executor -- dispatches whatever is ready, so a hold would be a schedule no step follows.)

Transfers are timed as the simulator times them (``policies.listsched.TransferBook``): one per (producer,
destination device), queued on its link's channel in order of request time, so transfers that share a
channel are serialized in the schedule as in the simulated step. A transfer is booked as soon as its
reader's device is known (the reader's group is placed: ``SendAhead``), not only when the reader is
placed, since the simulator sends it when the producer ends. The scheduled makespan is the replay of the
decisions (each op's device, each device's order) through that model (``replay_finish_s``).

The schedulers run on ops with the unit (group) constraint; Baechi places on GPUs only, so do these
(ops no GPU may run go to their allowed devices) -- unless the memory estimate does not fit in the GPUs,
in which case the CPU (host memory) is used as well, after the GPUs for m-TOPO. Memory per unit comes from
``unit_memory_bytes``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from graphs.errors import PlacerError
from policies.base import DecisionClock, check_budget, finish, joined_notes
from policies.problem import PlacementProblem, unit_memory_bytes
from policies.listsched import (FreeSourceTracker, Reservations, TransferBook, bottom_level_s,
                                SendAhead, candidate_devices, gpus_hold_the_model, makespan_note, mean_times,
                                replay_finish_s)
from policies.simple import units_in_topological_order
from policies.spill import fit_in_memory


@dataclass
class MTopoPolicy:
    name: str = "m-topo"
    memory_model: str = "auto"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        units, placed, notes = fitted_m_topo(problem, self.memory_model)
        return finish(self.name, problem, units, clock, measurer, on_measurement, op_placement=placed,
                      notes=notes)


def fitted_m_topo(problem: PlacementProblem, memory_model: str = "auto") -> tuple[np.ndarray, np.ndarray, str]:
    """m-TOPO's fill, repaired where the simulator's memory model says it overflows (its even shares come from
    an estimate: ``fit_in_memory``): the (U,) unit placement, the (N,) op placement and the notes."""
    fill = m_topo_fill(problem, memory_model)
    op_placement = problem.expand(fill.units)
    placed, fit_note = fit_in_memory(problem, op_placement, fill.unit_bytes, fill.devices)
    units = fill.units if placed is op_placement else problem.collapse(placed)  # moved to fit the memory
    return units, placed, joined_notes(fill.note, fit_note)


def m_topo_devices(problem: PlacementProblem) -> list[int]:
    """The devices m-TOPO fills, in order: the GPUs, then the others (host memory) when the memory estimate
    does not fit in the GPUs."""
    gpus = problem.gpu_indices() or list(range(problem.num_devices))
    if not gpus_hold_the_model(problem):  # spill to the other devices (host memory) after the GPUs
        gpus = gpus + [d for d in range(problem.num_devices) if d not in gpus]
    return gpus


@dataclass(frozen=True)
class MTopoFill:
    """m-TOPO's answer and what it filled by: the devices in order and the memory estimate."""

    units: np.ndarray  # (U,) int64 device of each unit
    note: str
    devices: list[int]  # the devices filled, in order (``m_topo_devices``)
    unit_bytes: np.ndarray  # (U,) int64 the memory estimate (``unit_memory_bytes``)


def m_topo_fill(problem: PlacementProblem, memory_model: str = "auto") -> MTopoFill:
    gpus = m_topo_devices(problem)
    unit_bytes, model = unit_memory_bytes(problem, memory_model, gpus)
    capacity = problem.usable_bytes()
    share = unit_bytes.sum() // len(gpus) + unit_bytes.max(initial=0)
    limit = np.minimum(capacity, share)  # (D,)
    used = np.zeros(problem.num_devices, dtype=np.int64)
    units = np.full(problem.num_units, -1, dtype=np.int64)
    current, overflowed = 0, 0
    for unit in units_in_topological_order(problem):
        allowed_gpus = [g for g in gpus if problem.unit_allowed[unit, g]]
        if not allowed_gpus:  # a unit no GPU may run: its fastest allowed device
            units[unit] = int(np.argmin(problem.unit_time_s[unit]))
            used[units[unit]] += unit_bytes[unit]
            continue
        while current < len(gpus) - 1 and used[gpus[current]] + unit_bytes[unit] > limit[gpus[current]]:
            current += 1
        device = gpus[current] if gpus[current] in allowed_gpus else allowed_gpus[0]
        if used[device] + unit_bytes[unit] > capacity[device]:  # the last GPU is full: most room left
            device = max(allowed_gpus, key=lambda g: capacity[g] - used[g])
            overflowed += used[device] + unit_bytes[unit] > capacity[device]
        units[unit] = device
        used[device] += unit_bytes[unit]
    note = f"memory model {model}" + (f"; {overflowed} groups over capacity" if overflowed else "")
    return MTopoFill(units, note, gpus, unit_bytes)


@dataclass
class METFPolicy:
    name: str = "m-etf"
    memory_model: str = "auto"
    devices: str = "auto"  # "gpus" (Baechi), "all", or "auto": the GPUs unless the model does not fit them

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        schedule = EtfScheduler(problem, self.memory_model, self.devices).run()
        placed, fit_note = schedule.reservations.fit_in_memory(schedule.device_of)
        return finish(self.name, problem, None, clock, measurer, on_measurement, op_placement=placed,
                      notes=joined_notes(schedule.notes(placed), fit_note))


@dataclass
class MSCTPolicy:
    name: str = "m-sct"
    memory_model: str = "auto"
    devices: str = "auto"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        scheduler = EtfScheduler(problem, self.memory_model, self.devices)
        favourite = favourite_children(problem, scheduler.cand)
        scheduler.favourite_child = favourite
        schedule = scheduler.run()
        placed, fit_note = schedule.reservations.fit_in_memory(schedule.device_of)
        note = f"{int((favourite >= 0).sum())} favourite children; " + schedule.notes(placed)
        return finish(self.name, problem, None, clock, measurer, on_measurement, op_placement=placed,
                      notes=joined_notes(note, fit_note))


DISPATCH = ("fifo", "priority")  # which op a device starts next (EtfScheduler._best_on)


class EtfScheduler:
    """Earliest-task-first list scheduling under memory limits; with ``favourite_child`` set, m-SCT.

    Exact ETF without scanning every ready op at every step: each device keeps its candidate ops in two
    heaps, ``pending`` by data-arrival time and, with ``dispatch="priority"`` only, ``released`` (arrival <=
    the device's free time) by priority; the default FIFO dispatch takes ``pending``'s top. Device free times
    only grow, and arrival times nearly always do (channels only fill up: see ``TransferBook``), so a heap
    entry's arrival is taken as a lower bound and refreshed when the entry comes to the top (``_arrival``). An
    arrival can drop, though: three times in all of m-ETF's schedule of inception-v3 on paper-2gpu (found by
    checking every refresh), each when a producer's transfer booked to a device shrank (``transfer_bytes``:
    its larger reader was placed elsewhere, so the copy carries only this op's edge). At the top, such an entry is
    re-keyed down as one whose arrival grew is re-keyed up; below the top, a drop is seen only when the entry
    gets there. An op that stops fitting on a device (memory only fills up; a unit once placed stays) leaves
    that device's heaps.
    """

    def __init__(self, problem: PlacementProblem, memory_model: str = "auto", devices: str = "auto",
                 dispatch: str = "fifo"):
        if dispatch not in DISPATCH:
            raise PlacerError(f"unknown dispatch {dispatch!r} (known: {', '.join(DISPATCH)})")
        self.problem, self.dispatch = problem, dispatch
        self.cand = candidate_devices(problem, devices)  # (N, D) bool
        op_mean, edge_mean = mean_times(problem, self.cand)
        self.priority = bottom_level_s(problem, op_mean, edge_mean)  # (N,)
        self.reservations = Reservations(problem, self.cand, memory_model)
        self.sources = FreeSourceTracker(problem, self.cand, self.reservations)
        self.favourite_child: np.ndarray | None = None  # (N,) int64, -1 where none
        n, d = problem.graph.num_ops, problem.num_devices
        self.finish_s = np.zeros(n)
        self.device_of = np.full(n, -1, dtype=np.int64)
        self.book = TransferBook(problem, self.finish_s, self.device_of)
        self.arrival_s = np.zeros((n, d))  # (N, D) when each ready op's inputs could be on each device
        self.arrival_version = np.zeros((n, d), dtype=np.int64)  # (N, D) book.version arrival_s was asked at
        self.extra_bytes = np.zeros(n, dtype=np.int64)  # memory of free inputs an op pulls along
        self.home = np.full(n, -1, dtype=np.int64)  # m-SCT: the device a favourite child must go to
        self.times = np.where(problem.op_allowed, problem.op_time_s, np.inf)  # (N, D)
        self.device_free = np.zeros(d)
        self.pending = [[] for _ in range(d)]  # heaps of (arrival_s, tie, op)
        self.released = [[] for _ in range(d)]  # heaps of (tie, arrival_s, op); "priority" dispatch only
        self.tie = (-self.priority if dispatch == "priority" else problem.graph.topo_position).tolist()  # (N,)
        self.ready: set[int] = set()
        self.device_order: list[list[int]] = [[] for _ in range(d)]  # ops in the order each device starts them
        self.send_ahead = True  # book a transfer once its reader's device is known (False: once the reader is)
        self.sender = SendAhead(problem, self.book, self.reservations)
        self.makespan_s = 0.0

    def run(self) -> "EtfScheduler":
        graph = self.problem.graph
        indegree = np.bincount(graph.edge_dst, minlength=graph.num_ops)
        offsets, _ = graph.succ_csr
        for op in np.flatnonzero(indegree == 0):
            if not self.sources.free[op]:
                self._make_ready(int(op))
        for op in np.flatnonzero(self.sources.free):  # their consumers may be ready now
            for succ in graph.edge_dst[offsets[op]:offsets[op + 1]]:
                indegree[succ] -= 1
                if indegree[succ] == 0:
                    self._make_ready(int(succ))
        while self.ready:
            op, device, start = self._choose()
            followers = self.sources.follow(op, device, self.finish_s, self.device_of)
            if followers:
                self.book.invalidate()
            start = max(start, self.book.commit(op, device))  # (later only if a free input went elsewhere)
            self.device_of[op] = device
            self.finish_s[op] = start + self.times[op, device]
            self.device_free[device] = self.finish_s[op]
            self.device_order[device].append(op)
            new_unit = self.reservations.unit_device[self.problem.op_unit[op]] < 0
            self.reservations.place(op, device)
            if self.send_ahead:
                self.sender.send_placed(op, new_unit, followers)
            self.ready.discard(op)
            if self.favourite_child is not None:
                self._send_home(int(self.favourite_child[op]), device)
            for succ in graph.edge_dst[offsets[op]:offsets[op + 1]]:
                indegree[succ] -= 1
                if indegree[succ] == 0:
                    self._make_ready(int(succ))
        self._place_orphans()
        self.replayed_finish_s = replay_finish_s(self.problem, self.book, self.device_order)  # (N,)
        self.makespan_s = float(self.replayed_finish_s.max(initial=0.0))
        return self

    def _make_ready(self, op: int) -> None:
        self.arrival_s[op] = self.book.inputs_done_s(op)  # a lower bound, asked for when at a heap's top
        self.arrival_version[op] = -1
        self.extra_bytes[op] = self.sources.pending_bytes(op)
        self.ready.add(op)
        for device in np.flatnonzero(self.reservations.static[op]):
            heapq.heappush(self.pending[device], (self.arrival_s[op, device], self.tie[op], op))

    def _arrival(self, op: int, device: int) -> float:
        """op's input arrival time on ``device`` under the transfers booked so far."""
        if self.arrival_version[op, device] != self.book.version:
            self.arrival_s[op, device] = self.book.arrival_s(op, device)
            self.arrival_version[op, device] = self.book.version
        return float(self.arrival_s[op, device])

    def _may_start(self, op: int, device: int) -> bool:
        """op is still to schedule and may go to ``device`` now (memory, unit, m-SCT's favourite edge)."""
        home = self.home[op]
        if home >= 0 and op in self.ready and not self._fits(op, home):
            self._release_home(op)  # its parent's device filled up before it was scheduled: anywhere again
            home = -1
        return op in self.ready and (home < 0 or home == device) and self._fits(op, device)

    def _release_home(self, op: int) -> None:
        """Forget op's favourite device and offer it to every device again (the others dropped it)."""
        self.home[op] = -1
        for device in np.flatnonzero(self.reservations.static[op]):
            heapq.heappush(self.pending[device], (self._arrival(op, int(device)), self.tie[op], op))

    def _fits(self, op: int, device: int) -> bool:
        res = self.reservations
        unit = self.problem.op_unit[op]
        if res.unit_device[unit] >= 0:
            return res.unit_device[unit] == device
        need = res.unit_bytes[unit] + self.extra_bytes[op]
        return res.used_bytes[device] + need <= res.capacity[device]

    def _pending_top(self, device: int) -> tuple[float, float, int] | None:
        """The pending entry of ``device`` with the earliest up-to-date arrival, or None."""
        pending = self.pending[device]
        while pending:
            arrival, tie, op = pending[0]
            if not self._may_start(op, device):
                heapq.heappop(pending)  # scheduled, or never fits here again
                continue
            fresh = self._arrival(op, device)
            if fresh == arrival:
                return pending[0]
            heapq.heapreplace(pending, (fresh, tie, op))  # later (a channel filled up), or earlier: re-keyed
        return None

    def _best_on(self, device: int) -> tuple[float, float, int] | None:
        """(start, -priority, op) of the ETF choice on ``device``, or None. ``fifo``: the op whose inputs
        arrive first (ties: topological position), as the simulator dispatches; ``priority``: among the
        ops whose inputs are there when the device is free, the one with the longest path to the end."""
        free, pending, released = self.device_free[device], self.pending[device], self.released[device]
        if self.dispatch == "fifo":
            top = self._pending_top(device)
            return None if top is None else (max(free, top[0]), -self.priority[top[2]], top[2])
        while (top := self._pending_top(device)) is not None and top[0] <= free:
            heapq.heappop(pending)
            heapq.heappush(released, (top[1], top[0], top[2]))
        while released:
            tie, _, op = released[0]
            if not self._may_start(op, device):
                heapq.heappop(released)
                continue
            fresh = self._arrival(op, device)
            if fresh <= free:
                return free, -self.priority[op], op
            heapq.heappop(released)  # its inputs now arrive later (a channel filled up): pending again
            heapq.heappush(pending, (fresh, tie, op))
        top = self._pending_top(device)
        return None if top is None else (top[0], -self.priority[top[2]], top[2])

    def _choose(self) -> tuple[int, int, float]:
        """(op, device, start) of the earliest start over the devices; ties: the longer path to the end,
        then the earlier finish (else an equal start went to the lowest-numbered device, however slow)."""
        best = None
        for device in range(self.problem.num_devices):
            pick = self._best_on(device)
            if pick is None:
                continue
            start, neg_priority, op = pick
            key = (start, neg_priority, start + self.times[op, device])
            if best is None or key < best[0]:
                best = (key, op, device)
        if best is None:  # nothing fits anywhere: new units go where most memory is left (may be oom)
            return self._choose_ignoring_memory()
        key, op, device = best
        return op, device, float(key[0])

    def _send_home(self, child: int, device: int) -> None:
        """m-SCT: the favourite child of an op placed on ``device`` goes there too, if its unit may."""
        if child < 0 or not self.reservations.static[child, device]:
            return
        unit_device = self.reservations.unit_device[self.problem.op_unit[child]]
        if unit_device < 0 and self._fits(child, device) or unit_device == device:
            self.home[child] = device

    def _choose_ignoring_memory(self) -> tuple[int, int, float]:
        ops = np.array(sorted(self.ready), dtype=np.int64)
        res = self.reservations
        mask = res.fallback(ops)
        unplaced = res.unit_device[self.problem.op_unit[ops]] < 0
        room = np.where(mask, (res.capacity - res.used_bytes)[None, :], np.iinfo(np.int64).min)
        mask[unplaced] &= room[unplaced] == room[unplaced].max(axis=1, keepdims=True)  # emptiest device
        arrival = np.array([self.book.arrival_all_s(int(op)) for op in ops])  # (R, D)
        start = np.where(mask, np.maximum(arrival, self.device_free[None, :]), np.inf)
        rows, cols = np.nonzero(start == start.min())
        pick = int(np.argmax(self.priority[ops[rows]]))
        return int(ops[rows[pick]]), int(cols[pick]), float(start[rows[pick], cols[pick]])

    def _place_orphans(self) -> None:
        """Free sources nobody consumes: with their unit if it is placed, else on the emptiest candidate."""
        res = self.reservations
        for op in np.flatnonzero(self.device_of < 0):
            device = res.unit_device[self.problem.op_unit[op]]
            if device < 0:
                options = np.flatnonzero(res.static[op])
                device = options[np.argmin(res.used_bytes[options])]
            res.place(int(op), int(device))
            self.device_of[op] = device

    def notes(self, placed: np.ndarray) -> str:
        """The makespan and the reservations' notes; ``placed``: the (N,) placement returned."""
        return makespan_note(self.makespan_s, self.device_of, placed) + "; " + self.reservations.notes()


def favourite_children(problem: PlacementProblem, cand: np.ndarray) -> np.ndarray:
    """(N,) int64: each op's favourite child (-1 where none), from the LP relaxation solved by HiGHS."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    graph = problem.graph
    n, e = graph.num_ops, graph.num_edges
    if e == 0:
        return np.full(n, -1, dtype=np.int64)
    op_s, edge_s = mean_times(problem, cand)
    src, dst = graph.edge_src, graph.edge_dst
    x = np.arange(e)  # variable layout: [x_0..x_{E-1}, s_0..s_{N-1}, w]
    s = e + np.arange(n)
    w = e + n
    rows, cols, vals, rhs = [], [], [], []
    # precedence: s_i - s_j + c_e x_e <= -p_i
    r = np.arange(e)
    rows += [r, r, r]
    cols += [s[src], s[dst], x]
    vals += [np.ones(e), -np.ones(e), edge_s]
    rhs.append(-op_s[src])
    next_row = e
    # at most one favourite child per op / favourite parent per op: -sum x_e <= 1 - degree
    for ends in (src, dst):
        degree = np.bincount(ends, minlength=n)
        multi = degree >= 2
        row_of = np.full(n, -1)
        row_of[multi] = next_row + np.arange(int(multi.sum()))
        keep = multi[ends]
        rows.append(row_of[ends[keep]])
        cols.append(x[keep])
        vals.append(-np.ones(int(keep.sum())))
        rhs.append(1.0 - degree[multi])
        next_row += int(multi.sum())
    # makespan: s_i - w <= -p_i
    r = next_row + np.arange(n)
    rows += [r, r]
    cols += [s, np.full(n, w)]
    vals += [np.ones(n), -np.ones(n)]
    rhs.append(-op_s)
    next_row += n
    a_ub = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(next_row, e + n + 1)).tocsr()
    cost = np.zeros(e + n + 1)
    cost[w] = 1.0
    bounds = [(0.0, 1.0)] * e + [(0.0, None)] * (n + 1)
    solution = linprog(cost, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    if solution.x is None:  # cannot happen for a DAG (all x_e = 1 is feasible); be safe anyway
        return np.full(n, -1, dtype=np.int64)
    return _round_favourites(solution.x[:e], src, dst, n)


def _round_favourites(x: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """Edges with x < 1/2, most favoured first, kept while each op has one favourite child and parent."""
    favourite = np.full(n, -1, dtype=np.int64)
    has_parent = np.zeros(n, dtype=bool)
    for edge in np.argsort(x, kind="stable"):
        if x[edge] >= 0.5:
            break
        if favourite[src[edge]] < 0 and not has_parent[dst[edge]]:
            favourite[src[edge]] = dst[edge]
            has_parent[dst[edge]] = True
    return favourite
