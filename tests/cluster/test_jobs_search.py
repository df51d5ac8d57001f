"""The search job end to end on a local Ray: run folder, determinism, resume, Ctrl-C, bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from cluster.runlog import read_best, read_manifest, read_metrics, read_run  # noqa: E402
from cluster.jobs import SearchConfig, run_search  # noqa: E402

pytestmark = pytest.mark.slow
GRAPH = "synthetic:300:1"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module: run_search leaves a Ray it did not start running."""
    from cluster import ray_setup

    ray_setup.init_ray(num_cpus=2)
    yield
    ray_setup.shutdown_ray()


def _config(tmp_path, **overrides) -> SearchConfig:
    settings = dict(graph=GRAPH, machine="paper-2gpu", budget=12, batch=4, groups=8, hidden_size=16, workers=1,
                    seed=3, out=str(tmp_path / "runs"))
    settings.update(overrides)
    return SearchConfig(**settings)


def test_search__run_folder_holds_every_measurement_and_the_result(local_ray, tmp_path):
    result = run_search(_config(tmp_path))
    rows = read_run(result.run_dir)
    learner_rows = rows[rows.policy == "reinforce"]
    assert len(learner_rows) == 12 == result.measurements
    assert set(rows.policy) >= {"reinforce", "single-gpu", "m-etf"}
    assert math.isclose(result.policy_best_runtime_s, learner_rows[learner_rows.status == "ok"].runtime_s.min())
    assert result.best_runtime_s <= result.policy_best_runtime_s
    assert result.best_runtime_s >= result.lower_bound_s
    assert read_manifest(result.run_dir).lower_bound_s == pytest.approx(result.lower_bound_s)
    assert read_best(result.run_dir).runtime_s == pytest.approx(result.best_runtime_s)
    finished = json.loads((result.run_dir / "result.json").read_text())
    assert finished["policy_best_runtime_s"] == result.policy_best_runtime_s
    assert len(read_metrics(result.run_dir)) > 0
    assert all(len(p) == 8 for p in learner_rows.placement)  # group placements, 8 groups
    data = result.to_json()
    assert set(data) >= {"run_dir", "best_runtime_s", "policy_best_runtime_s", "measurements", "lower_bound_s",
                         "baselines"}
    assert data["baselines"]["expert"] is None  # no expert rule for a synthetic graph
    json.dumps(data)


def _cli_search(out) -> dict:
    """`placer search` as a user runs it: a process of its own (its own local Ray), JSON result."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RLLIB_TEST_NO_TF_IMPORT": "1"}
    command = [sys.executable, "-m", "cluster.cli", "search", "--graph", GRAPH, "--machine", "paper-2gpu",
               "--budget", "12", "--batch", "4", "--groups", "8", "--workers", "1", "--seed", "3",
               "--out", str(out), "--json"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_search__same_seed_same_best_placement(tmp_path):
    """Two runs with the same seed, graph, machine and budget (noiseless simulator) measure the same
    placements, batch by batch, and report the same best placement."""
    first, second = _cli_search(tmp_path / "a"), _cli_search(tmp_path / "b")

    def learner_rows(result):  # (iteration, placement, status, runtime_s), arrival order within a batch aside
        rows = read_run(result["run_dir"]).query("policy == 'reinforce'")
        return sorted((int(r.iteration), tuple(int(d) for d in r.placement), r.status, r.runtime_s)
                      for r in rows.itertuples())

    first_rows, second_rows = learner_rows(first), learner_rows(second)
    assert len(first_rows) == 12
    diverged = next((pair for pair in zip(first_rows, second_rows) if pair[0] != pair[1]), None)
    assert diverged is None, f"same seed, different runs; first difference: {diverged}"
    assert first["policy_best_runtime_s"] == second["policy_best_runtime_s"]
    assert read_best(first["run_dir"]).placement == read_best(second["run_dir"]).placement


def test_search__resume_continues_without_measuring_again(local_ray, tmp_path):
    first = run_search(_config(tmp_path, budget=8))
    resumed = run_search(_config(tmp_path, budget=16, resume=str(first.run_dir)))
    assert resumed.run_dir == first.run_dir and resumed.measurements == 16
    rows = read_run(first.run_dir)
    learner = rows[(rows.policy == "reinforce") & ~rows.cache_hit]
    placements = [tuple(p) for p in learner.placement]
    assert len(placements) == len(set(placements))  # nothing measured twice
    straight = run_search(_config(tmp_path / "straight", budget=16))
    assert resumed.policy_best_runtime_s == straight.policy_best_runtime_s


def test_search__any_baseline_policy_runs_through_the_pool(local_ray, tmp_path):
    result = run_search(_config(tmp_path, policy="random", budget=10))
    rows = read_run(result.run_dir)
    assert (rows.policy == "random").sum() == 10 and result.measurements == 10


def test_search__ctrl_c_leaves_a_readable_log_with_the_best_placement(local_ray, tmp_path):
    calls = []

    def progress(measured, best_runtime_s, lower_bound_s):
        assert lower_bound_s > 0 and (math.isinf(best_runtime_s) or best_runtime_s >= lower_bound_s)
        calls.append(measured)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_search(_config(tmp_path, budget=40), progress=progress)
    (run_dir,) = list((tmp_path / "runs").iterdir())
    rows = read_run(run_dir)
    assert (rows.policy == "reinforce").sum() == 8  # two batches of 4 finished and were flushed
    assert read_best(run_dir) is not None


def test_search_cli__bad_input_exits_non_zero_and_writes_nothing(tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "runs"
    assert main(["search", "--graph", "no-such-graph", "--out", str(out)]) == 2
    assert "unknown graph 'no-such-graph'" in capsys.readouterr().err
    assert main(["search", "--graph", GRAPH, "--budget", "0", "--out", str(out)]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["search", "--graph", GRAPH, "--policy", "telepathy", "--out", str(out)]) == 2
    assert "unknown policy 'telepathy'" in capsys.readouterr().err
    assert main(["search", "--graph", GRAPH, "--grouping", "by-colour", "--out", str(out)]) == 2
    assert "--grouping: unknown grouping method" in capsys.readouterr().err
    assert not out.exists()


def test_search_cli__json_output(local_ray, tmp_path, capsys):
    from cluster.cli import main

    code = main(["search", "--graph", GRAPH, "--budget", "8", "--batch", "4", "--groups", "8", "--workers", "1",
                 "--out", str(tmp_path), "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["measurements"] == 8 and data["lower_bound_s"] > 0
    assert set(data["baselines"]) == {"single-gpu", "expert", "m-etf"}
    assert np.isfinite(data["best_runtime_s"])
