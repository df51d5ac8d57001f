"""The list schedulers (m-ETF, m-SCT, HEFT) time transfers as the simulator does (issue 16): one transfer per
(producer, destination device), on its link's channel, one at a time per channel."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.errors import PlacerError
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.machine import Device, Link, Machine
from measurers.sim.reference import Simulator
from policies.baechi import EtfScheduler, favourite_children
from policies.heft import heft_schedule
from policies.listsched import TransferBook
from policies.problem import make_problem
from conftest import build_graph

SCHEDULERS = ("m-etf", "m-sct", "heft")
BUS_BPS = 1e9  # every transfer of the bus machine: 0 latency, 1 GB/s, on one channel
TENTH_S = 1e8  # bytes that take 0.1 s on the bus


def bus_machine(num_gpus: int = 3) -> Machine:
    """GPUs at 1 TFLOP/s with no op overhead, every pair joined by a link on ONE channel ("bus")."""
    gpus = tuple(Device(f"gpu:{i}", "gpu", "test", 1e12, 1e12, 10**12, 0.0) for i in range(num_gpus))
    links = tuple(Link(a.name, b.name, BUS_BPS, 0.0, "bus") for a in gpus for b in gpus if a != b)
    return Machine("bus", gpus, links)


def schedule(problem, name: str) -> tuple[np.ndarray, float]:
    if name == "heft":
        device_of, makespan_s, _ = heft_schedule(problem)
        return device_of, makespan_s
    scheduler = EtfScheduler(problem)
    if name == "m-sct":
        scheduler.favourite_child = favourite_children(problem, scheduler.cand)
    scheduler.run()
    return scheduler.device_of, scheduler.makespan_s


def fork_join_graph():
    """op0 (0.5 s) feeds three 1 s children (0.1 s transfers), which all feed op4 (0.25 s)."""
    edges = [(0, 1, TENTH_S), (0, 2, TENTH_S), (0, 3, TENTH_S), (1, 4, TENTH_S), (2, 4, TENTH_S), (3, 4, TENTH_S)]
    return build_graph(edges, flops=[0.5e12, 1e12, 1e12, 1e12, 0.25e12], kinds=["aten.mm"] * 5)


@pytest.mark.parametrize("name", ("m-etf", "heft"))
def test_scheduler__fork_join_on_one_channel_has_the_hand_computed_makespan(name):
    graph, machine = fork_join_graph(), bus_machine()
    problem = make_problem(graph, machine)
    assert problem.op_time_s[:, 0].tolist() == pytest.approx([0.5, 1.0, 1.0, 1.0, 0.25])
    device_of, makespan_s = schedule(problem, name)
    # the children spread over the three GPUs; op0's two transfers share the bus (0.5-0.6, 0.6-0.7), so the
    # last child runs 0.7-1.7; op4 follows it and waits for two more transfers (1.5-1.6, 1.6-1.7)
    assert len(set(device_of[1:4].tolist())) == 3
    assert makespan_s == pytest.approx(1.95, abs=1e-9)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler__fork_join_on_one_channel_has_the_simulated_makespan_exactly(name):
    # the old fitted line overlapped the transfers: it scheduled 1.95 s for a placement simulated at 2.05 s
    graph, machine = fork_join_graph(), bus_machine()
    device_of, makespan_s = schedule(make_problem(graph, machine), name)
    assert Simulator(graph, machine, engine="reference").run(device_of).runtime_s == pytest.approx(makespan_s, abs=1e-9)


def test_transfer_book__two_transfers_on_one_channel_are_served_one_after_the_other():
    graph, machine = fork_join_graph(), bus_machine()
    problem = make_problem(graph, machine)
    finish_s = np.array([0.5, 0.0, 0.0, 0.0, 0.0])
    device_of = np.array([0, -1, -1, -1, -1])
    book = TransferBook(problem, finish_s, device_of)
    assert book.arrival_s(1, 0) == 0.5  # same device: no transfer
    assert book.arrival_s(1, 1) == pytest.approx(0.6)
    assert book.commit(1, 1) == pytest.approx(0.6)
    assert book.arrival_s(2, 2) == pytest.approx(0.7)  # the old fitted line said 0.6: it ignored the bus
    assert book.arrival_s(2, 1) == pytest.approx(0.6)  # op0's copy on gpu:1 is booked already
    before = book.version
    assert book.arrival_all_s(3).tolist() == pytest.approx([0.5, 0.6, 0.7])
    assert book.version == before  # asking commits nothing


def test_transfer_book__transfers_on_different_channels_overlap():
    machine = load_machine("paper-2gpu")  # host-to-device and device-to-host are separate channels
    graph = build_graph([(0, 2, 10**8), (1, 2, 10**8)], flops=[1e9, 1e9, 1e9], kinds=["aten.mm"] * 3)
    problem = make_problem(graph, machine)
    book = TransferBook(problem, np.zeros(3), np.array([0, 1, -1]))  # op0 on cpu:0, op1 on gpu:0
    links = book.links
    to_gpu1 = [links.transfer_s(src, 2, 10**8) for src in (0, 1)]
    channels = {book.channel_of[0][2], book.channel_of[1][2]}
    if len(channels) == 2:
        assert book.arrival_s(2, 2) == pytest.approx(max(to_gpu1))
    else:
        assert book.arrival_s(2, 2) == pytest.approx(sum(to_gpu1))


def test_transfer_book__one_transfer_per_producer_and_device_for_all_its_consumers_there():
    graph, machine = fork_join_graph(), bus_machine()
    problem = make_problem(graph, machine)
    finish_s = np.array([0.5, 0.0, 0.0, 0.0, 0.0])
    book = TransferBook(problem, finish_s, np.array([0, -1, -1, -1, -1]))
    book.commit(1, 1)
    book.commit(2, 1)  # op0's output is on gpu:1 already
    assert list(book.booked_s) == [(0, 1)]
    assert book.channel_free_s == [pytest.approx(0.6)]


def agreement(name: str, machine: Machine, seeds) -> list[tuple[float, float]]:
    """(scheduled makespan, simulated step) of scheduler ``name`` on synthetic graphs of 300 ops."""
    pairs = []
    for seed in seeds:
        graph = synthetic_graph(300, seed)
        device_of, makespan_s = schedule(make_problem(graph, machine).at_op_level(), name)
        pairs.append((makespan_s, Simulator(graph, machine).run(device_of).runtime_s))
    return pairs


@pytest.mark.parametrize("machine_name", ("bus", "paper-2gpu", "paper-4gpu"))
def test_m_etf__makespan_within_ten_percent_of_the_simulator_on_synthetic_graphs(machine_name):
    machine = bus_machine(4) if machine_name == "bus" else load_machine(machine_name)
    for makespan_s, simulated_s in agreement("m-etf", machine, range(3)):
        assert makespan_s == pytest.approx(simulated_s, rel=0.10)


@pytest.mark.parametrize("name", ("m-sct", "heft"))
def test_m_sct_and_heft__makespan_within_ten_percent_of_the_simulator_on_one_shared_channel(name):
    # (on the paper machines they miss by up to 16% (m-SCT) and 35% (HEFT) on some seeds: BENCHMARKS.md)
    for makespan_s, simulated_s in agreement(name, bus_machine(4), range(3)):
        assert makespan_s == pytest.approx(simulated_s, rel=0.10)


def test_etf__priority_dispatch_still_available_and_unknown_dispatch_refused():
    graph, machine = fork_join_graph(), bus_machine()
    problem = make_problem(graph, machine)
    scheduler = EtfScheduler(problem, dispatch="priority").run()
    assert (scheduler.device_of >= 0).all() and scheduler.makespan_s == pytest.approx(1.95)
    with pytest.raises(PlacerError, match="unknown dispatch"):
        EtfScheduler(problem, dispatch="lifo")


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler__a_machine_of_one_device_has_no_links_and_no_transfers(name):
    graph = fork_join_graph()
    machine = Machine("one", bus_machine(1).devices, ())
    device_of, makespan_s = schedule(make_problem(graph, machine), name)
    assert device_of.tolist() == [0] * 5 and makespan_s == pytest.approx(3.75)
