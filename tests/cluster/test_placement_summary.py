"""The placement summary on a five-op graph a reader can check by hand."""

import dataclasses

import numpy as np
import pytest

from cluster.placement_summary import Transfers, summarize_placement, transfers_per_step
from graphs.errors import PlacerError
from graphs.opgraph import LAYER_SCOPES
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


def test_summarize_placement__a_graph_recording_its_layers_maps_layers_only(make_graph):
    """A Keras graph records its layers: the optimizer's ("adam"), the loss's ("mse") and a bare TF op's
    ("Add") scopes are no module, an op in a non-layer scope inside a layer ("fc1.moments") counts for the
    layer, and every op still counts for its device."""
    scopes = np.array(["fc1", "fc1", "fc1.moments", "adam", "mse", "Add", "block.a"], dtype=object)
    graph = make_graph([(0, 1, 8), (1, 2, 8), (2, 4, 8), (4, 3, 8), (5, 3, 8), (2, 6, 8)],
                       flops=[0, 1000, 10, 50, 20, 5, 300], param_bytes=[100, 0, 0, 8, 0, 0, 0], scopes=scopes,
                       meta={LAYER_SCOPES: ["block", "block.a", "fc1"]})
    placement = np.array([1, 0, 0, 1, 1, 1, 0])
    summary = summarize_placement(graph, two_devices(), placement)
    assert summary.modules == {"fc1": "d1", "block.a": "d0"}  # fc1's weight is on d1: parameters decide
    assert list(summary.modules) == ["fc1", "block.a"] and summary.split_modules == ("fc1",)
    assert [(d.ops, d.param_bytes) for d in summary.devices] == [(3, 0), (4, 108)]
    unrecorded = summarize_placement(dataclasses.replace(graph, meta={}), two_devices(), placement)
    assert set(unrecorded.modules) == {"fc1", "fc1.moments", "adam", "mse", "Add", "block.a"}  # as before


def test_summarize_placement__a_layer_record_that_is_no_list_of_names_is_one_error(make_graph):
    """A hand-edited graph file's meta: one PlacerError naming the key, not a TypeError from deep inside."""
    graph = make_graph([(0, 1)], scopes=np.array(["fc1", "fc2"], dtype=object), meta={LAYER_SCOPES: 3})
    with pytest.raises(PlacerError, match=r"meta\['layer_scopes'\] must be a list of scope names, got 3"):
        summarize_placement(graph, two_devices(), np.array([0, 1]))


@pytest.fixture(scope="module")
def keras_residual():
    """A functional Keras model with a Dropout (whose seed generator has a state variable of its own), a
    bare Keras op (``x + hidden``), an Add layer and a nested Sequential model, and its traced training step."""
    keras = pytest.importorskip("keras")
    from graphs.tf.importer import trace_keras_training_step

    x = keras.Input((8,), name="x")
    hidden = keras.layers.Dropout(0.1, name="drop")(keras.layers.Dense(8, activation="relu", name="fc1")(x))
    summed = keras.layers.Add(name="merge")([x + hidden, hidden])
    block = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="a"), keras.layers.Dense(4, name="b")],
                             name="block")
    model = keras.Model(x, keras.layers.Dense(2, name="head")(block(summed)), name="res")
    graph = trace_keras_training_step(model, np.zeros((4, 8), "float32"), np.zeros((4, 2), "float32"),
                                      loss="mse", optimizer="adam", name="res")
    return model, graph


def keras_layer_paths(layer, prefix: str = "") -> set:
    """The dotted paths of a Keras layer's sublayers, recursively ("block", "block.a")."""
    paths = set()
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        paths |= {prefix + sub.name} | keras_layer_paths(sub, f"{prefix}{sub.name}.")
    return paths


def test_summarize_placement__a_keras_models_module_map_names_its_layers_on_the_device_of_their_weights(
        keras_residual):
    model, graph = keras_residual
    holds_weights = np.isin(graph.colocation, graph.colocation[graph.param_bytes > 0])  # (N,) with their updates
    placement = holds_weights.astype(np.int64)  # weights, gradients, optimizer state on d1; the rest on d0
    summary = summarize_placement(graph, two_devices(), placement)
    layers = keras_layer_paths(model)
    assert set(summary.modules) <= layers  # no "adam", "mse", "Add", "seed_generator"
    assert {"adam", "mse", "Add", "seed_generator"} <= set(graph.scopes)  # ... which the graph has
    assert set(graph.scopes) & layers <= set(summary.modules)  # every layer with ops of its own
    assert set(summary.modules) == {"fc1", "drop", "merge", "block.a", "block.b", "head"}
    for layer in ("fc1", "block.a", "block.b", "head"):  # those with weights: on their weights' device
        assert summary.modules[layer] == "d1"
    assert summary.modules["drop"] == summary.modules["merge"] == "d0"  # no weights: where their FLOPs run
    assert sum(d.param_bytes for d in summary.devices) == int(graph.param_bytes.sum())
