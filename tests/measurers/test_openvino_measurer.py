"""The OpenVINO measurer: HETERO affinities honoured (a split makes submodels, outputs unchanged), timing
rules, statuses, clear errors for missing devices and bad model files, the factory kind, the GPU check."""

import os
import statistics

import numpy as np
import pytest

ov = pytest.importorskip("openvino")

from graphs.errors import PlacerError  # noqa: E402
from graphs.opgraph import OpGraph  # noqa: E402
from graphs.synthetic import synthetic_graph  # noqa: E402
from measurers.factory import MeasurerSpec, build_measurer  # noqa: E402
from measurers.machine import Device, Link, Machine  # noqa: E402
from measurers.openvino.affinity import match_ops, node_devices  # noqa: E402
from measurers.openvino.check import SKIP_LINE, gpu_check_openvino, split_check  # noqa: E402
from measurers.openvino.devices import openvino_machine  # noqa: E402
from measurers.openvino.measurer import OpenVinoMeasurer  # noqa: E402
from measurers.openvino.sample import save_sample_model  # noqa: E402
from measurers.timing import INFERENCE_TIMING, default_timing  # noqa: E402

OPS = ["conv", "relu", "flat", "logits"]  # the sample model's ops, in order; a chain


OUT_BYTES = [1024, 1024, 1024, 20]  # the sample model's: (1, 4, 8, 8), (1, 4, 8, 8), (1, 256), (1, 5) in fp32
READ_BYTES = [768 + 432, 1024, 1024 + 16, 1024 + 5120]  # inputs and weights (the input x (1, 3, 8, 8), kernel, ...)


def graph_of(model_file, ops=OPS) -> OpGraph:
    """The sample model's op graph written out by hand: op names are the model's friendly names, and its sizes
    the model's (the measurer compares them)."""
    n = len(ops)
    out_bytes = np.array(OUT_BYTES[:n])
    return OpGraph(name="ov-sample", framework="openvino", op_names=np.array(ops, object),
                   op_kinds=np.array(["Convolution", "Relu", "Reshape", "MatMul"][:n], object),
                   flops=np.zeros(n), bytes_accessed=out_bytes + READ_BYTES[:n], out_bytes=out_bytes,
                   param_bytes=np.zeros(n, np.int64), edge_src=np.arange(n - 1), edge_dst=np.arange(1, n),
                   edge_bytes=np.full(n - 1, 1024), batch_size=1, meta={"model_file": str(model_file)})


def machine_of(kinds) -> Machine:
    devices = tuple(Device(f"{kind}:{i}", kind, "test", 1e11, 1e10, 2**30, 1e-6) for i, kind in enumerate(kinds))
    links = tuple(Link(a.name, b.name, 1e9, 1e-6, f"{a.name}>{b.name}") for a in devices for b in devices if a != b)
    return Machine("test-" + "-".join(kinds), devices, links)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return save_sample_model(tmp_path_factory.mktemp("ov"))


@pytest.fixture(scope="module")
def two_core():
    """A core with a second OpenVINO device, ``CPUB``: the CPU plugin registered again under another name
    (OpenVINO requires the name to contain the plugin's, ``CPU``), so a split is real HETERO work here."""
    core = ov.Core()
    core.register_plugin(os.path.join(os.path.dirname(ov.__file__), "libs", "libopenvino_intel_cpu_plugin.so"),
                         "CPUB")
    return core


def test_all_cpu_placement__ok_with_the_median_of_the_timed_runs(model_file):
    graph = graph_of(model_file)
    calls = []

    def clock():
        calls.append(1)
        return float(len(calls)) ** 2  # each sample longer than the one before

    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=3, warmup=2, clock=clock)
    [m] = measurer.measure([np.zeros(graph.num_ops, np.int64)])
    assert m.ok and m.error == "" and m.peak_bytes == (0,)
    assert len(calls) == 1 + 2 * (2 + 3)  # start, then a bracket around every warm-up and timed run
    assert len(m.samples_s) == 3 and m.runtime_s == statistics.median(m.samples_s) and m.runtime_s > 0
    assert m.samples_s[0] < m.samples_s[1] < m.samples_s[2]  # the timed runs are the last three, in order


def test_real_clock__positive_runtime_one_measurement_per_placement(model_file):
    graph = graph_of(model_file)
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=3, warmup=1)
    found = measurer.measure([np.zeros(graph.num_ops, np.int64)] * 2)
    assert len(found) == 2 and all(m.ok and 0 < m.runtime_s < 1 and len(m.samples_s) == 3 for m in found)


