"""The run log's format, and reading it: file names, Parquet schemas, the manifest and best-placement
records, and the readers (``read_run``, ``read_metrics``, ...).

The layout of a run folder, how files are written and how compaction keeps every row visible exactly
once: see ``cluster.runlog`` (the writer, which also re-exports every name here, so
``from cluster.runlog import read_run`` works). This module writes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.parquet as pq

from graphs.errors import PlacerError, is_whole_number
from measurers.timing import ESTIMATOR

FORMAT_VERSION = 2  # 2: placement_level column; runs, warmup and estimator in the manifest
READABLE_FORMAT_VERSIONS = (1, 2)
PLACEMENT_LEVELS = ("group", "op")
MANIFEST_FILE = "manifest.json"
MEASUREMENTS_DIR = "measurements"
METRICS_DIR = "metrics"
BEST_FILE = "best_placement.json"
GROUPS_FILE = "groups.parquet"
RESULT_FILE = "result.json"  # a finished search's result (cluster.jobs.SearchResult.to_json())
READ_ATTEMPTS = 8  # a part deleted by a compaction between listing and reading: list again
READ_PAUSE_S = 0.05  # before the n-th new listing, n times this: 1.4 s in all for a compaction of 1,000 parts

_TIME = pa.timestamp("us", tz="UTC")
MEASUREMENT_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("seq", pa.int64()),  # 0, 1, 2, ... in the order results reached the log
    ("policy", pa.string()),
    ("iteration", pa.int64()),
    ("placement", pa.list_(pa.int16())),  # group devices, or op devices: see placement_level
    ("placement_level", pa.string()),  # "group" | "op"; null in format version 1 (read_run fills it)
    ("runtime_s", pa.float64()),  # the manifest's estimator (median) of samples_s; NaN when unknown
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
    runs: int | None = None  # timed runs per measurement (None: not recorded, format version 1)
    warmup: int | None = None  # untimed runs before them
    estimator: str = ESTIMATOR  # how runtime_s is reduced from samples_s
    format_version: int = FORMAT_VERSION
    cpu: str = ""  # the CPU model that ran the run: learned policies' results depend on it ("" before)
    resumes: tuple[dict, ...] = ()  # one record per resume: when, command, settings changed (old, new)
    proven_bound_s: float | None = None  # best proven bound (policies.exact.bound); None: not computed (older runs)
    proven_bound_holds_for: str | None = None  # the placements it holds for, e.g. "every placement"
    graph_file: str = ""  # absolute path of the graph file the run read ("" for a benchmark, and older runs)
    device_removals: tuple[dict, ...] = ()  # devices that left the search (placer search --remove-device), one
    # record each: device, index (in `machine`), trigger, at_measurement (the policy's count), at_seq (the first
    # row logged after it: rows from there never use the device), machine_after; () in runs without any

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, default=str)

    @staticmethod
    def from_json(text: str, where: str = "manifest") -> RunManifest:
        try:
            data = json.loads(text)
            data["command"] = tuple(data["command"])
            data["resumes"] = tuple(_objects(data.get("resumes", []), "resumes"))
            data["device_removals"] = tuple(data.get("device_removals", ()))
            names = {f.name for f in dataclasses.fields(RunManifest)}
            for name in ("lower_bound_s", "proven_bound_s"):  # read as figures by analyze and reproduce
                if data.get(name) is not None and not is_seconds(data[name]):
                    raise ValueError(f"{name} {data[name]!r} is not a number of seconds >= 0")
            for name, kind in _MANIFEST_FIELD_TYPES.items():  # read as such by every command
                if name in data and not isinstance(data[name], kind):
                    raise ValueError(f"{name} {data[name]!r} is not {_KIND_NAMES[kind]}")
            for name in _MANIFEST_TEXT_OR_NULL:  # analyze prints them and opens the graph file
                if data.get(name) is not None and not isinstance(data[name], str):
                    raise ValueError(f"{name} {data[name]!r} is not a string or null")
            for name in ("runs", "warmup"):  # analyze keys runs by them (a list was a TypeError traceback)
                if data.get(name) is not None and not (is_whole_number(data[name]) and data[name] >= 0):
                    raise ValueError(f"{name} {data[name]!r} is not a whole number >= 0 or null")
            if isinstance(data.get("run_id"), str) and not _plain_name(data["run_id"]):  # it names plot files
                raise ValueError(f"run_id {data['run_id']!r} is not a plain name (a path or empty)")
            if not isinstance(data.get("estimator", ESTIMATOR), str):
                raise ValueError(f"estimator {data['estimator']!r} is not a string")
            data["graph_file"] = data.get("graph_file") or ""
            _check_removal_records(data["device_removals"])
            return RunManifest(**{k: v for k, v in data.items() if k in names})
        except (ValueError, KeyError, TypeError) as exc:
            raise PlacerError(f"{where}: not a valid run manifest ({exc})") from None


_MANIFEST_FIELD_TYPES = {"run_id": str, "config": dict, "graph_name": str, "graph_hash": str, "machine_name": str,
                         "machine": dict, "policy": str}
_KIND_NAMES = {str: "a string", dict: "a JSON object"}
_MANIFEST_TEXT_OR_NULL = ("graph_file", "proven_bound_holds_for")


def _plain_name(text: str) -> bool:
    """A name that is one file name in a folder: `analyze --plots DIR` names a run's plots after its run id, and
    an id "sub/../../x" wrote them outside DIR."""
    return bool(text) and text not in (".", "..") and not any(c in text for c in ("/", "\\", "\0"))


def _objects(records, name: str) -> list[dict]:
    """A list of JSON objects (``resumes``: analyze reads each record's time)."""
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise ValueError(f"{name} {records!r} is not a list of objects")
    return records


def _check_removal_records(records) -> None:
    """Each ``device_removals`` record that took place names its device, its index and the measurement it
    left at (whole numbers), and the machine after: analyze reads them as such."""
    for k, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"device_removals[{k}] is not an object")
        if not record.get("removed", True):
            continue
        for name in ("index", "at_measurement", "at_seq"):
            value = record.get(name, 0 if name == "at_seq" else None)  # at_seq: none before the first row
            if not (is_whole_number(value) and value >= 0):
                raise ValueError(f"device_removals[{k}].{name} {value!r} is not a whole number >= 0")
        for name in ("device", "machine_after"):
            if not isinstance(record.get(name), str):
                raise ValueError(f"device_removals[{k}].{name} {record.get(name)!r} is not a name")


