"""The ONNX importer on a model written by hand with onnx.helper, whose figures are checked by hand."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphs.errors import PlacerError
from graphs.inference.onnx_import import import_onnx
from graphs.opgraph import PHASE_CODE

BATCH = 2
F32 = 4  # bytes per float32


def _hand_model():
    """x (2,3,8,8) -> conv (3x3, 4 filters, bias) -> unnamed Relu -> flat (Reshape) -> fc (Gemm, bias)
    -> scale (Mul by s) -> fancy (custom domain, reads s again); sum = fc + scale. Two graph outputs."""
    init = numpy_helper.from_array
    initializers = [
        init(np.ones((4, 3, 3, 3), np.float32), "w"), init(np.ones(4, np.float32), "b"),
        init(np.array([BATCH, -1], np.int64), "flat_shape"),
        init(np.ones((144, 4), np.float32), "m"), init(np.ones(4, np.float32), "bias"),
        init(np.ones((1, 4), np.float32), "s"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "flat_shape"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "m", "bias"], ["g"], name="fc"),
        helper.make_node("Mul", ["g", "s"], ["h"], name="scale"),
        helper.make_node("FancyOp", ["h", "s"], ["y"], name="fancy", domain="com.example"),
        helper.make_node("Add", ["g", "h"], ["z"], name="sum"),
    ]
    graph = helper.make_graph(
        nodes, "hand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [BATCH, 4])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.example", 1)])


@pytest.fixture
def hand_onnx(tmp_path):
    path = tmp_path / "hand.onnx"
    onnx.save(_hand_model(), str(path))
    return path


def _by_name(graph, values) -> dict:
    return dict(zip(graph.op_names.tolist(), np.asarray(values).tolist()))


def test_import_onnx__ops_names_kinds_and_metadata(hand_onnx):
    graph = import_onnx(str(hand_onnx))
    assert graph.op_names.tolist() == ["conv", "Relu_1", "flat", "fc", "scale", "fancy", "sum"]
    assert graph.op_kinds.tolist() == ["Conv", "Relu", "Reshape", "Gemm", "Mul", "FancyOp", "Add"]
    assert (graph.name, graph.framework, graph.batch_size) == ("hand", "onnx", BATCH)
    assert set(graph.phases.tolist()) == {PHASE_CODE["forward"]}
    assert graph.meta["model_file"] == str(hand_onnx.resolve()) == graph.source
    assert graph.meta["ops_without_flops"] == {"FancyOp": 1}
    assert graph.num_params == 108 + 4 + 144 * 4 + 4 + 4  # float initializers only: not flat_shape


def test_import_onnx__flops_by_hand(hand_onnx):
    graph = import_onnx(str(hand_onnx))
    conv_out = BATCH * 4 * 6 * 6
    assert _by_name(graph, graph.flops) == {
        "conv": 2 * conv_out * 3 * 3 * 3 + conv_out,  # MACs x 2 + bias
        "Relu_1": conv_out, "flat": 0, "fc": 2 * BATCH * 4 * 144 + BATCH * 4,
        "scale": BATCH * 4, "fancy": 0, "sum": BATCH * 4,
    }


def test_import_onnx__edges_carry_tensor_bytes_and_weights_are_owned_once(hand_onnx):
    graph = import_onnx(str(hand_onnx))
    act, small = BATCH * 144 * F32, BATCH * 4 * F32
    edges = {(graph.op_names[s], graph.op_names[d]): int(b)
             for s, d, b in zip(graph.edge_src, graph.edge_dst, graph.edge_bytes)}
    assert edges == {("conv", "Relu_1"): act, ("Relu_1", "flat"): act, ("flat", "fc"): act,
                     ("fc", "scale"): small, ("scale", "fancy"): small, ("fc", "sum"): small,
                     ("scale", "sum"): small}  # no edge from the graph input x
    assert _by_name(graph, graph.param_bytes) == {
        "conv": (108 + 4) * F32, "Relu_1": 0, "flat": 2 * 8, "fc": (576 + 4) * F32, "scale": 4 * F32,
        "fancy": 0, "sum": 0}  # s belongs to scale, its first reader
    accessed = _by_name(graph, graph.bytes_accessed)
    assert accessed["conv"] == BATCH * 3 * 64 * F32 + act + (108 + 4) * F32
    assert accessed["fancy"] == small + small + 4 * F32  # h in, y out, s read again
    assert _by_name(graph, graph.out_bytes)["fancy"] == small  # its output's declared shape


def test_import_onnx__simulates_on_one_device(hand_onnx):
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer

    graph = import_onnx(str(hand_onnx))
    (measurement,) = SimulatorMeasurer(graph, load_machine("paper-2gpu")).measure(
        [np.zeros(graph.num_ops, dtype=np.int64)])
    assert measurement.ok and measurement.runtime_s > 0


def test_import_onnx__repeated_node_names_are_made_unique(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="act"), helper.make_node("Relu", ["a"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "dups", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    path = tmp_path / "dups.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    imported = import_onnx(str(path), name="renamed")
    assert imported.op_names.tolist() == ["act", "act_1"] and imported.name == "renamed"
    assert imported.edge_src.tolist() == [0] and imported.edge_dst.tolist() == [1]


def test_import_onnx__if_is_one_op_fed_by_what_its_branches_read(tmp_path):
    value = helper.make_tensor_value_info
    branch = {name: helper.make_graph([helper.make_node(kind, ["h"], [f"{name}_out"])], name, [],
                                      [value(f"{name}_out", TensorProto.FLOAT, [4])])
              for name, kind in (("then", "Identity"), ("else", "Neg"))}
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=branch["then"],
                              else_branch=branch["else"])]
    inputs = [value("x", TensorProto.FLOAT, [4]), value("flag", TensorProto.BOOL, [])]
    graph = helper.make_graph(nodes, "branchy", inputs, [value("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "branchy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    imported = import_onnx(str(path))
    assert imported.op_names.tolist() == ["relu", "choose"]
    assert list(zip(imported.edge_src.tolist(), imported.edge_dst.tolist(), imported.edge_bytes.tolist())) == \
        [(0, 1, 16)]  # h, read inside both branches
    assert imported.meta["ops_without_flops"] == {} and imported.flops[1] == 4  # the Neg branch's


def _damaged(tmp_path, hand_onnx) -> dict:
    data = hand_onnx.read_bytes()
    files = {"truncated": data[: len(data) // 2], "random": np.random.default_rng(0).bytes(2000), "empty": b""}
    broken = _hand_model()
    broken.graph.node[3].input[0] = "nowhere"  # fc reads a tensor nothing makes
    files["dangling"] = broken.SerializeToString()
    paths = {}
    for label, content in files.items():
        paths[label] = tmp_path / f"{label}.onnx"
        paths[label].write_bytes(content)
    return paths


def test_import_onnx__damaged_files_are_placer_errors_naming_the_file(tmp_path, hand_onnx):
    for label, path in _damaged(tmp_path, hand_onnx).items():
        with pytest.raises(PlacerError, match=str(path)) as caught:
            import_onnx(str(path))
        assert "not a valid ONNX model" in str(caught.value), label
    with pytest.raises(PlacerError, match="does not exist"):
        import_onnx(str(tmp_path / "absent.onnx"))
    (tmp_path / "folder.onnx").mkdir()
    with pytest.raises(PlacerError, match="folder.onnx is a folder, not a file"):
        import_onnx(str(tmp_path / "folder.onnx"))


def test_cli_graphs_import_onnx__writes_the_graph_and_warns_once(tmp_path, hand_onnx, capsys):
    from cluster.cli import main
    from graphs.io import load_graph_file

    out = tmp_path / "hand.parquet"
    assert main(["graphs", "import", "--onnx", str(hand_onnx), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert warnings == ["placer: warning: 1 op type has no FLOP formula, imported with bytes only: FancyOp (1)"]
    assert load_graph_file(out).content_hash == import_onnx(str(hand_onnx)).content_hash


def test_cli_graphs_import_onnx__damaged_file_exits_2_and_writes_nothing(tmp_path, hand_onnx, capsys):
    from cluster.cli import main

    damaged = _damaged(tmp_path, hand_onnx)["truncated"]
    out = tmp_path / "never.parquet"
    assert main(["graphs", "import", "--onnx", str(damaged), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error:") and str(damaged) in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.glob("*.parquet")) == []


def test_import_onnx__a_gru_counts_its_matmuls_biases_and_gates(tmp_path):
    """X (5 steps, 2 examples, 3 inputs), hidden 4, one direction, with bias: per step and example
    2 x 12 x (3 + 4) matmul FLOPs + 2 x 12 bias adds + 11 x 4 gate FLOPs."""
    weights = [numpy_helper.from_array(np.ones((1, 12, 3), np.float32), "W"),
               numpy_helper.from_array(np.ones((1, 12, 4), np.float32), "R"),
               numpy_helper.from_array(np.ones((1, 24), np.float32), "B")]
    node = helper.make_node("GRU", ["x", "W", "R", "B"], ["y", "h"], name="gru", hidden_size=4)
    graph = helper.make_graph([node], "gru", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, 3])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 2, 4])], weights)
    path = tmp_path / "gru.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    imported = import_onnx(str(path))
    assert imported.flops.tolist() == [5 * 2 * (2 * 12 * 7 + 2 * 12 + 11 * 4)]
    assert imported.meta["ops_without_flops"] == {}


def test_cli_graphs_import_onnx__tensors_of_data_dependent_shape_are_counted_and_warned(tmp_path, capsys):
    from cluster.cli import main
    from graphs.io import load_graph_file

    nodes = [helper.make_node("NonZero", ["x"], ["i"], name="nonzero"),
             helper.make_node("Cast", ["i"], ["y"], name="cast", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n"])])
    path, out = tmp_path / "nz.onnx", tmp_path / "nz.parquet"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["graphs", "import", "--onnx", str(path), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "placer: warning: 2 tensor(s) have a dim or a shape that shape inference could not size" in err
    assert "(made by Cast (1), NonZero (1): a shape computed at run time" in err  # which ops to look at
    meta = load_graph_file(out).meta
    assert meta["tensors_without_size"] == 2 and meta["unsized_tensors_by_op"] == {"Cast": 1, "NonZero": 1}


def _save(tmp_path, nodes, inputs, outputs, initializers=(), domains=()) -> str:
    """An opset-17 model of ``nodes`` saved in ``tmp_path``; its path."""
    graph = helper.make_graph(nodes, "small", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(domain, 1) for domain in domains]
    path = tmp_path / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return str(path)


def test_cli_graphs_import_onnx__outputs_shape_inference_cannot_type_are_counted_and_warned(tmp_path, capsys):
    """com.microsoft's Gelu is unknown to onnx's shape inference: its output used to be 0 bytes, silently."""
    from cluster.cli import main
    from graphs.io import load_graph_file

    value = helper.make_tensor_value_info
    path = _save(tmp_path, [helper.make_node("Gelu", ["x"], ["g"], name="gelu", domain="com.microsoft"),
                            helper.make_node("Relu", ["g"], ["y"], name="relu")],
                 [value("x", TensorProto.FLOAT, [2, 3])], [value("y", TensorProto.FLOAT, [2, 3])],
                 domains=["com.microsoft"])
    out = tmp_path / "gelu.parquet"
    assert main(["graphs", "import", "--onnx", path, "-o", str(out)]) == 0
    assert "placer: warning: 1 tensor(s) have a dim or a shape that shape inference could not size (made by Gelu " \
        "(1): " in capsys.readouterr().err
    assert load_graph_file(out).meta["unsized_tensors_by_op"] == {"Gelu": 1}


def test_import_onnx__a_tensor_read_twice_by_one_node_is_one_edges_bytes(tmp_path):
    value = helper.make_tensor_value_info
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="relu"),
                            helper.make_node("Mul", ["y", "y"], ["z"], name="square")],
                 [value("x", TensorProto.FLOAT, [2, 3])], [value("z", TensorProto.FLOAT, [2, 3])])
    graph = import_onnx(path)
    assert graph.edge_bytes.tolist() == [6 * F32]  # y once, not twice
    assert _by_name(graph, graph.bytes_accessed)["square"] == 2 * 6 * F32  # y in, z out


def _one_node_model(tmp_path, op_type: str, elem_type: int, shape: list) -> str:
    value = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node(op_type, ["a"], ["o"], name="op")], "one",
                              [value("a", elem_type, shape)], [value("o", elem_type, shape)])
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_import_onnx__a_zero_size_dim_is_zero_elements_not_an_unknown_dim(tmp_path):
    """dim_value 0 is a size (an empty batch): 0 FLOPs and 0 bytes, as OpenVINO's import of the same model
    gives; it was taken for a dynamic dim and counted as 1 (and as a tensor without a size)."""
    graph = import_onnx(_one_node_model(tmp_path, "Relu", TensorProto.FLOAT16, [0, 5]))
    assert graph.flops.tolist() == [0.0]
    assert graph.bytes_accessed.tolist() == [0.0]
    assert graph.out_bytes.tolist() == [0]
    assert "tensors_without_size" not in graph.meta


def test_import_onnx__string_tensors_have_no_byte_size(tmp_path):
    """STRING has no fixed size (0 bytes per element, as the importer documents), not numpy's 8-byte pointer."""
    graph = import_onnx(_one_node_model(tmp_path, "Identity", TensorProto.STRING, [3]))
    assert graph.bytes_accessed.tolist() == [0.0]
    assert graph.out_bytes.tolist() == [0]


