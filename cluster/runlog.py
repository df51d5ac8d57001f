"""The run log: one folder per run, Parquet inside, safe against a process killed at any moment.

Layout of ``<root>/<run_id>/``::

    manifest.json          run id, command, config, graph hash, machine, versions, seed, start time
    measurements/          Parquet dataset, one small file per flush: part-000000.parquet, ...
    metrics/               the same for learner metrics (long format: iteration, name, value)
    best_placement.json    the fastest ok placement so far
    groups.parquet         group-to-op map (op, group), once per run, when placements are per group

A ``ParquetWriter`` left open loses its whole file when the process dies (the footer is written on close),
so every flush writes a complete small file under a temporary dot-name and ``os.replace``s it into place:
readers (pandas, pyarrow.dataset, DuckDB) skip dot-files and only ever see whole files. The files read
without project code, e.g. ``duckdb.sql("select * from 'run/measurements/*.parquet'")``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
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
import pyarrow.dataset as pds
import pyarrow.parquet as pq

from graphs.errors import PlacerError
from measurers.catalog import machine_to_json

if TYPE_CHECKING:
    from cluster.pool import PoolResult
    from graphs.opgraph import OpGraph
    from measurers.base import Measurement
    from measurers.machine import Machine

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
MEASUREMENTS_DIR = "measurements"
METRICS_DIR = "metrics"
BEST_FILE = "best_placement.json"
GROUPS_FILE = "groups.parquet"
RESULT_FILE = "result.json"  # a finished search's result (cluster.jobs.SearchResult.to_json())
VERSIONED_PACKAGES = ("placer", "ray", "torch", "tensorflow", "numpy", "pyarrow")

_TIME = pa.timestamp("us", tz="UTC")
MEASUREMENT_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("seq", pa.int64()),  # 0, 1, 2, ... in the order results reached the log
    ("policy", pa.string()),
    ("iteration", pa.int64()),
    ("placement", pa.list_(pa.int16())),  # group devices, or op devices when ungrouped
    ("runtime_s", pa.float64()),  # median; NaN when unknown (crash, timeout, error)
    ("samples_s", pa.list_(pa.float64())),
    ("status", pa.string()),
    ("reward", pa.float64()),  # null when the writer has no reward function
    ("peak_bytes", pa.list_(pa.int64())),  # per device
    ("measure_s", pa.float64()),  # wall time of the measurement itself
    ("actor_id", pa.string()),
    ("node_id", pa.string()),
    ("submitted_at", _TIME),
    ("started_at", _TIME),
    ("finished_at", _TIME),
    ("cache_hit", pa.bool_()),
    ("error", pa.string()),
])
METRIC_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("seq", pa.int64()),
    ("iteration", pa.int64()),
    ("name", pa.string()),
    ("value", pa.float64()),
    ("logged_at", _TIME),
])


@dataclass(frozen=True)
class RunManifest:
    run_id: str
    command: tuple[str, ...]  # the command line that started the run
    config: dict  # the run's settings, JSON-able
    graph_name: str
    graph_hash: str  # OpGraph.content_hash
    machine_name: str
    machine: dict  # the Machine as JSON (measurers.catalog.machine_to_json; machine_from_json reads it)
    versions: dict  # package -> version (None when not installed)
    seed: int
    started_at: str  # ISO 8601, UTC
    policy: str = ""
    lower_bound_s: float | None = None  # of the graph on the machine, so readers need not rebuild the graph
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, default=str)

    @staticmethod
    def from_json(text: str, where: str = "manifest") -> RunManifest:
        try:
            data = json.loads(text)
            data["command"] = tuple(data["command"])
            names = {f.name for f in dataclasses.fields(RunManifest)}
            return RunManifest(**{k: v for k, v in data.items() if k in names})
        except (ValueError, KeyError, TypeError) as exc:
            raise PlacerError(f"{where}: not a valid run manifest ({exc})") from None


@dataclass(frozen=True)
class BestPlacement:
    run_id: str
    seq: int  # the row of the measurement
    runtime_s: float
    placement: tuple[int, ...]  # as logged (group or op devices)
    updated_at: str


def package_versions() -> dict:
    """Versions of the packages a run depends on, without importing them."""
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def make_run_id(graph_name: str, policy: str, seed: int, when: float | None = None) -> str:
    """``<graph>__<policy>__<seed>__<UTC time>``, safe as a folder name."""
    stamp = dt.datetime.fromtimestamp(time.time() if when is None else when, dt.timezone.utc)
    text = f"{graph_name}__{policy}__{seed}__{stamp:%Y%m%dT%H%M%S}"
    return re.sub(r"[^A-Za-z0-9_.=-]", "-", text)


def new_manifest(run_id: str, graph: OpGraph, machine: Machine, *, seed: int, policy: str = "",
                 config: Mapping | None = None, command: Sequence[str] | None = None,
                 lower_bound_s: float | None = None) -> RunManifest:
    return RunManifest(
        run_id=run_id, command=tuple(sys.argv if command is None else command), config=dict(config or {}),
        graph_name=graph.name, graph_hash=graph.content_hash, machine_name=machine.name,
        machine=machine_to_json(machine), versions=package_versions(),
        seed=int(seed), started_at=dt.datetime.now(dt.timezone.utc).isoformat(), policy=policy,
        lower_bound_s=None if lower_bound_s is None else float(lower_bound_s))


# ---- writing ---------------------------------------------------------------------------------------


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write through ``write(tmp)`` to a dot-name beside ``path``, then rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the whole new one, never a part."""
    _write_atomic(path, lambda tmp: tmp.write_text(text))


