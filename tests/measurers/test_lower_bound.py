"""The lower bound by hand, and the properties every simulated step must have."""

import numpy as np
import pytest

from graphs.opgraph import OpGraph
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.machine import Device, Link, Machine
from conftest import policy_placement
from measurers.sim.lower_bound import lower_bound_s
from measurers.sim.reference import Simulator

SLACK = 1e-12  # two placements' step times compared: their op times are added in other orders


def two_speed_machine(fast_factor: float) -> Machine:
    """cpu:0 plus gpu:0 (1 TFLOP/s) and gpu:1 (fast_factor times faster in compute and bandwidth)."""
    def gpu(name, factor):
        return Device(name, "gpu", "g", 1e12 * factor, 1e11 * factor, 10**12, 1e-6)

    devices = (Device("cpu:0", "cpu", "c", 1e11, 1e10, 10**12, 1e-6), gpu("gpu:0", 1.0), gpu("gpu:1", fast_factor))
    links = tuple(Link(a.name, b.name, 1e10, 1e-5, "bus") for a in devices for b in devices if a is not b)
    return Machine("two-speed", devices, links)


def test_lower_bound__critical_path_or_work_by_hand():
    # a -> b -> c chain of 1 s, 2 s, 3 s on a GPU plus a free-standing d of 6 s: path 6 s, work 12 s / 3 devices = 4 s
    flops = np.array([1.0, 2.0, 3.0, 6.0]) * 1e9
    graph = OpGraph(name="lb", framework="manual", op_names=np.array(list("abcd"), dtype=object),
                    op_kinds=np.array(["MatMul"] * 4, dtype=object), flops=flops, bytes_accessed=np.zeros(4),
                    out_bytes=np.zeros(4, dtype=np.int64), param_bytes=np.zeros(4, dtype=np.int64),
                    edge_src=np.array([0, 1]), edge_dst=np.array([1, 2]), edge_bytes=np.array([8, 8]))
    devices = (Device("cpu:0", "cpu", "c", 0.5e9, 1e12, 10**9, 0.0), Device("gpu:0", "gpu", "g", 1e9, 1e12, 10**9, 0.0),
               Device("gpu:1", "gpu", "g", 1e9, 1e12, 10**9, 0.0))
    machine = Machine("m", devices, tuple(Link(a.name, b.name, 1e9, 0.0, "x") for a in devices for b in devices
                                          if a is not b))
    assert lower_bound_s(graph, machine) == 6.0
    assert Simulator(graph, machine).lower_bound_s == 6.0
    assert lower_bound_s(graph, Machine("one", devices[1:2], ())) == pytest.approx(12.0, rel=1e-15)  # all the work


@pytest.mark.parametrize("machine_name", ["paper-2gpu", "paper-4gpu", "dgx1-v100", "h200x8"])
def test_step_time__never_below_the_lower_bound(machine_name):
    machine = load_machine(machine_name)
    rng = np.random.default_rng(3)
    for seed in range(4):
        graph = synthetic_graph(int(rng.integers(1, 3000)), seed)
        simulator = Simulator(graph, machine)
        bound = simulator.lower_bound_s
        placements = [policy_placement(graph, machine, p) for p in ("single-gpu", "cpu-only", "round-robin")]
        placements += list(rng.integers(0, machine.num_devices, size=(5, graph.num_ops)))
        for result in simulator.run_batch(placements):
            assert result.runtime_s >= bound  # no slack: the bound allows for the clock's rounding


def test_lower_bound__below_a_step_whose_clock_rounded_every_addition_down():
    """100,000 independent ops of 1e-5 s on one GPU: the simulator's clock ends at 0.99999999999808 s, and
    the work term was 1.0, above it."""
    n = 100_000
    graph = OpGraph(name="flat", framework="manual", op_names=np.array([f"o{i}" for i in range(n)], dtype=object),
                    op_kinds=np.array(["MatMul"] * n, dtype=object), flops=np.full(n, 1e4), bytes_accessed=np.zeros(n),
                    out_bytes=np.zeros(n, dtype=np.int64), param_bytes=np.zeros(n, dtype=np.int64),
                    edge_src=np.zeros(0, np.int64), edge_dst=np.zeros(0, np.int64), edge_bytes=np.zeros(0, np.int64))
    machine = Machine("one", (Device("gpu:0", "gpu", "x", 1e9, 1e12, 10**10, 0.0),), ())
    simulator = Simulator(graph, machine)
    step_s = simulator.run(np.zeros(n, dtype=np.int64)).runtime_s
    assert step_s < 1.0  # the clock's rounding
    assert simulator.lower_bound_s <= step_s and simulator.lower_bound_s == pytest.approx(1.0, rel=1e-10)


@pytest.mark.parametrize("seed", range(5))
def test_all_on_one_device__no_transfer_and_step_is_its_busy_time(seed):
    graph = synthetic_graph(1000 + 200 * seed, seed)
    machine = load_machine("dgx1-v100")
    simulator = Simulator(graph, machine)
    for device in range(machine.num_devices):
        result = simulator.run(np.full(graph.num_ops, device), timeline=True)
        assert result.link_bytes.sum() == 0 and len(result.timeline.transfer_op) == 0
        assert result.runtime_s == pytest.approx(result.busy_s[device], rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_faster_device__never_slower_for_single_device_placements(seed):
    graph = synthetic_graph(800, seed)
    for factor in (1.0, 1.5, 4.0):
        simulator = Simulator(graph, two_speed_machine(factor))
        slow = simulator.run(np.full(graph.num_ops, 1)).runtime_s
        fast = simulator.run(np.full(graph.num_ops, 2)).runtime_s
        assert fast <= slow * (1 + SLACK)
        if factor > 1:
            assert fast < slow


@pytest.mark.parametrize("long_branch", [1, 2])
def test_lower_bound__critical_path_takes_the_latest_predecessor_not_the_last_listed(long_branch):
    """Diamond a(1 s) -> {b, c} -> d(1 s), one branch 5 s and the other 1 s, on four GPUs (work 8 s / 4 = 2 s
    does not bind): the bound is the path a, long branch, d = 7 s whichever of d's predecessors is listed last.
    6 s would mean d started when its last-listed predecessor finished, not the latest one."""
    seconds = [1.0, 1.0, 1.0, 1.0]
    seconds[long_branch] = 5.0
    graph = OpGraph(name="diamond", framework="manual", op_names=np.array(list("abcd"), dtype=object),
                    op_kinds=np.array(["MatMul"] * 4, dtype=object), flops=np.array(seconds) * 1e9,
                    bytes_accessed=np.zeros(4), out_bytes=np.zeros(4, dtype=np.int64),
                    param_bytes=np.zeros(4, dtype=np.int64), edge_src=np.array([0, 0, 1, 2]),
                    edge_dst=np.array([1, 2, 3, 3]), edge_bytes=np.array([8, 8, 8, 8]))
    devices = tuple(Device(f"gpu:{i}", "gpu", "g", 1e9, 1e12, 10**9, 0.0) for i in range(4))
    machine = Machine("m", devices, tuple(Link(a.name, b.name, 1e9, 0.0, "x") for a in devices for b in devices
                                          if a is not b))
    assert lower_bound_s(graph, machine) == 7.0
    assert Simulator(graph, machine).lower_bound_s == 7.0
