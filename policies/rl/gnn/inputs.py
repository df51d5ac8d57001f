"""What the graph-neural placers see of a problem: features that carry over between graphs and machines.

Nothing here depends on op names, and every value is a share, a ratio or a log of a physical quantity,
so one network reads graphs of any size and machines with any number of devices:

- groups (G, F_NODE): the group feature matrix of ``graphs.features`` (op-class and phase fractions,
  standardized log magnitudes, topological positions) plus the group's work against the mean group's
  (the same for 16 or 64 groups) and its compute-to-communication ratio;
- edges (E, F_EDGE): both directions of every group edge, with the transfer time of its bytes relative
  to the mean group's work and a direction flag;
- devices (D, F_DEVICE): kind, speed relative to the fastest device on this graph, memory, mean link
  bandwidth, the device's ordinal among devices of its kind (what lets a network map early layers to
  one GPU and late layers to another although the GPUs are alike) and one over how many devices share its
  kind (``inverse_kind_count``: each GPU of paper-4gpu 0.25, its CPU 1; kinds are ``cpu`` and ``gpu``, so a
  K80 and a V100 count as two GPUs; not the number of kinds);
- pairs (G, D, F_PAIR): how much slower the group runs on the device than on its fastest one, the
  share of the device's memory its parameters take, and (the same for every group) how the whole step's
  one-device memory peak compares with the device's memory: what says a graph must be split to fit.

``FEATURE_LAYOUT`` names every column; a checkpoint stores it and refuses a network trained on another.
A change to what a column means must rename it (as ``work_share`` became ``log2_work_to_mean``): the names
are all a checkpoint can compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.errors import PlacerError
from graphs.features import FEATURE_COLUMNS, group_features
from measurers.sim.links import link_table
from policies.problem import PlacementProblem

NODE_COLUMNS = (*FEATURE_COLUMNS, "log2_work_to_mean", "log_compute_to_comm")
EDGE_COLUMNS = ("log_transfer_to_mean_work", "forward_edge")
DEVICE_COLUMNS = ("is_cpu", "is_gpu", "log_relative_speed", "log_memory_gib", "log_mean_bandwidth_gbps",
                  "kind_ordinal", "inverse_kind_count")
PAIR_COLUMNS = ("log_slowdown", "param_memory_share", "log2_graph_memory_share", "allowed")
FEATURE_LAYOUT = {"node": NODE_COLUMNS, "edge": EDGE_COLUMNS, "device": DEVICE_COLUMNS, "pair": PAIR_COLUMNS}
GIB = 2.0 ** 30


@dataclass(frozen=True, eq=False)
class GraphInputs:
    """One problem as the networks read it (float32 arrays, int64 indices)."""
    node: np.ndarray  # (G, F_NODE)
    edge_index: np.ndarray  # (2, E) int64: src, dst groups; every group edge in both directions
    edge: np.ndarray  # (E, F_EDGE)
    device: np.ndarray  # (D, F_DEVICE)
    pair: np.ndarray  # (G, D, F_PAIR)
    allowed: np.ndarray  # (G, D) bool
    work_s: np.ndarray  # (G, D) float64: the group's compute time on each device (inf where not allowed)
    edge_bytes: np.ndarray  # (E,) float64: bytes the edge carries

    @property
    def num_groups(self) -> int:
        return self.node.shape[0]

    @property
    def num_devices(self) -> int:
        return self.device.shape[0]


def graph_inputs(problem: PlacementProblem) -> GraphInputs:
    """The features of ``problem``'s units on its machine."""
    summary = group_features(problem.graph, problem.unit_grouping)
    allowed = problem.unit_allowed  # (G, D)
    work_s = problem.unit_time_s  # (G, D)
    best_s = np.where(allowed, work_s, np.inf).min(axis=1)  # (G,)
    total_s = max(float(best_s.sum()), 1e-12)
    mean_work_s = total_s / max(len(best_s), 1)
    bandwidth_Bps = _gpu_bandwidth_Bps(problem)
    group_bytes = (summary.in_bytes + summary.out_edge_bytes).astype(np.float64)  # (G,)
    compute_to_comm = (best_s + 1e-9) / (group_bytes / bandwidth_Bps + 1e-9)
    node = np.concatenate([summary.as_matrix(),
                           np.stack([np.clip(np.log2(best_s / mean_work_s + 1e-6), -8.0, 8.0) / 4.0,
                                     np.log10(compute_to_comm) / 3.0], axis=1)], axis=1)
    src, dst, nbytes = summary.edge_src, summary.edge_dst, summary.edge_bytes.astype(np.float64)
    transfer = np.log10((nbytes / bandwidth_Bps + 1e-9) / mean_work_s + 1e-6) / 3.0
    edge_index = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])]).astype(np.int64)
    edge = np.stack([np.concatenate([transfer, transfer]),
                     np.concatenate([np.ones(len(src)), np.zeros(len(src))])], axis=1)
    slowdown = np.where(allowed, (work_s + 1e-9) / (best_s[:, None] + 1e-9), 1e3)  # >= 1
    memory = np.array([d.memory_bytes for d in problem.machine.devices], dtype=np.float64)  # (D,)
    param_share = summary.param_bytes.astype(np.float64)[:, None] / memory[None, :]
    peak_bytes = max(problem.single_device_peak_bytes, 1)  # a graph of no memory: clipped at -4 alike, no warning
    whole_share = np.clip(np.log2(peak_bytes / memory), -4.0, 4.0) / 4.0  # (D,)
    pair = np.stack([np.log10(np.minimum(slowdown, 1e3)) / 3.0, np.minimum(param_share, 2.0),
                     np.broadcast_to(whole_share, slowdown.shape), allowed.astype(np.float64)], axis=2)
    device = device_features(problem, best_s)  # (D, F_DEVICE)
    for name, array in (("group", node), ("edge", edge), ("pair", pair), ("device", device)):
        if not np.isfinite(array).all():
            raise PlacerError(f"graph {problem.graph.name!r} on machine {problem.machine.name!r}: non-finite "
                              f"{name} features (a cost of NaN or inf?)")
    return GraphInputs(node=node.astype(np.float32), edge_index=edge_index, edge=edge.astype(np.float32),
                       device=device.astype(np.float32), pair=pair.astype(np.float32),
                       allowed=allowed.copy(), work_s=work_s.copy(), edge_bytes=np.concatenate([nbytes, nbytes]))