def _seconds_to_us(seconds: float) -> int:
    return int(round(seconds * 1e6))


@dataclass
class _Buffer:
    schema: pa.Schema
    rows: list = field(default_factory=list)  # tuples in schema order

    def table(self) -> pa.Table:
        columns = list(zip(*self.rows))
        return pa.table([pa.array(col, type=f.type) for col, f in zip(columns, self.schema)], schema=self.schema)


class RunLogWriter:
    """Appends measurement rows and metrics to one run folder; flushes a file every ``flush_rows`` rows or
    ``flush_interval_s`` seconds, and on ``flush()`` / ``close()``. Example::

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
        self._measurements = _Buffer(MEASUREMENT_SCHEMA)
        self._metrics = _Buffer(METRIC_SCHEMA)
        self._best = best
        self._best_dirty = False
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
        """Continue a run that stopped: sequence numbers and file names go on where they ended."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        for sub in (MEASUREMENTS_DIR, METRICS_DIR):
            (folder / sub).mkdir(exist_ok=True)
            for stale in (folder / sub).glob(".*.tmp"):
                stale.unlink()  # a flush the dead process never finished
        rows, metrics = read_run(folder), read_metrics(folder)
        parts = [int(m.group(1)) for sub in (MEASUREMENTS_DIR, METRICS_DIR) for p in (folder / sub).glob("part-*")
                 if (m := re.fullmatch(r"part-(\d+)\.parquet", p.name))]
        return cls(folder, manifest, next_seq=int(rows["seq"].max()) + 1 if len(rows) else 0,
                   next_part=max(parts, default=-1) + 1, best=read_best(folder),
                   next_metric_seq=int(metrics["seq"].max()) + 1 if len(metrics) else 0, **options)

    # ---- appending ---------------------------------------------------------------------------------

    def append(self, result: PoolResult, reward: float | None = None) -> int:
        """Buffer one row; returns its sequence number."""
        self._check_open()
        m = result.measurement
        placement = result.placement if result.log_placement is None else result.log_placement
        placement = _as_int16(placement)
        if reward is None and self.reward_fn is not None:
            reward = float(self.reward_fn(m))
        seq = self._next_seq
        self._next_seq += 1
        self._measurements.rows.append((
            self.manifest.run_id, seq, result.policy, int(result.iteration), placement, float(m.runtime_s),
            [float(s) for s in m.samples_s], m.status, reward, [int(b) for b in m.peak_bytes], float(m.measure_s),
            result.actor_id, result.node_id, _seconds_to_us(result.submitted_at),
            _seconds_to_us(result.started_at), _seconds_to_us(result.finished_at), bool(result.cache_hit),
            m.error))
        # ties go to the smaller placement, so the best does not depend on the order results arrived in
        better = self._best is None or (m.runtime_s, tuple(placement)) < (self._best.runtime_s, self._best.placement)
        if m.status == "ok" and math.isfinite(m.runtime_s) and better:
            self._best = BestPlacement(self.manifest.run_id, seq, float(m.runtime_s), tuple(placement),
                                       dt.datetime.now(dt.timezone.utc).isoformat())
            self._best_dirty = True
        self._maybe_flush()
        return seq

    def append_metrics(self, iteration: int, metrics: Mapping[str, float]) -> None:
        """One row per metric (long format, so new metric names never change the schema)."""
        self._check_open()
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
        _write_atomic(self.folder / GROUPS_FILE, lambda tmp: pq.write_table(table, tmp))

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
                _write_atomic(path, lambda tmp: pq.write_table(table, tmp))
                self._next_part += 1
                buffer.rows.clear()
        if self._best_dirty:
            write_text_atomic(self.folder / BEST_FILE, json.dumps(dataclasses.asdict(self._best), indent=2))
            self._best_dirty = False
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise PlacerError(f"the run log {self.folder} is closed")


