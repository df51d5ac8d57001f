"""One contract every registered policy keeps, learned ones included, run as every command runs them
(policies.registry.place): within budget, every measurement reported, a valid placement whose
measurement is the one returned, colocation groups kept, and the same seed gives the same placement."""

from __future__ import annotations

import numpy as np
import pytest

from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
from policies.problem import make_problem
from policies.registry import POLICIES, place, policy_entry

LEARNER_OPTIONS = {"batch_size": 4, "hidden_size": 16, "torch_threads": 1}
# reproducible: CP-SAT on one worker with a deterministic-time limit (HiGHS's solves stop on wall time, so
# under load a run can differ in how many solves finish; tests/policies/test_exact_relaxed.py covers it)
EXACT_OPTIONS = {"time_limit_s": 30.0, "num_workers": 1, "work_limit": 1.0, "solver": "cpsat"}
SEARCH_BUDGET = 8


def policy_options(name: str) -> dict:
    return LEARNER_OPTIONS if policy_entry(name).learned else EXACT_OPTIONS if name == "exact" else {}


@pytest.fixture(scope="module")
def problem():
    from graphs.registry import load_graph

    graph = load_graph("nmt-2")  # every policy applies to it, the expert's rule included
    return make_problem(graph, load_machine("paper-2gpu"), max_groups=8)


class CountingMeasurer:
    def __init__(self, measurer):
        self.measurer, self.measured = measurer, 0

    def measure(self, placements):
        self.measured += len(placements)
        return self.measurer.measure(placements)


def run(name: str, problem, seed: int = 0):
    entry = policy_entry(name)
    budget = 1 if entry.kind == "heuristic" else SEARCH_BUDGET
    measurer = CountingMeasurer(SimulatorMeasurer(problem.graph, problem.machine))
    seen = []
    result = place(name, problem, measurer, budget, seed, lambda p, m: seen.append(m), **policy_options(name))
    return result, measurer, seen, budget


@pytest.mark.parametrize("name", [*POLICIES, "device:1"])
def test_policy_contract__budget_placement_and_measurement(name, problem):
    result, measurer, seen, budget = run(name, problem)
    graph = problem.graph
    assert 1 <= measurer.measured <= budget
    assert result.measurements == measurer.measured == len(seen)
    placement = result.op_placement
    assert placement.shape == (graph.num_ops,) and placement.dtype == np.int64
    allowed = (graph.allowed_mask & problem.machine.kind_bits[placement]) != 0
    assert allowed.all()
    for group in np.unique(graph.colocation_ids):  # a colocation group never split
        assert len(set(placement[graph.colocation_ids == group].tolist())) == 1
    if policy_entry(name).places_groups:
        assert np.array_equal(problem.expand(result.group_placement), placement)
    again = SimulatorMeasurer(graph, problem.machine).measure([placement])[0]
    assert again.status == result.best.status and again.runtime_s == pytest.approx(result.best.runtime_s)
    assert result.placement_time_s >= 0


@pytest.mark.parametrize("name", [*POLICIES, "device:1"])
def test_policy_contract__same_seed_same_placement(name, problem):
    first, second = run(name, problem, seed=3)[0], run(name, problem, seed=3)[0]
    assert np.array_equal(first.op_placement, second.op_placement)


# -- ops restricted to one device kind, and what on_measurement is shown ---------------------------------------

def restricted(graph):
    """The graph with its inputs (and their colocation groups) CPU-only and its softmax ops GPU-only, as a
    user's graph file may say: zero-cost sources that may not follow their consumer to a GPU."""
    import dataclasses

    from graphs.opgraph import kind_bit

    inputs = np.isin(graph.colocation_ids, graph.colocation_ids[graph.op_kinds == "Input"])
    softmax = np.array([scope.startswith("softmax") for scope in graph.scopes]) & ~inputs
    mask = graph.allowed_mask.copy()
    mask[inputs], mask[softmax] = kind_bit("cpu"), kind_bit("gpu")
    return dataclasses.replace(graph, allowed_mask=mask)


@pytest.fixture(scope="module")
def restricted_problem(problem):
    return make_problem(restricted(problem.graph), problem.machine, max_groups=8)


class RecordingMeasurer:
    def __init__(self, measurer):
        self.measurer, self.placements, self.results = measurer, [], []

    def measure(self, placements):
        results = self.measurer.measure(placements)
        self.placements += [np.array(p, copy=True) for p in placements]
        self.results += results
        return results


