"""What one op costs on one device, and what one transfer costs on one link.

Roofline model. An op of class ``c`` on device ``d`` takes::

    time_s = d.op_overhead_s + max(flops / (d.peak_flops * d.compute_efficiency * COMPUTE_FACTOR[d.kind][c]),
                                   bytes_accessed / (d.mem_bandwidth_Bps * d.memory_efficiency * MEMORY_FACTOR[d.kind][c]))

The op class comes from the op kind string, torch ("aten.mm.default") and TensorFlow ("MatMul") alike
(``graphs.op_classes``, re-exported here):

- ``dense``: matrix products and convolutions (mm, bmm, addmm, matmul, linear, einsum, conv*, cudnn RNNs, fused
  attention kernels).
  They reach the device's typical efficiency (factor 1.0).
- ``elementwise``: pointwise maths, activations and their backward, casts, copies and optimizer updates
  (add, mul, relu, tanh, ApplyAdam...). Memory-bound in practice; their arithmetic runs at a fraction of peak
  (0.3 on a GPU, 0.5 on a CPU: no tensor cores / wide FMA chains).
- ``meta``: ops that launch no kernel: parameters (Variable), inputs, constants, views and reshapes,
  identities. They take zero time.
- ``other``: everything else (reductions, softmax, normalization, gathers, concatenation, embeddings...).
  Half the typical compute rate and 0.7 (GPU) / 0.6 (CPU) of the typical bandwidth: irregular access.

The device's own ``compute_efficiency`` / ``memory_efficiency`` (from the catalog) scale all classes.

Measured costs override the roofline: a profile file, written by the real measurers, keyed by op name and
device model (see ``OpProfile``). Where the profile has an entry for (op, model), every device of that model
uses the measured time; elsewhere the roofline stands. Ops a device kind may not run (allowed_mask) cost
``inf`` there, profile or not.
"""

from __future__ import annotations

import json
import os
import reprlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphs.errors import PlacerError
from graphs.op_classes import OP_CLASSES, op_class, op_class_codes  # noqa: F401 (re-exported)
from graphs.files import atomic_file, file_problem, loads_json_once
from graphs.opgraph import OpGraph
from measurers.machine import PROFILE_NAMED_BY, Machine

COMPUTE_FACTOR = {  # fraction of the device's typical compute rate, per device kind and op class
    "gpu": {"dense": 1.0, "elementwise": 0.3, "meta": 1.0, "other": 0.5},
    "cpu": {"dense": 1.0, "elementwise": 0.5, "meta": 1.0, "other": 0.5},
}
MEMORY_FACTOR = {  # fraction of the device's typical memory bandwidth
    "gpu": {"dense": 1.0, "elementwise": 1.0, "meta": 1.0, "other": 0.7},
    "cpu": {"dense": 1.0, "elementwise": 0.8, "meta": 1.0, "other": 0.6},
}

def op_time_matrix(graph: OpGraph, machine: Machine, profile: "OpProfile | None" = None) -> np.ndarray:
    """(N, D) float64 seconds: each op's time on each device; ``inf`` where allowed_mask excludes it.
    Without an explicit ``profile``, the machine file's own profile (if it names one) applies; a profile
    measured on another graph is a PlacerError (``OpProfile.check_graph``). Op or
    transfer times too large to simulate are a PlacerError (``_check_op_times``, ``_check_transfer_times``):
    every user of op times (simulator, lower bound, exact policies) builds them here."""
    named_by = ""
    if profile is None and machine.profile:
        profile = machine.profile  # a path, relative ones resolved by the machine file's reader
        named_by = machine.meta.get(PROFILE_NAMED_BY, "")
    classes = op_class_codes(graph)  # (N,) int8
    times = np.empty((graph.num_ops, machine.num_devices), dtype=np.float64)
    for d, device in enumerate(machine.devices):
        compute_Fps = np.array([device.peak_flops * device.compute_efficiency * COMPUTE_FACTOR[device.kind][c]
                                for c in OP_CLASSES])  # (C,)
        memory_Bps = np.array([device.mem_bandwidth_Bps * device.memory_efficiency * MEMORY_FACTOR[device.kind][c]
                               for c in OP_CLASSES])  # (C,)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # checked below, not warned
            roofline_s = np.maximum(graph.flops / compute_Fps[classes], graph.bytes_accessed / memory_Bps[classes])
        times[:, d] = np.where(classes == OP_CLASSES.index("meta"), 0.0, device.op_overhead_s + roofline_s)
    where = "the profile"
    if isinstance(profile, (str, os.PathLike)):  # a path, as the machine file names one
        where, profile = _read_named_profile(profile, named_by)
    if profile is not None:
        profile.check_graph(graph, where)
        profile.apply(graph, machine, times)
    allowed = allowed_cells(graph, machine)  # (N, D) bool
    times[~allowed] = np.inf
    _check_op_times(graph, machine, times, allowed)
    _check_transfer_times(graph, machine)
    return times


