"""The TensorFlow measurer: placement fidelity read from TensorFlow's own run metadata, same loss placed and
unplaced, timing rule, ``ResourceExhaustedError`` as ``oom``, bad placements rejected before anything runs.

Several CPU devices come from the Session's ``device_count`` (the graph-mode form of
``tf.config.set_logical_device_configuration``), so the test needs no subprocess.
"""

import itertools

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from graphs.errors import PlacerError  # noqa: E402
from graphs.synthetic import synthetic_graph  # noqa: E402
from graphs.tf.importer import import_keras_spec  # noqa: E402
from measurers.machine import Device, Link, Machine  # noqa: E402
from measurers.tf import measurer as tf_measurer_module  # noqa: E402
from measurers.tf.measurer import (PlacedSession, TFMeasurer, gpu_peak_bytes, out_of_memory,  # noqa: E402
                                   reset_gpu_peaks, tf_device_names)
from measurers.profiler import run_node_times_s  # noqa: E402
from measurers.tf.workload import tf_workload_from_graph  # noqa: E402

SPEC = "tests/fixtures/tiny_models.py:tiny_keras_mlp"


def three_cpus() -> Machine:
    devices = tuple(Device(f"cpu:{i}", "cpu", "test-cpu", 1e11, 1e10, 2**30, 1e-6) for i in range(3))
    links = tuple(Link(a.name, b.name, 1e9, 1e-6, f"{a.name}>{b.name}") for a in devices for b in devices if a != b)
    return Machine("three-cpus", devices, links)


@pytest.fixture(scope="module")
def graph():
    return import_keras_spec(SPEC)


@pytest.fixture(scope="module")
def measurer(graph):
    return TFMeasurer(graph, three_cpus(), runs=2, warmup=1)


def group_placement(graph, seed: int) -> np.ndarray:
    """A random device per colocation group (a variable and the ops that read and write it share one)."""
    groups = np.unique(graph.colocation, return_inverse=True)[1].reshape(-1)
    return np.random.default_rng(seed).integers(0, 3, groups.max() + 1)[groups]


def constant_derived(graph) -> np.ndarray:
    """(N,) bool: ops whose every producer is itself constant-derived (constants are not graph ops)."""
    constant = np.zeros(graph.num_ops, dtype=bool)
    for op in graph.topo_order.tolist():
        producers = graph.edge_src[graph.edge_dst == op]
        constant[op] = graph.op_kinds[op] not in ("Input", "Variable") and bool(np.all(constant[producers]))
    return constant


def where_nodes_ran(metadata) -> dict[str, str]:
    return {node.node_name: stats.device for stats in metadata.step_stats.dev_stats for node in stats.node_stats}


def test_tf_measurer__every_op_runs_on_its_placed_device_per_run_metadata(graph, measurer):
    asked = group_placement(graph, seed=4)
    traced = measurer.traced()
    placement = traced.effective_placement(asked)
    assert len(set(placement.tolist())) == 3
    moved = np.flatnonzero(placement != asked)
    assert all(i in traced.resource_of for i in moved)  # only ops on a variable's resource are moved
    devices = tf_device_names(measurer.machine)
    with PlacedSession(traced, [devices[d] for d in placement], devices) as session:
        ran = where_nodes_ran(session.step(trace=True))
    constant = constant_derived(graph)
    checked = 0
    for op in range(graph.num_ops):
        node = traced.node_of_op[op]
        if node not in ran:  # fed inputs do not run; ops computed from constants alone are folded
            assert graph.op_kinds[op] == "Input" or constant[op], node
            continue
        assert ran[node].endswith(devices[placement[op]].replace("/device:", "device:")), (node, ran[node])
        checked += 1
    assert checked >= 0.9 * graph.num_ops


def test_tf_measurer__an_op_level_placement_runs_every_op_where_its_effective_placement_says(graph, measurer):
    """Adam's slots (momentum, velocity) have no graph op: they got no device, and the ops on them were not
    moved with their parameter, so a placement that split a colocation group ran them where TensorFlow chose."""
    asked = np.random.default_rng(1).integers(0, 3, graph.num_ops)
    ids = graph.colocation_ids
    assert any(len(set(asked[ids == group].tolist())) > 1 for group in np.unique(ids))  # groups split
    assert ran_elsewhere(measurer, asked) == []


