"""The Parquet run log: rows round-trip, foreign readers, resume, compaction, and a writer killed mid-run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest
from conftest import build_graph

from cluster import runlog
from cluster.jobs import expand_logged, log_placement
from cluster.pool import PoolResult
from cluster.runlog import (FORMAT_VERSION, GROUPS_FILE, MANIFEST_FILE, LoggedPlacement, RunLogWriter, check_run_log,
                            compact_run, cpu_model, make_run_id, new_manifest, op_placement_of, read_best, read_groups,
                            read_manifest, read_metrics, read_run, read_runs, record_resume, resume_run)
from graphs.errors import PlacerError
from measurers.base import STATUSES, Measurement
from measurers.catalog import load_machine, machine_from_json
from measurers.timing import ESTIMATOR, TimingSettings

REPO = Path(__file__).resolve().parents[2]


def _result(i: int, status: str = "ok", runtime_s: float | None = None, cache_hit: bool = False,
            log_placement: LoggedPlacement | None = None) -> PoolResult:
    runtime_s = 1.0 + i if runtime_s is None else runtime_s
    m = Measurement(runtime_s if status == "ok" else float("nan"), (runtime_s, runtime_s * 1.01), status,
                    (100 * i, 200, 0, 0, 0), 0.01, "" if status == "ok" else f"{status} happened")
    t = 1_700_000_000.0 + i
    return PoolResult(i, np.array([i % 5, 1, 2], dtype=np.int64), m, f"actor{i % 2}", f"node{i % 2}", t, t + 0.5,
                      t + 0.75, cache_hit, 1, "cem", i // 4, log_placement)


def _part_files(run: Path, sub: str = "measurements") -> list[str]:
    return sorted(p.name for p in (run / sub).iterdir())


@pytest.fixture
def manifest():
    graph = build_graph([(0, 1), (1, 2)])
    return new_manifest(make_run_id(graph.name, "cem", 3, when=0.0), graph, load_machine("paper-4gpu"), seed=3,
                        policy="cem", config={"budget": 10}, command=["placer", "search"])


def test_runlog__rows_round_trip_with_types(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest, reward_fn=lambda m: -np.sqrt(m.runtime_s)) as log:
        for i in range(6):
            log.append(_result(i, status="oom" if i == 4 else "ok", cache_hit=i == 5))
    rows = read_run(tmp_path / manifest.run_id)
    assert list(rows["seq"]) == list(range(6))
    assert list(rows["status"]) == ["ok", "ok", "ok", "ok", "oom", "ok"]
    assert list(rows["placement"][3]) == [3, 1, 2] and rows["placement"][3].dtype == np.int16
    assert rows["reward"][0] == pytest.approx(-1.0) and rows["cache_hit"].tolist()[-1]
    assert list(rows["peak_bytes"][2]) == [200, 200, 0, 0, 0]
    assert rows["started_at"][1] == pd.Timestamp(1_700_000_001.5, unit="s", tz="UTC")
    assert rows["error"][4] == "oom happened" and rows["iteration"].tolist() == [0, 0, 0, 0, 1, 1]


def test_runlog__group_placement_is_logged_when_given(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.append(_result(0, log_placement=LoggedPlacement(np.array([4, 3]), "group")))
        log.write_groups(np.array([0, 1, 1]), op_names=["a", "b", "c"])
    run = tmp_path / manifest.run_id
    assert list(read_run(run)["placement"][0]) == [4, 3]
    assert read_groups(run).tolist() == [0, 1, 1]


@pytest.mark.parametrize("damage", [b"junk", b""])
def test_runlog__damaged_groups_file_is_one_error_naming_it(tmp_path, manifest, damage):
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.write_groups(np.array([0, 1, 1]), op_names=["a", "b", "c"])
    path = tmp_path / manifest.run_id / GROUPS_FILE
    path.write_bytes(damage)
    with pytest.raises(PlacerError, match=f"{path} is damaged"):
        read_groups(tmp_path / manifest.run_id)


@pytest.mark.parametrize("group, op", [([0, -1, 1], [0, 1, 2]), ([0, None, 1], [0, 1, 2]), ([0, 1, 1], [0, 0, 2])])
def test_runlog__a_groups_file_with_a_negative_missing_or_repeated_entry_is_damaged(tmp_path, manifest, group, op):
    """Group -1 indexed the last group's device (simulate reported another placement's step, exit 0); a null
    group was an IndexError; an op listed twice left another op out."""
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.write_groups(np.array([0, 1, 1]), op_names=["a", "b", "c"])
    path = tmp_path / manifest.run_id / GROUPS_FILE
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index("group"), "group", pa.array(group, pa.int64()))
    pq.write_table(table.set_column(table.schema.get_field_index("op"), "op", pa.array(op, pa.int64())), path)
    with pytest.raises(PlacerError, match=f"{path} is damaged: "):
        read_groups(tmp_path / manifest.run_id)


def test_runlog__placement_level__group_and_op_rows_in_one_run(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.write_groups(np.array([2, 0, 1]))  # 3 ops, 3 groups: lengths cannot tell the levels apart
        log.append(_result(0, runtime_s=1.0, log_placement=LoggedPlacement(np.array([3, 1, 2]), "group")))
        log.append(_result(1, runtime_s=2.0))  # no log placement: the op placement [1, 1, 2]
        log.append(_result(2, runtime_s=3.0, log_placement=LoggedPlacement(np.array([0, 0, 1]), "op")))
    run = tmp_path / manifest.run_id
    rows = read_run(run)
    assert rows["placement_level"].tolist() == ["group", "op", "op"]
    assert [list(p) for p in rows["placement"]] == [[3, 1, 2], [1, 1, 2], [0, 0, 1]]
    assert read_best(run).placement_level == "group"
    foreign = duckdb.sql(f"select placement_level from read_parquet('{run}/measurements/*.parquet') order by seq")
    assert [r[0] for r in foreign.fetchall()] == ["group", "op", "op"]


def test_runlog__placement_level__a_bad_level_is_a_placer_error():
    with pytest.raises(PlacerError, match="placement level"):
        LoggedPlacement(np.array([0, 1]), "unit")


class _Problem:
    """The part of policies' PlacementProblem that log_placement / expand_logged use."""

    def __init__(self, op_unit):
        self.op_unit = np.asarray(op_unit, dtype=np.int64)
        self.num_units = int(self.op_unit.max()) + 1
        self.graph = type("Graph", (), {"num_ops": len(self.op_unit)})()

    def expand(self, units):
        return np.asarray(units, dtype=np.int64)[..., self.op_unit]

    def collapse(self, ops):
        units = np.zeros(self.num_units, dtype=np.int64)
        units[self.op_unit[::-1]] = np.asarray(ops, dtype=np.int64)[::-1]
        return units


