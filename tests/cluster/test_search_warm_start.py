"""`placer search --warm-start`: where the candidates come from, what reaches the learned policy, what the
result and the table say, and bad input refused with one error line before any run folder is made.

A tiny learned policy registered here stands in for the learners: it records the ``warm_start`` it is
given, measures its candidates first (inside its budget, as the learners do) and then random placements."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from cluster.jobs import SearchConfig, run_search  # noqa: E402
from conftest import placer_stderr  # noqa: E402
from cluster.runlog import read_manifest, read_run  # noqa: E402
from policies.base import BudgetedMeasurer, DecisionClock, search_result  # noqa: E402
from policies.registry import POLICIES, PolicyEntry, register_policy  # noqa: E402

pytestmark = pytest.mark.slow
GRAPH = "synthetic:300:1"
FAKE = "fake-learner"
BASE_FLAGS = ["--graph", GRAPH, "--machine", "paper-2gpu", "--budget", "8", "--batch", "4", "--groups", "8",
              "--workers", "1"]


class FakeLearner:
    """A learned policy in the registry's sense: takes the learners' options, warm_start included."""
    given: list = []  # the warm_start of every policy built, in order

    def __init__(self, warm_start=None, **options):
        self.name = FAKE
        self.warm_start = warm_start
        FakeLearner.given.append(None if warm_start is None else [np.array(p) for p in warm_start])

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        from policies.rl.warm_start import measure_warm_start

        counter = BudgetedMeasurer(measurer, budget, problem.capacity_bytes(), DecisionClock(), on_measurement)
        measure_warm_start(problem, counter, self.warm_start)
        rng = np.random.default_rng(seed)
        while counter.left > 0:
            units = rng.integers(0, problem.num_devices, size=(min(4, counter.left), problem.num_units))
            counter.measure(problem.expand(problem.repair_allowed(units)))
        return search_result(self.name, problem, counter)


@pytest.fixture
def fake_learner():
    register_policy(PolicyEntry(FAKE, f"{__name__}:FakeLearner", "learned", "test stand-in for a learner"))
    FakeLearner.given.clear()
    yield FakeLearner.given
    POLICIES.pop(FAKE, None)


@pytest.fixture(scope="module")
def local_ray():
    from cluster import ray_setup

    ray_setup.init_ray(num_cpus=2)
    yield
    ray_setup.shutdown_ray()


def _heuristic_placement(name: str) -> np.ndarray:
    """(N,) what the heuristic places on the graph (as the search scores it: on colocation groups)."""
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.registry import place_once

    graph, machine = load_graph(GRAPH), load_machine("paper-2gpu")
    return place_once(name, graph, machine, SimulatorMeasurer(graph, machine)).op_placement


def _table_row(table: str, name: str) -> str:
    """The cells after ``name`` in the printed table's row that starts with it."""
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if cells[0] == name:
            return " │ ".join(cells[1:])
    raise AssertionError(f"no row {name!r} in\n{table}")


def _config(tmp_path, **overrides) -> SearchConfig:
    settings = dict(graph=GRAPH, machine="paper-2gpu", policy=FAKE, budget=8, batch=4, groups=8, hidden_size=16,
                    workers=1, seed=3, out=str(tmp_path / "runs"))
    return SearchConfig(**{**settings, **overrides})


def _restricted_graph_file(tmp_path) -> Path:
    """The synthetic graph with op 0's colocation group CPU-only, as a graph file."""
    from graphs.io import save_graph
    from graphs.opgraph import kind_bit
    from graphs.registry import load_graph

    graph = load_graph(GRAPH)
    mask = graph.allowed_mask.copy()
    mask[graph.colocation_ids == graph.colocation_ids[0]] = kind_bit("cpu")
    return save_graph(dataclasses.replace(graph, allowed_mask=mask), tmp_path / "restricted.parquet")


# -- bad input: one error line, exit 2, no run folder ----------------------------------------------------------

