"""The OpenVINO IR importer on an IR built by hand with openvino.opset13, figures checked by hand."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from graphs.errors import PlacerError
from graphs.inference.openvino_import import import_openvino_ir
from graphs.opgraph import PHASE_CODE

F32 = 4


def _hand_model(repeat_name: bool = False) -> ov.Model:
    """x (1,3,8,8) -> conv (3x3, 4 filters) -> relu -> flat (Reshape) -> fc (MatMul) -> bias (Add b)
    -> scale (Multiply b again); fc also feeds scale's sibling "gate" (Sigmoid) into the Result."""
    x = ops.parameter([1, 3, 8, 8], np.float32, name="x")
    conv = ops.convolution(x, ops.constant(np.ones((4, 3, 3, 3), np.float32)), [1, 1], [0, 0], [0, 0], [1, 1])
    relu = ops.relu(conv)
    flat = ops.reshape(relu, ops.constant(np.array([1, 144], np.int64)), special_zero=False)
    fc = ops.matmul(flat, ops.constant(np.ones((144, 4), np.float32)), False, False)
    b = ops.constant(np.ones((1, 4), np.float32))
    bias = ops.add(fc, b)
    scale = ops.multiply(bias, b)
    gate = ops.sigmoid(fc)
    out = ops.add(scale, gate)
    names = ["conv", "relu", "flat", "fc", "bias", "scale", "gate", "relu" if repeat_name else "out"]
    for node, name in zip((conv, relu, flat, fc, bias, scale, gate, out), names):
        node.set_friendly_name(name)
    return ov.Model([ops.result(out)], [x], "hand_ir")


@pytest.fixture
def hand_ir(tmp_path):
    path = tmp_path / "hand.xml"
    ov.save_model(_hand_model(), str(path), compress_to_fp16=False)
    return path


def _by_name(graph, values) -> dict:
    return dict(zip(graph.op_names.tolist(), np.asarray(values).tolist()))


def test_import_openvino_ir__ops_are_the_non_constant_nodes_by_friendly_name(hand_ir):
    graph = import_openvino_ir(str(hand_ir))
    assert sorted(graph.op_names.tolist()) == sorted(["conv", "relu", "flat", "fc", "bias", "scale", "gate", "out"])
    assert _by_name(graph, graph.op_kinds) == {
        "conv": "Convolution", "relu": "Relu", "flat": "Reshape", "fc": "MatMul", "bias": "Add",
        "scale": "Multiply", "gate": "Sigmoid", "out": "Add"}
    assert (graph.name, graph.framework, graph.batch_size) == ("hand", "openvino", 1)
    assert set(graph.phases.tolist()) == {PHASE_CODE["forward"]}
    assert graph.meta == {"model_file": str(hand_ir.resolve()), "ops_without_flops": {}}
    assert graph.source == str(hand_ir.resolve())
    assert graph.num_params == 108 + 144 * 4 + 4  # float Constants; the int64 shape is not a parameter


def test_import_openvino_ir__flops_edges_and_weights_by_hand(hand_ir):
    graph = import_openvino_ir(str(hand_ir))
    assert _by_name(graph, graph.flops) == {"conv": 2 * 144 * 27, "relu": 144, "flat": 0, "fc": 2 * 4 * 144,
                                            "bias": 4, "scale": 4, "gate": 4, "out": 4}
    edges = {(graph.op_names[s], graph.op_names[d]): int(b)
             for s, d, b in zip(graph.edge_src, graph.edge_dst, graph.edge_bytes)}
    act, small = 144 * F32, 4 * F32
    assert edges == {("conv", "relu"): act, ("relu", "flat"): act, ("flat", "fc"): act, ("fc", "bias"): small,
                     ("bias", "scale"): small, ("fc", "gate"): small, ("scale", "out"): small,
                     ("gate", "out"): small}  # nothing from the Parameter, nothing to the Result
    owned = _by_name(graph, graph.param_bytes)
    assert owned == {"conv": 108 * F32, "relu": 0, "flat": 2 * 8, "fc": 576 * F32, "bias": small, "scale": 0,
                     "gate": 0, "out": 0}  # b is the first reader's (bias), counted once
    accessed = _by_name(graph, graph.bytes_accessed)
    assert accessed["conv"] == 3 * 64 * F32 + act + 108 * F32
    assert accessed["scale"] == small + small + small  # bias in, b read, out


