"""Per-node OpenVINO devices for a placement, written as the HETERO plugin's manual affinities.

OpenVINO 2026.4 still honours manual affinity: ``node.get_rt_info()["affinity"] = "GPU.0"`` on every node,
then ``compile_model(model, "HETERO:GPU.0,CPU")`` splits the model into one submodel per connected
same-affinity region and compiles each on its device (``HETERO_NUMBER_OF_SUBMODELS`` counts them; a node
whose affinity names a device makes HETERO load that device's plugin even when the priorities list omits it).

A node whose friendly name is a graph op runs on that op's device. Every other node (Parameter, Constant,
Result, a weight decompression Convert the graph does not name) takes a neighbour op's device: the device of
its first consumer that has one (a Constant lives where it is read), else of its first producer (a Result
stays where its value was made), else the first device of the placement.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph


def check_graph_matches(graph: OpGraph, model, model_file: str) -> None:
    """PlacerError unless every graph op names a node of the model (matched by friendly name)."""
    names = {node.get_friendly_name() for node in model.get_ordered_ops()}
    missing = [name for name in graph.op_names.tolist() if name not in names]
    if missing:
        raise PlacerError(f"graph {graph.name!r} does not match model file {model_file!r}: {len(missing)} ops "
                          f"are not nodes of the model, e.g. {missing[0]!r}")


def node_devices(model, graph: OpGraph, placement: np.ndarray, device_names: Sequence[str]) -> dict[str, str]:
    """Unique node name (``node.get_name()``) -> OpenVINO device, for every node of ``model``.
    ``placement`` is the (N,) device index of each graph op; ``device_names`` the OpenVINO name of each."""
    op_device = {name: device_names[int(d)] for name, d in zip(graph.op_names.tolist(), placement.tolist())}
    nodes = list(model.get_ordered_ops())  # topological
    fallback = device_names[int(placement[0])] if len(placement) else device_names[0]
    chosen = {n.get_name(): op_device[n.get_friendly_name()] for n in nodes if n.get_friendly_name() in op_device}
    for node in reversed(nodes):  # consumers first: a chain Constant -> Convert -> op resolves in one pass
        if node.get_name() not in chosen:
            found = [chosen[c] for c in _consumers(node) if c in chosen]
            if found:
                chosen[node.get_name()] = found[0]
    for node in nodes:  # what feeds no op (a Result) stays with its producer
        if node.get_name() not in chosen:
            found = [chosen[p] for p in _producers(node) if p in chosen]
            chosen[node.get_name()] = found[0] if found else fallback
    return chosen


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


def _consumers(node) -> list[str]:
    return [target.get_node().get_name() for output in node.outputs() for target in output.get_target_inputs()]


def _producers(node) -> list[str]:
    return [value.get_node().get_name() for value in node.input_values()]