def is_seconds(value) -> bool:
    """A recorded duration: a finite number >= 0 (not a bool, a string or NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


@dataclass(frozen=True)
class BestPlacement:
    run_id: str
    seq: int  # the row of the measurement
    runtime_s: float
    placement: tuple[int, ...]  # as logged (group or op devices)
    updated_at: str
    placement_level: str | None = None  # "group" | "op"; None in files of format version 1


def read_manifest(folder: str | os.PathLike) -> RunManifest:
    """The run's manifest; a folder without one, or of another format version, is a PlacerError."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        raise PlacerError(f"{folder} is not a run folder (no {MANIFEST_FILE})")
    manifest = RunManifest.from_json(path.read_text(), str(path))
    if manifest.format_version not in READABLE_FORMAT_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_FORMAT_VERSIONS)
        raise PlacerError(f"{folder}: run log format version {manifest.format_version!r}, this placer reads "
                          f"versions {readable}")
    return manifest


# Columns every format version has written: a part without one, or with another type, is damaged (read as
# nulls, a run without ``runtime_s`` had no best, and one without ``status`` was a traceback).
REQUIRED_COLUMNS = ((MEASUREMENT_SCHEMA, ("seq", "policy", "placement", "runtime_s", "status", "cache_hit")),
                    (METRIC_SCHEMA, ("seq", "iteration", "name", "value")))


