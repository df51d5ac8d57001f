"""Shared pieces of the list schedulers (m-ETF, m-SCT, HEFT): candidate devices, data-arrival times,
memory reservation per unit, and the static priority (bottom level).

The schedulers place *ops*, one at a time, under the unit constraint: the first op of a unit to be
scheduled picks the device and reserves the whole unit's memory there; the unit's later ops follow it.
This is how Baechi treats TensorFlow colocation groups.
"""

from __future__ import annotations

import numpy as np

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
    """(N,) mean op time over its candidate devices and (E,) mean transfer time over distinct device pairs
    of the candidates (HEFT's average costs; Baechi's single-device-type costs when GPUs are alike)."""
    times = np.where(cand, problem.op_time_s, 0.0)
    op_mean = times.sum(axis=1) / np.maximum(cand.sum(axis=1), 1)
    used = np.flatnonzero(cand.any(axis=0))
    if len(used) < 2:
        return op_mean, np.zeros(problem.graph.num_edges)
    pairs = [(a, b) for a in used for b in used if a != b]
    lat = np.mean([problem.comm_latency_s[a, b] for a, b in pairs])
    per_byte = np.mean([problem.comm_s_per_byte[a, b] for a, b in pairs])
    return op_mean, lat + problem.graph.edge_bytes * per_byte


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

    def pending_bytes(self, op: int) -> int:
        """Memory of the still unplaced units of op's free inputs (they will follow op)."""
        graph, res = self.problem.graph, self.reservations
        offsets, ids = graph.pred_csr
        src = graph.edge_src[ids[offsets[op]:offsets[op + 1]]]
        units = np.unique(self.problem.op_unit[src[self.free[src]]])
        units = units[res.unit_device[units] < 0]
        return int(res.unit_bytes[units].sum())

    def follow(self, op: int, device: int, finish_s: np.ndarray, device_of: np.ndarray) -> None:
        """Place op's unplaced free inputs on ``device`` (at time 0)."""
        graph, res = self.problem.graph, self.reservations
        offsets, ids = graph.pred_csr
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


def arrival_times_s(problem: PlacementProblem, op: int, finish_s: np.ndarray, device_of: np.ndarray) -> np.ndarray:
    """(D,) time op's last input could arrive on each device, given its (scheduled) predecessors."""
    offsets, ids = problem.graph.pred_csr
    edges = ids[offsets[op]:offsets[op + 1]]
    if len(edges) == 0:
        return np.zeros(problem.num_devices)
    src = problem.graph.edge_src[edges]
    src_dev = device_of[src]
    unplaced = src_dev < 0  # free sources not placed yet: they will follow this op (no transfer)
    if unplaced.any():
        edges, src, src_dev = edges[~unplaced], src[~unplaced], src_dev[~unplaced]
        if len(edges) == 0:
            return np.zeros(problem.num_devices)
    nbytes = problem.graph.edge_bytes[edges].astype(np.float64)
    arrive = (finish_s[src][:, None] + problem.comm_latency_s[src_dev]
              + nbytes[:, None] * problem.comm_s_per_byte[src_dev])  # (P, D); diagonal terms are 0
    return arrive.max(axis=0)
