"""The policy protocol: a problem goes in, a placement (and how it was found) comes out.

A ``PlacementProblem`` bundles what every policy may read: the graph, the machine, the units it places
(the groups of a ``Grouping``, or the graph's colocation groups when there is no grouping), the cost
model's op-time matrix, a fitted line for transfer times and the lower bound. A policy answers
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

and ``POLICY_CLASSES["last-device"] = "my_module:AllOnLastDevicePolicy"`` makes ``make_policy`` find it.

``placement_time_s`` in a result is wall time spent deciding, with the time spent inside
``measurer.measure`` excluded; that time is reported separately as ``measure_time_s``.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Protocol, Sequence

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import PHASE_CODE, OpGraph
from measurers.base import Measurement, Measurer
from measurers.machine import Machine

FAILED_COST_S = 1e6  # cost of a failed (oom/error) placement; ranks below every runtime a step can have
OnMeasurement = Callable[[np.ndarray, Measurement], None]


@dataclass(frozen=True)
class PlacementProblem:
    graph: OpGraph
    machine: Machine
    op_unit: np.ndarray  # (N,) int64: the unit (group) each op belongs to; a unit goes to one device
    op_time_s: np.ndarray  # (N, D) float64: cost-model time of each op on each device, inf where not allowed
    comm_latency_s: np.ndarray  # (D, D) float64: fitted transfer latency, 0 on the diagonal
    comm_s_per_byte: np.ndarray  # (D, D) float64: fitted inverse bandwidth, 0 on the diagonal
    lower_bound_s: float
    grouping: object | None = None  # graphs.grouping.Grouping the units come from; None: colocation groups

    @property
    def num_units(self) -> int:
        return int(self.op_unit.max()) + 1 if len(self.op_unit) else 0

    @property
    def num_devices(self) -> int:
        return self.machine.num_devices

    @cached_property
    def op_allowed(self) -> np.ndarray:
        """(N, D) bool: op may run on device (its allowed_mask has the device's kind bit)."""
        return (self.graph.allowed_mask[:, None] & self.machine.kind_bits[None, :]) != 0

    @cached_property
    def unit_allowed(self) -> np.ndarray:
        """(U, D) bool: every op of the unit may run on the device."""
        allowed = np.ones((self.num_units, self.num_devices), dtype=bool)
        np.logical_and.at(allowed, self.op_unit, self.op_allowed)
        if not allowed.any(axis=1).all():
            bad = int(np.flatnonzero(~allowed.any(axis=1))[0])
            raise PlacerError(f"group {bad} of graph {self.graph.name!r} has no device on machine "
                              f"{self.machine.name!r} that all its ops may run on")
        return allowed

    @cached_property
    def unit_time_s(self) -> np.ndarray:
        """(U, D) float64: summed op time of each unit per device (inf where not allowed)."""
        total = np.zeros((self.num_units, self.num_devices))
        np.add.at(total, self.op_unit, np.where(self.op_allowed, self.op_time_s, 0.0))
        return np.where(self.unit_allowed, total, np.inf)

    def at_op_level(self) -> "PlacementProblem":
        """The same problem with the graph's colocation groups as units (what the list schedulers,
        partitioners and rules place; searches place the coarser groups)."""
        op_unit = np.unique(self.graph.colocation, return_inverse=True)[1].astype(np.int64).reshape(-1)
        return replace(self, op_unit=op_unit, grouping=None)

    def gpu_indices(self) -> list[int]:
        return self.machine.indices_of_kind("gpu")

    def expand(self, unit_placement: np.ndarray) -> np.ndarray:
        """(U,) or (B, U) unit placement -> (N,) or (B, N) op placement."""
        return np.asarray(unit_placement, dtype=np.int64)[..., self.op_unit]

    def collapse(self, op_placement: np.ndarray) -> np.ndarray:
        """(N,) op placement -> (U,) unit placement (the device of each unit's first op)."""
        units = np.zeros(self.num_units, dtype=np.int64)
        units[self.op_unit[::-1]] = np.asarray(op_placement, dtype=np.int64)[::-1]
        return units

    def repair_allowed(self, unit_placement: np.ndarray) -> np.ndarray:
        """Move every unit on a device it may not use to its fastest allowed device."""
        units = np.asarray(unit_placement, dtype=np.int64).copy()
        bad = ~self.unit_allowed[np.arange(self.num_units), units]
        if bad.any():
            units[bad] = np.argmin(self.unit_time_s[bad], axis=1)
        return units

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        if src == dst:
            return 0.0
        return float(self.comm_latency_s[src, dst] + nbytes * self.comm_s_per_byte[src, dst])

    def capacity_bytes(self) -> np.ndarray:
        """(D,) int64: memory capacity of each device."""
        return np.array([d.memory_bytes for d in self.machine.devices], dtype=np.int64)

    @cached_property
    def single_device_peak_bytes(self) -> int:
        """Peak memory the simulator's liveness model gives with every op on the first GPU (ops it may not
        run elsewhere): what the whole step needs, for calibrating the heuristics' memory model."""
        from measurers.sim.reference import Simulator

        gpus = self.gpu_indices() or [0]
        placement = np.where(self.op_allowed[:, gpus[0]], gpus[0], np.argmax(self.op_allowed, axis=1))
        return int(Simulator(self.graph, self.machine).run(placement).peak_bytes[gpus[0]])

    def usable_bytes(self) -> np.ndarray:
        """(D,) int64: what the memory-constrained heuristics may fill (HEADROOM of the capacity)."""
        return (self.capacity_bytes() * HEADROOM).astype(np.int64)


def op_memory_bytes(graph: OpGraph, model: str = "conservative") -> np.ndarray:
    """(N,) int64 bytes an op keeps on its device, for the memory-constrained heuristics.

    ``conservative`` (Baechi's): parameters plus every output, as if nothing were ever freed.
    ``saved``: parameters plus the outputs a later phase reads (forward activations the backward pass
    uses); everything else is taken as a short-lived temporary. The simulator's liveness is the truth;
    ``unit_memory_bytes`` scales ``saved`` up to the simulator's one-device peak.
    """
    if model == "conservative":
        return graph.param_bytes + graph.out_bytes
    if model == "saved":
        later = graph.phases[graph.edge_dst] > graph.phases[graph.edge_src]
        later &= graph.phases[graph.edge_dst] != PHASE_CODE["other"]
        saved = np.zeros(graph.num_ops, dtype=bool)
        saved[graph.edge_src[later]] = True
        return graph.param_bytes + np.where(saved, graph.out_bytes, 0)
    raise PlacerError(f"unknown memory model {model!r} (known: {', '.join(MEMORY_MODELS)})")


MEMORY_MODELS = ("conservative", "saved")
HEADROOM = 0.9  # share of a device's memory the heuristics fill: temporaries need the rest


def unit_memory_bytes(problem: PlacementProblem, model: str = "auto",
                      devices: Sequence[int] | None = None) -> tuple[np.ndarray, str]:
    """(U,) int64 bytes per unit and the model used. ``auto``: conservative when it fits in the total
    memory of ``devices`` (default: all), else the lighter ``saved`` model (a conservative model that
    fits nowhere would make every memory-constrained heuristic give up)."""
    models = MEMORY_MODELS if model == "auto" else (model,)
    capacity = problem.usable_bytes()[list(devices) if devices is not None else slice(None)].sum()
    for name in models:
        per_unit = np.bincount(problem.op_unit, weights=op_memory_bytes(problem.graph, name),
                               minlength=problem.num_units).astype(np.float64)
        if name == "saved" and model == "auto":  # calibrate: all units together need the one-device peak
            peak = problem.single_device_peak_bytes
            if peak > per_unit.sum() > 0:
                per_unit *= peak / per_unit.sum()
                name = "saved, scaled to the one-device peak"
        if per_unit.sum() <= capacity:
            break
    return np.ceil(per_unit).astype(np.int64), name


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


class Policy(Protocol):
    name: str

    def place(self, problem: PlacementProblem, measurer: Measurer, budget: int, seed: int,
              on_measurement: OnMeasurement | None = None) -> PolicyResult: ...


def measurement_cost_s(measurement: Measurement, capacity_bytes: np.ndarray) -> float:
    """What searches minimise: the runtime when ok; else FAILED_COST_S plus the memory overflow ratio, so
    that among failed placements the one closest to fitting ranks first."""
    if measurement.ok:
        return float(measurement.runtime_s)
    peaks = np.asarray(measurement.peak_bytes, dtype=np.float64)
    if len(peaks) != len(capacity_bytes):
        return FAILED_COST_S * 2
    overflow = np.maximum(peaks - capacity_bytes, 0.0).sum() / capacity_bytes.sum()
    return FAILED_COST_S * (1.0 + float(overflow))


@dataclass
class DecisionClock:
    """Wall time of a policy run, split into deciding and measuring."""
    started: float = field(default_factory=time.perf_counter)
    measure_s: float = 0.0

    @property
    def decide_s(self) -> float:
        return time.perf_counter() - self.started - self.measure_s


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
    if int(budget) < 1:
        raise PlacerError(f"a policy needs a budget of at least 1 measurement, got {budget}")


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


def search_result(name: str, problem: PlacementProblem, counter: BudgetedMeasurer, notes: str = "") -> PolicyResult:
    best = counter.best_placement
    return PolicyResult(name, best, problem.collapse(best), counter.clock.decide_s, counter.clock.measure_s,
                        counter.used, counter.best_measurement, notes)


# name -> "module:Class"; modules are imported on use so listing policies stays cheap.
POLICY_CLASSES: dict[str, str] = {
    "single-gpu": "policies.simple:SingleGpuPolicy",
    "cpu-only": "policies.simple:CpuOnlyPolicy",
    "round-robin": "policies.simple:RoundRobinPolicy",
    "expert": "policies.expert:ExpertPolicy",
    "metis": "policies.metis:MetisPolicy",
    "m-topo": "policies.baechi:MTopoPolicy",
    "m-etf": "policies.baechi:METFPolicy",
    "m-sct": "policies.baechi:MSCTPolicy",
    "heft": "policies.heft:HeftPolicy",
    "random": "policies.search:RandomSearchPolicy",
    "cem": "policies.search:CrossEntropyPolicy",
    "annealing": "policies.search:AnnealingPolicy",
}
DEFAULT_POLICIES = tuple(POLICY_CLASSES)


def make_policy(spec: str, **options) -> Policy:
    """A policy by name. ``device:K`` is the single-device placement on device K."""
    if spec.startswith("device:"):
        from policies.simple import SingleDevicePolicy

        try:
            return SingleDevicePolicy(device=int(spec.split(":", 1)[1]), **options)
        except ValueError:
            raise PlacerError(f"bad policy {spec!r}: expected device:K with K a device index") from None
    if spec not in POLICY_CLASSES:
        raise PlacerError(f"unknown policy {spec!r} (known: {', '.join(POLICY_CLASSES)}, device:K)")
    module_name, class_name = POLICY_CLASSES[spec].split(":")
    return getattr(importlib.import_module(module_name), class_name)(**options)


def make_problem(graph: OpGraph, machine: Machine, max_groups: int | None = None, profile=None,
                 grouping_method: str | None = None, seed: int = 0) -> PlacementProblem:
    """Build a problem: cost-model op times, fitted transfer line, lower bound, and the units to place
    (``max_groups``: the grouping engineer's groups; ``None``: the graph's colocation groups)."""
    from measurers.sim.costs import op_time_matrix
    from measurers.sim.lower_bound import lower_bound_s

    op_time_s = np.asarray(op_time_matrix(graph, machine, profile), dtype=np.float64)  # (N, D)
    grouping = None
    if max_groups is not None:
        from graphs.grouping import group_ops

        kwargs = {"method": grouping_method} if grouping_method else {}
        grouping = group_ops(graph, max_groups=max_groups, seed=seed, **kwargs)
        op_unit = np.asarray(grouping.op_group, dtype=np.int64)
    else:
        op_unit = np.unique(graph.colocation, return_inverse=True)[1].astype(np.int64).reshape(-1)
    latency, per_byte = fit_transfer_line(machine)
    return PlacementProblem(graph, machine, op_unit, op_time_s, latency, per_byte,
                            float(lower_bound_s(graph, machine)), grouping)


def fit_transfer_line(machine: Machine) -> tuple[np.ndarray, np.ndarray]:
    """(D, D) latency and seconds per byte: the cost model's transfer time as a line in bytes (Baechi's
    fitted communication model), read off at 0 and 1 GB."""
    try:
        from measurers.sim.costs import transfer_time_s
    except ImportError:  # the cost module is not there: read the links directly
        def transfer_time_s(m, src, dst, nbytes):
            link = m.link(src, dst)
            return link.latency_s + nbytes / link.bandwidth_Bps
    d = machine.num_devices
    latency, per_byte = np.zeros((d, d)), np.zeros((d, d))
    for src in range(d):
        for dst in range(d):
            if src != dst:
                t0 = float(transfer_time_s(machine, src, dst, 0))
                latency[src, dst] = t0
                per_byte[src, dst] = (float(transfer_time_s(machine, src, dst, 10**9)) - t0) / 1e9
    return latency, per_byte
