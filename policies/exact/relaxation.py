"""A mixed-integer relaxation of the simulator, for the placements of one coarsening (HiGHS).

``solve_relaxation(problem, time_limit_s, integer=True)`` returns a proven lower bound on the simulated
step time (``measurers/sim/reference.py``) of every placement that keeps each unit of
``problem.op_unit`` on one device and does not run out of memory. Every constraint below holds for the
simulator's actual schedule of any such placement, so that schedule (with ``w`` its step time) is a
feasible point: the optimum is at most the step time, and so is HiGHS's dual bound when a time limit
stops it. ``integer=False`` drops integrality (the LP relaxation: weaker, cheaper; only an LP solved to
optimality is reported, since a simplex stopped early proves nothing).

Variables (times in milliseconds inside the model, for the solver's absolute tolerances):

- ``x[u,d]`` binary, for the devices the unit may use; ``sum_d x[u,d] = 1``. In the simulator's schedule:
  1 where the unit runs.
- ``s[i] >= 0`` per op: the op's start time. ``p_i(x) = sum_d t[i,d] x[unit(i),d]`` is its run time.
- ``z[a,b]`` in [0,1] per ordered pair of units joined by an edge ``a -> b``: ``z >= x[a,d] - x[b,d]``
  for every d, so ``z = 1`` is forced exactly when a and b run on different devices (true value: that
  indicator).
- ``y[a,b,p,q]`` in [0,1] for such pairs and allowed ``p != q``: ``y >= x[a,p] + x[b,q] - 1``, so y is 1
  when a is on p and b on q (true value: that indicator).
- ``w``: the step time, minimised.

Constraints, and why the simulator's schedule meets each:

1. Precedence, per edge ``i -> j``. Same unit: j starts after i ends, ``s_j >= s_i + p_i``. Different
   units a, b: a consumer on another device starts after the transfer ``(i, device(j))`` arrives; that
   transfer is requested when i ends and takes ``latency + bytes / bandwidth`` of the link, for a size at
   least this edge's bytes (the simulator sends the largest edge to that device). With ``c_e`` the least
   such time over allowed device pairs and ``T_e[p,q]`` the time on each pair,
   ``s_j >= s_i + p_i + c_e z[a,b] + sum_{p != q} (T_e[p,q] - c_e) y[a,b,p,q]``: at the true indicators
   the comm term is exactly ``T_e`` of the pair used (0 on one device).
2. Step time: ``w >= s_i + p_i`` for every sink (every op ends by the last event).
3. Device work: ``w >= sum_u T[u,d] x[u,d]``: a device runs its ops one at a time.
4. Channel load: a channel serves one transfer at a time, so ``w >=`` the summed durations of its
   transfers. Per producer op i (unit a) and consumer unit b != a, let ``B[i,b]`` be the largest edge
   bytes from i into b, and ``alpha_i = 1 / k_i`` with ``k_i`` the number of such units b. The simulator
   sends one transfer per (i, destination device q) lasting ``L + max_{b on q} B[i,b] / BW``; the
   weights ``alpha_i (L + B[i,b] / BW)`` of the units b on q sum to at most that (at most ``k_i`` terms,
   each at most the max, times ``1 / k_i``), so
   ``w >= sum_{a,b} sum_{(p,q) on the channel} (K[a,b] L_pq + S[a,b] / BW_pq) y[a,b,p,q]`` with
   ``K[a,b] = sum_i alpha_i`` and ``S[a,b] = sum_i alpha_i B[i,b]`` over the producers i in a never
   exceeds the channel's busy time.
5. Memory: ``sum_u param_bytes[u] x[u,d] <= capacity[d]``: parameters are resident for the whole step,
   so a placement that is not ``oom`` satisfies it.
6. Heads and tails per device (the one-machine bound of job-shop scheduling). ``head_i``: the longest
   path of fastest op times before op i (no op starts earlier in any schedule), ``tail_i``: the longest
   path of fastest times after it (the step lasts at least that long after i ends). For thresholds h, t
   and the ops K = {i : head_i >= h, tail_i >= t}: those of K on device d run one at a time, the first
   starts at >= h and the step goes on >= t after the last ends, so
   ``w >= h + t + sum_{i in K} t[i,d] x[unit(i),d]``. A grid of HEAD_TAIL_LEVELS^2 thresholds per device.

7. Windows along the longest path (of fastest op times, as in 6). For each of WINDOW_OPS ops v spread
   along one such path and every device d: (a) v's ancestors that run on d run one at a time and all end
   before v starts, so ``s_v >= sum_{a anc. of v} t[a,d] x[unit(a),d]``; (b) its descendants on d start
   after v ends and end by the step's end, so ``w >= s_v + p_v + sum_{b desc. of v} t[b,d] x[unit(b),d]``;
   (c) for consecutive chosen ops u, v (u an ancestor of v: they lie on one path), the ops that are
   descendants of u and ancestors of v start after u ends and end before v starts, so
   ``s_v >= s_u + p_u + sum_{k between} t[k,d] x[unit(k),d]``. Each row sums the work per unit (at most
   U + D + 1 terms). They see what a training step's phases impose: the backward pass waits for the loss,
   so the forward work and the backward work must each fit on the devices, not only their sum. (On the
   issue's eight rows they raise the MIP bound by up to 9% at a 120 s limit, the LP by at most 2%:
   BENCHMARKS.md, issue 16, "Window rows".)

No symmetry rows: ordering interchangeable GPUs by their least unit index was tried (valid, since the
relaxation is invariant under such swaps) and measured worse at a 60 s limit on the 32 scope groups
(inception-v3 / paper-4gpu 0.4230 s at the limit against 0.4331 s optimal without; HiGHS detects the
symmetry itself), so the model leaves it to the solver.

Constraints 1-3 imply the closed-form bound (``measurers/sim/lower_bound.py``): a path's ops take at least
their fastest time, and the device rows sum to at least the total fastest work. The solver's answers carry
its tolerances (primal feasibility 1e-7 in milliseconds, i.e. 1e-10 s per row; a MIP prunes within 1e-6 ms of
its incumbent): ``proven_s`` takes them off a bound, relative and absolute.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import highspy
import numpy as np

from graphs.c_stdout import c_stdout_dropped
from graphs.errors import PlacerError
from measurers.sim.links import link_table
from policies.problem import PlacementProblem, parameters_cannot_fit, unit_param_bytes

MS_PER_S = 1e3
GB = 1e9
HEAD_TAIL_LEVELS = 16  # quantiles of heads and of tails used as thresholds in constraint 6
WINDOW_OPS = 48  # ops of the longest path with window rows (constraint 7)
SOLVER_SLACK = 1e-6  # relative: HiGHS's tolerances, how far its bound can sit above the true optimum
# HiGHS's default MIP feasibility tolerance, absolute in the model's units (milliseconds): a MIP prunes the
# nodes whose bound comes within it of its incumbent, so its dual bound can sit that far above (proven_s)
MIP_FEASIBILITY_TOLERANCE_MS = 1e-6
NOT_SOLVED = "not solved (time limit)"  # building the model took the whole time limit: HiGHS never ran
STOPPED = "stopped"  # solve_relaxation's ``stop`` was set before the solve ended
REFUSED = "not solved (HiGHS refused the model: a value past its limits, e.g. a coefficient over 1e15 ms)"
NUMERICAL_INFEASIBLE = "not proven (HiGHS found no point, yet a placement fits: numerical trouble)"


@dataclass(frozen=True)
class RelaxationResult:
    bound_s: float | None  # proven lower bound (None: the solver proved none, e.g. an LP cut short)
    status: str  # "optimal", "time limit", "infeasible" (no placement fits in memory), NUMERICAL_INFEASIBLE,
    # NOT_SOLVED, ...
    wall_s: float  # building and solving
    num_rows: int
    num_cols: int
    unit_placement: np.ndarray | None = None  # (U,) int64: a MIP's best integer point, None without one
    makespan_s: float = math.nan  # the model's w at unit_placement
    # a MIP's earlier integer points, oldest first, each distinct and no worse in the model than the one before
    # (HiGHS can report ties): ((U,) int64 placement, the model's w in seconds); unit_placement is not among them
    earlier: list[tuple[np.ndarray, float]] = field(default_factory=list)


class _Rows:
    """Row-wise sparse constraints ``lower <= a . v <= upper`` collected as triplets."""

    def __init__(self) -> None:
        self.row: list[np.ndarray] = []
        self.col: list[np.ndarray] = []
        self.val: list[np.ndarray] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.count = 0

    def add(self, row_of_term, col, val, lower, upper) -> None:
        """``row_of_term``: (K,) local row index (0..R-1) of each term; ``lower``/``upper``: (R,)."""
        lower = np.atleast_1d(np.asarray(lower, dtype=np.float64))
        self.row.append(np.asarray(row_of_term, dtype=np.int64) + self.count)
        self.col.append(np.asarray(col, dtype=np.int64))
        self.val.append(np.asarray(val, dtype=np.float64))
        self.lower.append(lower)
        self.upper.append(np.broadcast_to(np.asarray(upper, dtype=np.float64), lower.shape))
        self.count += len(lower)

    def csr(self):
        row, col, val = (np.concatenate(parts) for parts in (self.row, self.col, self.val))
        order = np.argsort(row, kind="stable")
        start = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(np.bincount(row, minlength=self.count), out=start[1:])
        return start, col[order], val[order], np.concatenate(self.lower), np.concatenate(self.upper)


@dataclass(frozen=True)
class _Layout:
    """Column indices of the model's variables."""

    x_col: np.ndarray  # (U, D) int64, -1 where the unit may not use the device
    pair_a: np.ndarray  # (P,) int64 producer unit of each cross pair
    pair_b: np.ndarray  # (P,) int64 consumer unit
    z_col: np.ndarray  # (P,) int64
    y_col: np.ndarray  # (P, D, D) int64, -1 where not a variable
    s_col: np.ndarray  # (N,) int64
    w_col: int
    num_cols: int