def _bad_input_cases(tmp_path) -> list[tuple[list[str], str]]:
    np.save(tmp_path / "short.npy", np.zeros(5, dtype=np.int64))
    np.save(tmp_path / "device7.npy", np.full(300, 7, dtype=np.int64))
    np.save(tmp_path / "floats.npy", np.zeros(300))
    (tmp_path / "placement.txt").write_text("0 1 2\n")
    np.save(tmp_path / "on-gpu.npy", np.ones(300, dtype=np.int64))
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "uint64.npy", np.full(300, 2**64 - 1, dtype=np.uint64))
    restricted = _restricted_graph_file(tmp_path)
    return [
        (["--warm-start", str(tmp_path / "empty.npy")], "cannot read it as a .npy array (No data left"),  # was EOFError
        (["--warm-start", "telepathy"], "--warm-start: unknown warm start 'telepathy': not a heuristic"),
        (["--warm-start", "m-etf,cem"], "--warm-start: unknown warm start 'cem'"),
        (["--warm-start", "m-etf,heft,m-etf"], "--warm-start: m-etf given more than once"),  # was dropped, exit 0
        (["--policy", "hsdag", "--groups", "8"], "--groups: hsdag groups the graph's colocation groups itself"),
        (["--policy", "hsdag", "--grouping", "metis"], "--grouping: hsdag groups the graph's colocation groups"),
        (["--warm-start", " "], "--warm-start: empty source"),
        (["--warm-start", str(tmp_path / "missing.npy")], "--warm-start: unknown warm start"),
        (["--warm-start", str(tmp_path / "placement.txt")], "a file must be a .npy file"),
        (["--policy", "random", "--warm-start"], "--warm-start needs a --policy that takes one"),
        (["--policy", "m-etf", "--warm-start", "expert"], "'m-etf' is a heuristic policy"),
        (["--warm-start", str(tmp_path / "short.npy")], "warm-start candidate 0 for graph"),
        (["--warm-start", str(tmp_path / "device7.npy")], "names device 7, outside 0..2"),
        (["--warm-start", str(tmp_path / "uint64.npy")], f"names device {2**64 - 1}, outside"),  # was "device -1"
        (["--warm-start", str(tmp_path / "floats.npy")], "must hold integer device indices"),
        (["--graph", str(restricted), "--warm-start", str(tmp_path / "on-gpu.npy")], "a device kind it may not use"),
        (["--warm-start", str(tmp_path)], "is not a run folder"),
        (["--split-groups", "cem"], "--split-groups: 'cem' is not a heuristic (single-gpu, cpu-only"),
        (["--split-groups", "telepathy"], "--split-groups: 'telepathy' is not a heuristic"),
        (["--split-groups", "device:9"], "--split-groups: device:9 names no device of machine"),
        (["--split-groups", "expert"], "--split-groups expert: no expert rule for graph"),
        (["--policy", "hierarchical", "--split-groups", "heft"], "policy 'hierarchical' does not place the searched"),
    ]


