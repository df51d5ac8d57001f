"""The shapes a model declares for its intermediate tensors and outputs give way to what its inputs' sizes give
(graphs.inference.declared_shapes): a batch-dynamic export whose declarations say batch 1 is costed at the
batch asked for, as the same model exported at that batch."""

from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from graphs.errors import PlacerError
from graphs.inference.onnx_import import import_onnx
from graphs.inference.openvino_import import import_openvino_ir

BATCH = 32


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv2(torch.relu(self.conv1(x)))).mean(dim=(2, 3)))


class SmallMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(20, 32), nn.Linear(32, 5)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(torch.flatten(x, 1))))


class SmallBlock(nn.Module):
    """A post-LN transformer block over 6 tokens of 16 (2 heads); its reshapes leave the batch to -1, so the
    exports at batch 1 and 32 have the same ops."""

    def __init__(self, tokens: int = 6, width: int = 16, heads: int = 2):
        super().__init__()
        self.tokens, self.width, self.heads = tokens, width, heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        split = (-1, self.tokens, self.heads, self.width // self.heads)
        q, k, v = (t.reshape(split).transpose(1, 2) for t in self.qkv(x).split(self.width, dim=-1))
        attended = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v
        x = self.norm(x + self.proj(attended.transpose(1, 2).reshape(-1, self.tokens, self.width)))
        return x + self.down(torch.relu(self.up(x)))


MODELS = {"cnn": (SmallCnn, (3, 16, 16)), "mlp": (SmallMlp, (4, 5)), "block": (SmallBlock, (6, 16))}


def _export(name: str, path: Path, batch: int, dynamic: bool) -> Path:
    """The model exported by torch.onnx's TorchScript exporter at ``batch``, its batch axis dynamic or not."""
    make, dims = MODELS[name]
    torch.manual_seed(0)
    axes = {"dynamic_axes": {"x": {0: "batch"}, "y": {0: "batch"}}} if dynamic else {}
    torch.onnx.export(make().eval(), (torch.randn(batch, *dims),), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], **axes)
    return path


def _declared_at_batch_1(dynamic: Path, path: Path) -> Path:
    """The dynamic export with every intermediate and output shape declared at batch 1 (as a tool that
    annotates shapes, run at batch 1, leaves it); its input stays batch-dynamic."""
    model = onnx.load(str(dynamic))
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    batch.dim_value = 1
    model = onnx.shape_inference.infer_shapes(model)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    assert model.graph.value_info and model.graph.value_info[-1].type.tensor_type.shape.dim[0].dim_value == 1
    onnx.save(model, str(path))
    return path


def _per_op(graph) -> list:
    return list(zip(graph.op_names.tolist(), graph.op_kinds.tolist(), graph.flops.tolist(), graph.out_bytes.tolist(),
                    graph.bytes_accessed.tolist()))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("declared_at_batch_1", [False, True])
def test_import_onnx__a_dynamic_batch_export_at_batch_32_costs_as_the_static_batch_32_export(
        tmp_path, name, declared_at_batch_1):
    static = import_onnx(str(_export(name, tmp_path / "static.onnx", BATCH, dynamic=False)))
    path = _export(name, tmp_path / "dynamic.onnx", 1, dynamic=True)
    if declared_at_batch_1:
        path = _declared_at_batch_1(path, tmp_path / "declared.onnx")
    graph = import_onnx(str(path), input_shapes={"x": (BATCH, *MODELS[name][1])})
    assert _per_op(graph) == _per_op(static)
    assert graph.edge_bytes.tolist() == static.edge_bytes.tolist() and "tensors_without_size" not in graph.meta


def test_import_openvino_ir__the_ir_of_an_export_declared_at_batch_1_costs_batch_32_at_batch_32(tmp_path):
    """OpenVINO's converter reads no declared intermediate shape, and reshaping the model sizes every op."""
    import openvino as ov

    irs = {}
    static = _export("cnn", tmp_path / "static.onnx", BATCH, dynamic=False)
    declared = _declared_at_batch_1(_export("cnn", tmp_path / "dynamic.onnx", 1, dynamic=True),
                                    tmp_path / "declared.onnx")
    for label, path in (("static", static), ("declared", declared)):
        irs[label] = tmp_path / f"{label}.xml"
        ov.save_model(ov.convert_model(str(path)), str(irs[label]), compress_to_fp16=False)
    graph = import_openvino_ir(str(irs["declared"]), input_shapes={"x": (BATCH, 3, 16, 16)})
    assert _per_op(graph) == _per_op(import_openvino_ir(str(irs["static"])))