def test_outputs_with_affinities__equal_the_plain_cpu_compile(model_file):
    graph = graph_of(model_file)
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=1, warmup=0, seed=4)
    placement = np.zeros(graph.num_ops, np.int64)
    assert measurer.compile_for(placement).get_property("HETERO_NUMBER_OF_SUBMODELS") == 1
    assert str(measurer.core.get_property("CPU", "INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"  # not bf16
    plain = ov.Core().compile_model(str(model_file), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    expected = plain(measurer.inputs)[plain.outputs[0]]
    [got] = measurer.infer_once(placement)
    assert got.shape == (1, 5) and np.abs(got).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_split_over_two_openvino_devices__submodels_and_same_outputs(model_file, two_core):
    graph = graph_of(model_file)
    measurer = OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), runs=2, warmup=1, core=two_core,
                                ov_devices=["CPU", "CPUB"])
    alone, middle, halves = np.zeros(4, np.int64), np.array([0, 1, 1, 0]), np.array([1, 1, 0, 0])
    counts = [measurer.compile_for(p).get_property("HETERO_NUMBER_OF_SUBMODELS") for p in (alone, middle, halves)]
    assert counts == [1, 3, 2]  # one submodel per connected same-device region: the affinities are honoured
    assert measurer.compile_for(middle).get_property("EXECUTION_DEVICES") == ["CPU", "CPUB"]
    reference = measurer.infer_once(alone)[0]
    for placement in (middle, halves):
        np.testing.assert_allclose(measurer.infer_once(placement)[0], reference, rtol=1e-5, atol=1e-5)
    assert all(m.ok for m in measurer.measure([middle, halves]))


def test_node_devices__non_ops_take_a_neighbour_ops_device(model_file):
    graph = graph_of(model_file)
    model = ov.Core().read_model(str(model_file))
    matched = match_ops(model, graph, str(model_file))
    devices = node_devices(model, matched, np.array([1, 0, 0, 1]), ["CPU", "CPUB"])
    by_name = {n.get_friendly_name(): devices[n.get_name()] for n in model.get_ordered_ops()}
    assert by_name["conv"] == "CPUB" and by_name["relu"] == by_name["flat"] == "CPU" and by_name["logits"] == "CPUB"
    assert by_name["x"] == by_name["kernel"] == "CPUB"  # input and weights where the convolution reads them
    assert by_name["flat_shape"] == "CPU" and by_name["dense"] == "CPUB"  # constants with their consumer
    assert by_name["out"] == "CPUB"  # the result with its producer


def test_node_ops__a_weight_a_shapeof_reads_first_is_the_op_that_computes_with_its(tmp_path):
    """An IR resized to the graph's input sizes gets a ShapeOf that reads a weight before its MatMul does: the
    weight (and its Constant) took the ShapeOf's device, while the importer gives its bytes to the MatMul."""
    from openvino import opset13 as ops

    from measurers.openvino.affinity import node_ops

    x = ops.parameter([4, 8], np.float32, name="x")
    weight = ops.constant(np.ones((8, 3), np.float32), name="fc.weight")
    # OpenVINO lists a value's readers in no fixed order: with twelve ShapeOfs, one came first almost always
    shapes = [ops.shape_of(weight, name=f"ShapeOf_{k}") for k in range(12)]
    matmul = ops.matmul(x, weight, False, False, name="fc")
    model = ov.Model([matmul, *shapes], [x], "shape-first")
    owner = node_ops(model, {**{shape.get_name(): 0 for shape in shapes}, matmul.get_name(): 1})
    assert owner[weight.get_name()] == 1


def test_device_the_runtime_lacks__placer_error_naming_it(model_file):
    graph = graph_of(model_file)
    with pytest.raises(PlacerError, match=r"device 'gpu:1' needs OpenVINO device 'GPU.0', which this runtime lacks"):
        OpenVinoMeasurer(graph, machine_of(["cpu", "gpu"]))
    with pytest.raises(PlacerError, match=r"'cpu:1' needs OpenVINO device 'NPU9'"):
        OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), ov_devices=["CPU", "NPU9"])
    with pytest.raises(PlacerError, match=r"has 2 devices but 1 OpenVINO device names"):
        OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), ov_devices=["CPU"])


def test_missing_or_damaged_model__placer_error(model_file, tmp_path):
    with pytest.raises(PlacerError, match="does not exist"):
        OpenVinoMeasurer(graph_of(tmp_path / "gone.xml"), openvino_machine())
    damaged = tmp_path / "damaged.xml"
    damaged.write_text(model_file.read_text()[:200])  # cut off mid-file
    with pytest.raises(PlacerError, match=r"damaged.xml' cannot be read by OpenVINO: \w") as caught:
        OpenVinoMeasurer(graph_of(damaged), openvino_machine())
    assert "src/" not in str(caught.value)  # OpenVINO's C++ source locations left out
    unnamed = graph_of(model_file)
    unnamed.meta.pop("model_file")
    with pytest.raises(PlacerError, match="names no model file"):
        OpenVinoMeasurer(unnamed, openvino_machine())
    with pytest.raises(PlacerError, match="'softmax'"):
        OpenVinoMeasurer(graph_of(model_file, OPS[:3] + ["softmax"]), openvino_machine())


