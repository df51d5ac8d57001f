"""The placement problem every policy reads: graph, machine, the units to place, op times, the lower
bound; and the memory models the memory-constrained heuristics share. (Transfer times come from the
machine's links: measurers/sim/links.py.)

``make_problem(graph, machine, max_groups=G)`` places the grouping engineer's groups (``graphs.grouping``);
``max_groups=None`` places the graph's colocation groups (``PlacementProblem.at_op_level`` turns the one
into the other, which is how the list schedulers and partitioners are run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError
from graphs.grouping import majority_device
from graphs.opgraph import PHASE_CODE, OpGraph
from measurers.machine import Machine


@dataclass(frozen=True)
class PlacementProblem:
    graph: OpGraph
    machine: Machine
    op_unit: np.ndarray  # (N,) int64: the unit (group) each op belongs to; a unit goes to one device
    op_time_s: np.ndarray  # (N, D) float64: cost-model time of each op on each device, inf where not allowed
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
    def unit_grouping(self):
        """The ``graphs.grouping.Grouping`` of the units: ``grouping``, or one built from ``op_unit`` (the
        colocation groups) when the problem has none."""
        from graphs.grouping import Grouping

        return self.grouping or Grouping.from_op_group(self.op_unit, self.graph.allowed_mask)

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
        return replace(self, op_unit=self.graph.colocation_ids, grouping=None)

    def split_by(self, op_placement: np.ndarray) -> "PlacementProblem":
        """The same problem with every unit split by the devices ``op_placement`` (N,) gives its ops
        (graphs.grouping ``Grouping.split_by``): that placement becomes one of the unit placements exactly."""
        grouping = self.unit_grouping.split_by(op_placement, self.graph.allowed_mask)
        return replace(self, op_unit=grouping.op_group, grouping=grouping)

    def gpu_indices(self) -> list[int]:
        return self.machine.indices_of_kind("gpu")

    def expand(self, unit_placement: np.ndarray) -> np.ndarray:
        """(U,) or (B, U) unit placement -> (N,) or (B, N) op placement."""
        return device_indices(unit_placement, self.num_units, self.num_devices, "unit placement")[..., self.op_unit]

    def collapse(self, op_placement: np.ndarray) -> np.ndarray:
        """(N,) op placement -> (U,) unit placement: each unit's majority device (graphs.grouping) among the
        devices the unit may use (a unit of three GPU ops and a CPU-only op went to the GPU, and its expansion
        put the CPU-only op there); a unit with no op on one of those goes to its fastest allowed device."""
        op_placement = device_indices(op_placement, self.graph.num_ops, self.num_devices, "op placement")
        units = majority_device(self.op_unit, self.num_units, op_placement)  # (U,)
        bad = np.flatnonzero(~self.unit_allowed[np.arange(self.num_units), units])
        if len(bad):
            counts = np.zeros((self.num_units, self.num_devices), dtype=np.int64)  # (U, D) ops per device
            np.add.at(counts, (self.op_unit, op_placement), 1)
            allowed_counts = np.where(self.unit_allowed[bad], counts[bad], 0)  # (B, D)
            some = allowed_counts.max(axis=1) > 0
            units[bad[some]] = allowed_counts[some].argmax(axis=1)
        return self.repair_allowed(units)  # the rest: the fastest allowed device

    def repair_allowed(self, unit_placement: np.ndarray) -> np.ndarray:
        """Move every unit on a device it may not use to its fastest allowed device."""
        units = device_indices(unit_placement, self.num_units, self.num_devices, "unit placement").copy()
        bad = ~self.unit_allowed[np.arange(self.num_units), units]
        if bad.any():
            units[bad] = np.argmin(self.unit_time_s[bad], axis=1)
        return units

    def capacity_bytes(self) -> np.ndarray:
        """(D,) int64: memory capacity of each device."""
        return np.array([d.memory_bytes for d in self.machine.devices], dtype=np.int64)

    @cached_property
    def single_device_peak_bytes(self) -> int:
        """Peak memory the simulator's liveness model gives with every op on the first GPU (ops it may not
        run elsewhere): what the whole step needs, for calibrating the heuristics' memory model."""
        _ = self.unit_allowed  # a unit that may run on no device: its own clear error, not the simulator's
        gpus = self.gpu_indices() or [0]
        placement = np.where(self.op_allowed[:, gpus[0]], gpus[0], np.argmax(self.op_allowed, axis=1))
        return int(self.simulator().run(placement).peak_bytes[gpus[0]])

    def simulator(self):
        """The simulator with this problem's op times (a profile's, where the problem was made with one):
        memory peaks depend on the order ops run in, so the heuristics' memory checks time ops as it does."""
        from measurers.sim.reference import Simulator

        return Simulator(self.graph, self.machine, op_time_s=self.op_time_s)

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
    usable = problem.usable_bytes()[list(devices) if devices is not None else slice(None)]  # (K,)
    capacity = usable.sum(dtype=np.float64)  # an int64 sum wrapped past 2**63 bytes and took the wrong model
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




