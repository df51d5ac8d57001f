"""`placer baselines`: the table, its JSON, the run log, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cluster.cli import main
from graphs.errors import PlacerError


def run_json(capsys, *args):
    code = main(["baselines", "--graph", "synthetic:80:2", "--machine", "paper-2gpu", "--json", *args])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else None), out.err


def test_baselines_json__has_lower_bound_and_one_result_per_policy(capsys):
    code, payload, _ = run_json(capsys, "--policies", "single-gpu,m-etf,cem,expert", "--budget", "30",
                                "--groups", "16")
    assert code == 0
    assert payload["lower_bound_s"] > 0
    rows = {row["policy"]: row for row in payload["results"]}
    assert list(rows) == ["single-gpu", "m-etf", "cem", "expert"]
    for name in ("single-gpu", "m-etf", "cem"):
        assert set(rows[name]) >= {"policy", "runtime_s", "status", "placement_time_s", "measurements"}
        assert rows[name]["runtime_s"] >= payload["lower_bound_s"] * (1 - 1e-9)
    assert rows["cem"]["measurements"] == 30 and rows["m-etf"]["measurements"] == 1
    assert rows["single-gpu"]["ratio_to_single_gpu"] == 1.0
    assert rows["expert"]["status"] == "skipped" and "no expert rule" in rows["expert"]["notes"]
    assert payload["proven_bound_s"] >= payload["lower_bound_s"]
    grouping = payload["proven_bound"]["grouping"]  # the searches' groups, e.g. "the 16 scope groups of ..."
    assert grouping.startswith("the 16 ") and grouping.endswith(" groups of synthetic:80:2")
    assert payload["proven_bound_holds_for"] in ("every placement", f"placements of {grouping}")
    cem = rows["cem"]  # a search of the bound's own groups: never below it
    assert cem["ratio_to_proven_bound"] == pytest.approx(cem["runtime_s"] / payload["proven_bound_s"])
    assert cem["ratio_to_proven_bound"] >= 1 - 1e-6


def test_baselines__an_out_of_memory_row_has_no_ratio_to_the_proven_bound(tmp_path, capsys):
    """The bound holds for placements that fit in memory: an oom row's step gave "x proven bound" 2.089."""
    from measurers.catalog import CATALOG_DIR

    machine = json.loads((CATALOG_DIR / "paper-2gpu.json").read_text())
    for device in machine["devices"]:
        device["memory_bytes"] = 30 * 10**6 if device["name"].startswith("gpu") else 20 * 10**6
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(machine))
    args = ["baselines", "--graph", "synthetic:60:1", "--machine", str(path), "--policies", "single-gpu,m-etf",
            "--budget", "5", "--bound-time-limit", "5"]
    assert main([*args, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [row["status"] for row in payload["results"]] == ["oom", "oom"]
    assert all(row["ratio_to_proven_bound"] is None for row in payload["results"])
    assert main(args) == 0
    table = capsys.readouterr().out
    assert table.count("│ oom ") == 2 and "2.089" not in table and "2.605" not in table


def test_baselines_json__same_seed_same_table(capsys):
    args = ("--policies", "random,annealing", "--budget", "20", "--groups", "8", "--seed", "4")
    _, first, _ = run_json(capsys, *args)
    _, second, _ = run_json(capsys, *args)
    assert [r["runtime_s"] for r in first["results"]] == [r["runtime_s"] for r in second["results"]]


def test_baselines_table__prints_every_policy(capsys):
    code = main(["baselines", "--graph", "synthetic:60", "--machine", "paper-4gpu", "--policies",
                 "cpu-only,round-robin,metis", "--budget", "5"])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("cpu-only", "round-robin", "metis", "lower bound", "x proven", "proven bound"):
        assert text in out


def test_baselines_out__writes_a_run_log_with_every_measurement(tmp_path, capsys):
    code, payload, _ = run_json(capsys, "--policies", "heft,random", "--budget", "12", "--out", str(tmp_path))
    assert code == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    rows = pd.read_parquet(folder / "measurements")
    assert sorted(rows["policy"].value_counts().items()) == [("heft", 1), ("random", 12), ("single-gpu", 1)]
    assert np.allclose(rows["reward"], -np.sqrt(rows["runtime_s"]))  # as a search's log (it was null)
    took = (rows["finished_at"] - rows["started_at"]).dt.total_seconds()  # they were all equal
    assert np.allclose(took, rows["measure_s"], atol=1e-3) and (rows["submitted_at"] == rows["started_at"]).all()
    assert json.loads((folder / "baselines.json").read_text())["results"] == payload["results"]
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no staging folder left beside it
    assert payload["run_dir"] == str(folder)  # a --json user finds the folder it made, as search's JSON names it
    from cluster.analysis import summarize

    (summary,) = summarize([folder])  # a finished baselines run: its best is the best baseline
    assert summary.finished and summary.policy_best_runtime_s == min(r["runtime_s"] for r in payload["results"])


def test_baselines_out__the_single_gpu_reference_is_a_row_as_it_is_in_the_log(tmp_path, capsys):
    """Measured for the "x single GPU" column though --policies left it out: it was logged, and analyze took
    it as the run's best while the table showed only the two rows asked for."""
    code, payload, _ = run_json(capsys, "--policies", "cpu-only,round-robin", "--out", str(tmp_path))
    assert code == 0
    assert [r["policy"] for r in payload["results"]] == ["cpu-only", "round-robin", "single-gpu"]
    assert payload["results"][2]["ratio_to_single_gpu"] == 1.0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    from cluster.analysis import summarize

    (summary,) = summarize([folder])
    best = min(r["runtime_s"] for r in payload["results"] if r["status"] == "ok")
    assert summary.policy_best_runtime_s == best and summary.measurements == 3


def _fail_after_two_policies(monkeypatch, error: BaseException) -> None:
    """policies.table.place runs each policy (its measurements reach the run log), then raises ``error`` after
    the second; the table's own single-gpu placement, after them, raises it too."""
    import policies.table

    real_place, placed = policies.table.place, []

    def place(name, *args, **kwargs):
        if len(placed) >= 2 and name == "single-gpu":  # the table's own single-gpu reference
            raise error
        result = real_place(name, *args, **kwargs)
        placed.append(name)
        if len(placed) == 2:
            raise error
        return result

    monkeypatch.setattr(policies.table, "place", place)


BASELINES_ARGS = ["baselines", "--graph", "synthetic:60:1", "--machine", "paper-2gpu", "--budget", "6"]


def test_baselines_out__a_policy_that_crashes_leaves_no_run_folder(tmp_path, monkeypatch):
    """It left runs/<id>/ with a manifest and measurement parts but no baselines.json."""
    _fail_after_two_policies(monkeypatch, RuntimeError("policy crashed"))
    out = tmp_path / "runs" / "baselines"
    with pytest.raises(RuntimeError, match="policy crashed"):
        main([*BASELINES_ARGS, "--policies", "heft,random,m-etf", "--out", str(out)])
    assert list(tmp_path.iterdir()) == []  # nor the folders --out named, which this command made


def test_baselines_out__a_placer_error_mid_way_is_one_line_and_keeps_what_was_there(tmp_path, monkeypatch, capsys):
    from conftest import one_placer_error

    (tmp_path / "earlier-run").mkdir()
    (tmp_path / "earlier-run" / "notes.txt").write_text("kept")
    _fail_after_two_policies(monkeypatch, PlacerError("the single GPU placement failed"))
    code = main([*BASELINES_ARGS, "--policies", "heft,random", "--out", str(tmp_path)])
    assert code == 2 and "the single GPU placement failed" in one_placer_error(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["earlier-run"]
    assert (tmp_path / "earlier-run" / "notes.txt").read_text() == "kept"


def test_baselines_out__an_interrupted_run_leaves_no_run_folder_and_the_next_one_writes_all(tmp_path, monkeypatch,
                                                                                              capsys):
    _fail_after_two_policies(monkeypatch, KeyboardInterrupt())
    args = [*BASELINES_ARGS, "--policies", "heft,random,m-etf", "--out", str(tmp_path)]
    assert main(args) == 130 and "placer: interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert main(args) == 0
    (folder,) = tmp_path.iterdir()
    assert f"run log: {folder}" in capsys.readouterr().out
    assert {p.name for p in folder.iterdir()} >= {"manifest.json", "measurements", "baselines.json"}
    rows = pd.read_parquet(folder / "measurements")
    assert sorted(rows["policy"].value_counts().items()) == [("heft", 1), ("m-etf", 1), ("random", 6),
                                                             ("single-gpu", 1)]  # the "x single GPU" column's


# `placer baselines --out` in a child process that stops inside its second policy, run folder half-written.
KILLED_BASELINES = """
import sys, time
import policies.table
from cluster.cli import main
real_place, placed = policies.table.place, []
def place(name, *args, **kwargs):
    placed.append(name)
    if len(placed) == 2:
        print("running", flush=True)
        time.sleep(600)
    return real_place(name, *args, **kwargs)
policies.table.place = place
main(sys.argv[1:])
"""


@pytest.mark.skipif(os.name != "posix", reason="the killed run's pid is checked through POSIX signals")
def test_baselines_out__the_next_run_removes_what_a_sigkilled_run_left(tmp_path, capsys):
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(repo), os.environ.get("PYTHONPATH"))))}
    args = [*BASELINES_ARGS, "--policies", "heft,random", "--out", str(tmp_path)]
    child = subprocess.Popen([sys.executable, "-c", KILLED_BASELINES, *args], stdout=subprocess.PIPE, text=True,
                             env=env)
    assert child.stdout.readline() == "running\n"
    child.kill()
    child.wait()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".") and (left / left.name.split(".")[1] / "manifest.json").is_file()

    assert main(args) == 0

    (folder,) = tmp_path.iterdir()
    assert f"run log: {folder}" in capsys.readouterr().out and (folder / "baselines.json").is_file()