def test_import_onnx__int8_and_bool_tensors_are_one_byte_an_element(tmp_path):
    graph = import_onnx(_one_node_model(tmp_path, "Identity", TensorProto.INT8, [3, 5]))
    assert graph.out_bytes.tolist() == [15]
    graph = import_onnx(_one_node_model(tmp_path, "Not", TensorProto.BOOL, [4]))
    assert (graph.out_bytes.tolist(), graph.bytes_accessed.tolist()) == ([4], [8.0])


def test_import_onnx__einsum_counts_its_contractions(tmp_path):
    """Einsum had no FLOP formula (0 FLOPs, listed in ops_without_flops): attention written with torch.einsum
    and exported lost its matmuls. Scores 'bhqd,bhkd->bhqk' are a batched matmul; in 'bsd,bte->bst' each
    operand sums its own index (d, e) before the product."""
    value = helper.make_tensor_value_info
    path = _save(tmp_path, [helper.make_node("Einsum", ["q", "k"], ["s"], name="scores", equation="bhqd,bhkd->bhqk"),
                            helper.make_node("Einsum", ["x", "x"], ["t"], name="sums", equation="bsd,bte->bst")],
                 [value("q", TensorProto.FLOAT, [2, 4, 8, 16]), value("k", TensorProto.FLOAT, [2, 4, 6, 16]),
                  value("x", TensorProto.FLOAT, [2, 5, 3])],
                 [value("s", TensorProto.FLOAT, [2, 4, 8, 6]), value("t", TensorProto.FLOAT, [2, 5, 5])])
    graph = import_onnx(path)
    assert _by_name(graph, graph.flops) == {"scores": 2 * 2 * 4 * 8 * 6 * 16, "sums": 2 * (2 * 5 * 3) + 2 * 2 * 5 * 5}
    assert graph.meta["ops_without_flops"] == {}


@pytest.mark.parametrize("equation, shapes, flops", [
    ("ij,jk", [(3, 5), (5, 7)], 2 * 3 * 5 * 7),  # implicit output ik
    ("...j,jk->...k", [(2, 3, 5), (5, 7)], 2 * 2 * 3 * 5 * 7),  # OpenVINO gives the equation as str
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], 2 * 2 * 3 * 4 + 2 * 2 * 4 * 5),  # left to right
    ("ij->i", [(6, 7)], 6 * 7), ("ij->ji", [(6, 7)], 0),  # a sum; a transpose
    ("ij,jk->ik", [(3, 5), None], 0),  # an operand of unknown rank
])
def test_op_flops__einsum_equations(equation, shapes, flops):
    from graphs.inference.flops import op_flops

    assert op_flops("Einsum", shapes, [None], {"equation": equation}) == flops