PART_NAME = re.compile(r"part-(\d+)\.parquet")
"""A log part's file name (``RunLogWriter.flush``, the compaction): only these are read, so another file in
the folder (a plot written there) is no part of the log."""


def part_files(folder: Path) -> list[Path]:
    """The log parts in ``folder``, by name."""
    return sorted(path for path in folder.glob("part-*.parquet") if PART_NAME.fullmatch(path.name))


def read_table(folder: Path, schema: pa.Schema, columns: Sequence[str] | None = None) -> pa.Table:
    """Every row under ``folder`` once (the first of each seq: a compaction may have left a row in two
    files), ordered by seq; ``columns`` only, where given (``seq`` among them). Other columns a file lacks (an
    older format) read as nulls."""
    if not folder.is_dir():
        return schema.empty_table() if columns is None else schema.empty_table().select(list(columns))
    _check_parts(folder, schema)
    for attempt in range(READ_ATTEMPTS):
        last = attempt == READ_ATTEMPTS - 1
        try:
            parts = part_files(folder)
            if not parts:
                return schema.empty_table()
            table = pds.dataset([str(part) for part in parts], format="parquet", schema=schema).to_table(columns)
        except FileNotFoundError:  # a compaction deleted a part after it was listed: list again, once it is done
            if last:
                raise PlacerError(f"{folder}: the run log's files kept changing while they were read (a run "
                                  "compacting its log as it ends?): try again") from None
            time.sleep(READ_PAUSE_S * (attempt + 1))
            continue
        except pa.ArrowException as exc:  # a part that is not Parquet, or cut short
            raise PlacerError(f"{folder}: a run log file is damaged ({exc})") from None
        _check_rows(table, folder, schema)
        table = table.sort_by("seq")
        seq = table.column("seq").to_numpy()  # (R,) sorted
        first = np.ones(len(seq), dtype=bool)
        first[1:] = seq[1:] != seq[:-1]
        gap = _rows_missing(seq[first]) if schema.equals(MEASUREMENT_SCHEMA) else None
        if gap is None:
            return table if first.all() else table.filter(pa.array(first))
        if last:  # (a listing that crossed a compaction, the merged part made after it looked, the old ones
            # deleted before: listed again)
            raise PlacerError(f"{folder}: the run log lacks its rows of seq {gap[0]}..{gap[1]} (a part file "
                              "deleted or lost): it cannot be read as the run it was")
    raise AssertionError("unreachable")


def _rows_missing(seq: np.ndarray) -> tuple[int, int] | None:
    """The first run of seq numbers missing from a measurement log's (R,) sorted, unique ``seq``, or None: a
    writer numbers its rows 0, 1, 2, ... (``RunLogWriter``), so a gap is rows lost (a part file deleted),
    which the readers took for a run that measured less, and a resume then made permanent."""
    if not len(seq) or seq[-1] == len(seq) - 1:
        return None
    gap = int(np.flatnonzero(seq != np.arange(len(seq)))[0])
    return gap, int(seq[gap]) - 1


NON_NULL_COLUMNS = ((MEASUREMENT_SCHEMA, ("seq", "status", "placement", "policy", "cache_hit")),
                    (METRIC_SCHEMA, ("seq", "iteration", "name")))
"""Columns no row of a log leaves empty: rows are ordered and told apart by seq, counted by status, each
measured a placement (a null one was a traceback where a removed device's rows are left out), was made by a
policy (a null one was reported as the best's source "nan") and was measured or taken from the cache (a null
cache_hit was counted as measured)."""