def test_import_openvino_ir__simulates_on_one_device(hand_ir):
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer

    graph = import_openvino_ir(str(hand_ir))
    (measurement,) = SimulatorMeasurer(graph, load_machine("paper-2gpu")).measure(
        [np.zeros(graph.num_ops, dtype=np.int64)])
    assert measurement.ok and measurement.runtime_s > 0


def test_import_openvino_ir__repeated_friendly_names_fail_clearly(tmp_path):
    path = tmp_path / "dups.xml"
    ov.save_model(_hand_model(repeat_name=True), str(path), compress_to_fp16=False)
    with pytest.raises(PlacerError, match="friendly names are not unique.*'relu'"):
        import_openvino_ir(str(path))


def test_import_openvino_ir__damaged_files_are_placer_errors_naming_the_file(tmp_path, hand_ir):
    text = hand_ir.read_bytes()
    cases = {"truncated": (text[: len(text) // 2], True, "not well-formed XML"),
             "random": (np.random.default_rng(0).bytes(500), True, "not well-formed XML"),
             "not_ir": (b"<model><layer/></model>", True, "not an OpenVINO IR"),
             "empty_net": (b"<net></net>", True, "has no layers"),  # OpenVINO tried TensorFlow's reader on it
             "no_bin": (text, False, "weights file .* is missing")}
    for label, (content, with_bin, problem) in cases.items():
        xml = tmp_path / f"{label}.xml"
        xml.write_bytes(content)
        if with_bin:
            xml.with_suffix(".bin").write_bytes(hand_ir.with_suffix(".bin").read_bytes())
        with pytest.raises(PlacerError, match=problem) as caught:
            import_openvino_ir(str(xml))
        assert str(xml) in str(caught.value), label
    with pytest.raises(PlacerError, match="does not exist"):
        import_openvino_ir(str(tmp_path / "absent.xml"))
    (tmp_path / "folder.xml").mkdir()
    with pytest.raises(PlacerError, match="folder.xml is a folder, not a file"):
        import_openvino_ir(str(tmp_path / "folder.xml"))


@pytest.mark.parametrize("net, error", [
    ("<net>", "OpenVINO IR {xml}: its <net> has no version attribute, which the IR reader needs"),
    ('<net version="99">', "OpenVINO cannot read IR {xml}: its IR reader does not take IR version '99'"),
])
def test_cli_graphs_import_openvino__an_ir_its_reader_refuses_is_one_error_line_and_no_other_readers_logs(
        tmp_path, hand_ir, net, error):
    """An IR with layers whose <net> the IR reader refuses was handed to OpenVINO's other frontends in turn:
    TensorFlow's printed absl "text_format.cc" lines on stderr before the error line."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    xml, out = tmp_path / "damaged.xml", tmp_path / "damaged.parquet"
    xml.write_text(re.sub(r"<net [^>]*>", net, hand_ir.read_text(), count=1))
    xml.with_suffix(".bin").write_bytes(hand_ir.with_suffix(".bin").read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "graphs", "import", "--openvino", str(xml), "-o",
                           str(out)], cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True,
                          timeout=300)
    assert (done.returncode, done.stderr) == (2, f"placer: error: {error.format(xml=xml)}\n")
    assert not out.exists()


def test_import_openvino_ir__short_weights_file_is_a_placer_error(tmp_path, hand_ir):
    xml = tmp_path / "short.xml"
    xml.write_bytes(hand_ir.read_bytes())
    xml.with_suffix(".bin").write_bytes(hand_ir.with_suffix(".bin").read_bytes()[:100])
    with pytest.raises(PlacerError, match=f"OpenVINO cannot read IR {xml}"):
        import_openvino_ir(str(xml))


def test_cli_graphs_import_openvino__writes_the_graph_without_warning(tmp_path, hand_ir, capsys):
    from cluster.cli import main
    from graphs.io import load_graph_file

    out = tmp_path / "hand.parquet"
    assert main(["graphs", "import", "--openvino", str(hand_ir), "-o", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert load_graph_file(out).meta["model_file"] == str(hand_ir.resolve())
    hand_ir.with_suffix(".bin").unlink()
    assert main(["graphs", "import", "--openvino", str(hand_ir), "-o", str(tmp_path / "none.parquet")]) == 2
    assert not (tmp_path / "none.parquet").exists()


def test_import_openvino_ir__an_lstm_sequence_counts_its_matmuls_biases_and_gates(tmp_path):
    """X (2 examples, 5 steps, 3 inputs), hidden 4, both directions, with bias: per step, example and
    direction 2 x 16 x (3 + 4) matmul FLOPs + 16 bias adds + 13 x 4 gate FLOPs. OpenVINO's B is one vector
    of 4 x hidden, W's and R's biases summed (ONNX's holds both, 8 x hidden): it counted 2 x 16 adds."""
    x = ops.parameter([2, 5, 3], np.float32, name="x")
    h0, c0 = (ops.constant(np.zeros((2, 2, 4), np.float32)) for _ in range(2))
    w, r, b = (ops.constant(np.ones(shape, np.float32)) for shape in ((2, 16, 3), (2, 16, 4), (2, 16)))
    lstm = ops.lstm_sequence(x, h0, c0, ops.constant(np.array([5, 5], np.int32)), w, r, b, 4, "bidirectional")
    lstm.set_friendly_name("lstm")
    path = tmp_path / "lstm.xml"
    ov.save_model(ov.Model([ops.result(lstm.output(0))], [x], "lstm"), str(path), compress_to_fp16=False)
    graph = import_openvino_ir(str(path))
    assert graph.flops.tolist() == [2 * 5 * 2 * (2 * 16 * 7 + 16 + 13 * 4)]


def test_import_openvino_ir__a_gru_sequence_adds_each_bias_element_once(tmp_path):
    """X (2, 5, 3), hidden 4: with linear_before_reset, B holds 4 x hidden biases (R's for the new gate
    apart), else 3 x hidden; one add each per step and example, beside 2 x 12 x (3 + 4) + 11 x 4."""
    x = ops.parameter([2, 5, 3], np.float32, name="x")
    h0 = ops.constant(np.zeros((2, 1, 4), np.float32))
    w, r = ops.constant(np.ones((1, 12, 3), np.float32)), ops.constant(np.ones((1, 12, 4), np.float32))
    lengths = ops.constant(np.array([5, 5], np.int32))
    nodes = [ops.gru_sequence(x, h0, lengths, w, r, ops.constant(np.ones((1, 4 * 4), np.float32)), 4, "forward",
                              linear_before_reset=True, name="before_reset"),
             ops.gru_sequence(x, h0, lengths, w, r, ops.constant(np.ones((1, 3 * 4), np.float32)), 4, "forward",
                              name="after_reset")]
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(n.output(0)) for n in nodes], [x])))
    products = 2 * 12 * 7 + 11 * 4
    assert _by_name(graph, graph.flops) == {"before_reset": 2 * 5 * (products + 16),
                                            "after_reset": 2 * 5 * (products + 12)}


