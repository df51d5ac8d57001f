"""The batch-1 inference benchmarks: small builds checked exactly, paper-size builds (slow) against the
published figures. FLOPs count a multiply-add as 2 (ResNet-50 at 224x224: about 2 x 4.1e9)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from graphs.opgraph import PHASE_CODE

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BERT_BASE_PARAMS = 109_482_240  # embeddings 23,837,184 + 12 x 7,087,872 + pooler 590,592
SMALL_BERT = dict(batch_size=1, seq_len=16, hidden=64, layers=2, heads=4, ffn=128, vocab=100, max_positions=32)
SCALARS_PER_LAYER = 4  # float Constant nodes, weights as initializers are (graphs.inference.onnx_constants):
# GELU's 1, sqrt(2) and 0.5, and the attention scores' divisor


def _bert_params(hidden: int, layers: int, ffn: int, vocab: int, max_positions: int, **_) -> int:
    embeddings = (vocab + max_positions + 2) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + (hidden * ffn + ffn) + (ffn * hidden + hidden) + 4 * hidden
    return embeddings + layers * layer + hidden * hidden + hidden


def _dense_flops(seq_len: int, hidden: int, layers: int, heads: int, ffn: int, **_) -> int:
    """MatMul + Gemm FLOPs of the encoder: projections and FFN per token, attention scores and context,
    the pooler's Gemm on the first token (its bias add included, as Gemm's formula counts it)."""
    per_token = 4 * hidden * hidden + 2 * hidden * ffn
    attention = 2 * seq_len * seq_len * hidden
    return 2 * layers * (seq_len * per_token + attention) + 2 * hidden * hidden + hidden


def _simulates(graph) -> bool:
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer

    (measurement,) = SimulatorMeasurer(graph, load_machine("paper-2gpu")).measure(
        [np.zeros(graph.num_ops, dtype=np.int64)])
    return measurement.ok


def _in_model_cache(path: str) -> bool:
    from graphs.registry import cache_dir

    return Path(path).is_file() and Path(path).parent == cache_dir() / "models"


def test_registry__inference_benchmarks_are_listed_at_batch_1():
    from graphs.registry import list_benchmarks

    configs = {b.name: b.config for b in list_benchmarks()}
    assert configs["resnet-50-infer"] == {"batch_size": 1, "image_size": 224}
    assert configs["inception-v3-infer"] == {"batch_size": 1, "image_size": 299}
    assert configs["bert-base-infer"]["seq_len"] == 128 and configs["bert-base-infer"]["layers"] == 12


def test_model_path__keyed_by_the_graphs_code_as_the_cached_graph_is(monkeypatch, tmp_path):
    """Two checkouts sharing the cache: one rewrote the model file that the other's cached graph names."""
    from graphs import registry
    from graphs.benchmarks.inference_models import model_path

    monkeypatch.setenv("PLACER_CACHE", str(tmp_path))
    config = dict(batch_size=1, image_size=224)
    here = model_path("resnet-50-infer", config, ".xml")
    assert here == model_path("resnet-50-infer", config, ".xml") and here.parent == tmp_path / "models"
    assert here != model_path("resnet-50-infer", {**config, "image_size": 96}, ".xml")
    monkeypatch.setattr(registry, "graphs_source_digest", lambda: "other-checkout")
    assert model_path("resnet-50-infer", config, ".xml") != here


def test_model_path__a_cache_that_cannot_hold_the_model_file_is_one_error_saying_what_to_do(monkeypatch, tmp_path):
    """PLACER_CACHE naming a file was a bare "models: Not a directory": the model file must be on disk."""
    from graphs.benchmarks.inference_models import model_path
    from graphs.errors import PlacerError

    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "afile"))
    with pytest.raises(PlacerError, match=r"^bert-base-infer keeps its model file in the graph cache, and "
                                          r".*afile/models cannot be written \(Not a directory\): set PLACER_CACHE "
                                          r"to a folder"):
        model_path("bert-base-infer", {}, ".onnx")