def allowed_cells(graph: OpGraph, machine: Machine) -> np.ndarray:
    """(N, D) bool: the (op, device) pairs allowed_mask lets run."""
    return (graph.allowed_mask[:, None] & machine.kind_bits[None, :]) != 0


def check_given_op_times(graph: OpGraph, machine: Machine, times: np.ndarray) -> None:
    """Op times a caller made (``Simulator(op_time_s=...)``) checked as ``op_time_matrix`` checks its own:
    a NaN or negative time where the op may run made the fast engine loop forever (or write past its arrays
    with a timeline), and an ``inf`` there read as a device the op may not run on."""
    allowed = allowed_cells(graph, machine)
    with np.errstate(invalid="ignore"):
        bad = allowed & ~(np.isfinite(times) & (times >= 0))  # (N, D) bool
    if bad.any():
        i, d = (int(k) for k in np.argwhere(bad)[0])
        raise PlacerError(f"op_time_s holds {times[i, d]} s for op {graph.op_names[i]!r} on device "
                          f"{machine.devices[d].name!r}, where it may run: op times there must be finite and >= 0 "
                          "(inf marks a device the op may not run on)")
    _check_op_times(graph, machine, times, allowed)


def _read_named_profile(path: str | os.PathLike, named_by: str) -> tuple[str, "OpProfile"]:
    """(how messages name the profile at ``path``, the profile). One a machine file names is named with that
    file (``named_by``) when damaged or of another graph, as machine_from_json names a missing one."""
    prefix = f"{named_by}: " if named_by else ""
    try:
        return f"{prefix}profile file {str(path)!r}", load_profile(path)
    except PlacerError as exc:
        raise PlacerError(f"{prefix}{exc}") from None


MAX_TOTAL_S = 1e15  # about 32 million years: far above any real step, far below float overflow


def _check_op_times(graph: OpGraph, machine: Machine, times: np.ndarray, allowed: np.ndarray) -> None:
    """``inf`` must mean "may not run there" only, and no step may overflow: every allowed time finite and
    their total, each op on its slowest allowed device (a bound on any placement's compute), at most
    ``MAX_TOTAL_S``. Device figures such as peak_flops 1e-300, or profile times of 1e308 s, used to give
    a step of ``inf`` s reported as "ok" (and numpy overflow warnings)."""
    bad = allowed & ~np.isfinite(times)
    if bad.any():
        i, d = (int(k) for k in np.argwhere(bad)[0])
        device = machine.devices[d]
        raise PlacerError(f"op {graph.op_names[i]!r} ({graph.flops[i]:.3g} flops, {graph.bytes_accessed[i]:.3g} "
                          f"bytes) takes longer than a float can hold on device {device.name!r} (peak_flops "
                          f"{device.peak_flops:.3g}, mem_bandwidth_Bps {device.mem_bandwidth_Bps:.3g}): "
                          "the op's size or the device's figures are too extreme to simulate")
    with np.errstate(over="ignore"):
        total_s = float(np.where(allowed, times, 0.0).max(axis=1, initial=0.0).sum())
    if not total_s <= MAX_TOTAL_S:
        raise PlacerError(f"the ops of graph {graph.name!r} take {total_s:.3g} s in all on machine {machine.name!r} "
                          f"(each on its slowest allowed device), more than {MAX_TOTAL_S:.0e} s: the profile's "
                          "times or the devices' figures are too extreme to simulate")


