"""Which graph op made each tensor of an ONNX model, so OpenVINO's nodes can be matched to ONNX-imported ops.

OpenVINO renames some ONNX nodes as it reads them (the node making a graph output takes the output's name;
one ONNX node may become several OpenVINO nodes), so friendly names alone do not find every op. Tensor names
survive: an OpenVINO node's output carries the ONNX tensor name it computes. The ONNX importer
(graphs.inference.onnx_import) makes op i of the graph from the ONNX graph's node i once its Constant nodes
are left out (they are weights, not ops: graphs.inference.onnx_constants); that order is checked here op for
op (same count, same op type) before it is relied on. A Constant's tensor belongs to no op: OpenVINO's
Constant node of it follows its reader (measurers.openvino.affinity), as an initializer's does.

OpenVINO's reader drops ONNX ops that compute nothing at inference (``ELIDED_ONNX_OPS``): a ``Dropout``
leaves no node, its producer's node taking its name and output tensor name; an ``Identity`` may stay an
OpenVINO Identity or go the same way. Such an op follows its producer: its tensors are its producer's op's.
"""

from __future__ import annotations

from pathlib import Path

from graphs.errors import PlacerError
from graphs.inference.onnx_constants import op_nodes
from graphs.opgraph import OpGraph

ELIDED_ONNX_OPS = frozenset({"Identity", "Dropout"})  # ONNX op types OpenVINO's reader may leave no node of


def onnx_tensor_ops(graph: OpGraph, model_file: str) -> dict[str, int]:
    """ONNX tensor name -> index of the graph op producing it (for an op of ELIDED_ONNX_OPS, its producer's; a
    Constant's tensor none, a weight as an initializer's); empty unless ``model_file`` is ONNX and the graph
    was imported from it (framework "onnx")."""
    if graph.framework != "onnx" or Path(model_file).suffix.lower() != ".onnx":
        return {}
    import onnx

    try:
        nodes = op_nodes(onnx.load(model_file, load_external_data=False).graph)
    except Exception as exc:  # noqa: BLE001  a damaged protobuf raises DecodeError and others
        raise PlacerError(f"model file {model_file!r} is not a readable ONNX model: {exc}") from None
    kinds = graph.op_kinds.tolist()
    if len(nodes) != len(kinds) or any(node.op_type != kind for node, kind in zip(nodes, kinds)):
        raise PlacerError(f"graph {graph.name!r} was not imported from {model_file!r} as it is now: the graph has "
                          f"{len(kinds)} ops, the file {len(nodes)} nodes besides its Constants (or their types "
                          "differ)")
    return _tensor_owners(nodes)


def _tensor_owners(nodes: list) -> dict[str, int]:
    """Tensor -> index of the node making it, an elided node's tensors its producer's (nodes in order, so a
    chain of them resolves to the first op that computes); an elided node reading a graph input keeps its own."""
    owners: dict[str, int] = {}
    for i, node in enumerate(nodes):
        source = node.input[0] if node.op_type in ELIDED_ONNX_OPS and node.input else ""
        owners.update({tensor: owners.get(source, i) for tensor in node.output if tensor})
    return owners