def _edges(graph) -> dict:
    return {(graph.op_names[s], graph.op_names[d]): int(b)
            for s, d, b in zip(graph.edge_src, graph.edge_dst, graph.edge_bytes)}


def _saved(tmp_path, outputs, inputs, name: str = "small"):
    path = tmp_path / f"{name}.xml"
    ov.save_model(ov.Model(outputs, inputs, name), str(path), compress_to_fp16=False)
    return path


def test_import_openvino_ir__a_tensor_read_twice_is_one_edges_bytes_and_unread_outputs_no_bytes(tmp_path):
    """relu -> square (Multiply(y, y)) -> pool (MaxPool-8, whose int64 indices output nothing reads)."""
    import openvino.opset8 as ops8

    x = ops.parameter([1, 2, 4, 4], np.float32, name="x")
    relu = ops.relu(x)
    square = ops.multiply(relu, relu)
    pool = ops8.max_pool(square, [2, 2], [1, 1], [0, 0], [0, 0], [2, 2])
    for node, name in ((relu, "relu"), (square, "square"), (pool, "pool")):
        node.set_friendly_name(name)
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(pool.output(0))], [x])))
    act = 32 * F32
    assert graph.edge_bytes.tolist() == [act, act]  # relu -> square once, square -> pool
    assert _by_name(graph, graph.bytes_accessed)["square"] == 2 * act  # y in once, out
    assert _by_name(graph, graph.out_bytes)["pool"] == 8 * F32  # the values; not the 8 int64 indices


