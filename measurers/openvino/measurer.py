"""The OpenVINO measurer: real inference of an imported model, each op on its placed OpenVINO device.

The graph comes from an OpenVINO IR or ONNX file (``graph.meta["model_file"]``, read with the process's one
core, measurers.openvino.core, unless a ``core`` is passed), its inputs sized as at import,
``meta["input_shapes"]``; graph ops are the model's nodes by friendly name, or for an ONNX-imported graph by
the tensors they compute; Parameter / Constant / Result nodes are not ops). Per placement the model's
nodes get manual HETERO affinities (measurers.openvino.affinity: ops on their devices, other nodes with a
neighbour op) and the model is compiled on ``HETERO:<devices>``, always through HETERO so one-device and
split placements are timed the same way. Compilation is not timed; timing follows measurers.timing:
warm-up inferences, then N timed ones on seeded random inputs, the median. Every device computes in fp32
(``INFERENCE_PRECISION``, the hint set on each device used), as the graphs' FLOP and byte counts and the
simulator's device figures assume; OpenVINO's own default is bf16 on CPUs with AMX (3.8x faster for
resnet-50-infer on the development machine: BENCHMARKS.md, issue 15) and f16 on GPUs.

Statuses: a bad placement (length, device index, allowed kind) is ``error`` before anything compiles; an
OpenVINO failure whose text says memory ran out is ``oom``, any other ``error`` with its text; past
``timeout_s`` ``timeout``. A machine device the runtime lacks, a missing or unreadable model file, a graph
whose ops are not the model's nodes, or one whose ops' recorded bytes are not the model's (a file rewritten
since the import: measurers.openvino.sizes) is a PlacerError at construction. Peak bytes: for a GPU the plugin's
``GPU_MEMORY_STATISTICS`` (bytes it holds while the placement is loaded, after the timed runs); 0 for CPUs,
which OpenVINO does not account per model. Example::

    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=10, warmup=3)
    [m.runtime_s for m in measurer.measure([placement])]
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from graphs.errors import PlacerError
from graphs.inference.openvino_import import size_inputs, size_ir_inputs
from graphs.opgraph import OpGraph
from measurers.base import Measurement, failed_measurement
from measurers.machine import Machine
from measurers.openvino.affinity import apply_affinity, match_ops, node_devices, node_ops
from measurers.openvino.core import openvino_core
from measurers.openvino.devices import openvino_device_names
from measurers.openvino.inputs import input_tensors, ov_message, random_inputs
from measurers.openvino.onnx_ops import onnx_ops
from measurers.openvino.sizes import check_sizes
from measurers.placement import check_placement
from measurers.timing import INFERENCE_TIMING, TimingSettings, time_runs

INFERENCE_PRECISION = "f32"
OOM_PATTERN = re.compile(r"out of memory|CL_OUT_OF_RESOURCES|CL_MEM_OBJECT_ALLOCATION_FAILURE|"
                         r"failed to allocate|std::bad_alloc", re.IGNORECASE)


class OpenVinoMeasurer:
    def __init__(self, graph: OpGraph, machine: Machine, *, runs: int = INFERENCE_TIMING.runs,
                 warmup: int = INFERENCE_TIMING.warmup, timeout_s: float = INFERENCE_TIMING.timeout_s, seed: int = 0,
                 core=None, ov_devices: Sequence[str] | None = None, clock: Callable[[], float] = time.perf_counter):
        self.graph, self.machine, self.seed, self.clock = graph, machine, seed, clock
        self.settings = TimingSettings(runs, warmup, timeout_s)
        self.core = core or openvino_core()  # one per process: see measurers.openvino.core
        self.device_names = openvino_device_names(machine, self.core.available_devices, ov_devices)  # (D,)
        for name in set(self.device_names):
            self.core.set_property(name, {"INFERENCE_PRECISION_HINT": INFERENCE_PRECISION})
        self.model_file = model_file_of(graph)
        self.model = read_model(self.core, self.model_file)
        onnx = onnx_ops(graph, self.model_file)
        where, imported_sizes = f"model file {self.model_file}", {  # the sizes the graph was imported at
            name: tuple(sizes) for name, sizes in graph.meta.get("input_shapes", {}).items()}
        if onnx is not None:  # ONNX, imported from the file as it is: every op a node before the resize
            match_ops(self.model, graph, self.model_file, onnx.tensor_ops)
            size_inputs(self.model, where, imported_sizes)
            # at those sizes OpenVINO folds shape arithmetic over a dynamic axis into constants: those ops have no node
            self.matched = match_ops(self.model, graph, self.model_file, onnx.tensor_ops, every_op=False)
        else:  # an IR's graph is the model resized as the import resized it (its new nodes named alike)
            size_ir_inputs(self.model, where, imported_sizes)
            self.matched = match_ops(self.model, graph, self.model_file)
        # names and types alone let a wider model, re-exported to the same path, pass as the graph: sizes too
        check_sizes(self.model, graph, self.model_file, self.matched, onnx)
        self.inputs = random_inputs(self.model, seed, graph.batch_size)  # one array per model input

    # -- one placement, compiled and run --------------------------------------------------------------
    def compile_for(self, placement: np.ndarray, config: dict | None = None):
        """The model compiled with ``placement`` (an (N,) checked op placement) as HETERO affinities."""
        devices = node_devices(self.model, self.matched, placement, self.device_names)
        target = apply_affinity(self.model, devices)
        return self.core.compile_model(self.model, target, config or {})

    def infer_once(self, placement, inputs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """The model's outputs (in order) for ``inputs`` (default: the seeded random ones) under ``placement``."""
        compiled = self.compile_for(check_placement(self.graph, self.machine, placement))
        results = compiled(input_tensors(self.model, self.inputs) if inputs is None else list(inputs))
        return [np.array(results[output]) for output in compiled.outputs]

    # -- measuring ------------------------------------------------------------------------------------
    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        return [self._measure_one(p) for p in placements]

    def _measure_one(self, placement) -> Measurement:
        began, clock_began = time.perf_counter(), self.clock()  # compiling counts toward the timeout, as in the pool
        zeros = (0,) * self.machine.num_devices
        try:
            placement = check_placement(self.graph, self.machine, placement)
        except PlacerError as exc:
            return failed_measurement("error", zeros, began, str(exc))
        try:
            request = self._request(placement)
            timing = time_runs(request.infer, self.settings, clock=self.clock, began=clock_began)
            peaks = self._peaks(placement)
        except Exception as exc:  # noqa: BLE001  any OpenVINO failure is a status, never the caller's crash
            message = ov_message(exc)
            status = "oom" if OOM_PATTERN.search(message) else "error"
            return failed_measurement(status, zeros, began, f"{type(exc).__name__}: {message}")
        return timing.measurement(self.settings, peaks, began)

    def op_times_s(self, placement: np.ndarray) -> dict[int, float]:
        """Each op's own time under ``placement`` (every op of the graph, (N,) keys) from OpenVINO's
        performance counters: ``warmup`` untimed inferences, then the mean over ``runs`` of each node's
        ``real_time`` summed per op. The CPU plugin's counters are running means since the model compiled
        (whole microseconds), so they are read twice, after the warm-up and after the timed runs, and the
        timed runs' mean is what the two readings give (``_timed_mean``): the median of the running means
        kept the cold first inferences (a small model's op times summed to up to 20x its step). A node's
        time is the op's it belongs to (affinity.node_ops, the rule that gives it a device): OpenVINO reads
        an ONNX ``Conv`` with a bias as ``c/WithoutBiases`` (the convolution) and ``c`` (the Add), and the
        convolution's time is the Conv's. The plugin rewrites the model before it runs it: an op it fused
        into another (relu into its convolution; bert's MatMul into a FullyConnected node named after the Add
        that follows), folded or optimized out runs no kernel of its own and gets 0 s, its time being in the
        node that ran. A node the plugin made of several (an ONNX convolution with the BatchNormalization and
        ReLU after it, run as one node named after none of the graph's ops) is the first of its original nodes
        (the runtime model's ``originalLayersNames``) that belongs to an op: its time went to no op, and the
        profile gave the step's largest kernel 0 s. Nodes the plugin added (layout reorders) are
        no op's and are left out. So on one device the times add up to the step; split, an op fused across
        the cut is timed as it ran fused."""
        request = self._request(check_placement(self.graph, self.machine, placement), {"PERF_COUNT": True})
        owner = node_ops(self.model, self.matched)
        op_of_name = {node.get_friendly_name(): owner[node.get_name()]
                      for node in self.model.get_ops() if node.get_name() in owner}
        op_of_name.update(_merged_node_ops(request.get_compiled_model(), op_of_name))
        warmup, runs = self.settings.warmup, self.settings.runs
        for _ in range(warmup):
            request.infer()
        warm = _times_by_op(request.get_profiling_info(), op_of_name) if warmup else {}
        for _ in range(runs):
            request.infer()
        timed = _times_by_op(request.get_profiling_info(), op_of_name)
        return {op: _timed_mean(timed.get(op, 0.0), warm.get(op, 0.0), warmup, runs)
                for op in range(self.graph.num_ops)}

    def _request(self, placement: np.ndarray, config: dict | None = None):
        """An infer request of the placed model with the random inputs already set (host tensors)."""
        request = self.compile_for(placement, config).create_infer_request()
        for index, tensor in enumerate(input_tensors(self.model, self.inputs)):
            request.set_input_tensor(index, tensor)
        return request

    def _peaks(self, placement: np.ndarray) -> tuple[int, ...]:
        used = set(placement.tolist())
        return tuple(gpu_bytes(self.core, name) if i in used and device.kind == "gpu" else 0
                     for i, (device, name) in enumerate(zip(self.machine.devices, self.device_names)))


