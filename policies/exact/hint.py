"""A complete solution hint for an ExactModel: one feasible schedule of a given placement.

CP-SAT given only the placement literals may search long for a first schedule on a model of hundreds of
pieces. This builds one, as a simple list schedule: pieces in topological order, each at the earliest
time its inputs are present and its device is free; each needed transfer, once its producer ends, at
the earliest time its channel is free. It satisfies every constraint of the free-order model but the
memory rows (the best single GPU may not hold every parameter: CP-SAT then repairs the hint) and the
dispatch rule's, which CP-SAT repairs on the small instances that use it.
"""

from __future__ import annotations

import numpy as np


def piece_topological_order(quotient) -> list[int]:
    """Pieces in a topological order of the piece edges (they form a DAG)."""
    indegree = np.bincount(quotient.edge_dst, minlength=quotient.num_pieces).tolist()
    succ = [[] for _ in range(quotient.num_pieces)]
    for a, b in zip(quotient.edge_src.tolist(), quotient.edge_dst.tolist()):
        succ[a].append(b)
    order = [k for k in range(quotient.num_pieces) if indegree[k] == 0]
    for k in order:  # grows while it is walked
        for b in succ[k]:
            indegree[b] -= 1
            if indegree[b] == 0:
                order.append(b)
    return order


def schedule_hint(em, unit_placement: np.ndarray) -> list[tuple[object, int]]:
    """(variable, value) pairs of one feasible schedule of ``unit_placement`` (U,) in ``em``."""
    q = em.quotient
    device = unit_placement[q.piece_group].tolist()  # (P,) per piece
    piece_ticks = em.ticks(np.where(np.isfinite(q.time_s), q.time_s, 0.0))
    channel_of = em.links.channel_of
    transfers_of: dict[int, list] = {}
    for t in em.transfers:
        transfers_of.setdefault(t.producer, []).append(t)
    preds: list[list[int]] = [[] for _ in range(q.num_pieces)]
    for a, b in zip(q.edge_src.tolist(), q.edge_dst.tolist()):
        preds[b].append(a)
    start, end = [0] * q.num_pieces, [0] * q.num_pieces
    arrival: dict[tuple[int, int], int] = {}
    device_free = [0] * q.num_devices
    channel_free = [0] * em.links.num_channels
    hints: list[tuple[object, int]] = []
    for k in piece_topological_order(q):
        d = device[k]
        ready = max([end[a] if device[a] == d else arrival[(a, d)] for a in preds[k]], default=0)
        start[k] = max(ready, device_free[d])
        end[k] = device_free[d] = start[k] + int(piece_ticks[k, d])
        hints += [(em.start[k], start[k]), (em.end[k], end[k])]
        for t in transfers_of.get(k, []):
            hints += transfer_hint(t, d, device, end[k], channel_free, channel_of, arrival)
    for u, xs in enumerate(em.x):
        hints += [(var, int(dev == unit_placement[u])) for dev, var in xs.items()]
    makespan = max(end + list(arrival.values()), default=0)
    return hints + [(em.makespan, makespan)]


def transfer_hint(t, source: int, device: list[int], producer_end: int, channel_free: list[int],
                  channel_of: np.ndarray, arrival: dict) -> list[tuple[object, int]]:
    """Hints of transfer ``t`` (producer on ``source``); books its channel and its arrival when present."""
    on_dst = [device[b] == t.dst for b in t.consumers]
    present = source != t.dst and any(on_dst)
    hints = [(t.present, int(present))]
    begin = finish = producer_end
    for p, (on_p, size, sizes) in t.by_source.items():
        needed = max([s for s, here in zip(sizes, on_dst) if here], default=min(sizes))
        if not isinstance(size, int):
            hints.append((size, needed))
        hints.append((on_p, int(present and p == source)))
        if present and p == source:
            channel = int(channel_of[source, t.dst])
            begin = max(producer_end, channel_free[channel])
            finish = channel_free[channel] = begin + needed
            arrival[(t.producer, t.dst)] = finish
    return hints + [(t.start, begin), (t.end, finish)]