def _as_int16(placement: np.ndarray) -> list[int]:
    values = np.asarray(placement)
    if values.ndim != 1 or (values.size and (values.min() < 0 or values.max() > np.iinfo(np.int16).max)):
        raise PlacerError("a logged placement must be a 1-D array of device indices in 0..32767")
    return values.astype(np.int16).tolist()


# ---- reading ---------------------------------------------------------------------------------------


def read_manifest(folder: str | os.PathLike) -> RunManifest:
    """The run's manifest; a folder without one, or of another format version, is a PlacerError."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        raise PlacerError(f"{folder} is not a run folder (no {MANIFEST_FILE})")
    manifest = RunManifest.from_json(path.read_text(), str(path))
    if manifest.format_version != FORMAT_VERSION:
        raise PlacerError(f"{folder}: run log format version {manifest.format_version}, this placer reads "
                          f"version {FORMAT_VERSION}")
    return manifest


def _read_dataset(folder: Path, schema: pa.Schema) -> pd.DataFrame:
    if not folder.is_dir():
        return schema.empty_table().to_pandas()
    table = pds.dataset(folder, format="parquet", schema=schema).to_table()
    return table.sort_by("seq").to_pandas()


def read_run(folder: str | os.PathLike) -> pd.DataFrame:
    """Every measurement row of one run, ordered by seq."""
    read_manifest(folder)
    return _read_dataset(Path(folder) / MEASUREMENTS_DIR, MEASUREMENT_SCHEMA)


def read_runs(folders: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """The rows of several runs in one frame (told apart by run_id)."""
    frames = [read_run(f) for f in folders]
    if not frames:
        return MEASUREMENT_SCHEMA.empty_table().to_pandas()
    return pd.concat(frames, ignore_index=True)


def read_metrics(folder: str | os.PathLike) -> pd.DataFrame:
    read_manifest(folder)
    return _read_dataset(Path(folder) / METRICS_DIR, METRIC_SCHEMA)


def read_best(folder: str | os.PathLike) -> BestPlacement | None:
    path = Path(folder) / BEST_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["placement"] = tuple(data["placement"])
    return BestPlacement(**data)


def read_groups(folder: str | os.PathLike) -> np.ndarray | None:
    """(N,) int64 group of each op, or None when the run logs op placements."""
    path = Path(folder) / GROUPS_FILE
    if not path.is_file():
        return None
    table = pq.read_table(path).sort_by("op")
    return table.column("group").to_numpy().astype(np.int64)


def resume_run(folder: str | os.PathLike, **writer_options) -> tuple[RunLogWriter, pd.DataFrame]:
    """A writer that continues the run, and the rows it had already logged (to replay into a search)."""
    writer = RunLogWriter.resume(folder, **writer_options)
    return writer, read_run(folder)
