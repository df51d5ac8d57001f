"""Inference models exported with dynamic axes: a dynamic batch counts as 1, any other dynamic input dim
must be given (--input-shape), and the OpenVINO measurer runs the model at the sizes it was imported at."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import openvino as ov
import openvino.opset13 as ops
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphs.errors import PlacerError
from graphs.inference.input_shapes import parse_input_shapes, sized_inputs
from graphs.inference.onnx_import import import_onnx
from graphs.inference.openvino_import import import_openvino_ir

CONV_MACS_8x8 = 4 * 6 * 6 * 3 * 3 * 3  # one image 3x8x8, 4 filters 3x3


def _expected_conv_flops(model, images: int = 1) -> float:
    """MACs x 2, plus the bias the ONNX model's conv has (the IR's has none)."""
    return images * (2 * CONV_MACS_8x8 + (4 * 6 * 6 if model is _onnx_conv else 0))


def _onnx_conv(path, dims) -> str:
    """x (dims, names for dynamic ones) -> conv (3x3, 4 filters, bias) -> relu."""
    weights = [numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w"),
               numpy_helper.from_array(np.ones(4, np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "oh", "ow"])],
                              weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _ir_conv(path, dims) -> str:
    x = ops.parameter(ov.PartialShape(dims), np.float32, name="x")
    conv = ops.convolution(x, ops.constant(np.ones((4, 3, 3, 3), np.float32)), [1, 1], [0, 0], [0, 0], [1, 1])
    relu = ops.relu(conv)
    conv.set_friendly_name("conv")
    relu.set_friendly_name("relu")
    ov.save_model(ov.Model([ops.result(relu)], [x], "dyn_ir"), str(path), compress_to_fp16=False)
    return str(path)


def _conv_flops(graph) -> float:
    return float(graph.flops[graph.op_names.tolist().index("conv")])


@pytest.mark.parametrize("importer, model", [(import_onnx, _onnx_conv), (import_openvino_ir, _ir_conv)])
def test_import__a_dynamic_height_and_width_are_refused_unless_given(tmp_path, importer, model):
    dims = ["batch", 3, "h", "w"] if model is _onnx_conv else [-1, 3, -1, -1]
    path = model(tmp_path / ("dyn.onnx" if model is _onnx_conv else "dyn.xml"), dims)
    with pytest.raises(PlacerError, match=r"input 'x' has no size for axes 2, 3 \(shape \[\?, 3, \?, \?\]\); give "
                                          r"it with --input-shape x=1,3,N,N"):
        importer(path)
    graph = importer(path, input_shapes={"x": (1, 3, 8, 8)})
    assert _conv_flops(graph) == _expected_conv_flops(model)  # counted as 1 they gave no conv (a 1x1 image)
    assert graph.meta["input_shapes"] == {"x": [1, 3, 8, 8]} and "tensors_without_size" not in graph.meta
    assert _conv_flops(importer(path, input_shapes={"x": (2, 3, 8, 8)})) == _expected_conv_flops(model, 2)


def test_import_openvino_ir__an_input_of_unknown_rank_is_refused_unless_given(tmp_path):
    """An IR input of dynamic rank was left out of the sizing: the import wrote 0 FLOPs and 0 bytes for
    every op after it, and OpenVINO's CPU plugin then refused the step ("Parameter operation with dynamic
    rank")."""
    x = ops.parameter(ov.PartialShape.dynamic(), np.float32, name="x")
    relu = ops.relu(x)
    relu.set_friendly_name("relu")
    path = tmp_path / "rank.xml"
    ov.save_model(ov.Model([ops.result(relu)], [x], "rank"), str(path))
    with pytest.raises(PlacerError, match=r"input 'x' has no known rank \(nor any size\); give it with "
                                          r"--input-shape x=D0,D1,..."):
        import_openvino_ir(str(path))
    graph = import_openvino_ir(str(path), input_shapes={"x": (2, 3)})
    assert graph.meta["input_shapes"] == {"x": [2, 3]}
    assert graph.out_bytes[graph.op_names.tolist().index("relu")] == 2 * 3 * 4