class FailingCore:
    """An OpenVINO core whose compile fails with ``message`` (how an out-of-memory GPU answers)."""

    def __init__(self, core, message: str):
        self.core, self.message = core, message

    def compile_model(self, *args, **kwargs):
        raise RuntimeError(f"Exception from src/plugins/intel_gpu/src/x.cpp:1:\n{self.message}\n")

    def __getattr__(self, name):
        return getattr(self.core, name)


def test_statuses__failures_are_measurements_never_exceptions(model_file):
    graph = graph_of(model_file)
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=1, warmup=0)
    zeros = np.zeros(graph.num_ops, np.int64)
    short, outside = measurer.measure([zeros[:2], zeros + 3])
    assert short.status == outside.status == "error" and "shape" in short.error and "devices 0..0" in outside.error
    measurer.core = FailingCore(measurer.core, "[GPU] out of memory: CL_OUT_OF_RESOURCES")
    [oom] = measurer.measure([zeros])
    assert oom.status == "oom" and "src/plugins" not in oom.error and "out of memory" in oom.error
    measurer.core = FailingCore(measurer.core.core, "unsupported layer")
    [error] = measurer.measure([zeros])
    assert error.status == "error" and error.error == "RuntimeError: unsupported layer"
    assert error.runtime_s == float("inf") and error.samples_s == ()


def test_timeout__past_the_limit(model_file):
    graph = graph_of(model_file)
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=5, warmup=5, timeout_s=2.5, clock=clock)
    [m] = measurer.measure([np.zeros(graph.num_ops, np.int64)])
    assert m.status == "timeout" and "time limit" in m.error


def test_timeout__compiling_counts_toward_the_limit(model_file):
    """The limit counted the runs alone, where the pool calls timeout any placement whose whole measurement
    (compiling the HETERO model included) is past it."""
    graph = graph_of(model_file)
    now = [0.0]

    def clock():
        now[0] += 0.01  # each run 0.01 s
        return now[0]

    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=2, warmup=1, timeout_s=5.0, clock=clock)
    compile_request = measurer._request

    def slow_compile(placement):
        now[0] += 100.0
        return compile_request(placement)

    measurer._request = slow_compile
    [m] = measurer.measure([np.zeros(graph.num_ops, np.int64)])
    assert m.status == "timeout" and "time limit" in m.error


def save_tiny_onnx(path):
    """Conv -> Relu -> Flatten -> MatMul; OpenVINO reads the last node under its output's name ``y``."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
               numpy_helper.from_array(rng.standard_normal((256, 5)).astype(np.float32), "M")]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"), helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "M"], ["y"], name="logits")]
    body = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], weights)
    onnx.save(helper.make_model(body, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_a_bfloat16_input_is_fed_as_bfloat16(tmp_path):
    """numpy has no bfloat16: the random input went in as float16, which OpenVINO refused ("Failed to set tensor
    for input with precision: f16"): every placement of such a model an error, `profile` impossible."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from graphs.inference.onnx_import import import_onnx

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "W")
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["xf", "W"], ["y"], name="mm")]
    body = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 8])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [weight])
    onnx.save(helper.make_model(body, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "bf16.onnx"))
    graph = import_onnx(str(tmp_path / "bf16.onnx"))
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=2, warmup=1)
    [m] = measurer.measure([np.zeros(graph.num_ops, np.int64)])
    assert m.ok, m.error
    (bits,) = measurer.inputs  # a bf16 is the high half of a float32: the input is the weights' left factor
    x = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(measurer.infer_once(np.zeros(graph.num_ops, np.int64))[0],
                               x @ numpy_helper.to_array(weight), rtol=1e-5, atol=1e-5)


def test_onnx_import__ops_matched_through_their_tensors_and_split(tmp_path, two_core):
    from graphs.inference.onnx_import import import_onnx

    path = save_tiny_onnx(tmp_path / "tiny.onnx")
    graph = import_onnx(str(path))
    assert graph.op_names.tolist() == OPS  # ONNX node names; OpenVINO calls the MatMul "y"
    measurer = OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), runs=2, warmup=1, core=two_core,
                                ov_devices=["CPU", "CPUB"])
    split = np.array([0, 0, 1, 1])
    assert measurer.compile_for(split).get_property("HETERO_NUMBER_OF_SUBMODELS") == 2
    np.testing.assert_allclose(measurer.infer_once(split)[0], measurer.infer_once(np.zeros(4, np.int64))[0],
                               rtol=1e-5, atol=1e-5)
    [m] = measurer.measure([split])
    assert m.ok and m.runtime_s > 0


def test_openvino_import__measured_as_imported(model_file, two_core):
    from graphs.inference.openvino_import import import_openvino_ir

    graph = import_openvino_ir(str(model_file))
    assert graph.op_names.tolist() == OPS and graph.meta["model_file"] == str(model_file)
    measurer = OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), runs=2, warmup=1, core=two_core,
                                ov_devices=["CPU", "CPUB"])
    assert all(m.ok for m in measurer.measure([np.zeros(4, np.int64), np.array([1, 0, 1, 0])]))