def test_log_placement__level_round_trips_through_the_log_when_groups_equal_ops(tmp_path, manifest):
    problem = _Problem([2, 0, 1])  # as many groups as ops, numbered differently
    op_placements = [np.array([1, 2, 3]), np.array([4, 4, 0])]
    logged = [log_placement(problem, p) for p in op_placements]
    assert [entry.level for entry in logged] == ["group", "group"]
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.write_groups(problem.op_unit)
        for i, entry in enumerate(logged):
            log.append(_result(i, log_placement=entry))
    rows = read_run(tmp_path / manifest.run_id)
    back = [expand_logged(problem, p, level) for p, level in zip(rows["placement"], rows["placement_level"])]
    assert [b.tolist() for b in back] == [p.tolist() for p in op_placements]
    assert expand_logged(problem, rows["placement"][0]).tolist() != op_placements[0].tolist()  # by length: wrong


def test_log_placement__split_group_is_logged_per_op_and_a_wrong_length_is_an_error():
    problem = _Problem([0, 0, 1])
    entry = log_placement(problem, np.array([1, 2, 3]))  # group 0 split over devices 1 and 2
    assert entry.level == "op" and entry.devices.tolist() == [1, 2, 3]
    assert log_placement(problem, np.array([2, 2, 3])).devices.tolist() == [2, 3]
    with pytest.raises(PlacerError, match="2 entries"):
        expand_logged(problem, np.array([0, 1]), "op")


def _downgrade_to_format_1(run: Path) -> None:
    """Rewrite a run folder as placer wrote it before format version 2: no placement_level column, no
    timing in the manifest."""
    for part in (run / "measurements").glob("part-*.parquet"):
        pq.write_table(pq.read_table(part).drop_columns(["placement_level"]), part)
    data = json.loads((run / MANIFEST_FILE).read_text())
    for key in ("runs", "warmup", "estimator"):
        del data[key]
    data["format_version"] = 1
    (run / MANIFEST_FILE).write_text(json.dumps(data))


def test_runlog__format_1_log_reads_levels_by_length_and_resumes(tmp_path, manifest):
    log = RunLogWriter.create(tmp_path, manifest, flush_rows=1)
    log.write_groups(np.array([0, 1, 1]))
    log.append(_result(0, log_placement=LoggedPlacement(np.array([4, 3]), "group")))
    log.append(_result(1))  # op placement, 3 entries
    log.close()
    run = tmp_path / manifest.run_id
    _downgrade_to_format_1(run)
    old = read_manifest(run)
    assert (old.format_version, old.runs, old.warmup) == (1, None, None)
    assert read_run(run)["placement_level"].tolist() == ["group", "op"]
    with RunLogWriter.resume(run) as writer:  # a newer placer goes on with the old run
        writer.append(_result(2, log_placement=LoggedPlacement(np.array([0, 1, 2]), "group")))
    rows = read_run(run)
    assert rows["seq"].tolist() == [0, 1, 2] and rows["placement_level"].tolist() == ["group", "op", "group"]
    assert len(_part_files(run)) == 1  # compacted: old files without the column and new ones with it