def test_baselines__zero_bound_time_limit_gives_the_closed_form(capsys):
    code, payload, _ = run_json(capsys, "--policies", "single-gpu", "--bound-time-limit", "0")
    assert code == 0 and payload["proven_bound_s"] == payload["lower_bound_s"]
    assert payload["proven_bound_holds_for"] == "every placement" and payload["proven_bound"]["mip_status"] == "skipped"


def test_baselines__unknown_policy_and_bad_budget_are_clear_errors(capsys, tmp_path):
    code, _, err = run_json(capsys, "--policies", "single-gpu,telepathy")
    assert code == 2 and "unknown policy 'telepathy'" in err
    code, _, err = run_json(capsys, "--policies", "single-gpu,device:9", "--out", str(tmp_path / "log"))
    assert code == 2 and "--policies: device:9 names no device of machine" in err
    assert list(tmp_path.iterdir()) == []  # no log folder
    code, _, err = run_json(capsys, "--ray-address", "127.0.0.1:1")  # the simulator needs no Ray, but a bad
    assert code == 2 and "cannot reach the Ray cluster at '127.0.0.1:1'" in err  # address is still a mistake
    code, _, err = run_json(capsys, "--budget", "0")
    assert code == 2 and "--budget" in err
    code, _, err = run_json(capsys, "--bound-time-limit", "-2")
    assert code == 2 and "--bound-time-limit" in err
    code, _, err = run_json(capsys, "--policies", "single-gpu,single-gpu")
    assert code == 2 and "--policies: single-gpu given more than once" in err
    code, _, err = run_json(capsys, "--policies", "single-gpu,,m-etf")
    assert code == 2 and "--policies 'single-gpu,,m-etf': an empty name" in err
    code, _, err = run_json(capsys, "--grouping", "by-colour")
    assert code == 2 and "unknown grouping method 'by-colour'" in err
    code, _, err = run_json(capsys, "--policies", "exact", "--groups", "1500", "--out", str(tmp_path / "log"))
    assert code == 2 and "--groups 1500: policy 'exact' places at most 1000 groups" in err  # as search: skipped
    assert list(tmp_path.iterdir()) == []
    code = main(["baselines", "--graph", "synthetic:20", "--machine", "no-such-machine"])
    assert code == 2 and "unknown machine 'no-such-machine'" in capsys.readouterr().err


