"""The TensorFlow measurer: the step's GraphDef with the device of every node set, run in a Session.

The step is re-traced (`measurers.tf.workload`) and checked op for op against the graph (same kind at
every index). Per placement, the GraphDef of the step is rewritten: every node gets its op's device (so
loss and optimizer ops are placed too, which ``with tf.device`` scopes miss), the nodes inside its library
functions as well (a ``cond``'s branches: a mixed-precision step's optimizer update; `measurers.tf.graph_def`
names them as the importer does); nodes the graph does not name (constants, identities) follow their first
input, or, with no placed input, their first consumer; each captured variable becomes a ``VarHandleOp`` on
its Variable op's device (an optimizer's slot, which has none: its parameter's), initialized from the eager
value; colocation hints (``_class``) are dropped (TensorFlow ran a group that a placement parts on device
0). Grappler and constant folding are off, so the nodes that run are the nodes placed; function calls are
inlined (the Session's own inlining, as a ``tf.function`` runs them; grappler's was off with it), so a
call's ops run as the importer names them. ``run_metadata`` returns TensorFlow's own record of where each
node ran (step stats). An op that takes a variable's resource (a slot's too) runs where that variable lives
(TensorFlow's placer insists; ``TracedStep.effective_placement``). Timing, statuses and the timeout follow
`measurers.timing`; ``ResourceExhaustedError`` is ``oom``, and so are allocation failures of other types
(``out_of_memory``). A GPU's ``peak_bytes`` is its allocator's peak over the placement's runs (TensorFlow's
``get_memory_info``: a Session in this process shares the eager context's allocator per GPU); a CPU's is 0,
not measured, as in the torch measurer.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from graphs.errors import PlacerError, first_line
from graphs.opgraph import OpGraph
from measurers.base import Measurement, failed_measurement, rebuild_step_now
from measurers.machine import Machine
from measurers.placement import check_placement
from measurers.timing import REAL_TIMING, TimingSettings, time_runs
from measurers.tf.graph_def import step_nodes
from measurers.tf.workload import TFWorkload, TracedStep, tf_workload_from_graph, trace_step


def tf_device_names(machine: Machine) -> list[str]:
    """TensorFlow device of each machine device: the k-th CPU -> /device:CPU:k, the k-th GPU -> /device:GPU:k."""
    counts = {"cpu": 0, "gpu": 0}
    names = []
    for device in machine.devices:
        names.append(f"/device:{device.kind.upper()}:{counts[device.kind]}")
        counts[device.kind] += 1
    return names


def local_tf_device(name: str) -> str:
    """``name`` ("/device:GPU:1", "/cpu:0", "gpu") as "/device:TYPE:INDEX" (index 0 when left out); a name
    TensorFlow cannot parse, or one that is not a CPU or GPU of this process, is a PlacerError naming it."""
    import tensorflow as tf

    try:
        spec = tf.DeviceSpec.from_string(name)
    except (ValueError, TypeError, AttributeError) as error:
        raise PlacerError(f"tf_devices gave {name!r}, not a TensorFlow device: {error}") from None
    if spec.device_type not in ("CPU", "GPU") or any(v is not None for v in (spec.job, spec.replica, spec.task)):
        raise PlacerError(f"tf_devices gave {name!r}, not a CPU or GPU of this process (\"/device:CPU:0\", "
                          "\"/device:GPU:1\")")
    return f"/device:{spec.device_type}:{spec.device_index or 0}"


def device_counts(tf_devices: list[str]) -> dict[str, int]:
    """CPUs and GPUs a Session needs for ``tf_devices`` ("/device:TYPE:INDEX"): one past the highest index
    of each type (at least one CPU), so two machine devices mapped to one TensorFlow device need it once."""
    counts = {"CPU": 1, "GPU": 0}
    for name in tf_devices:
        kind, index = name.rsplit(":", 2)[-2:]
        counts[kind] = max(counts[kind], int(index) + 1)
    return counts


def check_tf_sees_gpus(machine_devices: list[str]) -> None:
    """Refuse devices on GPUs this process's TensorFlow cannot see: with soft placement on (for ops
    without a GPU kernel) TensorFlow would run every "GPU" op on the CPU and the timing would lie."""
    import tensorflow as tf

    wanted, seen = device_counts(machine_devices)["GPU"], len(tf.config.list_physical_devices("GPU"))
    if wanted > seen:
        raise PlacerError(f"the devices need {wanted} GPUs but TensorFlow sees only {seen} in this process")


def gpu_peak_bytes(tf_devices: list[str], memory=None) -> tuple[int, ...]:
    """Each device's allocator peak since ``reset_gpu_peaks`` ("/device:GPU:k": bytes; CPUs: 0).
    ``memory`` is ``tf.config.experimental`` (a stand-in in tests)."""
    memory = memory or _tf_memory()
    peaks = {name: int(memory.get_memory_info(_short(name))["peak"]) for name in set(tf_devices) if _is_gpu(name)}
    return tuple(peaks.get(name, 0) for name in tf_devices)


def reset_gpu_peaks(tf_devices: list[str], memory=None) -> None:
    memory = memory or _tf_memory()
    for name in sorted({name for name in tf_devices if _is_gpu(name)}):
        memory.reset_memory_stats(_short(name))


def _is_gpu(name: str) -> bool:
    return name.startswith("/device:GPU:")


def _short(name: str) -> str:
    """"/device:GPU:1" -> "GPU:1", the form TensorFlow's memory functions document."""
    return name.removeprefix("/device:")