def ran_elsewhere(measurer, asked) -> list[tuple[str, str]]:
    """(node, device it ran on) for each op of ``asked``'s effective placement that ran on another device."""
    traced, devices = measurer.traced(), tf_device_names(measurer.machine)
    placement = traced.effective_placement(asked)
    with PlacedSession(traced, [devices[d] for d in placement], devices) as session:
        ran = where_nodes_ran(session.step(trace=True))
    node_of_run, _ = traced.nodes_of_runs(ran)
    ran_by_node = {node: ran[name] for name, node in node_of_run.items()}
    return [(node, ran_by_node[node]) for op, node in enumerate(traced.node_of_op)
            if node in ran_by_node and not ran_by_node[node].endswith(devices[placement[op]].removeprefix("/"))]


def test_tf_measurer__a_placement_that_parts_a_gradient_from_its_colocation_hint_runs_as_placed():
    """A gradient inside a function call carries ``_class`` (run beside another gradient op); placed apart,
    TensorFlow's placer ran both on CPU:0, where this placement puts nothing."""
    graph = import_keras_spec("tests/fixtures/tiny_models.py:tiny_keras_calls")
    measurer = TFMeasurer(graph, three_cpus())
    assert ran_elsewhere(measurer, np.random.default_rng(0).integers(1, 3, graph.num_ops)) == []


def test_trace_step__each_adam_slot_belongs_to_its_parameters_variable_op(graph, measurer):
    traced = measurer.traced()
    parameters = [op for op in range(graph.num_ops) if graph.op_kinds[op] == "Variable"]
    owners = list(traced.slot_owner.values())
    assert sorted(owners) == sorted(parameters * 2)  # momentum and velocity of each
    assert all(slot in traced.variables and slot not in traced.node_of_op for slot in traced.slot_owner)


def test_tf_measurer__a_placement_without_device_0_runs_nothing_there(graph, measurer):
    """Nodes with no inputs (``ones``, the gradient's seed) were left without a device, and TensorFlow ran them
    on CPU:0, where this placement puts no op."""
    traced, devices = measurer.traced(), tf_device_names(measurer.machine)
    for seed in range(3):
        placement = traced.effective_placement(np.random.default_rng(seed).integers(1, 3, graph.num_ops))
        with PlacedSession(traced, [devices[d] for d in placement], devices) as session:
            ran = where_nodes_ran(session.step(trace=True))
        on_0 = [node for node, device in ran.items()
                if device.endswith("CPU:0") and not node.startswith(("_SOURCE", "_arg", "_retval"))]
        assert on_0 == [], seed


def test_tf_measurer__placed_step_computes_the_same_losses_as_one_device(graph, measurer):
    devices = tf_device_names(measurer.machine)
    traced = measurer.traced()
    losses = []
    for placement in (np.zeros(graph.num_ops, dtype=np.int64), group_placement(graph, seed=7)):
        with PlacedSession(traced, [devices[d] for d in placement], devices) as session:
            losses.append([float(np.sum(session.step())) for _ in range(3)])  # later steps see the updated weights
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert losses[0][2] != losses[0][0]


def test_tf_measurer__median_of_timed_runs_after_warmup(graph):
    ticks = itertools.count()
    measurer = TFMeasurer(graph, three_cpus(), runs=3, warmup=2, clock=lambda: float(next(ticks)) ** 2)
    result = measurer.measure([group_placement(graph, 1)])[0]
    assert result.status == "ok"
    assert result.samples_s == (11.0, 15.0, 19.0) and result.runtime_s == 15.0  # calls 5,6 | 7,8 | 9,10


def test_tf_measurer__resource_exhausted_is_oom_and_next_placement_runs(graph, measurer, monkeypatch):
    real_step = PlacedSession.step
    calls = []

    def exhausted_once(self, trace=False):
        if not calls:
            calls.append(1)
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[4,16]")
        return real_step(self, trace)

    monkeypatch.setattr(PlacedSession, "step", exhausted_once)
    first, second = measurer.measure([group_placement(graph, 2)] * 2)
    assert first.status == "oom" and "OOM when allocating" in first.error
    assert second.status == "ok" and len(second.samples_s) == 2


