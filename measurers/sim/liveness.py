"""Which buffers a device holds at its memory peak, read back from a simulated timeline.

The simulator reports each device's peak (``SimResult.peak_bytes``), not what makes it up. ``buffers_on``
rebuilds a device's buffers from the timeline with the simulator's rules (reference.py, "Memory"): an op's
output lives on its device from the op's start until its last use there ends (a reader on the device, or a
transfer sending it away; the op's own end when nothing uses it); a received copy lives from its transfer's
start until its last reader on the receiving device ends. Parameters are resident and are not buffers.
``peak_moment`` sweeps them (at one instant the frees first, as the simulator processes events, but those
by 0 s work started then last) and ``live_at`` says which are live then. The memory repair
(policies/spill.py) moves the ops that hold them.
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
    freed_late: np.ndarray  # (B,) bool: by work that started at ``free_s`` (it ends in a later round of it)
    resident_bytes: int  # the device's parameters, resident for the whole step


def buffers_on(graph: OpGraph, alloc_bytes: np.ndarray, timeline: Timeline, device: int) -> DeviceBuffers:
    """The buffers of ``device`` in the step ``timeline`` records; ``alloc_bytes``: (N,) output bytes an op
    allocates (``measurers.sim.reference.output_alloc_bytes``)."""
    on = timeline.op_device == device  # (N,)
    src, dst = graph.edge_src, graph.edge_dst
    own = np.flatnonzero(on & (alloc_bytes > 0))
    local, sent = on[src] & on[dst], timeline.transfer_src == device
    own_free_s, own_late = _last_use(  # the op itself, its readers here and its transfers away
        np.concatenate([own, src[local], timeline.transfer_op[sent]]), graph.num_ops,
        np.concatenate([timeline.op_start_s[own], timeline.op_start_s[dst[local]], timeline.transfer_start_s[sent]]),
        np.concatenate([timeline.op_end_s[own], timeline.op_end_s[dst[local]], timeline.transfer_end_s[sent]]))

    received = np.flatnonzero(timeline.transfer_dst == device)
    copy_of = np.full(graph.num_ops, -1, dtype=np.int64)  # producer op -> its copy's index in ``received``
    copy_of[timeline.transfer_op[received]] = np.arange(len(received))
    remote = on[dst] & ~on[src]
    copy_free_s, copy_late = _last_use(copy_of[src[remote]], len(received), timeline.op_start_s[dst[remote]],
                                       timeline.op_end_s[dst[remote]])
    return DeviceBuffers(
        device=device, producer=np.concatenate([own, timeline.transfer_op[received]]).astype(np.int64),
        nbytes=np.concatenate([alloc_bytes[own], timeline.transfer_bytes[received]]).astype(np.int64),
        alloc_s=np.concatenate([timeline.op_start_s[own], timeline.transfer_start_s[received]]),
        free_s=np.concatenate([own_free_s[own], copy_free_s]),
        freed_late=np.concatenate([own_late[own], copy_late]),
        resident_bytes=int(graph.param_bytes[on].sum()))


def _last_use(key: np.ndarray, size: int, start_s: np.ndarray, end_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((size,) when the last use of each key ends, (size,) whether a use ending then also started then)."""
    free_s = np.full(size, -np.inf)
    np.maximum.at(free_s, key, end_s)
    late = np.zeros(size, dtype=bool)
    late[key[(end_s == free_s[key]) & (start_s == end_s)]] = True
    return free_s, late


def peak_moment(buffers: DeviceBuffers) -> tuple[float, int]:
    """(the first instant the device's memory is at its largest, those bytes); (0.0, resident) without
    buffers. At one instant the frees come first, then the allocations, then the frees by work that started
    then (a 0 s op): exact but where such work chains at one instant (then it may count a few too many)."""
    times = np.concatenate([buffers.alloc_s, buffers.free_s])
    delta = np.concatenate([buffers.nbytes, -buffers.nbytes])
    rank = np.concatenate([np.ones(len(delta) // 2), np.where(buffers.freed_late, 2, 0)])
    order = np.lexsort((rank, times))
    if not len(order):
        return 0.0, buffers.resident_bytes
    held = buffers.resident_bytes + np.cumsum(delta[order])
    at = int(np.argmax(held))
    return float(times[order][at]), int(held[at])


def live_at(buffers: DeviceBuffers, time_s: float) -> np.ndarray:
    """(B,) bool: the buffers allocated by ``time_s`` and not yet freed at it. One that work started at
    ``time_s`` frees (``freed_late``) is still live then, as ``peak_moment`` counts it: at ``peak_moment``'s
    instant the live buffers add up to its peak."""
    freed_after = (buffers.free_s > time_s) | (buffers.freed_late & (buffers.free_s == time_s))
    return (buffers.alloc_s <= time_s) & freed_after
