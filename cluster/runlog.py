"""The run log: one folder per run, Parquet inside, safe against a process killed at any moment.

Layout of ``<root>/<run_id>/``::

    manifest.json          run id, command, config, graph hash, machine, versions, seed, start time,
                           timing (runs, warmup, estimator: how runtime_s is reduced from samples_s)
    measurements/          Parquet dataset, one small file per flush: part-000000.parquet, ...
    metrics/               the same for learner metrics (long format: iteration, name, value)
    best_placement.json    the fastest ok placement so far
    groups.parquet         group-to-op map (op, group), once per run, when placements are per group

A ``ParquetWriter`` left open loses its whole file when the process dies (the footer is written on close),
so every flush writes a complete small file under a temporary dot-name and ``os.replace``s it into place:
readers (pandas, pyarrow.dataset, DuckDB) skip dot-files and only ever see whole files. The files read
without project code, e.g. ``duckdb.sql("select * from 'run/measurements/*.parquet'")``.

A row's ``placement`` is one device per group or one device per op; ``placement_level`` ("group" or
"op") says which. Logs of format version 1 have no such column: ``read_run`` fills it by length (op when
the run has no ``groups.parquet`` or the placement has one entry per op, else group).

This module writes (``RunLogWriter``, ``compact_run``, manifests). The file names, schemas, the manifest
and best-placement records and the readers (``read_run``, ``read_runs``, ``read_metrics``, ``read_best``,
...) are in ``cluster.runlog_format``; every one of them can be imported from here too.

Compaction. A run that finishes cleanly (``close(compact=True)``, or leaving ``with RunLogWriter...``
without an exception) rewrites each of ``measurements/`` and ``metrics/`` as one file holding every row in
``seq`` order, named with the next part number (``part-<highest + 1>.parquet``): write it under a
dot-name, rename it in, then delete the old parts. A visible file is never changed, only created whole or
deleted, and every step leaves each row in at least one visible file; a row is in two files only between
the rename and the last delete (or after a crash there). ``read_run`` / ``read_metrics`` keep the first
row of each ``seq`` (unique within a run) and list again when a part vanishes between listing and
reading, so project readers see every row exactly once at every moment. A foreign reader (pandas, DuckDB)
can see those duplicates in that window or after such a crash, until the run's next clean close (after a
resume) compacts again. A resumed run goes on with the part number after the highest there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import importlib.metadata
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# the format and its readers, re-exported: callers import them from here
from cluster.runlog_format import (BEST_FILE, FORMAT_VERSION, GROUPS_FILE, MANIFEST_FILE, MEASUREMENT_SCHEMA,
                                   MEASUREMENTS_DIR, METRIC_SCHEMA, METRICS_DIR, PART_NAME, PLACEMENT_LEVELS,
                                   READ_ATTEMPTS, READABLE_FORMAT_VERSIONS, RESULT_FILE, BestPlacement, RunManifest,
                                   check_run_log, device_removals_done, op_placement_of, part_files,
                                   placement_level_by_length, read_best, read_groups, read_manifest, read_metrics,
                                   ran_ok, read_result_json, read_run, read_runs, read_table, removed_device_indices,
                                   rows_without_devices)
from graphs.errors import PlacerError
from graphs.files import atomic_file, being_written
from measurers.catalog import machine_to_json
from measurers.timing import ESTIMATOR, REAL_TIMING, TimingSettings

if TYPE_CHECKING:
    from cluster.pool import PoolResult
    from graphs.opgraph import OpGraph
    from measurers.base import Measurement
    from measurers.machine import Machine

VERSIONED_PACKAGES = ("placer", "ray", "torch", "tensorflow", "numpy", "pyarrow")


@dataclass(frozen=True, eq=False)
class LoggedPlacement:
    """What a log row records for a placement: its devices and whether they are per group or per op.
    The producer (the search job) decides; the pool passes it through to the writer."""
    devices: np.ndarray  # (G,) or (N,) device indices
    level: str  # "group" | "op"

    def __post_init__(self) -> None:
        if self.level not in PLACEMENT_LEVELS:
            raise PlacerError(f"placement level must be one of {PLACEMENT_LEVELS}, got {self.level!r}")


def package_versions() -> dict:
    """Versions of the packages a run depends on, without importing them."""
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str:
    """The CPU's model name ("model name" in /proc/cpuinfo; platform.processor() elsewhere; "" unknown).

    Recorded in every manifest: the same seed gives the same learned placement on one CPU model, not
    across models (torch's float kernels round differently per instruction set)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor()


RUN_ID_GRAPH_CHARS = 96  # the graph name's share of a run id (make_run_id)


def make_run_id(graph_name: str, policy: str, seed: int, when: float | None = None,
                root: str | os.PathLike | None = None) -> str:
    """``<graph>__<policy>__<seed>__<UTC time>``, safe as a folder name; with ``root``, ``-2``, ``-3``, ...
    appended while ``root`` already holds a run of that name, or a run of that name is being written there
    (two runs started within one second: the second chose the first's name while its folder was staged, and
    failed when both were done, its whole run discarded; two started at the same instant still can). A graph
    name longer than ``RUN_ID_GRAPH_CHARS`` is cut there and ends in a hash of the whole name: a file system
    takes 255 bytes a name, less the staging folder's suffix (graphs/files.py ``_temp_name``)."""
    stamp = dt.datetime.fromtimestamp(time.time() if when is None else when, dt.timezone.utc)
    graph_part = re.sub(r"[^A-Za-z0-9_.=-]", "-", graph_name)
    graph_part = re.sub(r"^[.-]+", "", graph_part) or "graph"  # ".x" hid the run (analyze skips dot-named folders)
    if len(graph_part) > RUN_ID_GRAPH_CHARS:
        digest = hashlib.sha1(graph_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        graph_part = f"{graph_part[:RUN_ID_GRAPH_CHARS - 9]}-{digest}"
    text = re.sub(r"[^A-Za-z0-9_.=-]", "-", f"{graph_part}__{policy}__{seed}__{stamp:%Y%m%dT%H%M%S}")
    if root is None:
        return text
    run_id, k = text, 1
    while (Path(root) / run_id).exists() or being_written(Path(root), run_id):
        k += 1
        run_id = f"{text}-{k}"
    return run_id


def new_manifest(run_id: str, graph: OpGraph, machine: Machine, *, seed: int, policy: str = "",
                 config: Mapping | None = None, command: Sequence[str] | None = None,
                 lower_bound_s: float | None = None, runs: int = REAL_TIMING.runs,
                 warmup: int = REAL_TIMING.warmup, estimator: str = ESTIMATOR) -> RunManifest:
    """``runs`` / ``warmup``: what the run's measurer really does (the simulator: 1 and 0); the defaults
    are ``measurers.timing.TimingSettings``'s."""
    timing = TimingSettings(runs=int(runs), warmup=int(warmup))  # a bad count is a PlacerError here
    return RunManifest(
        run_id=run_id, command=tuple(invocation() if command is None else command), config=dict(config or {}),
        graph_name=graph.name, graph_hash=graph.content_hash, machine_name=machine.name,
        machine=machine_to_json(machine), versions=package_versions(),
        seed=int(seed), started_at=dt.datetime.now(dt.timezone.utc).isoformat(), policy=policy,
        lower_bound_s=None if lower_bound_s is None else float(lower_bound_s), runs=timing.runs,
        warmup=timing.warmup, estimator=str(estimator), cpu=cpu_model(), graph_file=_graph_file(config))


def _graph_file(config: Mapping | None) -> str:
    """The absolute path of the graph file ``config["graph"]`` names (a run read later from another folder
    finds it), else ""."""
    path = Path(str((config or {}).get("graph", "")))
    return str(path.resolve()) if path.name and path.is_file() else ""


def invocation() -> list[str]:
    """This process's command line, as a user types it: ``placer ...`` for placer's own command line (run as
    .venv/bin/placer or python -m cluster.cli), else ``sys.argv`` (a script of the user's)."""
    program = Path(sys.argv[0]).name if sys.argv else ""
    if program == "placer" or sys.argv[0].endswith(os.path.join("cluster", "cli.py")):
        return ["placer", *sys.argv[1:]]
    return list(sys.argv)


def record_resume(folder: str | os.PathLike, changed: Mapping[str, tuple], command: Sequence[str] | None = None
                  ) -> RunManifest:
    """Note a resume in the run's manifest: ``changed`` (setting -> (old, new)) is applied to its config
    (so the next resume starts from it) and kept, with the time and command line, under ``resumes``.
    Written atomically; returns the new manifest."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    record = {"at": dt.datetime.now(dt.timezone.utc).isoformat(),
              "command": list(invocation() if command is None else command),
              "changed": {name: list(values) for name, values in changed.items()}, "cpu": cpu_model()}
    config = {**manifest.config, **{name: new for name, (_, new) in changed.items()}}
    updated = dataclasses.replace(manifest, config=config, resumes=(*manifest.resumes, record))
    write_text_atomic(folder / MANIFEST_FILE, updated.to_json())
    return updated


def record_device_removal(folder: str | os.PathLike, record: Mapping[str, object]) -> RunManifest:
    """Note a device that left the search (``placer search --remove-device``) under ``device_removals`` in
    the run's manifest, with the time. Written atomically; returns the new manifest."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    entry = {**record, "at": dt.datetime.now(dt.timezone.utc).isoformat()}
    updated = dataclasses.replace(manifest, device_removals=(*manifest.device_removals, entry))
    write_text_atomic(folder / MANIFEST_FILE, updated.to_json())
    return updated


def record_proven_bound(folder: str | os.PathLike, bound_s: float, holds_for: str) -> RunManifest:
    """Replace the run's proven bound in its manifest (an exact run proved a better one for its groups).
    Written atomically; returns the new manifest."""
    folder = Path(folder)
    updated = dataclasses.replace(read_manifest(folder), proven_bound_s=float(bound_s),
                                  proven_bound_holds_for=holds_for)
    write_text_atomic(folder / MANIFEST_FILE, updated.to_json())
    return updated


# ---- writing ---------------------------------------------------------------------------------------


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the whole new one, never a part."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_parquet_atomic(path: Path, table: pa.Table) -> None:
    """Write ``table`` to ``path`` so a reader sees the old file or the whole new one, never a part."""
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)


def _seconds_to_us(seconds: float) -> int:
    return int(round(seconds * 1e6))


@dataclass
class _Buffer:
    schema: pa.Schema
    rows: list = field(default_factory=list)  # tuples in schema order

    def table(self) -> pa.Table:
        columns = list(zip(*self.rows))
        return pa.table([pa.array(col, type=f.type) for col, f in zip(columns, self.schema)], schema=self.schema)


def _faster(runtime_s: float, best: BestPlacement | None) -> bool:
    """Faster than ``best`` (or no best yet); a tie keeps the row logged first, as ``placer analyze`` and
    result.json name the best's source (a tie went to the smaller placement: ``apply`` and the timeline plot
    showed one policy's placement under another's name)."""
    return best is None or runtime_s < best.runtime_s


class RunLogWriter:
    """Appends measurement rows and metrics to one run folder; flushes a file every ``flush_rows`` rows or
    ``flush_interval_s`` seconds, and on ``flush()`` / ``close()``. ``close(compact=True)`` (or leaving a
    ``with`` block without an exception) marks a clean finish and compacts the parts. Example::

        manifest = new_manifest(make_run_id(graph.name, "cem", 0), graph, machine, seed=0, policy="cem")
        with RunLogWriter.create("runs", manifest, reward_fn=lambda m: -m.runtime_s ** 0.5) as log:
            with MeasurerPool(spec, run_log=log) as pool:   # the pool appends every result once
                pool.measure(placements)
    """

    def __init__(self, folder: str | os.PathLike, manifest: RunManifest, *, flush_rows: int = 256,
                 flush_interval_s: float = 5.0, reward_fn: Callable[[Measurement], float] | None = None,
                 next_seq: int = 0, next_part: int = 0, next_metric_seq: int = 0, best: BestPlacement | None = None):
        self.folder = Path(folder)
        self.manifest = manifest
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.reward_fn = reward_fn
        self._next_seq = next_seq
        self._next_part = next_part
        self._next_metric_seq = next_metric_seq
        self._metrics_logged_up_to = -1  # resume(): the last iteration the log has metrics of
        self._measurements = _Buffer(MEASUREMENT_SCHEMA)
        self._metrics = _Buffer(METRIC_SCHEMA)
        self._best = best
        self._best_dirty = False
        self._forbidden: set[int] = set()  # devices that left the run: the best never uses them
        self._last_flush = time.monotonic()
        self._closed = False

    @classmethod
    def create(cls, root: str | os.PathLike, manifest: RunManifest, **options) -> RunLogWriter:
        """Make ``root/<run_id>/`` (it must not exist yet) and write the manifest."""
        folder = Path(root) / manifest.run_id
        if folder.exists():
            raise PlacerError(f"run folder {folder} already exists (resume it, or pick another run id)")
        (folder / MEASUREMENTS_DIR).mkdir(parents=True)
        (folder / METRICS_DIR).mkdir()
        write_text_atomic(folder / MANIFEST_FILE, manifest.to_json())
        return cls(folder, manifest, **options)

    @classmethod
    def resume(cls, folder: str | os.PathLike, **options) -> RunLogWriter:
        """Continue a run that stopped: sequence numbers and file names go on where they ended. The best is the
        log's own where its rows hold a faster one than ``best_placement.json`` (a kill between a flush's
        measurements part and its best file left the file behind, and a resume answered those rows from it)."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        rows, metrics, best = read_run(folder), read_metrics(folder), read_best(folder)  # refused: nothing changed
        for sub in (MEASUREMENTS_DIR, METRICS_DIR):
            (folder / sub).mkdir(exist_ok=True)
            for stale in (folder / sub).glob(".*.tmp"):
                stale.unlink()  # a flush the dead process never finished (the readers skip dot files)
        parts = [number for sub in (MEASUREMENTS_DIR, METRICS_DIR) for number in _part_numbers(folder / sub)]
        writer = cls(folder, manifest, next_seq=int(rows["seq"].max()) + 1 if len(rows) else 0,
                     next_part=max(parts, default=-1) + 1, best=best,
                     next_metric_seq=int(metrics["seq"].max()) + 1 if len(metrics) else 0, **options)
        writer._metrics_logged_up_to = int(metrics["iteration"].max()) if len(metrics) else -1
        writer._forbidden = removed_device_indices(manifest)
        logged = writer._best_allowed_row(rows)
        if logged is not None and _faster(logged.runtime_s, best):
            writer._best, writer._best_dirty = logged, True
        return writer

    # ---- appending ---------------------------------------------------------------------------------

    def append(self, result: PoolResult, reward: float | None = None) -> int:
        """Buffer one row; returns its sequence number."""
        self._check_open()
        m = result.measurement
        logged = result.log_placement
        if logged is None:
            logged = LoggedPlacement(result.placement, "op")
        placement = _as_int16(logged.devices)
        if reward is None and self.reward_fn is not None:
            reward = float(self.reward_fn(m))
        seq = self._next_seq
        self._next_seq += 1
        self._measurements.rows.append((
            self.manifest.run_id, seq, result.policy, int(result.iteration), placement, logged.level,
            float(m.runtime_s),
            [float(s) for s in m.samples_s], m.status, reward, [int(b) for b in m.peak_bytes], float(m.measure_s),
            result.actor_id, result.node_id, _seconds_to_us(result.submitted_at),
            _seconds_to_us(result.started_at), _seconds_to_us(result.finished_at), bool(result.cache_hit),
            m.error))
        better = _faster(m.runtime_s, self._best)
        if m.status == "ok" and math.isfinite(m.runtime_s) and better and not self._forbidden.intersection(placement):
            self._best = BestPlacement(self.manifest.run_id, seq, float(m.runtime_s), tuple(placement),
                                       dt.datetime.now(dt.timezone.utc).isoformat(), logged.level)
            self._best_dirty = True
        self._maybe_flush()
        return seq

    def append_metrics(self, iteration: int, metrics: Mapping[str, float]) -> None:
        """One row per metric (long format, so new metric names never change the schema). A resumed run's
        learner replays the iterations after its checkpoint; those the log holds already are not logged
        again (until an iteration beyond them arrives)."""
        self._check_open()
        if iteration <= self._metrics_logged_up_to:
            return
        self._metrics_logged_up_to = -1
        now_us = _seconds_to_us(time.time())
        for name, value in metrics.items():
            self._metrics.rows.append((self.manifest.run_id, self._next_metric_seq, int(iteration), str(name),
                                       float(value), now_us))
            self._next_metric_seq += 1
        self._maybe_flush()

    def write_groups(self, group_of_op: np.ndarray, op_names: Sequence[str] | None = None) -> None:
        """The group-to-op map: logged placements are per group; op i runs where group_of_op[i] runs."""
        group_of_op = np.asarray(group_of_op, dtype=np.int64)  # (N,)
        columns = {"op": pa.array(np.arange(len(group_of_op), dtype=np.int64)), "group": pa.array(group_of_op)}
        if op_names is not None:
            columns["op_name"] = pa.array([str(n) for n in op_names], pa.string())
        table = pa.table(columns)
        write_parquet_atomic(self.folder / GROUPS_FILE, table)

    def forbid_devices(self, devices: Sequence[int]) -> None:
        """Devices (indices in the manifest's machine) that left the run: from now on the best placement
        (``best_placement.json``) is the fastest ok row using none of them, earlier rows included; none
        such: no best file."""
        self._check_open()
        self._forbidden.update(int(d) for d in devices)
        if self._best is None or not self._forbidden.intersection(self._best.placement):
            return
        self.flush()  # every row so far on disk, so the log can be read back
        self._best = self._best_allowed_row()
        if self._best is None:
            (self.folder / BEST_FILE).unlink(missing_ok=True)
        self._best_dirty = self._best is not None
        self.flush()

    def _best_allowed_row(self, rows: pd.DataFrame | None = None) -> BestPlacement | None:
        """The fastest ok row on no forbidden device, of ``rows`` (the log's, read here when not given)."""
        rows = rows_without_devices(read_run(self.folder) if rows is None else rows, self._forbidden)
        ok = rows[ran_ok(rows)]
        allowed = [(float(r.runtime_s), int(r.seq), tuple(int(d) for d in r.placement), r.placement_level)
                   for r in ok.itertuples()]
        if not allowed:
            return None
        runtime_s, seq, placement, level = min(allowed)  # ties: the row logged first, as ``append`` keeps it
        return BestPlacement(self.manifest.run_id, seq, runtime_s, placement,
                             dt.datetime.now(dt.timezone.utc).isoformat(), level)

    @property
    def best(self) -> BestPlacement | None:
        return self._best

    @property
    def rows_logged(self) -> int:
        return self._next_seq

    # ---- flushing ----------------------------------------------------------------------------------

    def _maybe_flush(self) -> None:
        buffered = len(self._measurements.rows) + len(self._metrics.rows)
        if buffered >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as new complete files (measurements first, then metrics, then best)."""
        for sub, buffer in ((MEASUREMENTS_DIR, self._measurements), (METRICS_DIR, self._metrics)):
            if buffer.rows:
                table = buffer.table()
                path = self.folder / sub / f"part-{self._next_part:06d}.parquet"
                write_parquet_atomic(path, table)
                self._next_part += 1
                buffer.rows.clear()
        if self._best_dirty:
            write_text_atomic(self.folder / BEST_FILE, json.dumps(dataclasses.asdict(self._best), indent=2))
            self._best_dirty = False
        self._last_flush = time.monotonic()

    def close(self, compact: bool = False) -> None:
        """Flush and close. ``compact=True`` says the run finished cleanly: the parts of measurements/ and
        metrics/ become one file each (``compact_run``). Without it the parts stay (a stopped run)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        if compact:
            compact_run(self.folder)

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close(compact=exc_type is None)

    def _check_open(self) -> None:
        if self._closed:
            raise PlacerError(f"the run log {self.folder} is closed")


def _as_int16(placement: np.ndarray) -> list[int]:
    values = np.asarray(placement)
    if values.ndim != 1 or (values.size and (values.min() < 0 or values.max() > np.iinfo(np.int16).max)):
        raise PlacerError("a logged placement must be a 1-D array of device indices in 0..32767")
    return values.astype(np.int16).tolist()


# ---- compaction ------------------------------------------------------------------------------------


def _part_numbers(folder: Path) -> list[int]:
    return [int(PART_NAME.fullmatch(path.name).group(1)) for path in part_files(folder)]


def compact_run(folder: str | os.PathLike) -> None:
    """Rewrite measurements/ and metrics/ as one part file each (see the module docstring for why a
    reader never sees a row twice or misses one). Only for a run no writer has open."""
    folder = Path(folder)
    read_manifest(folder)
    _compact_parts(folder / MEASUREMENTS_DIR, MEASUREMENT_SCHEMA)
    _compact_parts(folder / METRICS_DIR, METRIC_SCHEMA)


def _compact_parts(folder: Path, schema: pa.Schema) -> None:
    numbers = sorted(_part_numbers(folder))
    if not numbers:  # a search's metrics/: one empty file, so that DuckDB's 'metrics/*.parquet' finds the table
        folder.mkdir(exist_ok=True)
        write_parquet_atomic(folder / "part-000000.parquet", schema.empty_table())
        return
    if len(numbers) == 1:
        return
    table = read_table(folder, schema)  # every row once, in seq order
    target = folder / f"part-{numbers[-1] + 1:06d}.parquet"  # a new name: no visible file is rewritten
    write_parquet_atomic(target, table)
    _delete_parts([folder / f"part-{number:06d}.parquet" for number in numbers])


def _delete_parts(parts: Sequence[Path]) -> None:
    for part in parts:
        part.unlink(missing_ok=True)


def resume_run(folder: str | os.PathLike, **writer_options) -> tuple[RunLogWriter, pd.DataFrame]:
    """A writer that continues the run, and the rows it had already logged (to replay into a search)."""
    writer = RunLogWriter.resume(folder, **writer_options)
    return writer, read_run(folder)