def _layout(problem: PlacementProblem) -> _Layout:
    allowed = problem.unit_allowed  # (U, D) bool
    units, devices = allowed.shape
    x_col = np.full((units, devices), -1, dtype=np.int64)
    x_col[allowed] = np.arange(int(allowed.sum()))
    nxt = int(allowed.sum())
    src_unit = problem.op_unit[problem.graph.edge_src]
    dst_unit = problem.op_unit[problem.graph.edge_dst]
    cross = src_unit != dst_unit
    pairs = np.unique(np.stack([src_unit[cross], dst_unit[cross]], axis=1), axis=0).reshape(-1, 2)
    z_col = nxt + np.arange(len(pairs))
    nxt += len(pairs)
    y_ok = allowed[pairs[:, 0], :, None] & allowed[pairs[:, 1], None, :] & ~np.eye(devices, dtype=bool)
    y_col = np.full(y_ok.shape, -1, dtype=np.int64)  # (P, D, D)
    y_col[y_ok] = nxt + np.arange(int(y_ok.sum()))
    nxt += int(y_ok.sum())
    s_col = nxt + np.arange(problem.graph.num_ops)
    nxt += problem.graph.num_ops
    return _Layout(x_col, pairs[:, 0].copy(), pairs[:, 1].copy(), z_col, y_col, s_col, nxt, nxt + 1)