def test_import_onnx__conv_transpose_counts_its_bias_as_conv_does(tmp_path):
    """x (1, 8, 4, 4) -> ConvTranspose 8 -> 4 channels, kernel 2, stride 2 -> (1, 4, 8, 8): each input pixel
    of each input channel meets 4 x 2 x 2 weights; the bias (its third input) one add per output element,
    as Conv's (it was left out)."""
    value = helper.make_tensor_value_info
    path = _save(tmp_path, [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", strides=[2, 2])],
                 [value("x", TensorProto.FLOAT, [1, 8, 4, 4])], [value("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                 [numpy_helper.from_array(np.ones((8, 4, 2, 2), np.float32), "w"),
                  numpy_helper.from_array(np.ones(4, np.float32), "b")])
    assert import_onnx(path).flops.tolist() == [2 * (8 * 4 * 4) * (4 * 2 * 2) + 4 * 8 * 8]


def test_import_onnx__resize_counts_its_interpolation_by_mode(tmp_path):
    """Resize had no FLOP formula (0 FLOPs, listed in ops_without_flops). x (1, 3, 4, 6) -> (1, 3, 8, 12):
    two dims resized, so 2^2 taps an output element for linear, 4^2 for cubic, a multiply-add each; nearest
    is a gather; a linear resize of one dim (-> (1, 3, 4, 12)) reads 2 taps."""
    value = helper.make_tensor_value_info
    sizes = {"both": [1, 3, 8, 12], "wide": [1, 3, 4, 12]}
    nodes = [helper.make_node("Resize", ["x", "", "", size], [f"y_{mode}_{size}"], name=f"{mode}_{size}", mode=mode)
             for mode, size in (("nearest", "both"), ("linear", "both"), ("cubic", "both"), ("linear", "wide"))]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [1, 3, 4, 6])],
                 [value(node.output[0], TensorProto.FLOAT, sizes[node.name.partition("_")[2]]) for node in nodes],
                 [numpy_helper.from_array(np.array(dims, np.int64), name) for name, dims in sizes.items()])
    graph = import_onnx(path)
    both, wide = 3 * 8 * 12, 3 * 4 * 12
    assert _by_name(graph, graph.flops) == {"nearest_both": 0, "linear_both": 2 * 4 * both,
                                            "cubic_both": 2 * 16 * both, "linear_wide": 2 * 2 * wide}
    assert graph.meta["ops_without_flops"] == {}


@pytest.mark.parametrize("mode, flops", [(b"linear", 2 * 2 * 10), ("bilinear_pillow", 2 * 2 * 10),
                                         ("bicubic_pillow", 2 * 4 * 10), ("nearest", 0), ("linear_onnx", 0)])
def test_op_flops__resize_modes(mode, flops):
    """ONNX gives the mode as bytes, OpenVINO's Interpolate as str; the last: no dim changes size."""
    from graphs.inference.flops import op_flops

    out = (2, 5) if mode != "linear_onnx" else (2, 3)
    assert op_flops("Interpolate", [(2, 3)], [out], {"mode": mode}) == flops


SEQ, HIDDEN, HEADS = 5, 12, 3  # head_dim 4


def _legacy_attention(tmp_path, opset: int, head_dim_op: str = "Div") -> str:
    """The attention scores of an older torch.onnx export: x (BATCH, SEQ, HIDDEN) is reshaped to (batch, seq,
    heads, hidden // heads), its target computed at run time (Shape -> Gather -> Div -> Unsqueeze -> Concat),
    then q (.., seq, head_dim) @ k (.., head_dim, seq). ``head_dim_op`` (another op than "Div") follows the Div
    with that op: "Relu", an identity on a size that the folding does not know."""
    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value)))

    def unsqueeze(source, out):  # axes: an attribute up to opset 12, an input from 13
        if opset < 13:
            return helper.make_node("Unsqueeze", [source], [out], axes=[0])
        return helper.make_node("Unsqueeze", [source, "axis0"], [out])

    head_dim = [helper.make_node("Div", ["hidden", "heads"], ["head_dim"])] if head_dim_op == "Div" else [
        helper.make_node("Div", ["hidden", "heads"], ["quotient"]),
        helper.make_node(head_dim_op, ["quotient"], ["head_dim"])]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]), const("i0", np.int64(0)), const("i1", np.int64(1)),
        const("i2", np.int64(2)), const("heads", np.int64(HEADS)), const("axis0", np.array([0], np.int64)),
        *[helper.make_node("Gather", ["shape", f"i{k}"], [dim], axis=0)
          for k, dim in enumerate(("batch", "seq", "hidden"))],
        *head_dim,
        *[unsqueeze(dim, f"{dim}_1") for dim in ("batch", "seq", "heads", "head_dim")],
        helper.make_node("Concat", ["batch_1", "seq_1", "heads_1", "head_dim_1"], ["target"], axis=0, name="target"),
        helper.make_node("Reshape", ["x", "target"], ["split"], name="split"),
        helper.make_node("Transpose", ["split"], ["q"], perm=[0, 2, 1, 3], name="q"),
        helper.make_node("Transpose", ["split"], ["k"], perm=[0, 2, 3, 1], name="k"),
        helper.make_node("MatMul", ["q", "k"], ["scores"], name="scores"),
    ]
    graph = helper.make_graph(nodes, "legacy", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [BATCH, SEQ, HIDDEN])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["b", "h", "s", "t"])])
    path = tmp_path / f"legacy{opset}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return str(path)


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_import_onnx__a_legacy_attention_reshape_gets_its_computed_target(tmp_path, opset):
    """onnx's inference leaves the target unknown: Reshape-5/-13 read no computed target (not even the rank),
    and no opset's data propagation does Div; the folded target sizes every tensor."""
    graph = import_onnx(_legacy_attention(tmp_path, opset))
    head_dim = HIDDEN // HEADS
    assert "unsized_tensors_by_op" not in graph.meta and "tensors_without_size" not in graph.meta
    flops, accessed = _by_name(graph, graph.flops), _by_name(graph, graph.bytes_accessed)
    assert flops["scores"] == 2 * BATCH * HEADS * SEQ * SEQ * head_dim
    assert accessed["scores"] == 2 * BATCH * SEQ * HIDDEN * F32 + BATCH * HEADS * SEQ * SEQ * F32  # q, k; out
    assert accessed["split"] == 2 * BATCH * SEQ * HIDDEN * F32 + 4 * 8  # x in (a graph input), split out; target
    names = graph.op_names.tolist()
    edges = {(names[s], names[d]): b for s, d, b in zip(graph.edge_src, graph.edge_dst, graph.edge_bytes)}
    assert edges[("target", "split")] == 4 * 8  # the model's own nodes: the Concat still feeds the Reshape


def test_import_onnx__a_target_through_an_op_not_folded_stays_unknown_as_before(tmp_path):
    graph = import_onnx(_legacy_attention(tmp_path, 17, head_dim_op="Relu"))
    assert graph.meta["unsized_tensors_by_op"] == {"Reshape": 1, "Transpose": 2}  # head_dim counted as 1
    assert _by_name(graph, graph.flops)["scores"] == 2 * BATCH * HEADS * SEQ * SEQ * 1


def test_import_onnx__expand_and_constant_of_shape_targets_fold_through_slice_squeeze_cast_and_arithmetic(tmp_path):
    """(2, 5, 12) = Concat(Slice(shape)[0:2], Unsqueeze(Cast(Mul(Div(Cast(Squeeze(Slice(shape)[2:3])), 2), 2))))."""
    init = numpy_helper.from_array
    value = helper.make_tensor_value_info
    initializers = [init(np.array([0], np.int64), "zero"), init(np.array([2], np.int64), "two"),
                    init(np.array([3], np.int64), "three"), init(np.float32(2), "half"),
                    init(np.ones((1, 1, 1), np.float32), "bias")]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["lead"]),
        helper.make_node("Slice", ["shape", "two", "three"], ["last_1"]),
        helper.make_node("Squeeze", ["last_1", "zero"], ["last"]),
        helper.make_node("Cast", ["last"], ["last_f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["last_f", "half"], ["halved"]),
        helper.make_node("Mul", ["halved", "half"], ["doubled"]),
        helper.make_node("Cast", ["doubled"], ["width"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["width", "zero"], ["width_1"]),
        helper.make_node("Concat", ["lead", "width_1"], ["target"], axis=0),
        helper.make_node("Expand", ["bias", "target"], ["e"], name="expand"),
        helper.make_node("ConstantOfShape", ["target"], ["z"], name="zeros",
                         value=init(np.array([0], np.float32), "fill")),
        helper.make_node("Add", ["e", "z"], ["y"], name="sum"),
    ]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 5, 12])],
                 [value("y", TensorProto.FLOAT, [2, 5, "w"])], initializers)
    graph = import_onnx(path)
    assert "unsized_tensors_by_op" not in graph.meta
    assert _by_name(graph, graph.flops)["sum"] == 2 * 5 * 12
    assert _by_name(graph, graph.bytes_accessed)["sum"] == 3 * 2 * 5 * 12 * F32


