"""The fast engine: ``simulate_reference``'s algorithm compiled with numba, bit-identical results.

Differences are only in bookkeeping, never in arithmetic (every time is ``start + duration`` and every
transfer takes ``latency_s + bytes / bandwidth_Bps``, evaluated in the same order; numba runs without
fastmath):

- Ops are relabelled by topological position once per graph, so "earlier in topological order" is
  "smaller id".
- A ready op's priority (ready time, position) is one int64 ``rank << bits | op``, where ``rank`` counts
  the distinct event times passed so far (it grows exactly when time grows), so per-device ready queues are
  binary heaps of int64 in one shared array; channel queues likewise with ``rank << bits | transfer``
  (transfers are numbered in (producer position, destination device) order).
- Only devices and channels that changed in the last batch of events are offered new work (an idle device
  with queued work cannot exist after a dispatch, so this starts the same work as scanning them all).
- Pending events live in a heap of at most one per device and one per channel. Work that becomes ready
  at an instant is collected first and queued in one place, so each heap operation is written once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphs.opgraph import OpGraph
from measurers.machine import Machine


class FastSimulator:
    """Graph and machine arrays prepared once; ``run`` costs one compiled call per placement."""

    def __init__(self, graph: OpGraph, machine: Machine, op_time_s: np.ndarray, alloc_bytes: np.ndarray):
        self.graph, self.machine = graph, machine
        self.order = graph.topo_order  # (N,) op at each topological position
        position = np.empty(graph.num_ops, dtype=np.int64)
        position[self.order] = np.arange(graph.num_ops, dtype=np.int64)
        src, dst = position[graph.edge_src], position[graph.edge_dst]  # (E,) relabelled
        identity = np.array_equal(self.order, np.arange(graph.num_ops))
        by_src = np.arange(len(src)) if identity else np.lexsort((dst, src))  # graph edges are (src, dst) sorted
        self.succ_dst = np.ascontiguousarray(dst[by_src])  # (E,)
        self.succ_bytes = np.ascontiguousarray(graph.edge_bytes[by_src])  # (E,)
        self.succ_off = _offsets(src[by_src], graph.num_ops)  # (N+1,)
        by_dst = np.argsort(self.succ_dst, kind="stable")  # in-edges, as ids into the succ arrays
        self.pred_eid = by_dst.astype(np.int64)  # (E,)
        self.pred_src = np.ascontiguousarray(src[by_src][by_dst])  # (E,)
        self.pred_off = _offsets(self.succ_dst[by_dst], graph.num_ops)  # (N+1,)
        self.op_time_s = np.ascontiguousarray(op_time_s[self.order])  # (N, D)
        self.alloc_bytes = np.ascontiguousarray(alloc_bytes[self.order])  # (N,)
        self.param_bytes = np.ascontiguousarray(graph.param_bytes[self.order])  # (N,)
        num_devices = machine.num_devices
        self.link_of = np.full((num_devices, num_devices), -1, dtype=np.int64)  # (D, D)
        for k, link in enumerate(machine.links):
            self.link_of[machine.device_index(link.src), machine.device_index(link.dst)] = k
        channels = sorted({link.channel for link in machine.links})
        self.link_channel = np.array([channels.index(l.channel) for l in machine.links], dtype=np.int64)  # (L,)
        self.link_latency_s = np.array([l.latency_s for l in machine.links], dtype=np.float64)  # (L,)
        self.link_bandwidth_Bps = np.array([l.bandwidth_Bps for l in machine.links], dtype=np.float64)  # (L,)
        self.num_channels = len(channels)
        self.capacity_bytes = np.array([d.memory_bytes for d in machine.devices], dtype=np.int64)  # (D,)

    def run(self, placement: np.ndarray, want_timeline: bool = False):
        from measurers.simulator import SimResult, Timeline

        p = np.ascontiguousarray(placement[self.order], dtype=np.int64)  # (N,) relabelled
        plan = _plan_transfers(p, self.succ_off, self.succ_dst, self.succ_bytes, self.machine.num_devices)
        x_off, x_dst, x_bytes, edge_xfer, own_uses, copy_uses = plan
        out = _simulate(p, self.op_time_s, self.alloc_bytes, self.param_bytes, self.succ_off, self.succ_dst,
                        self.pred_off, self.pred_src, self.pred_eid, x_off, x_dst, x_bytes, edge_xfer, own_uses,
                        copy_uses, self.link_of, self.link_channel, self.link_latency_s, self.link_bandwidth_Bps,
                        self.num_channels)
        runtime_s, busy_s, peak_bytes, link_bytes, start_s, end_s, x_start_s, x_end_s = out
        timeline = None
        if want_timeline:
            x_op_relabelled = np.repeat(np.arange(len(p)), np.diff(x_off))
            op_start, op_end = np.empty_like(start_s), np.empty_like(end_s)
            op_start[self.order], op_end[self.order] = start_s, end_s
            x_src = p[x_op_relabelled]
            timeline = Timeline(
                op_device=np.asarray(placement, dtype=np.int64).copy(), op_start_s=op_start, op_end_s=op_end,
                transfer_op=self.order[x_op_relabelled].astype(np.int64), transfer_src=x_src,
                transfer_dst=x_dst, transfer_link=self.link_of[x_src, x_dst], transfer_bytes=x_bytes,
                transfer_start_s=x_start_s, transfer_end_s=x_end_s)
        return SimResult(runtime_s=float(runtime_s), status="oom" if np.any(peak_bytes > self.capacity_bytes) else "ok",
                         busy_s=busy_s, peak_bytes=peak_bytes, capacity_bytes=self.capacity_bytes.copy(),
                         link_bytes=link_bytes, timeline=timeline)


def warm_up() -> float:
    """Load (or compile) the compiled functions by simulating a 2-op graph; returns the seconds it took."""
    import time

    began = time.perf_counter()
    one = np.ones(1, dtype=np.int64)
    p, succ_off, succ_dst = np.array([0, 1]), np.array([0, 1, 1]), one.copy()
    x_off, x_dst, x_bytes, edge_xfer, own_uses, copy_uses = _plan_transfers(p, succ_off, succ_dst, one, 2)
    link_of = np.array([[-1, 0], [1, -1]])
    _simulate(p, np.ones((2, 2)), np.ones(2, dtype=np.int64), np.zeros(2, dtype=np.int64), succ_off, succ_dst,
              np.array([0, 0, 1]), np.array([0]), np.array([0]), x_off, x_dst, x_bytes, edge_xfer, own_uses,
              copy_uses, link_of, np.array([0, 0]), np.ones(2), np.ones(2), 1)
    return time.perf_counter() - began


def _offsets(sorted_keys: np.ndarray, n: int) -> np.ndarray:
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(sorted_keys, minlength=n), out=offsets[1:])
    return offsets


@njit(cache=True)
def _plan_transfers(p, succ_off, succ_dst, succ_bytes, num_devices):
    """Transfers of a placement, numbered by (producer, destination device); per-edge transfer ids; uses."""
    n, num_edges = len(p), len(succ_dst)
    x_off = np.zeros(n + 1, dtype=np.int64)  # transfers of op u: x_off[u]:x_off[u+1]
    x_dst = np.empty(num_edges, dtype=np.int64)
    x_bytes = np.empty(num_edges, dtype=np.int64)
    edge_xfer = np.full(num_edges, -1, dtype=np.int64)
    own_uses = np.zeros(n, dtype=np.int64)
    copy_uses = np.zeros(num_edges, dtype=np.int64)
    mark = np.full(num_devices, -1, dtype=np.int64)
    size = np.zeros(num_devices, dtype=np.int64)
    kid = np.zeros(num_devices, dtype=np.int64)
    count = 0
    for u in range(n):
        pu, remote = p[u], False
        for e in range(succ_off[u], succ_off[u + 1]):
            d = p[succ_dst[e]]
            if d == pu:
                own_uses[u] += 1
            elif mark[d] != u:
                mark[d], size[d], remote = u, succ_bytes[e], True
            elif succ_bytes[e] > size[d]:
                size[d] = succ_bytes[e]
        if remote:
            for d in range(num_devices):
                if mark[d] == u:
                    kid[d], x_dst[count], x_bytes[count] = count, d, size[d]
                    count += 1
                    own_uses[u] += 1
            for e in range(succ_off[u], succ_off[u + 1]):
                d = p[succ_dst[e]]
                if d != pu:
                    edge_xfer[e] = kid[d]
                    copy_uses[kid[d]] += 1
        x_off[u + 1] = count
    return x_off, x_dst[:count].copy(), x_bytes[:count].copy(), edge_xfer, own_uses, copy_uses[:count].copy()


@njit(cache=True)
def _simulate(p, op_time_s, alloc_bytes, param_bytes, succ_off, succ_dst, pred_off, pred_src, pred_eid, x_off,
              x_dst, x_bytes, edge_xfer, own_uses, copy_uses, link_of, link_channel, link_latency_s,
              link_bandwidth_Bps, num_channels):
    """The event loop. "Entities" are the devices (0..D-1), then the channels (D..D+C-1); each has a queue
    (ready ops, or requested transfers) kept as a binary heap in its own segment of ``q_keys``. The heap code
    is written out once per operation, not called: numba reference-counts array arguments of calls, which
    would cost more than the heap itself."""
    n, num_devices, num_transfers = len(p), link_of.shape[0], len(x_dst)
    op_bits, x_bits = _bits(n), _bits(num_transfers)  # key = rank << bits | id
    num_ent = num_devices + num_channels
    x_op = np.empty(num_transfers, dtype=np.int64)
    x_link = np.empty(num_transfers, dtype=np.int64)
    q_base = np.zeros(num_ent + 1, dtype=np.int64)  # queue segment of each entity
    for u in range(n):
        q_base[p[u] + 1] += 1
        for k in range(x_off[u], x_off[u + 1]):
            x_op[k], x_link[k] = u, link_of[p[u], x_dst[k]]
            q_base[num_devices + link_channel[x_link[k]] + 1] += 1
    for e in range(num_ent):
        q_base[e + 1] += q_base[e]
    q_keys, q_size = np.empty(max(q_base[num_ent], 1), dtype=np.int64), np.zeros(num_ent, dtype=np.int64)
    pend_ent, pend_key = np.empty(n + num_transfers, dtype=np.int64), np.empty(n + num_transfers, dtype=np.int64)
    ev_time, ev_ent, ev_size = np.empty(num_ent, dtype=np.float64), np.empty(num_ent, dtype=np.int64), 0
    dirty, is_dirty = np.empty(num_ent, dtype=np.int64), np.zeros(num_ent, dtype=np.bool_)
    running = np.full(num_ent, -1, dtype=np.int64)  # op per device, transfer per channel
    memory = np.zeros(num_devices, dtype=np.int64)
    busy_s = np.zeros(num_devices, dtype=np.float64)
    link_bytes = np.zeros(len(link_channel), dtype=np.int64)
    start_s, end_s = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.float64)
    x_start_s, x_end_s = np.zeros(num_transfers, dtype=np.float64), np.zeros(num_transfers, dtype=np.float64)
    waiting = np.empty(n, dtype=np.int64)
    num_pend, num_dirty = 0, 0
    for v in range(n):
        memory[p[v]] += param_bytes[v]
        waiting[v] = pred_off[v + 1] - pred_off[v]
        if waiting[v] == 0:
            pend_ent[num_pend], pend_key[num_pend] = p[v], v
            num_pend += 1
    peak = memory.copy()
    now, rank = 0.0, 0
    while True:
        for i in range(num_pend):  # queue what became ready or was requested at this instant
            ent, key = pend_ent[i], pend_key[i]
            base, j = q_base[ent], q_size[ent]
            q_size[ent] += 1
            while j > 0 and q_keys[base + ((j - 1) >> 1)] > key:  # heap push: sift up
                q_keys[base + j] = q_keys[base + ((j - 1) >> 1)]
                j = (j - 1) >> 1
            q_keys[base + j] = key
            if not is_dirty[ent]:
                dirty[num_dirty], is_dirty[ent] = ent, True
                num_dirty += 1
        num_pend = 0
        for i in range(num_dirty):  # idle entities that changed start their first queued item
            ent = dirty[i]
            is_dirty[ent] = False
            if running[ent] >= 0 or q_size[ent] == 0:
                continue
            base = q_base[ent]
            top = q_keys[base]  # heap pop: move the last key down from the root
            q_size[ent] -= 1
            size, last, j = q_size[ent], q_keys[base + q_size[ent]], 0
            while 2 * j + 1 < size:
                child = 2 * j + 1
                if child + 1 < size and q_keys[base + child + 1] < q_keys[base + child]:
                    child += 1
                if q_keys[base + child] >= last:
                    break
                q_keys[base + j] = q_keys[base + child]
                j = child
            q_keys[base + j] = last
            if ent < num_devices:  # op v starts on device ent
                v = top & ((1 << op_bits) - 1)
                running[ent] = v
                start_s[v], end_s[v] = now, now + op_time_s[v, ent]
                busy_s[ent] += op_time_s[v, ent]
                memory[ent] += alloc_bytes[v]
                peak[ent] = max(peak[ent], memory[ent])
                end = end_s[v]
            else:  # transfer k starts on channel ent - D
                k = top & ((1 << x_bits) - 1)
                running[ent] = k
                link, d = x_link[k], x_dst[k]
                x_start_s[k], x_end_s[k] = now, now + (link_latency_s[link] + x_bytes[k] / link_bandwidth_Bps[link])
                link_bytes[link] += x_bytes[k]
                memory[d] += x_bytes[k]
                peak[d] = max(peak[d], memory[d])
                end = x_end_s[k]
            j = ev_size  # event heap push
            ev_size += 1
            while j > 0 and ev_time[(j - 1) >> 1] > end:
                ev_time[j], ev_ent[j] = ev_time[(j - 1) >> 1], ev_ent[(j - 1) >> 1]
                j = (j - 1) >> 1
            ev_time[j], ev_ent[j] = end, ent
        num_dirty = 0
        if ev_size == 0:
            break
        if ev_time[0] > now:
            now, rank = ev_time[0], rank + 1
        while ev_size > 0 and ev_time[0] == now:  # every event at this instant, before anything starts
            ent = ev_ent[0]  # event heap pop
            ev_size -= 1
            last_t, last_e, j = ev_time[ev_size], ev_ent[ev_size], 0
            while 2 * j + 1 < ev_size:
                child = 2 * j + 1
                if child + 1 < ev_size and ev_time[child + 1] < ev_time[child]:
                    child += 1
                if ev_time[child] >= last_t:
                    break
                ev_time[j], ev_ent[j] = ev_time[child], ev_ent[child]
                j = child
            ev_time[j], ev_ent[j] = last_t, last_e
            dirty[num_dirty], is_dirty[ent] = ent, True  # an entity has at most one event
            num_dirty += 1
            if ent < num_devices:  # op v ends on device d
                v, d = running[ent], ent
                running[ent] = -1
                for i in range(pred_off[v], pred_off[v + 1]):  # its inputs have one use fewer
                    u = pred_src[i]
                    if p[u] == d:
                        own_uses[u] -= 1
                        if own_uses[u] == 0:
                            memory[d] -= alloc_bytes[u]
                    else:
                        k = edge_xfer[pred_eid[i]]
                        copy_uses[k] -= 1
                        if copy_uses[k] == 0:
                            memory[d] -= x_bytes[k]
                if own_uses[v] == 0:
                    memory[d] -= alloc_bytes[v]
                for k in range(x_off[v], x_off[v + 1]):
                    pend_ent[num_pend], pend_key[num_pend] = num_devices + link_channel[x_link[k]], (rank << x_bits) | k
                    num_pend += 1
                u = v
            else:  # transfer k of op u arrives on device d
                k = running[ent]
                running[ent] = -1
                u, d = x_op[k], x_dst[k]
                own_uses[u] -= 1
                if own_uses[u] == 0:
                    memory[p[u]] -= alloc_bytes[u]
            for i in range(succ_off[u], succ_off[u + 1]):  # u's output is now present on device d
                w = succ_dst[i]
                if p[w] == d:
                    waiting[w] -= 1
                    if waiting[w] == 0:
                        pend_ent[num_pend], pend_key[num_pend] = d, (rank << op_bits) | w
                        num_pend += 1
    return now, busy_s, peak, link_bytes, start_s, end_s, x_start_s, x_end_s


@njit(cache=True)
def _bits(count):
    """Bits that hold the ids 0..count-1 (at least 1)."""
    bits = 1
    while (1 << bits) < count:
        bits += 1
    return bits
