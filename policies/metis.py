"""Balanced k-way min-cut over the GPUs (METIS through pymetis): the papers' Scotch / MinCut baselines.

The units (groups) become vertices weighted by their compute time on a GPU; two units are joined by an
undirected edge weighted by the bytes of the tensors between them. METIS cuts the graph into one part
per GPU with balanced compute and few bytes across the cut. It ignores the order ops run in and memory,
as the partitioners in the papers did, which is why it tends to lose to a single GPU. Seeds 0 and 1 give the
same partition (glibc's ``srand(0)`` is ``srand(1)``; graphs/grouping.py says why it is kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.c_stdout import c_stdout_dropped
from policies.base import DecisionClock, check_budget, finish
from policies.problem import PlacementProblem

MAX_TOTAL_WEIGHT = 10**8  # METIS sums weights in 32-bit integers


@dataclass
class MetisPolicy:
    name: str = "metis"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        units, cut_bytes = metis_units(problem, seed)
        return finish(self.name, problem, units, clock, measurer, on_measurement,
                      notes=f"cut {cut_bytes / 1e6:.1f} MB")


def unit_edges(problem: PlacementProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Undirected unit-level edges (a < b) with summed tensor bytes."""
    graph = problem.graph
    a, b = problem.op_unit[graph.edge_src], problem.op_unit[graph.edge_dst]
    keep = a != b
    lo, hi = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
    key = lo * problem.num_units + hi
    pairs, inverse = np.unique(key, return_inverse=True)
    nbytes = np.bincount(inverse, weights=graph.edge_bytes[keep].astype(np.float64), minlength=len(pairs))
    return pairs // problem.num_units, pairs % problem.num_units, nbytes


def _scaled(weights: np.ndarray) -> np.ndarray:
    """Positive int weights whose sum fits METIS's integers, proportional to ``weights``."""
    total = float(weights.sum())
    scale = MAX_TOTAL_WEIGHT / total if total > 0 else 1.0
    return np.maximum(1, np.round(weights * min(scale, 1e6))).astype(np.int64)


def metis_units(problem: PlacementProblem, seed: int = 0) -> tuple[np.ndarray, float]:
    """(U,) device of every unit and the bytes crossing the cut."""
    import pymetis

    gpus = np.asarray(problem.gpu_indices() or list(range(problem.num_devices)), dtype=np.int64)
    if len(gpus) == 1 or problem.num_units <= 1:
        return problem.repair_allowed(np.full(problem.num_units, gpus[0], dtype=np.int64)), 0.0
    src, dst, nbytes = unit_edges(problem)
    u = problem.num_units
    if u <= len(gpus):  # a GPU per unit; METIS asked for more parts than vertices prints on stdout and fails
        return problem.repair_allowed(gpus[:u].copy()), float(nbytes.sum())
    both_src = np.concatenate([src, dst])
    both_dst = np.concatenate([dst, src])
    both_w = _scaled(np.concatenate([nbytes, nbytes]))
    order = np.lexsort((both_dst, both_src))
    xadj = np.zeros(u + 1, dtype=np.int64)
    np.cumsum(np.bincount(both_src, minlength=u), out=xadj[1:])
    compute_s = problem.unit_time_s[:, gpus]
    vweights = _scaled(np.where(np.isfinite(compute_s), compute_s, 0.0).min(axis=1))
    options = pymetis.Options(seed=int(seed))
    with c_stdout_dropped():  # METIS's printf warnings, on stdout
        _, parts = pymetis.part_graph(len(gpus), xadj=xadj.tolist(), adjncy=both_dst[order].tolist(),
                                      vweights=vweights.tolist(), eweights=both_w[order].tolist(), options=options)
    units = gpus[np.asarray(parts, dtype=np.int64)]
    cut = float(nbytes[units[src] != units[dst]].sum())
    return problem.repair_allowed(units), cut