@pytest.mark.parametrize("failure, error", [
    # its first line was read from an empty message: an IndexError out of measure()
    (lambda: tf.errors.ResourceExhaustedError(None, None, ""), "ResourceExhaustedError"),
    # a GPU copy's buffer not allocated: an InternalError, and an ``error`` before
    (lambda: tf.errors.InternalError(None, None, "Dst tensor is not initialized.\n\t [[node x]]"),
     "Dst tensor is not initialized."),
], ids=["empty message", "failed copy"])
def test_tf_measurer__an_allocation_failure_is_oom_with_its_first_line(graph, measurer, monkeypatch, failure, error):
    def fails(self, trace=False):
        raise failure()

    monkeypatch.setattr(PlacedSession, "step", fails)
    (result,) = measurer.measure([group_placement(graph, 2)])
    assert result.status == "oom" and result.error == error


def test_tf_measurer__a_sessions_set_up_counts_toward_the_timeout(graph, monkeypatch):
    """The clock started at the first run: a Session that took 10 s to build, then runs of 0.1 s, was ``ok``
    under a 5 s limit, while the pool calls the same placement (its measure_s past the limit) a timeout."""
    now = [0.0]
    real_init, real_step = PlacedSession.__init__, PlacedSession.step

    def slow_init(self, *args):
        real_init(self, *args)
        now[0] += 10.0

    def quick_step(self, trace=False):
        now[0] += 0.1
        return real_step(self, trace)

    monkeypatch.setattr(PlacedSession, "__init__", slow_init)
    monkeypatch.setattr(PlacedSession, "step", quick_step)
    measurer = TFMeasurer(graph, three_cpus(), runs=2, warmup=0, timeout_s=5.0, clock=lambda: now[0])
    (result,) = measurer.measure([group_placement(graph, 1)])
    assert result.status == "timeout" and "time limit" in result.error
    assert result.samples_s == pytest.approx((0.1,))  # stopped after the first run past the limit


@pytest.mark.parametrize("exc", [
    tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[4,16]"),
    tf.errors.InternalError(None, None, "Dst tensor is not initialized."),
    tf.errors.InternalError(None, None, "Failed copying input tensor from CPU:0 to GPU:0 in order to run "
                                        "_EagerConst: Dst tensor is not initialized."),
    tf.errors.UnknownError(None, None, "OOM when allocating tensor with shape[1024,1024] on /GPU:0"),
    RuntimeError("function failed: OOM when allocating tensor"),
])
def test_out_of_memory__gpu_allocation_failures_of_other_types_are_oom(exc):
    """A GPU copy's destination that could not be allocated (InternalError), or TensorFlow's OOM words inside
    another error, were ``error``: a placement that does not fit read as a crash."""
    assert out_of_memory(exc)


@pytest.mark.parametrize("exc", [
    tf.errors.InternalError(None, None, "Could not find registered platform"),
    tf.errors.UnknownError(None, None, "Failed to get convolution algorithm. This is probably because cuDNN "
                                       "failed to initialize"),
    ValueError("Dst tensor is not initialized."),  # only TensorFlow's InternalError means the copy's allocation
])
def test_out_of_memory__other_failures_are_not(exc):
    assert not out_of_memory(exc)


class FakeMemory:
    """``tf.config.experimental``'s memory functions, for GPUs this machine does not have."""

    def __init__(self, peaks: dict[str, int]):
        self.peaks, self.resets = peaks, []

    def get_memory_info(self, device: str) -> dict:
        return {"current": 0, "peak": self.peaks[device]}

    def reset_memory_stats(self, device: str) -> None:
        self.resets.append(device)


def test_gpu_peak_bytes__each_gpus_allocator_peak_by_its_short_name_and_zero_for_cpus():
    memory = FakeMemory({"GPU:0": 5_000, "GPU:1": 7_000})
    devices = ["/device:CPU:0", "/device:GPU:0", "/device:GPU:1", "/device:GPU:1"]
    reset_gpu_peaks(devices, memory)
    assert memory.resets == ["GPU:0", "GPU:1"]  # each GPU once, no CPU (TensorFlow tracks none there)
    assert gpu_peak_bytes(devices, memory) == (0, 5_000, 7_000, 7_000)


