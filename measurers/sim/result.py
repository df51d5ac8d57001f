"""What the simulator returns: the step's result and, on request, its timeline (both engines build these)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timeline:
    """Every op's device, start and end, every transfer, and every buffer's allocation and free, in seconds
    from the step's start.

    Buffers (reference.py, "Memory"): op i's output is buffer i, transfer k's received copy is buffer N + k.
    The simulator changes memory in rounds: round r frees the buffers whose last use ended at ``round_s[r]``,
    then allocates those of the work starting then. Work of 0 s ends in a later round of the instant it
    started in, so several rounds can share an instant; round 0 (at 0 s) frees nothing.
    """

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
    buffer_bytes: np.ndarray  # (N+T,) int64: 0 for an op whose output is its resident parameter (a Variable)
    buffer_alloc_round: np.ndarray  # (N+T,) int64: the round allocating it (its op's or transfer's start)
    buffer_free_round: np.ndarray  # (N+T,) int64: the round freeing it (its last use's end)
    round_s: np.ndarray  # (R,) float64: each round's instant, nondecreasing

    @property
    def buffer_op(self) -> np.ndarray:
        """(N+T,) int64: the op whose output the buffer holds."""
        return np.concatenate([np.arange(len(self.op_device), dtype=np.int64), self.transfer_op])

    @property
    def buffer_device(self) -> np.ndarray:
        """(N+T,) int64: the device holding the buffer."""
        return np.concatenate([self.op_device, self.transfer_dst])

    @property
    def buffer_alloc_s(self) -> np.ndarray:
        """(N+T,) float64: when the buffer is allocated."""
        return self.round_s[self.buffer_alloc_round]

    @property
    def buffer_free_s(self) -> np.ndarray:
        """(N+T,) float64: when the buffer is freed."""
        return self.round_s[self.buffer_free_round]


@dataclass(frozen=True)
class SimResult:
    runtime_s: float  # step time: the last op's end
    status: str  # "ok" | "oom"
    busy_s: np.ndarray  # (D,) float64: compute time per device
    peak_bytes: np.ndarray  # (D,) int64
    capacity_bytes: np.ndarray  # (D,) int64: each device's memory_bytes
    link_bytes: np.ndarray  # (L,) int64: bytes moved per machine.links entry
    timeline: Timeline | None = None
