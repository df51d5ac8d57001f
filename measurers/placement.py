"""Placements: check them, read and write placement files (policies that make them are in policies/).

An op placement is an (N,) int64 array of device indices into ``machine.devices``. A placement file is
JSON in one of these forms (device names, or device indices, as values)::

    ["gpu:0", "gpu:1", ...]                       # one entry per op, or one per group
    {"ops": ["gpu:0", ...]}                       # one entry per op
    {"ops": {"op name": "gpu:0", ...}}            # every op named once
    {"groups": ["gpu:0", ...]}                    # one entry per group

An object may also carry "graph", "graph_hash" and "machine" (``save_placement_file`` writes them); a
"graph_hash" must be the graph's content hash, a "graph" without one the graph's name, a "machine" the
machine's name.

Groups are the ``grouping`` passed in ((N,) group id of each op, or an object with an ``op_group`` array),
else the graph's colocation groups. A bare list whose length matches neither is an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from graphs.errors import PlacerError
from graphs.files import atomic_file, loads_json_once
from graphs.opgraph import OpGraph, dense_ids
from graphs.synthetic import full_graph_name
from measurers.machine import Machine

def check_placement(graph: OpGraph, machine: Machine, placement) -> np.ndarray:
    """The placement as a read-only (N,) int64 array; PlacerError on wrong length, device or allowed kind."""
    try:
        array = np.asarray(placement)
    except (ValueError, TypeError) as exc:  # ragged nested lists: numpy's ValueError, not one PlacerError
        raise PlacerError(f"placement is not a flat sequence of device indices: {exc}") from None
    if array.ndim != 1 or len(array) != graph.num_ops:
        raise PlacerError(f"placement has shape {array.shape} but graph {graph.name!r} has {graph.num_ops} ops")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise PlacerError(f"placement must hold integer device indices, got {array.dtype}")
    num_devices = machine.num_devices
    if array.size and (array.min() < 0 or array.max() >= num_devices):  # before the cast: 2**64-1 is no -1
        bad = int(np.flatnonzero((array < 0) | (array >= num_devices))[0])
        raise PlacerError(f"placement puts op {graph.op_names[bad]!r} on device {int(array[bad])}, "
                          f"but machine {machine.name!r} has devices 0..{num_devices - 1}")
    array = array.astype(np.int64, copy=False)
    allowed = (graph.allowed_mask & machine.kind_bits[array]) != 0  # (N,) bool
    if not allowed.all():
        bad = int(np.flatnonzero(~allowed)[0])
        device = machine.devices[int(array[bad])]
        raise PlacerError(f"placement puts op {graph.op_names[bad]!r} ({graph.op_kinds[bad]}) on {device.name!r}, "
                          f"a {device.kind} device it may not run on")
    if array is placement:
        array = array.copy()
    array.setflags(write=False)
    return array


def framework_devices(mapping, machine: Machine, what: str) -> list:
    """What a user's ``torch_devices(machine)`` / ``tf_devices(machine)`` returned, checked to be one device per
    machine device (``what`` names the function): None or a single value was a TypeError from deep inside."""
    devices = mapping(machine)
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (list, tuple)):
        raise PlacerError(f"{what} must return a list of devices, one per device of machine {machine.name!r}; "
                          f"it returned {type(devices).__name__}")
    if len(devices) != machine.num_devices:
        raise PlacerError(f"{what} gave {len(devices)} devices for the {machine.num_devices} of machine "
                          f"{machine.name!r}")
    return list(devices)


def load_placement_file(path: str | os.PathLike, graph: OpGraph, machine: Machine, grouping=None) -> np.ndarray:
    """Read a placement file (see the module docstring) and return the checked (N,) op placement."""
    path = Path(path)
    where = f"placement file {str(path)!r}"
    try:
        data = loads_json_once(path.read_text(), where)
    except FileNotFoundError:
        raise PlacerError(f"{where} does not exist") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, bad UTF-8, 4,300+ digits
        raise PlacerError(f"{where} is not readable JSON: {exc}") from None
    try:
        return check_placement(graph, machine, _op_devices(data, graph, machine, _op_groups(graph, grouping)))
    except PlacerError as exc:
        raise PlacerError(f"{where}: {exc}") from None


def save_placement_file(path: str | os.PathLike, graph: OpGraph, machine: Machine, placement) -> Path:
    """Write ``{"graph", "graph_hash", "machine", "ops": [device name per op]}`` atomically."""
    placement = check_placement(graph, machine, placement)
    names = [d.name for d in machine.devices]
    text = json.dumps({"graph": graph.name, "graph_hash": graph.content_hash, "machine": machine.name,
                       "ops": [names[d] for d in placement.tolist()]})
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_text(text)
    return path


def _op_groups(graph: OpGraph, grouping) -> np.ndarray:
    if grouping is None:
        return graph.colocation_ids
    groups = np.asarray(getattr(grouping, "op_group", grouping))
    if groups.shape != (graph.num_ops,):
        raise PlacerError(f"grouping has shape {groups.shape}, expected ({graph.num_ops},)")
    return dense_ids(groups)  # dense 0..G-1


def _op_devices(data, graph: OpGraph, machine: Machine, groups: np.ndarray) -> np.ndarray:
    num_groups = int(groups.max()) + 1 if len(groups) else 0
    if isinstance(data, dict):
        unknown = set(data) - {"ops", "groups", "graph", "graph_hash", "machine"}
        if unknown or ("ops" in data) == ("groups" in data):
            raise PlacerError("expected exactly one of the keys 'ops' or 'groups' (and optionally 'graph', "
                              "'graph_hash', 'machine')")
        _check_written_for(data, graph, machine)
        if "groups" in data:
            return _device_list(data["groups"], machine, num_groups, "groups")[groups]
        if isinstance(data["ops"], dict):
            return _named_ops(data["ops"], graph, machine)
        return _device_list(data["ops"], machine, graph.num_ops, "ops")
    if not isinstance(data, list):
        raise PlacerError("expected a list of devices or an object with 'ops' or 'groups'")
    if len(data) == graph.num_ops:
        return _device_list(data, machine, graph.num_ops, "ops")
    if len(data) == num_groups:
        return _device_list(data, machine, num_groups, "groups")[groups]
    raise PlacerError(f"has {len(data)} entries, but graph {graph.name!r} has {graph.num_ops} ops "
                      f"and {num_groups} groups")


def _check_written_for(data: dict, graph: OpGraph, machine: Machine) -> None:
    """The file's "graph_hash" (else its "graph" name) and "machine" name, where given, are this graph's and
    machine's: a placement of another graph or machine whose device names happen to fit is refused."""
    for key in ("graph", "graph_hash", "machine"):
        if key in data and not isinstance(data[key], str):
            raise PlacerError(f"'{key}' must be a string, got {json.dumps(data[key])}")
    if "graph_hash" in data and data["graph_hash"] != graph.content_hash:
        raise PlacerError(f"was written for a graph with hash {data['graph_hash']!r}; graph {graph.name!r} has "
                          f"hash {graph.content_hash!r}")
    if "graph_hash" not in data and full_graph_name(data.get("graph", graph.name)) != graph.name:
        raise PlacerError(f"was written for graph {data['graph']!r}, not {graph.name!r} (remove its 'graph' to "
                          "use it anyway)")
    if data.get("machine", machine.name) != machine.name:
        raise PlacerError(f"was written for machine {data['machine']!r}, not {machine.name!r} (remove its "
                          "'machine' to use it anyway)")