def _check_rows(table: pa.Table, folder: Path, schema: pa.Schema) -> None:
    """Rows a writer never logs (an empty seq or status; an ok row whose step time is negative, NaN or
    infinite) are a PlacerError naming the folder: read on, they were a traceback or a best of -1 s."""
    required = next((columns for known, columns in NON_NULL_COLUMNS if known.equals(schema)), ())
    for name in required:
        if name in table.column_names and table.column(name).null_count:  # (a reader may ask for some columns)
            raise PlacerError(f"{folder}: a run log file is damaged: {table.column(name).null_count} rows have "
                              f"no {name}")
    if "status" not in required:
        return
    ok = pc.equal(table.column("status"), "ok")
    runtime_s = table.column("runtime_s").filter(ok).to_numpy(zero_copy_only=False)  # (ok rows,)
    bad = ~(np.isfinite(runtime_s) & (runtime_s >= 0))
    if bad.any():
        raise PlacerError(f"{folder}: a run log file is damaged: {int(bad.sum())} rows of status ok have a "
                          f"runtime_s that is not a duration (first: {float(runtime_s[bad][0])})")


def check_run_log(folder: str | os.PathLike) -> None:
    """Every Parquet part of the run's measurement and metric logs opens and has the columns every version
    writes (its footer is read, not its rows), and its best placement file reads: a damaged file, or no log
    folder at all, is one PlacerError naming it, before a resumed run starts or changes anything."""
    check_measurement_log(folder)
    read_table(Path(folder) / METRICS_DIR, METRIC_SCHEMA, _checked_columns(METRIC_SCHEMA))


def check_measurement_log(folder: str | os.PathLike) -> None:
    """``check_run_log``'s half that a run's best placement rests on: the measurement log's parts open and
    hold every row (no gap in seq), and the best placement file names one of them."""
    _check_log_folder(folder)
    best = read_best(folder)  # before the rows: a live run's flush writes its rows first, then this file
    rows = read_table(Path(folder) / MEASUREMENTS_DIR, MEASUREMENT_SCHEMA, _checked_columns(MEASUREMENT_SCHEMA))
    _check_best_logged(folder, best, rows.column("seq").to_numpy())


def _checked_columns(schema: pa.Schema) -> list[str]:
    """What ``_check_rows`` reads of a log (not a long run's placements)."""
    return [name for name in CHECKED_COLUMNS if name in schema.names]


CHECKED_COLUMNS = ("seq", "iteration", "name", "status", "runtime_s", "policy", "cache_hit")  # what _check_rows reads


def _check_parts(folder: Path, schema: pa.Schema) -> None:
    required = next((columns for known, columns in REQUIRED_COLUMNS if known.equals(schema)), ())
    for part in part_files(folder):
        try:
            part_schema = pq.read_schema(part)
        except FileNotFoundError:  # a live run's compaction removed it after the listing: its rows moved
            continue
        except (pa.ArrowException, OSError) as exc:
            raise PlacerError(f"{part} is damaged: {exc}") from None
        for name in required:
            index = part_schema.get_field_index(name)
            if index < 0:
                raise PlacerError(f"{part} is damaged: it has no {name!r} column")
            if part_schema.field(index).type != schema.field(name).type:
                raise PlacerError(f"{part} is damaged: its {name!r} column holds {part_schema.field(index).type}, "
                                  f"not {schema.field(name).type}")


def _check_log_folder(folder: str | os.PathLike) -> None:
    """A run that has logged a measurement (it has a best placement) has its measurement folder: without it
    the log is gone, and the run would read as one that measured nothing. A run that never flushed a row may
    lack the empty folder (a copy that drops empty folders); RunLogWriter.resume makes it again."""
    if (Path(folder) / BEST_FILE).is_file() and not (Path(folder) / MEASUREMENTS_DIR).is_dir():
        raise PlacerError(f"{folder}: its measurement log ({MEASUREMENTS_DIR}/) is missing")


def _read_dataset(folder: Path, schema: pa.Schema) -> pd.DataFrame:
    return read_table(folder, schema).to_pandas()


