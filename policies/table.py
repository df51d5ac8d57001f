"""Run several policies on one problem with the same measurer, and tabulate the results.

Each policy runs through ``policies.registry.place`` (searches place the problem's groups, heuristics
colocation groups). Every row is scored by the
same measurer and reported next to the lower bound and the best single GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from graphs.errors import PlacerError
from measurers.base import Measurement, Measurer
from policies.base import PolicyResult
from policies.problem import PlacementProblem
from policies.registry import place

SKIPPED = "skipped"  # row status of a policy that does not apply (e.g. no expert rule for the graph)


@dataclass(frozen=True)
class BaselineRow:
    policy: str
    runtime_s: float  # nan when skipped
    status: str  # a Measurement status, or SKIPPED
    ratio_to_lower_bound: float  # runtime / lower bound (nan when not ok)
    ratio_to_single_gpu: float  # runtime / best single GPU runtime (nan when either is not ok, or that is 0 s)
    placement_time_s: float  # deciding only
    measure_time_s: float
    measurements: int
    notes: str
    result: PolicyResult | None


@dataclass(frozen=True)
class BaselineTable:
    graph: str
    machine: str
    lower_bound_s: float
    single_gpu_s: float  # nan when the single GPU placement failed
    rows: tuple[BaselineRow, ...]

    def best(self) -> BaselineRow | None:
        ok = [row for row in self.rows if row.status == "ok"]
        return min(ok, key=lambda row: row.runtime_s) if ok else None

    def to_json(self) -> dict:
        """The table as plain JSON values (nan and inf become null)."""
        return {"graph": self.graph, "machine": self.machine, "lower_bound_s": self.lower_bound_s,
                "single_gpu_s": _number(self.single_gpu_s),
                "results": [{"policy": row.policy, "runtime_s": _number(row.runtime_s), "status": row.status,
                             "ratio_to_lower_bound": _number(row.ratio_to_lower_bound),
                             "ratio_to_single_gpu": _number(row.ratio_to_single_gpu),
                             "placement_time_s": row.placement_time_s, "measure_time_s": row.measure_time_s,
                             "measurements": row.measurements, "notes": row.notes} for row in self.rows]}


def _number(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def run_baselines(problem: PlacementProblem, measurer: Measurer, policies: Sequence[str], budget: int,
                  seed: int = 0,
                  on_measurement: Callable[[str, np.ndarray, Measurement], None] | None = None,
                  options: Mapping[str, dict] | None = None) -> BaselineTable:
    """Run each named policy (``budget`` measurements at most each, with its ``options``, if any) and score
    them side by side."""
    results: list[tuple[str, PolicyResult | None, str]] = []
    for name in policies:
        callback = None if on_measurement is None else _tagged(on_measurement, name)
        try:
            results.append((name, place(name, problem, measurer, budget, seed, callback,
                                        **(options or {}).get(name, {})), ""))
        except PlacerError as exc:
            results.append((name, None, str(exc)))
    single = next((r for n, r, _ in results if n == "single-gpu" and r is not None), None)
    if single is None and problem.gpu_indices():  # for the "x single GPU" column; logged and shown as the others
        single = place("single-gpu", problem, measurer, 1, seed,
                       None if on_measurement is None else _tagged(on_measurement, "single-gpu"))
        if "single-gpu" not in policies:  # a row too: the run's log and its best hold it (analyze reads them)
            results.append(("single-gpu", single, ""))
    single_s = single.best.runtime_s if single is not None and single.best.ok else math.nan
    rows = tuple(_row(name, result, error, problem.lower_bound_s, single_s) for name, result, error in results)
    return BaselineTable(problem.graph.name, problem.machine.name, problem.lower_bound_s, single_s, rows)


def _tagged(callback, name):
    return lambda placement, measurement: callback(name, placement, measurement)


def _row(name, result, error, lower_bound_s, single_s) -> BaselineRow:
    if result is None:
        return BaselineRow(name, math.nan, SKIPPED, math.nan, math.nan, 0.0, 0.0, 0, error, None)
    m = result.best
    ok = m.ok
    return BaselineRow(name, float(m.runtime_s), m.status,
                       m.runtime_s / lower_bound_s if ok and lower_bound_s > 0 else math.nan,
                       m.runtime_s / single_s if ok and single_s > 0 else math.nan,
                       result.placement_time_s, result.measure_time_s, result.measurements,
                       result.notes or m.error, result)