def test_import_onnx__a_target_computed_from_a_folded_reshapes_output_folds_in_a_later_round(tmp_path):
    """The heads merged back: (batch, seq, heads * head_dim) from Shape(split), which the first inference
    leaves without even a rank at opset 13."""
    model = onnx.load(_legacy_attention(tmp_path, 13))
    init = numpy_helper.from_array
    model.graph.initializer.extend([init(np.array([0], np.int64), "start"), init(np.array([2], np.int64), "end"),
                                    init(np.int64(2), "at2"), init(np.int64(3), "at3")])
    model.graph.node.extend([
        helper.make_node("Shape", ["split"], ["split_shape"]),
        helper.make_node("Slice", ["split_shape", "start", "end"], ["lead"]),
        helper.make_node("Gather", ["split_shape", "at2"], ["split_heads"]),
        helper.make_node("Gather", ["split_shape", "at3"], ["split_head_dim"]),
        helper.make_node("Mul", ["split_heads", "split_head_dim"], ["width"]),
        helper.make_node("Unsqueeze", ["width", "axis0"], ["width_1"]),
        helper.make_node("Concat", ["lead", "width_1"], ["merged_shape"], axis=0),
        helper.make_node("Reshape", ["split", "merged_shape"], ["merged"], name="merge"),
        helper.make_node("Relu", ["merged"], ["out"], name="relu"),
    ])
    model.graph.output.append(helper.make_tensor_value_info("out", TensorProto.FLOAT, [BATCH, SEQ, "w"]))
    path = tmp_path / "merged.onnx"
    onnx.save(model, str(path))
    graph = import_onnx(str(path))
    assert "unsized_tensors_by_op" not in graph.meta
    assert _by_name(graph, graph.flops)["relu"] == BATCH * SEQ * HIDDEN


def test_import_onnx__normalizations_count_their_scale_and_bias_as_openvinos_spelling_does(tmp_path):
    """A LayerNormalization counted 5 FLOPs an element, as OpenVINO's MVN, which has no scale or bias: the
    OpenVINO IR converted from the same file (MVN, Multiply, Add) counted 7. x (2, 3, 4): 5 to normalize, 1
    for the scale, 1 for the bias where given (LayerNormalization's is optional); InstanceNormalization
    always has both."""
    import openvino as ov

    from graphs.inference.openvino_import import import_openvino_ir

    rng = np.random.default_rng(0)
    init = numpy_helper.from_array
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], name="ln", axis=-1),
             helper.make_node("LayerNormalization", ["y", "gamma"], ["z"], name="ln_unbiased", axis=-1),
             helper.make_node("InstanceNormalization", ["z", "scale", "shift"], ["out"], name="instance")]
    weights = [init(rng.normal(size=size).astype(np.float32), name)  # not ones and zeros, which OpenVINO folds
               for name, size in {"gamma": 4, "beta": 4, "scale": 3, "shift": 3}.items()]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 3, 4])],
                 [value("out", TensorProto.FLOAT, [2, 3, 4])], weights)
    graph = import_onnx(path)
    assert _by_name(graph, graph.flops) == {"ln": 7 * 24, "ln_unbiased": 6 * 24, "instance": 7 * 24}
    xml = tmp_path / "small.xml"
    ov.save_model(ov.convert_model(path), str(xml), compress_to_fp16=False)
    converted = import_openvino_ir(str(xml))
    assert "MVN" in converted.op_kinds.tolist() and "LayerNormalization" not in converted.op_kinds.tolist()
    assert converted.total_flops == graph.total_flops


@pytest.mark.parametrize("op_type, flops", [("GroupNormalization", 7 * 60), ("MeanVarianceNormalization", 5 * 60),
                                            ("MVN", 5 * 60)])
def test_op_flops__normalizations(op_type, flops):
    """ONNX GroupNormalization(X, scale, bias) normalizes and scales; MVN (OpenVINO, its second input the
    axes) and ONNX MeanVarianceNormalization only normalize."""
    from graphs.inference.flops import op_flops

    assert op_flops(op_type, [(2, 6, 5), (2,), (2,)], [(2, 6, 5)], {}) == flops


def test_import_onnx__attention_of_opset_23_counts_per_score_what_scaled_dot_product_attention_does(tmp_path):
    """ONNX's Attention had no formula (0 FLOPs, listed). q (2, 4 heads, L=6, E=8), k (2, 2 heads, S=10, 8), v
    (2, 2, 10, Ev=16): per score (batch x q heads x L x S) 2 x 8 + 2 x 16 for the matmuls, 1 for the scale and
    5 for the softmax (54), as OpenVINO's ScaledDotProductAttention; 1 more for a mask (is_causal, or an
    attn_mask of more than one element), 3 more for a softcap. The keys in past_key (P=3) are scored too: S
    counts them, read at its own input index after an attn_mask left out ("")."""
    value = helper.make_tensor_value_info
    shapes = {"q": [2, 4, 6, 8], "k": [2, 2, 10, 8], "v": [2, 2, 10, 16], "past_k": [2, 2, 3, 8],
              "past_v": [2, 2, 3, 16], "q3": [2, 6, 32], "k3": [2, 10, 16], "v3": [2, 10, 32], "mask": [6, 10],
              "one": [1]}
    attention = partial(helper.make_node, "Attention")
    nodes = [attention(["q", "k", "v"], ["plain_y"], name="plain"),
             attention(["q", "k", "v", "", "past_k", "past_v"], ["past_y", "present_k", "present_v"], name="past"),
             attention(["q", "k", "v"], ["causal_y"], name="causal", is_causal=1),
             attention(["q", "k", "v", "one"], ["one_y"], name="one_element_mask"),
             attention(["q", "k", "v"], ["capped_y"], name="capped", softcap=30.0),
             attention(["q3", "k3", "v3", "mask"], ["grouped_y"], name="grouped", q_num_heads=4, kv_num_heads=2),
             helper.make_node("Attention", ["q", "k", "v"], ["ms_y"], name="microsoft", domain="com.microsoft")]
    outputs = {"plain_y": [2, 4, 6, 16], "past_y": [2, 4, 6, 16], "present_k": [2, 2, 13, 8],
               "present_v": [2, 2, 13, 16], "causal_y": [2, 4, 6, 16], "one_y": [2, 4, 6, 16],
               "capped_y": [2, 4, 6, 16], "grouped_y": [2, 6, 64], "ms_y": [2, 4, 6, 16]}
    graph = helper.make_graph(nodes, "attention", [value(n, TensorProto.FLOAT, d) for n, d in shapes.items()],
                              [value(n, TensorProto.FLOAT, d) for n, d in outputs.items()])
    path = tmp_path / "attention.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                      helper.make_opsetid("com.microsoft", 1)]), str(path))
    imported = import_onnx(str(path))
    scores, per_score = 2 * 4 * 6 * 10, 2 * 8 + 2 * 16 + 1 + 5
    assert _by_name(imported, imported.flops) == {
        "plain": scores * per_score, "past": 2 * 4 * 6 * 13 * per_score, "causal": scores * (per_score + 1),
        "one_element_mask": scores * per_score, "capped": scores * (per_score + 3),
        "grouped": scores * (per_score + 1), "microsoft": 0}
    assert imported.meta["ops_without_flops"] == {"Attention": 1}  # com.microsoft's: other inputs, no formula


# Subgraph ops: a Loop, Scan or If costs its bodies (nodes costed as the main graph's), figures by hand.

BOOL = 1  # bytes per bool