def _device_list(values, machine: Machine, expected: int, what: str) -> np.ndarray:
    if not isinstance(values, list) or len(values) != expected:
        count = len(values) if isinstance(values, list) else "no list of"
        raise PlacerError(f"'{what}' has {count} entries, expected {expected}")
    index = {d.name: i for i, d in enumerate(machine.devices)}
    out = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        out[i] = _device_index(value, index, machine)
    return out


def _named_ops(mapping: dict, graph: OpGraph, machine: Machine) -> np.ndarray:
    op_index = {name: i for i, name in enumerate(graph.op_names)}
    device_index = {d.name: i for i, d in enumerate(machine.devices)}
    out = np.full(graph.num_ops, -1, dtype=np.int64)
    for op, value in mapping.items():
        if op not in op_index:
            raise PlacerError(f"graph {graph.name!r} has no op {op!r}")
        out[op_index[op]] = _device_index(value, device_index, machine)
    missing = np.flatnonzero(out < 0)
    if len(missing):
        raise PlacerError(f"op {graph.op_names[missing[0]]!r} has no device ({len(missing)} ops missing)")
    return out


def _device_index(value, index: dict, machine: Machine) -> int:
    if isinstance(value, str):
        if value not in index:
            machine.device_index(value)  # raises the unknown-device error
        return index[value]
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < machine.num_devices:
            raise PlacerError(f"device index {value} is outside 0..{machine.num_devices - 1}")
        return value
    raise PlacerError(f"a device must be a name or an index, got {value!r}")
