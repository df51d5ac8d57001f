"""Export a simulated timeline in Chrome trace format (open it in https://ui.perfetto.dev or chrome://tracing).

One process row per device (its ops) and one per channel (its transfers); times in microseconds. The file is
written to a temporary name and renamed, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from graphs.errors import PlacerError
from graphs.files import atomic_file
from graphs.opgraph import PHASES, OpGraph
from measurers.machine import Machine
from measurers.sim.result import SimResult


def chrome_trace(graph: OpGraph, machine: Machine, result: SimResult) -> dict:
    """The trace as a JSON-ready dict: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}."""
    timeline = result.timeline
    if timeline is None:
        raise PlacerError("the result has no timeline: simulate with timeline=True")
    _check_same_run(graph, machine, result)
    channels = sorted({link.channel for link in machine.links})
    events = [_name_row(d, f"{device.name} ({device.model})") for d, device in enumerate(machine.devices)]
    events += [_name_row(machine.num_devices + c, f"channel {name}") for c, name in enumerate(channels)]
    names, kinds, phases = graph.op_names, graph.op_kinds, graph.phases
    for op, (dev, start, end) in enumerate(zip(timeline.op_device.tolist(), timeline.op_start_s.tolist(),
                                                timeline.op_end_s.tolist())):
        events.append({"name": names[op], "cat": kinds[op], "ph": "X", "pid": dev, "tid": 0,
                       "ts": start * 1e6, "dur": (end - start) * 1e6, "args": {"phase": PHASES[phases[op]]}})
    for k in range(len(timeline.transfer_op)):
        link = machine.links[int(timeline.transfer_link[k])]
        start, end = float(timeline.transfer_start_s[k]), float(timeline.transfer_end_s[k])
        events.append({"name": f"{names[timeline.transfer_op[k]]} -> {link.dst}", "cat": "transfer", "ph": "X",
                       "pid": machine.num_devices + channels.index(link.channel), "tid": 0,
                       "ts": start * 1e6, "dur": (end - start) * 1e6,
                       "args": {"bytes": int(timeline.transfer_bytes[k]), "link": f"{link.src}->{link.dst}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"graph": graph.name, "machine": machine.name, "runtime_s": result.runtime_s,
                          "status": result.status}}


def _check_same_run(graph: OpGraph, machine: Machine, result: SimResult) -> None:
    """The result is of this graph on this machine: one of another was labelled with the wrong devices and
    links, or failed on an index."""
    timeline = result.timeline
    sizes_match = (len(timeline.op_device) == graph.num_ops and len(result.busy_s) == machine.num_devices
                   and len(result.link_bytes) == len(machine.links))
    names = [device.name for device in machine.devices]
    if not sizes_match or any((machine.links[k].src, machine.links[k].dst) != (names[src], names[dst])
                              for k, src, dst in zip(timeline.transfer_link.tolist(), timeline.transfer_src.tolist(),
                                                     timeline.transfer_dst.tolist())):
        raise PlacerError(f"the result is not of graph {graph.name!r} on machine {machine.name!r}: it has "
                          f"{len(timeline.op_device)} ops (the graph {graph.num_ops}), {len(result.busy_s)} "
                          f"devices and {len(result.link_bytes)} links (the machine {machine.num_devices} and "
                          f"{len(machine.links)}), or its transfers use other links")


def write_trace(path: str | os.PathLike, graph: OpGraph, machine: Machine, result: SimResult) -> Path:
    """Write ``chrome_trace(...)`` to ``path`` atomically (missing folders above it are made)."""
    trace = chrome_trace(graph, machine, result)
    path = Path(path)
    with atomic_file(path) as tmp, open(tmp, "w") as handle:
        json.dump(trace, handle)
    return path


def _name_row(pid: int, name: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
