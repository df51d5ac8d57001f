"""The group-level (quotient) graph of a PlacementProblem, as the exact solver reads it.

A group goes to one device. When the groups form a DAG, each group is also one block of the schedule.
The problem's groups often do not (a layer's group holds its forward and its backward ops, and an
unrolled RNN's layers feed each other at every time step), so a group is scheduled as *pieces*: op ``v``
gets a round ``r(v) = max over inputs u of r(u) + [u's group comes after v's group in a fixed group
order]``, and a piece is the ops of one group in one round. Every edge between pieces goes forward in
(round, group order), so the pieces form a DAG; all pieces of a group share its device. With a DAG of
groups and the group order one of its topological orders, every group is one piece. Rounds can be many
(rnnlm at 32 scope groups: 609 pieces, nmt-2: 1,326), so ``split="none"`` gives Moirai's model instead:
one block per group, and the edges that run against the group order are dropped.

A piece edge ``a -> b`` carries what the simulator would move from ``a`` to ``b``'s device if ``b`` were
alone there: one transfer per producer op of ``a`` reading into ``b``, of the largest edge bytes from that
op into ``b`` (measurers/sim/reference.py), summed over those producer ops (``edge_bytes``), and how many
such producer ops there are (``edge_transfers``: each pays the link latency once). For single-op groups
this is exactly the simulator's transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.opgraph import OpGraph
from policies.problem import PlacementProblem


@dataclass(frozen=True)
class QuotientGraph:
    allowed: np.ndarray  # (U, D) bool: group may run on device
    param_bytes: np.ndarray  # (U,) int64: parameter bytes resident on the group's device
    piece_group: np.ndarray  # (P,) int64: the group a piece belongs to
    time_s: np.ndarray  # (P, D) float64: summed op time of each piece per device, inf where not allowed
    topo_position: np.ndarray  # (P,) int64: smallest topological position of the piece's ops
    edge_src: np.ndarray  # (E,) int64: producer piece
    edge_dst: np.ndarray  # (E,) int64: consumer piece (!= edge_src)
    edge_bytes: np.ndarray  # (E,) int64: sum over producer ops of the largest edge bytes into the consumer piece
    edge_transfers: np.ndarray  # (E,) int64: producer ops of edge_src that read into edge_dst
    single_op: bool  # every group is one op: the quotient is the graph itself

    @property
    def num_groups(self) -> int:
        return int(self.allowed.shape[0])

    @property
    def num_pieces(self) -> int:
        return int(self.time_s.shape[0])

    @property
    def num_devices(self) -> int:
        return int(self.allowed.shape[1])

    @property
    def num_edges(self) -> int:
        return int(len(self.edge_src))

    @property
    def cut_edge(self) -> np.ndarray:
        """(E,) bool: the edge joins pieces of two groups (a transfer when they are on two devices)."""
        return self.piece_group[self.edge_src] != self.piece_group[self.edge_dst]


SPLITS = ("rounds", "none")


def quotient_graph(problem: PlacementProblem, split: str = "rounds", max_rounds: int | None = None) -> QuotientGraph:
    """``split``: how a group becomes pieces. ``rounds``: as in the module docstring (a DAG of pieces with
    every dependency, possibly many pieces); ``max_rounds`` R: the rounds bucketed into R, so at most R
    pieces per group, and the edges inside a bucket that run against the group order dropped. ``none``:
    one block per group (R = 1), as Moirai schedules a coarsened graph."""
    graph, unit = problem.graph, problem.op_unit
    position = graph.topo_position  # (N,)
    rank = group_order(graph, unit, problem.num_units, position)  # (U,)
    rounds = op_rounds(graph, unit, rank) if split == "rounds" else np.zeros(graph.num_ops, dtype=np.int64)  # (N,)
    if max_rounds is not None:
        rounds = rounds * int(max_rounds) // (int(rounds.max(initial=0)) + 1)
    key = rounds * (problem.num_units + 1) + unit
    op_piece = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)  # (N,)
    num_pieces = int(op_piece.max()) + 1 if len(op_piece) else 0
    piece_group = np.zeros(num_pieces, dtype=np.int64)
    piece_group[op_piece] = unit
    time_s = np.zeros((num_pieces, problem.num_devices))
    np.add.at(time_s, op_piece, np.where(problem.op_allowed, problem.op_time_s, 0.0))
    topo_position = np.full(num_pieces, graph.num_ops, dtype=np.int64)
    np.minimum.at(topo_position, op_piece, position)
    edge_src, edge_dst, edge_bytes, edge_transfers = piece_edges(graph, op_piece, num_pieces)
    piece_round = np.zeros(num_pieces, dtype=np.int64)
    piece_round[op_piece] = rounds
    against = piece_round[edge_src] == piece_round[edge_dst]  # (E,) in one round, against the group order:
    against &= rank[piece_group[edge_src]] > rank[piece_group[edge_dst]]
    if against.any():  # only where rounds were bucketed
        keep = ~against
        edge_src, edge_dst, edge_bytes, edge_transfers = (edge_src[keep], edge_dst[keep], edge_bytes[keep],
                                                          edge_transfers[keep])
    allowed = problem.unit_allowed
    return QuotientGraph(
        allowed=allowed,
        param_bytes=np.bincount(unit, weights=graph.param_bytes, minlength=problem.num_units).astype(np.int64),
        piece_group=piece_group, time_s=np.where(allowed[piece_group], time_s, np.inf),
        topo_position=topo_position, edge_src=edge_src, edge_dst=edge_dst, edge_bytes=edge_bytes,
        edge_transfers=edge_transfers, single_op=bool(problem.num_units == graph.num_ops))


def group_order(graph: OpGraph, unit: np.ndarray, num_units: int, position: np.ndarray) -> np.ndarray:
    """(U,) rank of each group (``unit``: (N,) the group of each op): a topological order of the group
    graph when it is a DAG, else the order of the groups' mean topological position."""
    sizes = np.maximum(np.bincount(unit, minlength=num_units), 1)  # (U,)
    mean = np.bincount(unit, weights=position, minlength=num_units) / sizes  # (U,) mean topological position
    src, dst = unit[graph.edge_src], unit[graph.edge_dst]
    cut = src != dst
    pairs = np.unique(src[cut] * num_units + dst[cut])
    src, dst = pairs // num_units, pairs % num_units
    indegree = np.bincount(dst, minlength=num_units)
    succ = [[] for _ in range(num_units)]
    for a, b in zip(src.tolist(), dst.tolist()):
        succ[a].append(b)
    ready = sorted(np.flatnonzero(indegree == 0).tolist(), key=lambda u: mean[u])
    order = []
    while ready:  # Kahn's algorithm (ties by mean position)
        u = ready.pop(0)
        order.append(u)
        for b in succ[u]:
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    if len(order) < num_units:  # a cycle: no topological order of the groups
        order = np.argsort(mean, kind="stable").tolist()
    rank = np.empty(num_units, dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(num_units)
    return rank


def op_rounds(graph: OpGraph, unit: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """(N,) the round of each op (module docstring): a piece is the ops of one group in one round."""
    offsets, edge_ids = graph.pred_csr
    preds = graph.edge_src[edge_ids].tolist()
    starts, group_rank = offsets.tolist(), rank[unit].tolist()
    rounds = [0] * graph.num_ops
    for v in graph.topo_order.tolist():
        best, mine = 0, group_rank[v]
        for u in preds[starts[v]:starts[v + 1]]:
            r = rounds[u] + (group_rank[u] > mine)
            if r > best:
                best = r
        rounds[v] = best
    return np.asarray(rounds, dtype=np.int64)


def piece_edges(graph: OpGraph, op_piece: np.ndarray, num_pieces: int):
    """(E,) producer piece, consumer piece, bytes and transfer count of every edge between two pieces."""
    src, dst_piece, nbytes = graph.edge_src, op_piece[graph.edge_dst], graph.edge_bytes.astype(np.int64)
    cut = op_piece[src] != dst_piece
    src, dst_piece, nbytes = src[cut], dst_piece[cut], nbytes[cut]  # (C,) each
    order = np.lexsort((nbytes, dst_piece, src))  # by producer op, consumer piece, bytes ascending
    src, dst_piece, nbytes = src[order], dst_piece[order], nbytes[order]
    last = np.ones(len(src), dtype=bool)  # the last row of each (op, piece) run holds its largest bytes
    last[:-1] = (src[1:] != src[:-1]) | (dst_piece[1:] != dst_piece[:-1])
    pair = op_piece[src[last]] * num_pieces + dst_piece[last]  # (T,)
    pairs, inverse = np.unique(pair, return_inverse=True)
    edge_bytes = np.bincount(inverse, weights=nbytes[last], minlength=len(pairs))
    edge_transfers = np.bincount(inverse, minlength=len(pairs))
    return ((pairs // num_pieces).astype(np.int64), (pairs % num_pieces).astype(np.int64),
            np.rint(edge_bytes).astype(np.int64), edge_transfers.astype(np.int64))
