"""The Parquet run log: rows round-trip, foreign readers, resume, and a writer killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow.dataset as pds
import pytest
from conftest import build_graph

from cluster.pool import PoolResult
from cluster.runlog import (FORMAT_VERSION, MANIFEST_FILE, RunLogWriter, make_run_id, new_manifest, read_best,
                            read_groups, read_manifest, read_metrics, read_run, read_runs, resume_run)
from graphs.errors import PlacerError
from measurers.base import STATUSES, Measurement
from measurers.catalog import load_machine, machine_from_json

REPO = Path(__file__).resolve().parents[2]


def _result(i: int, status: str = "ok", runtime_s: float | None = None, cache_hit: bool = False,
            log_placement=None) -> PoolResult:
    runtime_s = 1.0 + i if runtime_s is None else runtime_s
    m = Measurement(runtime_s if status == "ok" else float("nan"), (runtime_s, runtime_s * 1.01), status,
                    (100 * i, 200, 0, 0, 0), 0.01, "" if status == "ok" else f"{status} happened")
    t = 1_700_000_000.0 + i
    return PoolResult(i, np.array([i % 5, 1, 2], dtype=np.int64), m, f"actor{i % 2}", f"node{i % 2}", t, t + 0.5,
                      t + 0.75, cache_hit, 1, "cem", i // 4, log_placement)


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
        log.append(_result(0, log_placement=np.array([4, 3])))
        log.write_groups(np.array([0, 1, 1]), op_names=["a", "b", "c"])
    run = tmp_path / manifest.run_id
    assert list(read_run(run)["placement"][0]) == [4, 3]
    assert read_groups(run).tolist() == [0, 1, 1]


def test_runlog__files_open_without_project_code(tmp_path, manifest):
    with RunLogWriter.create(tmp_path, manifest, flush_rows=3) as log:
        for i in range(7):
            log.append(_result(i, status="crash" if i == 2 else "ok"))
    folder = tmp_path / manifest.run_id / "measurements"
    assert len(list(folder.glob("part-*.parquet"))) == 3  # flushes at 3, 6, and on close
    assert len(pd.read_parquet(folder)) == 7
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
    with pytest.raises(PlacerError, match="format version"):
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
def test_runlog__best_placement_tie_goes_to_the_smaller_placement_in_any_arrival_order(tmp_path, manifest, order):
    with RunLogWriter.create(tmp_path, manifest) as log:
        for i in order:
            log.append(_result(i, runtime_s=2.0))
    assert read_best(tmp_path / manifest.run_id).placement == (1, 1, 2)


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


def test_runlog__read_runs_concatenates(tmp_path, manifest):
    other = new_manifest("second", build_graph([(0, 1)]), load_machine("paper-2gpu"), seed=1)
    for m, n in ((manifest, 2), (other, 3)):
        with RunLogWriter.create(tmp_path, m) as log:
            for i in range(n):
                log.append(_result(i))
    rows = read_runs([tmp_path / manifest.run_id, tmp_path / "second"])
    assert rows.groupby("run_id").size().to_dict() == {manifest.run_id: 2, "second": 3}


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
