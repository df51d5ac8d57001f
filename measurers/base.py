"""The measurer protocol every way of timing a placement implements.

A measurer is bound once to (graph, machine, settings) and then answers ``measure(placements)``, where
each placement is an (N,) int array giving every op's device index on that machine. Example::

    class ConstantMeasurer:
        def __init__(self, graph, machine, runtime_s=1.0):
            self.graph, self.machine, self.runtime_s = graph, machine, runtime_s

        def measure(self, placements):
            return [Measurement(self.runtime_s, (self.runtime_s,), "ok", (0,) * self.machine.num_devices, 0.0)
                    for _ in placements]
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from graphs.errors import PlacerError

STATUSES = ("ok", "oom", "error", "timeout", "crash")


@dataclass(frozen=True)
class Measurement:
    runtime_s: float  # median step time over the timed samples (still set for oom when it is known)
    samples_s: tuple[float, ...]  # every timed sample, in order
    status: str  # one of STATUSES
    peak_bytes: tuple[int, ...]  # per device, in the machine's device order
    measure_s: float  # wall time the measurement itself took
    error: str = ""  # what went wrong, where something did

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def failed_measurement(status: str, peak_bytes: Sequence[int], began_s: float, error: str) -> Measurement:
    """A measurement that produced no step time (``oom``, ``error``...): ``began_s`` is when it started
    (``time.perf_counter()``), ``peak_bytes`` per device (zeros where nothing was counted)."""
    return Measurement(float("inf"), (), status, tuple(peak_bytes), time.perf_counter() - began_s, error)


def rebuild_step_now(rebuild: Callable[[], object]) -> None:
    """Rebuild a real measurer's step now (``rebuild``: its cached capture or trace): one it cannot rebuild
    (its spec's file gone) raises its PlacerError here, for a caller that measures in this process; a
    failure of the user's own step is left to the measurement, which reports it as its status."""
    try:
        rebuild()
    except PlacerError:
        raise
    except Exception:  # noqa: BLE001  (the user's step failed: measured as an ``error``)
        pass


class Measurer(Protocol):
    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        """One Measurement per placement, in order; failures are statuses, never exceptions."""