def _loop_body(carried_shape=(2, 4), condition=None):
    """One iteration: h (2,4) @ W (4,4, the outer graph's) -> m; m + b (4, the body's own weight) -> h2; the
    condition passed through by an Identity (or ``condition``'s nodes making cond_out)."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["h", "W"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b"], ["h2"], name="add")]
    nodes += condition or [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")]
    shape = list(carried_shape) if carried_shape is not None else None
    return helper.make_graph(nodes, "body", [value("i", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
                                             value("h", TensorProto.FLOAT, shape)],
                             [value("cond_out", TensorProto.BOOL, []), value("h2", TensorProto.FLOAT, shape)],
                             [numpy_helper.from_array(np.ones(4, np.float32), "b")])


# one iteration of _loop_body: MatMul 2 x 8 x 4 + Add 8 FLOPs; bytes: MatMul h, W, m; Add m, b, h2; Identity 2 bools
BODY_FLOPS = 2 * 8 * 4 + 8
BODY_BYTES = (8 + 16 + 8) * F32 + (8 + 4 + 8) * F32 + 2 * BOOL


def _loop_model(tmp_path, body, trips_input: str = "M", extra_inputs=(), trips: int = 5, before=(),
                condition: str = "", extra_initializers=()) -> str:
    """x (2,4) -> loop (Loop M times over body) -> y; W (4,4) and M = ``trips`` (5) initializers. ``before``:
    nodes ahead of the loop (making its trip count ``trips_input`` or its ``condition``)."""
    value = helper.make_tensor_value_info
    initializers = [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
                    numpy_helper.from_array(np.array(trips, np.int64), "M"), *extra_initializers]
    loop = helper.make_node("Loop", [trips_input, condition, "x"], ["y"], name="loop", body=body)
    return _save(tmp_path, [*before, loop], [value("x", TensorProto.FLOAT, [2, 4]), *extra_inputs],
                 [value("y", TensorProto.FLOAT, [2, 4])], initializers)


def test_import_onnx__a_loop_with_a_static_trip_count_costs_its_body_times_the_trips(tmp_path):
    graph = import_onnx(_loop_model(tmp_path, _loop_body()))
    assert graph.flops.tolist() == [5 * BODY_FLOPS]
    # 5 runs of its body, which read x (the first) and W, and write y (the last): its own tensors are not counted again
    assert graph.bytes_accessed.tolist() == [5 * BODY_BYTES]
    assert graph.param_bytes.tolist() == [8 + 16 * F32 + 4 * F32]  # M, W and the body's b: resident once
    assert graph.out_bytes.tolist() == [8 * F32]
    assert graph.num_params == 16 + 4  # W and the body's b
    assert graph.meta["ops_without_flops"] == {} and "bodies_not_costed" not in graph.meta


def test_import_onnx__a_huge_static_trip_count_is_one_error_naming_the_loop_not_the_input_sizes(tmp_path, capsys):
    """M = 10**18 took the body's bytes past 2**62, and the error said to check --input-shape, which this model
    has none of."""
    from cluster.cli import main

    path = _loop_model(tmp_path, _loop_body(), trips=10**18)
    message = (f"ONNX model {Path(path).resolve()}: Loop 'loop' runs its body 1000000000000000000 times (its static "
               f"trip count), {BODY_BYTES} bytes accessed in each run: {10**18 * BODY_BYTES:.3g} bytes, more than a "
               "graph counts (2**62)")
    with pytest.raises(PlacerError) as caught:
        import_onnx(path)
    assert str(caught.value) == message
    out = tmp_path / "loop.parquet"
    assert main(["graphs", "import", "--onnx", path, "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"placer: error: {message}\n" and not out.exists()


def test_import_onnx__loops_within_the_limit_each_but_not_together_name_the_costliest(tmp_path):
    """Two loops each under 2**62 bytes, over it together: the total's error names the costlier one."""
    value = helper.make_tensor_value_info
    trips = 2**62 // BODY_BYTES - 1
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["h"], name="first", body=_loop_body()),
             helper.make_node("Loop", ["N", "", "h"], ["y"], name="second", body=_loop_body())]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 4])], [value("y", TensorProto.FLOAT, [2, 4])],
                 [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
                  numpy_helper.from_array(np.array(trips, np.int64), "M"),
                  numpy_helper.from_array(np.array(trips - 1, np.int64), "N")])
    with pytest.raises(PlacerError, match=r"its subgraph bodies' accesses total .* bytes, more than a graph counts "
                                          r"\(2\*\*62\): the most from Loop 'first', .* over its runs: check its trip "
                                          r"count$"):
        import_onnx(path)


def test_import_onnx__a_loop_whose_trip_count_is_a_folded_shape_is_costed(tmp_path):
    """M = Shape(x)[0] (2), as torch.onnx writes ``for t in range(x.size(0))`` when it does not fold it."""
    shape_of_x = [helper.make_node("Shape", ["x"], ["x_shape"]),
                  helper.make_node("Gather", ["x_shape", "zero"], ["steps"], axis=0)]
    graph = import_onnx(_loop_model(tmp_path, _loop_body(), trips_input="steps", before=shape_of_x,
                                    extra_initializers=[numpy_helper.from_array(np.array(0, np.int64), "zero")]))
    assert _by_name(graph, graph.flops)["loop"] == 2 * BODY_FLOPS


def test_import_onnx__a_loop_whose_body_condition_is_a_constant_true_is_costed(tmp_path):
    """torch.onnx's for loop: the body's condition output an Identity of the outer graph's Constant true."""
    body = _loop_body(condition=[helper.make_node("Identity", ["go"], ["cond_out"])])
    go = helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(np.array(True)))
    graph = import_onnx(_loop_model(tmp_path, body, trips=3, before=[go], condition="go"))
    assert _by_name(graph, graph.flops)["loop"] == 3 * BODY_FLOPS


def test_import_onnx__loops_nest(tmp_path):
    """An outer Loop (M = 5) whose body runs an inner Loop (N = 3, a Constant of the outer body) of _loop_body."""
    value = helper.make_tensor_value_info
    inner = helper.make_node("Loop", ["N", "", "h_outer"], ["h_next"], name="inner", body=_loop_body())
    outer_body = helper.make_graph(
        [helper.make_node("Constant", [], ["N"], value=numpy_helper.from_array(np.array(3, np.int64))), inner,
         helper.make_node("Identity", ["cond_outer"], ["cond_next"])], "outer_body",
        [value("j", TensorProto.INT64, []), value("cond_outer", TensorProto.BOOL, []),
         value("h_outer", TensorProto.FLOAT, [2, 4])],
        [value("cond_next", TensorProto.BOOL, []), value("h_next", TensorProto.FLOAT, [2, 4])])
    graph = import_onnx(_loop_model(tmp_path, outer_body))
    assert graph.flops.tolist() == [5 * 3 * BODY_FLOPS]
    # M, N (a Constant, a weight as an initializer: graphs.inference.onnx_constants), W, the inner body's b (once)
    assert graph.param_bytes.tolist() == [8 + 8 + 16 * F32 + 4 * F32]
    assert graph.num_params == 16 + 4


