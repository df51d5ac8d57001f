"""`--json`: stdout carries exactly one JSON document; METIS's C-level warnings, Ray's driver log lines and
notes go to stderr. Also: a --groups above the graph's colocation groups is one note, and the real count
is reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster.cli import main

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RLLIB_TEST_NO_TF_IMPORT": "1", "RAY_USAGE_STATS_ENABLED": "0"}
# 55 ops in 51 colocation groups: on 8 GPUs the METIS baseline's partition makes METIS print
# "***Cannot bisect a graph with 0 vertices!" and "***You are trying to partition a graph into too many
# parts!" with printf, i.e. on file descriptor 1, not through Python.
SMALL_GRAPH, SMALL_GRAPH_COLOCATION_GROUPS = "synthetic:55:1", 51
NOTE = "placer: note: --groups 256 is more than the 51 colocation groups of graph 'synthetic:55:1'; using 51"


def _placer(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=timeout_s)


def test_baselines_json__metis_warnings_on_fd1_reach_neither_stream():
    """METIS asked for more parts than it can make prints "***You are trying to partition a graph into too many
    parts!" on descriptor 1: it went to stderr under --json, and into the table without it; now nowhere
    (graphs.grouping.c_stdout_dropped; tests/graphs/test_grouping.py shows METIS still prints there)."""
    done = _placer("baselines", "--graph", SMALL_GRAPH, "--machine", "paper-8gpu", "--groups", "256",
                   "--policies", "metis,single-gpu", "--budget", "2", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads(done.stdout)  # the whole of stdout: one document, nothing before or after it
    assert [row["policy"] for row in payload["results"]] == ["metis", "single-gpu"]
    assert "***" not in done.stderr


def test_baselines_json__groups_above_colocation_groups_is_one_note_and_the_real_count(capsys):
    code = main(["baselines", "--graph", SMALL_GRAPH, "--machine", "paper-2gpu", "--groups", "256",
                 "--policies", "single-gpu,random", "--budget", "3", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["groups"] == SMALL_GRAPH_COLOCATION_GROUPS
    assert out.err.count("placer: note:") == 1 and NOTE in out.err


def test_graphs_show__fewer_groups_than_asked_is_one_note(capsys):
    """"topo" cut synthetic:150 (138 colocation groups) into 21 runs for --groups 32, and nothing said so."""
    code = main(["graphs", "show", "synthetic:150", "--method", "topo", "--groups", "32", "--json"])
    out = capsys.readouterr()
    assert code == 0 and json.loads(out.out)["groups"] == 21
    assert out.err == ("placer: note: the topo grouping made 21 groups of graph 'synthetic:150:0', fewer than the "
                       "32 asked for (--groups 32, 138 colocation groups)\n")
    assert main(["graphs", "show", "synthetic:150", "--method", "metis", "--groups", "32", "--json"]) == 0
    assert "placer: note:" not in capsys.readouterr().err  # 32 groups made: no note


def test_graphs_show_and_baselines__the_default_groups_are_named_as_the_default_in_their_notes(capsys):
    """With no --groups a note said "--groups 32 is more than ...", a flag the user never gave."""
    assert main(["graphs", "show", "synthetic:20:1", "--json"]) == 0
    out = capsys.readouterr()
    colocation_groups = json.loads(out.out)["colocation_groups"]
    assert colocation_groups < 32 and "--groups 32" not in out.err
    assert out.err == (f"placer: note: the default of 32 groups (--groups) is more than the {colocation_groups} "
                       f"colocation groups of graph 'synthetic:20:1'; using {colocation_groups}\n")
    assert main(["graphs", "show", "synthetic:150", "--method", "topo", "--json"]) == 0
    assert "(the default of 32 groups (--groups), 138 colocation groups)" in capsys.readouterr().err
    assert main(["baselines", "--graph", "synthetic:20:1", "--machine", "paper-2gpu", "--policies", "random",
                 "--budget", "2", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["groups"] == colocation_groups
    assert "placer: note: the default of 32 groups (--groups) is more than" in out.err


def test_baselines_json__groups_below_colocation_groups_is_no_note(capsys):
    code = main(["baselines", "--graph", SMALL_GRAPH, "--machine", "paper-2gpu", "--groups", "8",
                 "--policies", "random", "--budget", "3", "--json"])
    out = capsys.readouterr()
    assert code == 0 and json.loads(out.out)["groups"] <= 8
    assert "placer: note:" not in out.err


def test_graphs_show_json__reports_the_real_group_count_with_one_note(capsys):
    code = main(["graphs", "show", SMALL_GRAPH, "--groups", "256", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    figures = json.loads(out.out)
    assert figures["groups"] == figures["colocation_groups"] == SMALL_GRAPH_COLOCATION_GROUPS
    assert out.err.count("placer: note:") == 1 and NOTE in out.err


def test_json_error__goes_to_stderr_with_a_nonzero_exit(capsys):
    code = main(["machines", "show", "no-such-machine", "--json"])
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and "placer: error:" in out.err


def test_json_stdout__restores_fd1_and_sys_stdout_afterwards(capfd):
    stdout_before = sys.stdout
    assert main(["machines", "show", "paper-2gpu", "--json"]) == 0
    assert sys.stdout is stdout_before
    os.write(1, b"after\n")
    out = capfd.readouterr().out
    assert json.loads(out[:-len("after\n")])["name"] == "paper-2gpu" and out.endswith("after\n")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), so the test only ever touches its own Ray."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _process_title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kill_first_busy_measurer(process: subprocess.Popen, killed: list[int]) -> None:
    """SIGKILL the first measurer actor of ``process`` seen running a method (Ray titles it
    ``ray::MeasurerActor.<method>`` then), so Ray reports a worker that died during a task."""
    while process.poll() is None:
        for pid in _descendants(process.pid):
            if _process_title(pid).startswith("ray::MeasurerActor."):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.01)


@pytest.mark.slow  # starts Ray
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the actor's process through /proc")
def test_search_json__ray_noise_after_a_killed_actor_goes_to_stderr_and_groups_are_the_real_count(tmp_path):
    command = [sys.executable, "-m", "cluster.cli", "search", "--graph", "synthetic:300", "--machine",
               "paper-2gpu", "--budget", "64", "--workers", "1", "--groups", "400", "--out", str(tmp_path), "--json"]
    process = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    killed: list[int] = []
    killer = threading.Thread(target=_kill_first_busy_measurer, args=(process, killed), daemon=True)
    killer.start()
    try:
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert killed, "the search ended before its measurer actor could be killed"
    assert process.returncode == 0, stderr[-3000:]
    result = json.loads(stdout)  # the whole of stdout
    assert result["measurements"] == 64
    assert "A worker died or was killed" in stderr
    assert result["groups"] == result["colocation_groups"] == 276  # synthetic:300's colocation groups
    assert stderr.count("placer: note:") == 1
    assert "--groups 400 is more than the 276 colocation groups of graph 'synthetic:300:0'; using 276" in stderr


def test_emit_json__infinities_become_null(capsys):
    import math

    from cluster.jsonout import emit_json

    emit_json({"runtime_s": math.inf, "samples_s": [1.0, math.nan], "ok": 2.5})
    assert json.loads(capsys.readouterr().out) == {"runtime_s": None, "samples_s": [1.0, None], "ok": 2.5}


def test_search_json__exact_reports_its_solver_next_to_the_measured_step_within_its_time_limit(tmp_path):
    """`placer search --policy exact --time-limit S --json`: one document with the solver's makespan, bound
    and status beside the measured step (CP-SAT's and HiGHS's banners stay off stdout)."""
    done = _placer("search", "--graph", "synthetic:40:2", "--machine", "paper-2gpu", "--policy", "exact",
                   "--budget", "4", "--time-limit", "3", "--groups", "8", "--workers", "1", "--out", str(tmp_path),
                   "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads(done.stdout)
    solver = payload["solver"]
    assert solver["status"] in ("optimal", "time limit") and solver["makespan_s"] > 0
    assert solver["bound_s"] <= solver["makespan_s"] * (1 + 1e-6) and "relaxation (HiGHS" in solver["notes"]
    assert payload["policy_best_runtime_s"] > 0 and 1 <= payload["measurements"] <= 4


def test_baselines_and_search__the_fewer_groups_note_names_the_method_used(tmp_path, capsys):
    """Scope grouping falls back to METIS on a graph without scopes: the note said "the scope grouping made 298
    groups", the run's grouping.npz said metis (and `graphs show` said metis)."""
    from conftest import build_graph
    from graphs.io import save_graph

    fan = build_graph([(0, i, 10**4) for i in range(1, 301)] + [(i, 301, 10**4) for i in range(1, 301)], 302,
                      name="fan")
    save_graph(fan, tmp_path / "fan.parquet")
    common = ["--graph", str(tmp_path / "fan.parquet"), "--machine", "paper-2gpu", "--groups", "301",
              "--bound-time-limit", "0", "--json"]
    assert main(["baselines", *common, "--policies", "single-gpu"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("placer: note: the metis grouping made ") and err.count("\n") == 1
    assert main(["search", *common, "--policy", "random", "--budget", "2", "--workers", "1",
                 "--out", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["grouping"] == "metis"
    assert "placer: note: the metis grouping made " in out.err and "scope grouping" not in out.err