def test_import_openvino_ir__an_ir_without_ops_is_refused_naming_it(tmp_path):
    x = ops.parameter([1, 4], np.float32, name="x")
    path = _saved(tmp_path, [ops.result(x)], [x], "empty")
    with pytest.raises(PlacerError, match=f"OpenVINO IR {path} has no ops"):
        import_openvino_ir(str(path))


def test_import_openvino_ir__interpolate_counts_its_taps_by_mode(tmp_path):
    """Interpolate had no FLOP formula. x (1, 3, 4, 6) -> (1, 3, 8, 12): 4^2 taps an output element for
    bicubic, a multiply-add each; nearest is a gather, 0."""
    x = ops.parameter([1, 3, 4, 6], np.float32, name="x")
    sizes, axes = ops.constant(np.array([8, 12], np.int64)), ops.constant(np.array([2, 3], np.int64))
    resized = {mode: ops.interpolate(x, sizes, mode, "sizes", axes=axes, name=mode)
               for mode in ("bicubic_pillow", "nearest")}
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(n) for n in resized.values()], [x])))
    assert _by_name(graph, graph.flops) == {"bicubic_pillow": 2 * 16 * 3 * 8 * 12, "nearest": 0}
    assert graph.meta["ops_without_flops"] == {}


def test_import_openvino_ir__scaled_dot_product_attention_counts_what_its_specification_spells_out(tmp_path):
    """ScaledDotProductAttention had no FLOP formula (0 FLOPs, listed in ops_without_flops): OpenVINO fuses an
    exported attention's MatMul, scale, mask, Softmax and MatMul into it, so a converted transformer lost its
    attention. q (2, 4, L=6, E=8), k (2, 4, S=10, 8), v (2, 4, 10, Ev=16): per score, 2 x 8 + 2 x 16 for the
    two matmuls, 1 for the scale, 5 for the softmax, and 1 for the mask where there is one (causal, or a
    mask tensor; a scalar mask is the specification's zero)."""
    q = ops.parameter([2, 4, 6, 8], np.float32, name="q")
    k = ops.parameter([2, 4, 10, 8], np.float32, name="k")
    v = ops.parameter([2, 4, 10, 16], np.float32, name="v")
    mask = ops.constant(np.zeros((6, 10), np.float32))
    scalar_mask, scale = ops.constant(np.float32(0)), ops.constant(np.float32(0.5))
    nodes = {"plain": ops.scaled_dot_product_attention(q, k, v, name="plain"),
             "causal": ops.scaled_dot_product_attention(q, k, v, causal=True, name="causal"),
             "masked": ops.scaled_dot_product_attention(q, k, v, mask, name="masked"),
             "scalar_mask": ops.scaled_dot_product_attention(q, k, v, scalar_mask, scale, name="scalar_mask")}
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(n) for n in nodes.values()], [q, k, v])))
    scores = 2 * 4 * 6 * 10
    unmasked = scores * (2 * 8 + 2 * 16 + 1 + 5)
    assert _by_name(graph, graph.flops) == {"plain": unmasked, "causal": unmasked + scores,
                                            "masked": unmasked + scores, "scalar_mask": unmasked}
    assert graph.meta["ops_without_flops"] == {}


