"""The physical lower bound on a step's time, reported next to every result.

``lower_bound_s = max(critical path, total work / number of devices)``, where every op takes its time on
its fastest allowed device (``min`` over the op's row of ``op_time_matrix``) and communication is free.
No placement can beat it: an op never runs faster than on its fastest device, a chain of dependent ops
runs one after another, and D devices do at most D ops at a time. (The simulator's step time is never
below it, with no slack: the work term is summed in another order than the simulator's clock, so it is
lowered by a margin of the rounding that order can cost, ``_summing_margin``.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphs.opgraph import OpGraph
from measurers.sim.costs import OpProfile, op_time_matrix
from measurers.machine import Machine


def lower_bound_s(graph: OpGraph, machine: Machine, profile: OpProfile | None = None) -> float:
    """max(critical path, total work / D) with each op on its fastest allowed device, no communication."""
    return lower_bound_from_times(graph, op_time_matrix(graph, machine, profile), machine.num_devices)


def lower_bound_from_times(graph: OpGraph, op_time_s: np.ndarray, num_devices: int) -> float:
    """The bound from an (N, D) op time matrix (``inf`` where an op may not run)."""
    if graph.num_ops == 0:
        return 0.0
    fastest_s = op_time_s.min(axis=1)  # (N,) float64
    offsets, edge_ids = graph.pred_csr
    path_s = _critical_path_s(graph.topo_order, offsets, np.ascontiguousarray(graph.edge_src[edge_ids]), fastest_s)
    return float(max(path_s, fastest_s.sum() / num_devices * _summing_margin(len(fastest_s))))


def _summing_margin(num_terms: int) -> float:
    """The work term's share left after rounding: the simulator's clock adds a device's op times one after
    another, each addition rounded down by up to one unit in 2**53, so its busy time can sit up to about
    N units below the exact sum (100,000 ops of 1e-5 s on one GPU: 0.99999999999808 s against a bound of
    1.0). numpy's pairwise sum and the division add under 64 more. The critical path needs none: it adds
    the same times in the order the simulator's clock does."""
    return 1.0 - (num_terms + 64) * 2.0**-53


@njit(cache=True)
def _critical_path_s(topo_order, pred_offsets, pred_src, fastest_s):
    """Longest path (sum of fastest_s along it) through the DAG."""
    finish = np.zeros(len(topo_order), dtype=np.float64)
    longest = 0.0
    for v in topo_order:
        start = 0.0
        for j in range(pred_offsets[v], pred_offsets[v + 1]):
            start = max(start, finish[pred_src[j]])
        finish[v] = start + fastest_s[v]
        longest = max(longest, finish[v])
    return longest
