"""The placement summary on a five-op graph a reader can check by hand."""

import dataclasses
import json

import numpy as np
import pytest

from cluster.placement_summary import TiedModules, Transfers, summarize_placement, transfers_per_step
from graphs.errors import PlacerError
from graphs.opgraph import LAYER_SCOPES, TIED_PARAMETERS
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


def tied_lm(make_graph, scopes=("emb", "emb", "mid", "mid", "out"), **meta):
    """op0 emb's weight (param:emb.weight, 400 B) -> op1 emb's lookup -> op2 mid matmul <- op3 mid's weight,
    op2 -> op4 out matmul <- op0: out reads emb's weight (tied weights; the graph records it when asked)."""
    graph = make_graph([(0, 1), (1, 2), (3, 2), (2, 4), (0, 4)], flops=[0, 0, 100, 0, 1000],
                       param_bytes=[400, 0, 0, 40, 0], scopes=np.array(scopes, dtype=object), meta=meta)
    return dataclasses.replace(graph, op_names=np.array(
        ["param:emb.weight", "lookup", "mm", "param:mid.weight", "logits"], dtype=object))


def tensors_after_to_in_order(modules: dict, holders: dict) -> dict:
    """Where each tensor ends when the map is applied with ``module.to(device)`` per entry, in order:
    ``holders`` maps a tensor to the module paths holding it (one Parameter object for all of them); .to()
    moves what the module or any submodule holds, wherever else that is held."""
    device_of = {}
    for module, device in modules.items():
        for tensor, paths in holders.items():
            if any(module == "" or path == module or path.startswith(module + ".") for path in paths):
                device_of[tensor] = device  # "": the model itself, which holds every tensor
    return device_of


def test_summarize_placement__modules_sharing_a_parameter_are_mapped_where_it_is_placed(make_graph):
    """emb's weight (and lookup) on d1, out's matmul on d0: by its FLOPs out went to d0, and `out.to(d0)`,
    applied after `emb.to(d1)`, moved the one shared Parameter to d0, away from emb's lookup."""
    placement = np.array([1, 1, 0, 0, 0])
    graph = tied_lm(make_graph, **{TIED_PARAMETERS: [["emb.weight", "out.weight"]]})
    summary = summarize_placement(graph, two_devices(), placement)
    assert summary.modules == {"emb": "d1", "mid": "d0", "out": "d1"}
    assert summary.tied == (TiedModules(("emb", "out"), ("emb.weight",), "d1"),)
    ends_on = tensors_after_to_in_order(summary.modules, {"W": ["emb", "out"], "M": ["mid"]})
    assert ends_on == {"W": "d1", "M": "d0"}  # each module's weight where its entry says
    assert json.loads(json.dumps(summary.to_json()))["tied"] == [
        {"modules": ["emb", "out"], "parameters": ["emb.weight"], "device": "d1"}]
    unrecorded = summarize_placement(dataclasses.replace(graph, meta={}), two_devices(), placement)
    assert unrecorded.modules == {"emb": "d1", "mid": "d0", "out": "d0"} and unrecorded.tied == ()  # as before


def test_summarize_placement__a_holder_without_ops_is_mapped_after_its_parent(make_graph):
    """dec.proj holds emb's weight but runs no op itself (dec reads it): without an entry of its own,
    `dec.to(d0)`, applied after `emb.to(d1)`, moved the shared weight away from emb."""
    graph = tied_lm(make_graph, ("emb", "emb", "mid", "mid", "dec"),
                    **{TIED_PARAMETERS: [["emb.weight", "dec.proj.weight"]]})
    summary = summarize_placement(graph, two_devices(), np.array([1, 1, 0, 0, 0]))
    assert summary.modules == {"emb": "d1", "mid": "d0", "dec": "d0", "dec.proj": "d1"}  # parents first
    assert summary.tied == (TiedModules(("emb", "dec.proj"), ("emb.weight",), "d1"),)
    ends_on = tensors_after_to_in_order(summary.modules, {"W": ["emb", "dec.proj"], "M": ["mid"]})
    assert ends_on == {"W": "d1", "M": "d0"}