def test_openvino_import__an_fp16_compressed_ir_measured_and_timed_as_imported(tmp_path, two_core):
    """``ov.save_model``'s default stores the weights as float16, each behind a decompression Convert that is
    no op of the graph: the ops are the uncompressed IR's, and a split places and times each of them."""
    from graphs.inference.openvino_import import import_openvino_ir

    plain = save_sample_model(tmp_path)
    model_file = tmp_path / "fp16.xml"
    ov.save_model(ov.Core().read_model(str(plain)), str(model_file), compress_to_fp16=True)
    graph = import_openvino_ir(str(model_file))
    assert graph.op_names.tolist() == OPS
    measurer = OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), runs=2, warmup=1, core=two_core,
                                ov_devices=["CPU", "CPUB"])
    assert all(m.ok for m in measurer.measure([np.zeros(4, np.int64), np.array([1, 0, 1, 0])]))
    times = measurer.op_times_s(np.array([0, 0, 1, 1]))
    assert sorted(times) == [0, 1, 2, 3] and times[0] > 0 and times[3] > 0


def test_factory__openvino_kind_with_its_default_timing(model_file):
    graph = graph_of(model_file)
    measurer = build_measurer(MeasurerSpec("openvino", graph, openvino_machine()))
    assert isinstance(measurer, OpenVinoMeasurer)
    assert default_timing("openvino") == INFERENCE_TIMING
    assert (measurer.settings.runs, measurer.settings.warmup) == (INFERENCE_TIMING.runs, INFERENCE_TIMING.warmup)
    assert openvino_machine().meta["openvino_devices"].split(",")[0] == "CPU"


def test_gpu_check__skips_without_an_openvino_gpu_and_reports_a_split(two_core):
    if any(name.startswith("GPU") for name in ov.Core().available_devices):
        pytest.skip("this node has an OpenVINO GPU; the check runs for real in tests/gpu_check.py")
    assert gpu_check_openvino() == SKIP_LINE
    line = split_check(two_core, machine_of(["cpu", "cpu"]), 1, ov_devices=["CPU", "CPUB"], runs=2, warmup=1)
    assert line.startswith("openvino CPUB (") and "split submodels 2" in line and " ms" in line


def test_op_times__from_performance_counters_fused_ops_zero_and_a_split_times_both_sides(model_file, two_core):
    """Every op of the sample model gets a time: the convolution runs a kernel of tens of microseconds (the
    matmul's, a microsecond or two, can come out 0 in the counters' whole microseconds); the CPU plugin fuses
    relu into the convolution, so relu's own time is 0 s. Split over two devices, the second device's ops are
    timed too (HETERO names their nodes "subgraph1: ...")."""
    graph = graph_of(model_file)
    measurer = OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), runs=3, warmup=1, core=two_core,
                                ov_devices=["CPU", "CPUB"])
    times = measurer.op_times_s(np.zeros(4, np.int64))
    assert sorted(times) == [0, 1, 2, 3]
    assert times[0] > 0 and times[3] >= 0 and times[1] == 0.0
    split = measurer.op_times_s(np.array([1, 1, 0, 0]))  # the convolution on the second device
    assert sorted(split) == [0, 1, 2, 3] and split[0] > 0 and split[3] >= 0
    with pytest.raises(PlacerError, match="placement"):
        measurer.op_times_s(np.zeros(3, np.int64))


class RunningMeanCounters:
    """An infer request whose performance counters are the CPU plugin's: each node's running mean since the
    model compiled, in whole microseconds; one inference takes ``times_us`` in turn (then the last again)."""

    def __init__(self, node_names, times_us):
        from datetime import timedelta

        self.node_names, self.times_us, self.done, self.timedelta = node_names, times_us, [], timedelta

    def infer(self):
        self.done.append(self.times_us[min(len(self.done), len(self.times_us) - 1)])

    def get_profiling_info(self):
        from types import SimpleNamespace

        mean_us = sum(self.done) // len(self.done)
        return [SimpleNamespace(node_name=name, real_time=self.timedelta(microseconds=mean_us))
                for name in self.node_names]

    def get_compiled_model(self):  # whose runtime graph has no node merged of several
        from types import SimpleNamespace

        return SimpleNamespace(get_runtime_model=lambda: SimpleNamespace(get_ordered_ops=lambda: []))


def test_op_times__the_timed_runs_mean_not_the_running_means_of_the_cold_first_runs(model_file, two_core,
                                                                                 monkeypatch):
    """A first inference of 500 us, then 20 us each: the counters read 500, 260, 180, 140, 116. Their median
    over the timed runs was 160 us, 8x the op's time (a reviewer's small model: op times summing to 20x its
    measured step)."""
    from measurers.openvino.affinity import node_ops

    graph = graph_of(model_file)
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=4, warmup=1, core=two_core)
    owner = node_ops(measurer.model, measurer.matched)
    one_node_each = {owner[node.get_name()]: node.get_friendly_name() for node in measurer.model.get_ops()
                     if node.get_name() in owner}
    request = RunningMeanCounters(list(one_node_each.values()), [500, 20])
    monkeypatch.setattr(measurer, "_request", lambda placement, config=None: request)
    times = measurer.op_times_s(np.zeros(graph.num_ops, np.int64))
    assert len(request.done) == 5
    assert {op: round(t * 1e6, 6) for op, t in times.items()} == {op: 20.0 for op in one_node_each}


