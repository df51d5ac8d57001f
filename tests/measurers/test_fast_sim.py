"""Differential test: the compiled engine against the reference on many graphs, machines and placements."""

import numpy as np
import pytest

from graphs.opgraph import OpGraph
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.machine import Device, Link, Machine
from conftest import policy_placement
from measurers.sim.reference import Simulator


def tie_heavy_graph(rng: np.random.Generator, n: int) -> OpGraph:
    """A random DAG whose op times are whole seconds or zero and whose tensors are whole GB, so many events
    happen at the same instant: the hardest case for two engines to agree on."""
    kinds = rng.choice(["MatMul", "Identity", "Variable", "AddV2"], size=n, p=[0.6, 0.15, 0.1, 0.15])
    src = rng.integers(0, n, size=3 * n)
    dst = rng.integers(0, n, size=3 * n)
    keep = src < dst
    return OpGraph(
        name="ties", framework="manual", op_names=np.array([f"t{i}" for i in range(n)], dtype=object),
        op_kinds=kinds.astype(object), flops=rng.integers(0, 3, size=n) * 1e9, bytes_accessed=np.zeros(n),
        out_bytes=rng.integers(0, 4, size=n) * 10**9, param_bytes=np.where(kinds == "Variable", 5 * 10**8, 0),
        edge_src=src[keep], edge_dst=dst[keep], edge_bytes=rng.integers(0, 3, size=int(keep.sum())) * 10**9)


def round_machine(num_gpus: int, shared: bool) -> Machine:
    devices = [Device("cpu:0", "cpu", "r", 0.5e9, 1e12, 10**10, 0.0)]
    devices += [Device(f"gpu:{i}", "gpu", "r", 1e9, 1e12, 4 * 10**9, 0.0) for i in range(num_gpus)]
    links = [Link(a.name, b.name, 1e9, 0.0, "bus" if shared else f"{a.name}>{b.name}")
             for a in devices for b in devices if a is not b]
    return Machine("round", tuple(devices), tuple(links))


def assert_same(graph, machine, placements):
    reference = Simulator(graph, machine, engine="reference")
    fast = Simulator(graph, machine, engine="fast")
    for placement in placements:
        a, b = reference.run(placement, timeline=True), fast.run(placement, timeline=True)
        assert a.runtime_s == b.runtime_s
        assert a.status == b.status
        for key in ("busy_s", "peak_bytes", "capacity_bytes", "link_bytes"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key
        for key in a.timeline.__dataclass_fields__:
            assert np.array_equal(getattr(a.timeline, key), getattr(b.timeline, key)), key


@pytest.mark.parametrize("seed", range(12))
def test_fast_equals_reference__tie_heavy_random_dags(seed):
    rng = np.random.default_rng(seed)
    graph = tie_heavy_graph(rng, int(rng.integers(2, 60)))
    for machine in (round_machine(2, shared=True), round_machine(3, shared=False)):
        placements = [rng.integers(0, machine.num_devices, size=graph.num_ops) for _ in range(6)]
        assert_same(graph, machine, placements)


@pytest.mark.parametrize("machine_name", ["paper-2gpu", "paper-4gpu", "dgx1-v100", "h200x8"])
def test_fast_equals_reference__synthetic_graphs_on_catalog_machines(machine_name):
    machine = load_machine(machine_name)
    rng = np.random.default_rng(len(machine_name))
    for num_ops, seed in ((1, 0), (7, 1), (300, 2), (2000, 3)):
        graph = synthetic_graph(num_ops, seed)
        placements = [policy_placement(graph, machine, policy) for policy in ("single-gpu", "cpu-only", "round-robin")]
        placements += [rng.integers(0, machine.num_devices, size=num_ops) for _ in range(3)]
        gpus = machine.indices_of_kind("gpu")
        placements.append(np.array(gpus)[rng.integers(0, 2, size=num_ops)])  # two GPUs: contention on links
        assert_same(graph, machine, placements)


def test_fast_equals_reference__statuses_include_oom():
    graph = synthetic_graph(20000, 5)  # 12.7 GB of parameters: more than one K80 die holds
    machine = load_machine("paper-2gpu")
    placements = [policy_placement(graph, machine, p) for p in ("single-gpu", "round-robin")]
    assert [Simulator(graph, machine).run(p).status for p in placements] == ["oom", "ok"]
    assert_same(graph, machine, placements)


def test_run_batch__same_results_as_single_runs():
    graph = synthetic_graph(500, 9)
    machine = load_machine("paper-4gpu")
    rng = np.random.default_rng(0)
    placements = rng.integers(0, machine.num_devices, size=(8, graph.num_ops))
    simulator = Simulator(graph, machine)
    batch = simulator.run_batch(placements)
    assert [r.runtime_s for r in batch] == [simulator.run(p).runtime_s for p in placements]
    assert len({r.runtime_s for r in batch}) > 1


@pytest.mark.parametrize("batch, message", [
    ([[0, 1, 0], [0, 1]], r"must be a \(B, 3\) batch: setting an array element"),  # ragged: was numpy's ValueError
    (None, r"must be a \(B, 3\) batch, got shape \(\)"),  # was a TypeError
    ([0, 1, 0], r"must be a \(B, 3\) batch, got shape \(3,\)"),
])
def test_run_batch__a_batch_of_the_wrong_shape_is_one_error(batch, message):
    from graphs.errors import PlacerError

    simulator = Simulator(synthetic_graph(3, 0), load_machine("paper-2gpu"))
    with pytest.raises(PlacerError, match=message):
        simulator.run_batch(batch)
    assert simulator.run_batch([]) == [] and len(simulator.run_batch([[0, 1, 0]])) == 1


CTRL_C_IN_A_SIMULATION_LOOP = """
import os, signal, threading
import numpy as np
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.sim.reference import Simulator

graph = synthetic_graph(300, seed=0)
sim = Simulator(graph, load_machine("paper-2gpu"), engine="fast")
placements = np.random.default_rng(0).integers(0, 3, size=(16, graph.num_ops))
sim.run(placements[0])  # compiled (or loaded from numba's cache) before the clock starts
for delay_s in (0.05, 0.11, 0.17, 0.23, 0.29, 0.31, 0.37, 0.43):
    threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        k = 0
        while True:
            sim.run(placements[k % 16])
            k += 1
    except BaseException as exc:
        print(type(exc).__name__)
"""


def test_fast_engine__ctrl_c_mid_simulation_is_a_keyboard_interrupt_not_a_system_error(tmp_path):
    """A Ctrl-C that landed while the compiled engine called back into Python (numba's ``_numba_unpickle``)
    came out as SystemError("... returned a result with an exception set"): 6 of 8 Ctrl-Cs in such a loop, and
    `placer baselines` then crashed with a traceback instead of stopping as Ctrl-C stops it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-c", CTRL_C_IN_A_SIMULATION_LOOP], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["KeyboardInterrupt"] * 8
