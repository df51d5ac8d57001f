"""The placement summary on a five-op graph a reader can check by hand."""

import dataclasses

import numpy as np

from cluster.placement_summary import Transfers, summarize_placement, transfers_per_step
from measurers.machine import Device, Link, Machine


def two_devices() -> Machine:
    devices = tuple(Device(f"d{i}", "cpu", "test-cpu", 1e11, 1e10, 2**30, 1e-6) for i in range(2))
    return Machine("two", devices, (Link("d0", "d1", 1e9, 0.0, "a"), Link("d1", "d0", 1e9, 0.0, "b")))


def tiny(make_graph):
    """op0 fc1 weight -> op1 fc1 matmul -> op2 relu (top level) -> op3 fc2 matmul <- op4 fc2 weight, and
    op1 -> op3 directly (two edges of one producer to one consumer device: one transfer, of the larger)."""
    return make_graph([(0, 1, 8), (1, 2, 16), (1, 3, 32), (2, 3, 16), (4, 3, 8)],
                      flops=[0, 1000, 0, 500, 0], param_bytes=[100, 0, 0, 0, 40],
                      scopes=np.array(["fc1", "fc1", "", "fc2.inner", "fc2"], dtype=object))


def test_transfers_per_step__one_per_producer_and_destination_device_of_its_largest_edge(make_graph):
    graph = tiny(make_graph)
    assert transfers_per_step(graph, np.array([0, 0, 1, 1, 1])) == Transfers(1, 32)  # op1 -> d1 once, 32 bytes
    assert transfers_per_step(graph, np.array([0, 0, 1, 1, 0])) == Transfers(2, 40)  # and op4 -> d1, 8 bytes
    assert transfers_per_step(graph, np.zeros(5, dtype=np.int64)) == Transfers(0, 0)


def test_summarize_placement__devices_scopes_and_modules(make_graph):
    graph = tiny(make_graph)
    summary = summarize_placement(graph, two_devices(), np.array([0, 0, 1, 1, 0]), scope_depth=1)
    assert [(d.device, d.ops, d.param_bytes, d.flops) for d in summary.devices] == [
        ("d0", 3, 140, 1000.0), ("d1", 2, 0, 500.0)]
    assert [(s.scope, s.ops_per_device, s.param_bytes) for s in summary.scopes] == [
        ("fc1", {"d0": 2}, 100), ("(top level)", {"d1": 1}, 0), ("fc2", {"d0": 1, "d1": 1}, 40)]
    # fc2's weight lives on d0 (parameters decide); fc2.inner has no parameters, its FLOPs run on d1
    assert summary.modules == {"fc1": "d0", "fc2.inner": "d1", "fc2": "d0"}
    assert list(summary.modules) == ["fc1", "fc2", "fc2.inner"]  # parents first: applied in order, children win
    assert summary.split_modules == ()  # each full scope runs on one device
    assert summary.to_json()["transfers"] == {"count": 2, "total_bytes": 40}


def test_summarize_placement__the_torch_loss_functions_own_ops_are_no_module(make_graph):
    """The torch importer puts the ops a loss function runs itself under scope "loss"; the model has no such
    module, so `model.get_submodule("loss")` would fail on the map."""
    scopes = np.array(["fc1", "fc1", "", "fc2.inner", "loss"], dtype=object)
    graph = make_graph([(0, 1, 8), (1, 2, 16), (2, 3, 16), (3, 4, 8)], flops=[0, 1000, 0, 500, 10],
                       param_bytes=[100, 0, 0, 0, 0], scopes=scopes)
    machine = two_devices()
    placement = np.array([0, 0, 1, 1, 1])
    assert "loss" in summarize_placement(graph, machine, placement).modules  # another framework's scope
    torch_graph = dataclasses.replace(graph, framework="torch")
    assert summarize_placement(torch_graph, machine, placement).modules == {"fc1": "d0", "fc2.inner": "d1"}