def test_profile_cli__openvino_profile_names_every_op_and_feeds_the_simulator(model_file, tmp_path, capsys):
    import json

    from cluster.cli import main
    from graphs.inference.openvino_import import import_openvino_ir
    from graphs.io import save_graph
    from measurers.sim.costs import load_profile

    graph_file = tmp_path / "sample.parquet"
    save_graph(import_openvino_ir(str(model_file)), graph_file)
    out = tmp_path / "ov-profile.json"
    assert main(["profile", "--graph", str(graph_file), "--machine", "openvino", "--measurer", "openvino",
                 "--runs", "3", "-o", str(out)]) == 0
    profile = load_profile(out)
    assert sorted(profile.op_names) == sorted(OPS)
    assert set(profile.device_models) == {openvino_machine().devices[0].model}
    capsys.readouterr()
    common = ["simulate", "--graph", str(graph_file), "--machine", "openvino", "--policy", "device:0", "--json"]
    assert main([*common, "--profile", str(out)]) == 0
    # a chain on one device: the simulated step is the sum of the profiled op times
    assert json.loads(capsys.readouterr().out)["runtime_s"] == pytest.approx(float(profile.time_s.sum()), rel=1e-6)


def save_onnx(path, nodes, weights, x_shape, y_shape):
    """An opset-13 model of ``nodes`` from input x to output y, with the named weight arrays."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    initializers = [numpy_helper.from_array(array, name) for name, array in weights.items()]
    body = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], initializers)
    onnx.save(helper.make_model(body, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_op_times__a_biased_onnx_conv_gets_the_time_of_the_convolution_openvino_split_off(tmp_path):
    """OpenVINO reads Conv(x, W, B) as "conv/WithoutBiases" (the convolution, what runs) and "conv" (the bias
    Add, fused into it): the convolution's time is the Conv op's, not 0 s."""
    from onnx import helper

    from graphs.inference.onnx_import import import_onnx

    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "B": np.ones(8, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = import_onnx(str(save_onnx(tmp_path / "biased.onnx", nodes, weights, [1, 3, 16, 16], [1, 8, 16, 16])))
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=2, warmup=1)
    times = measurer.op_times_s(np.zeros(2, np.int64))
    assert times[0] > 0 and times[1] == 0.0  # relu fused into the convolution


def test_op_times__a_convolution_run_with_its_batch_norm_merged_in_is_timed_not_dropped(tmp_path):
    """OpenVINO runs Conv -> BatchNormalization -> Relu as one Convolution node named after none of them
    ("Multiply_3717", its original nodes "Multiply_3717,/bn/BatchNormalization,/Relu"): the step's largest
    kernel went to no op, and the three ops took 0 s."""
    from onnx import helper

    from graphs.inference.onnx_import import import_onnx

    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "scale": np.ones(16, np.float32),
               "shift": np.zeros(16, np.float32), "mean": np.zeros(16, np.float32), "var": np.ones(16, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["y"], name="relu")]
    graph = import_onnx(str(save_onnx(tmp_path / "conv_bn.onnx", nodes, weights, [1, 3, 32, 32], [1, 16, 32, 32])))
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=3, warmup=1)
    times = measurer.op_times_s(np.zeros(graph.num_ops, np.int64))
    assert sum(times.values()) > 0


def test_onnx_identity_and_dropout__have_no_openvino_node_and_take_0_s_but_another_missing_op_is_an_error(tmp_path):
    """OpenVINO drops the Dropout and names the MatMul's node after it ("drop", tensor "c"): the ops that
    compute nothing follow their producer; a missing op that computes a tensor means a mismatched model file."""
    from onnx import helper

    from graphs.inference.onnx_import import import_onnx
    from measurers.openvino.onnx_ops import onnx_tensor_ops

    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("Identity", ["a"], ["b"], name="same"),
             helper.make_node("Dropout", ["b"], ["c"], name="drop"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    path = save_onnx(tmp_path / "ident.onnx", nodes, {"W": np.eye(4, dtype=np.float32)}, [1, 4], [1, 4])
    graph = import_onnx(str(path))
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=2, warmup=1)
    times = measurer.op_times_s(np.zeros(4, np.int64))
    assert times[0] > 0 and times[1] == times[2] == 0.0
    [m] = measurer.measure([np.zeros(4, np.int64)])
    assert m.ok
    direct = save_onnx(tmp_path / "drop.onnx", [nodes[0], helper.make_node("Dropout", ["a"], ["c"], name="drop"),
                                                 nodes[3]], {"W": np.eye(4, dtype=np.float32)}, [1, 4], [1, 4])
    by_drop = OpenVinoMeasurer(import_onnx(str(direct)), openvino_machine(), runs=1, warmup=0)  # MatMul named "drop"
    assert sorted(set(by_drop.matched.values())) == [0, 2]  # the MatMul's node is the MatMul's
    owning = {**onnx_tensor_ops(graph, str(path)), "phantom": 1}  # as if "same" computed a tensor of its own
    with pytest.raises(PlacerError, match="1 ops are not nodes of the model, e.g. 'same'"):
        match_ops(measurer.model, graph, str(path), owning)


@pytest.mark.parametrize("kind", ["Sum", "Max", "Min"])
def test_onnx_variadic_op_of_one_input__has_no_openvino_node_and_takes_0_s(tmp_path, kind):
    """A one-input Sum, Max or Min (valid ONNX) computes nothing: OpenVINO's reader leaves no node of it, and
    every measurement of the graph just imported from the file was refused ("1 ops are not nodes of the
    model, e.g. 'mid'")."""
    from onnx import helper

    from graphs.inference.onnx_import import import_onnx

    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node(kind, ["a"], ["b"], name="mid"),
             helper.make_node("MatMul", ["b", "W"], ["y"], name="mm2")]
    graph = import_onnx(str(save_onnx(tmp_path / "one.onnx", nodes, {"W": np.eye(4, dtype=np.float32)}, [1, 4],
                                      [1, 4])))
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=2, warmup=1)
    [m] = measurer.measure([np.zeros(3, np.int64)])
    assert m.ok and measurer.op_times_s(np.zeros(3, np.int64))[1] == 0.0


