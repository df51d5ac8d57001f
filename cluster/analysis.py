"""Summaries of run logs, read from the run folders' Parquet files alone (no Ray, no graph rebuild).

    find_runs(paths)            run folders named directly or found below an experiment folder
    summarize(paths)            one RunSummary per run: best step time, ratios, failures by status, rates
    policy_bests(rows)          best ok step time of every policy tag logged in a run
    learning_curve(rows)        every measured step time and the best so far, per measurement and wall time

A run that is still being written, or one whose process was killed, reads the same way: only whole
Parquet files are ever visible, and ``read_run`` gives each row once, also while (or after a crash
while) a finished run's parts are compacted into one file (see cluster/runlog.py). The lower bound comes
from the manifest (searches and baselines runs record it), else from ``result.json`` (written when a
search finishes) or, when the graph is in the benchmark cache on disk, from the cached graph; otherwise
it is unknown (NaN). The proven bound (policies/exact/bound.py) is read, never solved: from the manifest,
else ``result.json``; runs made before it was recorded have none (NaN). A run that lost a device
(``placer search --remove-device``; the manifest's ``device_removals``) counts for its bests only the rows
whose placement does not use that device, as the run's own best placement does.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from cluster.jobs.config import BASELINES_FILE, BASELINES_POLICY, FILE_POLICY, warm_start_label
from cluster.jsonout import json_safe
from cluster.runlog import (MANIFEST_FILE, RunManifest, device_removals_done, read_manifest, read_result_json,
                            read_run, removed_device_indices, rows_without_devices)
from cluster.runlog_format import is_seconds, rows_avoiding
from graphs.errors import PlacerError
from policies.registry import groups_itself

MAX_DEPTH = 6  # how deep below a folder run folders are looked for (runs/reproduce/EXPERIMENT/CELL/RUN: 4)


@dataclass(frozen=True)
class PolicyBest:
    policy: str
    runtime_s: float  # best ok step time; nan when none was ok
    status: str  # "ok", or the most common failure status when nothing was ok
    measurements: int  # rows tagged with this policy (cache hits included)


@dataclass(frozen=True)
class RemovedDevice:
    """A device that left the run (``placer search --remove-device``): rows that use it count for no best."""
    device: str
    at_measurement: int  # the run's own measurements before it left
    machine_after: str


@dataclass(frozen=True)
class RunSummary:
    run_dir: str
    run_id: str
    graph: str
    machine: str
    policy: str
    policy_best_runtime_s: float  # the run's own policy, ok rows only (a `placer baselines --out` run: every
    # row); nan when none. The figure every ratio below compares
    overall_best_runtime_s: float  # every ok row of the run (its baselines and warm start included) that uses
    # no removed device: result.json's overall_best_runtime_s, best_placement.json's placement
    overall_best_source: str  # the policy tag of the row that found it; "" when none was ok
    lower_bound_s: float  # nan when unknown
    best_baseline_s: float  # best ok row tagged with another policy, in this run or a comparable one (same graph,
    # machine and measuring: comparable_key), a `placer baselines --out` run's included; nan when none
    best_baseline: str  # its policy tag
    best_baseline_run: str  # the other run that logged it; "" when this run did (or there is none)
    ratio_to_lower_bound: float
    ratio_to_best_baseline: float  # < 1: the policy beat every baseline
    measurements: int  # rows measured, every policy's (cache hits excluded): what measurements_per_s counts
    cache_hits: int
    failures: dict[str, int]  # status -> count, failures only
    wall_s: float  # the sessions' sum: each one's start (the manifest's, then each resume's) to its last
    # finished measurement; the wait between a stop and its resume is not counted (wall_s_of). A search's own
    # wall_s is longer: it also counts what came before its run folder (the graph, the proven bound, Ray's start)
    measurements_per_s: float
    finished: bool  # result.json is there
    baselines: tuple[PolicyBest, ...] = field(default=())  # every other policy tag logged in the run
    proven_bound_s: float = math.nan  # best proven bound recorded by the run; nan when none was
    proven_bound_holds_for: str = ""  # the placements it holds for (e.g. "placements of the 32 scope groups ...")
    ratio_to_proven_bound: float = math.nan
    removed_devices: tuple[RemovedDevice, ...] = field(default=())
    policy_measurements: int = 0  # rows of the run's own policy, cache hits included: what `placer search`
    # counts against its budget and reports as its measurements (a `placer baselines --out` run: every row)

    def to_json(self) -> dict:
        data = asdict(self)
        return json_safe(data)


@dataclass(frozen=True)
class LearningCurve:
    seq: np.ndarray  # (M,) int64: log order
    elapsed_s: np.ndarray  # (M,) float64: finished_at minus the run's start (with a manifest: sessions only)
    runtime_s: np.ndarray  # (M,) float64: NaN where unknown
    ok: np.ndarray  # (M,) bool
    status: np.ndarray  # (M,) object
    best_so_far_s: np.ndarray  # (M,) float64: best ok runtime up to and including each row; inf before any


def find_runs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Run folders: each path is a run folder, or a folder with run folders below it (an experiment)."""
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise PlacerError(f"{raw}: no such file or folder")
        if not path.is_dir():
            raise PlacerError(f"{raw}: not a run folder (it is a file)")
        if (path / MANIFEST_FILE).is_file():
            runs.append(path)
            continue
        found = _runs_below(path, MAX_DEPTH)
        if not found:
            raise PlacerError(f"{raw}: not a run folder or an experiment folder (no {MANIFEST_FILE} in it "
                              f"or in its subfolders)")
        runs.extend(found)
    runs = _first_of_each(runs)  # a run named twice (analyze RUN RUN, or a run and its experiment): once
    for run in runs:
        read_manifest(run)  # another format version or a broken manifest: one clear error
    return runs