def _save(tmp_path, nodes, inputs, outputs, value_info=(), domains=(), initializers=()) -> str:
    graph = helper.make_graph(nodes, "declared", inputs, outputs, list(initializers), value_info=list(value_info))
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(domain, 1) for domain in domains]
    path = tmp_path / "declared.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return str(path)


def test_import_onnx__a_declared_size_the_inputs_contradict_gives_way_and_the_ops_after_it_follow(tmp_path):
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"], name="neg")]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, ["n", 4])], [value("y", TensorProto.FLOAT, [1, 4])],
                 [value("r", TensorProto.FLOAT, [1, 4])])
    graph = import_onnx(path, input_shapes={"x": (8, 4)})
    assert graph.out_bytes.tolist() == [8 * 4 * 4, 8 * 4 * 4] and graph.flops.tolist() == [32, 32]


def test_import_onnx__the_shapes_a_subgraph_body_declares_give_way_too(tmp_path):
    """An If whose branches declare their tensors at batch 1: at batch 8, its then branch's MatMul (8 x 4 x 4)
    and Relu are costed at 8 rows, and so is its output."""
    value = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("MatMul", ["h", "W"], ["t0"]), helper.make_node("Relu", ["t0"], ["t"])],
                             "then", [], [value("t", TensorProto.FLOAT, [1, 4])],
                             value_info=[value("t0", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"])], "else", [],
                              [value("e", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=then, else_branch=other)]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, ["n", 4]), value("flag", TensorProto.BOOL, [])],
                 [value("y", TensorProto.FLOAT, [1, 4])], [value("h", TensorProto.FLOAT, [1, 4])],
                 initializers=[numpy_helper.from_array(np.ones((4, 4), np.float32), "W")])
    graph = import_onnx(path, input_shapes={"x": (8, 4)})
    assert graph.flops.tolist() == [8 * 4, 2 * 8 * 4 * 4 + 8 * 4]
    assert graph.out_bytes.tolist() == [8 * 4 * 4, 8 * 4 * 4]


def test_import_onnx__a_declaration_still_sizes_what_inference_cannot_and_the_ops_after_it(tmp_path):
    """An op of a domain onnx does not know has no inferred output: its declared shape sizes it, and the
    Relu that reads it, which the inference from the inputs alone left unsized."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("FancyOp", ["x"], ["f"], name="fancy", domain="com.example"),
             helper.make_node("Relu", ["f"], ["y"], name="relu")]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, ["n", 4])],
                 [value("y", TensorProto.FLOAT, ["m", "k"])], [value("f", TensorProto.FLOAT, [8, 6])],
                 domains=["com.example"])
    graph = import_onnx(path, input_shapes={"x": (8, 4)})
    assert graph.out_bytes.tolist() == [8 * 6 * 4, 8 * 6 * 4] and "tensors_without_size" not in graph.meta


def test_import_onnx__a_declared_dim_fills_one_inference_leaves_without_a_size(tmp_path):
    """NonZero's count of non-zeros is known at run time only: a declared count sizes it (and its reader)."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
             helper.make_node("Transpose", ["nz"], ["y"], name="transpose")]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, ["n", 4])], [value("y", TensorProto.INT64, ["k", 2])],
                 [value("nz", TensorProto.INT64, [2, 5])])
    graph = import_onnx(path, input_shapes={"x": (8, 4)})
    assert graph.out_bytes.tolist() == [2 * 5 * 8, 5 * 2 * 8] and "tensors_without_size" not in graph.meta


