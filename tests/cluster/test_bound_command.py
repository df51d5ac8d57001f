"""`placer bound`: the table, one JSON document (HiGHS's banner kept off stdout), and clean failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cli import main

REPO = Path(__file__).resolve().parents[2]
GRAPH = ("--graph", "synthetic:200:1", "--machine", "paper-4gpu", "--groups", "8")


def test_bound__json_is_exactly_one_document_in_a_fresh_process():
    """A fresh process: HiGHS prints a banner on file descriptor 1 when its first solver is made."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RLLIB_TEST_NO_TF_IMPORT": "1"}
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "bound", *GRAPH, "--time-limit", "5", "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["groups"] == 8 and report["time_limit_s"] == 5
    assert report["lp_status"] == "optimal"
    assert report["closed_form_s"] <= report["lp_s"] * (1 + 1e-6) <= report["mip_s"] * (1 + 2e-6)
    assert report["best_s"] == pytest.approx(max(report["closed_form_s"], report["lp_s"], report["mip_s"]), rel=2e-6)
    assert report["grouping"] == "the 8 metis groups of synthetic:200:1"  # no name scopes: METIS groups
    assert report["mip_s"] > report["closed_form_s"] * 1.1  # copies and channels count here
    assert report["holds_for"] == "placements of the 8 metis groups of synthetic:200:1"


def test_bound__table_names_each_bound_and_what_it_holds_for(capsys):
    assert main(["bound", *GRAPH, "--time-limit", "3"]) == 0
    out = capsys.readouterr().out
    for text in ("closed form", "LP relaxation", "MIP relaxation", "every placement", "the 8 metis groups", "best"):
        assert text in out


def test_bound__a_small_graphs_bounds_print_their_digits(capsys):
    """Four decimals printed every bound of a 47 us step as 0.0000."""
    assert main(["bound", "--graph", "synthetic:10:1", "--machine", "h200x8", "--groups", "16", "--time-limit",
                 "5"]) == 0
    table = capsys.readouterr().out
    assert "0.0000" not in table and "e-05" in table


def test_bound__zero_time_limit_is_the_closed_form_only(capsys):
    assert main(["bound", *GRAPH, "--time-limit", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lp_s"] is None and report["mip_s"] is None and report["mip_status"] == "skipped"
    assert report["best_s"] == report["closed_form_s"] and report["holds_for"] == "every placement"


@pytest.mark.parametrize("args, message", [
    (("--graph", "no-such-graph", "--machine", "paper-2gpu"), "unknown graph 'no-such-graph'"),
    (("--graph", "synthetic:50", "--machine", "no-such-machine"), "unknown machine 'no-such-machine'"),
    (("--graph", "synthetic:50", "--machine", "paper-2gpu", "--time-limit", "-1"), "--time-limit"),
    (("--graph", "synthetic:50", "--machine", "paper-2gpu", "--time-limit", "nan"), "--time-limit"),
    (("--graph", "synthetic:50", "--machine", "paper-2gpu", "--groups", "0"), "--groups"),
])
def test_bound__bad_input_is_one_error_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["bound", *args, "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placer: error:") and message in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written