def unit_param_bytes(problem: PlacementProblem) -> np.ndarray:
    """(U,) float64: each unit's parameter bytes, resident on its device whatever the schedule."""
    return np.bincount(problem.op_unit, weights=problem.graph.param_bytes.astype(np.float64),
                       minlength=problem.num_units)


def parameters_cannot_fit(problem: PlacementProblem) -> bool:
    """Whether no placement can fit in memory, by two facts that prove it: a unit whose parameters exceed
    every device it may run on, or parameters that exceed all devices together."""
    param_bytes = unit_param_bytes(problem)  # (U,)
    capacity = problem.capacity_bytes().astype(np.float64)  # (D,)
    roomiest = np.where(problem.unit_allowed, capacity[None, :], -np.inf).max(axis=1)  # (U,)
    return bool(np.any(param_bytes > roomiest)) or param_bytes.sum() > capacity.sum()


def device_indices(values, length: int, num_devices: int, what: str) -> np.ndarray:
    """``values`` as int64 device indices, checked: a last axis of ``length``, integers (not floats or
    bools), each in 0..num_devices-1; else one PlacerError naming ``what``."""
    array = np.asarray(values)
    if array.ndim == 0 or array.shape[-1] != length:
        raise PlacerError(f"{what} has shape {array.shape}, expected {length} entries along its last axis")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise PlacerError(f"{what} must hold integer device indices, got {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= num_devices):
        raise PlacerError(f"{what} names device {int(array.min() if array.min() < 0 else array.max())}, "
                          f"but the machine has devices 0..{num_devices - 1}")
    return array.astype(np.int64, copy=False)


def make_problem(graph: OpGraph, machine: Machine, max_groups: int | None = None, profile=None,
                 grouping_method: str | None = None, seed: int = 0) -> PlacementProblem:
    """Build a problem: cost-model op times, lower bound, and the units to place
    (``max_groups``: the grouping engineer's groups; ``None``: the graph's colocation groups)."""
    from measurers.sim.costs import op_time_matrix
    from measurers.sim.lower_bound import lower_bound_from_times

    if not isinstance(graph, OpGraph) or not isinstance(machine, Machine):
        raise PlacerError(f"make_problem needs an OpGraph and a Machine (graphs.registry.load_graph, "
                          f"measurers.catalog.load_machine), got {type(graph).__name__} and {type(machine).__name__}")
    op_time_s = np.asarray(op_time_matrix(graph, machine, profile), dtype=np.float64)  # (N, D)
    grouping = None
    if max_groups is not None:
        from graphs.grouping import group_ops

        kwargs = {"method": grouping_method} if grouping_method else {}
        grouping = group_ops(graph, max_groups=max_groups, seed=seed, **kwargs)
        op_unit = np.asarray(grouping.op_group, dtype=np.int64)
    else:
        op_unit = graph.colocation_ids
    bound_s = lower_bound_from_times(graph, op_time_s, machine.num_devices)  # with the profile's op times
    return PlacementProblem(graph, machine, op_unit, op_time_s, bound_s, grouping)