def _check_transfer_times(graph: OpGraph, machine: Machine) -> None:
    """Every edge sent once over the slowest link (at most one transfer per edge: a bound on any
    placement's transfers) must take at most ``MAX_TOTAL_S`` in all: a link with latency_s 1e308 or
    bandwidth_Bps 1e-300 gave steps of inf (or 1.6e308) s reported as "ok", and one with latency_s NaN
    (``Link`` refuses it now, but a machine can be built past that check) made both engines loop forever."""
    if not machine.links or not len(graph.edge_bytes):
        return
    latency_s = float(np.max([link.latency_s for link in machine.links]))  # np.max keeps a NaN; max() may skip it
    bandwidth_Bps = float(np.min([link.bandwidth_Bps for link in machine.links]))
    with np.errstate(over="ignore", divide="ignore"):
        total_s = float(len(graph.edge_bytes) * latency_s + np.sum(graph.edge_bytes, dtype=np.float64) / bandwidth_Bps)
    if not total_s <= MAX_TOTAL_S:
        raise PlacerError(f"the transfers of graph {graph.name!r} may take {total_s:.3g} s in all on machine "
                          f"{machine.name!r} (each edge over its slowest link: latency_s up to {latency_s:.3g}, "
                          f"bandwidth_Bps down to {bandwidth_Bps:.3g}), more than {MAX_TOTAL_S:.0e} s: "
                          "the links' figures are too extreme to simulate")


def transfer_time_s(machine: Machine, src_dev: int, dst_dev: int, nbytes: float) -> float:
    """Seconds to move ``nbytes`` from device ``src_dev`` to ``dst_dev`` (0 on the same device)."""
    if src_dev == dst_dev:
        return 0.0
    link = machine.link(src_dev, dst_dev)
    return link.latency_s + nbytes / link.bandwidth_Bps


PROFILE_FORMAT = "placer-op-profile"
PROFILE_VERSION = 1


@dataclass(frozen=True)
class OpProfile:
    """Measured per-op times, keyed by (op name, device model). Written by the real measurers.

    On disk either JSON::

        {"format": "placer-op-profile", "version": 1, "graph_hash": "<optional>",
         "entries": [{"op": "fc1/MatMul", "device_model": "K80", "time_s": 0.00012}, ...]}

    or Parquet with columns ``op`` (string), ``device_model`` (string), ``time_s`` (float64), whose schema
    metadata ``placer.op_profile`` holds the JSON header (format, version, graph_hash); the file extension
    decides. A file without a graph hash (an older Parquet file) names no graph and is not checked against
    one. Entries for ops the graph does not have are ignored.
    """

    op_names: np.ndarray  # (K,) object
    device_models: np.ndarray  # (K,) object
    time_s: np.ndarray  # (K,) float64
    graph_hash: str = ""
    untimed: tuple[str, ...] = field(default=(), compare=False)  # ops that ran, not told apart: not saved

    def __post_init__(self) -> None:
        if not (len(self.op_names) == len(self.device_models) == len(self.time_s)):
            raise PlacerError("op profile: columns differ in length")
        times = np.asarray(self.time_s, dtype=np.float64)
        if times.size and (not np.all(np.isfinite(times)) or times.min() < 0):
            raise PlacerError("op profile: every time_s must be finite and not negative")
        for i, (op, model) in enumerate(zip(self.op_names, self.device_models)):  # unhashable ones broke set()
            for key, value in (("op", op), ("device_model", model)):
                if not isinstance(value, str):
                    raise PlacerError(f"op profile: entry {i}: {key} must be a string, got {reprlib.repr(value)}")
        keys = set(zip(self.op_names, self.device_models))
        if len(keys) != len(self.op_names):
            raise PlacerError("op profile: an (op, device_model) pair appears twice")

    def check_graph(self, graph: OpGraph, where: str) -> None:
        """A PlacerError when the profile names a graph (its hash) other than ``graph``: op names of another
        graph match by chance, and its times would apply without a word."""
        if self.graph_hash and self.graph_hash != graph.content_hash:
            raise PlacerError(f"{where} was measured on a graph with hash {self.graph_hash}; graph {graph.name!r} "
                              f"has hash {graph.content_hash} (its op names would match by chance)")

    def apply(self, graph: OpGraph, machine: Machine, times: np.ndarray) -> int:
        """Overwrite ``times`` (N, D) where measured; returns how many (op, device) cells changed."""
        op_index = {name: i for i, name in enumerate(graph.op_names)}
        changed = 0
        for d, device in enumerate(machine.devices):
            for op, model, t in zip(self.op_names, self.device_models, self.time_s):
                i = op_index.get(op)
                if model == device.model and i is not None:
                    times[i, d] = t
                    changed += 1
        return changed