def read_run(folder: str | os.PathLike) -> pd.DataFrame:
    """Every measurement row of one run, once each, ordered by seq; ``placement_level`` is filled by
    length for rows written before the column existed."""
    read_manifest(folder)
    _check_log_folder(folder)
    best = read_best(folder)  # before the rows: a live run's flush writes its rows first, then this file
    rows = _read_dataset(Path(folder) / MEASUREMENTS_DIR, MEASUREMENT_SCHEMA)
    _check_best_logged(folder, best, rows["seq"].to_numpy())
    return _fill_placement_level(rows, folder)


def _check_best_logged(folder: str | os.PathLike, best: "BestPlacement | None", seq: np.ndarray) -> None:
    """The best placement file (read before the rows) names a row the log holds: it is written after the rows
    it names (a flush writes the parts first). Without that row the log lost rows at its end, or all of them
    (every part deleted read as a finished run of 0 measurements, no best, exit 0)."""
    if best is not None and not (seq == int(best.seq)).any():
        raise PlacerError(f"{folder}: {BEST_FILE} names the row of seq {best.seq}, which its measurement log "
                          f"({MEASUREMENTS_DIR}/) lacks: rows were lost (a part file deleted?)")


def _fill_placement_level(rows: pd.DataFrame, folder: str | os.PathLike) -> pd.DataFrame:
    """Format version 1 rows: op placements have one entry per op (every placement is per op when the run
    has no group map), the rest are per group."""
    missing = rows["placement_level"].isna()
    if not missing.any():
        return rows
    group_of_op = read_groups(folder)
    num_ops = None if group_of_op is None else len(group_of_op)
    rows.loc[missing, "placement_level"] = [
        placement_level_by_length(len(p), num_ops) for p in rows.loc[missing, "placement"]]
    return rows


def placement_level_by_length(length: int, num_ops: int | None) -> str:
    """The format version 1 rule: a placement is per op when it has one entry per op (or the number of
    ops is unknown because the run logged no group map), else per group."""
    return "op" if num_ops is None or length == num_ops else "group"


def op_placement_of(logged, group_of_op: np.ndarray | None, num_ops: int, where,
                    level: str | None = None) -> np.ndarray:
    """(N,) op placement from a logged placement: op devices or group devices (expanded through
    ``group_of_op``, ``read_groups``'s map), as ``level`` ("op" | "group") says; None (a log of format
    version 1) tells them apart by length (``placement_level_by_length``). ``where`` names the run in
    errors."""
    logged = np.asarray(logged, dtype=np.int64)
    level = placement_level_by_length(len(logged), num_ops) if level is None else level
    if level == "op":
        if len(logged) != num_ops:
            raise PlacerError(f"{where}: the best placement is per op but has {len(logged)} entries, not the "
                              f"graph's {num_ops}")
        return logged
    if group_of_op is None or len(group_of_op) != num_ops or (len(group_of_op) and group_of_op.max() >= len(logged)):
        raise PlacerError(f"{where}: the best placement has {len(logged)} entries, neither the graph's {num_ops} "
                          f"ops nor a group placement matching {GROUPS_FILE}")
    return logged[group_of_op]


def ran_ok(rows: pd.DataFrame) -> pd.Series:
    """(R,) bool: the rows whose placement ran, with a step time."""
    return (rows["status"] == "ok") & np.isfinite(rows["runtime_s"].to_numpy(dtype=np.float64))


