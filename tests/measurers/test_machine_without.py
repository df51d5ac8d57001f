"""Machine.without_devices: a device leaves a running search; the rest of the machine stays as it was."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.errors import PlacerError
from measurers.catalog import load_machine


def test_without_devices__drops_the_device_and_every_link_touching_it():
    machine = load_machine("paper-4gpu")
    reduced = machine.without_devices(["gpu:1"])
    assert reduced.name == "paper-4gpu-without-gpu:1"
    assert [d.name for d in reduced.devices] == ["cpu:0", "gpu:0", "gpu:2", "gpu:3"]
    assert all("gpu:1" not in (link.src, link.dst) for link in reduced.links)
    kept_links = [link for link in machine.links if "gpu:1" not in (link.src, link.dst)]
    assert list(reduced.links) == kept_links  # the others unchanged, in order
    assert reduced.device_index("gpu:2") == 2 and reduced.devices[2] == machine.devices[3]


def test_kept_device_indices__map_reduced_indices_back_to_the_machine():
    machine = load_machine("paper-4gpu")
    kept = machine.kept_device_indices(["gpu:0", "gpu:2"])  # (D',)
    assert kept.dtype == np.int64 and kept.tolist() == [0, 2, 4]
    reduced = machine.without_devices(["gpu:2", "gpu:0"])  # the order of names does not matter
    assert reduced.name == "paper-4gpu-without-gpu:0-gpu:2"
    assert [machine.devices[i] for i in kept] == list(reduced.devices)


def test_without_devices__unknown_device_names_it_and_lists_the_devices():
    with pytest.raises(PlacerError, match=r"no device 'gpu:7' \(devices: cpu:0, gpu:0, gpu:1\)"):
        load_machine("paper-2gpu").without_devices(["gpu:7"])


def test_without_devices__removing_every_device_is_refused():
    machine = load_machine("paper-2gpu")
    with pytest.raises(PlacerError, match="cannot remove the last device"):
        machine.without_devices(["cpu:0", "gpu:0", "gpu:1"])
    assert machine.without_devices(["cpu:0", "gpu:0"]).num_devices == 1


def test_without_devices__simulator_times_a_placement_as_the_full_machine_does():
    """A placement that never uses the removed device: the reduced machine's step time equals the full
    machine's (no link of the removed device carries anything), and so do the other devices' peaks."""
    from graphs.registry import load_graph
    from measurers.sim.measurer import SimulatorMeasurer

    graph, machine = load_graph("synthetic:300"), load_machine("paper-4gpu")
    reduced, kept = machine.without_devices(["gpu:1"]), machine.kept_device_indices(["gpu:1"])
    placements = np.random.default_rng(0).integers(0, reduced.num_devices, (4, graph.num_ops))  # (B, N)
    on_reduced = SimulatorMeasurer(graph, reduced).measure(list(placements))
    on_full = SimulatorMeasurer(graph, machine).measure([kept[p] for p in placements])
    for small, full in zip(on_reduced, on_full):
        assert small.ok and full.ok
        assert full.runtime_s == pytest.approx(small.runtime_s, rel=1e-12)
        assert np.array(full.peak_bytes)[kept].tolist() == list(small.peak_bytes)
        assert full.peak_bytes[2] == 0