def test_summarize_placement__modules_tied_through_two_tensors_share_the_device_of_most_of_their_bytes(make_graph):
    """emb and out share emb.weight (400 B, d1); out and mid share mid.weight (40 B, d0): one device for all
    three, the one holding most of the shared bytes."""
    graph = tied_lm(make_graph, **{TIED_PARAMETERS: [["emb.weight", "out.weight"], ["mid.weight", "out.extra"]]})
    summary = summarize_placement(graph, two_devices(), np.array([1, 1, 0, 0, 0]))
    assert summary.modules == {"emb": "d1", "mid": "d1", "out": "d1"}
    assert summary.tied == (TiedModules(("emb", "mid", "out"), ("emb.weight", "mid.weight"), "d1"),)


def test_summarize_placement__a_tensor_one_module_holds_twice_ties_nothing(make_graph):
    """``self.w2 = self.w`` inside mid: it was listed as "tied" with mid alone, a tie to nothing."""
    graph = tied_lm(make_graph, **{TIED_PARAMETERS: [["mid.weight", "mid.alias"]]})
    summary = summarize_placement(graph, two_devices(), np.array([1, 1, 0, 0, 0]))
    assert summary.tied == ()
    assert summary.modules == summarize_placement(dataclasses.replace(graph, meta={}), two_devices(),
                                                  np.array([1, 1, 0, 0, 0])).modules


def root_lm(make_graph, **meta):
    """tied_lm whose table is the model's own parameter (op0 param:table, scope "") and whose lookup runs in
    the model's own forward (scope ""); a torch graph."""
    graph = tied_lm(make_graph, ("", "", "mid", "mid", "out"), **meta)
    names = graph.op_names.copy()
    names[0] = "param:table"
    return dataclasses.replace(graph, op_names=names, framework="torch")


def test_summarize_placement__a_torch_models_own_parameter_is_its_first_entry(make_graph):
    """A parameter registered on the model itself had no entry: no `.to()` of the map moved it."""
    graph = root_lm(make_graph)
    summary = summarize_placement(graph, two_devices(), np.array([1, 1, 0, 0, 0]))
    assert list(summary.modules.items()) == [("", "d1"), ("mid", "d0"), ("out", "d0")]  # the model first
    ends_on = tensors_after_to_in_order(summary.modules, {"T": [""], "M": ["mid"]})
    assert ends_on == {"T": "d1", "M": "d0"}
    other = summarize_placement(dataclasses.replace(graph, framework="onnx"), two_devices(), np.array([1, 1, 0, 0, 0]))
    assert "" not in other.modules  # ops outside any name scope: no module of another framework


def test_summarize_placement__a_parameter_the_model_shares_with_a_submodule_ties_the_model(make_graph):
    """``self.out.weight = self.table``: the model was left out of the tie (and of the map), so out's entry
    alone said where the table goes and the model's own parameters went nowhere."""
    graph = root_lm(make_graph, **{TIED_PARAMETERS: [["table", "out.weight"]]})
    summary = summarize_placement(graph, two_devices(), np.array([1, 1, 0, 0, 0]))
    assert list(summary.modules.items()) == [("", "d1"), ("mid", "d0"), ("out", "d1")]
    assert summary.tied == (TiedModules(("", "out"), ("table",), "d1"),)
    ends_on = tensors_after_to_in_order(summary.modules, {"T": ["", "out"], "M": ["mid"]})
    assert ends_on == {"T": "d1", "M": "d0"}


@pytest.mark.parametrize("record, message", [
    (3, r"meta\['tied_parameters'\] must be a list of lists of two or more parameter names, got 3"),
    ([["emb.weight"]], r"must be a list of lists of two or more parameter names, got \[\['emb.weight'\]\]"),
    ([["emb.bias", "out.bias"]], r"names 'emb.bias', but the graph has no Variable op 'param:emb.bias'"),
])
def test_summarize_placement__a_bad_tied_record_is_one_error(make_graph, record, message):
    """A hand-edited graph file's meta: one PlacerError naming the key, not a KeyError from deep inside."""
    graph = tied_lm(make_graph, **{TIED_PARAMETERS: record})
    with pytest.raises(PlacerError, match=message):
        summarize_placement(graph, two_devices(), np.zeros(5, dtype=np.int64))