def test_runlog__format_1_log_without_groups_is_all_op_placements(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.append(_result(0, log_placement=LoggedPlacement(np.array([4, 3]), "op")))
    run = tmp_path / manifest.run_id
    _downgrade_to_format_1(run)
    assert read_run(run)["placement_level"].tolist() == ["op"]


def test_runlog__manifest_names_the_estimator_and_timing(tmp_path, manifest):
    RunLogWriter.create(tmp_path, manifest).close()
    data = json.loads((tmp_path / manifest.run_id / MANIFEST_FILE).read_text())
    defaults = TimingSettings()
    assert (data["estimator"], data["runs"], data["warmup"]) == (ESTIMATOR, defaults.runs, defaults.warmup)
    assert ESTIMATOR == "median" and data["format_version"] == 2
    graph = build_graph([(0, 1)])
    sim = new_manifest("sim", graph, load_machine("paper-2gpu"), seed=0, runs=1, warmup=0)
    assert (sim.runs, sim.warmup, sim.estimator) == (1, 0, "median")
    with pytest.raises(PlacerError, match="runs must be at least 1"):
        new_manifest("bad", graph, load_machine("paper-2gpu"), seed=0, runs=0)


def test_runlog__files_open_without_project_code(tmp_path, manifest):
    log = RunLogWriter.create(tmp_path, manifest, flush_rows=3)
    for i in range(7):
        log.append(_result(i, status="crash" if i == 2 else "ok"))
    log.close()  # not a clean finish: the parts stay
    folder = tmp_path / manifest.run_id / "measurements"
    assert len(list(folder.glob("part-*.parquet"))) == 3  # flushes at 3, 6, and on close
    _assert_foreign_readers_see_seven_rows(folder)
    compact_run(tmp_path / manifest.run_id)
    assert len(list(folder.glob("part-*.parquet"))) == 1
    _assert_foreign_readers_see_seven_rows(folder)


def _assert_foreign_readers_see_seven_rows(folder: Path) -> None:
    assert pd.read_parquet(folder)["seq"].tolist() == list(range(7))
    assert pds.dataset(folder, format="parquet").count_rows() == 7
    counts = duckdb.sql(f"select status, count(*) from read_parquet('{folder}/*.parquet') "
                        f"group by status order by status").fetchall()
    assert counts == [("crash", 1), ("ok", 6)]


def test_runlog__manifest_records_run_facts(tmp_path, manifest):
    RunLogWriter.create(tmp_path, manifest).close()
    data = json.loads((tmp_path / manifest.run_id / MANIFEST_FILE).read_text())
    assert data["format_version"] == FORMAT_VERSION and data["seed"] == 3
    assert data["versions"]["ray"] == "2.60.0" and data["versions"]["torch"].startswith("2.13")
    assert data["graph_hash"] == build_graph([(0, 1), (1, 2)]).content_hash
    assert machine_from_json(data["machine"]) == load_machine("paper-4gpu")
    assert read_manifest(tmp_path / manifest.run_id) == manifest


def test_runlog__manifest_records_the_cpu_model(tmp_path, manifest):
    RunLogWriter.create(tmp_path, manifest).close()
    data = json.loads((tmp_path / manifest.run_id / MANIFEST_FILE).read_text())
    with open("/proc/cpuinfo") as info:
        model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    assert data["cpu"] == cpu_model() == model


def test_runlog__manifest_of_an_older_placer_reads_with_no_cpu_and_no_resumes(tmp_path, manifest):
    RunLogWriter.create(tmp_path, manifest).close()
    path = tmp_path / manifest.run_id / MANIFEST_FILE
    data = json.loads(path.read_text())
    del data["cpu"], data["resumes"]
    path.write_text(json.dumps(data))
    old = read_manifest(tmp_path / manifest.run_id)
    assert (old.cpu, old.resumes) == ("", ())


def test_runlog__record_resume__applies_changes_and_keeps_each_resume(tmp_path, manifest):
    RunLogWriter.create(tmp_path, manifest).close()
    run = tmp_path / manifest.run_id
    record_resume(run, {}, ["placer", "search", "--resume", str(run)])
    record_resume(run, {"budget": (10, 64)}, ["placer", "search", "--resume", str(run), "--budget", "64"])
    again = read_manifest(run)
    assert again.config == {"budget": 64} and again.command == manifest.command  # the starting command stays
    assert [r["changed"] for r in again.resumes] == [{}, {"budget": [10, 64]}]
    assert again.resumes[1]["command"][-2:] == ["--budget", "64"] and again.resumes[1]["cpu"] == cpu_model()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]  # written atomically, no leftovers