def test_import_openvino_ir__openvinos_spellings_of_elementwise_ops_have_the_onnx_ones_formula(tmp_path):
    """SoftPlus, SoftSign, GreaterEqual and LessEqual (ONNX: Softplus, Softsign, GreaterOrEqual, LessOrEqual)
    and the trigonometric ops had no formula: 0 FLOPs, listed in ops_without_flops. One FLOP an element."""
    x = ops.parameter([2, 3, 5], np.float32, name="x")
    nodes = [ops.softplus(x, name="softplus"), ops.softsign(x, name="softsign"),
             ops.greater_equal(x, x, name="ge"), ops.less_equal(x, x, name="le"), ops.tan(x, name="tan"),
             ops.asinh(x, name="asinh"), ops.cosh(x, name="cosh"), ops.is_finite(x, name="finite")]
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(n) for n in nodes], [x])))
    assert graph.meta["ops_without_flops"] == {}
    assert graph.flops.tolist() == [2 * 3 * 5] * len(nodes)


def test_import_openvino_ir__fp16_compressed_weights_import_as_the_uncompressed_ir(tmp_path):
    """``ov.save_model`` and ``ovc`` store float weights as float16 by default, each read through a
    decompression Convert that OpenVINO folds when it compiles: no op, the weights as the uncompressed IR's."""
    for folder, compress in (("plain", False), ("fp16", True)):
        (tmp_path / folder).mkdir()
        ov.save_model(_hand_model(), str(tmp_path / folder / "hand.xml"), compress_to_fp16=compress)
    compressed_ir = ov.Core().read_model(str(tmp_path / "fp16" / "hand.xml"))
    assert "Convert" in {node.get_type_name() for node in compressed_ir.get_ordered_ops()}  # what is tested
    plain, fp16 = (import_openvino_ir(str(tmp_path / folder / "hand.xml")) for folder in ("plain", "fp16"))
    assert sorted(fp16.op_names.tolist()) == sorted(plain.op_names.tolist())
    for values in ("flops", "param_bytes", "bytes_accessed", "out_bytes", "scopes"):
        assert _by_name(fp16, getattr(fp16, values)) == _by_name(plain, getattr(plain, values)), values
    assert _edges(fp16) == _edges(plain)
    assert fp16.num_params == plain.num_params


def test_import_openvino_ir__a_convolution_split_from_its_bias_keeps_the_layers_scope(tmp_path):
    """OpenVINO's ONNX reader splits ``/enc1/Conv`` (a Conv with a bias) into ``/enc1/Conv/WithoutBiases``
    and an Add named ``/enc1/Conv``: both are layer enc1's, as the ONNX import's one Conv is."""
    x = ops.parameter([1, 3, 8, 8], np.float32, name="x")
    conv = ops.convolution(x, ops.constant(np.ones((4, 3, 3, 3), np.float32)), [1, 1], [0, 0], [0, 0], [1, 1],
                           name="/enc1/Conv/WithoutBiases")
    bias = ops.add(conv, ops.constant(np.ones((1, 4, 1, 1), np.float32)), name="/enc1/Conv")
    relu = ops.relu(bias, name="/Relu")
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(relu)], [x])))
    assert _by_name(graph, graph.scopes) == {"/enc1/Conv/WithoutBiases": "enc1", "/enc1/Conv": "enc1", "/Relu": ""}