def test_import_onnx__a_loop_without_a_static_trip_count_is_listed_and_says_why(tmp_path, capsys):
    from cluster.cli import main

    value = helper.make_tensor_value_info
    dynamic = _loop_model(tmp_path, _loop_body(), trips_input="steps",
                          extra_inputs=[value("steps", TensorProto.INT64, [])])
    graph = import_onnx(dynamic)
    assert graph.flops.tolist() == [0.0]
    assert graph.bytes_accessed.tolist() == [8 * F32 + 8 * F32 + 16 * F32 + 8]  # its own tensors, W: no body
    assert graph.meta["ops_without_flops"] == {"Loop": 1}
    assert graph.meta["bodies_not_costed"] == {"loop": "Loop: its trip count M is computed at run time"}
    out = tmp_path / "loop.parquet"
    assert main(["graphs", "import", "--onnx", dynamic, "-o", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["placer: warning: 1 op type has no FLOP formula, imported with bytes only: Loop (1); "
                        "subgraph ops whose bodies are not costed, their trip count unknown: loop (Loop: its trip "
                        "count M is computed at run time)"]


def test_import_onnx__a_loop_that_may_stop_early_on_its_condition_is_not_costed(tmp_path):
    """M = 5 bounds the trips, but the body computes the condition (sum(h2) < 100): no static trip count."""
    stop = [helper.make_node("ReduceSum", ["h2"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"])]
    body = _loop_body(condition=stop)
    body.initializer.append(numpy_helper.from_array(np.array(100, np.float32), "limit"))
    graph = import_onnx(_loop_model(tmp_path, body))
    assert graph.flops.tolist() == [0.0] and graph.meta["ops_without_flops"] == {"Loop": 1}
    assert graph.meta["bodies_not_costed"] == {
        "loop": "Loop: its body computes its condition, so it may stop before its trip count M"}


def test_import_onnx__a_body_tensor_without_a_shape_is_counted_not_a_crash(tmp_path):
    """A body that declares no shape for its carried h: onnx's inference leaves h, m and h2 unshaped there (a
    loop-carried value may change shape between iterations), so MatMul and Add count 0 FLOPs and 0 bytes."""
    graph = import_onnx(_loop_model(tmp_path, _loop_body(carried_shape=None)))
    assert graph.flops.tolist() == [0.0]
    assert graph.meta["unsized_tensors_by_op"] == {"Add": 1, "MatMul": 1}
    assert graph.meta["ops_without_flops"] == {}


def test_import_onnx__an_op_without_a_formula_inside_a_body_is_listed(tmp_path):
    body = _loop_body()
    body.node.append(helper.make_node("FancyOp", ["h2"], ["fancy_out"], name="fancy", domain="com.example"))
    body.output.append(helper.make_tensor_value_info("fancy_out", TensorProto.FLOAT, [2, 4]))
    path = _loop_model(tmp_path, body)
    model = onnx.load(path)
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    model.graph.output.append(helper.make_tensor_value_info("ys", TensorProto.FLOAT, [5, 2, 4]))
    model.graph.node[0].output.append("ys")
    onnx.save(model, path)
    graph = import_onnx(path)
    assert graph.meta["ops_without_flops"] == {"FancyOp": 1}
    assert graph.flops.tolist() == [5 * BODY_FLOPS]  # the rest of the body


@pytest.mark.parametrize("axis", [0, 1])
def test_import_onnx__a_scan_costs_its_body_times_its_inputs_length(tmp_path, axis):
    """s (2,4) carried over 7 slices xt (2,3) of xs along ``axis``: MatMul(xt, W (3,4)) -> m; s + m -> s2;
    Identity(s2) -> o, stacked into os."""
    value = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("MatMul", ["xt", "W"], ["m"]), helper.make_node("Add", ["s", "m"], ["s2"]),
         helper.make_node("Identity", ["s2"], ["o"])], "scan_body",
        [value("s", TensorProto.FLOAT, None), value("xt", TensorProto.FLOAT, None)],
        [value("s2", TensorProto.FLOAT, None), value("o", TensorProto.FLOAT, None)])
    scan = helper.make_node("Scan", ["s0", "xs"], ["s_last", "os"], name="scan", body=body, num_scan_inputs=1,
                            scan_input_axes=[axis])
    xs_shape = [7, 2, 3] if axis == 0 else [2, 7, 3]
    path = _save(tmp_path, [scan], [value("s0", TensorProto.FLOAT, [2, 4]), value("xs", TensorProto.FLOAT, xs_shape)],
                 [value("s_last", TensorProto.FLOAT, [2, 4]), value("os", TensorProto.FLOAT, [7, 2, 4])],
                 [numpy_helper.from_array(np.ones((3, 4), np.float32), "W")])
    graph = import_onnx(path)
    assert graph.flops.tolist() == [7 * (2 * 8 * 3 + 8)]
    body_bytes = (6 + 12 + 8) * F32 + 3 * 8 * F32 + 2 * 8 * F32  # MatMul xt, W, m; Add s, m, s2; Identity s2, o
    # s0, xs, W, s_last and os are what the 7 runs read (xs slice by slice) and write (os slice by slice): no more
    assert graph.bytes_accessed.tolist() == [7 * body_bytes]
    assert graph.meta["ops_without_flops"] == {}


def test_import_onnx__an_if_costs_the_larger_of_its_branches_flops_and_bytes(tmp_path):
    """then: MatMul(h (2,4), W (4,4)), 64 FLOPs and 32 + 64 + 32 bytes; else: three Identity copies of h, 0 FLOPs
    and 3 x 64 bytes. The If counts 64 FLOPs and 192 bytes: each the larger, an upper bound of either branch."""
    value = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("MatMul", ["h", "W"], ["t"])], "then", [],
                             [value("t", TensorProto.FLOAT, [2, 4])])
    copies = [helper.make_node("Identity", [a], [b]) for a, b in (("h", "e1"), ("e1", "e2"), ("e2", "e"))]
    other = helper.make_graph(copies, "else", [], [value("e", TensorProto.FLOAT, [2, 4])])
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=then, else_branch=other)]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 4]), value("flag", TensorProto.BOOL, [])],
                 [value("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(np.ones((4, 4), np.float32), "W")])
    graph = import_onnx(path)
    assert _by_name(graph, graph.flops) == {"relu": 8, "choose": 2 * 8 * 4}
    # the else branch reads h and writes y (e) itself: the If's own h, W and y are not counted again
    assert _by_name(graph, graph.bytes_accessed)["choose"] == 3 * 2 * 8 * F32


def _stacking_loop_body():
    """_loop_body with a scan output: Relu(h2) -> r (2,4) each iteration, stacked by the Loop into ys."""
    body = _loop_body()
    body.node.append(helper.make_node("Relu", ["h2"], ["r"], name="relu"))
    body.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 4]))
    return body