def _tf_memory():
    import tensorflow as tf

    return tf.config.experimental


def _check_sizes(graph: OpGraph, step: OpGraph) -> None:
    """The rebuilt step's ops hold and make the bytes the graph's do: a model file edited since the import to
    other widths or another batch (the same ops, kind for kind) was timed and reported as the graph's."""
    for what, mine, theirs in (("parameter bytes", step.param_bytes, graph.param_bytes),
                               ("output bytes", step.out_bytes, graph.out_bytes)):
        differ = np.flatnonzero(np.asarray(mine) != np.asarray(theirs))
        if len(differ):
            i = int(differ[0])
            raise PlacerError(f"the real step does not match graph {graph.name!r}: op {graph.op_names[i]!r} has "
                              f"{int(theirs[i]):,} {what} in the graph, {int(mine[i]):,} in the step (the model "
                              "changed since the import?)")


class TFMeasurer:
    def __init__(self, graph: OpGraph, machine: Machine, *, runs: int = REAL_TIMING.runs,
                 warmup: int = REAL_TIMING.warmup, timeout_s: float = REAL_TIMING.timeout_s,
                 seed: int = 0, workload: TFWorkload | None = None, clock: Callable[[], float] = time.perf_counter):
        self.graph, self.machine, self.seed, self.clock = graph, machine, seed, clock
        self.settings = TimingSettings(runs, warmup, timeout_s)
        self.workload = workload or tf_workload_from_graph(graph)
        self.devices = tf_device_names(machine)
        self._traced: TracedStep | None = None

    def check_ready(self) -> None:
        """A GPU this process cannot see, or a step it cannot rebuild, is one PlacerError here, for a caller
        that measures in this process (``placer measure``), instead of an ``error`` measurement. A failure
        of the user's own step is left to the measurement, which reports it as its status."""
        check_tf_sees_gpus(self.devices)
        rebuild_step_now(self.traced)

    def traced(self) -> TracedStep:
        if self._traced is None:
            traced = trace_step(self.workload, self.seed)
            mine, theirs = traced.graph.op_kinds.tolist(), self.graph.op_kinds.tolist()
            if mine != theirs:
                index = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
                raise PlacerError(f"the real step does not match graph {self.graph.name!r}: {len(theirs)} ops in the "
                                  f"graph, {len(mine)} in the step, first difference at op {index}")
            _check_sizes(self.graph, traced.graph)
            self._traced = traced
        return self._traced

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        return [self._measure_one(p) for p in placements]

    def _measure_one(self, placement) -> Measurement:
        began, clock_began = time.perf_counter(), self.clock()  # set-up counts toward the timeout, as in the pool
        zeros = (0,) * self.machine.num_devices
        try:
            placement = check_placement(self.graph, self.machine, placement)
        except PlacerError as exc:
            return failed_measurement("error", zeros, began, str(exc))
        try:
            traced = self.traced()
            effective = traced.effective_placement(placement)
            with PlacedSession(traced, [self.devices[d] for d in effective.tolist()], self.devices) as run:
                reset_gpu_peaks(self.devices)  # after the Session's start: its variables count, an older step's not
                timing = time_runs(run.step, self.settings, clock=self.clock, began=clock_began)
                peaks = gpu_peak_bytes(self.devices)
            return timing.measurement(self.settings, peaks, began)
        except Exception as exc:  # noqa: BLE001  any failure of the step is a status
            if out_of_memory(exc):
                return failed_measurement("oom", self._peaks_after_failure(), began,
                                          first_line(_message(exc), type(exc).__name__))
            return failed_measurement("error", self._peaks_after_failure(), began, f"{type(exc).__name__}: {exc}")

    def _peaks_after_failure(self) -> tuple[int, ...]:
        """The peaks up to a failure (0 where TensorFlow cannot say, e.g. a GPU it never started)."""
        try:
            return gpu_peak_bytes(self.devices)
        except Exception:  # noqa: BLE001  a failure's report must not fail
            return (0,) * self.machine.num_devices


