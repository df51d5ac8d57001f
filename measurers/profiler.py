"""Per-op profiles: every op of a graph timed on every device model of a machine, by a real framework.

For each device model of the machine (one device of each), the whole step runs with every op on that
device (an op that may not run on its kind stays on the first device it may use), ``warmup`` times untimed
and then ``runs`` times with each op timed on its own, and the median per op is kept:

- torch: each replayed aten call bracketed by device synchronization (`PlacedReplay.run`), less the
  bracket's own time (``empty_bracket_s``);
- tf: TensorFlow's own per-node times from the run metadata (step stats; a GPU node's, its kernels' times:
  ``run_node_times_s``). TensorFlow inlines function calls
  (their ops run under the importer's names) except those it must not (``_noinline``, ``jit_compile``): it
  names their ops in the stats only within the function (``Relu``), and an op is timed when that name fits
  no other op; the rest are left out and listed in the profile's ``untimed`` (`graph_def.attribute_runs`);
- openvino: OpenVINO's performance counters (inference graphs imported from ONNX or OpenVINO IR); an op the
  plugin fused into another gets 0 s, its time being in that op's.

The result is an `OpProfile` (op name, device model, seconds) that the simulator's cost model reads
(`placer simulate --profile FILE`). Variables and inputs are not timed (they launch no kernel).
"""

from __future__ import annotations

import re
import time

import numpy as np

from graphs.opgraph import OpGraph
from measurers.sim.costs import OpProfile
from measurers.machine import Machine


def model_placements(graph: OpGraph, machine: Machine) -> list[tuple[int, np.ndarray]]:
    """(device, placement with every op it may run on that device) for one device of each model."""
    seen, out = set(), []
    bits = machine.kind_bits
    for d, device in enumerate(machine.devices):
        if device.model in seen:
            continue
        seen.add(device.model)
        fallback = np.array([next((k for k in range(machine.num_devices) if mask & bits[k]), d)
                             for mask in graph.allowed_mask.tolist()], dtype=np.int64)  # (N,)
        allowed = (graph.allowed_mask & bits[d]) != 0  # (N,) bool
        out.append((d, np.where(allowed, d, fallback)))
    return out


def profile_torch(graph: OpGraph, machine: Machine, runs: int = 3, warmup: int = 1, seed: int = 0,
                  measurer=None) -> OpProfile:
    from measurers.torch.measurer import TorchMeasurer

    measurer = measurer or TorchMeasurer(graph, machine, seed=seed)
    timed: list[tuple[int, int, float]] = []
    for d, placement in model_placements(graph, machine):
        replay = measurer.replay_for(placement)
        for _ in range(warmup):
            replay.run()
        bracket_s = empty_bracket_s(measurer.sync)
        samples = []
        for _ in range(runs):
            step_times: list[float] = []
            replay.run(step_times, sync=measurer.sync)
            samples.append(step_times)
        median = np.median(np.array(samples), axis=0)  # (M,) seconds per counted op
        timed += [(op, d, max(t - bracket_s, 0.0))
                  for op, t in zip(measurer.counted_ops.tolist(), median.tolist()) if placement[op] == d]
        del replay
    return _op_profile(graph, machine, timed)


def empty_bracket_s(sync, samples: int = 201) -> float:
    """Median seconds of the profiler's bracket around nothing (``sync()``, clock, ``sync()``, clock), which
    every torch op time carries on top of the op and is taken off it: on an H200 node the op times summed to
    1.6x the measured all-GPU step before."""
    found = []
    for _ in range(samples):
        sync()
        began = time.perf_counter()
        sync()
        found.append(time.perf_counter() - began)
    return float(np.median(found))


