"""Scopes of an ONNX model from torch's current exporter, read from its nodes' metadata, as those of a legacy export.

The models are written with onnx.helper; their metadata is spelled as torch 2.13's ``torch.onnx.export``
(``dynamo=True``, the default) writes it (torch/onnx/_internal/exporter/_core.py, ``_set_node_metadata``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphs.grouping import group_ops
from graphs.inference.onnx_import import import_onnx

# (legacy node name, dynamo node name, op, inputs, output, module classes walked into, FX node)
LAYERS = [
    ("/att/MatMul", "node_MatMul_1", "MatMul", ["x", "w1"], "a", [("att", "MultiheadAttention")], "linear"),
    ("/att/Add", "node_linear", "Add", ["a", "b1"], "a2", [("att", "MultiheadAttention")], "linear"),
    ("/Add", "node_add", "Add", ["a2", "x"], "r", [], "add"),
    ("/ln/LayerNormalization", "node_layer_norm", "LayerNormalization", ["r", "g", "b1"], "n",
     [("ln", "LayerNorm")], "layer_norm"),
    ("/encoder/layers.0/self_attn/MatMul", "node_MatMul_39", "MatMul", ["n", "w2"], "e",
     [("encoder", "TransformerEncoder"), ("encoder.layers.0", "TransformerEncoderLayer"),
      ("encoder.layers.0.self_attn", "MultiheadAttention")], "linear_2"),
    ("/encoder/layers.0/Relu", "node_relu", "Relu", ["e"], "y",
     [("encoder", "TransformerEncoder"), ("encoder.layers.0", "TransformerEncoderLayer")], "relu"),
]
SCOPES = ["att", "att", "", "ln", "encoder.layers.0.self_attn", "encoder.layers.0"]


def _metadata(modules: list[tuple[str, str]], fx_node: str, keys: tuple[str, ...]) -> dict[str, str]:
    """What torch's exporter records of a node called in ``modules`` (outermost first, below the root ``M``)."""
    walk = [("", "__main__.M")] + [(name, f"torch.nn.modules.{cls}") for name, cls in modules]
    recorded = {
        "namespace": "/".join(f"{name}: {cls}" for name, cls in walk) + f"/{fx_node}: aten.{fx_node}.default",
        "pkg.torch.onnx.class_hierarchy": repr([cls for _, cls in walk] + [f"aten.{fx_node}.default"]),
        "pkg.torch.onnx.name_scopes": repr([name for name, _ in walk] + [fx_node]),
        "pkg.torch.onnx.fx_node": f"%{fx_node} : [num_users=1] = call_function[target=torch.ops.aten.{fx_node}]",
    }
    return {key: recorded[key] for key in keys}


def _model(tmp_path, dynamo: bool, keys=("namespace", "pkg.torch.onnx.class_hierarchy",
                                         "pkg.torch.onnx.name_scopes", "pkg.torch.onnx.fx_node")) -> str:
    """The same six ops named as the legacy exporter names them, or as the dynamo one does with ``keys`` of
    its metadata."""
    nodes = []
    for legacy, new, op, inputs, output, modules, fx_node in LAYERS:
        node = helper.make_node(op, inputs, [output], name=new if dynamo else legacy)
        if dynamo:
            helper.set_metadata_props(node, _metadata(modules, fx_node, keys))
        nodes.append(node)
    weights = [numpy_helper.from_array(np.ones(shape, np.float32), name)
               for name, shape in (("w1", (8, 8)), ("b1", (8,)), ("g", (8,)), ("w2", (8, 8)))]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], weights)
    path = tmp_path / f"{'dynamo' if dynamo else 'legacy'}-{len(keys)}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_import_onnx__a_dynamo_export_takes_its_scopes_from_the_metadata_as_the_legacy_export_from_names(tmp_path):
    legacy, dynamo = import_onnx(_model(tmp_path, dynamo=False)), import_onnx(_model(tmp_path, dynamo=True))
    assert legacy.scopes.tolist() == SCOPES
    assert dynamo.scopes.tolist() == SCOPES
    assert dynamo.op_names.tolist() == [new for _, new, *_ in LAYERS]  # names stay the file's


def test_import_onnx__a_dynamo_export_groups_as_the_legacy_export_of_the_same_model(tmp_path):
    legacy, dynamo = import_onnx(_model(tmp_path, dynamo=False)), import_onnx(_model(tmp_path, dynamo=True))
    by_scope = [group_ops(graph, max_groups=3).op_group.tolist() for graph in (legacy, dynamo)]
    assert by_scope[0] == by_scope[1] and len(set(by_scope[0])) == 3


def test_import_onnx__the_namespace_alone_gives_the_scope_too(tmp_path):
    graph = import_onnx(_model(tmp_path, dynamo=True, keys=("namespace",)))
    assert graph.scopes.tolist() == SCOPES


def test_import_onnx__metadata_not_torchs_leaves_the_scope_to_the_name(tmp_path):
    path = _model(tmp_path, dynamo=False)
    model = onnx.load(path)
    helper.set_metadata_props(model.graph.node[0], {"pkg.torch.onnx.name_scopes": "not a list",
                                                    "namespace": "some other tool's"})
    helper.set_metadata_props(model.graph.node[4], {"pkg.torch.onnx.name_scopes": "[]"})
    onnx.save(model, path)
    assert import_onnx(path).scopes.tolist() == SCOPES


def test_import_onnx__an_op_torch_records_outside_any_module_has_the_top_scope(tmp_path):
    """torch records a node without a module stack as ``[node name]`` (no root module): no scope."""
    path = _model(tmp_path, dynamo=False)
    model = onnx.load(path)
    helper.set_metadata_props(model.graph.node[1], {"pkg.torch.onnx.name_scopes": "['linear']",
                                                    "namespace": "linear: aten.linear.default"})
    onnx.save(model, path)
    assert import_onnx(path).scopes.tolist() == ["att", "", *SCOPES[2:]]
