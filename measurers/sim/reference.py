"""The execution simulator: how long does one training step take under a placement?

``simulate(graph, machine, placement) -> SimResult`` is a pure function of its inputs. Two engines give
bit-identical results: ``engine="reference"`` (``simulate_reference`` below, plain Python, written to be
read) and ``engine="fast"`` (``measurers/sim/fast.py``, the same algorithm compiled with numba).
``Simulator`` binds a graph and a machine once and then runs many placements.

Semantics
---------
Op times come from ``measurers.sim.costs.op_time_matrix`` (roofline, or a measured profile).

- Devices. Each device runs one op at a time, to completion. When a device is idle it starts, among its
  ops whose inputs are all present, the one that became ready first; ties go to the op earlier in the
  graph's topological order (``graph.topo_order``).
- Transfers. An op ``u`` whose output is read by ops on another device ``d`` sends it to ``d`` once (one
  transfer per (producer, destination device)), of the largest edge bytes among those consumers' edges,
  requested when ``u`` ends. A transfer takes ``latency_s + bytes / bandwidth_Bps`` of the link from
  ``u``'s device to ``d``, and occupies that link's *channel* for its whole duration: transfers on one
  channel are served one at a time, first come first served (ties: producer's topological position, then
  destination device index). That is how transfers "share the channel's bandwidth": the same total bytes
  take the same total time, and no transfer ends earlier than it would alone. Transfers overlap computation
  and transfers on other channels. A consumer on ``d`` is ready when all its inputs have ended or arrived.
- Time. Events (op ends, transfer ends) are processed in time order; all events at one instant are
  processed before any device or channel starts new work at that instant. Work that starts and ends at
  the same instant (a meta op's 0 s, a 0-byte transfer on a link of 0 latency) ends in a later round of
  that instant, after its devices and channels have chosen their next work: what it makes ready waits
  for the next free slot, whatever its position. The step time (``runtime_s``) is the time of the last
  event.
- Memory, per device. Parameters (``param_bytes``) are resident for the whole step on their op's device.
  An op's output (``out_bytes``; zero for Variable-like ops and variable reads, whose output *is* the
  resident parameter) is allocated when the op starts and freed when the last of its uses ends; its uses are
  its consumers on the same device and its outgoing transfers (the send reads it). Output nobody uses is
  freed when the op ends. A received copy is allocated on the receiver when its transfer starts and freed when its last consumer
  there ends. ``peak_bytes`` is the largest total after any allocation. A peak above the device's
  ``memory_bytes`` gives status ``"oom"`` (``runtime_s`` still computed); it is never an exception. A
  timeline records every buffer and the rounds (batches of one instant's events, then the work they start)
  allocating and freeing it (``result.Timeline``): ``liveness.py`` replays them.
"""

from __future__ import annotations

import heapq
import os
import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph
from measurers.sim.costs import (OpProfile, allowed_cells, check_given_op_times, load_profile, op_class_codes,
                                  op_time_matrix, OP_CLASSES)
from measurers.machine import Machine
from measurers.placement import check_placement
from measurers.sim.links import link_table
from measurers.sim.result import SimResult, Timeline

ENGINES = ("reference", "fast")
# Ops whose output aliases the resident parameter: TensorFlow's reads of a resource variable (colocated with it
# at import) hand out its buffer, not a copy; counted as an allocation, a Keras MLP's simulated peak was 1.75x
# that of the same model imported from PyTorch (every kernel and Adam slot once more).
VARIABLE_KINDS = frozenset({"Variable", "VariableV2", "VarHandleOp", "ReadVariableOp"})


def simulate(graph: OpGraph, machine: Machine, placement, *, engine: str = "fast", timeline: bool = False,
             profile: OpProfile | str | None = None) -> SimResult:
    """Simulate one step of ``graph`` on ``machine`` under ``placement`` ((N,) device index per op)."""
    return Simulator(graph, machine, profile=profile, engine=engine).run(placement, timeline=timeline)