def test_runlog__bad_folders_are_placer_errors(tmp_path, manifest):
    with pytest.raises(PlacerError, match="not a run folder"):
        read_run(tmp_path)
    RunLogWriter.create(tmp_path, manifest).close()
    run = tmp_path / manifest.run_id
    with pytest.raises(PlacerError, match="already exists"):
        RunLogWriter.create(tmp_path, manifest)
    data = json.loads((run / MANIFEST_FILE).read_text())
    data["format_version"] = FORMAT_VERSION + 1
    (run / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(PlacerError, match=f"format version {FORMAT_VERSION + 1}, this placer reads versions 1, 2"):
        read_run(run)


def test_runlog__best_placement_is_fastest_ok(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.append(_result(0, runtime_s=3.0))
        log.append(_result(1, status="oom", runtime_s=0.1))
        log.append(_result(2, runtime_s=2.0))
        log.append(_result(3, runtime_s=2.5))
    best = read_best(tmp_path / manifest.run_id)
    assert (best.seq, best.runtime_s, best.placement) == (2, 2.0, (2, 1, 2))


@pytest.mark.parametrize("order", [(3, 1), (1, 3)])
def test_runlog__best_placement_tie_goes_to_the_row_logged_first_as_analyze_names_it(tmp_path, manifest, order):
    """It went to the smaller placement, while `placer analyze` and result.json named the first row's policy
    as the best's source: `apply` and the timeline plot showed one placement under another's name."""
    from cluster.analysis import summarize

    with RunLogWriter.create(tmp_path, manifest) as log:
        for i in order:
            log.append(_result(i, runtime_s=2.0))
    run = tmp_path / manifest.run_id
    first = read_run(run).sort_values("seq").iloc[0]
    assert read_best(run).placement == tuple(int(d) for d in first.placement) and read_best(run).seq == first.seq
    writer = RunLogWriter.resume(run)  # read back from the log: the same rule
    assert writer.best.seq == first.seq
    writer.close()
    summary = summarize([run])[0]
    assert (summary.overall_best_runtime_s, summary.overall_best_source) == (2.0, first.policy)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.drop_columns(["runtime_s"]), "it has no 'runtime_s' column"),
    (lambda t: t.drop_columns(["status"]), "it has no 'status' column"),
    (lambda t: t.set_column(t.schema.get_field_index("status"), "status",
                            pa.array([1] * t.num_rows, pa.int64())), "its 'status' column holds int64, not string"),
])
def test_runlog__a_part_without_a_column_every_version_writes_is_damaged(tmp_path, manifest, edit, message):
    """Read as nulls, a log without ``runtime_s`` analysed as a run with no best (exit 0), one without
    ``status`` was a traceback, and a resume of it crashed after Ray had started."""
    with RunLogWriter.create(tmp_path, manifest) as log:
        for i in range(3):
            log.append(_result(i))
    run = tmp_path / manifest.run_id
    part = next((run / "measurements").glob("*.parquet"))
    pq.write_table(edit(pq.read_table(part)), part)
    for read in (read_run, check_run_log):
        with pytest.raises(PlacerError, match=f"{part.name} is damaged: {message}"):
            read(run)


@pytest.mark.parametrize("column, value, message", [
    ("seq", None, "1 rows have no seq"),
    ("status", None, "1 rows have no status"),
    ("placement", None, "1 rows have no placement"),
    ("policy", None, "1 rows have no policy"),
    ("cache_hit", None, "1 rows have no cache_hit"),
    ("runtime_s", -1.0, r"1 rows of status ok have a runtime_s that is not a duration \(first: -1.0\)"),
    ("runtime_s", float("nan"), "1 rows of status ok have a runtime_s that is not a duration"),
])
def test_runlog__a_row_no_writer_logs_is_damaged(tmp_path, manifest, column, value, message):
    """A null seq was a traceback on --resume (NaN to int); a null status a row counted nowhere; an ok row of
    -1 s analysed as a best of -1 s, and a resume copied it into a best placement file every reader refused; a
    null placement a traceback in analyze of a run that lost a device; a null policy the best's source "nan"; a
    null cache_hit a row counted as measured."""
    with RunLogWriter.create(tmp_path, manifest) as log:
        for i in range(3):
            log.append(_result(i))
    run = tmp_path / manifest.run_id
    part = next((run / "measurements").glob("*.parquet"))
    table = pq.read_table(part)
    values = table.column(column).to_pylist()
    values[1] = value
    pq.write_table(table.set_column(table.schema.get_field_index(column), column,
                                    pa.array(values, table.schema.field(column).type)), part)
    # (check_run_log, before a resume, reads no placements: a long run's would be most of the log)
    for read in (read_run,) if column == "placement" else (read_run, check_run_log):
        with pytest.raises(PlacerError, match=f"measurements: a run log file is damaged: {message}"):
            read(run)


def _three_parts(tmp_path, manifest) -> Path:
    """A stopped run of six rows in three parts (two rows each), its best the last row."""
    log = RunLogWriter.create(tmp_path, manifest, flush_rows=2, flush_interval_s=1e9)
    for i in range(6):
        log.append(_result(i, runtime_s=10.0 - i))
    log.close()
    return tmp_path / manifest.run_id


@pytest.mark.parametrize("lost, message", [
    ([1], r"the run log lacks its rows of seq 2..3 \(a part file deleted or lost\)"),
    ([0], r"the run log lacks its rows of seq 0..1"),
    ([2], r"best_placement.json names the row of seq 5, which its measurement log \(measurements/\) lacks"),
    ([0, 1, 2], r"best_placement.json names the row of seq 5, which its measurement log"),
])
def test_runlog__rows_lost_with_a_deleted_part_are_refused(tmp_path, manifest, lost, message):
    """A deleted part was read as a run that measured less (the middle one) or nothing at all, "finished",
    exit 0 (every one); a resume then went on after the gap, and its compaction made the loss permanent. The
    commands that read a run's best (simulate --placement, apply, --warm-start RUN_DIR) took it too."""
    from cluster.run_best import read_run_best

    run = _three_parts(tmp_path, manifest)
    parts = sorted((run / "measurements").glob("*.parquet"))
    assert len(parts) == 3
    for k in lost:
        parts[k].unlink()
    for read in (read_run, check_run_log, RunLogWriter.resume, read_run_best):
        with pytest.raises(PlacerError, match=message):
            read(run)