def test_tf_measurer__peaks_are_read_after_the_runs_reset_once_the_session_has_started(graph, monkeypatch):
    """They were zeros: ``placer measure`` printed "peak 0.000 GB" for a GPU. No GPU here, so the memory
    functions are stand-ins; the order of reset, runs and read is what is checked."""
    events = []
    real_step = PlacedSession.step

    def step(self, trace=False):
        events.append("step")
        return real_step(self, trace)

    monkeypatch.setattr(PlacedSession, "step", step)
    monkeypatch.setattr(tf_measurer_module, "reset_gpu_peaks", lambda devices: events.append("reset"))
    monkeypatch.setattr(tf_measurer_module, "gpu_peak_bytes", lambda devices: events.append("read") or (1, 2, 3))
    measurer = TFMeasurer(graph, three_cpus(), runs=2, warmup=1)
    (result,) = measurer.measure([group_placement(graph, 3)])
    assert result.status == "ok" and result.peak_bytes == (1, 2, 3)
    assert events == ["reset", "step", "step", "step", "read"]


def test_tf_measurer__an_oom_reports_the_peaks_up_to_it(graph, measurer, monkeypatch):
    def exhausted(self, trace=False):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(PlacedSession, "step", exhausted)
    monkeypatch.setattr(tf_measurer_module, "gpu_peak_bytes", lambda devices: (0, 9, 0))
    (result,) = measurer.measure([group_placement(graph, 2)])
    assert result.status == "oom" and result.peak_bytes == (0, 9, 0)


def test_tf_measurer__bad_placement_rejected_before_anything_runs(graph):
    measurer = TFMeasurer(graph, three_cpus())
    short = measurer.measure([np.zeros(graph.num_ops - 1, dtype=np.int64)])[0]
    wild = np.zeros(graph.num_ops, dtype=np.int64)
    wild[3] = 7
    unknown = measurer.measure([wild])[0]
    assert short.status == unknown.status == "error"
    assert "shape" in short.error and "device 7" in unknown.error
    assert measurer._traced is None  # nothing traced, nothing run


def test_tf_measurer__a_model_file_edited_to_other_widths_is_refused_not_timed(tmp_path):
    """The rebuilt step ran the same ops, kind for kind, at the edited widths: timed, status ok, under the
    imported graph's name and hash."""
    model_file = tmp_path / "edited_mlp.py"
    source = ("import keras\nimport numpy as np\nWIDTH = {}\n"
              "def build():\n"
              "    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(WIDTH), keras.layers.Dense(2)])\n"
              "    model.compile(optimizer='adam', loss='mse')\n"
              "    return model, np.zeros((4, 8), np.float32), np.zeros((4, 2), np.float32)\n")
    model_file.write_text(source.format(16))
    graph = import_keras_spec(f"{model_file}:build")
    model_file.write_text(source.format(64))
    with pytest.raises(PlacerError, match="the real step does not match graph .*: op .* has 2,048 parameter bytes "
                                          "in the graph, 8,192 in the step"):
        TFMeasurer(graph, three_cpus(), runs=1, warmup=0).traced()


TRACE_UNDER_ANOTHER_DEVICE = """
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
from graphs.tf.importer import import_keras_spec
from measurers.tf.workload import tf_workload_from_graph, trace_step
graph = import_keras_spec("%s")
with tf.device("/CPU:1"):  # the default device elsewhere: GPU:0 on a GPU host
    traced = trace_step(tf_workload_from_graph(graph))
print(sorted({variable.device for variable in traced.variables.values()}))
""" % SPEC