def _first_of_each(runs: list[Path]) -> list[Path]:
    seen: set[Path] = set()
    unique = []
    for run in runs:
        if run.resolve() not in seen:
            seen.add(run.resolve())
            unique.append(run)
    return unique


def _runs_below(folder: Path, depth: int) -> list[Path]:
    if depth == 0:
        return []
    found = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (child / MANIFEST_FILE).is_file():
            found.append(child)
        else:
            found.extend(_runs_below(child, depth - 1))
    return found


def policy_bests(rows: pd.DataFrame) -> dict[str, PolicyBest]:
    """Best ok step time of every policy tag, in the order the tags first appear."""
    out = {}
    for policy in dict.fromkeys(rows["policy"].tolist()):
        mine = rows[rows["policy"] == policy]
        ok = mine[mine["status"] == "ok"]
        if len(ok):
            out[policy] = PolicyBest(policy, float(ok["runtime_s"].min()), "ok", len(mine))
        else:
            status = mine["status"].value_counts().idxmax() if len(mine) else "none"
            out[policy] = PolicyBest(policy, math.nan, str(status), len(mine))
    return out


def learning_curve(rows: pd.DataFrame, started_at: pd.Timestamp | None = None,
                   policy: str | None = None, manifest: RunManifest | None = None) -> LearningCurve:
    """The curve of ``rows`` (one run, ordered by seq), optionally of one policy tag only. With the run's
    ``manifest``, the best so far after a device left the run counts only placements without it, and the
    wall time counts the sessions' time only (``session_elapsed_s``: not the wait for a resume)."""
    sessions = (pd.Series(session_elapsed_s(rows, manifest), index=rows.index)
                if manifest is not None and len(rows) else None)  # of every row: a session ends at its last one
    if policy is not None:
        rows = rows[rows["policy"] == policy]
    rows = rows.sort_values("seq")
    runtime = rows["runtime_s"].to_numpy(dtype=np.float64)  # (M,)
    ok = (rows["status"] == "ok").to_numpy() & np.isfinite(runtime)  # (M,)
    best = np.minimum.accumulate(np.where(ok, runtime, np.inf)) if len(rows) else np.zeros(0)
    gone: set[int] = set()
    for removal in device_removals_done(manifest) if manifest is not None and len(rows) else ():
        gone.add(int(removal["index"]))
        after = rows["seq"].to_numpy() >= int(removal.get("at_seq", 0))  # (M,)
        kept_best = np.minimum.accumulate(np.where(ok & rows_avoiding(rows, gone), runtime, np.inf))
        best = np.where(after, kept_best, best)
    finished = rows["finished_at"]
    if started_at is None:
        started_at = finished.min() if len(rows) else None
    if sessions is not None:
        elapsed = sessions.loc[rows.index].to_numpy(dtype=np.float64)  # (M,)
    else:
        elapsed = ((finished - started_at).dt.total_seconds().to_numpy(dtype=np.float64) if len(rows)
                   else np.zeros(0))
    return LearningCurve(rows["seq"].to_numpy(dtype=np.int64), elapsed, runtime, ok,
                         rows["status"].to_numpy(dtype=object), best)


