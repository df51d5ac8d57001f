"""Do the importers agree? Small models of each kind, defined once in PyTorch and imported four ways: the
torch training step (graphs.torch: its forward ops are the phase "forward"), the model's ONNX export
(graphs.inference.onnx_import, batch 2 like the step), that file converted to OpenVINO IR
(graphs.inference.openvino_import) and, where a twin of the same sizes is easy, a Keras training step (graphs.tf).

What is comparable, and how closely:

- multiply-add FLOPs (convolutions, matmuls, einsums, attention, recurrent layers). The torch importer counts
  nothing else (element-wise ops cost 0 there, costed by their bytes), so its forward FLOPs are theirs. The
  layers have no biases: torch's formulas leave a bias out, ONNX's Conv and Gemm count it. Keras counts as
  torch does; ONNX and OpenVINO too, plus what a fused op does beside its products, written out per case
  (``Case.extra``: a recurrent op's gate arithmetic, OpenVINO's attention's scale and softmax). Exactly.
- every op of the ONNX and OpenVINO graphs has a formula (``meta["ops_without_flops"]`` is empty);
- pooling and resizing, in every graph that has them, exactly;
- the ONNX graph's total against the OpenVINO one's, exactly, where the two spell every op alike: not where
  the export writes out what OpenVINO fuses (GELU: five ops, 1 FLOP an element each, against one Gelu;
  attention's scale on q and k against one per score) nor for recurrent ops (OpenVINO's bias is one vector);
- parameters: the trainable weights of the torch and Keras steps, and with the float buffers the ONNX file's
  initializers, beside its Constant nodes (weights too: the scalars of a GELU, a resize's scales). OpenVINO's
  converter folds some weights (a batch norm into a scale and a shift) and adds constants (zero initial
  states and biases, resize scales), so its count is not compared.

Weights are drawn at random, not left at their initial ones and zeros, which the exporters would merge or fold.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from graphs.opgraph import PHASE_CODE

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 2
MULTIPLY_ADD_KINDS = {
    "onnx": ("Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN"),
    "openvino": ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData",
                 "MatMul", "Einsum", "ScaledDotProductAttention", "LSTMSequence", "GRUSequence", "RNNSequence"),
    "keras": ("Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "MatMul", "BatchMatMulV2", "Einsum"),
}
FAMILIES = {  # kinds of the same work in each vocabulary, compared exactly
    "pool": {"onnx": ("MaxPool", "AveragePool", "GlobalAveragePool"), "openvino": ("MaxPool", "AvgPool", "ReduceMean"),
             "keras": ("MaxPool", "AvgPool")},
    "resize": {"onnx": ("Resize",), "openvino": ("Interpolate",),
               "keras": ("ResizeBilinear", "ResizeBicubic", "ResizeNearestNeighbor")},
}


class ConvNet(nn.Module):
    """Strided, depthwise, grouped and transposed convolutions, batch norm, max and average pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(16)  # after the ReLU: the export cannot fold it into the stem
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.grouped = nn.Conv2d(16, 32, 3, padding=1, groups=4, bias=False)
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2, bias=False)
        self.fc = nn.Linear(16 * 8 * 8, 10, bias=False)

    def forward(self, x):  # (B, 3, 32, 32)
        x = self.norm(torch.relu(self.stem(x)))  # (B, 16, 16, 16)
        x = F.max_pool2d(self.grouped(self.depthwise(x)), 2)  # (B, 32, 8, 8)
        x = F.avg_pool2d(self.up(x), 2)  # (B, 16, 8, 8)
        return self.fc(x.flatten(1))


def keras_convnet():
    import keras

    layers = keras.layers
    x = inputs = keras.Input((32, 32, 3))
    x = layers.BatchNormalization()(layers.ReLU()(layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(x)))
    x = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = layers.MaxPooling2D(2)(layers.Conv2D(32, 3, padding="same", groups=4, use_bias=False)(x))
    x = layers.AveragePooling2D(2)(layers.Conv2DTranspose(16, 2, strides=2, use_bias=False)(x))
    return keras.Model(inputs, layers.Dense(10, use_bias=False)(layers.Flatten()(x)))