@pytest.mark.parametrize("importer, model", [(import_onnx, _onnx_conv), (import_openvino_ir, _ir_conv)])
def test_import__a_dynamic_batch_alone_counts_as_one(tmp_path, importer, model):
    path = model(tmp_path / ("b.onnx" if model is _onnx_conv else "b.xml"),
                 ["batch", 3, 8, 8] if model is _onnx_conv else [-1, 3, 8, 8])
    graph = importer(path)
    assert (graph.batch_size, _conv_flops(graph)) == (1, _expected_conv_flops(model))
    assert "input_shapes" not in graph.meta


@pytest.mark.parametrize("given, message", [
    ({"y": (1, 3, 8, 8)}, "--input-shape names 'y', but the model's inputs are 'x'"),
    ({"x": (1, 3, 8)}, "--input-shape x has 3 dims, but the input has 4"),
    ({"x": (1, 4, 8, 8)}, "--input-shape x gives axis 1 size 4, but the model fixes it at 3"),
])
def test_import__sizes_that_contradict_the_model_are_refused(tmp_path, given, message):
    path = _onnx_conv(tmp_path / "dyn.onnx", ["batch", 3, "h", "w"])
    with pytest.raises(PlacerError, match=message):
        import_onnx(path, input_shapes=given)


@pytest.mark.parametrize("texts, message", [
    (["x=1,3,a,8"], "expected NAME=D0,D1,..."), (["x=1,0,8"], "expected NAME=D0,D1,..."),
    (["1,3,8,8"], "expected NAME=D0,D1,..."), (["x=1", "x=2"], "input 'x' is given twice"),
    (["x=1,3,99999999999999999999,1"], "every size a whole number from 1 to 2147483647"),
])
def test_parse_input_shapes__malformed_entries_are_refused(texts, message):
    with pytest.raises(PlacerError, match=message):
        parse_input_shapes(texts)


@pytest.mark.parametrize("importer, model", [(import_onnx, _onnx_conv), (import_openvino_ir, _ir_conv)])
def test_import__sizes_whose_tensors_pass_a_64_bit_count_are_refused(tmp_path, importer, model):
    """Each size is allowed alone; the tensors they make used to overflow an int64 in a traceback."""
    path = model(tmp_path / ("dyn.onnx" if model is _onnx_conv else "dyn.xml"),
                 ["batch", 3, "h", "w"] if model is _onnx_conv else [-1, 3, -1, -1])
    with pytest.raises(PlacerError, match=r"total .* bytes, more than a graph counts \(2\*\*62\): check the input "
                                          r"sizes \(--input-shape\)") as caught:
        importer(path, input_shapes={"x": (1, 3, 2_000_000_000, 2_000_000_000)})
    assert str(Path(path).resolve()) in str(caught.value)  # which of several models a script imports


def test_import_openvino_ir__sizes_a_reshape_cannot_take_are_one_error(tmp_path):
    """x [N,3,H,W] -> Reshape to a fixed [1,48]: H x W other than 16 contradicts it, and OpenVINO's own
    RuntimeError was a traceback."""
    x = ops.parameter(ov.PartialShape([-1, 3, -1, -1]), np.float32, name="x")
    flat = ops.reshape(x, ops.constant(np.array([1, 48], np.int64)), special_zero=False)
    path = tmp_path / "reshape.xml"
    ov.save_model(ov.Model([ops.result(ops.relu(flat))], [x], "reshape"), str(path), compress_to_fp16=False)
    assert import_openvino_ir(str(path), input_shapes={"x": (1, 3, 4, 4)}).num_ops > 0
    with pytest.raises(PlacerError, match=r"reshape.xml.*: OpenVINO cannot size the model's inputs as x=1,3,5,5: "
                                          r"node '.*' \(Reshape\) fails: Requested output shape \[1,48\] is "
                                          r"incompatible with input shape \(its input shapes \{\[1,3,5,5\],\[2\]\}\)$"):
        import_openvino_ir(str(path), input_shapes={"x": (1, 3, 5, 5)})


