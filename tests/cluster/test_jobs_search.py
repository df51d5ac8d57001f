"""The search job end to end on a local Ray: run folder, determinism, resume, Ctrl-C, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from cluster.analysis import summarize  # noqa: E402
from cluster.runlog import MEASUREMENTS_DIR, read_best, read_manifest, read_metrics, read_run  # noqa: E402
from graphs.errors import PlacerError  # noqa: E402
from conftest import placer_stderr  # noqa: E402
from cluster.jobs import CHECKPOINT_DIR, SearchConfig, run_search  # noqa: E402

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
    from policies.registry import policy_entry

    settings = dict(graph=GRAPH, machine="paper-2gpu", budget=12, batch=4, groups=8, hidden_size=16, workers=1,
                    seed=3, out=str(tmp_path / "runs"))
    settings.update(overrides)
    if "batch" not in overrides and not policy_entry(settings.get("policy", SearchConfig.policy)).learned:
        settings["batch"] = None  # the learners' alone
    return SearchConfig(**settings)


def test_search__run_folder_holds_every_measurement_and_the_result(local_ray, tmp_path):
    result = run_search(_config(tmp_path))
    rows = read_run(result.run_dir)
    learner_rows = rows[rows.policy == "reinforce"]
    assert len(learner_rows) == 12 == result.measurements
    assert summarize([result.run_dir])[0].policy_measurements == 12  # `placer analyze` counts as search does
    assert set(rows.policy) >= {"reinforce", "single-gpu", "m-etf"}
    baselines = rows[rows.policy.isin(["single-gpu", "m-etf"])]  # each its own batches, from 0 (m-etf had 1)
    assert len(baselines) == 2 and (baselines.iteration == 0).all()
    assert math.isclose(result.policy_best_runtime_s, learner_rows[learner_rows.status == "ok"].runtime_s.min())
    assert result.overall_best_runtime_s <= result.policy_best_runtime_s
    assert result.overall_best_runtime_s >= result.lower_bound_s
    assert read_manifest(result.run_dir).lower_bound_s == pytest.approx(result.lower_bound_s)
    assert result.proven_bound_s >= result.lower_bound_s and result.proven_bound_holds_for
    assert read_manifest(result.run_dir).proven_bound_s == result.proven_bound_s
    if result.proven_bound_holds_for != "every placement":  # the learner places the bound's own groups
        assert result.proven_bound_holds_for == "placements of the 8 metis groups of " + result.graph
        assert result.policy_best_runtime_s >= result.proven_bound_s * (1 - 1e-6)
    assert read_best(result.run_dir).runtime_s == pytest.approx(result.overall_best_runtime_s)
    finished = json.loads((result.run_dir / "result.json").read_text())
    assert finished["policy_best_runtime_s"] == result.policy_best_runtime_s
    assert len(read_metrics(result.run_dir)) > 0
    assert all(len(p) == 8 for p in learner_rows.placement)  # group placements, 8 groups
    data = result.to_json()
    assert set(data) >= {"run_dir", "overall_best_runtime_s", "policy_best_runtime_s", "measurements", "lower_bound_s",
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
    assert len(first_rows) == len(second_rows) == 12
    diverged = next((pair for pair in zip(first_rows, second_rows) if pair[0] != pair[1]), None)
    assert diverged is None, f"same seed, different runs; first difference: {diverged}"
    assert first["policy_best_runtime_s"] == second["policy_best_runtime_s"]
    assert read_best(first["run_dir"]).placement == read_best(second["run_dir"]).placement


def test_search__a_search_resumed_with_a_larger_budget_is_refused(local_ray, tmp_path):
    """Annealing is run again from its start on resume; at another budget its schedule proposes other
    placements, and the log held 133 rows of a 96-measurement run."""
    from cluster.jobs import resume_config

    first = run_search(_config(tmp_path, policy="annealing", budget=16))
    with pytest.raises(PlacerError, match="--budget 32: a resume runs annealing \\(not a learner\\) again from its "
                                          "start"):
        resume_config(first.run_dir, {"budget": 32})
    with pytest.raises(PlacerError, match="finished \\(stopped by budget at --budget 16\\): start a new run"):
        resume_config(first.run_dir, {})  # not "pass a larger --budget"
    with pytest.raises(PlacerError, match="finished"):  # not "--runs 1: run ... searches without --runs"
        resume_config(first.run_dir, {"runs": 1, "warmup": 0})  # the simulator's defaults, which the run used
    with pytest.raises(PlacerError, match="--runs 2: run .* searches without --runs"):
        resume_config(first.run_dir, {"runs": 2})
    manifest = json.loads((first.run_dir / "manifest.json").read_text())
    manifest["config"]["batch"] = 4  # as an older placer recorded it for annealing, unused (--batch is refused now)
    (first.run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PlacerError, match="finished"):  # not "--batch None: run ... searches with 4"
        resume_config(first.run_dir, {"batch": None})  # what `placer reproduce` gives a search


def test_search__a_search_stops_at_its_time_limit_as_a_learner_does(local_ray, tmp_path):
    """--time-limit reached only the learners and exact's solver: annealing at --budget 3000 --time-limit 2
    ran 11 s and said "converged"."""
    result = run_search(_config(tmp_path, policy="annealing", budget=3000, time_limit_s=1e-6, bound_time_limit_s=0))
    assert result.stop_reason == "time_limit" and result.measurements < 3000


@pytest.mark.parametrize("policy", ["random", "reinforce"])
def test_search__the_time_limit_counts_from_the_sessions_start(local_ray, tmp_path, monkeypatch, policy):
    """`placer search --time-limit 45` ended at 63 s: the policy's clock started after Ray, the pool's actors
    and the baselines. Here the baselines "take" the whole limit (a fake clock moved on by 100 s): the policy
    gets none of it and stops at its first batch boundary, before measuring anything."""
    import cluster.jobs.search as search_job

    offset_s = [0.0]
    real_clock, real_baselines = search_job._clock, search_job._score_baselines
    monkeypatch.setattr(search_job, "_clock", lambda: real_clock() + offset_s[0])

    def slow_baselines(*args, **kwargs):
        outcome = real_baselines(*args, **kwargs)
        offset_s[0] += 100.0
        return outcome

    monkeypatch.setattr(search_job, "_score_baselines", slow_baselines)
    result = run_search(_config(tmp_path, policy=policy, budget=40, time_limit_s=100.0, bound_time_limit_s=0))
    assert result.stop_reason == "time_limit" and result.measurements == 0
    assert result.wall_s >= 100.0  # the session's clock, the same the limit is counted on
    assert not (read_run(result.run_dir).policy == policy).any()
    # said in the policy's notes (printed under the table, policy_notes in --json): "0 distinct placements" was all
    assert "--time-limit 100 s was spent before the policy began (loading the graph, Ray, the baselines)" in \
        result.policy_notes


def test_search__a_resume_whose_time_limit_ends_inside_the_replay_still_reports_the_whole_log(local_ray, tmp_path,
                                                                                             monkeypatch):
    """A killed annealing run resumed with a limit that the start-up had spent: annealing stopped inside the
    replay of its own log, and result.json (the run marked finished) gave 0 measurements and the expert as
    the best, where the log, best_placement.json and `placer analyze` had annealing's 1,500. The limit now
    stops a resumed policy only once its replay is over."""
    import cluster.jobs.search as search_job
    from cluster.runlog import RESULT_FILE

    first = run_search(_config(tmp_path, policy="annealing", budget=40, bound_time_limit_s=0))
    (first.run_dir / RESULT_FILE).unlink()  # as a run killed after its last row, before its result
    rows = read_run(first.run_dir)
    offset_s = [0.0]
    real_clock, real_baselines = search_job._clock, search_job._score_baselines
    monkeypatch.setattr(search_job, "_clock", lambda: real_clock() + offset_s[0])

    def slow_baselines(*args, **kwargs):
        outcome = real_baselines(*args, **kwargs)
        offset_s[0] += 100.0  # the limit is spent before the policy starts
        return outcome

    monkeypatch.setattr(search_job, "_score_baselines", slow_baselines)
    resumed = run_search(_config(tmp_path, policy="annealing", budget=40, bound_time_limit_s=0, time_limit_s=50.0,
                                 resume=str(first.run_dir)))
    assert resumed.stop_reason == "budget"  # as the run never stopped ended: its log held the whole budget
    assert resumed.measurements == first.measurements == 40
    assert resumed.policy_best_runtime_s == first.policy_best_runtime_s
    assert resumed.overall_best_source == first.overall_best_source
    assert read_run(first.run_dir).equals(rows)  # nothing measured or logged again

    with pytest.raises(KeyboardInterrupt):  # stopped half way: the resume's limit ends it past its replay
        run_search(_config(tmp_path / "half", policy="annealing", budget=40, bound_time_limit_s=0),
                   progress=_interrupt_at(20))
    (run_dir,) = list((tmp_path / "half" / "runs").iterdir())
    logged = int((read_run(run_dir).policy == "annealing").sum())
    half = run_search(_config(tmp_path / "half", policy="annealing", budget=40, bound_time_limit_s=0,
                              time_limit_s=50.0, resume=str(run_dir)))
    assert half.stop_reason == "time_limit" and logged <= half.measurements < 40


def test_search__a_heuristic_policy_that_is_also_a_baseline_logs_its_placement_once(local_ray, tmp_path):
    """`--policy m-etf` scored m-etf as a quick baseline, then placed it again: two rows under m-etf, and
    `placer analyze` counted 2 of the policy's measurements where the search counted 1. A resume of the
    stopped run logs nothing more."""
    from cluster.runlog import RESULT_FILE

    result = run_search(_config(tmp_path, policy="m-etf", budget=1))
    assert "m-etf" in {b.policy for b in result.baselines} and result.measurements == 1
    rows = read_run(result.run_dir)
    assert len(rows[rows.policy == "m-etf"]) == 1
    assert summarize([result.run_dir])[0].policy_measurements == 1
    (result.run_dir / RESULT_FILE).unlink()  # as a run stopped before its end
    resumed = run_search(_config(tmp_path, policy="m-etf", budget=1, resume=str(result.run_dir)))
    assert resumed.policy_best_runtime_s == result.policy_best_runtime_s
    assert read_run(result.run_dir).equals(rows)


@pytest.mark.parametrize("policy", ["reinforce", "hierarchical"])
def test_search__a_resumed_warm_started_learner_keeps_its_warm_starts_figure(local_ray, tmp_path, policy):
    """The resumed session reported warm_start_on_groups_s as nan (null in result.json): the learner knew its
    start only in the session that measured it."""
    first = run_search(_config(tmp_path, policy=policy, budget=8, batch=4, warm_start="auto"))
    assert math.isfinite(first.warm_start_on_groups_s)
    resumed = run_search(_config(tmp_path, policy=policy, budget=12, batch=4, warm_start="auto",
                                 resume=str(first.run_dir)))
    assert resumed.measurements == 12
    assert resumed.warm_start_on_groups_s == first.warm_start_on_groups_s
    assert json.loads((first.run_dir / "result.json").read_text())["warm_start_on_groups_s"] == \
        first.warm_start_on_groups_s


def test_search__resume_continues_without_measuring_again(local_ray, tmp_path):
    starts = []  # what each session's policy starts from: the bar's rate is this session's, after it
    first = run_search(_config(tmp_path, budget=8), on_policy_start=starts.append)
    shown = []  # the progress bar's best: the run's, not only this session's (it started at infinity)
    resumed = run_search(_config(tmp_path, budget=16, resume=str(first.run_dir)),
                         progress=lambda measured, best_s, bound_s: shown.append(best_s), on_policy_start=starts.append)
    assert resumed.run_dir == first.run_dir and resumed.measurements == 16 and starts == [0, 8]
    assert summarize([first.run_dir])[0].policy_measurements == 16  # both sessions', as search counts them
    assert shown and max(shown) <= first.policy_best_runtime_s
    rows = read_run(first.run_dir)
    learner = rows[(rows.policy == "reinforce") & ~rows.cache_hit]
    placements = [tuple(p) for p in learner.placement]
    assert len(placements) == len(set(placements))  # nothing measured twice
    straight = run_search(_config(tmp_path / "straight", budget=16))
    assert resumed.policy_best_runtime_s == straight.policy_best_runtime_s


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_search__ctrl_c_while_the_run_closes_keeps_every_row_and_stops_it_for_resume(local_ray, tmp_path,
                                                                                       monkeypatch, signum):
    """People press Ctrl-C again while a search closes: the KeyboardInterrupt landed in the pool's closing,
    before the run log's flush, and the rows still buffered were lost. It is held until the closing is done,
    and a run that had ended is then stopped, resumable, as an interrupted one. SIGTERM (`ray job stop`) too:
    it was not held, and a short search lost every row."""
    from cluster.jobs import SearchInterrupted
    from cluster.pool import MeasurerPool

    close = MeasurerPool.close

    def ctrl_c_then_close(pool):
        signal.raise_signal(signum)
        close(pool)

    monkeypatch.setattr(MeasurerPool, "close", ctrl_c_then_close)
    with pytest.raises(SearchInterrupted) as stopped:
        run_search(_config(tmp_path, budget=8))
    rows = read_run(stopped.value.run_dir)
    assert len(rows[rows.policy == "reinforce"]) == 8  # each measurement paid for is in the log
    monkeypatch.setattr(MeasurerPool, "close", close)
    resumed = run_search(_config(tmp_path, budget=8, resume=str(stopped.value.run_dir)))
    assert resumed.measurements == 8 and resumed.run_dir == stopped.value.run_dir


def test_search__sigterm_while_it_waits_for_its_bound_stops_it_as_ctrl_c(local_ray, tmp_path, monkeypatch):
    """After Ray is shut down a search waits for its proven bound; SIGTERM there got whatever handler the
    process had (a command line's: Ray's ``sys.exit``, status 15, no result)."""
    from cluster.jobs import SearchInterrupted
    from cluster.jobs import search as search_job

    solved = search_job._solved_bound

    def sigterm_then_wait(*args):
        signal.raise_signal(signal.SIGTERM)
        return solved(*args)

    def elsewhere(signum, frame):
        pass

    monkeypatch.setattr(search_job, "_solved_bound", sigterm_then_wait)
    before = signal.signal(signal.SIGTERM, elsewhere)
    try:
        with pytest.raises(SearchInterrupted):
            run_search(_config(tmp_path, budget=8))
        assert signal.getsignal(signal.SIGTERM) is elsewhere
    finally:
        signal.signal(signal.SIGTERM, before)


def test_search__a_resumed_hsdag_run_makes_its_policy_once(local_ray, tmp_path, monkeypatch):
    """The search checked hsdag's settings (learner.pt to resume included) by making a policy it threw away,
    then made the one that ran, which read and checked learner.pt again."""
    from policies.rl.gnn.hsdag.policy import HsdagPolicy

    first = run_search(_config(tmp_path, policy="hsdag", batch=None, budget=8, bound_time_limit_s=0))
    made = []
    original = HsdagPolicy.__init__

    def counting_init(self, *args, **kwargs):
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(HsdagPolicy, "__init__", counting_init)
    resumed = run_search(_config(tmp_path, policy="hsdag", batch=None, budget=16, bound_time_limit_s=0,
                                 resume=str(first.run_dir)))
    assert len(made) == 1
    assert resumed.run_dir == first.run_dir and resumed.measurements > first.measurements


def _count_checks(monkeypatch) -> list[str]:
    """The policy of each check_search_config call, wherever it is called from."""
    import cluster.jobs
    import cluster.jobs.search

    checks, original = [], cluster.jobs.search.check_search_config

    def counted(config):
        checks.append(config.policy)
        return original(config)

    monkeypatch.setattr(cluster.jobs, "check_search_config", counted)  # placer search's
    monkeypatch.setattr(cluster.jobs.search, "check_search_config", counted)  # run_search's
    return checks


def test_search_cli__checks_the_settings_once_per_search_new_or_resumed(local_ray, tmp_path, capsys, monkeypatch):
    """placer search checks them before its progress bar and hands run_search the answer (which checked them
    again, reading a resumed run's manifest and learner.pt once more)."""
    from cluster.cli import main

    checks = _count_checks(monkeypatch)
    assert main(["search", "--graph", GRAPH, "--policy", "hsdag", "--budget", "4", "--workers", "1",
                 "--bound-time-limit", "0", "--out", str(tmp_path / "runs"), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert checks == ["hsdag"] and first["measurements"] == 4
    assert main(["search", "--resume", first["run_dir"], "--budget", "8", "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert checks == ["hsdag", "hsdag"] and resumed["measurements"] == 8 and resumed["run_dir"] == first["run_dir"]
    assert main(["search", "--resume", first["run_dir"], "--budget", "8", "--groups", "6"]) == 2
    err = placer_stderr(capsys.readouterr().err)
    assert err.startswith("placer: error: --groups 6: run") and err.count("\n") == 1


def test_run_search__checks_settings_given_without_the_cli_once_and_refuses_bad_ones_before_anything(
        local_ray, tmp_path, monkeypatch):
    """As `placer reproduce` and a script call it: a SearchConfig, checked by run_search itself."""
    checks = _count_checks(monkeypatch)
    run_search(_config(tmp_path / "good", policy="random", budget=2, bound_time_limit_s=0))
    assert checks == ["random"]
    for overrides, message in (({"budget": 0}, "--budget must be a whole number of at least 1"),
                               ({"policy": "hsdag", "init": "other"}, "--init: hsdag starts from scratch")):
        with pytest.raises(PlacerError, match=message):
            run_search(_config(tmp_path / "bad", **overrides))
    assert not (tmp_path / "bad").exists()


def test_search__a_log_that_counted_the_baselines_together_resumes_without_logging_them_again(local_ray,
                                                                                              tmp_path):
    """Logs written before 3 December put the second quick baseline at iteration 1 (one count for all of
    them): a resume finds its row there instead of logging it again as a cache hit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = run_search(_config(tmp_path, budget=8))
    (part,) = sorted((first.run_dir / MEASUREMENTS_DIR).glob("part-*.parquet"))
    table = pq.read_table(part)
    names = [name for name in dict.fromkeys(table.column("policy").to_pylist()) if name != "reinforce"]
    assert len(names) == 2
    iterations = [1 if name == names[1] else it for name, it in
                  zip(table.column("policy").to_pylist(), table.column("iteration").to_pylist())]
    column = table.schema.get_field_index("iteration")
    pq.write_table(table.set_column(column, table.schema.field(column), pa.array(iterations,
                                                                                 table.schema.field(column).type)),
                   part)
    run_search(_config(tmp_path, budget=16, resume=str(first.run_dir)))
    rows = read_run(first.run_dir)
    assert [int((rows.policy == name).sum()) for name in names] == [1, 1]


def test_search_cli__groups_given_to_hierarchical_is_its_grouper_size(local_ray, tmp_path, capsys):
    """`--groups G` with the hierarchical planner sets the groups its grouper makes (the manifest keeps it, so
    a resume does too); without it the planner makes the paper's 256 (capped at the graph's atoms).
    `--grouping` is the method of the groups its grouper starts from (default scope).
    planner_groups belongs to hierarchical alone."""
    import torch

    from cluster.cli import main

    def grouper(run_dir) -> tuple[int, str]:
        saved = torch.load(Path(run_dir) / "checkpoint" / "learner.pt", weights_only=False)
        return saved["shape"][1], saved["config"]["prior"]  # shape: (atoms, groups, devices)

    assert main(["search", "--graph", GRAPH, "--policy", "hierarchical", "--groups", "6", "--grouping", "metis",
                 "--budget", "4", "--batch", "2", "--workers", "1", "--bound-time-limit", "0",
                 "--out", str(tmp_path / "six"), "--json"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    assert grouper(run_dir) == (6, "metis") and read_manifest(run_dir).config["planner_groups"] == 6
    default = run_search(_config(tmp_path / "default", policy="hierarchical", budget=4, batch=2))
    assert grouper(default.run_dir) == (256, "scope")
    assert read_manifest(default.run_dir).config["planner_groups"] is None
    with pytest.raises(PlacerError, match="planner_groups: only for the hierarchical planner"):
        run_search(_config(tmp_path / "reinforce", planner_groups=6))


def _interrupt_at(measured_to_stop: int):
    """A progress callback that presses Ctrl-C once the learner has measured ``measured_to_stop``."""
    def progress(measured, best_runtime_s, lower_bound_s):
        if measured >= measured_to_stop:
            raise KeyboardInterrupt

    return progress


def _assert_every_iteration_logged_once(run_dir, budget: int, batch: int) -> None:
    """The learner's rows are those of a run never stopped: ``budget`` rows, at most ``batch`` per iteration
    (a placement sampled again is not measured again), iterations numbered from 0 in order, and no placement
    measured twice."""
    rows = read_run(run_dir)
    learner = rows[rows.policy == "reinforce"]
    assert len(learner) == budget
    per_iteration = learner.groupby("iteration").size()
    assert per_iteration.index[0] == 0 and per_iteration.index.is_monotonic_increasing
    assert per_iteration.max() <= batch and learner.iteration.is_monotonic_increasing
    measured = [tuple(p) for p in learner.placement]
    assert len(measured) == len(set(measured))
    metrics = read_metrics(run_dir)  # the iterations a resume replays from its checkpoint: logged once too
    assert len(metrics) and not metrics.duplicated(["iteration", "name"]).any()


def test_search_cli__resume_keeps_the_runs_settings_unless_a_flag_is_given(local_ray, tmp_path, capsys):
    """A run with a budget below the default, stopped after 11 of its 12 batches (its checkpoint holds
    10), resumed with no flags: it ends at its own budget, not the command line's default, with each
    placement logged once. --budget raises it (recorded in the manifest); --graph, --seed and a lower
    --budget are refused with exit status 2 and change nothing."""
    from cluster.cli import main

    with pytest.raises(KeyboardInterrupt):
        run_search(_config(tmp_path, budget=48, batch=4), progress=_interrupt_at(44))
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert main(["search", "--resume", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measurements"] == 48
    _assert_every_iteration_logged_once(run_dir, budget=48, batch=4)

    assert main(["search", "--resume", str(run_dir), "--budget", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measurements"] == 64
    _assert_every_iteration_logged_once(run_dir, budget=64, batch=4)
    manifest = read_manifest(run_dir)
    assert manifest.config["budget"] == 64 and manifest.config["hidden_size"] == 16
    assert [r["changed"] for r in manifest.resumes] == [{}, {"budget": [48, 64]}]

    for flags, message in ((["--graph", "synthetic:300:2"], "--graph 'synthetic:300:2': run .* searches with "
                                                             "'synthetic:300:1'"),
                           (["--seed", "4"], "--seed 4: run .* searches with 3"),
                           (["--budget", "50"], "--budget 50: run .* has a budget of 64; .* only raise it"),
                           ([], r"run .* finished \(stopped by budget at --budget 64\): pass a larger --budget")):
        assert main(["search", "--resume", str(run_dir), *flags]) == 2
        err = placer_stderr(capsys.readouterr().err)
        assert err.startswith("placer: error: ") and err.count("\n") == 1
        assert __import__("re").search(message, err), err
    assert read_manifest(run_dir) == manifest and len(read_run(run_dir)) == 64 + 2  # and two baselines

    best, garbage = run_dir / "best_placement.json", run_dir / "metrics" / "part-999999.parquet"
    kept = best.read_text()
    for damage, damaged in ((lambda: best.write_text('{"oops": '), best),
                            (lambda: garbage.write_bytes(b"oops"), garbage)):
        damage()  # read only when the log is reopened: the manifest had been changed, result.json deleted
        assert main(["search", "--resume", str(run_dir), "--budget", "80"]) == 2
        err = placer_stderr(capsys.readouterr().err)
        assert err.startswith(f"placer: error: {damaged} is damaged") and err.count("\n") == 1
        assert read_manifest(run_dir) == manifest and (run_dir / "result.json").is_file()
        best.write_text(kept)
        garbage.unlink(missing_ok=True)
    # an empty grouping.npz was an EOFError traceback; a damaged groups.parquet resumed, and apply then failed
    for name, junk in (("grouping.npz", b""), ("groups.parquet", b"oops")):
        path = run_dir / name
        whole = path.read_bytes()
        path.write_bytes(junk)
        assert main(["search", "--resume", str(run_dir), "--budget", "80"]) == 2
        err = placer_stderr(capsys.readouterr().err)
        assert err.startswith(f"placer: error: {path} is damaged") and err.count("\n") == 1, err
        assert read_manifest(run_dir) == manifest and path.read_bytes() == junk
        path.write_bytes(whole)

    learner = run_dir / CHECKPOINT_DIR / "learner.pt"
    learner.write_bytes(learner.read_bytes()[:500])  # a damaged learner checkpoint: refused before any change
    assert main(["search", "--resume", str(run_dir), "--budget", "80"]) == 2
    err = placer_stderr(capsys.readouterr().err)
    assert err.startswith(f"placer: error: learner checkpoint {learner} is damaged") and err.count("\n") == 1
    assert read_manifest(run_dir) == manifest and (run_dir / "result.json").is_file()


def test_search_cli__killed_run_resumes_to_its_own_budget_each_placement_once(tmp_path):
    """`placer search --budget 640` killed (SIGKILL) after its first checkpoint, then `placer search
    --resume RUN_DIR`: 640 measurements, as asked, not the default 2,048, and the log a whole run's."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    # synthetic:1000 (not GRAPH): the learner does not converge on it before 640 measurements
    search = [sys.executable, "-m", "cluster.cli", "search", "--graph", "synthetic:1000:1", "--budget", "640",
              "--batch", "16",
              "--workers", "1", "--out", str(tmp_path)]
    driver = subprocess.Popen(search, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("*/checkpoint/learner.pt")) and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    (run_dir,) = list(tmp_path.iterdir())
    assert not (run_dir / "result.json").exists(), "the run finished before it could be killed"
    assert len(read_run(run_dir).query("policy == 'reinforce'")) < 640

    resume = [sys.executable, "-m", "cluster.cli", "search", "--resume", str(run_dir), "--json"]
    done = subprocess.run(resume, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["measurements"] == 640
    _assert_every_iteration_logged_once(run_dir, budget=640, batch=16)


def test_search__with_noise_the_bound_is_said_to_hold_for_the_noise_free_simulator(local_ray, tmp_path):
    """A step measured with noise can come out below the bound; nothing said so."""
    result = run_search(_config(tmp_path, policy="random", budget=4, noise_std=0.05))
    assert result.proven_bound_holds_for.endswith(
        ", in the noise-free simulator (a step measured with --noise 0.05 can come out below it)")
    assert run_search(_config(tmp_path, policy="random", budget=4)).proven_bound_holds_for.startswith("placements")


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


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_search__a_run_folder_is_made_whole_or_not_at_all(local_ray, tmp_path, monkeypatch, error):
    """Ctrl-C (or a full disk) after the manifest but before grouping.npz left a run folder that --resume
    refused as "not a search run", and that the interrupted search said it had not made (no run_dir)."""
    from cluster.runlog import RunLogWriter

    def write_groups(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(RunLogWriter, "write_groups", write_groups)
    started = []
    with pytest.raises(type(error)):
        run_search(_config(tmp_path, policy="random", budget=4), on_start=started.append)
    assert started == [] and list(tmp_path.iterdir()) == []  # nor the --out folder it made
    monkeypatch.undo()
    (tmp_path / "runs").mkdir()
    result = run_search(_config(tmp_path, policy="random", budget=4))
    assert list((tmp_path / "runs").iterdir()) == [result.run_dir]
    assert {"manifest.json", "groups.parquet", "grouping.npz", "result.json"} <= {p.name for p in
                                                                                  result.run_dir.iterdir()}


def _no_actor_starts(monkeypatch):
    """The pool finds no node to start an actor on (every GPU node held by another search): wait_ready's
    error, at once rather than after 120 s."""
    from cluster.pool import MeasurerPool

    monkeypatch.setattr(MeasurerPool, "_add_slots", lambda self: None)


def _ctrl_c_at_first_measurement(monkeypatch):
    from cluster.pool import MeasurerPool

    def submit(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(MeasurerPool, "submit", submit)


@pytest.mark.parametrize("fail, raised, match", [(_no_actor_starts, PlacerError, "no measurer actor started"),
                                                 (_ctrl_c_at_first_measurement, KeyboardInterrupt, None)])
def test_search__a_new_run_stopped_before_its_first_measurement_leaves_no_folder(local_ray, tmp_path, monkeypatch,
                                                                                 fail, raised, match):
    """A search whose pool never started an actor left a run folder with a manifest and nothing measured,
    which `placer analyze` listed as "running or stopped". A resumed run's folder stays, whatever happens."""
    settings = dict(policy="random", budget=40, bound_time_limit_s=0)
    with pytest.raises(KeyboardInterrupt):  # a stopped run, to resume below
        run_search(_config(tmp_path, **settings), progress=_interrupt_at(1))
    (stopped,) = list((tmp_path / "runs").iterdir())
    fail(monkeypatch)
    started = []
    with pytest.raises(raised, match=match) as caught:
        run_search(_config(tmp_path, **settings, seed=4), on_start=started.append)
    assert "within" not in str(caught.value)  # no slot to wait for: said at once, not as 120 s run out
    assert len(started) == 1 and not started[0].exists()  # it was opened, then removed
    assert list((tmp_path / "runs").iterdir()) == [stopped]
    if raised is KeyboardInterrupt:  # nothing to resume: the CLI prints no --resume command
        assert caught.value.run_dir is None and "no run folder was kept" in str(caught.value)
    with pytest.raises(raised, match=match):
        run_search(_config(tmp_path / "fresh", **settings))
    assert not (tmp_path / "fresh").exists()  # nor the --out folder it made
    with pytest.raises(raised, match=match):
        run_search(_config(tmp_path, **settings, resume=str(stopped)))
    assert list((tmp_path / "runs").iterdir()) == [stopped] and len(read_run(stopped)) > 0


def test_search_cli__every_measurer_node_lost_mid_search_stops_it_resumable_with_exit_1(local_ray, tmp_path,
                                                                                         monkeypatch, capsys):
    """The pool's "no measurer actors left" (every measurer node gone from the cluster) was bad input's exit 2,
    nothing on stdout under --json, and no word of the run folder it kept; a failure at run time stops the
    search as a lost Ray does: exit 1, one document naming the folder and the command that resumes it."""
    from cluster.cli import main
    from cluster.pool import MeasurerPool, MeasurersLost

    submit, submitted = MeasurerPool.submit, []

    def lost_after_three(self, *args, **kwargs):
        submitted.append(1)
        if len(submitted) > 3:
            raise MeasurersLost("no measurer actors left with 3 placements unmeasured (node 89b3 left the cluster)")
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(MeasurerPool, "submit", lost_after_three)
    flags = ["search", "--graph", GRAPH, "--policy", "random", "--budget", "40", "--groups", "8", "--workers", "1",
             "--bound-time-limit", "0", "--out", str(tmp_path / "runs"), "--json"]
    assert main(flags) == 1
    out = capsys.readouterr()
    document = json.loads(out.out)
    run_dir = document["run_dir"]
    assert document["stop_reason"] == "measurers_lost" and "node 89b3 left the cluster" in document["error"]
    assert document["resume"] == ["placer", "search", "--resume", run_dir]
    assert ("placer: error: no measurer actors left with 3 placements unmeasured (node "
                                        f"89b3 left the cluster); search stopped; the run log is complete up to now "
                                        f"in {run_dir}") in out.err.splitlines()
    measured = len(read_run(run_dir))
    assert measured > 0
    monkeypatch.setattr(MeasurerPool, "submit", submit)
    assert main(document["resume"][1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measurements"] == 40 and len(read_run(run_dir)) > measured


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
    assert data["proven_bound_s"] >= data["lower_bound_s"] and data["proven_bound_holds_for"]
    assert set(data["baselines"]) == {"single-gpu", "expert", "m-etf"}
    assert np.isfinite(data["overall_best_runtime_s"])


def test_search_cli__the_default_groups_are_named_as_the_default_in_the_note(local_ray, tmp_path, capsys):
    """With no --groups the note said "--groups 32 is more than ...", a flag the user never gave."""
    from cluster.cli import main

    flags = ["search", "--graph", "synthetic:20:1", "--policy", "random", "--budget", "2", "--workers", "1", "--json"]
    assert main([*flags, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr()
    colocation_groups = json.loads(out.out)["colocation_groups"]
    assert (f"placer: note: the default of 32 groups (--groups) is more than the {colocation_groups} colocation "
            f"groups of graph 'synthetic:20:1'") in out.err and "--groups 32" not in out.err
    assert main([*flags, "--groups", "40", "--out", str(tmp_path / "b")]) == 0
    assert "placer: note: --groups 40 is more than" in capsys.readouterr().err
    # hsdag refuses --groups (it groups the colocation groups itself): no note of a grouping it does not use
    hsdag = ["search", "--graph", "synthetic:20:1", "--policy", "hsdag", "--budget", "2", "--workers", "1", "--json"]
    assert main([*hsdag, "--out", str(tmp_path / "c")]) == 0
    assert "groups" not in capsys.readouterr().err


def test_search_cli__policy_expert_on_a_graph_it_has_no_rule_for_is_refused_before_anything_starts(tmp_path,
                                                                                               capsys):
    """It was found inside the run, after Ray and the baselines: a run folder of baseline rows, no result, that
    every --resume failed on again. (--warm-start expert was refused up front already.)"""
    from cluster.cli import main

    out = tmp_path / "runs"
    assert main(["search", "--graph", "synthetic:40", "--policy", "expert", "--budget", "8", "--out", str(out),
                 "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err == ("placer: error: --policy expert: no expert rule for graph 'synthetic:40:0': the papers "
                            "describe human placements only for rnnlm, nmt-* and inception-v3\n")


@pytest.mark.parametrize("policy, batch, given", [("giph", None, {}), ("hsdag", None, {}),
                                                   ("giph", 4, {"batch_size": 4}),
                                                   ("reinforce", None, {"hidden_size": 16})])
def test_search__graph_neural_placers_keep_their_own_batch_and_network_size(local_ray, tmp_path, monkeypatch,
                                                                             policy, batch, given):
    """The search's --batch reaches a learner only when given; its seq2seq width never reaches the
    graph-neural placers (their search defaults and checkpoints fix theirs)."""
    import policies.registry

    seen = {}
    original = policies.registry.place

    def recording_place(spec, problem, measurer, budget, seed, on_measurement=None, **options):
        if spec == policy:
            seen.update(options)
        return original(spec, problem, measurer, budget, seed, on_measurement, **options)

    monkeypatch.setattr(policies.registry, "place", recording_place)
    run_search(_config(tmp_path, policy=policy, batch=batch, budget=8, bound_time_limit_s=0))
    for key in ("batch_size", "hidden_size"):
        assert seen.get(key) == given.get(key), (key, seen.get(key))


@pytest.mark.parametrize("overrides, message", [
    ({"noise_std": float("inf")}, "--noise must be a number from 0 to 10, got inf"),
    ({"noise_std": 1000.0}, "--noise must be a number from 0 to 10, got 1000.0"),
    ({"seed": -1}, "--seed must be a whole number in 0..4294967295, got -1"),
    ({"budget": 2.5}, "--budget must be a whole number"),
    ({"groups": 8.0}, "--groups must be a whole number"),
    ({"baselines": "heft"}, "baselines must be a sequence of heuristic names, not the string 'heft'"),
    ({"baselines": ("single-gpu", "bogus")}, "baselines: 'bogus' is not a heuristic"),
    ({"policy": "device:3"}, "--policy: device:3 names no device of machine 'paper-2gpu' \\(devices 0..2\\)"),
    ({"baselines": ("device:7",)}, "baselines: device:7 names no device"),
    ({"split_groups": "device:3"}, "--split-groups: device:3 names no device"),
    ({"warm_start": "m-etf,device:9"}, "--warm-start: device:9 names no device"),
])
def test_check_search_config__values_the_command_line_cannot_give_are_refused_too(tmp_path, overrides, message):
    """A SearchConfig built in Python: refused before Ray starts or a run folder exists."""
    from cluster.jobs import check_search_config

    with pytest.raises(PlacerError, match=message):
        check_search_config(_config(tmp_path, **overrides))
    assert not (tmp_path / "runs").exists() and list(tmp_path.iterdir()) == []


def test_search_cli__sigterm_stops_a_run_as_ctrl_c_does(tmp_path):
    """`ray job stop` sends the job's driver SIGTERM: the run stops as after Ctrl-C (exit 130, the log flushed,
    no result), and --resume carries on from it. Under --json stdout still holds one document: the run folder
    and the command that resumes it."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    search = [sys.executable, "-m", "cluster.cli", "search", "--graph", "synthetic:1000:1", "--budget", "640",
              "--batch", "16", "--workers", "1", "--out", str(tmp_path), "--json"]
    driver = subprocess.Popen(search, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("*/checkpoint/learner.pt")) and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=120)
    (run_dir,) = list(tmp_path.iterdir())
    assert driver.returncode == 130 and "placer: search interrupted; the run log is complete" in err, err[-3000:]
    assert json.loads(out) == {"stop_reason": "interrupted", "run_dir": str(run_dir),
                               "resume": ["placer", "search", "--resume", str(run_dir)]}
    assert not (run_dir / "result.json").exists() and read_best(run_dir) is not None
    assert 0 < len(read_run(run_dir).query("policy == 'reinforce'")) < 640


def test_search__a_resumed_run_logs_what_a_run_never_stopped_logs_when_batches_repeat(local_ray, tmp_path):
    """Two groups, nine placements: many batches hold only placements measured before, and the learner
    measures nothing for them. The rows (placement, iteration, cache hit) of a run stopped and resumed are
    those of a run never stopped: the log numbers rows by the learner's own iterations, which its
    checkpoint holds (numbered by measure calls, a resume went on from another number and logged the
    replayed iterations' placements again as cache hits)."""
    settings = dict(budget=9, batch=2, groups=2)
    straight = run_search(_config(tmp_path / "straight", **settings))
    with pytest.raises(KeyboardInterrupt):
        run_search(_config(tmp_path / "stopped", **settings), progress=_interrupt_at(9))
    (run_dir,) = list((tmp_path / "stopped" / "runs").iterdir())
    assert (run_dir / CHECKPOINT_DIR / "learner.pt").is_file()  # it resumes from a checkpoint, not from scratch
    run_search(_config(tmp_path / "stopped", resume=str(run_dir), **settings))

    def learner_rows(folder):
        rows = read_run(folder)
        rows = rows[rows.policy == "reinforce"]
        return [(tuple(p), int(i), bool(h)) for p, i, h in zip(rows.placement, rows.iteration, rows.cache_hit)]

    assert learner_rows(run_dir) == learner_rows(straight.run_dir)


def test_search__a_run_where_nothing_ran_ok_says_so(local_ray, tmp_path, capsys):
    """Every placement out of memory (devices of 1 kB): the table said "overall best (reinforce) - ok" and
    result.json named reinforce as the source of no best."""
    from cluster.commands.search import print_result

    machine = json.loads((Path(REPO) / "measurers" / "catalog" / "paper-2gpu.json").read_text())
    for device in machine["devices"]:
        device["memory_bytes"] = 1000
    machine_file = tmp_path / "tiny.json"
    machine_file.write_text(json.dumps(machine))
    result = run_search(_config(tmp_path, machine=str(machine_file), budget=8))
    assert math.isinf(result.overall_best_runtime_s) and result.overall_best_source == "none ran ok"
    print_result(result)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert rows and all("│ ok " not in line for line in rows)  # the overall best's row said ok


def test_print_result__a_planner_of_its_own_groups_is_not_held_to_the_searched_groups_bound(capsys):
    """hierarchical places groups of its own: its row read 0.66x a proven bound of the 2 searched groups, and the
    footer said only the heuristics' placements may go below it; a run that measured nothing said "none ok"."""
    from cluster.commands.search import print_result
    from cluster.jobs.search import SearchResult

    def table_rows(result) -> dict[str, list[str]]:
        print_result(result)
        out = capsys.readouterr().out
        rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") > 2]
        return {cells[0]: cells for cells in rows if cells[0]}, " ".join(out.split())

    result = SearchResult(Path("run"), "rnnlm", "paper-2gpu", "hierarchical", 0.5320, "hierarchical", 0.5320, 16,
                          0.3, [], "budget", 1.0, groups=2, warm_start="expert", warm_start_runtime_s=0.5335,
                          warm_start_on_groups_s=0.5335, proven_bound_s=0.8011,
                          proven_bound_holds_for="placements of the 2 metis groups of rnnlm")
    rows, text = table_rows(result)
    own = next(cells for name, cells in rows.items() if name.startswith("hierarchical"))
    assert own[4] == "-" and rows["warm start on its"][4] == "-"  # names wrap in the 80-column table
    assert rows["overall best"][4] == "-" and rows["warm start"][4] == "0.67"  # expert's: colocation groups
    assert "(the heuristics', and hierarchical's own groups) may go below it" in text
    nothing = dataclasses.replace(result, policy="reinforce", policy_best_runtime_s=math.inf, measurements=0,
                                  warm_start=None)
    rows, _ = table_rows(nothing)
    assert next(cells for name, cells in rows.items() if name.startswith("reinforce"))[2] == "none measured"


def test_search__an_exact_runs_own_bound_for_every_placement_of_its_groups_raises_the_proven_bound(local_ray,
                                                                                                  tmp_path):
    """HiGHS's dual bound holds for every placement of the searched groups: with --bound-time-limit 0 the
    run's proven bound was the closed form (synthetic:40: 0.0028094 s beside the solver's 0.0036349 s)."""
    from cluster.analysis import proven_bound_of

    result = run_search(_config(tmp_path, graph="synthetic:40", policy="exact", budget=5, time_limit_s=3,
                                bound_time_limit_s=0))
    assert result.solver.bound_every_placement and result.solver.bound_s > result.lower_bound_s
    assert result.proven_bound_s == result.solver.bound_s
    assert result.proven_bound_holds_for == f"placements of the {result.groups} metis groups of synthetic:40:0"
    assert proven_bound_of(result.run_dir, read_manifest(result.run_dir)) == (result.proven_bound_s,
                                                                              result.proven_bound_holds_for)


def test_search__the_bound_is_solved_while_the_search_measures_and_recorded_when_it_ends(local_ray, tmp_path,
                                                                                          monkeypatch):
    """The proven bound's solve (10 s by default) ran before Ray started: every search waited for it first,
    a third of `make demo`. It runs in a thread now: here it sees the search's first batch measured before it
    ends, and the run records what it proved (a limit of its own: solves are shared per limit)."""
    import threading

    import policies.exact.bound as bound_module

    real, measured, saw_measuring = bound_module.proven_bound, threading.Event(), []

    def proven_bound(problem, time_limit_s, threads=1, stop=None):
        saw_measuring.append(measured.wait(60))
        return real(problem, time_limit_s, threads, stop=stop)

    monkeypatch.setattr(bound_module, "proven_bound", proven_bound)
    result = run_search(_config(tmp_path, bound_time_limit_s=3.25),
                        progress=lambda measured_count, best_s, lower_s: measured.set())
    assert saw_measuring == [True]
    assert read_manifest(result.run_dir).proven_bound_s == result.proven_bound_s >= result.lower_bound_s
    assert result.proven_bound_holds_for == "placements of the 8 metis groups of " + result.graph


def test_search__ctrl_c_stops_the_bounds_solve_and_its_resume_solves_it_again(local_ray, tmp_path, monkeypatch):
    """A search stopped before its bound is proven stops the solve (no thread left solving for nothing) and
    records no bound, not a partial one its resume would keep; the resume solves it and records it."""
    import threading

    import policies.exact.bound as bound_module

    real, stopped = bound_module.proven_bound, []

    def slow_bound(problem, time_limit_s, threads=1, stop=None):
        stopped.append(stop is not None and stop.wait(60))  # solving until the search stops it
        return real(problem, 0.0)

    monkeypatch.setattr(bound_module, "proven_bound", slow_bound)
    with pytest.raises(KeyboardInterrupt):
        run_search(_config(tmp_path, budget=40, bound_time_limit_s=4.75), progress=_interrupt_at(4))
    assert stopped == [True]
    assert not [t for t in threading.enumerate() if t.name == "placer-proven-bound"]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert read_manifest(run_dir).proven_bound_s is None
    monkeypatch.setattr(bound_module, "proven_bound", real)
    resumed = run_search(_config(tmp_path, budget=40, bound_time_limit_s=4.75, resume=str(run_dir)))
    assert read_manifest(run_dir).proven_bound_s == resumed.proven_bound_s >= resumed.lower_bound_s


def test_search__a_run_stopped_after_its_bound_was_proven_records_it(local_ray, tmp_path):
    """A Ctrl-C after the bound's solve had finished dropped it with the rest (the run's `analyze` row showed
    no proven bound); only a solve still going is stopped, and its resume solves it."""
    import threading

    def interrupt_once_the_bound_is_proven(measured, best_runtime_s, lower_bound_s):
        for thread in [t for t in threading.enumerate() if t.name == "placer-proven-bound"]:
            thread.join(60)
        if measured >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_search(_config(tmp_path, budget=40, bound_time_limit_s=0.5), progress=interrupt_once_the_bound_is_proven)
    (run_dir,) = list((tmp_path / "runs").iterdir())
    manifest = read_manifest(run_dir)
    assert manifest.proven_bound_s is not None and manifest.proven_bound_s >= manifest.lower_bound_s
    assert manifest.proven_bound_holds_for


def test_search__a_bound_solve_that_fails_leaves_the_closed_form_and_the_search_its_result(local_ray, tmp_path,
                                                                                            monkeypatch):
    """The bound is waited for after the search: a solve that raised lost the finished search's result (no
    result.json, an error), and the failure was shared with every later search of the same problem."""
    import policies.exact.bound as bound_module

    calls = []

    def failing_bound(problem, time_limit_s, threads=1, stop=None):
        calls.append(time_limit_s)
        raise RuntimeError("HiGHS fell over")

    monkeypatch.setattr(bound_module, "proven_bound", failing_bound)
    for attempt in (1, 2):
        result = run_search(_config(tmp_path / str(attempt), bound_time_limit_s=2.75))
        assert result.proven_bound_s == result.lower_bound_s and (result.run_dir / "result.json").exists()
        assert result.proven_bound_holds_for.startswith("every placement (the closed form: the solve failed: HiGHS")
        assert read_manifest(result.run_dir).proven_bound_s == result.proven_bound_s
    assert calls == [2.75, 2.75]  # tried again, not the first failure repeated


def test_search__a_tie_goes_to_the_first_row_logged_as_analyze_and_best_placement_have_it(local_ray, tmp_path):
    """annealing, warm-started from the expert, re-measures the expert's placement first (a cache hit): a
    tie. result.json named "annealing" (by name), analyze and best_placement.json the expert's row."""
    result = run_search(_config(tmp_path, graph="rnnlm", policy="annealing", warm_start="expert", budget=4,
                                groups=32, bound_time_limit_s=0, seed=0))
    expert = next(b.runtime_s for b in result.baselines if b.policy == "expert")
    assert result.overall_best_runtime_s == expert == result.policy_best_runtime_s  # the tie
    assert result.overall_best_source == "expert" == summarize([result.run_dir])[0].overall_best_source


def test_solver_raised_bound__only_a_real_raise_counts_not_the_same_solves_bound_one_ulp_higher():
    """exact's run of the bound's own MIP ends one ulp above it: proven_bound_s moved off its report's best_s."""
    from cluster.jobs.search import SolverFigures, solver_raised_bound
    from policies.problem import make_problem
    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    problem = make_problem(load_graph("synthetic:60"), load_machine("paper-2gpu"), max_groups=8)
    bound = (0.0035775512809844328, "placements of the 8 scope groups of synthetic:60")

    def solver(bound_s: float) -> SolverFigures:
        return SolverFigures(bound_s, bound_s, "optimal", "", bound_every_placement=True)

    assert solver_raised_bound(bound, solver(math.nextafter(bound[0], 1.0)), problem, "sim") is bound
    raised = solver_raised_bound(bound, solver(bound[0] * 1.01), problem, "sim")
    assert raised[0] == bound[0] * 1.01 and raised[1] == "placements of the 8 metis groups of synthetic:60:0"