def test_trace_step__its_eager_variables_live_on_the_cpu_whatever_the_default_device():
    """The traced step's eager model and optimizer variables (alive as long as the measurer) were made on the
    default device: GPU:0 on a GPU host, counted in every placement's GPU:0 peak. Logical CPUs stand in for
    GPUs here; a subprocess, as they must be set before TensorFlow starts."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", TRACE_UNDER_ANOTHER_DEVICE], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['/job:localhost/replica:0/task:0/device:CPU:0']"


def test_tf_workload_from_graph__needs_a_keras_spec():
    with pytest.raises(PlacerError, match="cannot be rebuilt"):
        tf_workload_from_graph(synthetic_graph(10, 0))


def test_profile_tf__times_from_run_metadata_for_the_ops_that_ran(graph, measurer):
    from measurers.profiler import profile_tf

    profile = profile_tf(graph, measurer.machine, runs=2, warmup=0, measurer=measurer)
    named = set(graph.op_names.tolist())
    assert set(profile.device_models) == {"test-cpu"} and len(profile.op_names) > 0.5 * graph.num_ops
    assert set(profile.op_names) <= named and (profile.time_s >= 0).all()
    assert not {graph.op_names[i] for i, k in enumerate(graph.op_kinds) if k in ("Variable", "Input")} & set(
        profile.op_names)
    # nanoseconds, not microseconds (which rounded a third of a small graph's ops down to 0 s): one run's
    # times are not all whole microseconds
    once = profile_tf(graph, measurer.machine, runs=1, warmup=0, measurer=measurer).time_s * 1e6
    assert np.any(np.abs(once - np.round(once)) > 1e-3)


def gpu_like_metadata(node: str, other: str):
    """A RunMetadata as a GPU's trace has it: the executor's record of ``node`` (3 us, until its kernels were
    queued) and ``other`` (2 us, no kernel), and ``node``'s two kernels (100 and 50 us) in the tracer's
    ``stream:all`` record, again per stream, named ``op_name:op_type`` (TensorFlow's xplane_to_step_stats.cc)."""
    metadata = tf.compat.v1.RunMetadata()

    def device(name: str, nodes: list[tuple[str, int]]) -> None:
        stats = metadata.step_stats.dev_stats.add(device=name)
        for node_name, micros in nodes:
            stats.node_stats.add(node_name=node_name, op_end_rel_micros=micros, all_end_rel_micros=micros)

    device("/job:localhost/replica:0/task:0/device:GPU:0", [(node, 3), (other, 2)])
    device("/device:GPU:0/stream:all", [(f"{node}:MatMul", 100), (f"{node}:MatMul", 50)])
    device("/device:GPU:0/stream:7", [(f"{node}:MatMul", 100), (f"{node}:MatMul", 50)])
    device("/device:GPU:0/memcpy", [("MemcpyHtoD", 9)])
    return metadata


def test_run_node_times_s__a_gpu_nodes_time_is_its_kernels_not_until_they_were_queued():
    times = run_node_times_s(gpu_like_metadata("dense/MatMul", "dense/Shape").step_stats)
    assert times == pytest.approx({"dense/MatMul": 150e-6, "dense/Shape": 2e-6})


def test_profile_tf__times_a_gpu_op_by_its_kernels(graph, measurer, monkeypatch):
    """profile_tf read a GPU node's executor record, which ends once its kernels are queued: 3 us here for
    kernels that ran 150 us."""
    from measurers.profiler import profile_tf

    traced = measurer.traced()
    matmul = next(op for op in range(graph.num_ops) if graph.op_kinds[op] == "MatMul")
    other = next(op for op in range(graph.num_ops) if graph.op_kinds[op] not in ("MatMul", "Variable", "Input"))
    metadata = gpu_like_metadata(traced.node_of_op[matmul], traced.node_of_op[other])
    real_step = PlacedSession.step
    monkeypatch.setattr(PlacedSession, "step", lambda self, trace=False: metadata if trace else real_step(self))
    profile = profile_tf(graph, measurer.machine, runs=2, warmup=0, measurer=measurer)
    times = dict(zip(profile.op_names.tolist(), profile.time_s.tolist()))
    assert times == pytest.approx({graph.op_names[matmul]: 150e-6, graph.op_names[other]: 2e-6})


@pytest.mark.slow
def test_tf_measurer__rebuilds_a_builtin_keras_benchmark_from_its_saved_graph(tmp_path):
    """A built-in Keras benchmark (ResNet-50, shrunk) keeps its step function in the graph file's meta, so
    the TensorFlow measurer runs it placed over three devices."""
    from graphs.benchmarks.keras_models import build_resnet50
    from graphs.io import load_graph_file, save_graph

    path = tmp_path / "resnet.parquet"
    save_graph(build_resnet50(batch_size=2, image_size=32, num_classes=10), path)
    graph = load_graph_file(path)
    assert graph.meta["keras_step"]["kwargs"]["image_size"] == 32
    measurer = TFMeasurer(graph, three_cpus(), runs=1, warmup=0)
    placement = group_placement(graph, seed=0)
    result = measurer.measure([placement])[0]
    assert result.status == "ok" and result.runtime_s > 0, result.error
    assert len(set(measurer.traced().effective_placement(placement).tolist())) == 3


def test_tf_measurer__a_gpu_tensorflow_cannot_see_is_refused_not_soft_placed_on_the_cpu(graph):
    from measurers.profiler import profile_tf

    cpu, gpu = three_cpus().devices[0], Device("gpu:0", "gpu", "test-gpu", 1e12, 1e11, 2**30, 1e-6)
    machine = Machine("cpu-gpu", (cpu, gpu), (Link("cpu:0", "gpu:0", 1e9, 1e-6, "pcie"),
                                              Link("gpu:0", "cpu:0", 1e9, 1e-6, "pcie")))
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this TensorFlow sees a GPU")
    measurer = TFMeasurer(graph, machine, runs=1, warmup=0)
    with pytest.raises(PlacerError, match="1 GPUs but TensorFlow sees only 0"):
        measurer.check_ready()
    on_gpu = measurer.measure([np.ones(graph.num_ops, dtype=np.int64)])[0]
    assert on_gpu.status == "error" and "TensorFlow sees only 0" in on_gpu.error
    with pytest.raises(PlacerError, match="TensorFlow sees only 0"):
        profile_tf(graph, machine, runs=1, warmup=0, measurer=measurer)


def test_device_counts__machine_devices_sharing_a_tensorflow_device_need_it_once():
    """Both GPUs of a machine mapped to /device:GPU:0 (a box with one GPU) need one GPU, not two; a
    Session makes CPUs up to the highest index used."""
    from measurers.tf.measurer import check_tf_sees_gpus, device_counts

    assert device_counts(["/device:CPU:0", "/device:GPU:0", "/device:GPU:0"]) == {"CPU": 1, "GPU": 1}
    assert device_counts(["/device:CPU:2", "/device:CPU:2"]) == {"CPU": 3, "GPU": 0}
    assert device_counts(["/device:GPU:1"]) == {"CPU": 1, "GPU": 2}
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(PlacerError, match="need 1 GPUs but TensorFlow sees only 0"):
            check_tf_sees_gpus(["/device:CPU:0", "/device:GPU:0", "/device:GPU:0"])


def test_tf_measurer__a_module_level_layer_after_clear_session_beside_another_model():
    """The measurer rebuilds a step after ``clear_session``, which restarts Keras's name counters but keeps a
    module spec's module-level layer, "dense": the function's own Dense was named "dense" too and Keras
    refused the model. Two models, each measured after the other's rebuild, in one process."""
    shared = import_keras_spec("fixtures.keras_shared_layer:build", batch_size=2)
    for graph in (shared, import_keras_spec(SPEC), shared):
        [result] = TFMeasurer(graph, three_cpus(), runs=1, warmup=0).measure([np.zeros(graph.num_ops, np.int64)])
        assert result.status == "ok", result.error


def test_tf_measurer__a_mixed_precision_model_steps_placed_as_on_one_device():
    """A "mixed_float16" Keras model (float16 compute; the optimizer's update inside the loss scale's
    ``cond``) runs placed over three devices: every op that runs runs where it was placed, the update's
    included (they ran wherever TensorFlow put the lowered branch), and the steps give one device's losses,
    which fall as the loss-scaled updates land."""
    mixed = import_keras_spec("tests/fixtures/tiny_models.py:tiny_keras_mixed_precision_classifier", batch_size=4)
    measurer = TFMeasurer(mixed, three_cpus(), runs=1, warmup=0)
    traced, devices = measurer.traced(), tf_device_names(measurer.machine)
    spread = traced.effective_placement(group_placement(mixed, seed=7))
    losses = []
    for placement in (np.zeros(mixed.num_ops, dtype=np.int64), spread):
        with PlacedSession(traced, [devices[d] for d in placement], devices) as session:
            ran = where_nodes_ran(session.step(trace=True))
            losses.append([float(np.sum(session.step())) for _ in range(3)])
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)  # float16 compute: orders of summation may differ
    assert losses[0][2] < losses[0][0]
    ran = {traced.node_of_run(node): device for node, device in ran.items()}  # cond/then/_0/X: cond/<fn>/X
    placed = {node: devices[spread[op]].replace("/device:", "device:") for op, node in enumerate(traced.node_of_op)}
    checked = [node for node in placed if node in ran]
    assert sum(node.startswith("cond/") for node in checked) >= 50
    assert [(node, ran[node]) for node in checked if not ran[node].endswith(placed[node])] == []
    assert all(result.status == "ok" for result in measurer.measure([spread, spread]))


