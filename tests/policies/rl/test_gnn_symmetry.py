"""Alike devices (policies/rl/gnn/symmetry.py): the machine's automorphisms keep every link, a placement
and any relabeling of it under them share one canonical form, and the simulator runs both alike."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.sim.links import link_table
from measurers.sim.measurer import SimulatorMeasurer
from policies.problem import make_problem
from policies.rl.gnn.symmetry import canonical_placement, device_automorphisms


def _link_matrices(machine):
    table = link_table(machine)
    has = table.link_of >= 0
    link = np.maximum(table.link_of, 0)
    return (np.where(has, table.bandwidth_Bps[link], 0.0), np.where(has, table.latency_s[link], 0.0))


@pytest.mark.parametrize("machine, count", [("paper-2gpu", 2), ("paper-4gpu", 8), ("paper-8gpu", 384)])
def test_automorphisms_keep_every_link(machine, count):
    m = load_machine(machine)
    autos = device_automorphisms(m)
    d = m.num_devices
    assert autos.shape == (count, d) and autos.dtype == np.int64
    np.testing.assert_array_equal(autos[0], np.arange(d))
    assert len({tuple(p) for p in autos}) == count  # distinct
    bandwidth, latency = _link_matrices(m)
    channel = link_table(m).channel_of  # (D, D)
    for p in autos:
        assert sorted(p) == list(range(d))
        assert all(m.devices[i].kind == m.devices[p[i]].kind for i in range(d))
        assert p[0] == 0  # the one CPU stays put
        np.testing.assert_array_equal(bandwidth[np.ix_(p, p)], bandwidth)
        np.testing.assert_array_equal(latency[np.ix_(p, p)], latency)
        assert _channels(channel, p) == _channels(channel, np.arange(d))


def _channels(channel: np.ndarray, p: np.ndarray) -> set[frozenset]:
    """The links sharing each channel, as (p[i], p[j]) pairs: the channel partition after relabeling by p."""
    members: dict[int, set] = {}
    for (i, j), c in np.ndenumerate(channel):
        if c >= 0:
            members.setdefault(int(c), set()).add((int(p[i]), int(p[j])))
    return {frozenset(v) for v in members.values()}


def test_swapping_gpus_of_different_boards_is_not_an_automorphism():
    autos = {tuple(p) for p in device_automorphisms(load_machine("paper-4gpu"))}
    assert (0, 1, 3, 2, 4) not in autos  # gpu 2 and 3 sit on different boards (channels)
    assert (0, 2, 1, 3, 4) in autos and (0, 3, 4, 1, 2) in autos


def test_automorphisms_form_a_group():
    autos = device_automorphisms(load_machine("paper-4gpu"))
    found = {tuple(p) for p in autos}
    for p in autos:
        assert tuple(np.argsort(p)) in found  # inverse
        for q in autos[:6]:
            assert tuple(q[p]) in found  # composition


def test_canonical_form_is_shared_by_every_relabeling():
    machine = load_machine("paper-4gpu")
    autos = device_automorphisms(machine)
    rng = np.random.default_rng(0)
    position, weight = rng.random(12), rng.random(12) + 0.1
    for _ in range(5):
        units = rng.integers(0, machine.num_devices, 12)
        canonical = canonical_placement(units, position, weight, autos)
        assert tuple(canonical) in {tuple(p[units]) for p in autos}  # a relabeling of units
        for p in autos:
            np.testing.assert_array_equal(canonical_placement(p[units], position, weight, autos), canonical)
        scores = [float((p[units] * weight * position).sum()) for p in autos]
        assert float((canonical * weight * position).sum()) == pytest.approx(max(scores))


def test_canonical_form_puts_late_work_on_high_indices():
    autos = device_automorphisms(load_machine("paper-2gpu"))  # identity and swapping gpu 1 and 2
    units = np.array([2, 1, 0])
    weight = np.ones(3)
    np.testing.assert_array_equal(canonical_placement(units, np.array([0.0, 0.5, 1.0]), weight, autos), [1, 2, 0])
    np.testing.assert_array_equal(canonical_placement(units, np.array([0.5, 0.0, 1.0]), weight, autos), [2, 1, 0])
    # a tie (no position told apart) is broken by reading the groups in order: smallest first
    np.testing.assert_array_equal(canonical_placement(units, np.zeros(3), weight, autos), [1, 2, 0])


def test_canonical_placement_runs_as_fast_on_the_simulator():
    graph, machine = load_graph("synthetic:200"), load_machine("paper-4gpu")
    problem = make_problem(graph, machine, max_groups=8)
    autos = device_automorphisms(machine)
    measurer = SimulatorMeasurer(graph, machine)
    rng = np.random.default_rng(1)
    position, weight = np.linspace(0, 1, problem.num_units), np.ones(problem.num_units)
    placements = []
    for _ in range(3):
        units = rng.integers(1, machine.num_devices, problem.num_units)  # GPUs only
        placements += [units, canonical_placement(units, position, weight, autos), autos[5][units]]
    results = measurer.measure([problem.expand(u) for u in placements])
    assert all(r.ok for r in results)
    runtimes = np.array([r.runtime_s for r in results]).reshape(3, 3)
    # alike up to the order the simulator breaks ties between events in (device index): < 2%
    np.testing.assert_allclose(runtimes, runtimes[:, :1].repeat(3, axis=1), rtol=2e-2)
    assert len(set(np.round(runtimes[:, 0], 12))) > 1  # the three placements differ


def test_gpus_of_one_model_with_other_figures_are_not_alike():
    """A machine file may give one of two GPUs of a model its own peak_flops: the swap was an automorphism
    ("changes nothing the simulator sees") while a placement ran 3 s on one GPU and 6 s on the other."""
    import dataclasses

    machine = load_machine("paper-2gpu")
    assert len(device_automorphisms(machine)) == 2
    slow = dataclasses.replace(machine.devices[2], peak_flops=machine.devices[2].peak_flops / 2)
    assert slow.model == machine.devices[1].model
    uneven = dataclasses.replace(machine, devices=(*machine.devices[:2], slow))
    np.testing.assert_array_equal(device_automorphisms(uneven), [np.arange(3)])