def _pair_index(layout: _Layout, units: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    key = layout.pair_a * units + layout.pair_b  # sorted (np.unique)
    return np.searchsorted(key, a * units + b)


def _runtime_terms(problem, layout, ops, rows_of_ops, sign):
    """Terms ``sign * p_i(x)`` for each op in ``ops`` (rows ``rows_of_ops``), in milliseconds."""
    x = layout.x_col[problem.op_unit[ops]]  # (K, D)
    t = np.where(x >= 0, problem.op_time_s[ops], 0.0) * MS_PER_S
    keep = x >= 0
    rows = np.broadcast_to(np.asarray(rows_of_ops)[:, None], x.shape)
    return rows[keep], x[keep], sign * t[keep]


def _add_assignment_rows(rows: _Rows, problem, layout) -> None:
    allowed = layout.x_col >= 0
    unit_of_term = np.nonzero(allowed)[0]
    rows.add(unit_of_term, layout.x_col[allowed], np.ones(len(unit_of_term)), np.ones(problem.num_units), 1.0)
    # z[a,b] - x[a,d] + x[b,d] >= 0 for every d that a may use.
    pa, d = np.nonzero(layout.x_col[layout.pair_a] >= 0)
    xb = layout.x_col[layout.pair_b[pa], d]
    r = np.arange(len(pa))
    has_b = xb >= 0
    rows.add(np.concatenate([r, r, r[has_b]]),
             np.concatenate([layout.z_col[pa], layout.x_col[layout.pair_a[pa], d], xb[has_b]]),
             np.concatenate([np.ones(len(r)), -np.ones(len(r)), np.ones(int(has_b.sum()))]),
             np.zeros(len(r)), np.inf)
    # y[a,b,p,q] - x[a,p] - x[b,q] >= -1.
    pi, p, q = np.nonzero(layout.y_col >= 0)
    r = np.arange(len(pi))
    rows.add(np.concatenate([r, r, r]),
             np.concatenate([layout.y_col[pi, p, q], layout.x_col[layout.pair_a[pi], p],
                             layout.x_col[layout.pair_b[pi], q]]),
             np.concatenate([np.ones(len(r)), -np.ones(len(r)), -np.ones(len(r))]),
             -np.ones(len(r)), np.inf)


def _cross_edges(problem, layout, links) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C,) the edges between units, (C,) their unit pair (index into layout.pair_a/b) and (C, D, D) the
    milliseconds each takes on each device pair (0 on the diagonal)."""
    graph = problem.graph
    src, dst = graph.edge_src, graph.edge_dst
    cross = np.flatnonzero(problem.op_unit[src] != problem.op_unit[dst])
    pair = _pair_index(layout, problem.num_units, problem.op_unit[src[cross]], problem.op_unit[dst[cross]])
    return cross, pair, np.minimum(links.transfer_matrix_s(graph.edge_bytes[cross]) * MS_PER_S, _cap_ms(problem))


def _cap_ms(problem: PlacementProblem) -> float:
    """Where a copy's or a channel's time is clipped, in milliseconds: every op run in turn on the slowest device
    it may use. A smaller coefficient only loosens a row, so the bound stays valid; a link a user slows to all
    but nothing (1 kB/s, to keep two devices apart) made coefficients 12 orders of magnitude above an op's time,
    and HiGHS's tolerances then proved a bound 7% above a measured step, or "infeasible" where placements fit."""
    allowed = problem.unit_allowed[problem.op_unit]  # (N, D)
    slowest_s = np.where(allowed, problem.op_time_s, 0.0).max(axis=1) if problem.graph.num_ops else np.zeros(0)
    return max(float(slowest_s.sum()) * MS_PER_S, 1e-3)


def _add_precedence_rows(rows: _Rows, problem, layout, links) -> None:
    graph = problem.graph
    src, dst = graph.edge_src, graph.edge_dst
    r = np.arange(graph.num_edges)
    rt_rows, rt_cols, rt_vals = _runtime_terms(problem, layout, src, r, -1.0)
    cross, pair, comm_ms = _cross_edges(problem, layout, links)
    y = layout.y_col[pair]  # (C, D, D)
    c_min = np.where(y >= 0, comm_ms, np.inf).min(axis=(1, 2))  # (C,)
    c_min = np.where(np.isfinite(c_min), c_min, 0.0)
    extra = comm_ms - c_min[:, None, None]
    keep = (y >= 0) & (extra > 0)
    ce, _, _ = np.nonzero(keep)
    rows.add(np.concatenate([r, r, rt_rows, cross, cross[ce]]),
             np.concatenate([layout.s_col[dst], layout.s_col[src], rt_cols, layout.z_col[pair], y[keep]]),
             np.concatenate([np.ones(len(r)), -np.ones(len(r)), rt_vals, -c_min, -extra[keep]]),
             np.zeros(len(r)), np.inf)


def heads_and_tails_s(problem: PlacementProblem) -> tuple[np.ndarray, np.ndarray]:
    """(N,) earliest start and (N,) least remaining time after the end of each op: longest paths of each
    op's fastest time on the devices its unit may use (communication free)."""
    graph = problem.graph
    fastest = _fastest_s(problem).tolist()  # (N,)
    succ = _neighbours(graph, forward=True)
    order = graph.topo_order.tolist()
    head, tail = [0.0] * graph.num_ops, [0.0] * graph.num_ops
    for u in order:
        end = head[u] + fastest[u]
        for v in succ[u]:
            if end > head[v]:
                head[v] = end
    for u in reversed(order):
        tail[u] = max((fastest[v] + tail[v] for v in succ[u]), default=0.0)
    return np.array(head), np.array(tail)


def _fastest_s(problem: PlacementProblem) -> np.ndarray:
    """(N,) each op's least time over the devices its unit may use."""
    allowed = problem.unit_allowed[problem.op_unit]  # (N, D)
    return np.where(allowed, problem.op_time_s, np.inf).min(axis=1)


def _neighbours(graph, forward: bool) -> list[list[int]]:
    """Each op's successors (``forward``) or predecessors, as lists."""
    out = [[] for _ in range(graph.num_ops)]
    src, dst = (graph.edge_src, graph.edge_dst) if forward else (graph.edge_dst, graph.edge_src)
    for u, v in zip(src.tolist(), dst.tolist()):
        out[u].append(v)
    return out


