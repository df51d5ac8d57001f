"""The Ray actor that holds one measurer on one node and measures chunks of placements.

The actor builds its measurer once (from a factory shipped through the object store) and answers
``measure(placements)`` with a ``ChunkOutcome``. It never raises for a bad placement: a measurer that
breaks the protocol by raising is retried placement by placement, so only the culprit gets ``error``.
Faults the actor cannot report itself (its process dies, it hangs) are the pool's business.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import ray

from measurers.base import Measurement
from measurers.factory import MeasurerFactory


@dataclass(frozen=True)
class ActorInfo:
    actor_id: str  # Ray's hex actor id
    node_id: str  # Ray's hex node id
    gpu_ids: tuple[str, ...]  # what ray.get_gpu_ids() gives this actor
    cuda_visible_devices: str  # as Ray set it for the process ("" when unset)
    pid: int
    omp_num_threads: str = ""  # OMP_NUM_THREADS in the actor's process: the threads its CPU ops get


@dataclass(frozen=True)
class ChunkOutcome:
    measurements: tuple[Measurement, ...]  # one per placement, in order
    started_at: float  # wall clock (time.time()) on the actor's node when the chunk began
    finished_at: float  # ... and when it ended


def error_measurement(message: str, measure_s: float = 0.0, status: str = "error") -> Measurement:
    """A failed measurement whose runtime is unknown."""
    return Measurement(float("nan"), (), status, (), measure_s, message)


class MeasurerActor:
    """Plain class; ``remote_actor_class()`` wraps it for Ray (so it also runs in-process in tests)."""

    def __init__(self, factory: MeasurerFactory):
        self._measurer = factory()
        context = ray.get_runtime_context()
        self._info = ActorInfo(
            actor_id=context.get_actor_id() or "",
            node_id=context.get_node_id(),
            gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            pid=os.getpid(),
            omp_num_threads=os.environ.get("OMP_NUM_THREADS", ""),
        )

    def info(self) -> ActorInfo:
        return self._info

    def ready(self) -> ActorInfo:
        """Build the measurer's step now (a real measurer's capture or trace, which its first measurement
        made inside that placement's time limit: a build longer than the limit timed out every placement,
        each on a fresh actor that began the build again), then say who this actor is. A step that fails to
        build is left to the measurements, which report it as their status, as before."""
        build = getattr(self._measurer, "check_ready", None)
        if build is not None:
            try:
                build()
            except Exception:  # noqa: BLE001  (each measurement meets it again and reports it)
                pass
        return self._info

    def measure(self, placements: Sequence[np.ndarray] | np.ndarray) -> ChunkOutcome:
        """``placements``: (B, N) array in any integer type (the pool narrows it for the trip), or a list."""
        started_at = time.time()
        if isinstance(placements, np.ndarray):
            placements = placements.astype(np.int64)  # (B, N): measurers get int64 rows, as the protocol says
        try:
            measurements = tuple(self._measurer.measure(placements))
            if len(measurements) != len(placements):
                raise RuntimeError(f"measurer returned {len(measurements)} results for {len(placements)} "
                                   f"placements")
        except Exception:
            measurements = tuple(self._measure_one(p) for p in placements) if len(placements) > 1 else (
                error_measurement(_short_traceback(), time.time() - started_at),)
        return ChunkOutcome(measurements, started_at, time.time())

    def _measure_one(self, placement: np.ndarray) -> Measurement:
        t0 = time.perf_counter()
        try:
            (measurement,) = self._measurer.measure([placement])
            return measurement
        except Exception:
            return error_measurement(_short_traceback(), time.perf_counter() - t0)


def _short_traceback(limit_chars: int = 2000) -> str:
    text = traceback.format_exc()
    return text if len(text) <= limit_chars else "..." + text[-limit_chars:]


_REMOTE_CLASS = None


def remote_actor_class():
    """MeasurerActor as a Ray actor class: no restarts (the pool replaces actors itself), one call at a
    time (calls run in submission order, so the oldest unfinished call is the one running)."""
    global _REMOTE_CLASS
    if _REMOTE_CLASS is None:
        _REMOTE_CLASS = ray.remote(max_restarts=0, max_task_retries=0)(MeasurerActor)
    return _REMOTE_CLASS
