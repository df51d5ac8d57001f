"""Warm start for the learned policies: start a learner from placements someone else found.

Every learned policy (reinforce, ppo, post, hierarchical) takes the option
``warm_start: Sequence[np.ndarray] | None``: candidate OP placements, each (N,) int64 for
``problem.graph``, ordered best-first by whoever chose them (the search job measures quick heuristics and
passes their placements). The policy checks them (``check_warm_start``), measures them inside its own
budget (``measure_warm_start``) and starts from the best that ran: the learner imitates it first, and its
best-so-far starts at that measurement, so a warm-started run never reports a best worse than its start.

This module imports no RLlib: the search job and the CLI check candidates with it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError
from measurers.base import Measurement
from policies.base import BudgetedMeasurer, LastResults
from policies.problem import PlacementProblem


@dataclass(frozen=True)
class WarmStart:
    """The candidate a learner starts from, and what it measured."""
    unit_placement: np.ndarray  # (U,) int64: collapsed onto the problem's units
    op_placement: np.ndarray  # (N,) int64: the unit placement expanded (what was measured)
    runtime_s: float
    candidate: int  # index into the candidates passed in

    @property
    def note(self) -> str:
        """What a run's notes say of it (kept in the learner's checkpoint, so a resumed run says it too)."""
        return f"warm start: candidate {self.candidate} at {self.runtime_s:.4f} s"


@dataclass(frozen=True)
class MeasuredCandidate:
    """One warm-start candidate as measured: a learner's memo keeps it, ok or not, so that sampling it
    again costs nothing."""
    unit_placement: np.ndarray  # (U,) int64
    op_placement: np.ndarray  # (N,) int64
    measurement: Measurement
    candidate: int  # index into the candidates passed in


def check_warm_start(problem: PlacementProblem, placements: Sequence[np.ndarray]) -> list[np.ndarray]:
    """int64 copies of ``placements``; PlacerError naming the candidate and the problem when one has the
    wrong length, names a device outside the machine, puts an op on a device kind it may not use, or
    splits a colocation group."""
    graph, num_devices = problem.graph, problem.num_devices
    checked = []
    for i, placement in enumerate(placements):
        array = np.asarray(placement)
        where = f"warm-start candidate {i} for graph {graph.name!r} on machine {problem.machine.name!r}"
        if array.ndim != 1 or len(array) != graph.num_ops:
            raise PlacerError(f"{where} has shape {array.shape}, expected ({graph.num_ops},): one device per op")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise PlacerError(f"{where} must hold integer device indices, got {array.dtype}")
        outside = (array < 0) | (array >= num_devices)  # before the cast: 2**64 - 1 in uint64 became -1
        if outside.any():
            raise PlacerError(f"{where} names device {int(array[outside][0])}, outside 0..{num_devices - 1}")
        array = array.astype(np.int64)
        forbidden = ~problem.op_allowed[np.arange(len(array)), array]  # (N,)
        if forbidden.any():
            op = int(np.flatnonzero(forbidden)[0])
            raise PlacerError(f"{where} puts op {op} on {problem.machine.devices[int(array[op])].name}, a device "
                              f"kind it may not use ({int(forbidden.sum())} such ops)")
        split = _split_colocation_group(graph.colocation_ids, array)
        if split is not None:
            raise PlacerError(f"{where} splits colocation group {split} across devices")
        checked.append(array.copy())
    return checked


def _split_colocation_group(colocation_ids: np.ndarray, placement: np.ndarray) -> int | None:
    """The first colocation group whose ops sit on more than one device, or None."""
    if not len(placement):
        return None
    groups = np.asarray(colocation_ids, dtype=np.int64)
    first = np.full(int(groups.max()) + 1, -1, dtype=np.int64)
    first[groups[::-1]] = placement[::-1]  # each group's device of its first op
    bad = np.flatnonzero(first[groups] != placement)
    return None if not len(bad) else int(groups[bad[0]])


def distinct_unit_placements(problem: PlacementProblem,
                             placements: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Candidates collapsed onto the problem's units, duplicates dropped (the first kept):
    (K, U) int64 and, per row, the index of the candidate it came from."""
    rows, origin, seen = [], [], set()
    for i, placement in enumerate(placements):
        units = problem.repair_allowed(problem.collapse(np.asarray(placement, dtype=np.int64)))  # (U,)
        key = units.tobytes()
        if key not in seen:
            seen.add(key)
            rows.append(units)
            origin.append(i)
    if not rows:
        return np.zeros((0, problem.num_units), dtype=np.int64), []
    return np.stack(rows).astype(np.int64), origin


def measure_candidates(problem: PlacementProblem, counter: BudgetedMeasurer,
                       placements: Sequence[np.ndarray] | None) -> list[MeasuredCandidate]:
    """Measure the distinct candidates (collapsed onto units) in ONE ``counter.measure`` call, so they
    count in the budget and reach ``on_measurement``; none when there are none or no budget is left.
    Candidates beyond the budget left are not measured (best-first order keeps the better ones)."""
    if not placements or counter.left <= 0:
        return []
    units, origin = distinct_unit_placements(problem, check_warm_start(problem, placements))
    units, origin = units[:counter.left], origin[:counter.left]
    op_placements = problem.expand(units)  # (K, N)
    before = counter.measurer
    capture = LastResults(before)
    counter.measurer = capture
    try:
        counter.measure(list(op_placements))
    finally:
        counter.measurer = before
    return [MeasuredCandidate(units[k].copy(), op_placements[k].copy(), measurement, origin[k])
            for k, measurement in enumerate(capture.last)]


def best_candidate(measured: Sequence[MeasuredCandidate]) -> WarmStart | None:
    """The fastest candidate that ran ok (the first of equals), or None when none did."""
    ok = [c for c in measured if c.measurement.ok]
    if not ok:
        return None
    best = min(ok, key=lambda c: c.measurement.runtime_s)
    return WarmStart(best.unit_placement, best.op_placement, float(best.measurement.runtime_s), best.candidate)


def measure_warm_start(problem: PlacementProblem, counter: BudgetedMeasurer,
                       placements: Sequence[np.ndarray] | None) -> WarmStart | None:
    """``measure_candidates``, then the best that ran ok: None when none ran ok, there were none, or no
    budget is left."""
    return best_candidate(measure_candidates(problem, counter, placements))