def test_import_onnx__sizes_the_model_cannot_take_are_refused_though_it_declares_shapes_for_them(tmp_path):
    """A U-Net annotated at 32x32, imported at 31x33: its Concat's halves (30x32, 31x33) do not match. The
    declaration sized the Concat (32x32) where inference could not, so no check ran and the import went on."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest", name="up"),
             helper.make_node("Concat", ["u", "x"], ["c"], axis=1, name="cat"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "unet", [value("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [value("y", TensorProto.FLOAT, [1, 6, 32, 32])],
                              [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
                              value_info=[value("c", TensorProto.FLOAT, [1, 6, 32, 32])])
    path = tmp_path / "unet.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(PlacerError, match=r"x=1,3,31,33 \(--input-shape\), node 'cat' \(Concat\) fails shape "):
        import_onnx(str(path), input_shapes={"x": (1, 3, 31, 33)})
    assert import_onnx(str(path), input_shapes={"x": (1, 3, 32, 32)}).out_bytes.tolist()[-1] == 6 * 32 * 32 * 4


def _computed_flatten(tmp_path, unfolded_op: bool = False) -> str:
    """x (N, 4, 5) -> flat = Reshape(x, [-1, ReduceProd(Shape(x)[1:3])]) (its target computed at run time, then
    passed through Relu, an op the folding does not know, if ``unfolded_op``) -> y = Relu(flat); flat and y
    declared (1, 20), at the export's batch."""
    value, tensor = helper.make_tensor_value_info, helper.make_tensor
    product = [helper.make_node("ReduceProd", ["tail"], ["p"], keepdims=1)] if not unfolded_op else [
        helper.make_node("ReduceProd", ["tail"], ["p0"], keepdims=1), helper.make_node("Relu", ["p0"], ["p"])]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "start", "end"], ["tail"]),
             *product, helper.make_node("Concat", ["rest", "p"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"], name="flatten"),
             helper.make_node("Relu", ["flat"], ["y"], name="relu")]
    initializers = [tensor("start", TensorProto.INT64, [1], [1]), tensor("end", TensorProto.INT64, [1], [3]),
                    tensor("rest", TensorProto.INT64, [1], [-1])]
    return _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, ["N", 4, 5])],
                 [value("y", TensorProto.FLOAT, [1, 20])], [value("flat", TensorProto.FLOAT, [1, 20])],
                 initializers=initializers)


def test_import_onnx__a_reshape_whose_target_folds_through_reduce_prod_follows_the_batch_not_its_declaration(
        tmp_path):
    """The target [-1, 20] folds (ReduceProd of the trailing dims, as a flatten writes it): at batch 32 the
    Reshape and the Relu are (32, 20); the declared (1, 20) sized both, the Relu costing 20 FLOPs."""
    graph = import_onnx(_computed_flatten(tmp_path), input_shapes={"x": (BATCH, 4, 5)})
    written = dict(zip(graph.op_names.tolist(), graph.out_bytes.tolist()))
    assert written["flatten"] == written["relu"] == BATCH * 20 * 4
    assert graph.flops.tolist()[-1] == BATCH * 20 and "tensors_without_size" not in graph.meta


def test_import_onnx__a_reshape_whose_target_does_not_fold_leaves_a_stale_declaration_out_and_says_so(tmp_path):
    """Through Relu the target stays unknown; the declared (1, 20) holds 20 elements where x holds 640: a size
    of the export's batch, not taken, and neither is the Relu's, computed from it. Both are unsized, counted."""
    graph = import_onnx(_computed_flatten(tmp_path, unfolded_op=True), input_shapes={"x": (BATCH, 4, 5)})
    assert graph.meta["unsized_tensors_by_op"] == {"Relu": 1, "Reshape": 1}
    assert import_onnx(_computed_flatten(tmp_path, unfolded_op=True)).out_bytes.tolist()[-2:] == [80, 80]  # batch 1