def read_runs(folders: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """The rows of several runs in one frame (told apart by run_id). One path is refused: a string is a
    sequence too, and each of its letters was read as a run folder ("r is not a run folder")."""
    if isinstance(folders, (str, os.PathLike)):
        raise PlacerError(f"read_runs takes a list of run folders, not one path ({str(folders)!r}): "
                          "read_run reads one run, read_runs(glob.glob('runs/*')) every run in a folder")
    frames = [read_run(f) for f in folders]
    if not frames:
        return MEASUREMENT_SCHEMA.empty_table().to_pandas()
    return pd.concat(frames, ignore_index=True)


def read_metrics(folder: str | os.PathLike) -> pd.DataFrame:
    read_manifest(folder)
    return _read_dataset(Path(folder) / METRICS_DIR, METRIC_SCHEMA)


RESULT_RENAMED = {"best_runtime_s": "overall_best_runtime_s", "best_source": "overall_best_source"}
"""result.json's fields under their older names: ``best_runtime_s`` was the overall best, not the policy's own."""


def read_result_json(folder: str | os.PathLike) -> dict | None:
    """The run's result.json as a JSON object, an older run's fields under today's names (RESULT_RENAMED);
    None when it is missing or damaged (the run did not finish writing it, so it counts as not finished)."""
    try:
        data = json.loads((Path(folder) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for old, new in RESULT_RENAMED.items():
        if old in data:
            data.setdefault(new, data.pop(old))
    return data


def read_best(folder: str | os.PathLike) -> BestPlacement | None:
    """The run's best placement so far; None before any placement was measured ok (no file). A damaged
    file is a PlacerError naming it."""
    path = Path(folder) / BEST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        data["placement"] = tuple(data["placement"])
        best = BestPlacement(**data)
    except (ValueError, TypeError, KeyError) as exc:
        raise PlacerError(f"{path} is damaged: {exc}") from None
    if not all(is_whole_number(device) and device >= 0 for device in best.placement):
        raise PlacerError(f"{path} is damaged: its placement holds something other than device numbers")
    if not is_seconds(best.runtime_s) or not is_whole_number(best.seq):
        raise PlacerError(f"{path} is damaged: its runtime_s {best.runtime_s!r} or seq {best.seq!r} is not a number")
    return best


def read_groups(folder: str | os.PathLike) -> np.ndarray | None:
    """(N,) int64 group of each op, or None when the run logs op placements. A damaged file is a
    PlacerError naming it."""
    path = Path(folder) / GROUPS_FILE
    if not path.is_file():
        return None
    try:
        table = pq.read_table(path).sort_by("op")
        ops, groups = table.column("op"), table.column("group")
    except (pa.ArrowException, KeyError, ValueError) as exc:  # not Parquet, truncated, or other columns
        raise PlacerError(f"{path} is damaged: {exc}") from None
    if ops.null_count or groups.null_count or not pa.types.is_integer(groups.type) \
            or not np.array_equal(ops.to_numpy(), np.arange(len(ops))):
        raise PlacerError(f"{path} is damaged: it is not one whole group number for each op 0..{len(ops) - 1}")
    group_of_op = groups.to_numpy().astype(np.int64)
    if len(group_of_op) and group_of_op.min() < 0:  # an index from the end: another group's devices, silently
        raise PlacerError(f"{path} is damaged: op {int(np.argmin(group_of_op))} has a negative group")
    return group_of_op


def device_removals_done(manifest: RunManifest) -> list[dict]:
    """The manifest's ``device_removals`` that took place (a planned one the run never reached has
    ``removed`` false)."""
    return [r for r in manifest.device_removals if r.get("removed", True)]


def removed_device_indices(manifest: RunManifest) -> set[int]:
    """Indices (in the manifest's machine) of the devices that left the run (``device_removals``)."""
    return {int(r["index"]) for r in device_removals_done(manifest)}


def rows_without_devices(rows: pd.DataFrame, devices: Collection[int]) -> pd.DataFrame:
    """The rows whose placement uses none of ``devices``: after a device left a run, only these can still
    be run."""
    if not devices or not len(rows):
        return rows
    return rows[rows_avoiding(rows, devices)]


def rows_avoiding(rows: pd.DataFrame, devices: Collection[int]) -> np.ndarray:
    """(R,) bool: the rows whose placement uses none of ``devices``."""
    forbidden = np.asarray(sorted(devices), dtype=np.int64)
    return np.asarray([not np.isin(np.asarray(p, dtype=np.int64), forbidden).any() for p in rows["placement"]],
                      dtype=bool)