class Simulator:
    """A simulator bound to one (graph, machine, profile): set-up (costs, graph arrays) is done once."""

    def __init__(self, graph: OpGraph, machine: Machine, profile: OpProfile | str | None = None,
                 engine: str = "fast", op_time_s: np.ndarray | None = None):
        """``op_time_s`` (N, D): op times already made from the cost model or a profile (a placement
        problem's), instead of ``profile``."""
        if engine not in ENGINES:
            raise PlacerError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
        if isinstance(profile, (str, os.PathLike)):
            profile = load_profile(profile)
        self.graph, self.machine, self.engine = graph, machine, engine
        if op_time_s is None:
            self.op_time_s = op_time_matrix(graph, machine, profile)  # (N, D) float64
        elif profile is not None or np.shape(op_time_s) != (graph.num_ops, machine.num_devices):
            raise PlacerError(f"op_time_s must be a ({graph.num_ops}, {machine.num_devices}) array of op times "
                              f"given instead of a profile, got shape {np.shape(op_time_s)}"
                              + (" and a profile" if profile is not None else ""))
        else:
            given = np.asarray(op_time_s, dtype=np.float64)
            check_given_op_times(graph, machine, given)
            # a copy (the reference engine read the caller's array on every run, the fast one its copy: a change
            # after made them disagree), inf where an op may not run, as op_time_matrix gives (the lower bound
            # took a CPU-only op's time on the GPU: 0.002 s where every placement steps 2 s)
            self.op_time_s = np.where(allowed_cells(graph, machine), given, np.inf)  # (N, D)
        self.alloc_bytes = output_alloc_bytes(graph)  # (N,) int64
        _check_memory_totals(graph, self.alloc_bytes)
        self._fast = None
        if engine == "fast":
            from measurers.sim.fast import FastSimulator

            self._fast = FastSimulator(graph, machine, self.op_time_s, self.alloc_bytes)

    @property
    def lower_bound_s(self) -> float:
        from measurers.sim.lower_bound import lower_bound_from_times

        return lower_bound_from_times(self.graph, self.op_time_s, self.machine.num_devices)

    def run(self, placement, timeline: bool = False) -> SimResult:
        placement = check_placement(self.graph, self.machine, placement)
        if self._fast is not None:
            return self._fast.run(placement, timeline)
        return simulate_reference(self.graph, self.machine, placement, self.op_time_s, self.alloc_bytes, timeline)

    def run_batch(self, placements) -> list[SimResult]:
        """One result per row of ``placements`` (B, N); PlacerError for anything else (a ragged batch too)."""
        try:
            batch = np.asarray(placements)
        except (ValueError, TypeError) as exc:  # ragged rows: numpy's ValueError, not one PlacerError
            raise PlacerError(f"placements must be a (B, {self.graph.num_ops}) batch: {exc}") from None
        if batch.size == 0 and batch.ndim == 1:  # an empty list: no placements
            return []
        if batch.ndim != 2:
            raise PlacerError(f"placements must be a (B, {self.graph.num_ops}) batch, got shape {batch.shape}")
        return [self.run(row) for row in batch]


def _check_memory_totals(graph: OpGraph, alloc_bytes: np.ndarray) -> None:
    """A device's memory never exceeds the graph's parameters plus outputs plus edge bytes (every transfer
    is at most one edge's bytes): that sum must fit int64. The graph keeps each of the three below 2**62,
    but three such sums can pass 2**63: the fast engine's counter wrapped (a wrong, smaller peak) and the
    reference's raised an OverflowError."""
    arrays = (graph.param_bytes, alloc_bytes, graph.edge_bytes)
    total = sum(int(a.sum(dtype=np.int64)) for a in arrays)  # each sum < 2**62: no int64 wrap here
    if total >= 2**63:
        raise PlacerError(f"graph {graph.name!r}: parameter, output and edge bytes total {total:.3g} bytes, "
                          "more than the simulator's int64 memory counters hold")