def _add_head_tail_rows(rows: _Rows, problem, layout, head: np.ndarray, tail: np.ndarray) -> None:
    levels = np.linspace(0.0, 1.0, HEAD_TAIL_LEVELS, endpoint=False)
    u, d = np.nonzero(layout.x_col >= 0)
    op_time = np.where(problem.unit_allowed[problem.op_unit], problem.op_time_s, 0.0)  # (N, D)
    for h in np.unique(np.quantile(head, levels)):
        for t in np.unique(np.quantile(tail, levels)):
            chosen = (head >= h) & (tail >= t)  # (N,)
            if not chosen.any():
                continue
            work = np.zeros((problem.num_units, problem.num_devices))  # (U, D) seconds of chosen ops
            np.add.at(work, problem.op_unit[chosen], op_time[chosen])
            keep = work[u, d] > 0
            rows.add(np.concatenate([np.arange(problem.num_devices), d[keep]]),
                     np.concatenate([np.full(problem.num_devices, layout.w_col), layout.x_col[u[keep], d[keep]]]),
                     np.concatenate([np.ones(problem.num_devices), -work[u[keep], d[keep]] * MS_PER_S]),
                     np.full(problem.num_devices, (h + t) * MS_PER_S), np.inf)


def longest_path_ops(problem: PlacementProblem, count: int, tail: np.ndarray | None = None) -> np.ndarray:
    """(M,) up to ``count`` ops spread evenly (by position) along one longest path of fastest op times, in
    path order, so each is an ancestor of the next; ``tail``: heads_and_tails_s's, if computed already."""
    graph = problem.graph
    if graph.num_ops == 0 or count <= 0:
        return np.zeros(0, dtype=np.int64)
    tail = heads_and_tails_s(problem)[1] if tail is None else tail
    reach = (_fastest_s(problem) + tail).tolist()  # (N,) the longest path from each op's start on
    succ = _neighbours(graph, forward=True)
    sources = np.flatnonzero(np.bincount(graph.edge_dst, minlength=graph.num_ops) == 0)
    op = int(sources[np.argmax(np.asarray(reach)[sources])])
    path = [op]
    while succ[op]:
        op = max(succ[op], key=reach.__getitem__)  # continues a longest path
        path.append(op)
    pick = np.unique(np.linspace(0, len(path) - 1, min(count, len(path))).round().astype(np.int64))
    return np.asarray(path, dtype=np.int64)[pick]


