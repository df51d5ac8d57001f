"""The PyTorch importer on small models whose figures can be checked by hand."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphs.errors import PlacerError
from graphs.io import load_graph_file, save_graph
from graphs.opgraph import PHASE_CODE, TIED_PARAMETERS
from graphs.opgraph import colocation_groups
from graphs.torch.importer import import_torch_spec, trace_training_step

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _mlp_graph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return trace_training_step(model, (torch.randn(4, 8),), name="mlp")


def _ops(graph, kind=None, phase=None, scope=None) -> np.ndarray:
    mask = np.ones(graph.num_ops, dtype=bool)
    if kind is not None:
        mask &= graph.op_kinds == kind
    if phase is not None:
        mask &= graph.phases == PHASE_CODE[phase]
    if scope is not None:
        mask &= graph.scopes == scope
    return np.flatnonzero(mask)


def _in_edges(graph, op: int) -> dict[int, int]:
    """{producer: bytes} of the edges into ``op``."""
    mask = graph.edge_dst == op
    return dict(zip(graph.edge_src[mask].tolist(), graph.edge_bytes[mask].tolist()))


def test_trace_training_step__mlp_params_and_variables_by_hand():
    graph = _mlp_graph()
    assert graph.num_params == 8 * 16 + 16 + 16 * 2 + 2
    assert (graph.framework, graph.batch_size, graph.name) == ("torch", 4, "mlp")
    variables = _ops(graph, kind="Variable")
    weight_bytes = {"param:0.weight": 8 * 16 * 4, "param:0.bias": 16 * 4, "param:2.weight": 32 * 4,
                    "param:2.bias": 2 * 4}
    assert {graph.op_names[i]: int(graph.out_bytes[i]) for i in variables} == weight_bytes
    # fp32 Adam keeps weight, gradient, exp_avg and exp_avg_sq resident
    assert {graph.op_names[i]: int(graph.param_bytes[i]) for i in variables} == \
        {k: 4 * v for k, v in weight_bytes.items()}
    assert {graph.scopes[i] for i in variables} == {"0", "2"}
    assert graph.param_bytes.sum() == graph.param_bytes[variables].sum()  # only Variables own bytes


def test_trace_training_step__mlp_flops_by_hand():
    graph = _mlp_graph()
    forward = 2 * 4 * 8 * 16 + 2 * 4 * 16 * 2
    # layer 2: grad of its input and of its weight; layer 1: grad of its weight only (x needs none)
    backward = 2 * (2 * 4 * 16 * 2) + 2 * 4 * 8 * 16
    assert graph.flops[graph.phases == PHASE_CODE["forward"]].sum() == forward
    assert graph.flops[graph.phases == PHASE_CODE["backward"]].sum() == backward
    assert graph.flops[graph.phases == PHASE_CODE["update"]].sum() == 0  # element-wise: bytes only
    assert graph.total_flops == forward + backward


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_trace_training_step__a_grouped_convolutions_backward_is_twice_its_forward(groups):
    """torch's formula counted the weight gradient as if ungrouped: a depthwise convolution's backward came out
    17x its forward (the Keras importer: 2x, an input and a weight gradient of the forward's FLOPs each)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.grouped = nn.Conv2d(3, 16, 1), nn.Conv2d(16, 16, 3, padding=1, groups=groups)

        def forward(self, x):
            return self.grouped(self.first(x)).square().mean()

    graph = trace_training_step(Net(), (torch.randn(2, 3, 8, 8),), name="grouped")
    forward, backward = (graph.flops[_ops(graph, kind=kind)] for kind in ("aten.convolution",
                                                                           "aten.convolution_backward"))
    grouped_forward = 2 * 2 * 16 * (16 // groups) * 9 * 8 * 8
    assert sorted(forward.tolist()) == sorted([2 * 2 * 16 * 3 * 8 * 8, grouped_forward])
    assert sorted(backward.tolist()) == sorted([2 * 2 * 16 * 3 * 8 * 8, 2 * grouped_forward])  # x needs no grad


def test_trace_training_step__mlp_edges_and_bytes_by_hand():
    graph = _mlp_graph()
    first, second = _ops(graph, kind="aten.addmm", phase="forward")
    relu = _ops(graph, kind="aten.relu")[0]
    (x_input,) = _ops(graph, kind="Input")
    assert graph.out_bytes[x_input] == 4 * 8 * 4
    assert _in_edges(graph, first)[x_input] == 4 * 8 * 4
    assert _in_edges(graph, relu) == {first: 4 * 16 * 4}
    assert _in_edges(graph, second)[relu] == 4 * 16 * 4
    bias, weight_t, out = 16 * 4, 8 * 16 * 4, 4 * 16 * 4
    assert graph.bytes_accessed[first] == bias + 4 * 8 * 4 + weight_t + out
    assert graph.out_bytes[first] == out
    bias_var = list(graph.op_names).index("param:0.bias")
    assert _in_edges(graph, first)[bias_var] == bias


def test_trace_training_step__every_phase_present():
    graph = _mlp_graph()
    counts = np.bincount(graph.phases, minlength=4)
    assert all(counts[PHASE_CODE[p]] > 0 for p in ("forward", "backward", "update", "other"))
    other = graph.phases == PHASE_CODE["other"]
    assert set(graph.op_kinds[other]) == {"Variable", "Input"}
    assert all(k.startswith("aten.") for k in graph.op_kinds[~other])


def test_trace_training_step__backward_ops_colocated_with_their_forward_op():
    graph = _mlp_graph()
    for scope in ("0", "2"):
        (forward_mm,) = _ops(graph, kind="aten.addmm", phase="forward", scope=scope)
        backward_mms = _ops(graph, kind="aten.mm", phase="backward", scope=scope)
        assert len(backward_mms) == (1 if scope == "0" else 2)
        assert np.all(graph.colocation[backward_mms] == graph.colocation[forward_mm])
    threshold = _ops(graph, kind="aten.threshold_backward")[0]
    assert graph.colocation[threshold] == graph.colocation[_ops(graph, kind="aten.relu")[0]]
    assert graph.scopes[threshold] == "1"


def test_trace_training_step__update_ops_colocated_with_their_variable():
    graph = _mlp_graph()
    update = _ops(graph, phase="update")
    variables = _ops(graph, kind="Variable")
    for op in update:
        group = np.flatnonzero(graph.colocation == graph.colocation[op])
        owners = [v for v in group if graph.op_kinds[v] == "Variable"]
        assert len(owners) == 1 and graph.scopes[owners[0]] == graph.scopes[op]
    for var in variables:
        kinds = set(graph.op_kinds[graph.colocation == graph.colocation[var]])
        assert {"aten.lerp_", "aten.addcdiv_"} <= kinds  # Adam's moment and weight updates
    assert graph.num_colocation_groups < graph.num_ops
    assert set(np.unique(graph.colocation)) == set(range(graph.num_colocation_groups))  # dense ids


class _ViewsAndInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = self.fc(x)
        y.add_(1.0)
        flat = y.view(-1)
        y[:, 0].mul_(2.0)  # writes y's storage through a view
        return flat.sum() + y.mean()


def test_trace_training_step__views_and_inplace_colocated_with_producer():
    graph = trace_training_step(_ViewsAndInPlace(), (torch.randn(3, 6),))
    addmm = _ops(graph, kind="aten.addmm", phase="forward")[0]
    add = _ops(graph, kind="aten.add_", phase="forward")[0]
    view = _ops(graph, kind="aten.view", phase="forward")[0]
    mul = _ops(graph, kind="aten.mul_", phase="forward")[0]
    assert _in_edges(graph, add) == {addmm: 3 * 6 * 4}
    assert graph.colocation[add] == graph.colocation[addmm] == graph.colocation[view] == graph.colocation[mul]
    # readers after the in-place write through a view depend on the writer, not the first producer
    total = _ops(graph, kind="aten.sum", phase="forward")[0]
    mean = _ops(graph, kind="aten.mean", phase="forward")[0]
    assert mul in _in_edges(graph, mean)
    assert mul in _in_edges(graph, total)


def _bn_convnet_graph(train: bool):
    from graphs.specs import call_spec

    model, inputs = call_spec(f"{FIXTURES / 'tiny_models.py'}:tiny_torch_bn_convnet", "torch")
    return trace_training_step(model.train(train), inputs)


def _group(graph, op: int) -> set[str]:
    return set(graph.op_names[graph.colocation == graph.colocation[op]])


def test_trace_training_step__batch_norm_colocated_with_the_running_statistics_it_updates():
    """native_batch_norm updates running_mean and running_var in place in training, though its schema does not
    say so: a placement must not put those buffers on another device than the op (they were apart). In eval
    mode it only reads them: no tie."""
    graph = _bn_convnet_graph(train=True)
    (forward,) = _ops(graph, kind="aten.native_batch_norm")
    (backward,) = _ops(graph, kind="aten.native_batch_norm_backward")
    group = _group(graph, forward)
    assert {"param:1.running_mean", "param:1.running_var", graph.op_names[backward]} <= group
    assert "param:1.num_batches_tracked" not in group  # its own add_, tied to it as before
    (counter,) = _ops(graph, kind="aten.add_", phase="forward")
    assert "param:1.num_batches_tracked" in _group(graph, counter)
    names = list(graph.op_names)
    assert _in_edges(graph, forward).keys() >= {names.index("param:1.running_mean"),
                                                 names.index("param:1.running_var")}
    evaluated = _bn_convnet_graph(train=False)
    (forward,) = _ops(evaluated, kind="aten.native_batch_norm")
    assert not {"param:1.running_mean", "param:1.running_var"} & _group(evaluated, forward)


class _OutBatchNorm(nn.Module):
    """Batch norm through ``native_batch_norm.out``, its outputs preallocated (no affine: out= has no autograd)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(4))
        self.register_buffer("running_var", torch.ones(4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y, save_mean, save_invstd = torch.empty(0), torch.empty(0), torch.empty(0)
        torch.ops.aten.native_batch_norm.out(x, None, None, self.running_mean, self.running_var, self.training,
                                             0.1, 1e-5, out=y, save_mean=save_mean, save_invstd=save_invstd)
        return self.fc(y)


def test_trace_training_step__batch_norm_out_overload_colocated_with_the_running_statistics_it_updates():
    """native_batch_norm.out writes the running statistics in training as the default overload does (its schema
    marks only out, save_mean and save_invstd written): the op was apart from both buffers."""
    graph = trace_training_step(_OutBatchNorm().train(True), (torch.randn(8, 4),))
    (forward,) = _ops(graph, kind="aten.native_batch_norm")
    assert {"param:running_mean", "param:running_var"} <= _group(graph, forward)
    evaluated = trace_training_step(_OutBatchNorm().train(False), (torch.randn(8, 4),))
    (forward,) = _ops(evaluated, kind="aten.native_batch_norm")
    assert not {"param:running_mean", "param:running_var"} & _group(evaluated, forward)


@pytest.mark.parametrize("func", [torch.ops.aten.native_batch_norm.out, torch.ops.aten.cudnn_batch_norm.out,
                                  torch.ops.aten.miopen_batch_norm.out])
def test_undeclared_writes__batch_norm_out_overloads_write_the_running_statistics_in_training(func):
    from graphs.torch.recorder import undeclared_writes

    names = [a.name for a in func._schema.arguments]
    args = [None] * names.index("training")
    assert undeclared_writes(func, (*args, True), {}) == [names.index("running_mean"), names.index("running_var")]
    assert undeclared_writes(func, (*args, False), {}) == []


@pytest.mark.parametrize("func", [torch.ops.aten._native_batch_norm_legit.out,  # its schema says so already
                                  torch.ops.aten._native_batch_norm_legit_functional.default,  # returns new ones
                                  torch.ops.aten._batch_norm_with_update_functional.default])
def test_undeclared_writes__nothing_for_batch_norms_whose_schema_is_true(func):
    from graphs.torch.recorder import undeclared_writes

    assert undeclared_writes(func, (None,) * 5 + (True,), {}) == []


class _TwoRunningAverages(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x):
        y = self.fc(x)
        with torch.no_grad():
            torch._foreach_lerp_([self.mean, self.var], [y.mean(0), y.var(0)], 0.1)
        return y.sum()


def test_trace_training_step__an_op_writing_two_buffers_in_place_is_colocated_with_both():
    """Every buffer an op writes is tied to it, not only its first written argument (the second was apart)."""
    graph = trace_training_step(_TwoRunningAverages(), (torch.randn(3, 4),))
    (update,) = _ops(graph, kind="aten._foreach_lerp_")
    assert {"param:mean", "param:var"} <= _group(graph, update)
    assert "param:fc.weight" not in _group(graph, update)


def test_trace_training_step__loss_fn_targets_become_inputs_and_loss_scope():
    model = nn.Linear(5, 3)
    targets = torch.tensor([0, 2, 1, 1])
    graph = trace_training_step(model, torch.randn(4, 5), loss_fn=lambda out: F.cross_entropy(out, targets))
    inputs = _ops(graph, kind="Input")
    assert len(inputs) == 2 and sorted(graph.out_bytes[inputs].tolist()) == [4 * 8, 4 * 5 * 4]
    nll = _ops(graph, kind="aten.nll_loss_forward")[0]
    assert graph.scopes[nll] == "loss"
    assert any(graph.op_kinds[src] == "Input" for src in _in_edges(graph, nll))


def test_trace_training_step__frozen_params_and_buffers_are_resident_but_not_trained():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model[0].bias.requires_grad_(False)
    graph = trace_training_step(model, torch.randn(8, 4))
    assert graph.num_params == 16 + 4 + 4  # weight, BN weight and bias; not the frozen bias
    names = list(graph.op_names)
    frozen = names.index("param:0.bias")
    assert graph.param_bytes[frozen] == 16  # its weight only: no gradient, no optimizer state
    running_mean = names.index("param:1.running_mean")
    assert graph.op_kinds[running_mean] == "Variable" and graph.param_bytes[running_mean] == 16
    assert not np.any((graph.colocation == graph.colocation[frozen]) & (graph.phases == PHASE_CODE["update"]))


def test_trace_training_step__optimizer_state_sets_param_bytes():
    graph = trace_training_step(nn.Linear(3, 2, bias=False), torch.randn(1, 3), optimizer_cls=torch.optim.SGD,
                                optimizer_kwargs={"lr": 0.1})
    (variable,) = _ops(graph, kind="Variable")
    assert graph.param_bytes[variable] == 2 * 6 * 4  # plain SGD: weight + gradient
    assert graph.meta["optimizer"] == "SGD"


class _ScaledLinear(nn.Module):
    """A Linear to one output (its bias has one element) times a learned 0-dim temperature (CLIP's logit_scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return self.fc(x) * self.logit_scale.exp()


def test_trace_training_step__one_element_parameters_hold_weight_gradient_and_two_moments():
    """Adam's step counter is a one-element tensor too: it was counted as a moment of every one-element
    parameter (20 bytes instead of 16)."""
    graph = trace_training_step(_ScaledLinear(), torch.randn(4, 8))
    names = list(graph.op_names)
    assert {name: int(graph.param_bytes[names.index(f"param:{name}")])
            for name in ("fc.weight", "fc.bias", "logit_scale")} == {"fc.weight": 4 * 32, "fc.bias": 4 * 4,
                                                                     "logit_scale": 4 * 4}


class _CheckpointedBlocks(nn.Module):
    """A stem Linear, then blocks (Linear, Tanh) each under ``torch.utils.checkpoint``: their forward runs
    again in the backward, from the input it kept."""

    def __init__(self, width: int, blocks: int, reentrant: bool) -> None:
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(blocks))
        self.reentrant = reentrant

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return x.pow(2).mean()


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_trace_training_step__checkpointed_blocks_read_and_update_their_parameters(reentrant):
    """The recomputation read the model's own parameters, not the traced ones: a reentrant checkpoint's
    gradients missed the traced parameters (their Adam updates were left out of the step), and a
    non-reentrant one read them as constant Input ops."""
    batch, width, blocks = 4, 8, 2
    graph = trace_training_step(_CheckpointedBlocks(width, blocks, reentrant), torch.randn(batch, width))
    assert [graph.op_names[i] for i in _ops(graph, kind="Input")] == ["input:0"]
    updates = graph.colocation[_ops(graph, phase="update")]
    for variable in _ops(graph, kind="Variable"):
        assert graph.colocation[variable] in updates, graph.op_names[variable]
    one_matmul = 2 * batch * width * width
    forward = (1 + blocks) * one_matmul
    # the stem's weight gradient; each block's input and weight gradients and its recomputed forward
    assert graph.flops[graph.phases == PHASE_CODE["backward"]].sum() == one_matmul + blocks * 3 * one_matmul
    assert graph.flops[graph.phases == PHASE_CODE["forward"]].sum() == forward


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_trace_training_step__recomputed_ops_are_in_their_modules_scope(reentrant):
    """A checkpointed block's recomputation runs its modules' forward in the backward pass: each op there is
    in its module's scope. They took the scope of the backward op that asked for them (the Linear's in the
    Tanh's) or, under a reentrant checkpoint, of their first input (the Tanh's in the Linear's)."""
    graph = trace_training_step(_CheckpointedBlocks(8, 2, reentrant), torch.randn(4, 8))
    linears, tanhs = _ops(graph, kind="aten.addmm", phase="backward"), _ops(graph, kind="aten.tanh", phase="backward")
    assert sorted(graph.scopes[linears].tolist()) == ["blocks.0.0", "blocks.1.0"]
    assert sorted(graph.scopes[tanhs].tolist()) == ["blocks.0.1", "blocks.1.1"]


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_trace_training_step__a_checkpointed_blocks_backward_is_in_its_modules_scope_and_colocated(reentrant):
    """Under a reentrant checkpoint the recomputed nodes were never stamped with their ops, so the backward
    through them took the scope of whatever produced the incoming gradient (the next block's, the loss's)
    and no colocation with the forward op it differentiates."""
    graph = trace_training_step(_CheckpointedBlocks(8, 2, reentrant), torch.randn(4, 8))
    tanh_grads = _ops(graph, kind="aten.tanh_backward")
    assert sorted(graph.scopes[tanh_grads].tolist()) == ["blocks.0.1", "blocks.1.1"]
    tanhs = _ops(graph, kind="aten.tanh")  # the forward's and the recomputation's: the gradient is with one
    for grad in tanh_grads:
        assert graph.colocation[grad] in {graph.colocation[t] for t in tanhs if graph.scopes[t] == graph.scopes[grad]}


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad


class _CubeBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return _Cube.apply(self.fc(x))


def test_trace_training_step__custom_function_backward_follows_its_forward():
    """A custom autograd.Function's forward runs without gradients, and its output gets the Function's node
    only when apply returns: that node was never linked to an op, so the backward's ops took their first
    input's scope ("fc") and were colocated with nothing."""
    graph = trace_training_step(nn.Sequential(_CubeBlock()), torch.randn(3, 4))
    forward_cube = _ops(graph, kind="aten.mul", phase="forward")[-1]
    backward = _ops(graph, kind="aten.mul", phase="backward")
    assert len(backward) == 3 and graph.scopes[forward_cube] == "0"
    assert set(graph.scopes[backward].tolist()) == {"0"}
    assert set(graph.colocation[backward].tolist()) == {graph.colocation[forward_cube]}


def test_trace_training_step__meta_model_allocates_nothing():
    with torch.device("meta"):
        model = nn.Linear(60_000, 60_000)  # 14.4 GB of fp32 weights: only fake tensors can trace it
    graph = trace_training_step(model, torch.empty(2, 60_000, device="meta"))
    assert graph.num_params == 60_000 * 60_000 + 60_000
    assert graph.flops[graph.phases == PHASE_CODE["forward"]].sum() == 2 * 2 * 60_000 * 60_000


def test_import_torch_spec__tied_weights_are_one_variable_and_every_holder_is_recorded(tmp_path):
    """``out.weight = emb.weight``: one Parameter, one Variable op (in emb's scope) that out's forward reads
    too; meta records both names, so `placer apply`'s module map can put emb and out on one device. The
    record is kept in the graph file and is no part of the content hash."""
    graph = import_torch_spec(f"{FIXTURES / 'tiny_models.py'}:tiny_torch_tied_lm")
    variables = {graph.op_names[i]: graph.scopes[i] for i in _ops(graph, kind="Variable")}
    assert variables == {"param:emb.weight": "emb", "param:mid.weight": "mid", "param:mid.bias": "mid"}
    emb_weight = int(np.flatnonzero(graph.op_names == "param:emb.weight")[0])
    assert "out" in {graph.scopes[op] for op in graph.edge_dst[graph.edge_src == emb_weight]}  # out reads it
    assert graph.meta[TIED_PARAMETERS] == [["emb.weight", "out.weight"]]
    assert load_graph_file(save_graph(graph, tmp_path / "tied.parquet")).meta[TIED_PARAMETERS] == \
        [["emb.weight", "out.weight"]]
    assert dataclasses.replace(graph, meta={}).content_hash == graph.content_hash
    assert TIED_PARAMETERS not in _mlp_graph().meta  # nothing shared: no record


def test_trace_training_step__a_module_registered_twice_ties_each_of_its_tensors():
    shared = nn.BatchNorm1d(4)
    model = nn.Sequential(nn.Linear(4, 4), shared, shared)  # paths 1 and 2: weight, bias and three buffers
    graph = trace_training_step(model, torch.randn(3, 4))
    assert graph.meta[TIED_PARAMETERS] == [[f"1.{key}", f"2.{key}"] for key in (
        "weight", "bias", "running_mean", "running_var", "num_batches_tracked")]


def test_trace_training_step__model_without_params_is_rejected():
    with pytest.raises(PlacerError, match="no trainable parameters"):
        trace_training_step(nn.ReLU(), torch.randn(2, 2))


def test_colocation_groups__union_find_dense_ids():
    assert colocation_groups(5, [(0, 2), (4, 3)]).tolist() == [0, 1, 0, 2, 2]
    assert colocation_groups(4, [(0, 1), (2, 3), (1, 3)]).tolist() == [0, 0, 0, 0]
    assert colocation_groups(3, []).tolist() == [0, 1, 2]


def test_import_torch_spec__file_function_traces():
    graph = import_torch_spec(f"{FIXTURES / 'tiny_models.py'}:tiny_torch_mlp")
    assert graph.num_params == 8 * 16 + 16 + 16 * 2 + 2
    assert graph.name == "tiny_torch_mlp" and graph.batch_size == 4
    assert "tiny_models.py" in graph.source


def test_import_torch_spec__module_function_traces():
    graph = import_torch_spec("graphs.benchmarks.torch_models:rnnlm_spec")
    assert graph.framework == "torch" and graph.num_params > 0


@pytest.mark.parametrize("spec, message", [
    ("no_colon_here", "expected MODULE:FUNCTION"),
    ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
    (f"{FIXTURES / 'broken_model.py'}:build", "RuntimeError: this module is broken on purpose"),
    (f"{FIXTURES / 'missing.py'}:build", "no file"),
    (f"{FIXTURES / 'tiny_models.py'}:nope", "has no function 'nope'"),
    (f"{FIXTURES / 'tiny_models.py'}:not_a_model", "must return (model, example_inputs)"),
])
def test_import_torch_spec__bad_spec_is_one_placer_error_naming_it(spec, message):
    with pytest.raises(PlacerError) as caught:
        import_torch_spec(spec)
    assert spec in str(caught.value) and message in str(caught.value)


def test_import_torch_spec__bad_function_result_or_model_is_rejected(tmp_path):
    module = tmp_path / "bad_models.py"
    module.write_text("import torch\n"
                      "def not_module():\n    return 'model', (torch.zeros(2),)\n"
                      "def bad_inputs():\n    return torch.nn.Linear(2, 2), ['x']\n"
                      "def raises():\n    raise ValueError('boom')\n"
                      "def bad_shape():\n    return torch.nn.Linear(3, 2), (torch.zeros(4, 5),)\n"
                      "def no_params():\n    return torch.nn.ReLU(), (torch.zeros(4, 5),)\n")
    for func, message in (("not_module", "torch.nn.Module"), ("bad_inputs", "tuple of tensors"),
                          ("raises", "ValueError: boom"), ("bad_shape", "tracing the training step failed"),
                          ("no_params", "no trainable parameters")):
        with pytest.raises(PlacerError, match=message):
            import_torch_spec(f"{module}:{func}")


def test_import_torch_spec__a_models_error_of_many_lines_is_quoted_by_its_first(tmp_path):
    """The whole message was quoted: an error of two lines broke the command line's one-line rule."""
    module = tmp_path / "loud_models.py"
    module.write_text("import torch\n"
                      "class Loud(torch.nn.Linear):\n"
                      "    def forward(self, x):\n        raise ValueError('line one\\nline two')\n"
                      "def loud():\n    return Loud(2, 2), (torch.zeros(3, 2),)\n")
    with pytest.raises(PlacerError) as caught:
        import_torch_spec(f"{module}:loud")
    assert str(caught.value).endswith("ValueError: line one") and "\n" not in str(caught.value)


def test_import_torch_spec__a_file_imports_as_python_runs_it(tmp_path, monkeypatch):
    """A ``@dataclass`` config under ``from __future__ import annotations`` ("'NoneType' object has no attribute
    '__dict__'": the file's module was in no ``sys.modules``) and a model split over two files in one folder
    ("No module named 'helper_layers'") import as ``python FILE`` runs them."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "helper_layers_s62.py").write_text(
        "import torch\n"
        "class MLP(torch.nn.Sequential):\n"
        "    def __init__(self, width):\n"
        "        super().__init__(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))\n")
    (folder / "main_model.py").write_text(
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n"
        "import torch\n"
        "from helper_layers_s62 import MLP\n"
        "@dataclass\n"
        "class Config:\n"
        "    width: int = 8\n"
        "    batch: int = 4\n"
        "def build():\n"
        "    config = Config()\n"
        "    return MLP(config.width), (torch.zeros(config.batch, config.width),)\n")
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder it appends goes with the test
    before = set(sys.modules)
    try:
        graph = import_torch_spec(f"{folder / 'main_model.py'}:build")
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]
    assert graph.num_params == 8 * 8 + 8 + 8 * 2 + 2


def test_import_target__two_files_of_one_name_are_two_modules(tmp_path):
    """The module was named by the file's stem alone: a/model.py and b/model.py replaced each other in
    ``sys.modules``, where a ``@dataclass`` or a pickle looks a class's module up."""
    from graphs.specs import import_target

    modules = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.py").write_text(f"WHERE = {folder!r}\n")
        path = str(tmp_path / folder / "model.py")
        modules.append(import_target(f"{path}:build", path, "torch"))
    import sys

    assert [sys.modules[m.__name__].WHERE for m in modules] == ["a", "b"]
    for m in modules:
        del sys.modules[m.__name__]


def test_trace_training_step__a_parameter_the_loss_never_reaches_keeps_its_weight_alone():
    """A real step gives it no gradient and Adam makes no state for it: 4x its bytes overstated memory."""
    class WithUnusedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 4)
            self.unused_head = nn.Linear(8, 1000)

        def forward(self, x):
            return self.body(x)

    graph = trace_training_step(WithUnusedHead(), torch.zeros(2, 8))
    resident = dict(zip(graph.op_names, graph.param_bytes.tolist()))
    assert resident["param:unused_head.weight"] == 8 * 1000 * 4 and resident["param:unused_head.bias"] == 1000 * 4
    assert resident["param:body.weight"] == 4 * 8 * 4 * 4  # weight, gradient and Adam's two moments


def test_trace_training_step__same_model_same_graph():
    first, second = _mlp_graph(), _mlp_graph()
    assert first.content_hash == second.content_hash
    assert first.num_edges == second.num_edges > 0


def test_trace_training_step__lstm_matmuls_counted_step_by_step():
    """nn.LSTM on the CPU would be one fused oneDNN op per layer (aten.mkldnn_rnn_layer), which has no FLOP
    formula (the layer counted 0 FLOPs) and no GPU kernel; traced without oneDNN it is its cell's matmuls,
    every step: gates = x W_ih^T + b_ih + h W_hh^T + b_hh, 4 * hidden wide."""
    batch, steps, features, hidden = 3, 5, 8, 16
    torch.manual_seed(0)
    graph = trace_training_step(nn.LSTM(features, hidden, batch_first=True), (torch.randn(batch, steps, features),),
                                loss_fn=lambda out: out[0].sum(), name="lstm")
    assert not any(kind.startswith("aten.mkldnn") for kind in graph.op_kinds)
    per_step = 2 * batch * features * 4 * hidden + 2 * batch * hidden * 4 * hidden
    assert graph.flops[graph.phases == PHASE_CODE["forward"]].sum() == steps * per_step
    assert torch.backends.mkldnn.enabled  # the trace leaves the setting as it found it


class HalvesWhileLarge(nn.Module):
    """Halves its output while its largest value is above 1: ``rounds`` rounds at most, or no bound (None)."""

    def __init__(self, rounds: int | None):
        super().__init__()
        self.linear, self.rounds = nn.Linear(4, 4), rounds

    def forward(self, x):
        h, done = self.linear(x), 0
        while (self.rounds is None or done < self.rounds) and h.abs().max() > 1.0:
            h, done = h / 2, done + 1
        return h


def test_trace_training_step__a_loop_until_a_tensors_value_changes_is_one_error_not_a_hang(monkeypatch):
    """Traced without data every read of a value answers 1 (True): the loop never ended, the import's memory
    growing (a review). A bounded loop reading values as often still imports."""
    import graphs.torch.recorder as recorder

    monkeypatch.setattr(recorder, "MAX_SCALAR_READS", 50)
    graph = trace_training_step(HalvesWhileLarge(rounds=40), torch.randn(3, 4))
    assert ((graph.op_kinds == "aten.gt") & (graph.phases == PHASE_CODE["forward"])).sum() == 40
    with pytest.raises(PlacerError, match=r"the step read a tensor's value more than 50 times \(.item\(\), or a "
                                          r"tensor in an if or while\), the last in the forward pass: .* never ends"):
        trace_training_step(HalvesWhileLarge(rounds=None), torch.randn(3, 4))


def test_trace_training_step__a_loss_without_gradient_is_refused_saying_why():
    """An integer output (argmax) has no gradient: the error says so, not autograd's 'element 0 of tensors
    does not require grad and does not have a grad_fn'."""
    with pytest.raises(PlacerError, match="does not depend on any trainable parameter"):
        trace_training_step(nn.Linear(4, 2), (torch.randn(3, 4),), loss_fn=lambda out: out.argmax(-1), name="argmax")


class _LossAndLogits(nn.Module):
    """Returns its loss with its logits, in a dict (as Hugging Face models do) or a tuple, loss first."""

    def __init__(self, as_dict: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.as_dict = as_dict

    def forward(self, x, labels):
        logits = self.fc(x)
        loss = F.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits} if self.as_dict else (loss, logits)


@pytest.mark.parametrize("as_dict, pick", [(True, "out['loss']"), (False, "out[0]")], ids=["dict", "tuple"])
def test_trace_training_step__a_model_returning_more_than_its_loss_is_told_how_to_pick_it(as_dict, pick):
    inputs = (torch.randn(2, 4), torch.tensor([0, 2]))
    with pytest.raises(PlacerError, match=rf"returned {'dict' if as_dict else 'tuple'}: .*loss_fn.*{re.escape(pick)}"):
        trace_training_step(_LossAndLogits(as_dict), inputs)
    loss_fn = (lambda out: out["loss"]) if as_dict else (lambda out: out[0])
    graph = trace_training_step(_LossAndLogits(as_dict), inputs, loss_fn=loss_fn)
    assert len(_ops(graph, kind="aten.nll_loss_forward")) == 1


class _SdpaAttention(nn.Module):
    """Self-attention through F.scaled_dot_product_attention: one CPU flash kernel, not two bmm ops."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_trace_training_step__cpu_attention_kernel_counts_its_matmuls():
    """torch's flop_counter has no formula for the CPU flash kernel (the step counted its attention as 0
    FLOPs); it counts as the flash kernel: Q K^T and P V forward, five such matmuls backward."""
    batch, seq, width, heads = 2, 16, 32, 4
    torch.manual_seed(0)
    graph = trace_training_step(_SdpaAttention(width, heads), (torch.randn(batch, seq, width),), name="sdpa")
    kernel = _ops(graph, kind="aten._scaled_dot_product_flash_attention_for_cpu")
    backward = _ops(graph, kind="aten._scaled_dot_product_flash_attention_for_cpu_backward")
    one_matmul = 2 * batch * heads * seq * seq * (width // heads)
    assert graph.flops[kernel].tolist() == [2 * one_matmul]
    assert graph.flops[backward].tolist() == [5 * one_matmul]
    projection = 2 * batch * seq * width * 3 * width
    assert graph.flops[graph.phases == PHASE_CODE["forward"]].sum() == projection + 2 * one_matmul


class _VectorProducts(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.matrix = nn.Parameter(torch.randn(width, width))
        self.vector = nn.Parameter(torch.randn(width))
        self.batches = nn.Parameter(torch.randn(3, width, width))
        self.bilinear = nn.Bilinear(width, 5, 2)

    def forward(self, x, y):
        return (torch.mv(self.matrix, x[0]).sum() + torch.dot(self.vector, x[0])
                + torch.addmv(self.vector, self.matrix, x[1]).sum()
                + torch.addbmm(self.matrix, self.batches, self.batches).sum() + self.bilinear(x, y).sum())


def test_trace_training_step__vector_products_and_bilinear_count_their_multiply_adds():
    """mv, dot, addmv, addbmm and nn.Bilinear's _trilinear have no formula in torch's flop_counter (0 FLOPs
    before); a multiply-add is 2 FLOPs, the added term not counted (as torch's addmm)."""
    width, rows = 8, 4
    torch.manual_seed(0)
    graph = trace_training_step(_VectorProducts(width), (torch.randn(rows, width), torch.randn(rows, 5)),
                                name="products")
    forward = graph.phases == PHASE_CODE["forward"]

    def flops(kind):
        return graph.flops[forward & (graph.op_kinds == kind)].tolist()

    assert flops("aten.mv") == [2 * width * width]
    assert flops("aten.dot") == [2 * width]
    assert flops("aten.addmv") == [2 * width * width]
    assert flops("aten.addbmm") == [2 * 3 * width * width * width]
    # out[b, o] = sum_ij x[b, i] W[o, i, j] y[b, j]: x W over (b, o, i, j), then that times y over (b, o, j)
    assert flops("aten._trilinear") == [2 * rows * 2 * width * 5 + 2 * rows * 2 * 5]


class _Spectral(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        y = self.fc(x)
        mixed = torch.fft.fft(torch.fft.rfft(y))  # r2c, then c2c over the one-sided half
        plane = torch.fft.rfft2(y.view(y.shape[0], 4, -1))  # r2c over two dims
        return torch.fft.irfft(mixed, n=y.shape[-1]).sum() + plane.abs().sum()


def test_trace_training_step__ffts_count_five_n_log2_n_per_complex_transform():
    """torch's flop_counter has no FFT formula (0 FLOPs before): 5 N log2 N per complex transform of length
    N, half for a real signal; an r2c over two dims of 4 and 4 counts log2(16)."""
    width, rows = 16, 4
    torch.manual_seed(0)
    graph = trace_training_step(_Spectral(width), (torch.randn(rows, width),), name="spectral")
    forward = graph.phases == PHASE_CODE["forward"]

    def flops(kind):
        return graph.flops[forward & (graph.op_kinds == kind)].tolist()

    half = width // 2 + 1
    assert flops("aten._fft_r2c") == [2.5 * rows * width * 4, 2.5 * rows * width * 4]  # rfft; rfft2 on 4 x 4
    assert flops("aten._fft_c2c") == [round(5 * rows * half * math.log2(half))]  # N = 9: not a power of 2
    assert flops("aten._fft_c2r") == [2.5 * rows * width * 4]  # the real output's full length, 16
    backward = graph.phases == PHASE_CODE["backward"]
    assert np.all(graph.flops[backward & np.char.startswith(graph.op_kinds.astype(str), "aten._fft_")] > 0)


class _ComplexLinear(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width, dtype=torch.cfloat))

    def forward(self, x):
        return (x @ self.w).abs()


def test_trace_training_step__a_complex_matmul_counts_its_real_multiply_adds():
    """Counted with the real formula, 2 M N K: a complex multiply-add is 8 real FLOPs, so complex models were
    costed at a quarter of their work (the FFTs were already in real FLOPs)."""
    graph = trace_training_step(_ComplexLinear(8), torch.randn(4, 8, dtype=torch.cfloat), name="cplx")
    forward = graph.phases == PHASE_CODE["forward"]
    assert graph.flops[forward & (graph.op_kinds == "aten.mm")].tolist() == [4 * 2 * 4 * 8 * 8]


class _MaskRouted(nn.Module):
    """Routes the rows a boolean mask picks to an expert: the picked rows' count depends on the data."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 1)
        self.expert = nn.Linear(4, 4)

    def forward(self, x):
        picked = self.router(x).squeeze(-1) > 0
        return self.expert(x[picked]).sum()


def test_trace_training_step__data_dependent_shape_is_one_error_saying_what_to_do():
    """Was fake tensors' own DynamicOutputShapeException naming only the aten op."""
    with pytest.raises(PlacerError, match=r"aten\.index .*shape depends on the data.*give the model fixed shapes"):
        trace_training_step(_MaskRouted(), (torch.randn(6, 4),), name="routed")


class _InPlaceViews(nn.Module):
    """Shape-only in-place ops on an activation, a shrinking and a growing resize_ on a gradient-free copy."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = self.fc(x)
        flat = y.view(-1)  # a view taken before the in-place views: they leave its data as it was
        y.unsqueeze_(0).squeeze_(0).t_().transpose_(0, 1).as_strided_((3, 6), (6, 1))
        shrunk = x.detach().clone().resize_(2, 6)
        grown = x.detach().clone().resize_(4, 6)
        return flat.sum() + y.mean() + shrunk.sum() + grown.sum()


def test_trace_training_step__in_place_views_move_and_allocate_nothing():
    """Were costed as reading and writing the whole tensor, and made the view taken before them read them."""
    graph = trace_training_step(_InPlaceViews(), (torch.randn(3, 6),))
    restrided = [_ops(graph, kind=f"aten.{name}", phase="forward")[0]
                 for name in ("unsqueeze_", "squeeze_", "t_", "transpose_", "as_strided_")]
    shrink, grow = _ops(graph, kind="aten.resize_", phase="forward")
    for op in [*restrided, shrink]:
        assert (graph.bytes_accessed[op], graph.out_bytes[op]) == (0, 0), graph.op_kinds[op]
        assert graph.flops[op] == 0
    assert graph.bytes_accessed[grow] > 0  # growing allocates and copies
    addmm = _ops(graph, kind="aten.addmm", phase="forward")[0]
    view = _ops(graph, kind="aten.view", phase="forward")[0]
    # each in-place view reads the tensor its predecessor left; the sum of the earlier view reads that view
    chain = [addmm, *restrided]
    for producer, op in zip(chain, restrided):
        assert _in_edges(graph, op) == {producer: 3 * 6 * 4}
    assert _in_edges(graph, _ops(graph, kind="aten.sum", phase="forward")[0]) == {view: 3 * 6 * 4}
    assert _in_edges(graph, _ops(graph, kind="aten.mean", phase="forward")[0]) == {restrided[-1]: 3 * 6 * 4}
    assert len({graph.colocation[op] for op in [addmm, view, *restrided]}) == 1


class _Rebinding(nn.Module):
    """``holder.set_(...)``: a gradient-free copy of the input pointed at the activation's data (as a tensor, or
    as its storage), both read afterwards; and a resize_ that grows a copy of the input."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.source = source

    def forward(self, x):
        y = self.fc(x)
        holder = x.detach().clone()
        data = y.detach()
        if self.source == "tensor":
            holder.set_(data)
        else:
            holder.set_(data.untyped_storage(), 0, (3, 6), (6, 1))
        grown = x.detach().clone().resize_(4, 6)
        return y.sum() + holder.sum() + grown.sum()