def output_alloc_bytes(graph: OpGraph) -> np.ndarray:
    """(N,) int64: bytes an op allocates on its own device when it starts (see the module docstring)."""
    kinds = graph.op_kinds.tolist()
    variable_kinds = [kind for kind in set(kinds) if kind in VARIABLE_KINDS]
    is_variable = np.isin(graph.op_kinds, variable_kinds) if variable_kinds else np.zeros(graph.num_ops, dtype=bool)
    is_variable |= (graph.param_bytes > 0) & (op_class_codes(graph) == OP_CLASSES.index("meta"))
    return np.where(is_variable, 0, graph.out_bytes).astype(np.int64)


def simulate_reference(graph: OpGraph, machine: Machine, placement: np.ndarray, op_time_s: np.ndarray,
                       alloc_bytes: np.ndarray, want_timeline: bool = False) -> SimResult:
    """The reference engine: the semantics of the module docstring, one step at a time, in plain Python."""
    n, num_devices = graph.num_ops, machine.num_devices
    device = placement.tolist()
    duration = [float(op_time_s[i, device[i]]) for i in range(n)]
    if any(d == float("inf") for d in duration):
        raise PlacerError("placement puts an op on a device it may not run on")
    position = [0] * n
    for pos, op in enumerate(graph.topo_order.tolist()):
        position[op] = pos
    succ = [[] for _ in range(n)]
    pred = [[] for _ in range(n)]
    for u, v, size in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist()):
        succ[u].append((v, size))
        pred[v].append(u)
    links = link_table(machine)
    link_index = {(src, dst): int(links.link_of[src, dst]) for src in range(num_devices) for dst in range(num_devices)
                  if src != dst}
    channels = links.channel_names
    link_channel = links.link_channel.tolist()

    # Transfers: one per (producer, destination device), numbered in (topological position, device) order.
    transfer_bytes: dict[tuple[int, int], int] = {}
    for u in range(n):
        for v, size in succ[u]:
            if device[v] != device[u]:
                key = (u, device[v])
                transfer_bytes[key] = max(transfer_bytes.get(key, 0), size)
    transfers = sorted(transfer_bytes, key=lambda key: (position[key[0]], key[1]))  # [(producer, dst device)]
    transfers_of = [[] for _ in range(n)]
    for k, (u, dst) in enumerate(transfers):
        transfers_of[u].append(k)
    transfer_id = {key: k for k, key in enumerate(transfers)}

    # Buffers (see "Memory" in the module docstring): op u's output is buffer u, transfer k's copy buffer n + k;
    # the uses that keep each alive, and the rounds allocating and freeing each (round_s: each round's instant).
    buffer_device = device + [dst for _, dst in transfers]
    buffer_bytes = alloc_bytes.tolist() + [transfer_bytes[key] for key in transfers]
    uses = [len(transfers_of[u]) + sum(device[v] == device[u] for v, _ in succ[u]) for u in range(n)]
    uses += [sum(device[v] == dst for v, _ in succ[u]) for u, dst in transfers]
    alloc_round, free_round, round_s = [0] * len(uses), [0] * len(uses), [0.0]
    memory = [0] * num_devices
    for u in range(n):
        memory[device[u]] += int(graph.param_bytes[u])
    peak = list(memory)

    def allocate(buffer: int) -> None:
        dev = buffer_device[buffer]
        memory[dev] += buffer_bytes[buffer]
        peak[dev] = max(peak[dev], memory[dev])
        alloc_round[buffer] = len(round_s) - 1

    def use_ended(buffer: int) -> None:
        uses[buffer] -= 1
        if uses[buffer] == 0:
            free(buffer)

    def free(buffer: int) -> None:
        memory[buffer_device[buffer]] -= buffer_bytes[buffer]
        free_round[buffer] = len(round_s) - 1

    waiting = [len(pred[v]) for v in range(n)]  # inputs not yet present
    ready = [[] for _ in range(num_devices)]  # per device: heap of (ready time, topo position, op)
    queued = [[] for _ in channels]  # per channel: heap of (request time, topo position, dst device, transfer)
    running_op: list[int | None] = [None] * num_devices
    running_transfer: list[int | None] = [None] * len(channels)
    events: list[tuple[float, int, int]] = []  # heap of (end time, 0 = op / 1 = transfer, id)
    start_s, end_s = [0.0] * n, [0.0] * n
    transfer_start_s, transfer_end_s = [0.0] * len(transfers), [0.0] * len(transfers)
    busy_s = [0.0] * num_devices
    link_bytes = [0] * len(machine.links)
    for v in range(n):
        if waiting[v] == 0:
            heapq.heappush(ready[device[v]], (0.0, position[v], v))

    def input_present(v: int, now: float) -> None:
        waiting[v] -= 1
        if waiting[v] == 0:
            heapq.heappush(ready[device[v]], (now, position[v], v))

    now = 0.0
    while True:
        for d in range(num_devices):  # idle devices start their first ready op
            if running_op[d] is None and ready[d]:
                _, _, v = heapq.heappop(ready[d])
                running_op[d] = v
                start_s[v], end_s[v] = now, now + duration[v]
                busy_s[d] += duration[v]
                allocate(v)
                heapq.heappush(events, (end_s[v], 0, v))
        for c in range(len(channels)):  # idle channels start their first queued transfer
            if running_transfer[c] is None and queued[c]:
                _, _, _, k = heapq.heappop(queued[c])
                u, dst = transfers[k]
                link = link_index[(device[u], dst)]
                size = transfer_bytes[(u, dst)]
                running_transfer[c] = k
                transfer_start_s[k] = now
                transfer_end_s[k] = now + (machine.links[link].latency_s + size / machine.links[link].bandwidth_Bps)
                link_bytes[link] += size
                allocate(n + k)
                heapq.heappush(events, (transfer_end_s[k], 1, k))
        if not events:
            break
        now = events[0][0]
        round_s.append(now)
        while events and events[0][0] == now:  # every event at this instant, before anything starts
            _, what, ident = heapq.heappop(events)
            if what == 0:
                v = ident
                running_op[device[v]] = None
                for u in pred[v]:  # v's inputs: one use fewer
                    use_ended(u if device[u] == device[v] else n + transfer_id[(u, device[v])])
                if uses[v] == 0:  # nothing uses v's output
                    free(v)
                for w, _ in succ[v]:
                    if device[w] == device[v]:
                        input_present(w, now)
                for k in transfers_of[v]:
                    c = link_channel[link_index[(device[v], transfers[k][1])]]
                    heapq.heappush(queued[c], (now, position[v], transfers[k][1], k))
            else:
                k = ident
                u, dst = transfers[k]
                running_transfer[link_channel[link_index[(device[u], dst)]]] = None
                use_ended(u)
                for w, _ in succ[u]:
                    if device[w] == dst:
                        input_present(w, now)

    if any(waiting):
        raise AssertionError("an op never became ready: the graph is not a DAG")
    capacity = np.array([d.memory_bytes for d in machine.devices], dtype=np.int64)
    peak_bytes = np.array(peak, dtype=np.int64)
    timeline = None
    if want_timeline:
        links = [link_index[(device[u], dst)] for u, dst in transfers]
        timeline = Timeline(
            op_device=placement.astype(np.int64), op_start_s=np.array(start_s), op_end_s=np.array(end_s),
            transfer_op=np.array([u for u, _ in transfers], dtype=np.int64),
            transfer_src=np.array([device[u] for u, _ in transfers], dtype=np.int64),
            transfer_dst=np.array([dst for _, dst in transfers], dtype=np.int64),
            transfer_link=np.array(links, dtype=np.int64),
            transfer_bytes=np.array([transfer_bytes[key] for key in transfers], dtype=np.int64),
            transfer_start_s=np.array(transfer_start_s), transfer_end_s=np.array(transfer_end_s),
            buffer_bytes=np.array(buffer_bytes, dtype=np.int64),
            buffer_alloc_round=np.array(alloc_round, dtype=np.int64),
            buffer_free_round=np.array(free_round, dtype=np.int64), round_s=np.array(round_s))
    return SimResult(runtime_s=now, status="oom" if np.any(peak_bytes > capacity) else "ok",
                     busy_s=np.array(busy_s), peak_bytes=peak_bytes, capacity_bytes=capacity,
                     link_bytes=np.array(link_bytes, dtype=np.int64), timeline=timeline)
