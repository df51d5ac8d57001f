"""Teachers for the graph-neural placers: a plain search per training problem, whose best placement the
network imitates before it learns from rewards (as DOPPLER imitates a heuristic first, and Placeto and
GDP's from-scratch policies spend most of their samples finding what a search finds quickly).

``teach`` scores the quick heuristics (one measurement each), anneals the groups from the best of them
(collapsed onto the groups) with the rest of its budget, and returns the best group placement found, relabeled to its canonical form under the
machine's alike devices (``symmetry.canonical_placement``), so that every teacher uses device labels the
same way (the first layers on the first GPU of a board, and so on). The relabeled placement is measured
once more: alike devices run it alike up to the order in which a channel serves copies requested at the
same instant (by destination index: symmetry.py says how much that can move a step); it is kept unless it
measures more than ``RELABEL_TOLERANCE`` slower.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.errors import PlacerError
from measurers.base import Measurer
from policies.base import CountingMeasurer
from policies.problem import PlacementProblem
from policies.registry import QUICK_HEURISTICS, place
from policies.rl.gnn.symmetry import canonical_placement, device_automorphisms


RELABEL_TOLERANCE = 0.02  # the canonical relabeling is kept unless it measures this much slower


@dataclass(frozen=True)
class Teaching:
    units: np.ndarray  # (G,) int64, canonical labels
    runtime_s: float
    measurements: int  # spent finding it


def teach(problem: PlacementProblem, measurer: Measurer, budget: int, seed: int, position: np.ndarray,
          weight: np.ndarray) -> Teaching | None:
    """The best placement of the problem's groups found with ``budget`` measurements (None if none ran
    ok), canonical for the groups' topological ``position`` (G,) and work ``weight`` (G,)."""
    counted = CountingMeasurer(measurer)
    starts = []
    for name in QUICK_HEURISTICS:
        if budget - counted.used <= 1:
            break
        try:
            result = place(name, problem, counted, 1, seed)
        except PlacerError:  # e.g. no expert rule for this graph
            continue
        if result.best is not None and result.best.ok:
            starts.append((result.best.runtime_s, result.op_placement))
    starts.sort(key=lambda item: item[0])
    if budget - counted.used < 3:
        return None
    on_groups = [problem.expand(problem.collapse(p)) for _, p in starts]  # what the groups can express
    found = place("annealing", problem, counted, budget - counted.used - 1, seed, warm_start=on_groups)
    if found.best is None or not found.best.ok:
        return None
    units, runtime_s = found.group_placement, float(found.best.runtime_s)
    canonical = canonical_placement(units, position, weight, device_automorphisms(problem.machine))
    if not np.array_equal(canonical, units):  # the simulator breaks event ties by device index: measure it
        [measured] = counted.measure([problem.expand(canonical)])
        if measured.ok and measured.runtime_s <= runtime_s * (1 + RELABEL_TOLERANCE):
            units, runtime_s = canonical, float(measured.runtime_s)
    return Teaching(units, runtime_s, counted.used)