def test_runlog__a_live_run_read_while_it_flushes_a_new_best_reads(tmp_path, manifest, monkeypatch):
    """The reader read the parts, then the best file; a flush in between (its rows, then a new best) made the
    best name a row the reader had not seen: "rows were lost", for a run still being written."""
    import cluster.runlog_format as runlog_format

    log = RunLogWriter.create(tmp_path, manifest, flush_rows=2, flush_interval_s=1e9)
    for i in range(4):
        log.append(_result(i, runtime_s=10.0 - i))
    read_rows = runlog_format._read_dataset

    def flushed_meanwhile(folder, schema):
        rows = read_rows(folder, schema)
        for i in range(4, 6):  # the live writer's next flush: two rows, one a new best
            log.append(_result(i, runtime_s=10.0 - i))
        return rows

    monkeypatch.setattr(runlog_format, "_read_dataset", flushed_meanwhile)
    assert len(read_run(tmp_path / manifest.run_id)) == 4
    monkeypatch.undo()
    assert len(read_run(tmp_path / manifest.run_id)) == 6


def test_runlog__a_listing_that_crossed_a_compaction_is_listed_again(tmp_path, manifest, monkeypatch):
    """A listing taken while a compaction ran can miss the merged part and some old ones: a gap that is no
    loss. It is listed again before the gap is called lost rows."""
    import cluster.runlog_format as runlog_format

    run = _three_parts(tmp_path, manifest)
    listed, list_parts = [], runlog_format.part_files

    def crossed_once(folder):
        parts = list_parts(folder)
        listed.append(folder)
        return [parts[0], parts[2]] if len(listed) == 1 and folder.name == "measurements" else parts

    monkeypatch.setattr(runlog_format, "part_files", crossed_once)
    monkeypatch.setattr(runlog_format, "_check_parts", lambda folder, schema: None)  # its listing is not this one
    assert read_run(run)["seq"].tolist() == list(range(6))
    assert len([folder for folder in listed if folder.name == "measurements"]) == 2


def test_read_runs__one_path_is_refused_not_read_letter_by_letter(tmp_path):
    """A string is a sequence: read_runs("runs") said "r is not a run folder"."""
    with pytest.raises(PlacerError, match=r"read_runs takes a list of run folders, not one path \('runs'\)"):
        read_runs("runs")
    with pytest.raises(PlacerError, match="not one path"):
        read_runs(tmp_path)


_BEST = {"run_id": "r", "seq": 0, "runtime_s": 1.0, "placement": [1, 0], "updated_at": "t", "placement_level": "op"}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"run_id": "r"}', '{"placement": 3}', "null",
                                  # fields of the wrong type: tracebacks in simulate and apply before
                                  json.dumps({**_BEST, "placement": ["x", 0]}),
                                  json.dumps({**_BEST, "runtime_s": "abc"}),
                                  json.dumps({**_BEST, "placement": [1.5, 0]})])
def test_runlog__a_damaged_best_placement_is_one_placer_error_naming_the_file(tmp_path, manifest, text):
    with RunLogWriter.create(tmp_path, manifest) as log:
        log.append(_result(0))
    run = tmp_path / manifest.run_id
    (run / "best_placement.json").write_text(text)
    with pytest.raises(PlacerError, match=r"best_placement\.json is damaged"):
        read_best(run)
    with pytest.raises(PlacerError, match=r"best_placement\.json is damaged"):
        RunLogWriter.resume(run)


def test_op_placement_of__groups_expand_and_bad_length_is_an_error():
    assert op_placement_of([2, 1], np.array([0, 0, 1]), 3, "run").tolist() == [2, 2, 1]
    assert op_placement_of([0, 1, 2], None, 3, "run").tolist() == [0, 1, 2]
    with pytest.raises(PlacerError, match="neither"):
        op_placement_of([0, 1], None, 3, "run")
    with pytest.raises(PlacerError, match="neither"):
        op_placement_of([0, 1], np.array([0, 2, 1]), 3, "run")  # group 2 has no device


def test_op_placement_of__the_logged_level_wins_over_the_length():
    groups = np.array([2, 0, 1])  # as many groups as ops, numbered differently
    assert op_placement_of([5, 6, 7], groups, 3, "run", level="group").tolist() == [7, 5, 6]
    assert op_placement_of([5, 6, 7], groups, 3, "run", level="op").tolist() == [5, 6, 7]
    assert op_placement_of([5, 6, 7], groups, 3, "run").tolist() == [5, 6, 7]  # format version 1: by length
    with pytest.raises(PlacerError, match="per op but has 2 entries"):
        op_placement_of([0, 1], groups, 3, "run", level="op")


def test_runlog__resume_continues_sequence_and_files(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest) as log:
        for i in range(3):
            log.append(_result(i))
        log.append_metrics(0, {"loss": 1.5, "entropy": 0.3})
    run = tmp_path / manifest.run_id
    (run / "measurements" / ".part-000009.parquet.123.tmp").write_bytes(b"half a file")
    writer, rows = resume_run(run)
    assert len(rows) == 3
    with writer:
        writer.append(_result(7))
        writer.append_metrics(1, {"loss": 1.0})
    again = read_run(run)
    assert again["seq"].tolist() == [0, 1, 2, 3] and again["placement"][3].tolist() == [2, 1, 2]
    metrics = read_metrics(run)
    assert metrics["seq"].tolist() == [0, 1, 2] and metrics["value"].tolist() == [1.5, 0.3, 1.0]
    assert not list(run.glob("measurements/.*.tmp"))