def _onnx_unet(path) -> str:
    """x [N, 3, H, W] -> pool (2x2 max pool) -> up (nearest x2 Resize) -> cat (Concat with x on the channels)
    -> relu: H and W must be even, as a U-Net's must be multiples of its poolings'."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest", name="up"),
             helper.make_node("Concat", ["u", "x"], ["c"], axis=1, name="cat"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "unet", [value("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [value("y", TensorProto.FLOAT, ["n", 6, "h", "w"])],
                              [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_cli_graphs_import_onnx__sizes_the_model_cannot_take_are_one_error_naming_the_node(tmp_path, capsys):
    """A U-Net at 31x33: its halves, 30x32 and 31x33, cannot be concatenated. The import warned of unsized
    tensors and wrote a graph, and `placer measure` then failed on OpenVINO's first internal line."""
    from cluster.cli import main

    path, out = _onnx_unet(tmp_path / "unet.onnx"), tmp_path / "unet.parquet"
    assert main(["graphs", "import", "--onnx", path, "--input-shape", "x=1,3,31,33", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"placer: error: ONNX model {Path(path).resolve()}: at the input sizes x=1,3,31,33 "
                   "(--input-shape), node 'cat' (Concat) fails shape inference: Can't merge shape info. Both "
                   "inferred and declared dimension have values but they differ. Inferred=31 Declared=30 "
                   "Dimension=2\n")
    assert not out.exists()
    assert main(["graphs", "import", "--onnx", path, "--input-shape", "x=1,3,32,32", "-o", str(out)]) == 0
    assert "placer: warning" not in capsys.readouterr().err and out.exists()


def test_import_onnx__sizes_an_unnamed_node_cannot_take_are_one_error_too(tmp_path):
    """onnx names an unnamed node's conflict "(op_type:Add): ...", without ", node name: ": the import went on
    with the Add unsized (costed as 8 FLOPs) where a named one was refused."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("MatMul", ["b", "w"], ["q"]),
             helper.make_node("Add", ["p", "q"], ["y"])]
    graph = helper.make_graph(nodes, "two", [value("a", TensorProto.FLOAT, ["batch", "seq", 8]),
                                             value("b", TensorProto.FLOAT, ["n", "seq", 8])],
                              [value("y", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")])
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(PlacerError, match=r"an unnamed Add fails shape inference"):
        import_onnx(str(path), input_shapes={"a": (3, 5, 8), "b": (2, 5, 8)})
    assert import_onnx(str(path), input_shapes={"a": (3, 5, 8), "b": (3, 5, 8)}).num_ops == 3


def test_import_onnx__shapes_the_model_declares_at_other_sizes_do_not_refuse_it(tmp_path):
    """A model made batch-dynamic whose value_info and outputs still say batch 1 runs at batch 4 (OpenVINO and
    onnxruntime read no declared intermediate shape); a NonZero output, unsized by nature, sent the import to
    onnx's strict inference, which refused the model over its own stale annotations."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Relu", ["r"], ["y"], name="relu2"),
             helper.make_node("NonZero", ["x"], ["nz"], name="nonzero")]
    graph = helper.make_graph(nodes, "stale", [value("x", TensorProto.FLOAT, ["n", 4])],
                              [value("y", TensorProto.FLOAT, [1, 4]), value("nz", TensorProto.INT64, [2, "k"])],
                              value_info=[value("r", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "stale.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    graph = import_onnx(str(path), input_shapes={"x": (4, 4)})
    assert graph.num_ops == 3 and graph.meta["unsized_tensors_by_op"] == {"NonZero": 1}


def test_import_openvino_ir__sizes_the_model_cannot_take_name_the_node_and_why(tmp_path):
    """OpenVINO's refusal was its first line, a C++ check ("Check 'TRShape::merge_into(...)' failed at
    src/core/..."): the node and the reason are on its later lines."""
    xml = tmp_path / "unet.xml"
    ov.save_model(ov.convert_model(_onnx_unet(tmp_path / "unet.onnx")), str(xml), compress_to_fp16=False)
    with pytest.raises(PlacerError) as refused:
        import_openvino_ir(str(xml), input_shapes={"x": (1, 3, 31, 33)})
    assert str(refused.value) == (
        f"OpenVINO IR {xml}: OpenVINO cannot size the model's inputs as x=1,3,31,33: node 'cat' (Concat) fails: "
        "Argument shapes are inconsistent; they must have the same rank, and must have equal dimension everywhere "
        "except on the concatenation axis (axis 1). (its input shapes {[1,3,30,32],[1,3,31,33]})")
    assert import_openvino_ir(str(xml), input_shapes={"x": (1, 3, 32, 32)}).num_ops == 4


def test_parse_input_shapes__names_may_hold_equals_signs():
    assert parse_input_shapes(["input:0=1,3,8,8", "a=b=2"]) == {"input:0": (1, 3, 8, 8), "a=b": (2,)}


def test_cli_graphs_import__input_shape_sizes_the_model_and_bad_ones_write_nothing(tmp_path, capsys):
    from cluster.cli import main
    from graphs.io import load_graph_file

    path = _onnx_conv(tmp_path / "dyn.onnx", ["batch", 3, "h", "w"])
    out = tmp_path / "g.parquet"
    assert main(["graphs", "import", "--onnx", path, "-o", str(out)]) == 2
    assert "give it with --input-shape x=1,3,N,N" in capsys.readouterr().err and not out.exists()
    assert main(["graphs", "import", "--torch", "m:f", "--input-shape", "x=1", "-o", str(out)]) == 2
    assert "--input-shape applies to --onnx and --openvino only" in capsys.readouterr().err and not out.exists()
    assert main(["graphs", "import", "--onnx", path, "--input-shape", "x=1,3,8,8", "-o", str(out)]) == 0
    assert _conv_flops(load_graph_file(out)) == _expected_conv_flops(_onnx_conv)
    assert load_graph_file(out).meta["input_shapes"] == {"x": [1, 3, 8, 8]}


@pytest.mark.parametrize("model", [_onnx_conv, _ir_conv])
def test_openvino_measurer__runs_the_model_at_the_sizes_it_was_imported_at(tmp_path, model):
    from measurers.openvino.devices import openvino_machine
    from measurers.openvino.measurer import OpenVinoMeasurer

    onnx_model = model is _onnx_conv
    path = model(tmp_path / ("dyn.onnx" if onnx_model else "dyn.xml"),
                 ["batch", 3, "h", "w"] if onnx_model else [-1, 3, -1, -1])
    graph = (import_onnx if onnx_model else import_openvino_ir)(path, input_shapes={"x": (2, 3, 8, 8)})
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=1, warmup=0)
    (output,) = measurer.infer_once(np.zeros(graph.num_ops, dtype=np.int64))
    assert output.shape == (2, 4, 6, 6)
    (measurement,) = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])
    assert measurement.status == "ok" and measurement.runtime_s > 0


