"""Per-node OpenVINO devices for a placement, written as the HETERO plugin's manual affinities.

OpenVINO 2026.4 still honours manual affinity: ``node.get_rt_info()["affinity"] = "GPU.0"`` on every node,
then ``compile_model(model, "HETERO:GPU.0,CPU")`` splits the model into one submodel per connected
same-affinity region and compiles each on its device (``HETERO_NUMBER_OF_SUBMODELS`` counts them; a node
whose affinity names a device makes HETERO load that device's plugin even when the priorities list omits it).

A node is an op's when its friendly name is the op's name, or (ONNX) one of its output tensors is the op's
(measurers.openvino.onnx_ops). Every other node (Parameter, Constant, Result, a weight decompression Convert,
a piece of an ONNX node OpenVINO split in several) takes a neighbour's device: that of its first consumer
that has one, a ShapeOf last (a Constant lives where its data is read), else of its first producer (a Result stays where its value
was made), else the first device of the placement. The same rule (``node_ops``) says which op a node's
time in OpenVINO's performance counters belongs to.

An ONNX op that computes nothing at inference (``onnx_ops.elided``: ``Identity``, ``Dropout``, a ``Sum`` of
one input) has no node of its own: OpenVINO's reader may drop it, and its tensors are its producer's
(measurers.openvino.onnx_ops). It runs
no kernel, so it needs no device and takes 0 s; any other op without a node means the model file is not the
graph's, an error.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from graphs.errors import PlacerError
from graphs.inference.openvino_import import SHAPE_READERS
from graphs.opgraph import OpGraph


def match_ops(model, graph: OpGraph, model_file: str, tensor_ops: dict[str, int] | None = None,
              every_op: bool = True) -> dict[str, int]:
    """Unique node name (``node.get_name()``) -> graph op index, for the nodes that are ops; PlacerError
    unless every graph op has a node, an ONNX graph's ops that own no tensor in ``tensor_ops`` aside (they
    compute nothing: ``onnx_ops.elided``). ``tensor_ops``:
    tensor name -> op index (an ONNX graph, onnx_ops), checked before names; a node whose outputs carry the
    tensors of several ops is the first op's. ``every_op=False``: no op needs a node (a model resized to the
    graph's input sizes, checked with every op as read: its reshape folds the shape arithmetic over a dynamic
    axis, Shape, Gather, Concat, into constants, which run no kernel)."""
    tensor_ops = tensor_ops or {}
    op_index = {name: i for i, name in enumerate(graph.op_names.tolist())}
    matched = {}
    for node in model.get_ordered_ops():
        by_tensor = [tensor_ops[t] for out in node.outputs() for t in out.get_names() if t in tensor_ops]
        op = min(by_tensor) if by_tensor else op_index.get(node.get_friendly_name())
        if op is not None:
            matched[node.get_name()] = op
    missing = sorted(set(range(graph.num_ops)) - set(matched.values()))
    if tensor_ops:  # an ONNX graph: its ops that compute nothing own no tensor, their producers' ops do
        owning = set(tensor_ops.values())
        missing = [op for op in missing if op in owning]
    if missing and every_op:
        raise PlacerError(f"graph {graph.name!r} does not match model file {model_file!r}: {len(missing)} ops "
                          f"are not nodes of the model, e.g. {graph.op_names[missing[0]]!r}")
    return matched


def node_devices(model, matched: dict[str, int], placement: np.ndarray,
                 device_names: Sequence[str]) -> dict[str, str]:
    """Unique node name -> OpenVINO device, for every node of ``model``. ``matched`` is ``match_ops``'s
    answer, ``placement`` the (N,) device index of each graph op, ``device_names`` the OpenVINO name of each."""
    fallback = device_names[int(placement[0])] if len(placement) else device_names[0]
    owner = node_ops(model, matched)
    return {node.get_name(): device_names[int(placement[owner[node.get_name()]])] if node.get_name() in owner
            else fallback for node in model.get_ordered_ops()}


def node_ops(model, matched: dict[str, int]) -> dict[str, int]:
    """Unique node name -> the graph op it belongs to: its own for the ops' nodes (``matched``), a neighbour
    op's for the others (the rule above); a node with no op around it is left out."""
    nodes = list(model.get_ordered_ops())  # topological
    owner = dict(matched)
    for node in reversed(nodes):  # consumers first: a chain Constant -> Convert -> op resolves in one pass
        if node.get_name() not in owner:
            found = [owner[c] for c in _data_consumers(node) if c in owner]
            if found:
                owner[node.get_name()] = found[0]
    for node in nodes:  # what feeds no op (a Result) stays with its producer
        if node.get_name() not in owner:
            found = [owner[p] for p in _producers(node) if p in owner]
            if found:
                owner[node.get_name()] = found[0]
    return owner


def apply_affinity(model, devices: dict[str, str]) -> str:
    """Write each node's device as its ``affinity``; the HETERO device string that compiles them, its
    priorities in first-use order (e.g. ``"HETERO:GPU.0,CPU"``)."""
    used: list[str] = []
    for node in model.get_ordered_ops():
        device = devices[node.get_name()]
        node.get_rt_info()["affinity"] = device
        if device not in used:
            used.append(device)
    return "HETERO:" + ",".join(used)


def _data_consumers(node) -> list[str]:
    """The nodes that read ``node``'s outputs, those that read their data before a ShapeOf (which reads only a
    shape): a weight a ShapeOf read first (an IR resized to the graph's input sizes) stayed on the ShapeOf's
    device, while the importer gives its bytes to the op that computes with it (SHAPE_READERS)."""
    targets = [target.get_node() for output in node.outputs() for target in output.get_target_inputs()]
    return [t.get_name() for t in sorted(targets, key=lambda t: t.get_type_name() in SHAPE_READERS)]


def _producers(node) -> list[str]:
    return [value.get_node().get_name() for value in node.input_values()]