def test_import_onnx__a_loops_scan_outputs_are_its_trip_count_long(tmp_path):
    """loop (M = 5) -> y (2,4), ys (5,2,4); neg = Neg(ys). onnx's inference gives ys (and z) a symbolic leading
    dim, which counted as 1: ys and the Neg were one iteration's."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], name="loop", body=_stacking_loop_body()),
             helper.make_node("Neg", ["ys"], ["z"], name="neg")]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 4])],
                 [value("y", TensorProto.FLOAT, [2, 4]), value("z", TensorProto.FLOAT, ["T", 2, 4])],
                 [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
                  numpy_helper.from_array(np.array(5, np.int64), "M")])
    graph = import_onnx(path)
    assert _by_name(graph, graph.out_bytes) == {"loop": (8 + 5 * 8) * F32, "neg": 5 * 8 * F32}
    assert _by_name(graph, graph.flops) == {"loop": 5 * (BODY_FLOPS + 8), "neg": 5 * 8}
    assert graph.edge_bytes.tolist() == [5 * 8 * F32]
    assert "tensors_without_size" not in graph.meta


def test_import_onnx__an_inner_loops_scan_outputs_are_its_trip_count_long_too(tmp_path):
    """An outer Loop (M = 5) whose body runs an inner one (N = 3) stacking r, negates the stack (3,2,4) and
    stacks that in turn: ys (5,3,2,4), read by an Abs."""
    value = helper.make_tensor_value_info
    inner = helper.make_node("Loop", ["N", "", "h_outer"], ["h_next", "rs"], name="inner", body=_stacking_loop_body())
    outer_body = helper.make_graph(
        [helper.make_node("Constant", [], ["N"], value=numpy_helper.from_array(np.array(3, np.int64))), inner,
         helper.make_node("Neg", ["rs"], ["negated"], name="neg"),
         helper.make_node("Identity", ["cond_outer"], ["cond_next"])], "outer_body",
        [value("j", TensorProto.INT64, []), value("cond_outer", TensorProto.BOOL, []),
         value("h_outer", TensorProto.FLOAT, [2, 4])],
        [value("cond_next", TensorProto.BOOL, []), value("h_next", TensorProto.FLOAT, [2, 4]),
         value("negated", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], name="outer", body=outer_body),
             helper.make_node("Abs", ["ys"], ["z"], name="abs")]
    path = _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 4])],
                 [value("y", TensorProto.FLOAT, [2, 4]), value("z", TensorProto.FLOAT, ["A", "B", 2, 4])],
                 [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
                  numpy_helper.from_array(np.array(5, np.int64), "M")])
    graph = import_onnx(path)
    assert _by_name(graph, graph.flops) == {"outer": 5 * (3 * (BODY_FLOPS + 8) + 3 * 8), "abs": 5 * 3 * 8}
    assert _by_name(graph, graph.out_bytes) == {"outer": (8 + 5 * 3 * 8) * F32, "abs": 5 * 3 * 8 * F32}
    assert "tensors_without_size" not in graph.meta


def test_import_onnx__a_loops_carried_output_has_the_shape_it_has_before_and_after_each_run(tmp_path):
    """loop (M = 5, or a trip count computed at run time) carries x (2,4) into h; post = h @ W. onnx's inference
    leaves h without a shape: post had no FLOPs and h no bytes, where the IR import sizes them."""
    value = helper.make_tensor_value_info
    for trips, extra_inputs in (("M", []), ("steps", [value("steps", TensorProto.INT64, [])])):
        folder = tmp_path / trips
        folder.mkdir()
        nodes = [helper.make_node("Loop", [trips, "", "x"], ["h"], name="loop", body=_loop_body()),
                 helper.make_node("MatMul", ["h", "W"], ["y"], name="post")]
        path = _save(folder, nodes, [value("x", TensorProto.FLOAT, [2, 4]), *extra_inputs],
                     [value("y", TensorProto.FLOAT, [2, 4])],
                     [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
                      numpy_helper.from_array(np.array(5, np.int64), "M")])
        graph = import_onnx(path)
        assert _by_name(graph, graph.flops)["post"] == 2 * 2 * 4 * 4, trips
        assert _by_name(graph, graph.out_bytes)["loop"] == 8 * F32, trips
        assert graph.edge_bytes.tolist() == [8 * F32], trips
        assert "unsized_tensors_by_op" not in graph.meta, trips


def test_import_onnx__the_scan_outputs_of_a_loop_without_a_static_trip_count_stay_unsized(tmp_path):
    value = helper.make_tensor_value_info
    loop = helper.make_node("Loop", ["steps", "", "x"], ["y", "ys"], name="loop", body=_stacking_loop_body())
    path = _save(tmp_path, [loop], [value("x", TensorProto.FLOAT, [2, 4]), value("steps", TensorProto.INT64, [])],
                 [value("y", TensorProto.FLOAT, [2, 4]), value("ys", TensorProto.FLOAT, ["T", 2, 4])],
                 [numpy_helper.from_array(np.ones((4, 4), np.float32), "W")])
    graph = import_onnx(path)
    assert graph.out_bytes.tolist() == [(8 + 8) * F32]  # ys's unknown leading dim counts as 1, and is said
    assert graph.meta["unsized_tensors_by_op"] == {"Loop": 1}


def _nonzero_scan(tmp_path, transposed: bool = False, with_xs: bool = True) -> str:
    """s (4) carried over the slices of f = Cast(NonZero(mask (2,3))), (2, ?): its second dim is data-dependent
    (``transposed``: of ft, its transpose, (?, 2), whose scan axis is unsized), and of xs (2,3) when ``with_xs``.
    Body: MatMul(xt, W (3,4)) -> m (4 + 12 x 2 FLOPs); ReduceSum(slice of f) -> t (keepdims); a = m + t; s2 = s + a."""
    value = helper.make_tensor_value_info
    body_nodes = [helper.make_node("ReduceSum", ["fs"], ["t"], keepdims=1)]
    body_nodes += [helper.make_node("MatMul", ["xt", "W"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"]),
                   helper.make_node("Add", ["s", "a"], ["s2"])] if with_xs else [
        helper.make_node("Add", ["s", "t"], ["s2"])]
    body = helper.make_graph(body_nodes + [helper.make_node("Identity", ["s2"], ["o"])], "scan_body",
                             [value("s", TensorProto.FLOAT, [4]), value("fs", TensorProto.FLOAT, None)]
                             + ([value("xt", TensorProto.FLOAT, None)] if with_xs else []),
                             [value("s2", TensorProto.FLOAT, [4]), value("o", TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"], name="nonzero"),
             helper.make_node("Cast", ["nz"], ["f"], name="cast", to=TensorProto.FLOAT)]
    nodes += [helper.make_node("Transpose", ["f"], ["ft"], name="transpose", perm=[1, 0])] if transposed else []
    nodes += [helper.make_node("Scan", ["s0", "ft" if transposed else "f"] + (["xs"] if with_xs else []),
                               ["s_last", "os"], name="scan", body=body, num_scan_inputs=2 if with_xs else 1)]
    return _save(tmp_path, nodes, [value("mask", TensorProto.FLOAT, [2, 3]), value("s0", TensorProto.FLOAT, [4])]
                 + ([value("xs", TensorProto.FLOAT, [2, 3])] if with_xs else []),
                 [value("s_last", TensorProto.FLOAT, [4]), value("os", TensorProto.FLOAT, ["T", 4])],
                 [numpy_helper.from_array(np.ones((3, 4), np.float32), "W")])


# one iteration of _nonzero_scan's body with xs: MatMul 2 x 4 x 3, ReduceSum 1 per element of its slice, two Adds 4
def _nonzero_scan_flops(slice_elements: int) -> int:
    return 2 * (2 * 4 * 3 + slice_elements + 4 + 4)


def test_import_onnx__a_scan_whose_input_has_an_unsized_dim_is_costed_when_its_scan_axis_is_sized(tmp_path):
    """f (2, ?): 2 iterations, whatever its other dim (a slice of ? elements, counted as 1, and said). Only
    a scan input sized in every dim used to be read: the Scan had no FLOPs."""
    graph = import_onnx(_nonzero_scan(tmp_path))
    assert _by_name(graph, graph.flops)["scan"] == _nonzero_scan_flops(1)
    assert "bodies_not_costed" not in graph.meta and graph.meta["ops_without_flops"] == {}
    assert graph.meta["unsized_tensors_by_op"] == {"Cast": 1, "NonZero": 1}


def test_import_onnx__a_scans_length_is_read_from_any_of_its_scan_inputs(tmp_path):
    """ft (?, 2) first, its scan axis unsized; xs (2,3), as long (every scan input is), says 2. A slice of ft
    has 2 elements."""
    graph = import_onnx(_nonzero_scan(tmp_path, transposed=True))
    assert _by_name(graph, graph.flops)["scan"] == _nonzero_scan_flops(2)
    assert "bodies_not_costed" not in graph.meta


def test_cli_graphs_import_onnx__a_scan_of_unknown_length_is_not_costed_and_warned(tmp_path, capsys):
    from cluster.cli import main

    path = _nonzero_scan(tmp_path, transposed=True, with_xs=False)
    graph = import_onnx(path)
    assert _by_name(graph, graph.flops)["scan"] == 0.0 and graph.meta["ops_without_flops"] == {"Scan": 1}
    assert graph.meta["bodies_not_costed"] == {"scan": "Scan: the length of its scan inputs is not known statically"}
    assert main(["graphs", "import", "--onnx", path, "-o", str(tmp_path / "scan.parquet")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "no FLOP formula" in line]
    assert warnings == ["placer: warning: 1 op type has no FLOP formula, imported with bytes only: Scan (1); "
                        "subgraph ops whose bodies are not costed, their trip count unknown: scan (Scan: the length "
                        "of its scan inputs is not known statically)"]


def _sequence_map(tmp_path, make_sequence: list, inputs: list) -> str:
    """``make_sequence``'s nodes make seq; map = SequenceMap(seq) over MatMul(t, W (4,4)) and Relu, each tensor
    of seq (1,2,4): 2 x 8 x 4 + 8 FLOPs; y = ConcatFromSequence(mapped)."""
    value = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("MatMul", ["t", "W"], ["m"]), helper.make_node("Relu", ["m"], ["r"])],
                             "map_body", [value("t", TensorProto.FLOAT, None)], [value("r", TensorProto.FLOAT, None)])
    nodes = [*make_sequence, helper.make_node("SequenceMap", ["seq"], ["mapped"], name="map", body=body),
             helper.make_node("ConcatFromSequence", ["mapped"], ["y"], name="concat", axis=0)]
    return _save(tmp_path, nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 4])],
                 [numpy_helper.from_array(np.ones((4, 4), np.float32), "W")])


MAP_BODY_FLOPS = 2 * 8 * 4 + 8
MAP_BODY_BYTES = (8 + 16 + 8) * F32 + (8 + 8) * F32  # MatMul t, W, m; Relu m, r


def test_import_onnx__a_sequence_map_costs_its_body_times_its_sequences_length(tmp_path):
    """SplitToSequence of x (3,2,4) along axis 0 (no split: one tensor per row) makes 3 tensors (1,2,4). The
    SequenceMap had no formula: no FLOPs, its body unseen."""
    split = helper.make_node("SplitToSequence", ["x"], ["seq"], name="split", axis=0)
    graph = import_onnx(_sequence_map(tmp_path, [split], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                         [3, 2, 4])]))
    assert _by_name(graph, graph.flops)["map"] == 3 * MAP_BODY_FLOPS
    assert _by_name(graph, graph.bytes_accessed)["map"] == 3 * MAP_BODY_BYTES
    assert _by_name(graph, graph.param_bytes)["map"] == 16 * F32  # W, read by its body
    assert "SequenceMap" not in graph.meta["ops_without_flops"] and "bodies_not_costed" not in graph.meta


def test_import_onnx__a_sequence_map_over_a_sequence_of_unknown_length_is_not_costed_and_says_why(tmp_path):
    """seq is a graph input: how many tensors it holds is known at run time only."""
    elem = helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 2, 4])
    seq = helper.make_value_info("seq", helper.make_sequence_type_proto(elem))
    graph = import_onnx(_sequence_map(tmp_path, [], [seq]))
    assert _by_name(graph, graph.flops)["map"] == 0.0
    assert graph.meta["ops_without_flops"]["SequenceMap"] == 1
    assert graph.meta["bodies_not_costed"] == {
        "map": "SequenceMap: the length of its input sequence is not known statically"}


def _sequence_ops_model(tmp_path) -> str:
    """x (3,2,4) split into a sequence of three (1,2,4), one taken out, a Relu of it put back, the four
    concatenated along axis 0 into y, negated; a pair made of x and x, stacked along a new axis 0 into z."""
    value = helper.make_tensor_value_info
    node = helper.make_node
    nodes = [node("SplitToSequence", ["x"], ["rows"], name="split", axis=0),
             node("SequenceAt", ["rows", "one"], ["row"], name="at"),
             node("Relu", ["row"], ["r"], name="relu"),
             node("SequenceInsert", ["rows", "r"], ["more"], name="insert"),
             node("ConcatFromSequence", ["more"], ["y"], name="concat", axis=0),
             node("Neg", ["y"], ["minus_y"], name="neg"),
             node("SequenceConstruct", ["x", "x"], ["pair"], name="construct"),
             node("ConcatFromSequence", ["pair"], ["z"], name="stack", axis=0, new_axis=1)]
    return _save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [3, 2, 4])],
                 [value("minus_y", TensorProto.FLOAT, ["Y", 2, 4]), value("z", TensorProto.FLOAT, ["Z", 3, 2, 4])],
                 [numpy_helper.from_array(np.array(1, np.int64), "one")])


def test_import_onnx__sequence_ops_cost_no_flops_and_move_their_tensors_as_a_copy(tmp_path):
    """They had no formula (listed in ops_without_flops), and a sequence is 0 bytes: they cost their tensor side
    once. Now each writes what it reads, as a Concat or a Split moving those tensors."""
    graph = import_onnx(_sequence_ops_model(tmp_path))
    x_bytes, row_bytes = 24 * F32, 8 * F32
    assert graph.meta["ops_without_flops"] == {}
    assert _by_name(graph, graph.flops) == {"split": 0, "at": 0, "relu": 8, "insert": 0, "concat": 0, "neg": 32,
                                            "construct": 0, "stack": 0}
    accessed, written = _by_name(graph, graph.bytes_accessed), _by_name(graph, graph.out_bytes)
    assert accessed["split"] == 2 * x_bytes and written["split"] == x_bytes  # the sequence holds the rows
    assert accessed["at"] == 2 * row_bytes  # the position, 8 bytes, is read with the row it picks
    assert accessed["insert"] == 2 * row_bytes
    assert accessed["construct"] == 2 * x_bytes  # x read once, as by any node reading a tensor twice
    assert accessed["concat"] == 2 * written["concat"] and accessed["stack"] == 2 * written["stack"]


def test_import_onnx__concat_from_sequence_of_known_length_is_sized_and_so_are_its_readers(tmp_path):
    """y = ConcatFromSequence of four (1,2,4) along axis 0: (4,2,4); z stacks two (3,2,4) along a new axis 0:
    (2,3,2,4). onnx's inference left their concatenated dim symbolic, counted as 1: one tensor's worth."""
    graph = import_onnx(_sequence_ops_model(tmp_path))
    written = _by_name(graph, graph.out_bytes)
    assert (written["concat"], written["neg"], written["stack"]) == (32 * F32, 32 * F32, 48 * F32)
    assert _by_name(graph, graph.flops)["neg"] == 32
    # only the sequences are unsized (0 bytes), y and z no longer
    assert graph.meta["unsized_tensors_by_op"] == {"SequenceConstruct": 1, "SequenceInsert": 1, "SplitToSequence": 1}


def _appending_loop_model(tmp_path, axis: int, new_axis: int, declared: list) -> str:
    """A list appended in a loop: five runs insert Relu(x) (x: (N, 8)) into a sequence that starts empty;
    after the Loop, y = ConcatFromSequence (``axis``, ``new_axis``) declared ``declared`` and at = its tensor 2.
    The body declares its sequence without sizes, as torch.onnx does."""
    value, sequence = helper.make_tensor_value_info, helper.make_tensor_sequence_value_info
    body = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                              helper.make_node("SequenceInsert", ["s_in", "r"], ["s_out"]),
                              helper.make_node("Identity", ["c_in"], ["c_out"])], "append",
                             [value("i", TensorProto.INT64, []), value("c_in", TensorProto.BOOL, []),
                              sequence("s_in", TensorProto.FLOAT, ["m", "n"])],
                             [value("c_out", TensorProto.BOOL, []), sequence("s_out", TensorProto.FLOAT, ["m", "n"])])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
             helper.make_node("Loop", ["M", "", "empty"], ["list"], name="loop", body=body),
             helper.make_node("ConcatFromSequence", ["list"], ["y"], name="concat", axis=axis, new_axis=new_axis),
             helper.make_node("SequenceAt", ["list", "two"], ["at"], name="at")]
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                 [value("y", TensorProto.FLOAT, declared), value("at", TensorProto.FLOAT, [2, 8])],
                 [numpy_helper.from_array(np.array(5, np.int64), "M"), numpy_helper.from_array(np.int64(2), "two")])


@pytest.mark.parametrize("axis, new_axis, stacked, declared", [
    (0, 0, (15, 8), [10, 8]), (1, 0, (3, 40), [2, "w"]), (1, 1, (3, 5, 8), [2, 5, 8]), (-1, 1, (3, 8, 5), [2, 8, 5]),
    (0, 1, (5, 3, 8), ["a", "b", "c"])])
def test_import_onnx__a_sequence_a_loop_appends_to_is_sized_by_its_trip_count_and_the_inserted_tensor(
        tmp_path, axis, new_axis, stacked, declared):
    """At x (3, 8), the Loop leaves five (3, 8) tensors: y and at are sized from them (both were costed at the
    sizes declared at the export's batch 2, or unsized: the Loop's sequence had no length nor tensor shape)."""
    graph = import_onnx(_appending_loop_model(tmp_path, axis, new_axis, declared), input_shapes={"x": (3, 8)})
    written, accessed = _by_name(graph, graph.out_bytes), _by_name(graph, graph.bytes_accessed)
    assert written["concat"] == int(np.prod(stacked)) * F32 and accessed["concat"] == 2 * written["concat"]
    assert written["at"] == 3 * 8 * F32
    assert _by_name(graph, graph.flops)["loop"] == 5 * 3 * 8  # five Relu of (3, 8)
    assert graph.meta["unsized_tensors_by_op"] == {"Loop": 1, "SequenceEmpty": 1, "SequenceInsert": 1}  # sequences


def test_import_onnx__constant_nodes_of_every_attribute_are_weights_of_their_readers_not_ops(tmp_path):
    """value_floats, value_float and value_ints Constants, as an initializer each: no op, its bytes read by each
    reader and owned by the first, its floats in num_params; an unnamed op keeps its index among all nodes."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Constant", [], ["bias"], value_floats=[1.0, 2.0, 3.0]),
             helper.make_node("Constant", [], ["scale"], value_float=0.5),
             helper.make_node("Constant", [], ["target"], value_ints=[3, 2]),
             helper.make_node("Add", ["x", "bias"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "scale"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["b"], name="again"),
             helper.make_node("Reshape", ["b", "target"], ["y"], name="reshape")]
    graph = import_onnx(_save(tmp_path, nodes, [value("x", TensorProto.FLOAT, [2, 3])],
                              [value("y", TensorProto.FLOAT, [3, 2])]))
    assert graph.op_names.tolist() == ["add", "Mul_4", "again", "reshape"]
    assert graph.param_bytes.tolist() == [3 * F32, F32, 0, 2 * 8]  # bias owned by its first reader
    assert graph.bytes_accessed.tolist() == [(6 + 3 + 6) * F32, (6 + 1 + 6) * F32, (6 + 3 + 6) * F32,
                                             (6 + 6) * F32 + 2 * 8]
    assert list(zip(graph.edge_src.tolist(), graph.edge_dst.tolist())) == [(0, 1), (1, 2), (2, 3)]
    assert graph.num_params == 3 + 1


def test_import_onnx__a_model_of_constants_alone_is_refused(tmp_path):
    value = helper.make_tensor_value_info
    path = _save(tmp_path, [helper.make_node("Constant", [], ["y"], value_float=1.0)], [],
                 [value("y", TensorProto.FLOAT, [])])
    with pytest.raises(PlacerError, match=r"small.onnx has no nodes but Constants$"):
        import_onnx(path)