def test_build_bert_base_infer__small_encoder_params_and_matmul_flops_exact():
    from graphs.benchmarks.inference_models import build_bert_base_infer

    graph = build_bert_base_infer(**SMALL_BERT)
    assert (graph.name, graph.framework, graph.batch_size) == ("bert-base-infer", "onnx", 1)
    assert graph.num_params == _bert_params(**SMALL_BERT) + SCALARS_PER_LAYER * SMALL_BERT["layers"]
    assert "Constant" not in graph.op_kinds.tolist()  # its Constant nodes are weights, not ops
    dense = np.isin(graph.op_kinds, ["MatMul", "Gemm"])
    assert graph.flops[dense].sum() == _dense_flops(**SMALL_BERT)
    assert graph.meta["ops_without_flops"] == {} and set(graph.phases.tolist()) == {PHASE_CODE["forward"]}
    assert {"layers.0.attention.query", "layers.1.output", "pooler"} <= set(graph.scopes.tolist())
    assert _in_model_cache(graph.meta["model_file"]) and graph.meta["model_file"].endswith(".onnx")
    assert _simulates(graph)


def test_build_resnet50_infer__small_image_is_an_openvino_graph_with_its_ir_kept():
    from graphs.benchmarks.inference_models import build_resnet50_infer

    graph = build_resnet50_infer(image_size=32)
    assert (graph.framework, graph.batch_size) == ("openvino", 1)
    assert int((graph.op_kinds == "Convolution").sum()) == 53  # 1 stem + 16 blocks x 3 + 4 shortcuts
    assert graph.meta["ops_without_flops"] == {}
    xml = graph.meta["model_file"]
    assert _in_model_cache(xml) and Path(xml).with_suffix(".bin").is_file()
    assert _simulates(graph)


def test_build_resnet50_infer__the_same_graph_whatever_the_process_converted_before():
    """OpenVINO names a node the converter leaves unnamed after a counter of every node the process has made:
    the same build after another model's conversion had other op names (``Transpose_241``, ``Transpose_11637``),
    so another hash."""
    from graphs.benchmarks.inference_models import build_resnet50_infer

    first = build_resnet50_infer(image_size=32)
    build_resnet50_infer(image_size=48)  # the converter makes thousands of nodes
    again = build_resnet50_infer(image_size=32)
    assert again.op_names.tolist() == first.op_names.tolist() and again.content_hash == first.content_hash
    assert "Transpose_1" in first.op_names.tolist()  # what the converter left unnamed, numbered in the model


def test_number_counter_named_nodes__numbers_openvino_counter_names_and_keeps_the_model_input_names():
    """An input the model named ``Image_7`` has the form of OpenVINO's counter names but is the model's own."""
    import openvino as ov
    import openvino.opset13 as ops

    from graphs.inference.openvino_import import number_counter_named_nodes

    image = ops.parameter([1, 4], name="Image_7")
    model = ov.Model([ops.relu(ops.relu(image))], [image])
    number_counter_named_nodes(model)
    names = [(node.get_type_name(), node.get_friendly_name()) for node in model.get_ordered_ops()]
    assert names[:3] == [("Parameter", "Image_7"), ("Relu", "Relu_1"), ("Relu", "Relu_2")]


@pytest.mark.slow
def test_resnet50_infer__flops_near_2x_4_1e9_and_cached_graph_keeps_its_ir():
    from graphs.registry import benchmark_graph

    graph = benchmark_graph("resnet-50-infer")
    assert graph.total_flops == pytest.approx(2 * 4.1e9, rel=0.15)
    assert graph.meta["ops_without_flops"] == {}
    again = benchmark_graph("resnet-50-infer")  # read from the cache: still names the IR on disk
    assert again.content_hash == graph.content_hash and _in_model_cache(again.meta["model_file"])


@pytest.mark.slow
def test_inception_v3_infer__flops_near_2x_5_7e9():
    from graphs.registry import benchmark_graph

    graph = benchmark_graph("inception-v3-infer")
    assert graph.total_flops == pytest.approx(2 * 5.7e9, rel=0.15)
    assert graph.meta["ops_without_flops"] == {} and _simulates(graph)


@pytest.mark.slow
def test_bert_base_infer__110m_params_and_dense_flops():
    from graphs.registry import benchmark_graph

    graph = benchmark_graph("bert-base-infer")
    assert graph.num_params == pytest.approx(110e6, rel=0.05)
    assert graph.num_params - SCALARS_PER_LAYER * 12 == BERT_BASE_PARAMS == _bert_params(
        hidden=768, layers=12, ffn=3072, vocab=30522, max_positions=512)
    dense = np.isin(graph.op_kinds, ["MatMul", "Gemm"])
    assert graph.flops[dense].sum() == _dense_flops(seq_len=128, hidden=768, layers=12, heads=12, ffn=3072)
    assert _simulates(graph)