def test_baselines__torch_measurer_runs_through_the_pool(tmp_path, capsys, monkeypatch):
    """Real PyTorch step times through the Ray pool on the node's own devices (the CPU here)."""
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    graph_file = tmp_path / "mlp.parquet"
    assert main(["graphs", "import", "--torch", "tests/fixtures/tiny_models.py:tiny_torch_mlp",
                 "-o", str(graph_file)]) == 0
    capsys.readouterr()
    code = main(["baselines", "--graph", str(graph_file), "--machine", "local", "--measurer", "torch",
                 "--policies", "cpu-only,m-etf", "--runs", "3", "--warmup", "1", "--json", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in report["results"]}
    assert rows["cpu-only"]["status"] == "ok" and rows["cpu-only"]["runtime_s"] > 0
    assert rows["m-etf"]["measurements"] == 1
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]  # the log: the pool's own results, not made up
    logged = pd.read_parquet(folder / "measurements").sort_values("seq")
    assert list(logged.policy) == ["cpu-only", "m-etf"]  # on the CPU alone, the same placement:
    assert list(logged.cache_hit) == [False, True] and logged.actor_id.iloc[0] != ""  # m-etf's a hit, flagged
    assert logged.measure_s.iloc[1] == logged.measure_s.iloc[0]  # (the hit repeats the measurement)
    # the simulator's bound, not one of measured steps (a measurement came out 14% below it)
    assert report["proven_bound_holds_for"].endswith(", in the simulator (not a torch measurement)")
    assert not ray.is_initialized()  # the command shut its Ray down