def test_tf_measurer__a_model_whose_lstm_was_built_rolled_runs_the_unrolled_step_it_was_imported_as():
    """An LSTM built with unroll=False is imported unrolled (graphs.tf.recurrent); the measurer rebuilds that
    very step (no while loop, the graph's op names), and it runs placed over three devices as on one."""
    graph = import_keras_spec("tests/fixtures/tiny_models.py:tiny_keras_lstm_classifier", batch_size=4)
    measurer = TFMeasurer(graph, three_cpus(), runs=1, warmup=0)
    traced, devices = measurer.traced(), tf_device_names(measurer.machine)
    assert list(traced.graph.op_names) == list(graph.op_names)
    assert not {op.type for op in traced.concrete.graph.get_operations()} & {"While", "StatelessWhile"}
    spread = traced.effective_placement(group_placement(graph, seed=3))
    assert len(set(spread.tolist())) == 3
    losses = []
    for placement in (np.zeros(graph.num_ops, dtype=np.int64), spread):
        with PlacedSession(traced, [devices[d] for d in placement], devices) as session:
            ran = where_nodes_ran(session.step(trace=True))
            losses.append([float(np.sum(session.step())) for _ in range(3)])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[0][2] != losses[0][0]
    placed = {node: devices[spread[op]].replace("/device:", "device:") for op, node in enumerate(traced.node_of_op)}
    checked = [node for node in placed if node in ran]
    assert len(checked) >= 0.9 * graph.num_ops  # all but the fed inputs
    assert [(node, ran[node]) for node in checked if not ran[node].endswith(placed[node])] == []
    [result] = measurer.measure([spread])
    assert result.status == "ok", result.error


