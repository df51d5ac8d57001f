"""The simulator as a Measurer: the embedded default for searches, tests and baseline comparisons.

Each placement is simulated once (the simulator is deterministic); ``runs`` samples are then drawn from a
multiplicative noise model, ``sample = runtime_s * exp(noise_std * z)`` with ``z ~ N(0, 1)`` from a
generator seeded with ``seed`` and the placement's bytes, and the reported runtime is their median. The
noise of a placement therefore does not depend on which measurer (or pool actor) drew it, nor when. With
``noise_std = 0`` (the default) every sample equals the simulated time. A placement that fails the checks
(wrong length, unknown device, a device kind an op may not use) is a Measurement with status "error";
``measure`` never raises for a bad placement.

Example::

    measurer = SimulatorMeasurer(graph, load_machine("paper-4gpu"), runs=5, noise_std=0.02, seed=1)
    [m.runtime_s for m in measurer.measure([placement_a, placement_b])]
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError, is_whole_number
from graphs.opgraph import OpGraph
from measurers.base import Measurement
from measurers.sim.costs import OpProfile
from measurers.machine import Machine
from measurers.sim.reference import Simulator
from measurers.timing import SIM_TIMING, check_noise_std


class SimulatorMeasurer:
    def __init__(self, graph: OpGraph, machine: Machine, *, runs: int = SIM_TIMING.runs, noise_std: float = 0.0, seed: int = 0,
                 profile: OpProfile | str | None = None, engine: str = "fast"):
        if not is_whole_number(runs) or runs < 1:
            raise PlacerError(f"runs must be a whole number of at least 1, got {runs!r}")
        check_noise_std(noise_std, "noise_std")
        if not is_whole_number(seed) or seed < 0:
            raise PlacerError(f"seed must be a whole number >= 0, got {seed!r}")
        self.graph, self.machine, self.runs, self.noise_std = graph, machine, runs, noise_std
        self.simulator = Simulator(graph, machine, profile=profile, engine=engine)
        self.seed = int(seed)

    @property
    def lower_bound_s(self) -> float:
        return self.simulator.lower_bound_s

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        return [self._measure_one(placement) for placement in placements]

    def _noise_rng(self, placement) -> np.random.Generator:
        digest = hashlib.blake2b(np.ascontiguousarray(placement, dtype=np.int64).tobytes(), digest_size=8).digest()
        return np.random.default_rng([self.seed, int.from_bytes(digest, "little")])

    def _measure_one(self, placement) -> Measurement:
        began = time.perf_counter()
        try:
            result = self.simulator.run(placement)
        except PlacerError as exc:
            return Measurement(math.inf, (), "error", (0,) * self.machine.num_devices,
                               time.perf_counter() - began, error=str(exc))
        samples = np.full(self.runs, result.runtime_s)
        if self.noise_std > 0:
            samples = samples * np.exp(self.noise_std * self._noise_rng(placement).standard_normal(self.runs))
        return Measurement(float(np.median(samples)), tuple(float(s) for s in samples), result.status,
                           tuple(int(b) for b in result.peak_bytes), time.perf_counter() - began)