def _timed_mean(mean_s: float, warm_mean_s: float, warmup: int, runs: int) -> float:
    """The mean of the ``runs`` timed inferences from running means since the model compiled: ``mean_s`` over
    all ``warmup + runs``, ``warm_mean_s`` over the warm-up (at least 0 s: the means are rounded). A plugin
    whose counters hold the last inference's time gives about that time here once the warm-up settled it."""
    return max(0.0, ((warmup + runs) * mean_s - warmup * warm_mean_s) / runs)


def _merged_node_ops(compiled, op_of_name: dict[str, int]) -> dict[str, int]:
    """Node name -> op, for the nodes of the compiled model's runtime graph that are none of ``op_of_name``'s
    but were made of nodes that are (``originalLayersNames``: the node's own name, then what was merged in);
    a runtime graph OpenVINO cannot give adds none."""
    try:
        runtime = compiled.get_runtime_model()
    except RuntimeError:
        return {}
    found = {}
    for node in runtime.get_ordered_ops():
        info = node.get_rt_info()
        if node.get_friendly_name() in op_of_name or "originalLayersNames" not in info:
            continue
        origins = str(info["originalLayersNames"].astype(str)).split(",")
        op = next((op_of_name[name] for name in origins if name in op_of_name), None)
        if op is not None:
            found[node.get_friendly_name()] = op
    return found


