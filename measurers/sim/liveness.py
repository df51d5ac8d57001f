"""Which buffers a device holds at its memory peak, read from a simulated timeline.

The simulator reports each device's peak (``SimResult.peak_bytes``), not what makes it up; with a timeline it
also records every buffer it allocates and frees, and the round of each (``result.Timeline``: the order it
changes memory in, several rounds at one instant where work takes 0 s). ``buffers_on`` selects a device's
buffers: its ops' outputs (not a Variable's, which is its resident parameter) and the copies it receives.
``peak_moment`` replays them in the simulator's order (its peak, exactly) and ``live_at`` says which are live
then. The memory repair (policies/spill.py) moves the ops that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.opgraph import OpGraph
from measurers.sim.result import Timeline


@dataclass(frozen=True)
class DeviceBuffers:
    """One device's buffers over a step: the producer op of each, its bytes and when it lives."""

    device: int
    producer: np.ndarray  # (B,) int64 op whose output it is (its own output or a received copy of it)
    nbytes: np.ndarray  # (B,) int64
    alloc_s: np.ndarray  # (B,) float64: allocated at
    free_s: np.ndarray  # (B,) float64: freed at
    alloc_round: np.ndarray  # (B,) int64: the simulator's round allocating it (``Timeline.buffer_alloc_round``)
    free_round: np.ndarray  # (B,) int64: the round freeing it (later than ``alloc_round``)
    resident_bytes: int  # the device's parameters, resident for the whole step


def buffers_on(graph: OpGraph, timeline: Timeline, device: int) -> DeviceBuffers:
    """The buffers of ``device`` in the step ``timeline`` records: its ops' outputs of positive bytes, then
    the copies it receives (in transfer order)."""
    is_copy = np.arange(len(timeline.buffer_bytes)) >= graph.num_ops  # (N+T,)
    held = np.flatnonzero((timeline.buffer_device == device) & (is_copy | (timeline.buffer_bytes > 0)))
    return DeviceBuffers(
        device=device, producer=timeline.buffer_op[held], nbytes=timeline.buffer_bytes[held],
        alloc_s=timeline.buffer_alloc_s[held], free_s=timeline.buffer_free_s[held],
        alloc_round=timeline.buffer_alloc_round[held], free_round=timeline.buffer_free_round[held],
        resident_bytes=int(graph.param_bytes[timeline.op_device == device].sum()))


def _round_ends(buffers: DeviceBuffers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The device's memory after each round that changes it, replaying the buffers' rounds: ((K,) rounds,
    (K,) their instants, (K,) bytes held then). A round frees before it allocates, so its end is its fullest."""
    rounds = np.concatenate([buffers.free_round, buffers.alloc_round])
    order = np.argsort(rounds, kind="stable")
    rounds = rounds[order]
    held = buffers.resident_bytes + np.cumsum(np.concatenate([-buffers.nbytes, buffers.nbytes])[order])
    end = np.flatnonzero(np.append(rounds[1:] != rounds[:-1], True)) if len(rounds) else rounds
    return rounds[end], np.concatenate([buffers.free_s, buffers.alloc_s])[order][end], held[end]


def peak_moment(buffers: DeviceBuffers) -> tuple[float, int]:
    """(the first instant the device's memory is at its largest, those bytes: the simulator's peak);
    (0.0, resident) without buffers."""
    _, times_s, held = _round_ends(buffers)
    if not len(held):
        return 0.0, buffers.resident_bytes
    at = int(np.argmax(held))
    return float(times_s[at]), int(held[at])


def live_at(buffers: DeviceBuffers, time_s: float) -> np.ndarray:
    """(B,) bool: the buffers live at ``time_s``; where the device's memory changes in several rounds of that
    instant (work of 0 s), those live after the fullest (the first of them): at ``peak_moment``'s instant the
    live buffers add up to its peak."""
    rounds, times_s, held = _round_ends(buffers)
    upto = np.flatnonzero(times_s <= time_s)
    if not len(upto):
        return np.zeros(len(buffers.nbytes), dtype=bool)
    then = upto[times_s[upto] == time_s]
    at = then[np.argmax(held[then])] if len(then) else upto[-1]
    return (buffers.alloc_round <= rounds[at]) & (buffers.free_round > rounds[at])