def test_profile_tf__times_the_ops_inside_a_mixed_precision_steps_cond():
    """The optimizer's update runs inside the loss scale's lowered ``cond`` as ``cond/then/_0/...``; the
    profile matched step stats to the measurer's names (``cond/<then function>/...``; the importer's are
    ``cond/then/...``) and left them out."""
    from measurers.profiler import profile_tf

    mixed = import_keras_spec("tests/fixtures/tiny_models.py:tiny_keras_mixed_precision_classifier", batch_size=4)
    profile = profile_tf(mixed, three_cpus(), runs=1, warmup=0)
    # the branch that runs when the gradients are finite, less the scale's own nested cond (it runs rarely)
    in_update = {name for name, kind in zip(mixed.op_names, mixed.op_kinds) if name.split("/")[1:2] == ["then"]
                 and not {"then", "else"} & set(name.split("/")[2:])
                 and kind in ("Mul", "Sub", "AssignSubVariableOp", "Sqrt")}
    assert len(in_update) >= 10 and in_update <= set(profile.op_names)


def test_profile_tf__times_the_ops_inside_a_steps_function_calls_which_run_where_placed():
    """A layer calling ``tf.function``s: TensorFlow inlines the calls (the Session's own function inlining,
    grappler being off), so their ops and their gradients' run under the importer's names
    (``<call>/Relu``), on their placed devices. Before, the calls ran through the function runtime, whose
    step stats name the ops ``Relu``, and the profile left them out without a word."""
    from measurers.profiler import profile_tf

    calls = import_keras_spec("tests/fixtures/tiny_models.py:tiny_keras_calls")
    inner = {name for name in calls.op_names if "PartitionedCall" in name}
    assert len(inner) >= 20 and any(name.startswith("PartitionedCall") for name in inner)  # gradients' calls too
    profile = profile_tf(calls, three_cpus(), runs=1, warmup=0)
    assert inner <= set(profile.op_names) and profile.untimed == ()
    measurer = TFMeasurer(calls, three_cpus(), runs=1, warmup=0)
    traced, devices = measurer.traced(), tf_device_names(measurer.machine)
    spread = traced.effective_placement(group_placement(calls, seed=3))
    with PlacedSession(traced, [devices[d] for d in spread], devices) as session:
        ran = {traced.node_of_run(node): device for node, device in where_nodes_ran(session.step(trace=True)).items()}
    placed = {node: devices[spread[op]].replace("/device:", "device:") for op, node in enumerate(traced.node_of_op)}
    assert len({placed[node] for node in inner}) == 3 and inner <= set(ran)
    assert [(node, ran[node]) for node in inner if not ran[node].endswith(placed[node])] == []