def _times_by_op(infos, op_of_name: dict[str, int]) -> dict[int, float]:
    """One run's performance counters summed per op (an op may run as several nodes)."""
    times_s: dict[int, float] = {}
    for info in infos:
        op = op_of_name.get(info.node_name.split(": ", 1)[-1])  # HETERO prefixes "subgraphK: "
        if op is not None:
            times_s[op] = times_s.get(op, 0.0) + info.real_time.total_seconds()
    return times_s


def model_file_of(graph: OpGraph) -> str:
    """The model file the graph was imported from (``graph.meta["model_file"]``); PlacerError if absent."""
    model_file = graph.meta.get("model_file")
    if model_file and not isinstance(model_file, str):  # a hand-edited graph file's metadata
        raise PlacerError(f"graph {graph.name!r}: meta['model_file'] is {model_file!r}, not a path")
    if not model_file:
        raise PlacerError(f"graph {graph.name!r} names no model file (meta['model_file']); the OpenVINO "
                          f"measurer needs a graph imported from an OpenVINO IR or ONNX file")
    if not Path(model_file).is_file():
        raise PlacerError(f"graph {graph.name!r}: model file {model_file!r} does not exist")
    return str(model_file)


def read_model(core, model_file: str):
    """``core.read_model``, its failure a PlacerError naming the file."""
    try:
        return core.read_model(model_file)
    except Exception as exc:  # noqa: BLE001  OpenVINO raises RuntimeError and others for a damaged file
        raise PlacerError(f"model file {model_file!r} cannot be read by OpenVINO: {ov_message(exc)}") from None


def gpu_bytes(core, device_name: str) -> int:
    """Bytes the OpenVINO GPU plugin reports holding on ``device_name`` (all allocation kinds); 0 when it
    does not say."""
    try:
        stats = core.get_property(device_name, "GPU_MEMORY_STATISTICS")
    except Exception:  # noqa: BLE001  a plugin without the property
        return 0
    return int(sum(int(v) for v in dict(stats).values()))