@pytest.mark.parametrize("name", [*POLICIES, "device:0", "device:1"])
def test_policy_contract__restricted_ops_stay_on_their_kinds_and_every_measurement_is_reported(name,
                                                                                             restricted_problem):
    problem, graph = restricted_problem, restricted_problem.graph
    assert (graph.allowed_mask == 1).sum() > 0 and (graph.allowed_mask == 2).sum() > 0
    entry = policy_entry(name)
    budget = 1 if entry.kind == "heuristic" else SEARCH_BUDGET
    measurer = RecordingMeasurer(SimulatorMeasurer(graph, problem.machine))
    seen = []
    result = place(name, problem, measurer, budget, 1, lambda p, m: seen.append((np.array(p, copy=True), m)),
                   **policy_options(name))
    placement = result.op_placement
    bad = np.flatnonzero((graph.allowed_mask & problem.machine.kind_bits[placement]) == 0)
    assert not len(bad), f"{len(bad)} ops on a kind they may not use, e.g. {graph.op_names[bad[0]]!r}"
    assert result.best.ok, result.best.error
    for group in np.unique(graph.colocation_ids):
        assert len(set(placement[graph.colocation_ids == group].tolist())) == 1
    # on_measurement: called once per measurement, with the placement measured and its measurement
    assert len(seen) == len(measurer.placements) == result.measurements <= budget
    for (shown, shown_measurement), measured, measurement in zip(seen, measurer.placements, measurer.results):
        assert np.array_equal(shown, measured) and shown_measurement is measurement
    assert any(np.array_equal(placement, p) for p in measurer.placements)  # the answer was measured


def test_policy_contract__expert_names_the_graph_it_has_no_rule_for():
    from graphs.errors import PlacerError
    from graphs.registry import load_graph

    graph = load_graph("synthetic:300")
    problem = make_problem(graph, load_machine("paper-2gpu"), max_groups=8)
    with pytest.raises(PlacerError, match=f"no expert rule for graph {graph.name!r}"):
        place("expert", problem, SimulatorMeasurer(graph, problem.machine), 1, 0)


# -- the same seed in another process: Python's hash seed and the graph cache play no part ----------------------

_PLACE_ALL = """
import hashlib, sys
sys.path.insert(0, {folder!r})
import test_policy_contract as contract
from graphs.registry import load_graph
graph = load_graph("nmt-2")
problem = contract.make_problem(graph, contract.load_machine("paper-2gpu"), max_groups=8)
print("graph", graph.content_hash)
for name in contract.POLICIES:
    result = contract.run(name, problem, seed=3)[0]
    print(name, hashlib.sha256(result.op_placement.tobytes()).hexdigest(), result.best.runtime_s.hex())
"""


def test_policy_contract__same_seed_same_placement_in_processes_with_other_hash_seeds(tmp_path):
    """Every policy places alike in two fresh processes whose str hashes differ (PYTHONHASHSEED 1 and 2: a set of
    names iterated in hash order would show), the first building the graph, the second reading it from the
    cache. A benchmark's two runs of one command differ only across CPUs (README, Reproducibility)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = _PLACE_ALL.format(folder=str(Path(__file__).resolve().parent))
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PLACER_CACHE": str(tmp_path / "cache")}
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(done.stdout.splitlines())
    assert len(outputs[0]) == 1 + len(POLICIES)
    assert outputs[0] == outputs[1]


def test_measurement_cost__a_failure_that_did_not_overflow_ranks_behind_every_overflow_wherever_reported():
    """A measurer's own error (zero peaks) cost FAILED_COST_S and ranked ahead of every out-of-memory placement,
    while the same failure from the pool (no peaks) cost twice that (a review)."""
    import numpy as np

    from measurers.base import Measurement
    from policies.base import FAILED_COST_S, measurement_cost_s

    capacity = np.array([100, 100], dtype=np.int64)

    def failed(status, peaks):
        return Measurement(float("nan"), (), status, tuple(peaks), 0.0)

    just_over = measurement_cost_s(failed("oom", (101, 0)), capacity)
    assert FAILED_COST_S < just_over < 2 * FAILED_COST_S
    for status, peaks in (("error", (0, 0)), ("error", ()), ("timeout", ()), ("crash", ())):
        assert measurement_cost_s(failed(status, peaks), capacity) == 2 * FAILED_COST_S > just_over