def test_import_openvino_ir__integer_weights_decompressed_by_ops_keep_those_ops(tmp_path):
    """int8 weight compression reads u8 weights through Convert, Multiply by a scale: OpenVINO keeps the u8 weights
    and runs the decompression, so that Convert stays an op owning the u8 bytes (only float16's is folded)."""
    x = ops.parameter([2, 4], np.float32, name="x")
    stored = ops.constant(np.ones((4, 3), np.uint8))
    weights = ops.multiply(ops.convert(stored, np.float32, name="dequantize"),
                           ops.constant(np.full((1, 3), 0.5, np.float32)), name="scale")
    fc = ops.matmul(x, weights, False, False, name="fc")
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(fc)], [x])))
    assert sorted(graph.op_names.tolist()) == ["dequantize", "fc", "scale"]
    assert _by_name(graph, graph.param_bytes)["dequantize"] == 4 * 3  # one byte a weight


def _ir_of_onnx(tmp_path, nodes, inputs, outputs, initializers) -> tuple:
    """The opset-17 ONNX model of ``nodes`` and the IR ``openvino.convert_model`` makes of it (float32 weights):
    their paths."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "small", inputs, outputs, list(initializers))
    onnx_path, xml_path = tmp_path / "small.onnx", tmp_path / "small.xml"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(onnx_path))
    ov.save_model(ov.convert_model(str(onnx_path)), str(xml_path), compress_to_fp16=False)
    return onnx_path, xml_path


def test_import_openvino_ir__a_weight_two_layers_share_is_resident_once_as_the_onnx_imports(tmp_path):
    """W (8,8) and B (8) feed two MatMul + Add pairs. The converter gives each reader a Constant of its own, both
    of the one stored weight (one data in the .bin): it was counted once per Constant, twice the .bin."""
    from onnx import TensorProto, helper, numpy_helper

    from graphs.inference.onnx_import import import_onnx

    node = helper.make_node
    onnx_path, xml_path = _ir_of_onnx(
        tmp_path, [node("MatMul", ["x", "W"], ["a"], name="mm1"), node("Add", ["a", "B"], ["a2"], name="add1"),
                   node("Relu", ["a2"], ["r"], name="relu"), node("MatMul", ["r", "W"], ["c"], name="mm2"),
                   node("Add", ["c", "B"], ["y"], name="add2")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "W"),
         numpy_helper.from_array(np.arange(8, dtype=np.float32) + 100, "B")])
    graph, onnx_graph = import_openvino_ir(str(xml_path)), import_onnx(str(onnx_path))
    owners = {name: size for name, size in _by_name(graph, graph.param_bytes).items() if size}
    assert owners == {"mm1": 64 * F32, "add1": 8 * F32}  # the first readers; mm2 and the last Add read them
    assert graph.param_bytes.sum() == onnx_graph.param_bytes.sum() == xml_path.with_suffix(".bin").stat().st_size
    assert graph.num_params == onnx_graph.num_params == 64 + 8


def test_import_openvino_ir__a_weight_read_before_inside_and_after_a_loop_is_resident_once(tmp_path):
    """pre = x @ W; a Loop (M = 5) of h @ W, Tanh; post = its result @ W. The converter moves W into the body, a
    third Constant of the one stored weight: it was counted three times, once by pre, the Loop and post each."""
    from onnx import TensorProto, helper, numpy_helper

    value, node = helper.make_tensor_value_info, helper.make_node
    body = helper.make_graph([node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
                              node("MatMul", ["h_in", "W"], ["m"], name="body_matmul"),
                              node("Tanh", ["m"], ["h_out"], name="body_tanh")], "body",
                             [value("i", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
                              value("h_in", TensorProto.FLOAT, [2, 4])],
                             [value("cond_out", TensorProto.BOOL, []), value("h_out", TensorProto.FLOAT, [2, 4])])
    _, xml_path = _ir_of_onnx(
        tmp_path, [node("MatMul", ["x", "W"], ["x1"], name="pre"),
                   node("Loop", ["M", "C", "x1"], ["h_last"], body=body, name="loop"),
                   node("MatMul", ["h_last", "W"], ["y"], name="post")],
        [value("x", TensorProto.FLOAT, [2, 4])], [value("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "W"),
         numpy_helper.from_array(np.array(5, np.int64), "M"), numpy_helper.from_array(np.array(True), "C")])
    graph = import_openvino_ir(str(xml_path))
    assert graph.op_kinds.tolist() == ["MatMul", "Loop", "MatMul"]
    pre, loop, post = graph.param_bytes.tolist()
    assert pre == 16 * F32 and post == 0  # W: pre's, the first reader; the Loop owns only its own scalars
    assert pre + loop == xml_path.with_suffix(".bin").stat().st_size
    assert graph.num_params == 16


def test_import_openvino_ir__a_shape_of_reading_a_weight_does_not_own_it(tmp_path):
    """x (4,4,5) reshaped to (-1, rows of W) by the shape ShapeOf(W) reads, as OpenVINO's reshape writes a
    Reshape before a MatMul; fc = MatMul(that, W (20,5)). The ShapeOf, first to read W, owned it and fc had
    none. A weight only a ShapeOf reads (V) is still resident once: the ShapeOf's."""
    x = ops.parameter([4, 4, 5], np.float32, name="x")
    w = ops.constant(np.arange(100, dtype=np.float32).reshape(20, 5))
    v = ops.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    rows = ops.gather(ops.shape_of(w, name="w_shape"), ops.constant(np.array([0], np.int64)),
                      ops.constant(np.array(0, np.int64)), name="w_rows")
    target = ops.concat([ops.constant(np.array([-1], np.int64)), rows], 0, name="target")
    flat = ops.reshape(x, target, special_zero=False, name="flat")
    fc = ops.matmul(flat, w, False, False, name="fc")
    v_shape = ops.shape_of(v, name="v_shape")
    graph = import_openvino_ir(str(_saved(tmp_path, [ops.result(fc), ops.result(v_shape)], [x])))
    assert _by_name(graph, graph.param_bytes)["w_shape"] == 0
    assert _by_name(graph, graph.param_bytes)["fc"] == 100 * F32
    assert _by_name(graph, graph.param_bytes)["v_shape"] == 6 * F32
    assert _by_name(graph, graph.flops)["fc"] == 2 * 4 * 20 * 5