def test_profile_tf__an_uninlined_calls_ops_are_timed_where_their_names_tell_them_apart_and_listed_where_not():
    """Functions marked ``_noinline`` run through TensorFlow's function runtime: the step stats name their
    ops within the function alone. ``spread`` (called once) has ``Sigmoid`` and ``Square``, which nothing
    else is named: timed. The two calls of ``squash`` share ``Relu`` and the others; ``spread``'s ``Add``
    shares its name with a top-level op's (Adam's): none of these is timed (the loss's
    ``Square``, top-level before its ops had the loss's scope, took both ops' times), and each is listed in
    ``untimed``."""
    from measurers.profiler import profile_tf

    calls = import_keras_spec("tests/fixtures/tiny_models.py:tiny_keras_uninlined_calls")
    profile = profile_tf(calls, three_cpus(), runs=1, warmup=0)
    timed, untimed = set(profile.op_names), set(profile.untimed)
    squash = {name for name in calls.op_names if "/PartitionedCall/" in name or "/PartitionedCall_1/" in name}
    assert len(squash) == 6 and squash <= untimed and not squash & timed
    spread = {name for name in calls.op_names if "calls_1/PartitionedCall_2/" in name}
    assert {n.rsplit("/", 1)[1] for n in spread & timed} == {"Sigmoid", "Square"}
    assert {next(n for n in spread if n.endswith("/Add")), "Add"} <= untimed and "Add" not in timed
    assert not timed & untimed and len(timed) > 0.5 * calls.num_ops


def test_placed_graph_def__an_identity_of_a_calls_output_runs_where_the_callee_made_it():
    """A layer returns ``tf.identity`` of a ``tf.function``'s result. The identity (no op of the graph: the
    importer collapses it) follows its input: that was the call node, which follows the call's own input,
    so the identity was placed where the layer before runs, not where ``squash`` makes its value."""
    import keras

    from measurers.tf.measurer import placed_graph_def
    from measurers.tf.workload import trace_model_step

    @tf.function(autograph=False)
    def squash(x):
        return tf.nn.relu(x * 2.0)

    class Squash(keras.layers.Layer):
        def call(self, x):
            return tf.identity(squash(x))

    features = keras.Input((8,))
    model = keras.Model(features, keras.layers.Dense(2)(Squash(name="sq")(keras.layers.Dense(8)(features))))
    traced = trace_model_step(model, np.zeros((4, 8), np.float32), np.zeros((4, 2), np.float32))
    devices = ["/device:CPU:1" if "sq_1/" in node else "/device:CPU:0" for node in traced.node_of_op]
    graph_def, _ = placed_graph_def(traced, devices)
    identity = next(node for node in graph_def.node if node.op == "Identity" and "sq_1/" in node.name)
    assert identity.input[0].startswith("functional") and "PartitionedCall" in identity.input[0]
    assert identity.device == "/device:CPU:1"


@pytest.mark.parametrize("meta, words", [({"keras_step": {"function": 5}}, r"meta\['keras_step'\] is .*not a step"),
                                         ({"keras_step": {"function": "f", "kwargs": [1]}}, "not a step"),
                                         ({"keras_spec": 7}, r"meta\['keras_spec'\] is 7, not a spec")])
def test_tf_workload__a_step_named_by_values_of_other_types_is_named(meta, words):
    """A hand-edited graph file's metadata: `placer profile` said the step failed (an AttributeError)."""
    from dataclasses import replace

    with pytest.raises(PlacerError, match=words):
        tf_workload_from_graph(replace(synthetic_graph(10), meta=meta))