def test_runlog__a_resume_takes_the_best_from_the_rows_where_the_best_file_was_left_behind(tmp_path, manifest):
    """A kill between a flush's measurements part and its best file left an older best file; a resume trusted
    it, answered the rows already logged from it, and `placer apply` took the slower placement."""
    with RunLogWriter.create(tmp_path, manifest) as log:
        for i in (2, 1, 0):
            log.append(_result(i))  # the fastest, 1.0 s, last
    run = tmp_path / manifest.run_id
    best_file = run / "best_placement.json"
    stale = {**json.loads(best_file.read_text()), "seq": 0, "runtime_s": 3.0, "placement": [2, 1, 2]}
    best_file.write_text(json.dumps(stale))
    writer, _ = resume_run(run)
    with writer:
        writer.append(_result(4))  # 5.0 s: no better
    best = read_best(run)
    assert (best.seq, best.runtime_s, list(best.placement)) == (2, 1.0, [0, 1, 2])


def test_runlog__read_runs_concatenates(tmp_path, manifest):
    other = new_manifest("second", build_graph([(0, 1)]), load_machine("paper-2gpu"), seed=1)
    for m, n in ((manifest, 2), (other, 3)):
        with RunLogWriter.create(tmp_path, m) as log:
            for i in range(n):
                log.append(_result(i))
    rows = read_runs([tmp_path / manifest.run_id, tmp_path / "second"])
    assert rows.groupby("run_id").size().to_dict() == {manifest.run_id: 2, "second": 3}


class _Crash(Exception):
    """Stands for the process dying at that point."""


def _stopped_run(root: Path, manifest, rows: int = 1000, rows_per_part: int = 10, metrics: bool = True) -> Path:
    """A run closed without a clean finish: ``rows`` measurements in parts of ``rows_per_part`` rows, and
    (``metrics``) one metric per measurement, in as many parts."""
    flush_rows = rows_per_part * (2 if metrics else 1)  # the writer counts both kinds of rows
    log = RunLogWriter.create(root, manifest, flush_rows=flush_rows, flush_interval_s=1e9)
    for i in range(rows):
        log.append(_result(i))
        if metrics:
            log.append_metrics(i, {"loss": float(i)})
    log.close()
    return log.folder


def _assert_every_row_once(run: Path, rows: int = 1000, metrics: int = 1000) -> None:
    assert read_run(run)["seq"].tolist() == list(range(rows))
    assert np.allclose(read_run(run)["runtime_s"], np.arange(rows) + 1.0)
    assert read_metrics(run)["value"].tolist() == [float(i) for i in range(metrics)]


def test_runlog__compaction__thousand_rows_in_a_hundred_parts_become_one_file(tmp_path, manifest):
    run = _stopped_run(tmp_path, manifest, metrics=False)
    assert len(_part_files(run)) == 100
    before = read_run(run)
    compact_run(run)
    assert len(_part_files(run)) == 1 and len(_part_files(run, "metrics")) == 1
    metrics = run / "metrics"  # a search's: no metric, and still a table DuckDB and pandas read (it was no file)
    assert duckdb.sql(f"select count(*) from '{metrics}/*.parquet'").fetchall() == [(0,)]
    assert list(pd.read_parquet(metrics).columns) == list(read_metrics(run).columns)
    after = read_run(run)
    pd.testing.assert_frame_equal(after, before)
    assert after["seq"].tolist() == list(range(1000))
    folder = run / "measurements"
    assert pd.read_parquet(folder)["seq"].tolist() == list(range(1000))  # the one file is in seq order
    assert duckdb.sql(f"select count(*), count(distinct seq) from '{folder}/*.parquet'").fetchall() == [(1000, 1000)]


def test_runlog__compaction__clean_close_leaves_one_measurement_and_one_metrics_file(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest, flush_rows=7, flush_interval_s=1e9) as log:
        for i in range(1000):
            log.append(_result(i))
            log.append_metrics(i, {"loss": float(i)})
        assert len(_part_files(log.folder)) > 100
        assert len(read_run(log.folder)) < 1000  # the last rows are still buffered: close flushes them first
    run = log.folder
    assert len(_part_files(run)) == 1 and len(_part_files(run, "metrics")) == 1
    _assert_every_row_once(run)
    assert read_best(run).seq == 0


def test_runlog__compaction__not_when_the_run_stops_with_an_exception(tmp_path, manifest):
    with pytest.raises(KeyboardInterrupt):
        with RunLogWriter.create(tmp_path, manifest, flush_rows=3) as log:
            for i in range(7):
                log.append(_result(i))
            raise KeyboardInterrupt
    assert len(_part_files(log.folder)) == 3  # a stopped run keeps its parts: resume may go on
    _assert_every_row_once(log.folder, rows=7, metrics=0)


def test_runlog__compaction__resume_appends_after_the_compacted_file(tmp_path, manifest):
    run = _stopped_run(tmp_path, manifest, rows=30)
    compact_run(run)
    (compacted,) = _part_files(run)
    writer, rows = resume_run(run, flush_rows=4)
    assert len(rows) == 30
    for i in range(30, 40):
        writer.append(_result(i))
        writer.append_metrics(i, {"loss": float(i)})
    writer.flush()
    assert _part_files(run)[0] == compacted and all(name > compacted for name in _part_files(run)[1:])
    _assert_every_row_once(run, rows=40, metrics=40)
    writer.close(compact=True)
    assert len(_part_files(run)) == 1 and len(_part_files(run, "metrics")) == 1
    _assert_every_row_once(run, rows=40, metrics=40)