def test_sized_inputs__every_input_without_sizes_is_named_in_one_error():
    """Was one error for the first such input only: a user gave it, then met the next."""
    inputs = {"ids": (None, None), "img": (None, 3, None, None), "scale": (1,)}
    with pytest.raises(PlacerError) as refused:
        sized_inputs("model m.onnx", inputs, {})
    assert str(refused.value) == ("model m.onnx: input 'ids' has no size for axis 1 (shape [?, ?]); input 'img' has "
                                  "no size for axes 2, 3 (shape [?, 3, ?, ?]); give them with --input-shape ids=1,N "
                                  "--input-shape img=1,3,N,N")
    with pytest.raises(PlacerError, match=r"input 'img' has no size for axes 0, 2, 3 .* give it with "
                                          r"--input-shape img=N,3,N,N$"):  # ids' batch 2 is not img's 1
        sized_inputs("model m.onnx", inputs, {"ids": (2, 16)})
    assert sized_inputs("model m.onnx", inputs, {"ids": (2, 16), "img": (2, 3, 8, 8)}) == \
        {"ids": (2, 16), "img": (2, 3, 8, 8), "scale": (1,)}
    # restating a fixed input's own shape gives no batch: the open leading dims stay 1, as with no sizes at all
    fixed = {"ids": (None, 16), "scale": (1,)}
    assert sized_inputs("model m.onnx", fixed, {"scale": (1,)}) == {"ids": (1, 16), "scale": (1,)}


