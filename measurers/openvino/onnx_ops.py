"""Which graph op made each tensor of an ONNX model, so OpenVINO's nodes can be matched to ONNX-imported ops.

OpenVINO renames some ONNX nodes as it reads them (the node making a graph output takes the output's name;
one ONNX node may become several OpenVINO nodes), so friendly names alone do not find every op. Tensor names
survive: an OpenVINO node's output carries the ONNX tensor name it computes. The ONNX importer
(graphs.inference.onnx_import) makes op i of the graph from the ONNX graph's node i once its Constant nodes
(weights, not ops) and the nodes no graph output depends on (which OpenVINO's reader leaves out too) are left
out: graphs.inference.onnx_constants.op_nodes; that order is checked here op for op (same count, same op type)
before it is relied on. A Constant's tensor belongs to no op: OpenVINO's
Constant node of it follows its reader (measurers.openvino.affinity), as an initializer's does.

OpenVINO's reader drops ONNX ops that compute nothing at inference (``elided``): a ``Dropout``, and a
``Sum``, ``Max`` or ``Min`` of one input, leaves no node, its producer's node taking its name and output
tensor name; an ``Identity`` may stay an OpenVINO Identity or go the same way. Such an op follows its
producer: its tensors are its producer's op's.

``onnx_ops`` also says what the file holds now for the measurer's size check (measurers.openvino.sizes): each
op's own output tensors, and the weight bytes each op owns, counted as the importer counted ``param_bytes``
(an initializer's or a Constant node's tensor, owned by the first op that reads it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from graphs.errors import PlacerError
from graphs.inference.onnx_constants import constant_tensors, op_nodes
from graphs.inference.onnx_import import SUBGRAPH_OPS
from graphs.opgraph import OpGraph

ELIDED_ONNX_OPS = frozenset({"Identity", "Dropout"})  # ONNX op types OpenVINO's reader may leave no node of
ONE_INPUT_ELIDED_ONNX_OPS = frozenset({"Sum", "Max", "Min"})  # variadic ops it leaves none of with one input


def elided(node) -> bool:
    """Whether OpenVINO's reader may leave no node of the ONNX ``node``: it computes nothing at inference."""
    if node.op_type in ELIDED_ONNX_OPS:
        return True
    return node.op_type in ONE_INPUT_ELIDED_ONNX_OPS and sum(1 for t in node.input if t) == 1


class OnnxOps(NamedTuple):
    """What an ONNX file says of the ops of the graph imported from it."""

    tensor_ops: dict[str, int]  # tensor -> the op making it (an elided op's: its producer's)
    outputs: list[tuple[str, ...]]  # (N,) each op's own output tensors
    param_bytes: list[int] | None  # (N,) the weight bytes each op owns; None with subgraph ops (see _param_bytes)


def onnx_tensor_ops(graph: OpGraph, model_file: str) -> dict[str, int]:
    """ONNX tensor name -> index of the graph op producing it (for an ``elided`` op, its producer's; a
    Constant's tensor none, a weight as an initializer's); empty unless ``model_file`` is ONNX and the graph
    was imported from it (framework "onnx")."""
    found = onnx_ops(graph, model_file)
    return {} if found is None else found.tensor_ops


def onnx_ops(graph: OpGraph, model_file: str) -> OnnxOps | None:
    """The file's ops (``OnnxOps``), read once, after checking they are the graph's op for op (count and type);
    None unless ``model_file`` is ONNX and the graph was imported from it (framework "onnx")."""
    if graph.framework != "onnx" or Path(model_file).suffix.lower() != ".onnx":
        return None
    import onnx

    try:  # weights' dims and types are all the size check needs of them: their data stays on disk
        body = onnx.load(model_file, load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001  a damaged protobuf raises DecodeError and others
        raise PlacerError(f"model file {model_file!r} is not a readable ONNX model: {exc}") from None
    nodes = op_nodes(body)
    kinds = graph.op_kinds.tolist()
    if len(nodes) != len(kinds) or any(node.op_type != kind for node, kind in zip(nodes, kinds)):
        raise PlacerError(f"graph {graph.name!r} was not imported from {model_file!r} as it is now: the graph has "
                          f"{len(kinds)} ops, the file {len(nodes)} nodes besides its Constants (or their types "
                          "differ)")
    return OnnxOps(_tensor_owners(nodes), [tuple(t for t in node.output if t) for node in nodes],
                   _param_bytes(body, nodes))


def _param_bytes(body, nodes: list) -> list[int] | None:
    """Each op's owned weight bytes as graphs.inference.onnx_import counts them: a weight (an initializer, or a
    Constant node's tensor) is the first op's that lists it as an input. None when some op is a subgraph op:
    its bodies read outer weights without listing them and hold weights of their own, which this leaves to
    the importer rather than count differently."""
    if any(node.op_type in SUBGRAPH_OPS for node in nodes):
        return None
    weights = {**constant_tensors(body), **{init.name: init for init in body.initializer}}
    owned: set[str] = set()
    found = []
    for node in nodes:
        mine = [t for t in dict.fromkeys(node.input) if t in weights and t not in owned]
        owned.update(mine)
        found.append(sum(math.prod(weights[t].dims) * _itemsize(weights[t].data_type) for t in mine))
    return found


def _itemsize(data_type: int) -> int:
    """Bytes of one element of an ONNX data type, 0 where it has no fixed size (STRING, UNDEFINED), as the
    importer counts them."""
    import onnx

    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(data_type)
    except (KeyError, TypeError, ValueError):
        return 0
    return 0 if dtype.kind == "O" else dtype.itemsize


def _tensor_owners(nodes: list) -> dict[str, int]:
    """Tensor -> index of the node making it, an elided node's tensors its producer's (nodes in order, so a
    chain of them resolves to the first op that computes); an elided node reading a graph input keeps its own."""
    owners: dict[str, int] = {}
    for i, node in enumerate(nodes):
        source = next((t for t in node.input if t), "") if elided(node) else ""
        owners.update({tensor: owners.get(source, i) for tensor in node.output if tensor})
    return owners