@pytest.mark.parametrize("deleted_before_crash", [0, 40])
def test_runlog__compaction__crash_after_rename_before_deletes_reads_every_row_once(tmp_path, manifest, monkeypatch,
                                                                                     deleted_before_crash):
    run = _stopped_run(tmp_path, manifest)
    real_delete = runlog._delete_parts

    def crash(parts):
        real_delete(parts[:deleted_before_crash])
        raise _Crash

    monkeypatch.setattr(runlog, "_delete_parts", crash)
    with pytest.raises(_Crash):
        compact_run(run)
    assert len(_part_files(run)) == 100 - deleted_before_crash + 1  # the compacted file is in, beside parts
    _assert_every_row_once(run, metrics=1000)
    monkeypatch.setattr(runlog, "_delete_parts", real_delete)
    with RunLogWriter.resume(run) as writer:
        assert writer.rows_logged == 1000
        writer.append(_result(1000))
        writer.append_metrics(1000, {"loss": 1000.0})
    assert len(_part_files(run)) == 1 and len(_part_files(run, "metrics")) == 1
    _assert_every_row_once(run, rows=1001, metrics=1001)
    folder = run / "measurements"
    assert duckdb.sql(f"select count(*), count(distinct seq) from '{folder}/*.parquet'").fetchall() == [(1001, 1001)]


def test_runlog__compaction__crash_after_the_temp_file_is_written_reads_every_row_once(tmp_path, manifest,
                                                                                        monkeypatch):
    run = _stopped_run(tmp_path, manifest)
    parts_before = _part_files(run)

    def crash(src, dst):
        src = Path(src)
        shutil.copy(src, src.with_name(src.name.replace(".tmp", ".killed.tmp")))  # a killed process leaves it
        raise _Crash

    monkeypatch.setattr(runlog.os, "replace", crash)
    with pytest.raises(_Crash):
        compact_run(run)
    monkeypatch.undo()
    assert [n for n in _part_files(run) if not n.startswith(".")] == parts_before
    assert any(n.startswith(".") and n.endswith(".killed.tmp") for n in _part_files(run))
    _assert_every_row_once(run)
    assert pd.read_parquet(run / "measurements")["seq"].tolist() == list(range(1000))  # dot-files skipped
    RunLogWriter.resume(run).close(compact=True)
    assert len(_part_files(run)) == 1  # the temp file is gone too
    _assert_every_row_once(run)


def test_runlog__compaction__a_reader_that_listed_the_old_parts_lists_again(tmp_path, manifest, monkeypatch):
    run = _stopped_run(tmp_path, manifest)
    real_dataset = pds.dataset
    listed = []

    def list_then_compact(*args, **kwargs):
        dataset = real_dataset(*args, **kwargs)
        listed.append(dataset)
        if len(listed) == 1:
            compact_run(run)  # deletes the parts this first listing holds
        return dataset

    monkeypatch.setattr(pds, "dataset", list_then_compact)
    rows = read_run(run)
    assert rows["seq"].tolist() == list(range(1000)) and len(_part_files(run)) == 1
    with pytest.raises(FileNotFoundError):
        listed[0].to_table()  # what read_run met, and answered by listing again


_WRITER_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    from cluster.pool import PoolResult
    from cluster.runlog import RunLogWriter, new_manifest
    from graphs.opgraph import OpGraph
    from measurers.base import Measurement
    from measurers.catalog import load_machine
    sys.path.insert(0, sys.argv[2])
    from conftest import build_graph
    graph = build_graph([(0, 1), (1, 2)])
    log = RunLogWriter.create(sys.argv[1], new_manifest("killed", graph, load_machine("paper-4gpu"), seed=0),
                              flush_rows=5)
    i = 0
    while True:
        m = Measurement(1.0 + i, (1.0 + i,) * 3, "ok", (i, 0, 0, 0, 0), 0.001)
        now = time.time()
        log.append(PoolResult(i, np.array([i % 5, 0, 1]), m, "a", "n", now, now, now, False, 1, "p", i))
        log.append_metrics(i, {"loss": float(i)})
        i += 1
