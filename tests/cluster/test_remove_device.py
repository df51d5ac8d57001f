"""`placer search --remove-device`: a device leaves mid-search and the policy goes on, on the devices left."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from cluster.runlog import read_best, read_manifest, read_run  # noqa: E402
from conftest import placer_stderr  # noqa: E402

GRAPH, MACHINE, GPU1 = "synthetic:300:1", "paper-4gpu", 2  # gpu:1 is device 2 of cpu:0, gpu:0..3


@pytest.fixture(scope="module")
def local_ray():
    from cluster import ray_setup

    ray_setup.init_ray(num_cpus=2)
    yield
    ray_setup.shutdown_ray()


def _search(out, *flags) -> list[str]:
    return ["search", "--graph", GRAPH, "--machine", MACHINE, "--budget", "60", "--workers", "1", "--groups", "8",
            "--bound-time-limit", "0", "--out", str(out), *flags]


def _run(tmp_path_factory, capsys, policy: str, *flags):
    from cluster.cli import main

    out = tmp_path_factory.mktemp("runs")
    assert main(_search(out, "--policy", policy, "--remove-device", "gpu:1@20", "--json", *flags)) == 0
    result = json.loads(capsys.readouterr().out)
    (run_dir,) = out.iterdir()
    return run_dir, result


def _uses(placement, device: int) -> bool:
    return device in set(np.asarray(placement).tolist())


# -- the measurer a reduced problem sees -------------------------------------------------------------------


def test_reduced_machine_measurer__times_as_the_simulator_on_the_reduced_machine():
    from cluster.jobs.removal import ReducedMachineMeasurer
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer

    graph, machine = load_graph(GRAPH), load_machine(MACHINE)
    reduced, kept = machine.without_devices(["gpu:1"]), machine.kept_device_indices(["gpu:1"])
    seen = []
    wrapped = ReducedMachineMeasurer(SimulatorMeasurer(graph, machine), kept, machine.num_devices,
                                     on_batch=lambda batch, results: seen.extend(batch))
    placements = list(np.random.default_rng(1).integers(0, reduced.num_devices, (5, graph.num_ops)))  # 5 x (N,)
    got, want = wrapped.measure(placements), SimulatorMeasurer(graph, reduced).measure(placements)
    assert [m.runtime_s for m in got] == pytest.approx([m.runtime_s for m in want], rel=1e-12)
    assert [m.peak_bytes for m in got] == [m.peak_bytes for m in want]  # per device of the reduced machine
    assert wrapped.measured == 5 and not any(_uses(p, GPU1) for p in seen)  # measured on the original indices
    assert [p.tolist() for p in seen] == [kept[p].tolist() for p in placements]


def test_moved_placement__units_on_a_removed_device_move_together_to_the_device_fastest_for_them():
    from cluster.jobs.removal import moved_placement
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from policies.problem import make_problem

    problem = make_problem(load_graph(GRAPH), load_machine(MACHINE), max_groups=8)
    units = np.arange(problem.num_units) % problem.num_devices  # (U,) every device used
    kept = problem.machine.kept_device_indices(["gpu:1"])
    moved = moved_placement(problem, problem.expand(units), kept)  # (N,) on the reduced machine
    assert moved.min() >= 0 and moved.max() < len(kept)
    orphans = np.flatnonzero(units == GPU1)
    targets = set()
    for unit in range(problem.num_units):
        ops = problem.op_unit == unit
        if units[unit] != GPU1:
            assert (kept[moved[ops]] == units[unit]).all()  # stays where it was
        else:
            assert len(set(moved[ops].tolist())) == 1  # whole
            targets.add(int(kept[moved[ops][0]]))
    assert len(targets) == 1  # together, as they were on the removed device
    together_s = {d: problem.unit_time_s[orphans, d].sum() for d in kept}
    assert targets.pop() == min(together_s, key=together_s.get)  # the device that runs them all fastest


def test_place_with_removals__exacts_own_solver_limit_is_a_phase_ending_not_the_search(monkeypatch):
    """exact stops with "time_limit" when its solver's limit runs out: that ended the whole search, so the
    device never left ("its trigger did not come") and the budget went unspent. The session's own time limit
    still ends it."""
    import time

    import policies.registry as registry
    from cluster.jobs.removal import DeviceRemoval, place_with_removals
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.base import BudgetedMeasurer, DecisionClock, RunContext, search_result
    from policies.problem import make_problem

    class SolverOutOfTime:  # measures two placements of its groups, then its solver's limit runs out
        def place(self, problem, measurer, budget, seed, on_measurement=None):
            counter = BudgetedMeasurer(measurer, budget, problem.capacity_bytes(), DecisionClock())
            counter.measure([problem.expand(np.full(problem.num_units, d)) for d in (0, 1)])
            time.sleep(0.2)
            return search_result("exact", problem, counter, stop_reason="time_limit")

    monkeypatch.setattr(registry, "make_policy", lambda name, **options: SolverOutOfTime())
    problem = make_problem(load_graph(GRAPH), load_machine(MACHINE), max_groups=8)
    seen = []

    def run(context=None):
        options = {"time_limit_s": 10.0, **({"context": context} if context else {})}
        return place_with_removals("exact", problem, SimulatorMeasurer(problem.graph, problem.machine), 60, 0,
                                   options, [DeviceRemoval("gpu:1", 20, "gpu:1@20")], lambda: False,
                                   lambda records, devices: seen.append(devices))

    phased = run()
    assert seen == [[GPU1]] and phased.removals[0]["removed"] and phased.measurements == 4
    assert GPU1 not in phased.kept.tolist()
    seen.clear()
    over = run(RunContext(time_limit_s=0.1))  # the session's limit: over by the first phase's end
    assert seen == [] and over.stop_reason == "time_limit" and over.measurements == 2


# -- a search that loses a device ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["annealing", "cem", "heft"])
def test_remove_device__no_placement_uses_the_device_after_it_left(local_ray, tmp_path_factory, capsys, policy):
    run_dir, result = _run(tmp_path_factory, capsys, policy)
    (removal,) = read_manifest(run_dir).device_removals
    assert removal["device"] == "gpu:1" and removal["index"] == GPU1 and removal["trigger"] == "measurements"
    rows = read_run(run_dir)
    own = rows[rows["policy"] == policy]
    after = own[own["seq"] >= removal["at_seq"]]
    if policy == "heft":  # a heuristic measures once, then once again on the devices left
        assert removal["at_measurement"] == 1 and len(own) == 2
    else:
        assert removal["at_measurement"] == 20 and len(own) == 60 and len(after) == 40
        assert any(_uses(p, GPU1) for p in own[own["seq"] < removal["at_seq"]]["placement"])  # it was in use
    assert len(after) and not any(_uses(p, GPU1) for p in after["placement"])
    assert result["final_devices"] == ["cpu:0", "gpu:0", "gpu:2", "gpu:3"]
    assert result["device_removals"][0]["removed"] and result["measurements"] == len(own)
    assert not _uses(result["best_placement"], GPU1)
    assert not _uses(read_best(run_dir).placement, GPU1)
    ok = rows[(rows["status"] == "ok") & ~rows["placement"].map(lambda p: _uses(p, GPU1))]
    assert result["overall_best_runtime_s"] == pytest.approx(ok["runtime_s"].min())  # the best over what qualifies


@pytest.mark.slow
def test_remove_device__the_progress_bar_shows_the_best_without_the_device(local_ray, tmp_path):
    """After gpu:1 left (2 measurements before the end), the bar's best is the policy's best on the devices
    left: it kept the best on gpu:1, 0.0286 s against 0.0327 s."""
    from cluster.jobs import SearchConfig, run_search

    shown = []
    config = SearchConfig(graph=GRAPH, machine=MACHINE, budget=60, workers=1, groups=8, bound_time_limit_s=0,
                          out=str(tmp_path), policy="annealing", remove_devices=("gpu:1@58",))
    result = run_search(config, progress=lambda measured, best_s, bound_s: shown.append(best_s))
    assert shown[-1] == pytest.approx(result.policy_best_runtime_s)


@pytest.mark.slow
def test_remove_device__annealing_warm_starts_from_the_best_moved_off_the_device(local_ray, tmp_path_factory,
                                                                                   capsys):
    """A policy that takes a warm start goes on from the best so far: its first placement after the removal is
    no slower than the best before it, moved (unless that best never used the device)."""
    from cluster.jobs.removal import moved_placement
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem

    run_dir, result = _run(tmp_path_factory, capsys, "annealing")
    (removal,) = read_manifest(run_dir).device_removals
    rows = read_run(run_dir)
    own = rows[rows["policy"] == "annealing"]
    before = own[(own["seq"] < removal["at_seq"]) & (own["status"] == "ok")]
    best_before = before.loc[before["runtime_s"].idxmin()]
    problem = make_problem(load_graph(GRAPH), load_machine(MACHINE), max_groups=8)
    kept = problem.machine.kept_device_indices(["gpu:1"])
    start = kept[moved_placement(problem, problem.expand(np.asarray(best_before["placement"])), kept)]
    (start_s,) = SimulatorMeasurer(problem.graph, problem.machine).measure([start])
    assert own[own["seq"] >= removal["at_seq"]]["runtime_s"].min() <= start_s.runtime_s + 1e-12
    assert result["policy_best_runtime_s"] <= start_s.runtime_s + 1e-12


@pytest.mark.slow
def test_remove_device__a_warm_start_on_the_device_that_left_is_said_so(local_ray, tmp_path_factory, capsys):
    """HEFT's placement uses gpu:1; once gpu:1 leaves, the table's warm-start rows showed steps the final devices
    cannot run, above the policy's own best "never worse than" them, without a word."""
    from cluster.cli import main

    out = tmp_path_factory.mktemp("runs")
    args = _search(out, "--policy", "annealing", "--remove-device", "gpu:1@20", "--warm-start", "heft")
    assert main(args + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (run_dir,) = out.iterdir()
    heft = read_run(run_dir).query("policy == 'heft'")["placement"].iloc[0]
    assert _uses(heft, GPU1) and result["warm_start_on_removed_devices"] is True
    assert main(_search(tmp_path_factory.mktemp("runs"), "--policy", "annealing", "--remove-device", "gpu:1@20",
                        "--warm-start", "heft")) == 0
    cells = [line.split("│")[1].strip() for line in capsys.readouterr().out.splitlines() if line.count("│") > 2]
    names = " ".join(cells)  # the first column's lines, wrapped at the console's width
    assert "warm start (heft) (uses a device that left)" in names
    assert "warm start on the searched groups (uses a device that left)" in names


# -- bad input: one error, exit status 2, no run folder -----------------------------------------------------


def _cpu_only_graph_file(tmp_path):
    """The synthetic graph with op 0's colocation group CPU-only."""
    from graphs.io import save_graph
    from graphs.opgraph import kind_bit
    from graphs.registry import load_graph

    graph = load_graph(GRAPH)
    mask = graph.allowed_mask.copy()
    mask[graph.colocation_ids == graph.colocation_ids[0]] = kind_bit("cpu")
    return save_graph(dataclasses.replace(graph, allowed_mask=mask), tmp_path / "cpu-only.parquet")


@pytest.mark.parametrize("flags, message", [
    (["--remove-device", "gpu:1"], "--remove-device 'gpu:1': expected NAME@MEASUREMENTS"),
    (["--remove-device", "gpu:1@x"], "--remove-device 'gpu:1@x': expected NAME@MEASUREMENTS (e.g. gpu:1@200) or "
                                     "NAME@node-lost; 'x' is not a measurement count"),
    (["--remove-device", "@5"], "--remove-device '@5': expected NAME@MEASUREMENTS"),
    (["--remove-device", "gpu:1@+5"], "--remove-device 'gpu:1@+5': expected NAME@MEASUREMENTS"),  # taken as 5
    (["--remove-device", "gpu:1@\u0665"], "--remove-device 'gpu:1@\u0665': expected"),  # an Arabic-Indic 5
    (["--remove-device", "gpu:1@-3"], "--remove-device 'gpu:1@-3': MEASUREMENTS must be at least 1, got -3"),
    (["--remove-device", "gpu:9@5"], "--remove-device 'gpu:9@5': machine 'paper-4gpu' has no device 'gpu:9' "
                                     "(devices: cpu:0, gpu:0, gpu:1, gpu:2, gpu:3)"),
    (["--remove-device", "gpu:1@60"], "--remove-device 'gpu:1@60': 60 measurements is not below the budget of 60"),
    (["--remove-device", "gpu:1@5", "--remove-device", "gpu:1@9"], "--remove-device: device 'gpu:1' is named twice"),
    ([f"--remove-device={d}@5" for d in ("cpu:0", "gpu:0", "gpu:1", "gpu:2", "gpu:3")],
     "--remove-device: machine 'paper-4gpu': cannot remove the last device"),
    (["--policy", "reinforce", "--remove-device", "gpu:1@5"],
     "--remove-device: policy 'reinforce' has one network output per device of the machine and cannot go on "
     "without a device; policies that can: single-gpu"),
    (["--policy", "device:2", "--remove-device", "gpu:1@5"], "--remove-device: policy 'device:2' places everything"),
])
def test_remove_device__bad_input_is_one_error_and_no_run_folder(tmp_path, capsys, flags, message):
    from cluster.cli import main

    out = tmp_path / "runs"
    assert main(_search(out, "--policy", "cem", *flags)) == 2
    err = placer_stderr(capsys.readouterr().err)
    assert err.startswith(f"placer: error: {message}") and err.count("\n") == 1
    assert not out.exists()


def test_remove_device__every_device_an_op_may_use_is_refused(tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "runs"
    flags = ["--policy", "cem", "--graph", str(_cpu_only_graph_file(tmp_path)), "--remove-device", "cpu:0@5"]
    assert main(_search(out, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error: --remove-device: without cpu:0, group ") and "no device its ops may run on" in err
    assert not out.exists()


@pytest.mark.slow
def test_remove_device__resume_is_refused_either_way(local_ray, tmp_path_factory, capsys):
    from cluster.cli import main

    run_dir, _ = _run(tmp_path_factory, capsys, "heft")
    assert main(["search", "--resume", str(run_dir)]) == 2
    assert "--remove-device is not supported for resumed runs" in capsys.readouterr().err
    assert main(["search", "--resume", str(run_dir), "--remove-device", "gpu:2@30"]) == 2
    assert capsys.readouterr().err.startswith("placer: error: --remove-device is not supported for resumed runs")


def test_best_by_devices__a_tie_goes_to_the_placement_measured_first():
    """The set of devices first used won a tie: seq 17 (a set an earlier, slower row had used) over seq 16,
    so search --json's best_placement was not best_placement.json's, which `placer apply` reads."""
    from cluster.jobs.removal import BestByDevices
    from measurers.base import Measurement

    def ok(runtime_s):
        return Measurement(runtime_s, (runtime_s,), "ok", (0,) * 5, 0.0)

    best = BestByDevices()
    slower, first, tie = np.array([4, 1, 0]), np.array([3, 1, 0]), np.array([4, 0, 1])
    best.record([slower, first, tie], [ok(2.0), ok(1.0), ok(1.0)])
    runtime_s, placement = best.fastest([0, 1, 3, 4])
    assert runtime_s == 1.0 and placement.tolist() == first.tolist()
    assert best.fastest([0, 1, 4])[1].tolist() == tie.tolist()  # the first on the devices left