def device_features(problem: PlacementProblem, best_s: np.ndarray) -> np.ndarray:
    """(D, F_DEVICE) float64; the speed is the graph's whole work on the device against its fastest."""
    machine = problem.machine
    allowed = problem.unit_allowed
    total_on = np.where(allowed, problem.unit_time_s, 0.0).sum(axis=0)  # (D,) the work a device may take
    covered = np.where(allowed, best_s[:, None], 0.0).sum(axis=0)  # (D,) its best-case time on those groups
    speed = np.where(total_on > 0, covered / np.maximum(total_on, 1e-12), 1e-3)  # (D,) in (0, 1]
    kinds = [d.kind for d in machine.devices]
    ordinal, count = np.zeros(len(kinds)), np.zeros(len(kinds))  # (D,) position and number of its kind
    for kind in set(kinds):
        members = [i for i, k in enumerate(kinds) if k == kind]
        ordinal[members] = np.arange(len(members)) / max(len(members) - 1, 1)
        count[members] = len(members)
    bandwidth = _mean_bandwidth_Bps(problem)
    return np.stack([[k == "cpu" for k in kinds], [k == "gpu" for k in kinds], np.log10(speed),
                     np.log10([d.memory_bytes / GIB for d in machine.devices]) / 2.0,
                     np.log10(bandwidth / 1e9), ordinal, 1.0 / count], axis=1).astype(np.float64)


def _mean_bandwidth_Bps(problem: PlacementProblem) -> np.ndarray:
    """(D,) mean bandwidth of each device's links to the other devices of its kind (to all others when it
    is alone of its kind; 1 GB/s on a one-device machine): alike GPUs read the same on a box of 2 or 8."""
    table = link_table(problem.machine)
    d = problem.num_devices
    out = np.full(d, 1e9)
    if d < 2 or not len(table.bandwidth_Bps):
        return out
    kinds = np.array([device.kind for device in problem.machine.devices])
    for i in range(d):
        peers = [j for j in range(d) if j != i and kinds[j] == kinds[i]] or [j for j in range(d) if j != i]
        out[i] = _without_overflow(np.mean, table.bandwidth_Bps[table.link_of[i, peers]])
    return out


def _gpu_bandwidth_Bps(problem: PlacementProblem) -> float:
    """The median bandwidth of the links between accelerators (between all devices when there are fewer
    than two GPUs): the same on a box of 2 or 8 alike GPUs, so group and edge features do not change."""
    table = link_table(problem.machine)
    gpus = problem.gpu_indices()
    members = gpus if len(gpus) >= 2 else list(range(problem.num_devices))
    if len(members) < 2 or not len(table.bandwidth_Bps):
        return 1e9
    links = table.link_of[np.ix_(members, members)][~np.eye(len(members), dtype=bool)]
    return _without_overflow(np.median, table.bandwidth_Bps[links])


def _without_overflow(average, values: np.ndarray) -> float:
    """``average(values)`` (np.mean, np.median) of finite ``values``, also where their sum overflows (links of
    1e308 B/s a machine file may give: the features turned inf and the network's sampling failed)."""
    with np.errstate(over="ignore"):
        value = float(average(values))
    if np.isfinite(value):
        return value
    largest = float(values.max())
    return float(average(values / largest)) * largest
