"""The simplest baselines: everything on one device, and round robin over the GPUs.

Units whose ops may not run on the chosen device kind (a CPU-only op) go to their fastest allowed device,
as TensorFlow's placer does with ops that have no GPU kernel. None of these look at memory: a single GPU
that is too small for the model is reported ``oom``, which is the point of the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.errors import PlacerError
from policies.base import DecisionClock, check_budget, finish
from policies.problem import PlacementProblem


def best_single_device(problem: PlacementProblem, kind: str | None = "gpu") -> int:
    """The device of ``kind`` (any kind when None) on which the cost model sums the least op time."""
    return devices_by_speed(problem, kind)[0]


def devices_by_speed(problem: PlacementProblem, kind: str | None = "gpu") -> list[int]:
    """The devices of ``kind`` (any kind when None), least summed op time (the cost model's) first."""
    candidates = problem.machine.indices_of_kind(kind) if kind else list(range(problem.num_devices))
    if not candidates:
        raise PlacerError(f"machine {problem.machine.name!r} has no {kind} device")
    finite = np.where(np.isfinite(problem.op_time_s), problem.op_time_s, 0.0)
    disallowed = (~problem.op_allowed).sum(axis=0)  # fewer ops forced elsewhere wins a tie
    return sorted(candidates, key=lambda d: (float(finite[:, d].sum()), int(disallowed[d]), d))


def single_device_units(problem: PlacementProblem, device: int) -> np.ndarray:
    """(U,) every unit on ``device``, except units that may not run there."""
    if not 0 <= device < problem.num_devices:
        raise PlacerError(f"device {device} is out of range for machine {problem.machine.name!r} "
                          f"({problem.num_devices} devices)")
    return problem.repair_allowed(np.full(problem.num_units, device, dtype=np.int64))


@dataclass
class SingleDevicePolicy:
    """Everything on one given device (``device:K`` on the command line)."""
    device: int = 0
    name: str = ""

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        units = single_device_units(problem, self.device)
        return finish(self.name or f"device:{self.device}", problem, units, clock, measurer, on_measurement)


@dataclass
class SingleGpuPolicy:
    """Everything on the GPU the cost model says is fastest (the papers' "1 GPU" column)."""
    name: str = "single-gpu"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        device = best_single_device(problem, "gpu")
        units = single_device_units(problem, device)
        return finish(self.name, problem, units, clock, measurer, on_measurement,
                      notes=f"device {problem.machine.devices[device].name}")


@dataclass
class CpuOnlyPolicy:
    """Everything on the (fastest) CPU: the papers' "1 CPU" column."""
    name: str = "cpu-only"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        device = best_single_device(problem, "cpu")
        return finish(self.name, problem, single_device_units(problem, device), clock, measurer, on_measurement)


@dataclass
class RoundRobinPolicy:
    """Units in topological order (of their first op) dealt to the GPUs in turn."""
    name: str = "round-robin"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        gpus = problem.gpu_indices() or list(range(problem.num_devices))
        order = units_in_topological_order(problem)
        units = np.empty(problem.num_units, dtype=np.int64)
        units[order] = np.asarray(gpus, dtype=np.int64)[np.arange(len(order)) % len(gpus)]
        return finish(self.name, problem, problem.repair_allowed(units), clock, measurer, on_measurement)


def units_in_topological_order(problem: PlacementProblem) -> np.ndarray:
    """(U,) unit ids sorted by the topological position of their first op."""
    first = np.full(problem.num_units, np.iinfo(np.int64).max)
    np.minimum.at(first, problem.op_unit, problem.graph.topo_position)
    return np.argsort(first, kind="stable")