def profile_tf(graph: OpGraph, machine: Machine, runs: int = 3, warmup: int = 1, seed: int = 0,
               measurer=None) -> OpProfile:
    from measurers.tf.measurer import PlacedSession, TFMeasurer

    measurer = measurer or TFMeasurer(graph, machine, seed=seed)
    traced = measurer.traced()
    timed: list[tuple[int, int, float]] = []
    untimed: set[int] = set()
    for d, placement in model_placements(graph, machine):
        effective = traced.effective_placement(placement)
        with PlacedSession(traced, [measurer.devices[k] for k in effective.tolist()], measurer.devices) as session:
            for _ in range(warmup):
                session.step()
            per_node: dict[str, list[float]] = {}
            missed: set[str] = set()
            for _ in range(runs):
                times = run_node_times_s(session.step(trace=True).step_stats)
                nodes, not_told = traced.nodes_of_runs(times)
                missed |= not_told
                for name, seconds in times.items():
                    if name in nodes:
                        per_node.setdefault(nodes[name], []).append(seconds)
        for op, node in enumerate(traced.node_of_op):
            if effective[op] != d or graph.op_kinds[op] in ("Variable", "Input"):
                continue
            if node in per_node:
                timed.append((op, d, float(np.median(per_node[node]))))
            elif node in missed:
                untimed.add(op)
    return _op_profile(graph, machine, timed, untimed)


KERNELS_OF_A_GPU = re.compile(r"/device:GPU:\d+/stream:all$")  # the GPU tracer's kernels, every stream
EXECUTOR_DEVICE = re.compile(r"device:[A-Z_]+:\d+$")  # the executor's own record of a device's nodes


def run_node_times_s(step_stats) -> dict[str, float]:
    """Each node's seconds in one traced run, by its step-stats name. The executor's record of a GPU node
    ends when its kernels are queued, not run: a GPU node's time is the sum of its kernels' in the tracer's
    ``/device:GPU:k/stream:all`` record (named ``op_name:op_type``: TensorFlow's xplane_to_step_stats.cc),
    the executor's only for a node that launched none. A node run more than once (a loop's body) sums."""
    executor: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for device in step_stats.dev_stats:
        if KERNELS_OF_A_GPU.search(device.device):
            _add_times(kernels, device.node_stats, lambda name: name.rsplit(":", 1)[0])
        elif EXECUTOR_DEVICE.search(device.device):  # not a tracer's per-stream, memcpy or sync record
            _add_times(executor, device.node_stats, lambda name: name)
    return {**executor, **kernels}


def _add_times(times: dict[str, float], node_stats, name_of) -> None:
    for node in node_stats:
        name = name_of(node.node_name)
        times[name] = times.get(name, 0.0) + _node_time_s(node)


def _node_time_s(node) -> float:
    """A traced TF node's own time: the nanosecond field where TF fills it in (the microsecond one rounds a
    third of a small graph's ops down to 0 s), else the microsecond one."""
    return node.op_end_rel_nanos * 1e-9 if node.op_end_rel_nanos else node.op_end_rel_micros * 1e-6


def profile_openvino(graph: OpGraph, machine: Machine, runs: int = 3, warmup: int = 1, seed: int = 0,
                     measurer=None) -> OpProfile:
    from measurers.openvino.measurer import OpenVinoMeasurer

    measurer = measurer or OpenVinoMeasurer(graph, machine, runs=runs, warmup=warmup, seed=seed)
    timed = [(op, d, t) for d, placement in model_placements(graph, machine)
             for op, t in sorted(measurer.op_times_s(placement).items()) if placement[op] == d]
    return _op_profile(graph, machine, timed)


def _op_profile(graph: OpGraph, machine: Machine, timed: list[tuple[int, int, float]],
                untimed: set[int] = frozenset()) -> OpProfile:
    """The profile of (op index, device index, seconds) triples: keyed by op name and the device's model.
    ``untimed``: ops that ran but whose times the framework did not tell apart (`OpProfile.untimed`)."""
    ops = np.array([graph.op_names[op] for op, _, _ in timed], dtype=object)
    models = np.array([machine.devices[d].model for _, d, _ in timed], dtype=object)
    return OpProfile(ops, models, np.array([t for _, _, t in timed], dtype=np.float64), graph.content_hash,
                     tuple(graph.op_names[op] for op in sorted(untimed)))


PROFILERS = {"torch": profile_torch, "tf": profile_tf, "openvino": profile_openvino}


def profile_graph(graph: OpGraph, machine: Machine, measurer_kind: str, runs: int = 3, warmup: int = 1,
                  seed: int = 0) -> OpProfile:
    from graphs.errors import PlacerError

    if measurer_kind not in PROFILERS:
        raise PlacerError(f"unknown measurer {measurer_kind!r} for a profile (known: {', '.join(PROFILERS)})")
    return PROFILERS[measurer_kind](graph, machine, runs, warmup, seed)
