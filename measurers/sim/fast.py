"""The fast engine: ``simulate_reference``'s algorithm compiled with numba, bit-identical results.

Differences are only in bookkeeping, never in arithmetic (every time is ``start + duration`` and every
transfer takes ``latency_s + bytes / bandwidth_Bps``, evaluated in the same order; numba runs without
fastmath):

- Ops are relabelled by topological position once per graph, so "earlier in topological order" is
  "smaller id".
- A ready op's priority (ready time, position) is one int64 ``rank << bits | op``, where ``rank`` counts
  the distinct event times passed so far (it grows exactly when time grows); channel queues likewise use
  ``rank << bits | transfer`` (transfers are numbered in (producer position, destination device) order).
  A new key never ranks below a queued one, so each queue is a sorted run in one shared array, consumed
  from its head: a pop is one read, a push an append (a short insertion among keys of the same instant).
- Each copy of a tensor (an op's own output, or one transfer of it) is a "slot" with precomputed readers
  and remaining uses, so an arrival touches only the ops waiting for that copy.
- Only devices and channels that changed in the last batch of events are offered new work (an idle device
  with queued work cannot exist after a dispatch, so this starts the same work as scanning them all).
- Pending events live in a heap of at most one per device and one per channel. All events of an instant
  are handled before anything starts, so the order of pushes within an instant does not matter.
- Ids and offsets are int32 (half the memory traffic); keys, bytes and times stay 64-bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphs.errors import raise_interrupt_within
from graphs.opgraph import OpGraph
from measurers.machine import Machine
from measurers.sim.links import link_table
from measurers.sim.result import SimResult, Timeline


class FastSimulator:
    """Graph and machine arrays prepared once; ``run`` costs one compiled call per placement."""

    def __init__(self, graph: OpGraph, machine: Machine, op_time_s: np.ndarray, alloc_bytes: np.ndarray):
        self.graph, self.machine = graph, machine
        self.order = graph.topo_order  # (N,) op at each topological position
        position = graph.topo_position  # (N,)
        src, dst = position[graph.edge_src], position[graph.edge_dst]  # (E,) relabelled
        identity = np.array_equal(self.order, np.arange(graph.num_ops))
        by_src = np.arange(len(src)) if identity else np.lexsort((dst, src))  # graph edges are (src, dst) sorted
        self.succ_dst = dst[by_src].astype(np.int32)  # (E,) ids are int32 to halve the memory traffic
        self.succ_bytes = np.ascontiguousarray(graph.edge_bytes[by_src])  # (E,)
        self.succ_off = _offsets(src[by_src], graph.num_ops).astype(np.int32)  # (N+1,)
        by_dst = np.argsort(self.succ_dst, kind="stable")  # in-edges, as ids into the succ arrays
        self.succ_pred = np.empty(len(src), dtype=np.int32)  # (E,) each out-edge's position among in-edges
        self.succ_pred[by_dst] = np.arange(len(src), dtype=np.int32)
        self.pred_off = _offsets(self.succ_dst[by_dst], graph.num_ops).astype(np.int32)  # (N+1,)
        self.op_time_s = np.ascontiguousarray(op_time_s[self.order])  # (N, D)
        self.alloc_bytes = np.ascontiguousarray(alloc_bytes[self.order])  # (N,)
        self.buffer_alloc_bytes = np.asarray(alloc_bytes, dtype=np.int64)  # (N,) in graph op order: ops' buffers
        self.param_bytes = np.ascontiguousarray(graph.param_bytes[self.order])  # (N,)
        links = link_table(machine)
        self.link_of, self.link_channel = links.link_of, links.link_channel  # (D, D), (L,)
        self.link_latency_s, self.link_bandwidth_Bps = links.latency_s, links.bandwidth_Bps  # (L,), (L,)
        self.num_channels = links.num_channels
        self.capacity_bytes = np.array([d.memory_bytes for d in machine.devices], dtype=np.int64)  # (D,)

    def run(self, placement: np.ndarray, want_timeline: bool = False):
        p = placement[self.order].astype(np.int32)  # (N,) relabelled
        try:
            plan = _plan_transfers(p, self.succ_off, self.succ_dst, self.succ_bytes, self.succ_pred,
                                   self.alloc_bytes, self.machine.num_devices)
            out = _simulate(p, self.op_time_s, self.param_bytes, self.pred_off, *plan, self.link_of,
                            self.link_channel, self.link_latency_s, self.link_bandwidth_Bps, self.num_channels,
                            self.order, want_timeline)
        except SystemError as exc:
            raise_interrupt_within(exc)
            raise
        x_off, x_dst, x_bytes = plan[:3]
        runtime_s, busy_s, peak_bytes, link_bytes, start_s, end_s, x_start_s, x_end_s = out[:8]
        timeline = None
        if want_timeline:
            x_op_relabelled = np.repeat(np.arange(len(p)), np.diff(x_off))
            op_start, op_end = np.empty_like(start_s), np.empty_like(end_s)
            op_start[self.order], op_end[self.order] = start_s, end_s
            x_src, x_dst = p[x_op_relabelled].astype(np.int64), x_dst.astype(np.int64)
            alloc_round, free_round, round_s = out[8:]  # already in buffer order (op i, then transfer k at N + k)
            timeline = Timeline(
                op_device=np.asarray(placement, dtype=np.int64).copy(), op_start_s=op_start, op_end_s=op_end,
                transfer_op=self.order[x_op_relabelled].astype(np.int64), transfer_src=x_src,
                transfer_dst=x_dst, transfer_link=self.link_of[x_src, x_dst], transfer_bytes=x_bytes,
                transfer_start_s=x_start_s, transfer_end_s=x_end_s,
                buffer_bytes=np.concatenate([self.buffer_alloc_bytes, x_bytes]),
                buffer_alloc_round=alloc_round, buffer_free_round=free_round, round_s=round_s)
        return SimResult(runtime_s=float(runtime_s), status="oom" if np.any(peak_bytes > self.capacity_bytes) else "ok",
                         busy_s=busy_s, peak_bytes=peak_bytes, capacity_bytes=self.capacity_bytes.copy(),
                         link_bytes=link_bytes, timeline=timeline)


def warm_up() -> float:
    """Load (or compile) the compiled functions by simulating a 2-op graph; returns the seconds it took."""
    import time

    began = time.perf_counter()
    i32 = np.int32
    p, succ_off, one, zero = np.array([0, 1], i32), np.array([0, 1, 1], i32), np.ones(1, i32), np.zeros(1, i32)
    plan = _plan_transfers(p, succ_off, one, np.ones(1, np.int64), zero, np.ones(2, np.int64), 2)
    _simulate(p, np.ones((2, 2)), np.zeros(2, dtype=np.int64), np.array([0, 0, 1], i32), *plan,
              np.array([[-1, 0], [1, -1]]), np.array([0, 0]), np.ones(2), np.ones(2), 1, np.array([0, 1]), False)
    return time.perf_counter() - began


def _offsets(sorted_keys: np.ndarray, n: int) -> np.ndarray:
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(sorted_keys, minlength=n), out=offsets[1:])
    return offsets


@njit(cache=True)
def _plan_transfers(p, succ_off, succ_dst, succ_bytes, succ_pred, alloc_bytes, num_devices):
    """Transfers of a placement, numbered by (producer, destination device), and the use lists.

    A "slot" is a copy of a tensor: op u's own output (slot ``u + x_off[u]``) or transfer k of op u (slot
    ``u + 1 + k``), so the slots of op u are contiguous. Per slot: its readers ``nt_w[nt_off[s]:nt_off[s+1]]``
    (consumers on the slot's device, a slice of u's out-edges), its remaining ``uses`` (readers, plus the
    transfers for an op's own slot) and its bytes; per in-edge (pred order) the slot ``rel`` it reads."""
    n, num_edges = len(p), len(succ_dst)
    x_off = np.zeros(n + 1, dtype=np.int32)  # transfers of op u: x_off[u]:x_off[u+1]
    x_dst = np.empty(num_edges, dtype=np.int32)
    x_bytes = np.empty(num_edges, dtype=np.int64)
    nt_off = np.empty(n + num_edges + 1, dtype=np.int32)
    nt_w = np.empty(num_edges, dtype=np.int32)
    uses = np.empty(n + num_edges, dtype=np.int32)
    slot_bytes = np.empty(n + num_edges, dtype=np.int64)
    rel = np.empty(num_edges, dtype=np.int32)
    mark = np.full(num_devices, -1, dtype=np.int64)
    size = np.zeros(num_devices, dtype=np.int64)
    fill = np.zeros(num_devices, dtype=np.int64)  # readers per device, then the write cursor
    kid = np.zeros(num_devices, dtype=np.int64)
    remote = np.empty(num_devices, dtype=np.int64)  # the devices u sends to, ascending
    count = 0
    for u in range(n):
        pu, lo, hi, local, num_remote = p[u], succ_off[u], succ_off[u + 1], 0, 0
        for e in range(lo, hi):
            d = p[succ_dst[e]]
            if d == pu:
                local += 1
            elif mark[d] != u:
                mark[d], size[d], fill[d] = u, succ_bytes[e], 1
                j = num_remote  # insertion into the short sorted list
                while j > 0 and remote[j - 1] > d:
                    remote[j] = remote[j - 1]
                    j -= 1
                remote[j] = d
                num_remote += 1
            else:
                fill[d] += 1
                if succ_bytes[e] > size[d]:
                    size[d] = succ_bytes[e]
        own = u + count
        nt_off[own], uses[own], slot_bytes[own] = lo, local, alloc_bytes[u]
        if num_remote > 0:
            pos = lo + local
            for i in range(num_remote):
                d = remote[i]
                slot = u + 1 + count
                kid[d], x_dst[count], x_bytes[count] = slot, d, size[d]
                nt_off[slot], uses[slot], slot_bytes[slot] = pos, fill[d], size[d]
                pos, fill[d] = pos + fill[d], pos
                count += 1
            uses[own] += num_remote
            at = lo
            for e in range(lo, hi):
                w = succ_dst[e]
                d = p[w]
                if d == pu:
                    nt_w[at], rel[succ_pred[e]] = w, own
                    at += 1
                else:
                    nt_w[fill[d]], rel[succ_pred[e]] = w, kid[d]
                    fill[d] += 1
        else:
            for e in range(lo, hi):
                nt_w[e], rel[succ_pred[e]] = succ_dst[e], own
        x_off[u + 1] = count
    nt_off[n + count] = num_edges
    return (x_off, x_dst[:count].copy(), x_bytes[:count].copy(), nt_off[:n + count + 1], nt_w, uses[:n + count],
            slot_bytes[:n + count], rel)


@njit(cache=True)
def _simulate(p, op_time_s, param_bytes, pred_off, x_off, x_dst, x_bytes, nt_off, nt_w, uses, slot_bytes, rel,
              link_of, link_channel, link_latency_s, link_bandwidth_Bps, num_channels, order, record):
    """The event loop. "Entities" are the devices (0..D-1), then the channels (D..D+C-1); each has a queue
    (ready ops, or requested transfers) in its own segment of ``q_keys``. Keys pushed at an instant carry the
    newest rank, so each queue is a sorted array consumed from its head: a push is an append (an insertion
    only for keys of the same instant arriving out of order), a pop is one read. The queue and heap code is
    written out, not called: numba reference-counts array arguments of calls. With ``record``, each slot's
    allocating and freeing round and each round's instant (result.Timeline) are recorded, straight in the
    timeline's buffer order (op ``order[u]``'s output, then transfer k's copy at N + k): reordering slot-indexed
    records in Python took ten temporaries of N+T entries, whose memory glibc handed back and the next run
    faulted in again (a timeline run of nmt-8 1.5x slower; BENCHMARKS.md, "Timeline cost")."""
    n, num_devices, num_transfers = len(p), link_of.shape[0], len(x_dst)
    op_bits, x_bits = _bits(n), _bits(num_transfers)  # key = rank << bits | id
    num_ent = num_devices + num_channels
    x_op = np.empty(num_transfers, dtype=np.int32)
    x_link = np.empty(num_transfers, dtype=np.int32)
    q_base = np.zeros(num_ent + 1, dtype=np.int64)  # queue segment of each entity
    num_recorded = len(slot_bytes) if record else 0
    buffer_of = np.empty(num_recorded, dtype=np.int32)  # each slot's buffer (result.Timeline order)
    for u in range(n):
        q_base[p[u] + 1] += 1
        if record:
            buffer_of[u + x_off[u]] = order[u]
        for k in range(x_off[u], x_off[u + 1]):
            x_op[k], x_link[k] = u, link_of[p[u], x_dst[k]]
            q_base[num_devices + link_channel[x_link[k]] + 1] += 1
            if record:
                buffer_of[u + 1 + k] = n + k
    for e in range(num_ent):
        q_base[e + 1] += q_base[e]
    q_keys = np.empty(max(q_base[num_ent], 1), dtype=np.int64)
    q_head, q_tail = q_base[:num_ent].copy(), q_base[:num_ent].copy()
    ev_time, ev_ent, ev_size = np.empty(num_ent, dtype=np.float64), np.empty(num_ent, dtype=np.int64), 0
    dirty, is_dirty = np.empty(num_ent, dtype=np.int64), np.zeros(num_ent, dtype=np.bool_)
    running = np.full(num_ent, -1, dtype=np.int64)  # op per device, transfer per channel
    memory = np.zeros(num_devices, dtype=np.int64)
    busy_s = np.zeros(num_devices, dtype=np.float64)
    link_bytes = np.zeros(len(link_channel), dtype=np.int64)
    start_s, end_s = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.float64)
    x_start_s, x_end_s = np.zeros(num_transfers, dtype=np.float64), np.zeros(num_transfers, dtype=np.float64)
    waiting = np.empty(n, dtype=np.int32)
    alloc_round, free_round = np.zeros(num_recorded, dtype=np.int64), np.zeros(num_recorded, dtype=np.int64)
    round_s = np.zeros(num_recorded + 1, dtype=np.float64)  # a round has an event: at most one per slot, + round 0
    num_dirty = 0
    for v in range(n):
        memory[p[v]] += param_bytes[v]
        waiting[v] = pred_off[v + 1] - pred_off[v]
        if waiting[v] == 0:  # sources are queued in id order: appends
            ent = p[v]
            q_keys[q_tail[ent]] = v
            q_tail[ent] += 1
            if not is_dirty[ent]:
                dirty[num_dirty], is_dirty[ent] = ent, True
                num_dirty += 1
    peak = memory.copy()
    now, rank, rnd = 0.0, 0, 0
    while True:
        for i in range(num_dirty):  # idle entities that changed start their first queued item
            ent = dirty[i]
            is_dirty[ent] = False
            if running[ent] >= 0 or q_head[ent] == q_tail[ent]:
                continue
            top = q_keys[q_head[ent]]
            q_head[ent] += 1
            if ent < num_devices:  # op v starts on device ent
                v = top & ((1 << op_bits) - 1)
                running[ent] = v
                start_s[v], end_s[v] = now, now + op_time_s[v, ent]
                busy_s[ent] += op_time_s[v, ent]
                memory[ent] += slot_bytes[v + x_off[v]]
                peak[ent] = max(peak[ent], memory[ent])
                if record:
                    alloc_round[buffer_of[v + x_off[v]]] = rnd
                end = end_s[v]
            else:  # transfer k starts on channel ent - D
                k = top & ((1 << x_bits) - 1)
                running[ent] = k
                link, d = x_link[k], x_dst[k]
                x_start_s[k], x_end_s[k] = now, now + (link_latency_s[link] + x_bytes[k] / link_bandwidth_Bps[link])
                link_bytes[link] += x_bytes[k]
                memory[d] += x_bytes[k]
                peak[d] = max(peak[d], memory[d])
                if record:
                    alloc_round[n + k] = rnd
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
        rnd += 1
        if record:
            round_s[rnd] = now
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
            if not is_dirty[ent]:
                dirty[num_dirty], is_dirty[ent] = ent, True
                num_dirty += 1
            if ent < num_devices:  # op v ends on device d
                v, d = running[ent], ent
                running[ent] = -1
                for i in range(pred_off[v], pred_off[v + 1]):  # the copies it read have one use fewer
                    s = rel[i]
                    uses[s] -= 1
                    if uses[s] == 0:
                        memory[d] -= slot_bytes[s]
                        if record:
                            free_round[buffer_of[s]] = rnd
                slot = v + x_off[v]
                if uses[slot] == 0:
                    memory[d] -= slot_bytes[slot]
                    if record:
                        free_round[buffer_of[slot]] = rnd
                for k in range(x_off[v], x_off[v + 1]):  # request its transfers
                    ent, key = num_devices + link_channel[x_link[k]], (rank << x_bits) | k
                    head, j = q_head[ent], q_tail[ent]  # sorted insert (see the docstring; written out twice:
                    # a shared inlined helper measured ~15% slower on transfer-heavy runs)
                    q_tail[ent] = j + 1
                    while j > head and q_keys[j - 1] > key:
                        q_keys[j] = q_keys[j - 1]
                        j -= 1
                    q_keys[j] = key
                    if not is_dirty[ent]:
                        dirty[num_dirty], is_dirty[ent] = ent, True
                        num_dirty += 1
            else:  # transfer k of op u arrives on device d
                k = running[ent]
                running[ent] = -1
                u, d = x_op[k], x_dst[k]
                own = u + x_off[u]
                uses[own] -= 1
                if uses[own] == 0:
                    memory[p[u]] -= slot_bytes[own]
                    if record:
                        free_round[buffer_of[own]] = rnd
                slot = u + 1 + k
            for i in range(nt_off[slot], nt_off[slot + 1]):  # the copy is now present on device d
                w = nt_w[i]
                waiting[w] -= 1
                if waiting[w] == 0:  # w is ready: sorted insert into d's queue
                    key = (rank << op_bits) | w
                    head, j = q_head[d], q_tail[d]
                    q_tail[d] = j + 1
                    while j > head and q_keys[j - 1] > key:
                        q_keys[j] = q_keys[j - 1]
                        j -= 1
                    q_keys[j] = key
                    if not is_dirty[d]:
                        dirty[num_dirty], is_dirty[d] = d, True
                        num_dirty += 1
    return (now, busy_s, peak, link_bytes, start_s, end_s, x_start_s, x_end_s, alloc_round, free_round,
            round_s[:rnd + 1] if record else round_s)


@njit(cache=True)
def _bits(count):
    """Bits that hold the ids 0..count-1 (at least 1)."""
    bits = 1
    while (1 << bits) < count:
        bits += 1
    return bits