def run_started_at(manifest: RunManifest) -> pd.Timestamp | None:
    try:
        return pd.Timestamp(manifest.started_at).tz_convert("UTC")
    except (ValueError, TypeError):
        return None


def summarize(paths: Sequence[str | os.PathLike]) -> list[RunSummary]:
    """One summary per run found under ``paths``; each is compared with the best baseline among its own and
    those logged by the other runs read that were measured alike (``comparable_key``: the other runs of an
    experiment, a `placer baselines --out` run beside it)."""
    runs = find_runs(paths)
    loaded = []
    baseline_rows: dict[tuple, list[pd.DataFrame]] = {}  # every run's rows of other policies
    for run in runs:
        manifest, rows = read_manifest(run), read_run(run)
        usable = rows_without_devices(rows, removed_device_indices(manifest))  # bests count these only
        bests = policy_bests(usable)
        others = _baseline_rows(manifest, usable).assign(**{LOGGED_BY: manifest.run_id})
        baseline_rows.setdefault(comparable_key(manifest), []).append(others)
        loaded.append((run, manifest, rows, usable, bests))
    pooled = {key: pd.concat(frames, ignore_index=True) for key, frames in baseline_rows.items()}
    return [_summary(run, manifest, rows, usable, bests, _baseline_pool(manifest, pooled[comparable_key(manifest)]))
            for run, manifest, rows, usable, bests in loaded]


LOGGED_BY = "_logged_by"  # column of the pooled rows: the run id that logged each


def comparable_key(manifest: RunManifest) -> tuple:
    """What makes two runs' step times comparable: one graph, one machine (its whole description: an edited
    copy of a catalog file keeps the name), and one measurer with the same noise, timed runs, warmup and
    estimator (a noisy search's single-gpu is no baseline of a noiseless run)."""
    config = manifest.config
    noise_std = config.get("noise_std") or 0.0  # `placer baselines` has no --noise: 0
    machine = json.dumps(manifest.machine, sort_keys=True) if manifest.machine else manifest.machine_name
    return (manifest.graph_hash, machine, str(config.get("measurer", "sim")),
            _hashable(noise_std), manifest.runs, manifest.warmup, manifest.estimator)


def _hashable(value):
    return value if isinstance(value, (int, float, str)) else repr(value)


@dataclass(frozen=True)
class BaselinePool:
    bests: list[PolicyBest]  # the best of each baseline policy
    logged_by: dict[str, str]  # policy -> run id of another run that logged its best ("" for the run's own)


def _baseline_pool(manifest: RunManifest, rows: pd.DataFrame) -> BaselinePool:
    """The best of each baseline that this run and the comparable runs logged (``rows``, other policies' rows of
    each, LOGGED_BY naming its run), on the devices this run kept (a device that left this run would make
    another run's placement one it can no longer run). The run's own policy is no baseline of it, also where
    another run scored it as one; a tie goes to the run's own row."""
    kept = rows_without_devices(rows, removed_device_indices(manifest))
    kept = _baseline_rows(manifest, kept)
    bests = policy_bests(kept)
    ok = kept[kept["status"] == "ok"].assign(_other=kept[LOGGED_BY] != manifest.run_id)
    first = ok.sort_values(["runtime_s", "_other"], kind="stable").drop_duplicates("policy")
    logged_by = {str(p): ("" if r == manifest.run_id else str(r)) for p, r in zip(first["policy"], first[LOGGED_BY])}
    return BaselinePool(list(bests.values()), logged_by)