def test_summarize_placement__a_traced_tied_model_applied_with_to_in_order_keeps_each_weight_with_its_module(
        one_torch_thread):
    """The torch importer's record, on a real model: its shared Parameter (one object) ends, after `.to()`
    per map entry in order, on the device the map gives every module holding it."""
    from fixtures.tiny_models import tiny_torch_tied_lm
    from graphs.torch.importer import trace_training_step

    model, inputs = tiny_torch_tied_lm()
    graph = trace_training_step(model, inputs, name="tied")
    emb_weight = graph.colocation == graph.colocation[list(graph.op_names).index("param:emb.weight")]
    placement = emb_weight.astype(np.int64)  # emb's weight, its gradient and update on d1; out's matmuls on d0
    summary = summarize_placement(graph, two_devices(), placement)
    device_of = {}  # id(Parameter) -> device: .to() moves a Parameter in place, for every module holding it
    for module, device in summary.modules.items():
        for parameter in model.get_submodule(module).parameters():
            device_of[id(parameter)] = device
    for module, device in summary.modules.items():
        own = model.get_submodule(module).parameters(recurse=False)
        assert {device_of[id(parameter)] for parameter in own} <= {device}, module
    assert summary.modules["emb"] == summary.modules["out"] == "d1"


def test_summarize_placement__a_traced_model_holding_parameters_itself_applied_in_order_keeps_each_with_its_entry(
        one_torch_thread):
    """The model's own table (which out.weight shares) and logit bias: both end, after `.to()` per map entry in
    order, where the model's entry says, and the shared table also where out's does."""
    from fixtures.tiny_models import tiny_torch_root_tied_lm
    from graphs.torch.importer import trace_training_step

    model, inputs = tiny_torch_root_tied_lm()
    graph = trace_training_step(model, inputs, name="root_tied")
    table = graph.colocation == graph.colocation[list(graph.op_names).index("param:table")]
    summary = summarize_placement(graph, two_devices(), table.astype(np.int64))  # the table and its update on d1
    assert list(summary.modules) == ["", "mid", "out"]
    device_of = {}  # id(Parameter) -> device
    for module, device in summary.modules.items():
        for parameter in model.get_submodule(module).parameters():
            device_of[id(parameter)] = device
    assert device_of[id(model.table)] == summary.modules[""] == summary.modules["out"] == "d1"
    for module, device in summary.modules.items():
        own = model.get_submodule(module).parameters(recurse=False)
        assert {device_of[id(parameter)] for parameter in own} <= {device}, module


@pytest.fixture(scope="module")
def keras_residual():
    """A functional Keras model with a Dropout (whose seed generator has a state variable of its own), a
    bare Keras op (``x + hidden``), an Add layer and a nested Sequential model, and its traced training step."""
    keras = pytest.importorskip("keras")
    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    with fresh_keras_names():  # built as `placer graphs import` builds it: "seed_generator", whatever ran before
        x = keras.Input((8,), name="x")
        hidden = keras.layers.Dropout(0.1, name="drop")(keras.layers.Dense(8, activation="relu", name="fc1")(x))
        summed = keras.layers.Add(name="merge")([x + hidden, hidden])
        block = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="a"),
                                  keras.layers.Dense(4, name="b")], name="block")
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


def test_summarize_placement__a_subclassed_keras_models_layers_go_where_their_weights_are():
    """A subclassed model builds its layers in its first call; their weights were then no layer's (scope ""),
    so the map put each layer where its FLOPs ran, whatever device held its weights and optimizer state."""
    pytest.importorskip("keras")
    from fixtures.tiny_models import tiny_keras_subclassed
    from graphs.tf.importer import trace_keras_training_step

    model, inputs, targets = tiny_keras_subclassed()
    graph = trace_keras_training_step(model, inputs, targets, name="two_layers")
    holds_weights = np.isin(graph.colocation, graph.colocation[graph.op_kinds == "Variable"])  # with their updates
    summary = summarize_placement(graph, two_devices(), holds_weights.astype(np.int64))  # the rest on d0
    hidden, out = model.hidden.name, model.out.name  # "dense", "dense_1" in a fresh process
    assert summary.modules == {hidden: "d1", out: "d1"}
    held = {s.scope: s.param_bytes for s in summary.scopes}
    assert (held[hidden], held[out]) == (4 * 4 * (6 * 16 + 16), 4 * 4 * (16 * 2 + 2))  # weights, grads, Adam m, v