def test_search_cli__bad_warm_start_is_one_error_and_writes_nothing(tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "runs"
    for flags, message in _bad_input_cases(tmp_path):
        assert main(["search", *BASE_FLAGS, "--out", str(out), *flags]) == 2, flags
        captured = capsys.readouterr()
        err = placer_stderr(captured.err)
        assert err.startswith("placer: error: ") and err.count("\n") == 1, err
        assert message in err, (flags, err)
        assert captured.out == ""
        assert not out.exists(), flags


def test_search__warm_start_names_and_paths_are_checked_before_ray(tmp_path, monkeypatch):
    """A bad placement file fails in run_search before Ray starts (nothing to shut down, nothing written)."""
    import ray

    from graphs.errors import PlacerError

    np.save(tmp_path / "short.npy", np.zeros(5, dtype=np.int64))
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started for a bad warm start"))
    with pytest.raises(PlacerError, match=r"shape \(5,\), expected \(300,\)"):
        run_search(_config(tmp_path, policy="reinforce", warm_start=str(tmp_path / "short.npy")))
    assert not (tmp_path / "runs").exists()


# -- auto, names, files: what reaches the policy and what the result says ---------------------------------------

def test_search__auto_warm_start_hands_the_policy_the_baselines_fastest_first(local_ray, tmp_path, fake_learner):
    result = run_search(_config(tmp_path, warm_start="auto"))
    scored = {b.policy: b.runtime_s for b in result.baselines}
    assert set(scored) == {"single-gpu", "expert", "m-topo", "m-etf", "m-sct", "heft"}  # quick ones and the warm start's
    ran = sorted((t, name) for name, t in scored.items() if math.isfinite(t))
    assert len(ran) >= 2 and math.isnan(scored["expert"])  # no expert rule for a synthetic graph
    assert result.warm_start == ran[0][1] and result.warm_start_runtime_s == ran[0][0]
    (given,) = fake_learner
    assert len(given) == len(ran)
    for placement, (runtime_s, name) in zip(given, ran):  # each candidate is that baseline's placement
        assert np.array_equal(placement, _heuristic_placement(name))
    rows = read_run(result.run_dir)
    assert (rows.policy == FAKE).sum() == 8  # the policy's own measurements, warm start inside the budget
    assert read_manifest(result.run_dir).config["warm_start"] == "auto"
    data = result.to_json()
    assert data["warm_start"] == ran[0][1] and data["warm_start_runtime_s"] == pytest.approx(ran[0][0])


def test_search__named_heuristics_warm_start_only_those(local_ray, tmp_path, fake_learner):
    result = run_search(_config(tmp_path, warm_start="heft,round-robin"))
    scored = {b.policy: b.runtime_s for b in result.baselines}
    assert set(scored) == {"single-gpu", "expert", "m-etf", "heft", "round-robin"}  # m-sct: not asked for
    best = min(("heft", "round-robin"), key=scored.get)
    assert result.warm_start == best and result.warm_start_runtime_s == scored[best]
    assert len(fake_learner[0]) == 2


def test_search__without_warm_start_the_policy_gets_none(local_ray, tmp_path, fake_learner):
    result = run_search(_config(tmp_path))
    assert fake_learner == [None] and result.warm_start is None and math.isnan(result.warm_start_runtime_s)
    assert {b.policy for b in result.baselines} == {"single-gpu", "expert", "m-etf"}


def test_search_cli__file_warm_start_reaches_the_policy_and_the_table(local_ray, tmp_path, capsys, monkeypatch,
                                                                      fake_learner):
    """A .npy placement: checked, copied into the run folder, scored once ("warm-start" in the log), handed
    to the policy as its only candidate, named in the JSON and the table; a resume keeps it and refuses
    another source."""
    from cluster.cli import main
    from graphs.registry import load_graph

    monkeypatch.setenv("COLUMNS", "400")  # the table unwrapped
    colocation = load_graph(GRAPH).colocation_ids
    placement = np.where(colocation % 2 == 0, 1, 2).astype(np.int64)  # colocation groups on gpu:0 / gpu:1
    path = tmp_path / "mine.npy"
    np.save(path, placement)
    out = tmp_path / "runs"
    assert main(["search", *BASE_FLAGS, "--policy", FAKE, "--out", str(out), "--warm-start", str(path),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # exactly one JSON document
    (given,) = fake_learner
    assert len(given) == 1 and np.array_equal(given[0], placement)
    run_dir = Path(data["run_dir"])
    assert np.array_equal(np.load(run_dir / "warm_start.npy"), placement)
    rows = read_run(run_dir)
    (scored,) = rows[rows.policy == "warm-start"].runtime_s
    assert data["warm_start"] == str(path) and data["warm_start_runtime_s"] == pytest.approx(scored)

    path.unlink()  # a resume starts from the run folder's copy
    assert main(["search", "--resume", str(run_dir), "--budget", "12"]) == 0
    table = capsys.readouterr().out
    assert np.array_equal(fake_learner[1][0], placement)
    assert _table_row(table, f"warm start ({path})").startswith(f"{scored:.4f} │ ok")
    assert f"{FAKE} (learner's own best, warm-started)" in table
    assert main(["search", "--resume", str(run_dir), "--warm-start", "heft"]) == 2
    err = placer_stderr(capsys.readouterr().err)
    assert err.startswith("placer: error: --warm-start 'heft': run ") and err.count("\n") == 1
    assert "keeps it" in err and read_manifest(run_dir).config["warm_start"] == str(path)


def test_search_cli__run_folder_warm_start_and_table(local_ray, tmp_path, capsys, monkeypatch, fake_learner):
    """Another run's folder as the source: its best placement; the table marks the warm start. A run of
    another graph is refused before anything is written."""
    from cluster.cli import main
    from cluster.run_best import read_run_best
    from graphs.registry import load_graph

    monkeypatch.setenv("COLUMNS", "400")

    first = run_search(_config(tmp_path / "first", policy="random", batch=None))
    assert main(["search", *BASE_FLAGS, "--policy", FAKE, "--out", str(tmp_path / "runs"),
                 "--warm-start", str(first.run_dir)]) == 0
    table = capsys.readouterr().out
    (given,) = fake_learner
    assert np.array_equal(given[0], read_run_best(first.run_dir).op_placement(load_graph(GRAPH)))
    assert _table_row(table, f"warm start ({first.run_dir})").startswith(f"{first.overall_best_runtime_s:.4f} │ ok")
    assert f"{FAKE} (learner's own best, warm-started)" in table
    assert "x proven bound" in table and "proven bound (placer bound)" in table  # the column and what it holds for

    other = run_search(_config(tmp_path / "other", policy="random", batch=None, graph="synthetic:300:2"))
    assert main(["search", *BASE_FLAGS, "--policy", FAKE, "--out", str(tmp_path / "none"),
                 "--warm-start", str(other.run_dir)]) == 2
    err = placer_stderr(capsys.readouterr().err)
    assert "that run placed a graph with hash" in err and err.count("\n") == 1
    assert not (tmp_path / "none").exists()


def test_search__a_named_heuristic_that_does_not_apply_is_refused_and_one_of_several_is_skipped(
        local_ray, tmp_path, fake_learner):
    """expert has no rule for a synthetic graph. Named alone, the search ran cold and said only "expert":
    it is refused before the run starts, as --split-groups expert is. Named with another, it is skipped, as
    a baseline is, and the other is the start."""
    from graphs.errors import PlacerError

    with pytest.raises(PlacerError, match="--warm-start expert: no expert rule for graph"):
        run_search(_config(tmp_path, warm_start="expert"))
    assert fake_learner == [] and not (tmp_path / "runs").exists()
    result = run_search(_config(tmp_path, warm_start="expert,m-etf"))
    assert result.warm_start == "m-etf" and math.isfinite(result.warm_start_runtime_s)


def test_search__reinforce_starts_from_the_warm_start_and_never_ends_worse(local_ray, tmp_path):
    """The real learner: its first measurements are the candidates collapsed onto its groups (inside its
    budget), and its best is no worse than the best of them."""
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from policies.problem import make_problem
    from policies.rl.warm_start import distinct_unit_placements

    result = run_search(_config(tmp_path, policy="reinforce", warm_start="auto", budget=8, batch=4))
    rows = read_run(result.run_dir)
    learner = rows[rows.policy == "reinforce"]
    assert len(learner) == 8 == result.measurements
    problem = make_problem(load_graph(GRAPH), load_machine("paper-2gpu"), max_groups=8, seed=3)
    scored = {b.policy: b.runtime_s for b in result.baselines}
    ran = [name for _, name in sorted((t, name) for name, t in scored.items() if math.isfinite(t))]
    units, _ = distinct_unit_placements(problem, [_heuristic_placement(name) for name in ran])  # (K, U)
    first = learner.sort_values("seq").head(len(units))  # measured before its first batch, in iteration 0
    assert (first.iteration == 0).all()
    assert sorted(tuple(p) for p in first.placement) == sorted(tuple(u) for u in units)
    assert result.policy_best_runtime_s <= first[first.status == "ok"].runtime_s.min()
    assert result.warm_start_on_groups_s == first[first.status == "ok"].runtime_s.min()  # reported as the start
    assert result.to_json()["warm_start_on_groups_s"] == result.warm_start_on_groups_s


def test_search__annealing_takes_the_warm_start_and_never_ends_above_it(local_ray, tmp_path):
    """The one search that takes a warm start: its chains start at the best of its own starts and the
    heuristics' placements collapsed onto its groups, measured inside its budget; the start's step on its
    groups is reported as the learners' is."""
    result = run_search(_config(tmp_path, policy="annealing", batch=None, warm_start="heft", budget=12))
    rows = read_run(result.run_dir)
    annealing = rows[rows.policy == "annealing"]
    assert len(annealing) == result.measurements <= 12
    assert result.warm_start == "heft" and math.isfinite(result.warm_start_runtime_s)
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from policies.problem import make_problem

    problem = make_problem(load_graph(GRAPH), load_machine("paper-2gpu"), max_groups=8, seed=3)
    heft_units = tuple(problem.collapse(_heuristic_placement("heft")))
    first = annealing.iloc[:3]  # single GPU, m-TOPO and the warm start, measured together first
    assert heft_units in {tuple(p) for p in first.placement}
    heft_on_groups = first[[tuple(p) == heft_units for p in first.placement]]
    assert result.policy_best_runtime_s <= heft_on_groups.runtime_s.min()
    assert result.warm_start_on_groups_s == heft_on_groups.runtime_s.min()  # was null: set by the learners only


def test_search__split_groups_makes_the_heuristic_an_exact_start(local_ray, tmp_path, monkeypatch):
    """--warm-start heft --split-groups heft: the searched groups are the 8 groups split by HEFT's devices,
    so the learner's start on its groups is HEFT's own placement and step time, and the run folder keeps the
    split grouping (what a resume places). HEFT runs once: the warm start reuses the split's placement."""
    from cluster.jobs.config import GROUPING_FILE
    from graphs.grouping import Grouping
    from policies.heft import HeftPolicy

    plain = run_search(_config(tmp_path, policy="reinforce", warm_start="heft", budget=8, batch=4))
    heft_runs = []
    original = HeftPolicy.place
    monkeypatch.setattr(HeftPolicy, "place", lambda self, *a, **k: heft_runs.append(1) or original(self, *a, **k))
    split = run_search(_config(tmp_path, policy="reinforce", warm_start="heft", split_groups="heft", budget=8,
                               batch=4))
    assert len(heft_runs) == 1  # placed once for the split; the warm start measures that placement
    assert 8 < split.groups <= 8 * 3 and plain.groups == 8
    assert split.warm_start_on_groups_s == split.warm_start_runtime_s  # exact, not collapsed
    assert plain.warm_start_on_groups_s != plain.warm_start_runtime_s  # collapsed onto 8 groups: another placement
    assert split.policy_best_runtime_s <= split.warm_start_runtime_s
    with np.load(Path(split.run_dir) / GROUPING_FILE) as arrays:
        grouping = Grouping.from_arrays(dict(arrays))
    assert grouping.num_groups == split.groups and grouping.method.endswith("+split")
    heft = _heuristic_placement("heft")
    assert np.array_equal(grouping.expand(grouping.collapse(heft)), heft)