def _not_baselines(manifest: RunManifest) -> tuple[str, str]:
    """Policies whose rows are no baseline of the run: its own, and a warm start's re-measurement of a placement
    from a file or run folder (FILE_POLICY: another search's best, perhaps this policy's own)."""
    return manifest.policy, FILE_POLICY


def _baseline_rows(manifest: RunManifest, rows: pd.DataFrame) -> pd.DataFrame:
    return rows[~rows["policy"].isin(_not_baselines(manifest))]


def _own_baselines(manifest: RunManifest, bests: dict[str, PolicyBest]) -> list[PolicyBest]:
    return [b for p, b in bests.items() if p not in _not_baselines(manifest)]


def _summary(run: Path, manifest: RunManifest, rows: pd.DataFrame, usable: pd.DataFrame,
             bests: dict[str, PolicyBest], pool: BaselinePool) -> RunSummary:
    """``rows``: the whole log; ``usable``: those on devices the run kept; ``bests``: policy_bests(usable)."""
    own = bests.get(manifest.policy)
    own_best = own.runtime_s if own is not None else math.nan
    overall, overall_source = _fastest(usable[usable["status"] == "ok"])
    if overall_source == FILE_POLICY:  # named as result.json names it
        overall_source = warm_start_label(str(manifest.config.get("warm_start")))
    finished = read_result_json(run) is not None
    if manifest.policy == BASELINES_POLICY:  # a `placer baselines --out` run: its best is the best baseline
        own_best, finished = overall, (run / BASELINES_FILE).is_file()
    ok_pool = [b for b in pool.bests if b.status == "ok"]
    baseline = min(ok_pool, key=lambda b: b.runtime_s) if ok_pool else None
    measured = rows[~rows["cache_hit"].astype(bool)]
    policy_rows = rows if manifest.policy == BASELINES_POLICY else rows[rows["policy"] == manifest.policy]
    failures = {str(k): int(v) for k, v in rows.loc[rows["status"] != "ok", "status"].value_counts().items()}
    wall_s = wall_s_of(rows, manifest)
    lower = lower_bound_of(run, manifest)
    proven_s, proven_for = proven_bound_of(run, manifest)
    baseline_s = baseline.runtime_s if baseline is not None else math.nan
    return RunSummary(
        run_dir=str(run), run_id=manifest.run_id, graph=manifest.graph_name, machine=manifest.machine_name,
        policy=manifest.policy, policy_best_runtime_s=own_best, overall_best_runtime_s=overall,
        overall_best_source=overall_source, lower_bound_s=lower,
        best_baseline_s=baseline_s, best_baseline=baseline.policy if baseline is not None else "",
        best_baseline_run=pool.logged_by.get(baseline.policy, "") if baseline is not None else "",
        ratio_to_lower_bound=_ratio(own_best, lower), ratio_to_best_baseline=_ratio(own_best, baseline_s),
        measurements=len(measured), cache_hits=len(rows) - len(measured), failures=failures, wall_s=wall_s,
        measurements_per_s=len(measured) / wall_s if wall_s > 0 else math.nan,
        finished=finished, baselines=tuple(_own_baselines(manifest, bests)),
        proven_bound_s=proven_s, proven_bound_holds_for=proven_for,
        ratio_to_proven_bound=math.nan if groups_itself(manifest.policy) else _ratio(own_best, proven_s),
        removed_devices=tuple(RemovedDevice(str(r["device"]), int(r["at_measurement"]), str(r["machine_after"]))
                              for r in device_removals_done(manifest)),
        policy_measurements=len(policy_rows))