PARQUET_META_KEY = b"placer.op_profile"  # the Parquet form's header, as the JSON form's top-level fields


def load_profile(path: str | os.PathLike) -> OpProfile:
    """Read a profile file (JSON or Parquet); one PlacerError naming the file and the problem otherwise."""
    path = Path(path)
    where = f"profile file {str(path)!r}"
    if problem := file_problem(path):
        raise PlacerError(f"{where} {problem}")
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            raw = (table.schema.metadata or {}).get(PARQUET_META_KEY)
            graph_hash = "" if raw is None else _graph_hash_of(json.loads(raw), where)  # None: an older file
            table = table.to_pydict()
            columns = {key: table[key] for key in ("op", "device_model", "time_s")}
        else:
            data = loads_json_once(path.read_text(), where)
            graph_hash = _graph_hash_of(data, where)
            entries = data["entries"]
            columns = {key: [entry[key] for entry in entries] for key in ("op", "device_model", "time_s")}
        bad = next((t for t in columns["time_s"] if isinstance(t, bool) or not isinstance(t, (int, float))), None)
        if bad is not None:  # float() took true as 1 s and "0.25" as 0.25 s
            raise PlacerError(f"{where}: field 'time_s' must hold numbers, got {bad!r}")
        times = [float(t) for t in columns["time_s"]]
    except PlacerError:
        raise
    except KeyError as exc:
        raise PlacerError(f"{where}: missing field {exc.args[0]!r}") from None
    except Exception as exc:  # unreadable JSON / Parquet, wrong types
        raise PlacerError(f"{where} is damaged or not a profile: {exc}") from None
    try:
        return OpProfile(_objects(columns["op"]), _objects(columns["device_model"]),
                         np.array(times, dtype=np.float64), graph_hash)
    except PlacerError as exc:
        raise PlacerError(f"{where}: {exc}") from None


def save_profile(profile: OpProfile, path: str | os.PathLike) -> Path:
    """Write ``profile`` as JSON (or Parquet for a .parquet path), atomically."""
    path = Path(path)
    header = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "graph_hash": profile.graph_hash}
    with atomic_file(path) as tmp:
        if path.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.table({"op": list(profile.op_names), "device_model": list(profile.device_models),
                              "time_s": profile.time_s})
            pq.write_table(table.replace_schema_metadata({PARQUET_META_KEY: json.dumps(header).encode()}), tmp)
        else:
            entries = [{"op": str(o), "device_model": str(m), "time_s": float(t)}
                       for o, m, t in zip(profile.op_names, profile.device_models, profile.time_s)]
            tmp.write_text(json.dumps({**header, "entries": entries}, indent=1))
    return path


def _graph_hash_of(header: dict, where: str) -> str:
    """The graph hash a profile header (the JSON top level, or the Parquet metadata) names ("" if none),
    once its format and version are checked."""
    if header.get("format") != PROFILE_FORMAT or header.get("version") != PROFILE_VERSION:
        raise PlacerError(f"{where}: not a {PROFILE_FORMAT} version {PROFILE_VERSION} file")
    graph_hash = header.get("graph_hash", "")
    if not isinstance(graph_hash, str):  # null was the hash "None", of no graph ("measured on a graph with hash None")
        raise PlacerError(f"{where}: field 'graph_hash' must be a string, got {json.dumps(graph_hash)}")
    return graph_hash


def _objects(values: list) -> np.ndarray:
    """(K,) object array holding each value as is: ``np.array`` would turn list values into a 2-D array
    (or fail on ragged ones) before ``OpProfile`` could name the bad entry."""
    return np.fromiter(values, dtype=object, count=len(values))
