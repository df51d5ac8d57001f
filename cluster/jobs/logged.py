"""The measurer a search's policy sees: the pool, tagged and logged, answering a resumed run from its log."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from cluster.runlog import RunLogWriter, read_run
from graphs.errors import PlacerError
from measurers.base import Measurement


@dataclass
class PastRows:
    """What the log of a resumed run already holds."""
    known: dict[bytes, Measurement] = field(default_factory=dict)
    """Op placement bytes -> its measurement (rows that were measured, not cache hits)."""
    logged: Counter = field(default_factory=Counter)
    """(policy, iteration, op placement bytes) -> rows: what a replayed iteration must not log again."""
    best_s: dict[str, float] = field(default_factory=dict)
    """Policy -> its best step that ran ok: where a resumed run's progress bar starts."""

    def first_iteration(self, policy: str) -> int:
        """The iteration of ``policy``'s first logged rows; 0 when it has none. A quick baseline logs at 0,
        but a log written before 3 December counted the baselines' batches together (m-etf at 1)."""
        return min((iteration for name, iteration, _ in self.logged if name == policy), default=0)

    def rows_to_replay(self, policy: str, from_iteration: int = 0) -> int:
        """Rows ``policy`` logged from iteration ``from_iteration`` on: what its resumed run replays from the
        log before it measures anything new (a learner replays only the iterations after its checkpoint)."""
        return sum(count for (name, iteration, _), count in self.logged.items()
                   if name == policy and iteration >= from_iteration)



class LoggedPoolMeasurer:
    """The Measurer a policy sees: sends each batch to the pool in one call, tags it with the policy and
    iteration, logs group placements, and answers placements already in the log of a resumed run.

    The iteration: with ``count_calls`` one per call, from ``first_iteration``; else a learner's own
    (``start_iteration``, called as each of its iterations ends; from ``first_iteration``, where a learner
    resumed from its checkpoint goes on). A learner skips the call when a batch holds only placements it
    has measured, and giph and placeto call several times per update, so calls do not count its
    iterations. (A search with device removals, never resumed, runs a fresh learner per phase: calls.)

    Such a placement is not measured again. If the log holds it under this policy and iteration (the
    learner replays the iterations after its checkpoint) it is not logged again either; otherwise it is
    logged as a cache hit, as the pool logs a placement met twice in one session. So a resumed run's log
    holds the rows a run never stopped would hold, each once."""

    def __init__(self, pool, problem, policy: str, past: PastRows | None = None,
                 on_batch: Callable[[Sequence[Measurement]], None] | None = None, *,
                 log: RunLogWriter | None = None, first_iteration: int = 0, count_calls: bool = True):
        self.pool, self.problem, self.policy = pool, problem, policy
        self.past = past or PastRows()
        self.on_batch = on_batch
        self.log = log
        self.iteration = first_iteration
        self.count_calls = count_calls
        self.replayed = 0  # rows of the log this session answered under their own iteration
        self.sent = 0  # placements sent to the pool: new ones, past what the log holds

    def start_iteration(self, iteration: int) -> None:
        """Tag what is measured from now on with ``iteration`` (a learner's, when its previous one ended)."""
        self.iteration = iteration

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        batch = [np.ascontiguousarray(p, dtype=np.int64) for p in placements]  # B x (N,)
        out: list[Measurement | None] = [self._from_log(p) for p in batch]
        todo = [i for i, m in enumerate(out) if m is None]
        if todo:
            self.sent += len(todo)
            results = self.pool.measure_results(
                [batch[i] for i in todo], policy=self.policy, iteration=self.iteration,
                log_placements=[log_placement(self.problem, batch[i]) for i in todo])
            for i, result in zip(todo, results):
                out[i] = result.measurement
        if self.count_calls:
            self.iteration += 1
        if self.on_batch is not None:
            self.on_batch(out)
        return out

    def _from_log(self, placement: np.ndarray) -> Measurement | None:
        """The logged measurement of ``placement`` (None: not measured yet), logging it as a cache hit
        unless this iteration logged it before the resume."""
        measurement = self.past.known.get(placement.tobytes())
        if measurement is None:
            return None
        slot = (self.policy, self.iteration, placement.tobytes())
        if self.past.logged[slot] > 0:
            self.past.logged[slot] -= 1
            self.replayed += 1
        elif self.log is not None:
            self._log_cache_hit(placement, measurement)
        return measurement

    def _log_cache_hit(self, placement: np.ndarray, measurement: Measurement) -> None:
        from cluster.pool import PoolResult

        now = time.time()
        self.log.append(PoolResult(-1, placement, measurement, "", "", now, now, now, cache_hit=True,
                                   policy=self.policy, iteration=self.iteration,
                                   log_placement=log_placement(self.problem, placement)))



def log_placement(problem, op_placement: np.ndarray):
    """What a log row records (a ``cluster.runlog.LoggedPlacement``): the (G,) group placement, level
    "group", when every group sits on one device, else the (N,) op placement, level "op" (a baseline that
    splits groups)."""
    from cluster.runlog import LoggedPlacement

    groups = problem.collapse(op_placement)
    if np.array_equal(problem.expand(groups), op_placement):
        return LoggedPlacement(groups, "group")
    return LoggedPlacement(np.asarray(op_placement, dtype=np.int64), "op")



def expand_logged(problem, logged: np.ndarray, level: str | None = None) -> np.ndarray:
    """Inverse of log_placement: the (N,) op placement of a logged row. ``level`` is the row's
    placement_level; None (a log of format version 1) tells the levels apart by length."""
    from cluster.runlog import placement_level_by_length

    logged = np.asarray(logged, dtype=np.int64)
    num_ops = problem.graph.num_ops
    level = placement_level_by_length(len(logged), num_ops) if level is None else level
    expected = num_ops if level == "op" else problem.num_units
    if len(logged) != expected:
        raise PlacerError(f"a logged {level} placement has {len(logged)} entries; this problem has {expected}")
    return logged if level == "op" else problem.expand(logged)



def past_rows(run_dir: Path, problem) -> PastRows:
    """What a resumed run's log holds: the placements it measured and its rows per policy and iteration."""
    past = PastRows()
    for row in read_run(run_dir).itertuples():
        key = expand_logged(problem, row.placement, row.placement_level).tobytes()
        past.logged[(row.policy, int(row.iteration), key)] += 1
        if row.status == "ok" and row.runtime_s < past.best_s.get(row.policy, math.inf):
            past.best_s[row.policy] = float(row.runtime_s)
        if not row.cache_hit:
            past.known[key] = Measurement(
                float(row.runtime_s), tuple(row.samples_s), row.status, tuple(int(b) for b in row.peak_bytes),
                float(row.measure_s), row.error or "")
    return past
