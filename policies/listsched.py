"""Shared pieces of the list schedulers (m-ETF, m-SCT, HEFT): candidate devices, data-arrival times
(``TransferBook``: the simulator's transfers and channels), memory reservation per unit, and the static
priority (bottom level).

The schedulers place *ops*, one at a time, under the unit constraint: the first op of a unit to be
scheduled picks the device and reserves the whole unit's memory there; the unit's later ops follow it.
This is how Baechi treats TensorFlow colocation groups.
"""

from __future__ import annotations

import numpy as np

from measurers.sim.links import LinkTable, link_table
from policies.problem import PlacementProblem, unit_memory_bytes


def candidate_devices(problem: PlacementProblem, use: str) -> np.ndarray:
    """(N, D) bool: devices an op may be scheduled on. ``gpus``: the GPUs (Baechi places on GPUs only),
    plus the allowed devices of an op no GPU may run; ``all``: every allowed device; ``auto``: the GPUs
    when the model's memory estimate fits in them, else every device (host memory takes the spill)."""
    allowed = problem.op_allowed
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
    return bool(gpus) and unit_bytes.sum() <= problem.usable_bytes()[gpus].sum()


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
        devices = np.flatnonzero(cand.any(axis=0))
        self.unit_bytes, self.model_used = unit_memory_bytes(problem, memory_model, devices)  # (U,)
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


class TransferBook:
    """Transfers as the simulator makes them (``measurers.sim.reference``): one per (producer, destination
    device), of the edge's bytes, on its link's channel, timed by ``LinkTable.transfer_s``; a channel
    serves one transfer at a time, so a transfer starts at max(producer end, channel free).

    ``arrival_s`` asks, without committing, when an op's inputs would all be on a device (its new transfers
    queued on their channels in the simulator's order: producer end, then topological position);
    ``commit`` books those transfers once the op is placed there. Channels only fill up, so an arrival
    time asked earlier is a lower bound of the one asked now (``version`` counts the commits).
    """

    def __init__(self, problem: PlacementProblem, finish_s: np.ndarray, device_of: np.ndarray):
        self.problem, self.finish_s, self.device_of = problem, finish_s, device_of  # shared (N,) arrays
        self.links: LinkTable = link_table(problem.machine)
        num_devices = problem.num_devices  # (LinkTable.channel_of fails on a machine without links)
        self.channel_of = (self.links.channel_of.tolist() if self.links.num_channels
                           else [[-1] * num_devices for _ in range(num_devices)])  # [D][D], -1 on the diagonal
        self.channel_free_s = [0.0] * self.links.num_channels
        self.booked_s: dict[tuple[int, int], float] = {}  # (producer, dst device) -> transfer end
        self.version = 0
        graph = problem.graph
        position = np.empty(graph.num_ops, dtype=np.int64)
        position[graph.topo_order] = np.arange(graph.num_ops)
        self.position_array = position  # (N,) topological position of each op
        self.position = position.tolist()
        self.inputs = _inputs_by_producer(problem)  # per op: [(producer, bytes)] in topological order

    def arrival_s(self, op: int, device: int) -> float:
        """When op's last placed input would be on ``device`` if op were placed there now."""
        ready, _ = self._plan(op, device)
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
        ready, new = self._plan(op, device)
        for producer, channel, end_s in new:
            self.booked_s[producer, device] = end_s
            self.channel_free_s[channel] = max(self.channel_free_s[channel], end_s)
        if new:
            self.version += 1
        return ready

    def _plan(self, op: int, device: int) -> tuple[float, list[tuple[int, int, float]]]:
        """(inputs-ready time, [(producer, channel, transfer end)] of the transfers op would add)."""
        finish_s, device_of, booked = self.finish_s, self.device_of, self.booked_s
        ready, requests = 0.0, []
        for producer, nbytes in self.inputs[op]:
            src = int(device_of[producer])
            if src < 0:  # a free source not placed yet: it will follow op (no transfer)
                continue
            if src == device:
                ready = max(ready, float(finish_s[producer]))
            elif (producer, device) in booked:
                ready = max(ready, booked[producer, device])
            else:
                requests.append((float(finish_s[producer]), self.position[producer], producer, src, nbytes))
        if len(requests) > 1:
            requests.sort()
        new, free = [], {}
        for request_s, _, producer, src, nbytes in requests:
            channel = self.channel_of[src][device]
            start = max(request_s, free.get(channel, self.channel_free_s[channel]))
            free[channel] = end = start + self.links.transfer_s(src, device, nbytes)
            new.append((producer, channel, end))
            ready = max(ready, end)
        return ready, new


def _inputs_by_producer(problem: PlacementProblem) -> list[list[tuple[int, int]]]:
    """Per op, its distinct producers with the largest edge bytes from each, sorted by topological position
    (the order in which the simulator queues transfers that are requested at the same time)."""
    graph = problem.graph
    position = np.empty(graph.num_ops, dtype=np.int64)
    position[graph.topo_order] = np.arange(graph.num_ops)
    order = np.lexsort((position[graph.edge_src], graph.edge_dst))  # by consumer, then producer position
    inputs: list[list[tuple[int, int]]] = [[] for _ in range(graph.num_ops)]
    for src, dst, nbytes in zip(graph.edge_src[order].tolist(), graph.edge_dst[order].tolist(),
                                graph.edge_bytes[order].tolist()):
        row = inputs[dst]
        if row and row[-1][0] == src:
            row[-1] = (src, max(row[-1][1], nbytes))
        else:
            row.append((src, nbytes))
    return inputs