def _fastest(ok_rows: pd.DataFrame) -> tuple[float, str]:
    """(step time, policy tag) of the fastest row, the first logged on a tie; (nan, "") for none."""
    if not len(ok_rows):
        return math.nan, ""
    first = ok_rows.sort_values(["runtime_s", "seq"], kind="stable").iloc[0]
    return float(first["runtime_s"]), str(first["policy"])


def wall_s_of(rows: pd.DataFrame, manifest: RunManifest) -> float:
    """Seconds the run spent: each session's (its start, then each resume's) up to its last measurement.
    The time a stopped run waited for its resume is not counted (it made a resumed run look 4x slower)."""
    if not len(rows):
        return 0.0
    return max(float(session_elapsed_s(rows, manifest).max()), 0.0)


def session_elapsed_s(rows: pd.DataFrame, manifest: RunManifest) -> np.ndarray:
    """(M,) seconds from the run's start to each row's finish, counting the sessions' time only (each from
    its start, then each resume's, to its last measurement): the wait for a resume is left out, as in
    ``wall_s_of``. A row finished before the first session started counts 0."""
    started = run_started_at(manifest)
    starts = sorted([started if started is not None else rows["submitted_at"].min(),
                     *(_timestamp(record.get("at")) for record in manifest.resumes)], key=lambda t: t.value)
    finished = rows["finished_at"]
    elapsed = np.zeros(len(rows), dtype=np.float64)  # (M,)
    offset_s = 0.0  # the sessions before this one
    for start, end in zip(starts, [*starts[1:], None]):
        mine = ((finished >= start) & (finished < end) if end is not None else finished >= start).to_numpy()
        if mine.any():
            session_s = (finished[mine] - start).dt.total_seconds().to_numpy(dtype=np.float64)
            elapsed[mine] = offset_s + session_s
            offset_s += float(session_s.max())
    return elapsed


def _timestamp(text) -> pd.Timestamp:
    try:
        return pd.Timestamp(text).tz_convert("UTC")
    except (ValueError, TypeError):  # a damaged resume record: its session counts with the one before
        return pd.Timestamp.max.tz_localize("UTC")


def _ratio(numerator: float, denominator: float) -> float:
    if math.isfinite(numerator) and math.isfinite(denominator) and denominator > 0:
        return numerator / denominator
    return math.nan


def lower_bound_of(run: Path, manifest: RunManifest) -> float:
    """The lower bound: from the manifest, else result.json, else from the graph in the on-disk cache,
    else NaN."""
    if manifest.lower_bound_s is not None:
        return float(manifest.lower_bound_s)
    value = (read_result_json(run) or {}).get("lower_bound_s")
    if is_seconds(value):
        return float(value)
    graph = cached_graph(manifest)
    if graph is None:
        return math.nan
    from measurers.catalog import machine_from_json
    from measurers.sim.lower_bound import lower_bound_s

    return float(lower_bound_s(graph, machine_from_json(manifest.machine)))


def proven_bound_of(run: Path, manifest: RunManifest) -> tuple[float, str]:
    """(seconds, what it holds for) of the proven bound the run recorded: the manifest's, else
    result.json's; (NaN, "") when neither has one."""
    if manifest.proven_bound_s is not None:
        return float(manifest.proven_bound_s), manifest.proven_bound_holds_for or ""
    data = read_result_json(run) or {}
    if is_seconds(data.get("proven_bound_s")):
        return float(data["proven_bound_s"]), str(data.get("proven_bound_holds_for") or "")
    return math.nan, ""


def cached_graph(manifest: RunManifest):
    """The run's graph when it can be had without tracing (a graph file, or the benchmark cache) and
    still has the hash the run logged; else None."""
    from graphs import registry
    from graphs.io import load_graph_file

    name = str(manifest.config.get("graph", manifest.graph_name))
    candidates = [Path(name)] + ([Path(manifest.graph_file)] if manifest.graph_file else [])
    cached = registry.cached_graph_path(name)
    if cached is not None:
        candidates.append(cached)
    for path in candidates:
        if path.is_file():
            try:
                graph = load_graph_file(path)
            except PlacerError:
                continue
            if graph.content_hash == manifest.graph_hash:
                return graph
    return None