OOM_MESSAGE = "OOM when allocating"  # TensorFlow's allocators' words, whatever error type carries them
COPY_ALLOCATION_FAILURE = "Dst tensor is not initialized"  # an InternalError: a copy's GPU buffer not allocated


def out_of_memory(exc: BaseException) -> bool:
    """The step ran out of memory: a ResourceExhaustedError, or an allocation failure TensorFlow reports as
    another type (a GPU copy's destination it could not allocate, an OOM inside a function's error), which
    was ``error`` as if the step had crashed. cuDNN's "Failed to get convolution algorithm" stays ``error``:
    it also means a broken cuDNN install, and TensorFlow's message does not say memory ran out."""
    import tensorflow as tf

    if isinstance(exc, tf.errors.ResourceExhaustedError):
        return True
    text = _message(exc)
    return OOM_MESSAGE in text or (isinstance(exc, tf.errors.InternalError) and COPY_ALLOCATION_FAILURE in text)


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc)


class PlacedSession:
    """A Session running one placement of a traced step; ``step()`` runs it once, ``step(trace=True)``
    returns TensorFlow's RunMetadata (where each node ran)."""

    def __init__(self, traced: TracedStep, op_devices: list[str], machine_devices: list[str]):
        import tensorflow as tf

        check_tf_sees_gpus(machine_devices)
        self.traced = traced
        self._reads: dict | None = None  # variable node name -> its read op, made on first read_variables()
        graph_def, init_feeds = placed_graph_def(traced, op_devices)
        self.tf_graph = tf.Graph()
        with self.tf_graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
            self._init_ops, self._init_feeds = [], {}
            for node_name, variable in traced.variables.items():
                value = tf.compat.v1.placeholder(variable.dtype, variable.shape)
                handle = self.tf_graph.get_tensor_by_name(f"{node_name}:0")
                with tf.device(_device_of(graph_def, node_name)):
                    self._init_ops.append(tf.raw_ops.AssignVariableOp(resource=handle, value=value))
                self._init_feeds[value] = init_feeds[node_name]
        config = tf.compat.v1.ConfigProto(device_count=device_counts(machine_devices), allow_soft_placement=True)
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
        config.graph_options.optimizer_options.do_constant_folding = False
        config.graph_options.optimizer_options.do_function_inlining = True  # a call's ops run under their names
        self.session = tf.compat.v1.Session(graph=self.tf_graph, config=config)
        concrete = traced.concrete
        self._fetches = [t.name for t in concrete.graph.outputs]
        self._targets = [op.name for op in concrete.graph.control_outputs]
        self._feeds = {t.name: value for t, value in zip(concrete.graph.inputs, traced.args)}
        self.session.run(self._init_ops, feed_dict=self._init_feeds)

    def feed(self, args: list) -> None:
        """Feed later steps ``args`` (numpy values of the step's arguments: inputs, then targets, flattened)
        instead of the traced step's."""
        names = list(self._feeds)
        if len(args) != len(names):
            raise PlacerError(f"the step takes {len(names)} arrays (inputs, then targets), got {len(args)}")
        self._feeds = dict(zip(names, args))

    def read_variables(self) -> dict[str, np.ndarray]:
        """Every captured variable's current value in the session, by its GraphDef node name."""
        import tensorflow as tf

        if self._reads is None:
            with self.tf_graph.as_default():
                self._reads = {}
                for node_name, variable in self.traced.variables.items():
                    handle = self.tf_graph.get_tensor_by_name(f"{node_name}:0")
                    with tf.device(handle.op.device):
                        self._reads[node_name] = tf.raw_ops.ReadVariableOp(resource=handle, dtype=variable.dtype)
        return self.session.run(self._reads)

    def step(self, trace: bool = False):
        import tensorflow as tf

        if not trace:
            return self.session.run(self._fetches + self._targets, feed_dict=self._feeds)[0]
        metadata = tf.compat.v1.RunMetadata()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        self.session.run(self._fetches + self._targets, feed_dict=self._feeds, options=options,
                         run_metadata=metadata)
        return metadata

    def __enter__(self) -> "PlacedSession":
        return self

    def __exit__(self, *exc) -> None:
        self.session.close()