def test_baselines__an_exact_rows_own_bound_for_every_placement_of_its_groups_raises_the_proven_bound(tmp_path,
                                                                                                      capsys):
    """As in a search: HiGHS's dual bound holds for every placement of the searched groups, the bound's own;
    with --bound-time-limit 0 baselines.json and the manifest kept the closed form (synthetic:40: 0.0028094 s
    beside exact's 0.0039757 s), and every ratio_to_proven_bound was over it."""
    from cluster.analysis import proven_bound_of
    from cluster.commands.baselines import print_table
    from cluster.jobs import run_baselines
    from cluster.jobs.config import BASELINES_FILE, BaselinesConfig
    from cluster.runlog import read_manifest

    outcome = run_baselines(BaselinesConfig("synthetic:40", "paper-2gpu", policies=("exact", "m-etf"), budget=5,
                                            groups=8, seed=3, bound_time_limit_s=0, out=str(tmp_path)))
    exact = outcome.table.rows[0].result
    assert exact.solver_bound_every_placement and exact.solver_bound_s > outcome.table.lower_bound_s
    proven = (exact.solver_bound_s, f"placements of the {outcome.groups} metis groups of synthetic:40:0")
    payload = json.loads((outcome.run_dir / BASELINES_FILE).read_text())
    assert (payload["proven_bound_s"], payload["proven_bound_holds_for"]) == proven
    assert payload["proven_bound"]["best_s"] == payload["lower_bound_s"]  # `placer bound`'s own report, as it was
    assert payload["proven_bound"]["holds_for"] == "every placement"
    for row in payload["results"]:
        assert row["status"] == "ok" and row["ratio_to_proven_bound"] == row["runtime_s"] / exact.solver_bound_s
    assert proven_bound_of(outcome.run_dir, read_manifest(outcome.run_dir)) == proven  # what analyze reads
    assert outcome.proven_bound == proven and json.loads(json.dumps(outcome.to_json())) == payload
    print_table(outcome.table, outcome.proven_bound)
    assert f"proven bound {proven[0]:.4g} s for {proven[1]}" in capsys.readouterr().out