def test_onnx_shape_arithmetic_over_a_dynamic_axis__folded_at_the_imported_sizes_and_measured(tmp_path):
    """torch exports a batch-dynamic attention's reshapes with their targets computed from a tensor's shape (Shape,
    Gather, Unsqueeze, Concat); resized to the imported batch, OpenVINO folds those ops into constants, and
    every measurement was refused: "graph ... does not match model file ...: 46 ops are not nodes"."""
    import torch

    from graphs.inference.onnx_import import import_onnx

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.proj(x)
            heads = y.view(y.shape[0], 5, 2, 8).transpose(1, 2)  # (B, 2, 5, 8): the batch read from y's shape
            return (heads @ heads.transpose(2, 3)).softmax(-1).reshape(y.shape[0], -1)

    torch.manual_seed(0)
    path = tmp_path / "attention.onnx"
    torch.onnx.export(Heads().eval(), (torch.randn(1, 5, 16),), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    imported = import_onnx(str(path), input_shapes={"x": (2, 5, 16)})
    measurer = OpenVinoMeasurer(imported, openvino_machine(), runs=2, warmup=1)
    [m] = measurer.measure([np.zeros(imported.num_ops, np.int64)])
    assert m.ok, m.error
    folded = set(range(imported.num_ops)) - set(measurer.matched.values())
    assert folded and {imported.op_kinds[i] for i in folded} <= {"Shape", "Gather", "Unsqueeze", "Concat", "Slice",
                                                                "Reshape", "Mul", "Div", "Cast", "Sqrt"}
    assert sum(measurer.op_times_s(np.zeros(imported.num_ops, np.int64)).values()) > 0


def test_ir_shape_arithmetic_over_a_dynamic_batch__renamed_alike_at_import_and_in_the_measurer(tmp_path):
    """An IR whose batch is dynamic, its flatten's target read from a ShapeOf: sized at import, OpenVINO rebuilt the
    Gather and Concat under its counter names (Gather_108), another number in the measurer, which refused the
    graph: "2 ops are not nodes of the model, e.g. 'Gather_108'" (a review's finding, kept since stop 58)."""
    import openvino.opset13 as ops

    from graphs.inference.openvino_import import import_openvino_ir

    image = ops.parameter([-1, 4, 8, 8], np.float32, name="x")
    weights = ops.constant(np.random.default_rng(0).random((8, 4, 3, 3), np.float32), name="w")
    relu = ops.relu(ops.convolution(image, weights, [1, 1], [1, 1], [1, 1], [1, 1], name="conv"), name="relu")
    batch = ops.gather(ops.shape_of(relu, name="shape"), ops.constant(np.array([0], np.int64)),
                       ops.constant(np.array(0, np.int64)), name="batch")
    target = ops.concat([batch, ops.constant(np.array([-1], np.int64))], 0, name="target")
    flat = ops.reshape(relu, target, False, name="flat")
    out = ops.matmul(flat, ops.constant(np.ones((512, 5), np.float32), name="fc_w"), False, False, name="fc")
    path = tmp_path / "dynamic.xml"
    ov.save_model(ov.Model([ops.result(out, name="y")], [image], "dynamic"), str(path), compress_to_fp16=False)

    graph = import_openvino_ir(str(path), input_shapes={"x": (8, 4, 8, 8)})
    assert {"Gather_1", "Concat_1"} <= set(graph.op_names.tolist())  # the rebuilt nodes, numbered
    assert import_openvino_ir(str(path), input_shapes={"x": (8, 4, 8, 8)}).content_hash == graph.content_hash
    measurer = OpenVinoMeasurer(graph, openvino_machine(), runs=2, warmup=1)
    assert sorted(measurer.matched.values()) == list(range(graph.num_ops))  # every op a node
    [m] = measurer.measure([np.zeros(graph.num_ops, np.int64)])
    assert m.ok, m.error


def test_onnx_rank_0_input__measured_at_its_shape(tmp_path):
    """An If's condition, a rank-0 input, was handed to OpenVINO as shape (1,), which it refused: status error."""
    from onnx import TensorProto, helper

    from graphs.inference.onnx_import import import_onnx

    onnx = pytest.importorskip("onnx")
    value = helper.make_tensor_value_info
    branch = {name: helper.make_graph([helper.make_node(kind, ["x"], [name])], name, [],
                                      [value(name, TensorProto.FLOAT, [2, 6])])
              for name, kind in (("then", "Relu"), ("else", "Neg"))}
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch["then"], else_branch=branch["else"])]
    graph = helper.make_graph(nodes, "cond", [value("x", TensorProto.FLOAT, [2, 6]), value("c", TensorProto.BOOL, [])],
                              [value("y", TensorProto.FLOAT, [2, 6])])
    path = tmp_path / "cond.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    imported = import_onnx(str(path))
    [m] = OpenVinoMeasurer(imported, openvino_machine(), runs=2, warmup=1).measure([np.zeros(imported.num_ops,
                                                                                             np.int64)])
    assert m.ok, m.error