class Decoder(nn.Module):
    """A grouped transposed convolution, a convolution strided along one axis, pixel shuffle, nearest,
    bilinear and bicubic resizing, softplus, global average pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1, groups=2, bias=False)
        self.conv = nn.Conv2d(8, 16, 3, stride=(2, 1), padding=1, bias=False)

    def forward(self, x):  # (B, 8, 8, 8)
        x = F.pixel_shuffle(self.conv(self.up(x)), 2)  # (B, 16, 8, 16) -> (B, 4, 16, 32)
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")  # (B, 4, 32, 64)
        x = F.interpolate(x, scale_factor=0.5, mode="bilinear")  # (B, 4, 16, 32)
        x = F.softplus(F.interpolate(x, size=(20, 24), mode="bicubic"))
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


class Encoder(nn.Module):
    """Token embedding, layer norm, multi-head attention (torch's fused attention kernel), a GELU feed-forward,
    an einsum, a batched matmul and a softmax."""

    def __init__(self, vocab: int = 50, width: int = 64, heads: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, bias=False, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(width, hidden, bias=False), nn.GELU(), nn.Linear(hidden, width, bias=False))
        self.project = nn.Parameter(torch.randn(width, 16))

    def forward(self, tokens):  # (B, T)
        x = self.norm(self.embed(tokens))
        x = x + self.attention(x, x, x, need_weights=False)[0]
        x = x + self.ff(x)
        y = torch.einsum("btd,de->bte", x, self.project)
        return torch.softmax(y @ y.transpose(1, 2), dim=-1)


def keras_encoder():
    import keras

    layers = keras.layers
    tokens = keras.Input((12,), dtype="int32")
    x = layers.LayerNormalization()(layers.Embedding(50, 64)(tokens))
    x = x + layers.MultiHeadAttention(4, 16, use_bias=False)(x, x)
    x = x + layers.Dense(64, use_bias=False)(layers.Dense(128, activation="gelu", use_bias=False)(x))
    y = layers.EinsumDense("btd,de->bte", output_shape=(12, 16))(x)
    scores = keras.ops.matmul(y, keras.ops.transpose(y, (0, 2, 1)))
    return keras.Model(tokens, keras.ops.softmax(scores, axis=-1))


class Recurrent(nn.Module):
    """An LSTM and a GRU (torch's reset gate after the matmul: ONNX's linear_before_reset, Keras's reset_after)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(64, 64, batch_first=True, bias=False)
        self.gru = nn.GRU(64, 48, batch_first=True, bias=False)
        self.fc = nn.Linear(48, 5, bias=False)

    def forward(self, x):  # (B, T, 64)
        return self.fc(self.gru(self.lstm(x)[0])[0])


def keras_recurrent():
    import keras

    layers = keras.layers
    x = inputs = keras.Input((7, 64))
    x = layers.LSTM(64, return_sequences=True, use_bias=False, unroll=True)(x)  # unrolled: traced with shapes
    x = layers.GRU(48, return_sequences=True, use_bias=False, unroll=True)(x)
    return keras.Model(inputs, layers.Dense(5, use_bias=False)(x))


class Norms(nn.Module):
    """Layer, instance and batch norm (after a ReLU: neither exporter folds it into its neighbours), log-softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.LayerNorm(16)
        self.mix = nn.Linear(16, 16, bias=False)
        self.instance = nn.InstanceNorm1d(8, affine=True)
        self.batch = nn.BatchNorm1d(8)

    def forward(self, x):  # (B, 8, 16)
        x = self.instance(self.mix(self.layer(x)))
        return torch.log_softmax(self.batch(torch.relu(x)), dim=-1)


STEPS = BATCH * 7  # the recurrent case's time steps x examples
SCORES = BATCH * 4 * 12 * 12  # the encoder's attention scores: heads x queries x keys per example


@dataclass(frozen=True)
class Case:
    name: str
    model: Callable[[], nn.Module]
    example: Callable[[], torch.Tensor]
    keras_model: Callable | None = None
    extra: dict = field(default_factory=dict)  # {importer: FLOPs its fused ops add to the multiply-adds}
    same_totals: bool = True  # whether the ONNX and OpenVINO graphs spell every element-wise op alike


CASES = [
    Case("convnet", ConvNet, lambda: torch.randn(BATCH, 3, 32, 32), keras_convnet),
    Case("decoder", Decoder, lambda: torch.randn(BATCH, 8, 8, 8)),
    # OpenVINO's attention: its scale and softmax, 1 + 5 a score (the ONNX export writes them as ops of their own,
    # and GELU as five)
    Case("encoder", Encoder, lambda: torch.randint(0, 50, (BATCH, 12)), keras_encoder,
         extra={"openvino": SCORES * (1 + 5)}, same_totals=False),
    # the gate arithmetic per step, example and hidden unit (LSTM 13, GRU 11); OpenVINO's ops also add their
    # bias, one vector of 4 x hidden each (the LSTM's gates, the GRU's three and its new gate's R bias), which
    # the converter makes of zeros for a layer without one
    Case("recurrent", Recurrent, lambda: torch.randn(BATCH, 7, 64), keras_recurrent,
         extra={"onnx": STEPS * (13 * 64 + 11 * 48), "openvino": STEPS * (13 * 64 + 11 * 48 + 4 * 64 + 4 * 48)},
         same_totals=False),
    Case("norms", Norms, lambda: torch.randn(BATCH, 8, 16)),
]


def _randomized(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.uniform_(0.5, 1.5)  # positive: running variances among them
    return model


def _import_all(case: Case, folder) -> dict:
    import openvino as ov

    from graphs.inference.onnx_import import import_onnx
    from graphs.inference.openvino_import import import_openvino_ir
    from graphs.torch.importer import trace_training_step

    model, example = _randomized(case.model()), case.example()
    graphs = {"torch": trace_training_step(model, (example,), name=case.name)}
    onnx_path, xml_path = folder / f"{case.name}.onnx", folder / f"{case.name}.xml"
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (example,), str(onnx_path), dynamo=False, opset_version=17)
    graphs["onnx"] = import_onnx(str(onnx_path))
    ov.save_model(ov.convert_model(str(onnx_path)), str(xml_path), compress_to_fp16=False)
    graphs["openvino"] = import_openvino_ir(str(xml_path))
    if case.keras_model is not None:
        graphs["keras"] = _keras_step(case)
    return graphs


def _keras_step(case: Case):
    import keras  # after OR-Tools, which conftest imports first (graphs.native_order)

    from graphs.tf.importer import trace_keras_training_step

    keras.utils.set_random_seed(0)
    model = case.keras_model()
    example = case.example().numpy()
    example = example.transpose(0, 2, 3, 1) if example.ndim == 4 else example  # channels last
    targets = np.zeros((BATCH, *model.output_shape[1:]), "float32")
    return trace_keras_training_step(model, example, targets, loss="mse", optimizer="adam", name=case.name)


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("importers")
    return {case.name: _import_all(case, folder) for case in CASES}


def _forward_flops(graph, kinds) -> float:
    chosen = np.isin(graph.op_kinds, list(kinds)) & (graph.phases == PHASE_CODE["forward"])
    return float(graph.flops[chosen].sum())


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_importers_agree__multiply_add_flops(imported, case):
    graphs = imported[case.name]
    reference = graphs["torch"].summary()["forward_flops"]
    assert reference > 0
    for name in sorted(set(graphs) - {"torch"}):
        assert _forward_flops(graphs[name], MULTIPLY_ADD_KINDS[name]) == reference + case.extra.get(name, 0), name


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_importers_agree__every_inference_op_has_a_formula(imported, case):
    for name in ("onnx", "openvino"):
        assert imported[case.name][name].meta["ops_without_flops"] == {}, name


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_importers_agree__pooling_and_resizing_alike(imported, case):
    graphs = imported[case.name]
    for family, kinds in FAMILIES.items():
        counted = {name: _forward_flops(graphs[name], kinds[name]) for name in kinds if name in graphs}
        assert len(set(counted.values())) == 1, (family, counted)


@pytest.mark.parametrize("case", [case for case in CASES if case.same_totals], ids=lambda case: case.name)
def test_importers_agree__onnx_and_openvino_totals_where_they_spell_every_op_alike(imported, case):
    """Normalizations included: a LayerNormalization or an InstanceNormalization is MVN, Multiply and Add in
    OpenVINO; an inference batch norm a Multiply and an Add."""
    graphs = imported[case.name]
    assert graphs["onnx"].total_flops == graphs["openvino"].total_flops


def _constant_nodes(model_file: str) -> tuple[int, int]:
    """(float scalars, bytes) of the tensors the ONNX file's Constant nodes hold (the exporter's: ``value``)."""
    import onnx
    from onnx import numpy_helper

    arrays = [numpy_helper.to_array(node.attribute[0].t) for node in onnx.load(model_file).graph.node
              if node.op_type == "Constant"]
    return sum(a.size for a in arrays if a.dtype.kind == "f"), sum(a.nbytes for a in arrays)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_importers_agree__parameters(imported, case):
    """The trainable weights in every training step; with the float buffers (batch norm's running
    statistics), the ONNX initializers and their bytes, beside what its Constant nodes hold."""
    graphs, model = imported[case.name], case.model()
    weights = sum(p.numel() for p in model.parameters())
    float_buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    constant_scalars, constant_bytes = _constant_nodes(graphs["onnx"].meta["model_file"])
    assert {name: graphs[name].num_params for name in graphs if name != "openvino"} == {
        name: weights + (float_buffers + constant_scalars if name == "onnx" else 0)
        for name in graphs if name != "openvino"}
    assert graphs["onnx"].total_param_bytes == 4 * (weights + float_buffers) + constant_bytes
    resident = graphs["torch"].out_bytes[graphs["torch"].op_kinds == "Variable"].sum()
    assert resident == 4 * (weights + float_buffers) + sum(b.numel() * b.element_size() for b in model.buffers()
                                                           if not b.is_floating_point())


def _constant_weights_model(path) -> str:
    """x [2, 16] -> MatMul w -> Add b -> Relu -> Reshape to shape, every weight a Constant node (as older
    torch.onnx exports write them): w a ``value`` tensor, b ``value_floats``, shape ``value_ints``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(
                 rng.uniform(0.5, 1.5, (16, 8)).astype(np.float32), "w_value"), name="w_const"),
             helper.make_node("Constant", [], ["b"], value_floats=rng.uniform(0.5, 1.5, 8).tolist(), name="b_const"),
             helper.make_node("Constant", [], ["shape"], value_ints=[2, 2, 4], name="shape_const"),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "constants", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_importers_agree__an_onnx_constant_node_is_a_weight_as_the_irs_constant(tmp_path):
    """OpenVINO reads a Constant node as its Constant, parameter bytes of its first reader; the ONNX importer
    made it an op without parameters, so the two disagreed on one model (4 ops against 7, 0 parameters)."""
    import openvino as ov

    from graphs.inference.onnx_import import import_onnx
    from graphs.inference.openvino_import import import_openvino_ir

    onnx_path, xml_path = _constant_weights_model(tmp_path / "constants.onnx"), tmp_path / "constants.xml"
    ov.save_model(ov.convert_model(onnx_path), str(xml_path), compress_to_fp16=False)
    graphs = {"onnx": import_onnx(onnx_path), "openvino": import_openvino_ir(str(xml_path))}
    columns = ("op_kinds", "flops", "bytes_accessed", "out_bytes", "param_bytes", "edge_src", "edge_dst", "edge_bytes")
    for column in columns:
        assert getattr(graphs["onnx"], column).tolist() == getattr(graphs["openvino"], column).tolist(), column
    assert graphs["onnx"].op_kinds.tolist() == ["MatMul", "Add", "Relu", "Reshape"]
    assert graphs["onnx"].param_bytes.tolist() == [16 * 8 * 4, 8 * 4, 0, 3 * 8]  # the shape's int64s too
    assert graphs["onnx"].num_params == graphs["openvino"].num_params == 16 * 8 + 8  # float weights alone