def test_import_onnx__a_reshape_in_a_loop_body_reads_its_target_from_the_outer_graph(tmp_path):
    """A Loop of two runs, each flattening x (N, 4, 5) to [-1, 20], an initializer of the outer graph (as
    torch.onnx hoists a body's constants): onnx's inference of a body sees the outer tensors' types and the
    values its data propagation computed, not the outer initializers' or Constants' values, so the body's
    declarations at batch 1 sized it. Folded into the body, each run's Relu is (32, 20), stacked (2, 32, 20)."""
    value, tensor = helper.make_tensor_value_info, helper.make_tensor
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                              helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
                              helper.make_node("Relu", ["flat"], ["r"])], "flatten",
                             [value("i", TensorProto.INT64, []), value("c_in", TensorProto.BOOL, [])],
                             [value("c_out", TensorProto.BOOL, []), value("r", TensorProto.FLOAT, [1, 20])],
                             value_info=[value("flat", TensorProto.FLOAT, [1, 20])])
    initializers = [tensor("flat_shape", TensorProto.INT64, [2], [-1, 20]), tensor("two", TensorProto.INT64, [], [2])]
    path = _save(tmp_path, [helper.make_node("Loop", ["two", ""], ["y"], name="loop", body=body)],
                 [value("x", TensorProto.FLOAT, ["N", 4, 5])], [value("y", TensorProto.FLOAT, [2, 1, 20])],
                 initializers=initializers)
    graph = import_onnx(path, input_shapes={"x": (BATCH, 4, 5)})
    assert graph.flops.tolist() == [2 * BATCH * 20] and graph.out_bytes.tolist() == [2 * BATCH * 20 * 4]
    assert "tensors_without_size" not in graph.meta


class AppendingLoop(nn.Module):
    """A list appended in a loop over x's steps, stacked, concatenated and indexed after it: scripted, a Loop
    carrying a sequence (SequenceInsert in its body; ConcatFromSequence and SequenceAt after it); traced, the
    loop unrolled."""

    def __init__(self):
        super().__init__()
        self.step = nn.Linear(8, 8)

    def forward(self, x):
        outs: List[torch.Tensor] = []
        for i in range(x.size(1)):
            outs.append(self.step(x[:, i]))
        return torch.stack(outs, 1), torch.cat(outs, 0), outs[2]


def _export_loop(path: Path, batch: int, scripted: bool, declared_at_batch_1: bool = False) -> str:
    torch.manual_seed(0)
    module = torch.jit.script(AppendingLoop()) if scripted else AppendingLoop()
    axes = {"dynamic_axes": {"x": {0: "batch"}}} if scripted else {}
    torch.onnx.export(module, (torch.randn(batch, 5, 8),), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], **axes)
    if declared_at_batch_1:  # every tensor's shape inferred at batch 1 and declared, the body's too
        model = onnx.load(str(path))
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
        onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize("declared_at_batch_1", [False, True])
def test_import_onnx__a_list_appended_in_a_loop_costs_as_the_unrolled_export_at_the_batch_given(
        tmp_path, declared_at_batch_1):
    """At x (3, 5, 8): the Loop runs its body five times, each a Linear of (3, 8) (its Slice of x read its axes
    from a Constant outside the body, which onnx's inference of a body does not see: it was costed at one row
    by one column), and what reads its sequence is sized as the unrolled export's stack, cat and outs[2] (they
    were unsized, or sized at batch 1)."""
    unrolled = import_onnx(_export_loop(tmp_path / "unrolled.onnx", 3, scripted=False))
    path = _export_loop(tmp_path / "loop.onnx", 1, scripted=True, declared_at_batch_1=declared_at_batch_1)
    graph = import_onnx(path, input_shapes={"x": (3, 5, 8)})
    flops, written = (dict(zip(graph.op_kinds.tolist(), values)) for values in (graph.flops, graph.out_bytes))
    assert flops["Loop"] == sum(unrolled.flops[unrolled.op_kinds == "Gemm"]) == 5 * (2 * 3 * 8 * 8 + 3 * 8)
    stack, cat = unrolled.out_bytes[unrolled.op_kinds == "Concat"].tolist()
    assert graph.out_bytes[graph.op_kinds == "ConcatFromSequence"].tolist() == [stack, cat] == [3 * 5 * 8 * 4] * 2
    assert written["SequenceAt"] == 3 * 8 * 4  # outs[2], the unrolled export's third Gemm's output