def test_onnx_constant_nodes__are_no_ops_and_their_openvino_constants_follow_their_readers(tmp_path, two_core):
    """Weights written as Constant nodes are weights of the ONNX graph, not ops (graphs.inference.onnx_constants):
    the graph's op i is the file's non-Constant node i, and OpenVINO's Constant of each lives with its
    reader."""
    from onnx import helper, numpy_helper

    from graphs.inference.onnx_import import import_onnx

    rng = np.random.default_rng(0)
    constants = {"W": rng.standard_normal((4, 6)).astype(np.float32),
                 "M": rng.standard_normal((6, 3)).astype(np.float32)}
    nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, f"{name}_value"),
                              name=f"{name}_const") for name, array in constants.items()]
    nodes += [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm1"),
              helper.make_node("Relu", ["a"], ["r"], name="relu"),
              helper.make_node("MatMul", ["r", "M"], ["y"], name="mm2")]
    graph = import_onnx(str(save_onnx(tmp_path / "constants.onnx", nodes, {}, [2, 4], [2, 3])))
    assert graph.op_names.tolist() == ["mm1", "relu", "mm2"]
    measurer = OpenVinoMeasurer(graph, machine_of(["cpu", "cpu"]), runs=1, warmup=0, core=two_core,
                                ov_devices=["CPU", "CPUB"])
    split = np.array([0, 0, 1])
    devices = node_devices(measurer.model, measurer.matched, split, ["CPU", "CPUB"])
    readers = {node.get_name(): [target.get_node().get_name() for target in node.output(0).get_target_inputs()]
               for node in measurer.model.get_ordered_ops() if node.get_type_name() == "Constant"}
    assert len(readers) == 2 and all(devices[name] == devices[reader[0]] for name, reader in readers.items())
    np.testing.assert_allclose(measurer.infer_once(split)[0], measurer.infer_once(np.zeros(3, np.int64))[0],
                               rtol=1e-5, atol=1e-5)


def test_ov_message__drops_a_failed_checks_source_line_inside_a_line_too():
    """A reshape the CPU plugin refuses puts the check after the node's name, mid-line: its condition and
    source line stayed in the error (a review)."""
    from measurers.openvino.inputs import ov_message

    error = RuntimeError("Exception from src/inference/src/cpp/infer_request.cpp:223:\n[CPU] Reshape node with name "
                         "'y' Check 'minusOneCount <= 1 && inputProduct == outputProduct' failed at "
                         "src/plugins/intel_cpu/src/shape_inference/custom/reshape.cpp:77:\n[cpu]reshape: the shape "
                         "of input data (1.4) conflicts with the reshape pattern (0.1)\n")
    assert ov_message(error) == ("[CPU] Reshape node with name 'y' [cpu]reshape: the shape of input data (1.4) "
                                 "conflicts with the reshape pattern (0.1)")