def _onnx_fixed_reshape(path) -> str:
    """x[batch, 4, 5] -> Reshape to the constant [1, 20] (written at the export's batch 1) -> MatMul [20, 8]."""
    value = helper.make_tensor_value_info
    target = numpy_helper.from_array(np.array([1, 20], dtype=np.int64), "target")
    weight = numpy_helper.from_array(np.ones((20, 8), dtype=np.float32), "w")
    nodes = [helper.make_node("Reshape", ["x", "target"], ["r"], name="flatten"),
             helper.make_node("MatMul", ["r", "w"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "fixed", [value("x", TensorProto.FLOAT, ["batch", 4, 5])],
                              [value("y", TensorProto.FLOAT, ["b", 8])], [target, weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_cli_graphs_import_onnx__a_reshape_to_a_size_fixed_at_export_is_one_error_naming_it(tmp_path, capsys):
    """onnx's inference gives the Reshape the constant target's shape whatever its input holds: at batch 32
    the MatMul after it was costed at batch 1 (320 FLOPs), with no warning, and onnxruntime cannot run it."""
    from cluster.cli import main

    path, out = _onnx_fixed_reshape(tmp_path / "fixed.onnx"), tmp_path / "fixed.parquet"
    assert main(["graphs", "import", "--onnx", path, "--input-shape", "x=32,4,5", "-o", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"placer: error: ONNX model {Path(path).resolve()}: at the input sizes x=32,4,5 (--input-shape), node "
        "'flatten' (Reshape) fails shape inference: it reshapes [32, 4, 5] (640 elements) to the fixed shape "
        "[1, 20] (20 elements), written at the sizes the model was exported at: export it at these sizes, or with "
        "these axes dynamic\n")
    assert not out.exists()
    assert main(["graphs", "import", "--onnx", path, "-o", str(out)]) == 0  # at its own batch, 1: it runs
    assert out.exists()


def test_import_onnx__a_reshape_whose_target_is_computed_at_run_time_is_not_refused(tmp_path):
    """Its output's declared shape ([1, 20], written at the export's batch) is no fixed target: the model runs
    at batch 32 (onnxruntime reshapes to [32, 20]), and the check refused it as one."""
    value, tensor = helper.make_tensor_value_info, helper.make_tensor
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "st", "en"], ["tail"]),
             helper.make_node("ReduceProd", ["tail"], ["p"], keepdims=1),
             helper.make_node("Concat", ["neg", "p"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="flatten"),
             helper.make_node("Relu", ["y"], ["z"])]
    inits = [tensor("st", TensorProto.INT64, [1], [1]), tensor("en", TensorProto.INT64, [1], [3]),
             tensor("neg", TensorProto.INT64, [1], [-1])]
    graph = helper.make_graph(nodes, "computed", [value("x", TensorProto.FLOAT, ["N", 4, 5])],
                              [value("z", TensorProto.FLOAT, [1, 20])], inits,
                              value_info=[value("y", TensorProto.FLOAT, [1, 20])])
    path = tmp_path / "computed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert import_onnx(str(path), input_shapes={"x": (32, 4, 5)}).num_ops == 6


def _onnx_two_branches(path, dims_a, dims_b) -> str:
    """a, b (dims given) -> ma = a @ w, mb = b @ w (w 64x64) -> add: two inputs of one batch when the model
    names their leading dims alike; y and yb out (an add alone would broadcast a b of batch 1)."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["a", "w"], ["ya"], name="ma"),
             helper.make_node("MatMul", ["b", "w"], ["yb"], name="mb"),
             helper.make_node("Add", ["ya", "yb"], ["y"], name="add")]
    inputs = [value("a", TensorProto.FLOAT, dims_a), value("b", TensorProto.FLOAT, dims_b)]
    outputs = [value("y", TensorProto.FLOAT, ["batch", 64]), value("yb", TensorProto.FLOAT, ["batch", 64])]
    graph = helper.make_graph(nodes, "two", inputs, outputs,
                              [numpy_helper.from_array(np.ones((64, 64), np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _ir_two_branches(path) -> str:
    """The IR twin of _onnx_two_branches: a, b [?, 64]; an IR names no dims."""
    a, b = (ops.parameter(ov.PartialShape([-1, 64]), np.float32, name=name) for name in "ab")
    weight = ops.constant(np.ones((64, 64), np.float32))
    nodes = [ops.matmul(a, weight, False, False), ops.matmul(b, weight, False, False)]
    for node, name in zip(nodes, ("ma", "mb")):
        node.set_friendly_name(name)
    total = ops.add(*nodes)
    total.set_friendly_name("add")
    ov.save_model(ov.Model([ops.result(total)], [a, b], "two"), str(path), compress_to_fp16=False)
    return str(path)


def _op_flops(graph, name: str) -> float:
    return float(graph.flops[graph.op_names.tolist().index(name)])


MATMUL_FLOPS_8 = 2 * 8 * 64 * 64  # a batch of 8 rows through the 64x64 weight


def test_import_onnx__a_size_given_for_a_named_dim_sizes_every_input_that_names_it(tmp_path):
    """a and b are both ["batch", 64]: a=8,64 sizes b at 8 too. b's branch was costed at batch 1 (1/8 of
    its FLOPs), silently, and meta["input_shapes"] held a alone, so the measurer fed b at 1."""
    path = _onnx_two_branches(tmp_path / "two.onnx", ["batch", 64], ["batch", 64])
    graph = import_onnx(path, input_shapes={"a": (8, 64)})
    assert (_op_flops(graph, "ma"), _op_flops(graph, "mb")) == (MATMUL_FLOPS_8, MATMUL_FLOPS_8)
    assert graph.meta["input_shapes"] == {"a": [8, 64], "b": [8, 64]}
    with pytest.raises(PlacerError, match=r"--input-shape gives dim 'batch' size 8 in 'a' and 4 in 'b', but the "
                                          r"model names them one dim"):
        import_onnx(path, input_shapes={"a": (8, 64), "b": (4, 64)})


@pytest.mark.parametrize("importer", [import_onnx, import_openvino_ir])
def test_import__with_sizes_given_a_leading_dim_no_name_ties_to_them_must_be_given_too(tmp_path, importer):
    """An IR names no dims (nor does an ONNX input whose dim has no dim_param): a=8,64 left b [?, 64] at 1
    beside it, silently. Now b is named in the error; given both, both are recorded."""
    path = (_onnx_two_branches(tmp_path / "two.onnx", [None, 64], [None, 64]) if importer is import_onnx
            else _ir_two_branches(tmp_path / "two.xml"))
    with pytest.raises(PlacerError, match=r"input 'b' has no size for axis 0 \(shape \[\?, 64\]\) \(sizes are given "
                                          r"for other inputs, and no dim name ties its leading dim to theirs\); give "
                                          r"it with --input-shape b=N,64$"):
        importer(path, input_shapes={"a": (8, 64)})
    graph = importer(path, input_shapes={"a": (8, 64), "b": (8, 64)})
    assert (_op_flops(graph, "ma"), _op_flops(graph, "mb")) == (MATMUL_FLOPS_8, MATMUL_FLOPS_8)
    assert graph.meta["input_shapes"] == {"a": [8, 64], "b": [8, 64]}
    assert "input_shapes" not in importer(path).meta  # nothing given: every batch 1, as before


def test_sized_inputs__a_named_dim_carries_past_the_leading_axis_and_static_inputs_are_recorded():
    """A BERT export's input_ids and attention_mask share ["batch", "seq"]: giving one sizes both."""
    inputs = {"ids": (None, None), "mask": (None, None), "scale": (1,)}
    names = {"ids": ("batch", "seq"), "mask": ("batch", "seq"), "scale": (None,)}
    assert sized_inputs("model m.onnx", inputs, {"ids": (2, 16)}, names) == \
        {"ids": (2, 16), "mask": (2, 16), "scale": (1,)}


def test_openvino_measurer__feeds_every_input_at_the_sizes_carried_to_it(tmp_path):
    from measurers.openvino.devices import openvino_machine
    from measurers.openvino.measurer import OpenVinoMeasurer

    graph = import_onnx(_onnx_two_branches(tmp_path / "two.onnx", ["batch", 64], ["batch", 64]),
                        input_shapes={"a": (8, 64)})
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=1, warmup=0)
    outputs = measurer.infer_once(np.zeros(graph.num_ops, dtype=np.int64))
    assert [output.shape for output in outputs] == [(8, 64), (8, 64)]  # yb was (1, 64): b fed at batch 1
