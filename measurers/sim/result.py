"""What the simulator returns: the step's result and, on request, its timeline (both engines build these)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timeline:
    """Every op's device, start and end, and every transfer, in seconds from the step's start."""

    op_device: np.ndarray  # (N,) int64
    op_start_s: np.ndarray  # (N,) float64
    op_end_s: np.ndarray  # (N,) float64
    transfer_op: np.ndarray  # (T,) int64: producer op
    transfer_src: np.ndarray  # (T,) int64: device index
    transfer_dst: np.ndarray  # (T,) int64: device index
    transfer_link: np.ndarray  # (T,) int64: index into machine.links
    transfer_bytes: np.ndarray  # (T,) int64
    transfer_start_s: np.ndarray  # (T,) float64
    transfer_end_s: np.ndarray  # (T,) float64


@dataclass(frozen=True)
class SimResult:
    runtime_s: float  # step time: the last op's end
    status: str  # "ok" | "oom"
    busy_s: np.ndarray  # (D,) float64: compute time per device
    peak_bytes: np.ndarray  # (D,) int64
    capacity_bytes: np.ndarray  # (D,) int64: each device's memory_bytes
    link_bytes: np.ndarray  # (L,) int64: bytes moved per machine.links entry
    timeline: Timeline | None = None