def placed_graph_def(traced: TracedStep, op_devices: list[str]):
    """The step's GraphDef with every node's device set; captured variables as VarHandleOps.

    Returns (graph_def, {variable node name: initial numpy value})."""
    import tensorflow as tf

    graph_def = traced.concrete.graph.as_graph_def()
    device_of = {node: op_devices[i] for i, node in enumerate(traced.node_of_op)}
    device_of.update({node: op_devices[op] for node, op in traced.slot_owner.items()})  # beside its parameter
    captured_values = {internal.op.name: external for external, internal in traced.concrete.graph.captures}
    init = {}
    for node in graph_def.node:
        variable = traced.variables.get(node.name)
        if variable is not None:
            _to_var_handle(node, variable)
            init[node.name] = variable.numpy()
        elif node.name in captured_values and node.op == "Placeholder":  # a captured constant tensor
            value = captured_values[node.name]
            node.op = "Const"
            node.ClearField("input")
            dtype = node.attr["dtype"].type
            node.attr.clear()
            node.attr["dtype"].type = dtype
            node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.numpy()))
    _set_devices(graph_def, device_of)
    _drop_colocation_hints(graph_def)
    return graph_def, init


def _drop_colocation_hints(graph_def) -> None:
    """Clear every node's ``_class`` (``loc:@other``: run beside ``other``, a gradient beside its forward op):
    where a placement puts the two apart TensorFlow's placer ran both on device 0. A resource's readers and
    writers stay with it without the hint (its placer's own rule; ``TracedStep.effective_placement``)."""
    functions = graph_def.library.function
    for node in [*graph_def.node, *(node for function in functions for node in function.node_def)]:
        if "_class" in node.attr:
            del node.attr["_class"]


def _to_var_handle(node, variable) -> None:
    node.op = "VarHandleOp"
    node.ClearField("input")
    node.attr.clear()
    node.attr["dtype"].type = variable.dtype.as_datatype_enum
    node.attr["shape"].shape.CopyFrom(variable.shape.as_proto())
    node.attr["shared_name"].s = f"placer/{node.name}".encode()
    node.attr["container"].s = b""


def _set_devices(graph_def, device_of: dict) -> None:
    """Named nodes get their op's device; the others their first placed input's, in dependency order, and a
    node with none (a constant such as ``ones``, the gradient's seed, a folded ``Shape``) its first placed
    consumer's: left empty, TensorFlow put it on device 0, where the placement may run nothing. Nodes
    inside library functions (control flow, calls) too, by the importer's flattened names."""
    nodes = {found.name: found for found in step_nodes(graph_def)}
    resolved = _devices_from_inputs(nodes, device_of)
    _devices_from_consumers(nodes, resolved)
    for name, found in nodes.items():
        found.node.device = resolved[name]


def _devices_from_inputs(nodes: dict, device_of: dict) -> dict[str, str]:
    """Each node's device: its op's, else its first input's that has one ("" where none has)."""
    resolved: dict[str, str] = {}

    def device(name: str, depth: int = 0) -> str:
        if name in resolved:
            return resolved[name]
        if name in device_of:
            resolved[name] = device_of[name]
            return resolved[name]
        resolved[name] = ""
        found = nodes.get(name)
        if found is not None and depth < 200:
            for source in found.data_sources + found.control_sources:
                if device(source, depth + 1):
                    resolved[name] = resolved[source]
                    break
        return resolved[name]

    for name in nodes:
        device(name)
    return resolved


def _devices_from_consumers(nodes: dict, resolved: dict[str, str]) -> None:
    """A node still without a device takes its first consumer's (that consumer's own from its consumers, if
    it has none either), so a constant runs beside what reads it."""
    consumers: dict[str, list[str]] = {}
    for name, found in nodes.items():
        for source in dict.fromkeys(found.data_sources + found.control_sources):
            consumers.setdefault(source, []).append(name)
    visiting: set[str] = set()

    def device(name: str, depth: int = 0) -> str:
        if resolved.get(name) or name in visiting or depth >= 200:
            return resolved.get(name, "")
        visiting.add(name)
        resolved[name] = next((found for found in (device(c, depth + 1) for c in consumers.get(name, ())) if found),
                              "")
        return resolved[name]

    for name in nodes:
        device(name)


def _device_of(graph_def, name: str) -> str:
    return next(node.device for node in graph_def.node if node.name == name)
