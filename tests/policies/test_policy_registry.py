"""The one policy registry: every command means the same placement by the same name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cluster.cli import main
from conftest import build_graph, policy_placement
from graphs.errors import PlacerError
from measurers.catalog import load_machine
from policies.registry import (POLICIES, PolicyEntry, baseline_names, learned_names, make_policy, place, place_once,
                               policy_entry, register_policy)

LINK = {"bandwidth_Bps": 1e10, "latency_s": 1e-5}


def k80_v100_machine(tmp_path):
    """1 CPU + a K80 (gpu:0, listed first) + a V100 (gpu:1, faster)."""
    names = ("cpu:0", "gpu:0", "gpu:1")
    spec = {"name": "k80-v100", "devices": [{"name": "cpu:0", "model": "Xeon-E5-2699v3"},
                                            {"name": "gpu:0", "model": "K80"}, {"name": "gpu:1", "model": "V100"}],
            "links": [{"src": a, "dst": b, **LINK, "channel": f"{a}>{b}"} for a in names for b in names if a != b]}
    path = tmp_path / "k80-v100.json"
    path.write_text(json.dumps(spec))
    return path


def test_registry__every_policy_is_listed_once_with_its_kind():
    off_by_default = {name for name, entry in POLICIES.items() if not entry.default_baseline}
    assert off_by_default == {"exact"}  # too slow for `placer baselines` unless named
    assert set(baseline_names()) | set(learned_names()) | off_by_default == set(POLICIES)
    assert {"reinforce", "ppo"} <= set(learned_names()) and not set(learned_names()) & set(baseline_names())
    assert policy_entry("device:2").kind == "heuristic"
    assert make_policy("device:2").device == 2
    with pytest.raises(PlacerError, match="unknown policy 'nope'"):
        policy_entry("nope")
    for spec in ("device:x", "device:01", "device:+1", "device: 1", "device:-1", "device:"):
        with pytest.raises(PlacerError, match="device:K"):  # one spelling per device: duplicates stay visible
            policy_entry(spec)


def test_single_gpu__simulate_and_baselines_both_take_the_fastest_gpu(tmp_path, capsys):
    machine_file = str(k80_v100_machine(tmp_path))
    assert main(["simulate", "--graph", "synthetic:300", "--machine", machine_file, "--policy", "single-gpu",
                 "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert main(["baselines", "--graph", "synthetic:300", "--machine", machine_file,
                 "--policies", "single-gpu,device:1,device:2", "--json"]) == 0
    rows = {row["policy"]: row for row in json.loads(capsys.readouterr().out)["results"]}
    assert rows["device:2"]["runtime_s"] < rows["device:1"]["runtime_s"]  # the V100 is the faster GPU
    assert simulated["runtime_s"] == pytest.approx(rows["single-gpu"]["runtime_s"], rel=1e-12)
    assert simulated["runtime_s"] == pytest.approx(rows["device:2"]["runtime_s"], rel=1e-12)
    busy = {d["name"]: d["busy_s"] for d in simulated["devices"]}
    assert busy["gpu:1"] > 0 and busy["gpu:0"] == 0


def test_simulate__any_baseline_by_name_and_learned_ones_refused(tmp_path, capsys):
    assert main(["simulate", "--graph", "synthetic:300", "--machine", "paper-2gpu", "--policy", "m-etf",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    assert main(["simulate", "--graph", "synthetic:300", "--machine", "paper-2gpu", "--policy", "reinforce"]) == 2
    assert "learned policy" in capsys.readouterr().err


def test_policy_placement__keeps_colocation_groups_and_allowed_kinds():
    graph = build_graph([], 4, colocation=np.array([0, 1, 0, 3]), allowed_mask=np.array([3, 3, 3, 1], dtype=np.uint8))
    machine = load_machine("paper-2gpu")
    assert policy_placement(graph, machine, "single-gpu").tolist() == [1, 1, 1, 0]  # op3 is CPU-only
    assert policy_placement(graph, machine, "cpu-only").tolist() == [0, 0, 0, 0]
    assert policy_placement(graph, machine, "round-robin").tolist() == [1, 2, 1, 0]


def test_registry__a_policy_registered_later_joins_the_baselines(monkeypatch):
    monkeypatch.setitem(POLICIES, "last-gpu", POLICIES["single-gpu"])  # removed again after the test
    register_policy(PolicyEntry("last-gpu", "policies.simple:SingleGpuPolicy", "heuristic", "test"))
    assert "last-gpu" in baseline_names() and "last-gpu" not in learned_names()


def test_baselines__learned_policy_names_are_refused(capsys):
    assert main(["baselines", "--graph", "synthetic:300", "--machine", "paper-2gpu", "--policies", "ppo"]) == 2
    assert "learned policy" in capsys.readouterr().err


def test_place_once__searches_and_learned_policies_need_a_budget():
    from measurers.sim.measurer import SimulatorMeasurer

    graph, machine = build_graph([(0, 1)]), load_machine("paper-2gpu")
    with pytest.raises(PlacerError, match="search policy"):
        place_once("annealing", graph, machine, SimulatorMeasurer(graph, machine))


def test_place_once__learned_policy_needs_a_budget():
    from measurers.sim.measurer import SimulatorMeasurer

    graph, machine = build_graph([(0, 1)]), load_machine("paper-2gpu")
    with pytest.raises(PlacerError, match="learned policy"):
        place_once("ppo", graph, machine, SimulatorMeasurer(graph, machine))


@pytest.fixture(scope="module")
def small():
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from graphs.registry import load_graph

    graph, machine = load_graph("synthetic:120"), load_machine("paper-2gpu")
    return make_problem(graph, machine, max_groups=8), SimulatorMeasurer(graph, machine)


@pytest.mark.parametrize("name, options, message", [
    ("random", {"batch_size": 0}, "random: batch_size must be a whole number >= 1, got 0"),
    ("cem", {"smoothing": float("nan")}, "cem: smoothing must be a finite number in \\(0, 1\\]"),
    ("cem", {"elite_fraction": 0.0}, "cem: elite_fraction"),
    ("cem", {"batch_size": 2.5}, "cem: batch_size must be a whole number"),
    ("annealing", {"chains": 0}, "annealing: chains"),
    ("annealing", {"start_temperature": -1}, "annealing: start_temperature must be a finite number > 0"),
    ("exact", {"work_limit": -1}, "exact: work_limit must be a positive finite number"),
    ("cem", {"nonsense": 1}, "policy 'cem': got an unexpected keyword argument 'nonsense'"),
    ("device:1", {"nonsense": 1}, "policy 'device:1': got an unexpected keyword argument 'nonsense'"),
    ("reinforce", {"nonsense": 1}, "policy 'reinforce' takes no option 'nonsense'"),
    ("hierarchical", {"nonsense": 1}, "policy 'hierarchical' takes no option 'nonsense'"),
])
def test_place__bad_options_are_one_error_naming_them(small, name, options, message):
    """Before any measurement: a search that would quietly search less, or a crash from deep inside."""
    problem, measurer = small
    with pytest.raises(PlacerError, match=message):
        place(name, problem, measurer, 8, 0, **options)


@pytest.mark.parametrize("budget, seed, message", [
    (2.5, 0, "budget of a whole number"), (float("nan"), 0, "budget of a whole number"),
    (8, -1, "a seed must be a whole number in 0..4294967295, got -1"), (8, 1.5, "a seed must be a whole number"),
])
def test_place__budget_and_seed_are_whole_numbers(small, budget, seed, message):
    problem, measurer = small
    with pytest.raises(PlacerError, match=message):
        place("random", problem, measurer, budget, seed)


def test_problem__expand_and_collapse_check_what_they_are_given(small):
    problem, _ = small
    units, ops = problem.num_units, problem.graph.num_ops
    assert problem.expand(np.zeros((3, units), dtype=np.int64)).shape == (3, ops)
    for bad, message in [(np.zeros(units + 1, dtype=int), "expected 8 entries"),
                         (np.full(units, 0.7), "integer device indices"),
                         (np.full(units, 7), "names device 7, but the machine has devices 0..2"),
                         (np.full(units, -1), "names device -1")]:
        with pytest.raises(PlacerError, match=message):
            problem.expand(bad)
    with pytest.raises(PlacerError, match="op placement must hold integer device indices"):
        problem.collapse(np.full(ops, 1.7))
    with pytest.raises(PlacerError, match="op placement names device 9"):
        problem.collapse(np.full(ops, 9))


def test_problem__collapse_takes_the_majority_among_the_devices_a_unit_may_use():
    """A unit of three ops on a GPU and one CPU-only op on the CPU collapsed to the GPU; its expansion put the
    CPU-only op there, and a graph-neural teacher's warm start was refused for it (a review)."""
    from policies.problem import make_problem

    graph = build_graph([(0, 1, 100), (1, 2, 100), (2, 3, 100)], 4, kinds=["AddV2"] * 4, allowed_mask=[3, 3, 3, 1])
    machine = load_machine("paper-2gpu")
    problem = make_problem(graph, machine, max_groups=1)
    cpu, gpu = machine.indices_of_kind("cpu")[0], machine.indices_of_kind("gpu")[0]
    assert problem.num_units == 1 and problem.unit_allowed[0].tolist() == [True, False, False]
    units = problem.collapse(np.array([gpu, gpu, gpu, cpu]))
    assert units.tolist() == [cpu] and problem.op_allowed[np.arange(4), problem.expand(units)].all()
    two = make_problem(graph, machine)  # colocation units: one op each, the collapse is the placement itself
    assert two.collapse(np.array([gpu, gpu, gpu, cpu])).tolist() == [gpu, gpu, gpu, cpu]


def test_make_problem__names_and_empty_graphs_are_refused():
    from policies.problem import make_problem

    with pytest.raises(PlacerError, match="make_problem needs an OpGraph and a Machine .* got str and Machine"):
        make_problem("synthetic:120", load_machine("paper-2gpu"))
    with pytest.raises(PlacerError, match="graph 'empty' has no ops"):  # refused as the graph is made (or read)
        build_graph([], 0, name="empty")