def export_cnn(path, width: int):
    """The reviewer's CNN: Conv(3->16), Conv(16->``width``), Linear, exported with the TorchScript exporter (the
    node and tensor names do not depend on ``width``)."""
    import torch

    class Cnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, width, 3, padding=1)
            self.fc3 = torch.nn.Linear(width * 8 * 8, 10)

        def forward(self, x):
            return self.fc3(torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1))

    torch.manual_seed(0)
    torch.onnx.export(Cnn().eval(), (torch.randn(1, 3, 8, 8),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"])
    return path


def test_onnx_model_rewritten_wider_since_the_import__refused_before_anything_is_timed(tmp_path, capsys):
    """A review: the CNN re-exported to the same path with Conv(16->256) and a wider Linear (same node and tensor
    names) matched by name and type, and ``measure`` gave status ok at 5x the step, ``profile`` wrote a profile
    under the imported graph's hash."""
    from cluster.cli import main
    from graphs.inference.onnx_import import import_onnx
    from graphs.io import load_graph_file, save_graph

    path = export_cnn(tmp_path / "cnnB.onnx", 32)
    graph_file = tmp_path / "cnnB.parquet"
    save_graph(import_onnx(str(path)), graph_file)
    OpenVinoMeasurer(import_onnx(str(path)), openvino_machine(), runs=1, warmup=0)  # as imported: measured
    export_cnn(path, 256)
    expected = (f"graph 'cnnB' does not match model file '{load_graph_file(graph_file).meta['model_file']}': its op "
                "'/conv2/Conv' outputs 65,536 bytes, 8,192 in the graph (the model changed since the import?)")
    with pytest.raises(PlacerError) as caught:  # at construction: nothing compiled or timed
        OpenVinoMeasurer(load_graph_file(graph_file), openvino_machine())
    assert str(caught.value) == expected
    common = ["--graph", str(graph_file), "--machine", "openvino", "--measurer", "openvino"]
    capsys.readouterr()
    assert main(["measure", *common, "--policy", "cpu-only", "--json"]) == 2
    assert capsys.readouterr().err.strip() == f"placer: error: {expected}"
    out = tmp_path / "p.json"
    assert main(["profile", *common, "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"placer: error: {expected}" and not out.exists()


def test_onnx_weights_rewritten_at_the_same_output_sizes__refused_naming_the_op_and_both_sizes(tmp_path):
    """A 3x3 kernel rewritten as 5x5 (padding 2): every output keeps its size, the Conv's weights do not."""
    from onnx import helper

    from graphs.inference.onnx_import import import_onnx

    def save(kernel: int):
        weights = {"W": np.ones((4, 3, kernel, kernel), np.float32), "M": np.ones((256, 5), np.float32)}
        nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[kernel // 2] * 4),
                 helper.make_node("Flatten", ["c"], ["f"], name="flat"),
                 helper.make_node("MatMul", ["f", "M"], ["y"], name="logits")]
        return save_onnx(tmp_path / "conv.onnx", nodes, weights, [1, 3, 8, 8], [1, 5])

    graph = import_onnx(str(save(3)))
    assert graph.param_bytes.tolist() == [432, 0, 5120]
    save(5)
    with pytest.raises(PlacerError, match=r"^graph 'conv' does not match model file '.*conv.onnx': its op 'conv' holds "
                                          r"1,200 bytes of weights, 432 in the graph \(the model changed since the "
                                          r"import\?\)$"):
        OpenVinoMeasurer(graph, openvino_machine())


def save_conv_ir(path, kernel: int = 3, channels: int = 4):
    """An IR x (1, 3, 8, 8) -> Convolution ``conv`` (``kernel`` wide, the padding that keeps 8x8) -> Relu."""
    import openvino.opset13 as ops

    x = ops.parameter([1, 3, 8, 8], np.float32, name="x")
    weights = ops.constant(np.ones((channels, 3, kernel, kernel), np.float32), name="w")
    pad = [kernel // 2] * 2
    relu = ops.relu(ops.convolution(x, weights, [1, 1], pad, pad, [1, 1], name="conv"), name="relu")
    ov.save_model(ov.Model([ops.result(relu, name="y")], [x], "conv"), str(path), compress_to_fp16=False)
    return path


@pytest.mark.parametrize("kernel, channels, problem", [
    (5, 4, "its op 'conv' reads 1,968 bytes (inputs and weights), 1,200 in the graph"),  # 768 input + 1,200 weights
    (3, 8, "its op 'conv' outputs 2,048 bytes, 1,024 in the graph")])
def test_ir_rewritten_since_the_import__refused_naming_the_first_op_that_differs(tmp_path, kernel, channels, problem):
    from graphs.inference.openvino_import import import_openvino_ir

    path = save_conv_ir(tmp_path / "conv.xml")
    graph = import_openvino_ir(str(path))
    save_conv_ir(path, kernel, channels)
    with pytest.raises(PlacerError) as caught:
        OpenVinoMeasurer(graph, openvino_machine())
    assert str(caught.value) == (f"graph 'conv' does not match model file '{graph.meta['model_file']}': {problem} "
                                 "(the model changed since the import?)")
    assert OpenVinoMeasurer(import_openvino_ir(str(path)), openvino_machine()).matched  # imported again: measured


def test_model_file_of__a_model_file_that_is_no_path_is_named():
    """A hand-edited graph file's meta['model_file'] of 5: `placer profile` said the step failed, with a
    TypeError."""
    from dataclasses import replace

    from measurers.openvino.measurer import model_file_of

    graph = replace(synthetic_graph(10), meta={"model_file": 5})
    with pytest.raises(PlacerError, match=r"meta\['model_file'\] is 5, not a path"):
        model_file_of(graph)