""")


@pytest.mark.parametrize("kill_after_files", [3, 12])
def test_runlog__sigkill_mid_run_leaves_readable_folder(tmp_path, kill_after_files):
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    proc = subprocess.Popen([sys.executable, "-c", _WRITER_SCRIPT, str(tmp_path), str(REPO / "tests")], cwd=REPO,
                            env=env, stderr=subprocess.PIPE)
    folder = tmp_path / "killed" / "measurements"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if folder.is_dir() and len(list(folder.glob("part-*.parquet"))) >= kill_after_files:
            break
        time.sleep(0.005)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows = read_run(tmp_path / "killed")
    assert len(rows) >= 2 * kill_after_files  # each flush holds 5 rows: measurements and metrics
    assert rows["seq"].tolist() == list(range(len(rows)))  # flushed in order: no holes
    assert set(rows["status"]) <= set(STATUSES)
    assert all(len(p) == 3 for p in rows["placement"])
    assert np.allclose(rows["runtime_s"], rows["seq"] + 1.0)
    assert len(read_metrics(tmp_path / "killed")) >= len(rows) - 3  # killed between the two files of a flush
    assert duckdb.sql(f"select count(*) from read_parquet('{folder}/*.parquet')").fetchall() == [(len(rows),)]


def test_run_ids_started_within_one_second_do_not_collide(tmp_path):
    """Two runs of the same graph, policy and seed started in the same second get distinct folders."""
    from cluster.runlog import make_run_id

    first = make_run_id("nmt-2", "reinforce", 0, when=0.0, root=tmp_path)
    (tmp_path / first).mkdir()
    second = make_run_id("nmt-2", "reinforce", 0, when=0.0, root=tmp_path)
    assert second == first + "-2" and not (tmp_path / second).exists()
    assert make_run_id("nmt-2", "reinforce", 0, when=0.0) == first  # without a root: the plain name


def test_run_id__an_overlong_graph_name_is_cut_and_hashed_so_the_folder_can_be_made(tmp_path):
    """A graph file may name a graph with hundreds of characters; its run folder (and the staging folder
    with its suffix) must still fit a file system's 255-byte names, and two such names must not collide."""
    from cluster.runlog import make_run_id

    first = make_run_id("L" * 300, "annealing", 0, when=0.0, root=tmp_path)
    other = make_run_id("L" * 299 + "M", "annealing", 0, when=0.0, root=tmp_path)
    assert first != other and first.startswith("L" * 80) and len(first) < 160
    (tmp_path / first).mkdir()  # the name the search makes
    assert make_run_id("nmt-2", "cem", 0, when=0.0).startswith("nmt-2__cem__0__")  # short names unchanged


@pytest.mark.parametrize("graph_name, start", [(".hidden", "hidden__"), ("../../x", "x__"), ("-", "graph__"),
                                               ("...", "graph__")])
def test_run_id__never_starts_with_a_dot_or_a_dash(graph_name, start):
    """A graph named ".hidden" made a hidden run folder, which `placer analyze DIR` skips (dot-named folders
    are staging) and `ls` hides; a leading dash reads as an option on a command line."""
    from cluster.runlog import make_run_id

    assert make_run_id(graph_name, "cem", 0, when=0.0).startswith(start)


def test_runlog__a_resumed_learner_replaying_logged_iterations_does_not_log_their_metrics_twice(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest) as log:
        for iteration in range(4):
            log.append_metrics(iteration, {"loss": float(iteration)})
        folder = log.folder
    with RunLogWriter.resume(folder) as log:  # its checkpoint held 2 iterations: 2 and 3 run again
        for iteration in (2, 3, 4, 0):  # then 4 is new, and a later phase may count from 0 again
            log.append_metrics(iteration, {"loss": 10.0 + iteration})
    metrics = read_metrics(folder)
    assert metrics.iteration.tolist() == [0, 1, 2, 3, 4, 0]
    assert metrics.value.tolist() == [0.0, 1.0, 2.0, 3.0, 14.0, 10.0]


@pytest.mark.parametrize("argv, command", [
    (["/home/u/placer/.venv/bin/placer", "baselines", "--out", "r"], ["placer", "baselines", "--out", "r"]),
    (["/home/u/placer/cluster/cli.py", "reproduce", "mirhoseini2017"], ["placer", "reproduce", "mirhoseini2017"]),
    (["my_sweep.py", "--fast"], ["my_sweep.py", "--fast"]),
])
def test_invocation__placers_command_line_as_a_user_types_it(monkeypatch, argv, command):
    """A manifest's command: baselines --out recorded .venv/bin/placer, and reproduce's runs a made-up
    `placer reproduce nmt-2 paper-2gpu annealing`."""
    from cluster.runlog import invocation

    monkeypatch.setattr(sys, "argv", argv)
    assert invocation() == command


@pytest.mark.parametrize("name, value", [("config", "x"), ("machine", [1]), ("graph_hash", 5), ("policy", None),
                                         ("run_id", "sub/../../escaped"), ("run_id", ".."), ("run_id", "")])
def test_read_manifest__a_field_of_the_wrong_type_is_one_error(tmp_path, manifest, name, value):
    """``"config": "x"`` loaded, and `placer apply` failed with an AttributeError. A run id names files (`analyze
    --plots DIR` wrote "sub/../../escaped"'s plots outside DIR)."""
    with RunLogWriter.create(tmp_path, manifest):
        pass
    path = tmp_path / manifest.run_id / MANIFEST_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), name: value}))
    with pytest.raises(PlacerError, match=f"manifest.json: not a valid run manifest \\({name} .* is not a"):
        read_manifest(tmp_path / manifest.run_id)


def test_make_run_id__a_name_another_writer_is_staging_is_taken(tmp_path):
    """Two `placer baselines --out DIR` started within one second: the second chose the first's run id while the
    first's folder was still staged (a baselines run stages it for its whole run), and when both had finished
    the second failed, "folder ... already exists", its whole run discarded."""
    from graphs.files import atomic_folder

    when = 1.7e9
    first = make_run_id("g", "baselines", 0, when=when, root=tmp_path)
    with atomic_folder(tmp_path, first) as staging:
        (staging / first).mkdir()
        second = make_run_id("g", "baselines", 0, when=when, root=tmp_path)
        assert second == f"{first}-2"
    assert make_run_id("g", "baselines", 0, when=when, root=tmp_path) == f"{first}-2"  # the first's folder: taken