def test_import_openvino_ir__an_input_goes_by_its_parameters_name_and_any_of_its_ports(tmp_path):
    """A converter that removed the Cast after an input ("mask") gave its port the Cast's output name too: the
    input went by the least of the names, "/layer/Cast_output_0", and `--input-shape mask=2,8` was refused
    ("the model's inputs are 'ids', '/layer/Cast_output_0'")."""
    mask = ops.parameter([-1, 8], ov.Type.f32, name="mask")
    mask.output(0).get_tensor().set_names({"mask", "/layer/Cast_output_0"})
    path = tmp_path / "masked.xml"
    ov.save_model(ov.Model([ops.relu(mask)], [mask], "masked"), str(path), compress_to_fp16=False)
    for given in ("mask", "/layer/Cast_output_0"):
        graph = import_openvino_ir(str(path), input_shapes={given: (2, 8)})
        assert graph.meta["input_shapes"] == {"mask": [2, 8]} and graph.batch_size == 2
    with pytest.raises(PlacerError, match="but the model's inputs are 'mask'"):
        import_openvino_ir(str(path), input_shapes={"ids": (2, 8)})
    with pytest.raises(PlacerError, match=r"--input-shape gives input 'mask' twice \('mask' and "
                                          r"'/layer/Cast_output_0' are its names\)"):
        import_openvino_ir(str(path), input_shapes={"mask": (2, 8), "/layer/Cast_output_0": (4, 8)})