@pytest.mark.parametrize("source", ["tensor", "storage"])
def test_trace_training_step__set_makes_a_view_of_its_source_and_moves_nothing(source):
    """Was costed as a write of the whole tensor, and re-registered the source's storage as written by it (the
    activation's other reader then read set_); given a storage, the tensor's readers lost the activation."""
    graph = trace_training_step(_Rebinding(source), (torch.randn(3, 6),))
    addmm = _ops(graph, kind="aten.addmm", phase="forward")[0]
    rebind = _ops(graph, kind="aten.set_", phase="forward")[0]
    assert (graph.bytes_accessed[rebind], graph.out_bytes[rebind], graph.flops[rebind]) == (0, 0, 0)
    assert _in_edges(graph, rebind) == {addmm: 3 * 6 * 4}  # the data it now views, not the copy it dropped
    assert graph.colocation[rebind] == graph.colocation[addmm]
    first_sum, second_sum = _ops(graph, kind="aten.sum", phase="forward")[:2]
    assert _in_edges(graph, first_sum) == {addmm: 3 * 6 * 4}  # y.sum(): y is addmm's
    assert _in_edges(graph, second_sum) == {rebind: 3 * 6 * 4}  # holder.sum()


def test_trace_training_step__growing_resize_allocates_its_new_storage_and_copies_the_old():
    """Was 0 out_bytes (it allocates the grown storage) and bytes accessed of twice the new size."""
    graph = trace_training_step(_Rebinding("tensor"), (torch.randn(3, 6),))
    grow = _ops(graph, kind="aten.resize_", phase="forward")[0]
    assert graph.out_bytes[grow] == 4 * 6 * 4
    assert graph.bytes_accessed[grow] == 2 * 3 * 6 * 4  # reads and writes the old storage's bytes
    assert graph.flops[grow] == 0
    assert _in_edges(graph, _ops(graph, kind="aten.sum", phase="forward")[2]) == {grow: 4 * 6 * 4}