def _related(graph, chosen: np.ndarray, ancestors: bool) -> np.ndarray:
    """(N, M) bool: op i is an ancestor (``ancestors``) or a descendant of ``chosen[m]``: one sweep in
    topological order (reversed for ancestors) with a bitset per op, bit m for chosen[m]."""
    num_chosen = len(chosen)
    bit = [0] * graph.num_ops
    for m, op in enumerate(chosen.tolist()):
        bit[op] = 1 << m
    inherit_from = _neighbours(graph, forward=ancestors)  # an ancestor inherits from its successors
    order = graph.topo_order.tolist()
    masks = [0] * graph.num_ops
    for i in (reversed(order) if ancestors else order):
        acc = 0
        for j in inherit_from[i]:
            acc |= masks[j] | bit[j]
        masks[i] = acc
    out = np.zeros((graph.num_ops, num_chosen), dtype=bool)
    for first in range(0, num_chosen, 64):  # 64 bits at a time through numpy
        width = min(64, num_chosen - first)
        chunk = np.array([(mask >> first) & ((1 << width) - 1) for mask in masks], dtype=np.uint64)
        out[:, first:first + width] = (chunk[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1) != 0
    return out


def _work_by_unit_ms(problem, member: np.ndarray) -> np.ndarray:
    """(M, U, D) milliseconds: the summed time on each device of each unit's ops with ``member[:, m]``."""
    units, devices, count = problem.num_units, problem.num_devices, member.shape[1]
    op, m = np.nonzero(member)
    op_time = np.where(problem.unit_allowed[problem.op_unit[op]], problem.op_time_s[op], 0.0)  # (K, D)
    key = m * units + problem.op_unit[op]
    work = np.stack([np.bincount(key, weights=op_time[:, d], minlength=count * units) for d in range(devices)],
                    axis=1)
    return work.reshape(count, units, devices) * MS_PER_S


def _add_work_rows(rows: _Rows, problem, layout, work_ms, plus_col, minus_col=None, ran_op=None) -> None:
    """Rows ``v[plus_m] - v[minus_m] - p_{ran_m}(x) - sum_u work_ms[m,u,d] x[u,d] >= 0`` for every m and
    device d with some work (``minus_col``, ``ran_op``: (M,) or None for no such term)."""
    devices = problem.num_devices
    m, u, d = np.nonzero((work_ms > 0) & (layout.x_col >= 0)[None])
    row_keys, row_of_term = np.unique(m * devices + d, return_inverse=True)
    row_m, r = row_keys // devices, np.arange(len(row_keys))
    parts = [(r, plus_col[row_m], np.ones(len(r))), (row_of_term.reshape(-1), layout.x_col[u, d], -work_ms[m, u, d])]
    if minus_col is not None:
        parts.append((r, minus_col[row_m], -np.ones(len(r))))
    if ran_op is not None:
        parts.append(_runtime_terms(problem, layout, ran_op[row_m], r, -1.0))
    row, col, val = (np.concatenate(p) for p in zip(*parts))
    pair, inverse = np.unique(row * layout.num_cols + col, return_inverse=True)  # HiGHS takes no duplicates
    merged = np.bincount(inverse.reshape(-1), weights=val, minlength=len(pair))
    rows.add(pair // layout.num_cols, pair % layout.num_cols, merged, np.zeros(len(r)), np.inf)


def _add_window_rows(rows: _Rows, problem, layout, tail: np.ndarray) -> None:
    """Constraint 7 around the ops of ``longest_path_ops``."""
    chosen = longest_path_ops(problem, WINDOW_OPS, tail)
    if len(chosen) == 0:
        return
    anc = _related(problem.graph, chosen, ancestors=True)  # (N, M)
    desc = _related(problem.graph, chosen, ancestors=False)
    s_col = layout.s_col[chosen]
    _add_work_rows(rows, problem, layout, _work_by_unit_ms(problem, anc), s_col)
    _add_work_rows(rows, problem, layout, _work_by_unit_ms(problem, desc), np.full(len(chosen), layout.w_col),
                   s_col, chosen)
    between = desc[:, :-1] & anc[:, 1:]  # after chosen[m], before chosen[m + 1]
    _add_work_rows(rows, problem, layout, _work_by_unit_ms(problem, between), s_col[1:], s_col[:-1], chosen[:-1])


def _add_makespan_rows(rows: _Rows, problem, layout) -> None:
    graph = problem.graph
    sinks = np.flatnonzero(np.bincount(graph.edge_src, minlength=graph.num_ops) == 0)
    r = np.arange(len(sinks))
    rt_rows, rt_cols, rt_vals = _runtime_terms(problem, layout, sinks, r, -1.0)
    rows.add(np.concatenate([r, r, rt_rows]),
             np.concatenate([np.full(len(r), layout.w_col), layout.s_col[sinks], rt_cols]),
             np.concatenate([np.ones(len(r)), -np.ones(len(r)), rt_vals]), np.zeros(len(r)), np.inf)
    # Device work: w - sum_u T[u,d] x[u,d] >= 0.
    u, d = np.nonzero(layout.x_col >= 0)
    devices = problem.num_devices
    rows.add(np.concatenate([np.arange(devices), d]),
             np.concatenate([np.full(devices, layout.w_col), layout.x_col[u, d]]),
             np.concatenate([np.ones(devices), -problem.unit_time_s[u, d] * MS_PER_S]),
             np.zeros(devices), np.inf)


def _pair_traffic(problem, layout) -> tuple[np.ndarray, np.ndarray]:
    """(P,) K[a,b] and S[a,b] of constraint 4: alpha-weighted producer count and bytes per cross pair."""
    graph, units = problem.graph, problem.num_units
    src, dst = graph.edge_src, graph.edge_dst
    cross = problem.op_unit[src] != problem.op_unit[dst]
    op_b = np.stack([src[cross], problem.op_unit[dst[cross]]], axis=1)  # (C, 2) producer op, consumer unit
    keys, inverse = np.unique(op_b, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    max_bytes = np.zeros(len(keys))
    np.maximum.at(max_bytes, inverse, graph.edge_bytes[cross].astype(np.float64))
    k_of_op = np.bincount(keys[:, 0], minlength=graph.num_ops)  # consumer units per producer op
    alpha = 1.0 / k_of_op[keys[:, 0]]
    pair = _pair_index(layout, units, problem.op_unit[keys[:, 0]], keys[:, 1])
    count = np.bincount(pair, weights=alpha, minlength=len(layout.pair_a))
    size = np.bincount(pair, weights=alpha * max_bytes, minlength=len(layout.pair_a))
    return count, size


def _add_channel_rows(rows: _Rows, problem, layout, links) -> None:
    count, size = _pair_traffic(problem, layout)
    pi, p, q = np.nonzero(layout.y_col >= 0)
    link = links.link_of[p, q]
    busy_ms = np.minimum((count[pi] * links.latency_s[link] + size[pi] / links.bandwidth_Bps[link]) * MS_PER_S,
                         _cap_ms(problem))  # (P',) clipped as a copy's time is (_cap_ms)
    channel = links.link_channel[link]
    c = links.num_channels
    rows.add(np.concatenate([np.arange(c), channel]),
             np.concatenate([np.full(c, layout.w_col), layout.y_col[pi, p, q]]),
             np.concatenate([np.ones(c), -busy_ms]), np.zeros(c), np.inf)


def _parameters_fit(problem: PlacementProblem) -> bool:
    """Whether the memory rows (each unit's parameters on its device, within the device's capacity) leave a
    placement, found greedily: heaviest unit first, onto the allowed device with the most room left. The other
    rows always hold with a long enough step, so a relaxation HiGHS calls infeasible while this finds one is
    HiGHS's numerics (a machine whose figures span a dozen orders of magnitude), not a proof."""
    param_bytes = unit_param_bytes(problem)  # (U,)
    room = problem.capacity_bytes().astype(np.float64)  # (D,)
    for unit in np.argsort(-param_bytes, kind="stable").tolist():
        options = np.flatnonzero(problem.unit_allowed[unit])
        if not len(options):
            return False
        device = options[np.argmax(room[options])]
        if room[device] < param_bytes[unit]:
            return False
        room[device] -= param_bytes[unit]
    return True


def _add_memory_rows(rows: _Rows, problem, layout) -> None:
    param_gb = unit_param_bytes(problem) / GB
    u, d = np.nonzero(layout.x_col >= 0)
    devices = problem.num_devices
    rows.add(d, layout.x_col[u, d], param_gb[u], np.full(devices, -np.inf), problem.capacity_bytes() / GB)


def build_model(problem: PlacementProblem, integer: bool = True, placement_weight: float = 0.0,
                forbidden: Sequence[np.ndarray] = (), window_rows: bool = True) -> highspy.HighsLp:
    """The relaxation of the module docstring as a HiGHS model (objective: w, in milliseconds; plus
    ``placement_weight`` times the tie-breaking cost of ``_placement_cost``; ``forbidden`` (U,) unit
    placements are cut off; ``window_rows``: with constraint 7)."""
    return _build(problem, integer, placement_weight, forbidden, window_rows)[0]


def _placement_cost(problem, layout, links) -> np.ndarray:
    """(num_cols,) milliseconds: each unit's time on its device and each cut pair's least copy time of all
    its edges (over every pair of distinct devices, allowed or not: a tie-break, not a bound). Many
    placements share the relaxation's optimum (it sees no queueing); among them this prefers fast devices
    and few copies, which the simulator rewards."""
    cost = np.zeros(layout.num_cols)
    allowed = layout.x_col >= 0
    cost[layout.x_col[allowed]] = problem.unit_time_s[allowed] * MS_PER_S
    cost[layout.z_col] = _least_copy_ms(problem, layout, links)
    return cost


def _least_copy_ms(problem, layout, links) -> np.ndarray:
    """(P,) milliseconds: each unit pair's least copy time, summed over its edges (0 on one device)."""
    if problem.num_devices == 1:  # no edge is ever cut
        return np.zeros(len(layout.z_col))
    _, pair, comm_ms = _cross_edges(problem, layout, links)
    off_diagonal = ~np.eye(problem.num_devices, dtype=bool)
    least_ms = np.where(off_diagonal, comm_ms, np.inf).min(axis=(1, 2))  # (C,)
    return np.bincount(pair, weights=least_ms, minlength=len(layout.z_col))


def _add_forbidden_rows(rows: _Rows, problem, layout, forbidden: Sequence[np.ndarray]) -> None:
    """No-good cuts: sum_u x[u, P_u] <= U - 1 for each forbidden placement P."""
    units = np.arange(problem.num_units)
    for k, placement in enumerate(forbidden):
        cols = layout.x_col[units, np.asarray(placement, dtype=np.int64)]
        cols = cols[cols >= 0]
        rows.add(np.zeros(len(cols), dtype=np.int64), cols, np.ones(len(cols)), np.array([-np.inf]),
                 float(len(cols) - 1))


def _add_measured_rows(rows: _Rows, problem, layout, links, measured: Sequence[tuple[np.ndarray, float]]) -> None:
    """Cuts from measurements, as logic-based Benders decomposition's optimality cuts but with a heuristic
    reach: for a placement P measured at T seconds, ``w >= T - sum_u reach_u(P) (1 - x[u, P_u])``, where
    ``reach_u`` is unit u's time on its device in P plus the least copy time of every unit pair it is in.
    A placement that moves few units of P is taken to run about as slowly as P; the relaxation is loose
    exactly there (its optimum balances the work and then stalls in the simulator), and a no-good cut
    forbids P alone. Not valid for every placement (a move can gain more than its reach in the simulator's
    dispatch), so a model with them proves nothing."""
    if not measured:
        return
    units = np.arange(problem.num_units)
    least_ms = _least_copy_ms(problem, layout, links)  # (P,)
    comm_of_unit = (np.bincount(layout.pair_a, weights=least_ms, minlength=problem.num_units)
                    + np.bincount(layout.pair_b, weights=least_ms, minlength=problem.num_units))  # (U,) ms
    for placement, step_s in measured:
        placement = np.asarray(placement, dtype=np.int64)
        cols = layout.x_col[units, placement]  # (U,) -1 where not allowed (then never 1: the unit always moved)
        reach_ms = problem.unit_time_s[units, placement] * MS_PER_S + comm_of_unit  # (U,)
        keep = cols >= 0
        reach_ms = np.where(keep, reach_ms, 0.0)  # a unit that cannot stay on P_u: its move is forced
        rows.add(np.zeros(int(keep.sum()) + 1, dtype=np.int64),
                 np.concatenate([[layout.w_col], cols[keep]]), np.concatenate([[1.0], -reach_ms[keep]]),
                 np.array([step_s * MS_PER_S - reach_ms.sum()]), np.inf)


def _build(problem: PlacementProblem, integer: bool, placement_weight: float,
           forbidden: Sequence[np.ndarray], window_rows: bool = True,
           measured: Sequence[tuple[np.ndarray, float]] = ()) -> tuple[highspy.HighsLp, _Layout]:
    layout = _layout(problem)
    links = link_table(problem.machine)
    rows = _Rows()
    _add_forbidden_rows(rows, problem, layout, forbidden)
    _add_measured_rows(rows, problem, layout, links, measured)
    _add_assignment_rows(rows, problem, layout)
    _add_precedence_rows(rows, problem, layout, links)
    _add_makespan_rows(rows, problem, layout)
    _add_channel_rows(rows, problem, layout, links)
    _add_memory_rows(rows, problem, layout)
    head, tail = heads_and_tails_s(problem)  # (N,), (N,) seconds
    _add_head_tail_rows(rows, problem, layout, head, tail)
    if window_rows:
        _add_window_rows(rows, problem, layout, tail)
    start, index, value, row_lower, row_upper = rows.csr()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = layout.num_cols, rows.count
    cost = placement_weight * _placement_cost(problem, layout, links) if placement_weight else np.zeros(layout.num_cols)
    cost[layout.w_col] = 1.0
    upper = np.full(layout.num_cols, np.inf)
    upper[: layout.s_col[0] if problem.graph.num_ops else layout.w_col] = 1.0  # x, z, y in [0, 1]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, np.zeros(layout.num_cols), upper
    lp.row_lower_, lp.row_upper_ = row_lower, row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = layout.num_cols, rows.count
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = start, index, value
    if integer:
        kinds = [highspy.HighsVarType.kContinuous] * layout.num_cols
        for col in layout.x_col[layout.x_col >= 0].tolist():
            kinds[col] = highspy.HighsVarType.kInteger
        lp.integrality_ = kinds
    return lp, layout


def solve_relaxation(problem: PlacementProblem, time_limit_s: float, integer: bool = True,
                     threads: int = 1, placement_weight: float = 0.0,
                     forbidden: Sequence[np.ndarray] = (), incumbent_after_s: float | None = None,
                     start: np.ndarray | None = None, stop: threading.Event | None = None,
                     window_rows: bool = True,
                     measured: Sequence[tuple[np.ndarray, float]] = ()) -> RelaxationResult:
    """Build and solve; the bound is HiGHS's dual bound (MIP) or the optimum (LP, only when optimal).
    Building counts against ``time_limit_s``: when it took all of it, HiGHS does not run (status NOT_SOLVED).
    A MIP also returns its best integer placement. With ``placement_weight``, ``forbidden`` or ``measured`` the model
    is no longer the relaxation of every placement, so no bound is returned (``bound_s`` None).
    ``incumbent_after_s``: a MIP stops ("time limit") once this many seconds have passed and it holds an
    integer point and a dual bound; without them it goes on, up to ``time_limit_s``. ``start`` (U,): a unit
    placement given to HiGHS as a starting solution (its other columns left for HiGHS to complete). ``stop``:
    once set (by another thread), the solve stops at HiGHS's next interrupt check (status "stopped"; a MIP's
    dual bound so far still holds, an LP cut short proves nothing). ``window_rows=False`` leaves out
    constraint 7: a weaker bound, still valid, and other integer points (exact's candidate solves).
    ``measured``: ((U,) placement, its measured step in seconds) pairs, one cut each (``_add_measured_rows``);
    they lift w near placements that measured slow, so ``makespan_s`` is then that model's w, not the
    relaxation's."""
    began = time.perf_counter()
    # proven here: the memory rows are in GB, and HiGHS's feasibility tolerances (1e-7 to 1e-6) took devices of
    # a few bytes holding hundreds as a fit ("optimal" beside an "infeasible" LP)
    if parameters_cannot_fit(problem):
        return RelaxationResult(None, "infeasible", time.perf_counter() - began, 0, 0)
    lp, layout = _build(problem, integer, placement_weight, forbidden, window_rows, measured)
    highs = quiet_highs()
    highs.setOptionValue("threads", int(threads))
    highs.setOptionValue("random_seed", 0)
    remaining_s = time_limit_s - (time.perf_counter() - began)  # building counts against the limit
    if not remaining_s > 0:
        return RelaxationResult(None, NOT_SOLVED, time.perf_counter() - began, lp.num_row_, lp.num_col_)
    highs.setOptionValue("time_limit", float(remaining_s))
    if highs.passModel(lp) == highspy.HighsStatus.kError:  # a coefficient past HiGHS's 1e15: it ran an empty model
        return RelaxationResult(None, REFUSED, time.perf_counter() - began, lp.num_row_, lp.num_col_)
    if integer and start is not None:
        _set_start(highs, layout, start)
    interrupted, improving = [], []
    if integer:
        _record_improving(highs, layout, improving)
    if integer and incumbent_after_s is not None:
        _stop_once_an_incumbent_after(highs, began + incumbent_after_s, interrupted)
    if stop is not None:
        _stop_when_set(highs, stop)
    with _interruptible(highs):
        ran = highs.run()
    if ran != highspy.HighsStatus.kOk and highs.getModelStatus() == highspy.HighsModelStatus.kNotset:
        # HiGHS keeps one task scheduler per process: a later solve asking another thread count fails
        raise PlacerError(f"HiGHS could not solve the relaxation (threads={threads}; one process must use "
                          f"one thread count)")
    status = highs.getModelStatus()
    name = "time limit" if interrupted and status == highspy.HighsModelStatus.kInterrupt else _status_name(status)
    if stop is not None and stop.is_set() and status == highspy.HighsModelStatus.kInterrupt:
        name = STOPPED
    if name == "infeasible" and not len(forbidden) and not len(measured) and _parameters_fit(problem):
        name = NUMERICAL_INFEASIBLE  # only memory can leave the relaxation without a point, and a placement fits
    info = highs.getInfo()
    bound_ms = None
    if integer and np.isfinite(info.mip_dual_bound):
        bound_ms = max(float(info.mip_dual_bound), 0.0)
    elif not integer and name == "optimal":
        bound_ms = float(info.objective_function_value)
    if placement_weight or len(forbidden) or len(measured):
        bound_ms = None
    placement, makespan_s = _incumbent(highs, layout) if integer else (None, math.nan)
    earlier = _distinct(improving, placement)
    return RelaxationResult(None if bound_ms is None else bound_ms / MS_PER_S, name,
                            time.perf_counter() - began, lp.num_row_, lp.num_col_, placement, makespan_s,
                            earlier)


def proven_s(bound_s: float) -> float:
    """HiGHS's bound ``bound_s`` less what its tolerances can put above the true optimum: ``SOLVER_SLACK``
    relative, and twice the MIP's absolute tolerance (2 ns). The absolute part matters only for steps of
    microseconds or less: on a 4-op graph stepping in 76 ns the MIP's dual bound came out 0.9% (0.7 ns) above
    a placement's simulated step; a reviewer's random graphs of such steps, up to 0.5 ns above."""
    return max(bound_s * (1.0 - SOLVER_SLACK) - 2 * MIP_FEASIBILITY_TOLERANCE_MS / MS_PER_S, 0.0)


def relaxed_step_s(problem: PlacementProblem, unit_placement: np.ndarray, time_limit_s: float) -> float:
    """The relaxation's least step for one (U,) placement of the units: its x fixed, the rest solved (an LP in
    effect); nan unless HiGHS proves it within ``time_limit_s``. What a MIP's integer point carries is its w
    there, which nothing minimised for that placement (an earlier point's, or one the time limit cut short):
    a "solver's makespan" above the placement's measured step, where the relaxation's is never above it."""
    lp, layout = _build(problem, True, 0.0, ())
    highs = quiet_highs()
    highs.setOptionValue("threads", 1)  # as every solve here: HiGHS keeps one thread count per process
    highs.setOptionValue("time_limit", float(time_limit_s))
    highs.passModel(lp)
    for unit, device in enumerate(np.asarray(unit_placement, dtype=np.int64).tolist()):
        for d, col in enumerate(layout.x_col[unit].tolist()):
            if col >= 0:
                value = 1.0 if d == device else 0.0
                highs.changeColBounds(int(col), value, value)
    with _interruptible(highs):
        highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return math.nan
    # less HiGHS's tolerances, as every bound here: as solved it came out an ulp above the simulated step
    return proven_s(float(highs.getInfo().objective_function_value) / MS_PER_S)


def _distinct(points: list, best: np.ndarray | None) -> list[tuple[np.ndarray, float]]:
    """``points`` ((U,) placement, w) without repeats (the first kept) and without ``best``."""
    kept, seen = [], set() if best is None else {best.tobytes()}
    for placement, w_s in points:
        if placement.tobytes() not in seen:
            seen.add(placement.tobytes())
            kept.append((placement, w_s))
    return kept


def _record_improving(highs: highspy.Highs, layout: _Layout, improving: list) -> None:
    """Append ((U,) placement, w in seconds) to ``improving`` for each integer point better than the last."""
    def on_improving(event) -> None:
        values = np.asarray(event.data_out.mip_solution, dtype=np.float64)  # (columns,)
        improving.append((_placement_of(values, layout), float(values[layout.w_col]) / MS_PER_S))

    highs.cbMipImprovingSolution.subscribe(on_improving)


def _stop_once_an_incumbent_after(highs: highspy.Highs, stop_at: float, interrupted: list) -> None:
    """Interrupt the MIP from ``stop_at`` (perf_counter seconds) on, as soon as it holds an integer point and
    a dual bound; appends True to ``interrupted`` when it did."""
    def on_interrupt(event) -> None:
        out = event.data_out
        found = math.isfinite(out.mip_primal_bound) and math.isfinite(out.mip_dual_bound)
        if found and time.perf_counter() >= stop_at:
            interrupted.append(True)
            event.interrupt()

    highs.cbMipInterrupt.subscribe(on_interrupt)


def _stop_when_set(highs: highspy.Highs, stop: threading.Event) -> None:
    """Interrupt the solve (simplex, interior point or branch and bound) once ``stop`` is set."""
    def on_interrupt(event) -> None:
        if stop.is_set():
            event.interrupt()

    for check in (highs.cbSimplexInterrupt, highs.cbIpmInterrupt, highs.cbMipInterrupt):
        check.subscribe(on_interrupt)


@contextmanager
def _interruptible(highs: highspy.Highs):
    """Ctrl-C stops the solve at HiGHS's next interrupt check (simplex, interior point or branch and bound),
    then raises KeyboardInterrupt. ``run`` holds the main thread in C++, where Python's own handler only ran
    once the solve had ended: `placer bound` took up to its whole time limit to stop. Only where Ctrl-C is
    Python's default (the main thread, no handler of the caller's)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    pressed = []

    def on_interrupt(event) -> None:
        if pressed:
            event.interrupt()

    for check in (highs.cbSimplexInterrupt, highs.cbIpmInterrupt, highs.cbMipInterrupt):
        check.subscribe(on_interrupt)
    signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pressed:
        raise KeyboardInterrupt


def _set_start(highs: highspy.Highs, layout: _Layout, unit_placement: np.ndarray) -> None:
    """HiGHS's starting solution: the x columns of ``unit_placement`` (U,), which HiGHS completes (an LP
    with them fixed) into an integer point when they fit."""
    units = np.arange(len(unit_placement))
    chosen = layout.x_col[units, np.asarray(unit_placement, dtype=np.int64)]  # (U,) -1 where not allowed
    cols = layout.x_col[layout.x_col >= 0]
    values = np.isin(cols, chosen[chosen >= 0]).astype(np.float64)
    highs.setSolution(len(cols), cols.astype(np.int32), values)


def _incumbent(highs: highspy.Highs, layout: _Layout) -> tuple[np.ndarray | None, float]:
    """(U,) the MIP's best integer placement and its w in seconds, or (None, nan) when it has none."""
    if highs.getInfo().primal_solution_status != 2:  # 2: a feasible point
        return None, math.nan
    values = np.asarray(highs.getSolution().col_value)
    return _placement_of(values, layout), float(values[layout.w_col]) / MS_PER_S


def _placement_of(values: np.ndarray, layout: _Layout) -> np.ndarray:
    """(U,) int64: each unit's device in the column values of an integer point."""
    x = np.where(layout.x_col >= 0, values[np.maximum(layout.x_col, 0)], -1.0)  # (U, D)
    return x.argmax(axis=1).astype(np.int64)


_BANNER_SILENCED = []  # [True] once the process's first solver was made (with fd 1 at /dev/null)


def silence_highs_banner() -> None:
    """Make the process's first HiGHS solver, whose banner HiGHS prints on stdout (file descriptor 1, below
    Python; it would break a ``--json`` document), with fd 1 pointing at /dev/null; later solvers print none.
    fd 1 is the whole process's, so this is done once, on the calling thread: a solve in another thread (the
    search's proven bound, cluster/jobs/bound_solve.py, which calls this first) must not take it from the
    main thread's output."""
    if _BANNER_SILENCED:
        return
    with c_stdout_dropped():
        highspy.Highs()
    _BANNER_SILENCED.append(True)


def quiet_highs() -> highspy.Highs:
    """A silent solver (the banner silenced first, ``silence_highs_banner``)."""
    silence_highs_banner()
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    return highs


def _status_name(status) -> str:
    names = {highspy.HighsModelStatus.kOptimal: "optimal", highspy.HighsModelStatus.kTimeLimit: "time limit",
             highspy.HighsModelStatus.kInfeasible: "infeasible",
             highspy.HighsModelStatus.kInterrupt: "interrupted"}
    return names.get(status, str(status).rsplit(".", 1)[-1].removeprefix("k").lower())