def test_trace_training_step__one_tensor_given_as_two_inputs_is_refused():
    """(x, x): the graph named the tensor once, input 0 had no readers, and a placed step fed input 1's value
    to both, silently."""
    class AutoEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.encode, self.decode = nn.Linear(6, 2), nn.Linear(2, 6)

        def forward(self, x, target):
            return (self.decode(self.encode(x)) - target).square().mean()

    x = torch.randn(4, 6)
    with pytest.raises(PlacerError, match=r"example inputs 0 and 1 are the same tensor: pass a copy"):
        trace_training_step(AutoEncoder(), (x, x))
    graph = trace_training_step(AutoEncoder(), (x, x.clone()))
    inputs = np.flatnonzero(graph.op_kinds == "Input")
    assert len(inputs) == 2 and all(np.isin(inputs, graph.edge_src))  # each input is read


def test_import_torch_spec__a_file_that_is_not_python_is_named_so(tmp_path):
    """A spec naming a .json file said "cannot import ...: AttributeError: 'NoneType' object has no attribute
    'loader'"."""
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(PlacerError, match=r"x.json' is not a Python file \(.py\)"):
        import_torch_spec(f"{tmp_path / 'x.json'}:f")


class _TiedThroughAList(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self._tied = [self.emb.weight]  # the output projection reads it through a plain list
        self.bias = nn.Parameter(torch.zeros(20))

    def forward(self, x):
        return F.linear(self.emb(x), self._tied[0], self.bias)


def _weight_decay_over_a_saved_list():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    params = list(model.parameters())  # made before the step: the real tensors, not the ones traced
    return model, torch.randn(4, 8), lambda out: out.sum() + 1e-4 * sum(p.pow(2).sum() for p in params)


@pytest.mark.parametrize("build, name", [(lambda: (_TiedThroughAList(), torch.randint(0, 20, (2, 5))), "emb.weight"),
                                         (_weight_decay_over_a_saved_list, "0.weight")])
def test_trace__a_parameter_read_around_its_module_is_one_error_naming_it(build, name):
    """It became a constant input (const:N), its gradient bypassed the parameter's Variable op, and the import
    said nothing: the torch measurer then refused the step with a mismatch naming neither."""
    with pytest.raises(PlacerError, match=f"parameter '{re.escape(name)}' is read through a reference the trace "
                                          "cannot follow"):
        trace_training_step(*build())


def test_trace__a_frozen_parameter_read_through_a_list_is_a_constant_as_in_the_real_step():
    """It has no gradient to miss: refusing it broke a model that imported and measured before."""
    model = _TiedThroughAList()
    model.emb.weight.requires_grad_(False)
    graph = trace_training_step(model, torch.randint(0, 20, (2, 5)))
    assert any(name.startswith("const:") for name in graph.op_names)


def test_trace__weight_decay_over_the_models_parameters_read_as_the_step_runs_is_traced():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    graph = trace_training_step(model, torch.randn(4, 8),
                                lambda out: out.sum() + 1e-4 * sum(p.pow(2).sum() for p in model.parameters()))
    assert not any(name.startswith("const:") for name in graph.op_names)


class _LengthsAsList(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, lengths):
        return torch.stack([self.fc(x[i, :n]).sum() for i, n in enumerate(lengths.tolist())])


def test_trace__tolist_reads_values_without_an_op_the_real_step_never_runs():
    """A fake tensor's tolist dispatches an aten.unbind to reach its elements, a real one's reads its data:
    the graph held the unbind, and the torch measurer refused every step ("is aten.unbind in the graph but the
    step ran aten.select"). Iterating a tensor unbinds it in a real step too, and stays in the graph."""
    graph = trace_training_step(_LengthsAsList(), (torch.randn(3, 5, 4), torch.tensor([1, 1, 1])))
    assert "aten.unbind" not in set(graph.op_kinds) and "aten.select" in set(graph.op_kinds)
    iterated = trace_training_step(nn.Linear(4, 2), torch.randn(3, 4),
                                   lambda out: torch.stack([row.sum() for row in out]).sum())
    assert "aten.unbind" in set(iterated.op_kinds)
