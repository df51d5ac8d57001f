"""The PyTorch measurer: placed step equals the unplaced one, copies once per destination, timing rules,
statuses through the real exception types, bad placements rejected before anything runs."""

import itertools
import math
import weakref

import numpy as np
import pytest
import torch
from torch import nn

from graphs.benchmarks.torch_models import build_rnnlm
from graphs.errors import PlacerError
from graphs.opgraph import PHASE_CODE, OpGraph
from graphs.torch.importer import trace_training_step
from measurers.catalog import load_machine
from measurers.timing import TimingSettings, time_runs
from measurers.torch.measurer import TorchMeasurer, _out_of_memory
from measurers.torch.program import (_RELEASE_EVERY_BYTES, _RELEASE_EVERY_SLOTS, PlacedReplay, _Capture,
                                     capture_step)
from measurers.torch.workload import TorchWorkload, workload_from_graph

RNNLM_TINY = dict(batch_size=2, seq_len=3, hidden=8, vocab=20, layers=2)


def all_cpu(machine):
    """Every machine device mapped to the CPU: logical devices stay distinct, so copies still happen."""
    return ["cpu"] * machine.num_devices


@pytest.fixture(scope="module")
def rnnlm():
    return build_rnnlm(**RNNLM_TINY)


@pytest.fixture(scope="module")
def machine():
    return load_machine("paper-2gpu")  # cpu:0, gpu:0, gpu:1


def reference_step(graph: OpGraph, seed: int = 0, workload: TorchWorkload | None = None):
    """Loss and updated parameters of the ordinary single-device autograd step on the same inputs."""
    step = (workload or workload_from_graph(graph)).materialize(seed)
    optimizer = step.make_optimizer()
    loss = step.loss()
    loss.backward()
    optimizer.step()
    return float(loss.detach()), {name: p.detach().clone() for name, p in step.model.named_parameters()}


def placed_results(measurer: TorchMeasurer, placement: np.ndarray):
    replay = measurer.replay_for(placement)
    loss = float(replay.run())
    program = measurer.program()
    params = {name: replay.leaves[slot][0] for name, slot in program.param_slots.items()}
    return loss, params, replay.copies


def test_torch_measurer__placed_step_matches_single_device_run(rnnlm, machine):
    ref_loss, ref_params = reference_step(rnnlm)
    measurer = TorchMeasurer(rnnlm, machine, torch_devices=all_cpu)
    placement = np.random.default_rng(3).integers(0, machine.num_devices, rnnlm.num_ops)
    loss, params, copies = placed_results(measurer, placement)
    assert copies > 100  # the placement really moves tensors between (logical) devices
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert set(params) == set(ref_params)
    for name, value in params.items():
        assert torch.allclose(value, ref_params[name], rtol=1e-5, atol=1e-7), name
        assert not torch.equal(value, measurer.program().leaf_values[measurer.program().param_slots[name]]), name


class SinCos(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        y = self.w * x
        return (y.sin() + y.cos()).sum()


def sincos_workload():
    return TorchWorkload(lambda: (SinCos(), (torch.randn(3, 4),)), origin="test sincos")


def test_torch_measurer__tensor_copied_once_per_destination_device(machine):
    graph = trace_training_step(SinCos(), (torch.randn(3, 4),), name="sincos")
    kinds, phases = graph.op_kinds.tolist(), graph.phases
    forward = [i for i in range(graph.num_ops) if phases[i] == PHASE_CODE["forward"]]
    sin_op = next(i for i in forward if kinds[i] == "aten.sin")
    cos_op = next(i for i in forward if kinds[i] == "aten.cos")
    placement = np.zeros(graph.num_ops, dtype=np.int64)
    placement[[sin_op, cos_op]] = 1
    measurer = TorchMeasurer(graph, machine, workload=sincos_workload(), torch_devices=all_cpu)
    loss, _, copies = placed_results(measurer, placement)
    # y goes to device 1 once (read by both sin and cos); sin and cos outputs come back for the add.
    assert copies == 3
    _, _, copies_unplaced = placed_results(measurer, np.zeros(graph.num_ops, dtype=np.int64))
    assert copies_unplaced == 0
    assert loss == pytest.approx(reference_step(graph, workload=measurer.workload)[0], rel=1e-6)


def test_timing__warmup_discarded_and_median_reported():
    durations = iter([100.0, 50.0, 3.0, 1.0, 2.0])  # two warm-up runs, then three timed
    now = [0.0]

    def run_once():
        now[0] += next(durations)

    timing = time_runs(run_once, TimingSettings(runs=3, warmup=2), clock=lambda: now[0])
    assert timing.samples_s == (3.0, 1.0, 2.0)
    assert timing.median_s == 2.0 and not timing.timed_out


def test_timing__stops_with_timeout_past_the_limit():
    calls = []
    now = [0.0]

    def run_once():
        calls.append(1)
        now[0] += 2.0

    timing = time_runs(run_once, TimingSettings(runs=5, warmup=5, timeout_s=5.0), clock=lambda: now[0])
    assert timing.timed_out and len(calls) == 3 and timing.samples_s == ()


def test_torch_measurer__median_of_runs_after_warmup_with_stub_clock(rnnlm, machine):
    ticks = itertools.count()
    measurer = TorchMeasurer(rnnlm, machine, runs=3, warmup=2, torch_devices=all_cpu,
                             clock=lambda: float(next(ticks)) ** 2 / 10)
    result = measurer.measure([np.zeros(rnnlm.num_ops, dtype=np.int64)])[0]
    assert result.status == "ok" and len(result.samples_s) == 3
    # clock t^2/10 at call t: began=0, then (start, end) pairs 1,2 | 3,4 (warm-up) | 5,6 | 7,8 | 9,10
    assert result.samples_s == pytest.approx((1.1, 1.5, 1.9))
    assert result.runtime_s == pytest.approx(1.5)


def test_torch_measurer__timeout_status(rnnlm, machine):
    ticks = itertools.count()
    measurer = TorchMeasurer(rnnlm, machine, runs=5, warmup=0, timeout_s=2.5, torch_devices=all_cpu,
                             clock=lambda: float(next(ticks)))
    result = measurer.measure([np.zeros(rnnlm.num_ops, dtype=np.int64)])[0]
    assert result.status == "timeout" and "time limit" in result.error and 0 < len(result.samples_s) < 5
    assert result.runtime_s == math.inf  # no step time: the runs that finished were the median of a part


def test_timing__counts_from_when_the_measurement_began():
    now = [10.0]

    def run_once():
        now[0] += 1.0

    settings = TimingSettings(runs=3, warmup=0, timeout_s=5.0)
    assert not time_runs(run_once, settings, clock=lambda: now[0]).timed_out  # 3 s of runs
    timing = time_runs(run_once, settings, clock=lambda: now[0], began=now[0] - 4.5)  # after 4.5 s of set-up
    assert timing.timed_out and timing.samples_s == (1.0,)


def test_torch_measurer__copying_the_leaves_counts_toward_the_timeout(rnnlm, machine):
    """The clock started at the first run: leaves that took 10 s to copy to their devices, then quick runs,
    were ``ok`` under a 5 s limit, while the pool calls the placement (its measure_s past it) a timeout."""
    now = [0.0]

    class SlowSetUp(TorchMeasurer):
        def replay_for(self, placement):
            replay = super().replay_for(placement)
            now[0] += 10.0
            return replay

    measurer = SlowSetUp(rnnlm, machine, runs=3, warmup=0, timeout_s=5.0, torch_devices=all_cpu,
                         clock=lambda: now[0])
    result = measurer.measure([np.zeros(rnnlm.num_ops, dtype=np.int64)])[0]
    assert result.status == "timeout" and len(result.samples_s) == 1


def raising_once(program, exc):
    """Make the first matmul of the program raise ``exc`` once (a stubbed op)."""
    step = next(s for s in program.steps if s.counted and "mm" in str(s.func))
    real_func, real_call = step.func, step.call

    def stub(*args, **kwargs):
        step.func, step.call = real_func, real_call
        raise exc

    step.func = step.call = stub


def test_torch_measurer__cuda_oom_is_a_status_and_the_next_placement_runs(rnnlm, machine):
    measurer = TorchMeasurer(rnnlm, machine, runs=1, warmup=0, torch_devices=all_cpu)
    raising_once(measurer.program(), torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    placement = np.zeros(rnnlm.num_ops, dtype=np.int64)
    first, second = measurer.measure([placement, placement])
    assert first.status == "oom" and "out of memory" in first.error and first.samples_s == ()
    assert second.status == "ok" and second.runtime_s > 0


def test_torch_measurer__the_first_placement_resets_the_gpu_peaks_it_reads(rnnlm, machine, monkeypatch):
    """A new measurer reset the peaks of no device (its devices were resolved only later, by the replay) and
    read the process's old peak (7 GB here) as the first placement's. CUDA's calls are stubbed: no GPU."""
    from measurers.torch import measurer as torch_measurer

    peak = {"bytes": 7 * 10**9}  # left by earlier CUDA work in this process
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: peak.update(bytes=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peak["bytes"])

    class Replay:
        def run(self):
            peak["bytes"] = max(peak["bytes"], 10**6)  # this placement's own peak: 1 MB

    class OnAGpu(TorchMeasurer):
        def replay_for(self, placement):
            _ = self.torch_devices  # as the real one does first (place_program)
            return Replay()

    def one_gpu(machine):
        return [torch.device("cuda", 0)] * machine.num_devices

    monkeypatch.setattr(torch_measurer.torch.cuda, "init", lambda: None, raising=False)
    measurer = OnAGpu(rnnlm, machine, runs=1, warmup=0, torch_devices=one_gpu)
    first, second = measurer.measure([np.zeros(rnnlm.num_ops, dtype=np.int64)] * 2)
    assert first.status == second.status == "ok"
    assert max(first.peak_bytes) == max(second.peak_bytes) == 10**6


@pytest.mark.parametrize("message", ["CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                                     "CUDA error: out of memory"])
def test_torch_measurer__a_librarys_allocation_failure_is_oom_too(rnnlm, machine, message):
    """cuBLAS, cuDNN and the CUDA runtime say their memory ran out in a plain RuntimeError: it was an error."""
    measurer = TorchMeasurer(rnnlm, machine, runs=1, warmup=0, torch_devices=all_cpu)
    raising_once(measurer.program(), RuntimeError(message))
    first, second = measurer.measure([np.zeros(rnnlm.num_ops, dtype=np.int64)] * 2)
    assert first.status == "oom" and first.error == message
    assert second.status == "ok"


def cpu_allocation_failure() -> RuntimeError:
    """The CPU allocator's own failure, from a real allocation past any address space."""
    try:
        torch.empty(2**60, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    pytest.skip("this machine allocated 2**60 bytes")


def test_out_of_memory__the_cpu_allocators_failure_is_oom_as_in_the_tf_measurer():
    """torch on the CPU said "DefaultCPUAllocator: can't allocate memory" and it was an ``error``; TensorFlow's
    measurer reports its CPU allocator's failure as ``oom``."""
    assert _out_of_memory(cpu_allocation_failure())
    assert _out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                                       "memory: you tried to allocate 4000000000000 bytes."))
    assert _out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not _out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not _out_of_memory(ValueError("DefaultCPUAllocator: can't allocate memory"))  # not the allocator's type


def test_torch_measurer__other_failure_is_error_with_its_text(rnnlm, machine):
    measurer = TorchMeasurer(rnnlm, machine, runs=1, warmup=0, torch_devices=all_cpu)
    raising_once(measurer.program(), RuntimeError("kernel exploded"))
    first, second = measurer.measure([np.zeros(rnnlm.num_ops, dtype=np.int64)] * 2)
    assert first.status == "error" and "kernel exploded" in first.error
    assert second.status == "ok"


@pytest.mark.parametrize("bad", ["short", "out_of_range"])
def test_torch_measurer__bad_placement_rejected_before_anything_runs(rnnlm, machine, bad):
    measurer = TorchMeasurer(rnnlm, machine, torch_devices=all_cpu)
    placement = np.zeros(rnnlm.num_ops - 1 if bad == "short" else rnnlm.num_ops, dtype=np.int64)
    if bad == "out_of_range":
        placement[5] = machine.num_devices
    result = measurer.measure([placement])[0]
    assert result.status == "error" and ("shape" in result.error or "device" in result.error)
    assert measurer._program is None  # nothing was built, captured or run


def test_torch_measurer__step_that_differs_from_the_graph_is_an_error(machine):
    graph = trace_training_step(SinCos(), (torch.randn(3, 4),), name="sincos")

    class Other(SinCos):
        def forward(self, x):
            return (self.w * x).tanh().sum()

    workload = TorchWorkload(lambda: (Other(), (torch.randn(3, 4),)), origin="other")
    measurer = TorchMeasurer(graph, machine, workload=workload, torch_devices=all_cpu)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "error" and "does not match graph" in result.error


class Scaled(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(width))

    def forward(self, x):
        return (self.w * x).sin().sum()


@pytest.mark.parametrize("change", ["width", "batch"])
def test_torch_measurer__a_step_of_the_same_ops_at_other_sizes_is_an_error(machine, change):
    """A model file edited since the import to other widths or another batch runs the same ops, kind for kind:
    it was timed, status ok, and reported as the graph's."""
    graph = trace_training_step(Scaled(4), (torch.randn(3, 4),), name="scaled")
    width, batch = (64, 3) if change == "width" else (4, 30)
    workload = TorchWorkload(lambda: (Scaled(width), (torch.randn(batch, width),)), origin="edited")
    measurer = TorchMeasurer(graph, machine, workload=workload, torch_devices=all_cpu)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "error" and "does not match graph 'scaled'" in result.error
    assert ("param:w holds 256 bytes, 16 in the graph" if change == "width" else
            "input:0 holds 480 bytes, 48 in the graph") in result.error
    same = TorchWorkload(lambda: (Scaled(4), (torch.randn(3, 4),)), origin="as imported")
    assert TorchMeasurer(graph, machine, workload=same, torch_devices=all_cpu).measure(
        [np.zeros(graph.num_ops, dtype=np.int64)])[0].status == "ok"


class Strided(nn.Module):
    def __init__(self, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=stride, padding=1)

    def forward(self, x):
        return self.conv(x).mean()


class ReadsItsRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, rows):
        return self.fc(x[:int(rows.item())]).sum()  # the import answers .item() with 1


@pytest.mark.parametrize("case", ["stride", "item"])
def test_torch_measurer__a_step_whose_ops_make_other_bytes_than_the_graph_is_an_error(machine, case):
    """Same op kinds, same parameter and input sizes, other work: a convolution's stride edited since the import
    (1 to 4: 16x fewer output bytes), or rows read with .item() (32 real, 1 traced). Timed, status ok, and
    reported as the graph's step. (The measurement's error keeps the message's start and end: the op named.)"""
    if case == "stride":
        graph = trace_training_step(Strided(1), (torch.randn(2, 3, 16, 16),), name="strided")
        build, expected = (lambda: (Strided(4), (torch.randn(2, 3, 16, 16),))), "aten.convolution"
    else:
        build = lambda: (ReadsItsRows(), (torch.randn(32, 8), torch.tensor(32)))  # noqa: E731
        graph = trace_training_step(*build(), name="rows")
        expected = "aten.addmm"
    measurer = TorchMeasurer(graph, machine, workload=TorchWorkload(build, origin=case), torch_devices=all_cpu)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "error" and "does not match graph" in result.error and expected in result.error


def test_workload_from_graph__benchmark_spec_and_unknown_origin(rnnlm):
    step = workload_from_graph(rnnlm).materialize(1)
    assert step.inputs[0].shape == (2, 3) and int(step.inputs[0].max()) < 20
    assert not any(p.is_meta for p in step.model.parameters())
    again = workload_from_graph(rnnlm).materialize(1)
    assert torch.equal(step.inputs[0], again.inputs[0])
    assert all(torch.equal(a, b) for a, b in zip(step.model.parameters(), again.model.parameters()))
    from graphs.synthetic import synthetic_graph

    with pytest.raises(PlacerError, match="cannot be rebuilt"):
        workload_from_graph(synthetic_graph(10, 0))


class TextClassifier(nn.Module):
    """Token ids (vocabulary 50) and class targets (3 classes): both integer inputs, with other bounds."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids, labels):
        return nn.functional.cross_entropy(self.head(self.emb(ids).mean(dim=1)), labels)


def test_torch_measurer__real_example_inputs_are_the_builders_own(machine):
    """Integer inputs were drawn again below the embedding's 50 rows, so the class targets went out of range
    and every measurement of the model failed (IndexError)."""
    labels = torch.tensor([0, 2, 1, 2])
    workload = TorchWorkload(lambda: (TextClassifier(), (torch.randint(0, 50, (4, 6)), labels.clone())),
                             origin="text classifier")
    built = workload.materialize(0)
    assert torch.equal(built.inputs[1], labels)
    graph = trace_training_step(built.model, built.inputs, name="text_classifier")
    measurer = TorchMeasurer(graph, machine, runs=1, warmup=0, workload=workload, torch_devices=all_cpu)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "ok", result.error


def eval_dropout_mlp():
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 2))
    return model.eval(), (torch.randn(4, 8),)


def meta_eval_dropout_mlp():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 2))
    return model.eval(), (torch.randn(4, 8),)


@pytest.mark.parametrize("build", [eval_dropout_mlp, meta_eval_dropout_mlp], ids=["real", "meta"])
def test_torch_measurer__a_model_its_builder_returned_in_eval_mode_is_measured_in_eval_mode(machine, build):
    """The importer traces the model in the mode its builder returned; the measurer switched it to train mode
    (Dropout on), so the step ran ops the graph lacks and every measurement said it "does not match graph"."""
    workload = TorchWorkload(build, origin="eval dropout mlp")
    graph = trace_training_step(*build(), name="eval_dropout_mlp")
    measurer = TorchMeasurer(graph, machine, runs=1, warmup=0, workload=workload, torch_devices=all_cpu)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "ok", result.error
    assert not workload.materialize(0).model.training


def meta_tied_lm():
    from fixtures.tiny_models import tiny_torch_tied_lm

    with torch.device("meta"):
        model, _ = tiny_torch_tied_lm()
    return model, (torch.randint(0, 32, (4, 5)), torch.randint(0, 32, (4, 5)))


def test_torch_measurer__a_tied_model_built_on_the_meta_device_stays_tied_and_is_measured(machine):
    """to_empty gave the embedding and the output layer a weight each: the step had two weights and two Adam
    updates where the graph has one, and every measurement was "does not match graph"."""
    workload = TorchWorkload(meta_tied_lm, origin="meta tied lm")
    built = workload.materialize(0)
    assert built.model.emb.weight is built.model.out.weight and not built.model.emb.weight.is_meta
    graph = trace_training_step(*meta_tied_lm(), name="meta_tied_lm")
    measurer = TorchMeasurer(graph, machine, runs=1, warmup=0, workload=workload, torch_devices=all_cpu)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "ok", result.error


class _ComplexMatmul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.cfloat))

    def forward(self, x):
        return (x @ self.w).abs()


def meta_complex_input():
    return _ComplexMatmul(), torch.empty(4, 8, dtype=torch.cfloat, device="meta")


def test_torch_measurer__a_complex_input_on_the_meta_device_is_drawn(machine):
    """Drawn with randint ("check_random_bounds handles only integral, floating-point and boolean types"):
    every measurement of such a model was an error."""
    workload = TorchWorkload(meta_complex_input, origin="meta complex input")
    graph = trace_training_step(*meta_complex_input(), name="meta_complex_input")
    measurer = TorchMeasurer(graph, machine, runs=1, warmup=0, workload=workload, torch_devices=all_cpu)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "ok", result.error


def test_torch_measurer__gpu_machine_without_cuda_is_an_error_status(rnnlm, machine):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = TorchMeasurer(rnnlm, machine).measure([np.zeros(rnnlm.num_ops, dtype=np.int64)])[0]
    assert result.status == "error" and "CUDA" in result.error


def test_torch_measurer__initializes_cuda_once_it_maps_a_device_there(rnnlm, machine, monkeypatch):
    """On an H200 node `placer measure --machine FILE` gave "error: Invalid device argument" for every
    placement: the measurer reset CUDA's peak memory statistics before anything had initialized CUDA (`local`
    does, by reading the GPUs). No CUDA here: the call is what is checked, not its effect."""
    calls = []
    monkeypatch.setattr(torch.cuda, "init", lambda: calls.append("init"))
    on_gpu = TorchMeasurer(rnnlm, machine, torch_devices=lambda m: ["cpu"] + ["cuda:0"] * (m.num_devices - 1))
    assert [d.type for d in on_gpu.torch_devices][:2] == ["cpu", "cuda"] and calls == ["init"]
    _ = on_gpu.torch_devices
    assert calls == ["init"]  # resolved once
    on_cpu = TorchMeasurer(rnnlm, machine, torch_devices=lambda m: ["cpu"] * m.num_devices)
    _ = on_cpu.torch_devices
    assert calls == ["init"]


def test_torch_measurer__runs_inside_a_ray_pool_actor(rnnlm):
    ray = pytest.importorskip("ray")
    from cluster.pool import MeasurerPool, PoolConfig
    from cluster.ray_setup import init_ray
    from measurers.factory import MeasurerSpec

    if ray.is_initialized():
        ray.shutdown()
    init_ray(num_cpus=1)  # a private local Ray, not a cluster another process started
    try:
        machine = load_machine("local")
        spec = MeasurerSpec("torch", rnnlm, machine, runs=2, warmup=1)
        placement = np.zeros(rnnlm.num_ops, dtype=np.int64)
        with MeasurerPool(spec, PoolConfig(num_cpu_actors=1, use_gpus=False)) as pool:
            good, bad = pool.measure([placement, placement[:-1]])
    finally:
        ray.shutdown()
    assert good.status == "ok" and len(good.samples_s) == 2 and good.runtime_s > 0
    assert bad.status == "error"


def test_torch_program__every_tensor_freed_once_after_its_last_use(rnnlm, machine):
    program = TorchMeasurer(rnnlm, machine, torch_devices=all_cpu).program()
    freed = [slot for step in program.steps for slot in step.frees]
    assert len(freed) == len(set(freed)) == program.num_slots - 1 and program.loss_slot not in freed
    position = {slot: i for i, step in enumerate(program.steps) for slot in step.frees}
    for i, step in enumerate(program.steps):
        assert all(position[slot] >= i for slot in step.inputs if slot != program.loss_slot)  # read, then freed


def _replayed_loss(program) -> float:
    leaves = {slot: 0 for slot in program.leaf_values}
    return float(PlacedReplay(program, [0] * len(program.counted_kinds), [torch.device("cpu")], leaves).run())


@pytest.mark.parametrize("numel, temporaries", [(16, 2 * _RELEASE_EVERY_SLOTS), (_RELEASE_EVERY_BYTES // 8, 6)])
def test_capture_step__lets_go_of_tensors_the_step_no_longer_reaches(numel, temporaries):
    """Many small temporaries (the slot count triggers a release) or a few large ones (the bytes do): the
    first is freed while the step still runs, as eager PyTorch frees it, and the program replays the same
    loss. A capture that held every tensor could not capture the full-size RNNLM in 24 GB."""
    alive_at_end = {}

    def step_fn():
        x = torch.ones(numel)
        first = x * 2
        first_ref = weakref.ref(first)
        del first
        for _ in range(temporaries):
            x = x + 1
        alive_at_end["first"] = first_ref() is not None
        return x.sum()

    program = capture_step(step_fn, {}, {})
    assert alive_at_end == {"first": False}
    assert _replayed_loss(program) == float(numel * (1 + temporaries))


def test_capture_step__makes_the_calls_of_a_capture_that_holds_every_tensor(monkeypatch):
    """Autograd accumulates a gradient in place, or steals it, when nothing else holds it; the importer's trace
    holds every tensor, and the graph must match the program op for op. So a tensor autograd still reaches
    (a saved output it later unpacks as a new tensor of the same storage, a gradient waiting to be summed)
    stays held, and releasing the rest changes no call and no replayed value."""
    weight = torch.randn(8, 8, requires_grad=True)

    def step_fn():
        h = torch.ones(4, 8)
        for _ in range(_RELEASE_EVERY_SLOTS):  # the weight's gradient gets a term from every use
            h = torch.tanh(h @ weight)
        loss = h.sum()
        loss.backward()
        return loss

    released = capture_step(step_fn, {}, {"weight": weight})
    weight.grad = None
    monkeypatch.setattr(_Capture, "_release_unreachable", lambda self: None)
    held = capture_step(step_fn, {}, {"weight": weight})
    assert [(s.func, s.restride[:1]) for s in released.steps] == [(s.func, s.restride[:1]) for s in held.steps]
    assert len(released.leaf_values) == len(held.leaf_values)
    assert _replayed_loss(released) == _replayed_loss(held)


class BatchNormNet(nn.Module):
    """A BatchNorm in train mode: its kernel updates the running statistics in place, though its schema
    (aten.native_batch_norm) does not say it writes them."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x)).pow(2).sum()


class TransposeInPlace(nn.Module):
    """``transpose_`` changes its tensor's shape in place (an in-place view op): no data to copy back."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.w = nn.Parameter(torch.randn(4, 5))

    def forward(self, x):
        return (self.fc(x).transpose_(0, 1) * self.w).sum()


class WritesThroughViews(nn.Module):
    """In-place writes through views of a tensor that needs a gradient: autograd rebuilds such a view by
    replaying its view ops on the base under fake tensors, so the step must be captured that way too."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        h = self.fc(x) * 2.0
        h[:, :2] = 0.0
        h[:, 2:4].mul_(3.0)
        return self.out(h).pow(2).sum()


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(6, 8, num_layers=2, batch_first=True)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.rnn(x)[0]).sum()


def _state_after_one_step(step) -> tuple[float, dict]:
    """Loss and parameters and buffers after one ordinary single-device step of ``step``."""
    optimizer = step.make_optimizer()
    loss = step.loss()
    loss.backward()
    optimizer.step()
    return float(loss.detach()), {name: t.detach().clone() for name, t in step.model.state_dict().items()}


def _placed_state(graph, machine, workload, placement) -> tuple[float, dict, int]:
    measurer = TorchMeasurer(graph, machine, workload=workload, torch_devices=all_cpu)
    replay = measurer.replay_for(placement)
    loss = float(replay.run())
    return loss, {name: replay.leaves[slot][0] for name, slot in measurer.program().param_slots.items()}, replay.copies


def _kinds_on(graph, kinds: tuple, device: int) -> np.ndarray:
    """Every op of ``kinds`` on ``device``, the others on device 0."""
    placement = np.zeros(graph.num_ops, dtype=np.int64)
    for kind in kinds:
        assert (graph.op_kinds == kind).any(), kind
        placement[graph.op_kinds == kind] = device
    return placement


@pytest.mark.parametrize("module, input_shape, placement_of", [
    (BatchNormNet, (5, 6), lambda graph: _kinds_on(graph, ("aten.native_batch_norm",), 1)),
    (TransposeInPlace, (5, 6), lambda graph: _kinds_on(graph, ("aten.transpose_", "aten.mul"), 2)),
    (LSTMNet, (3, 4, 6), lambda graph: np.random.default_rng(0).integers(0, 3, graph.num_ops)),
    (WritesThroughViews, (5, 6), lambda graph: np.random.default_rng(1).integers(0, 3, graph.num_ops)),
], ids=["batchnorm-away-from-its-running-stats", "transpose_-away-from-its-tensor", "lstm-spread",
        "writes-through-views-spread"])
def test_torch_measurer__placed_step_updates_parameters_and_buffers_as_one_device(module, input_shape, placement_of,
                                                                                 machine, one_torch_thread):
    workload = TorchWorkload(lambda: (module(), (torch.randn(*input_shape),)), origin=module.__name__)
    built = workload.materialize(0)
    graph = trace_training_step(built.model, built.inputs, name=module.__name__)
    ref_loss, ref_state = _state_after_one_step(workload.materialize(0))
    loss, state, copies = _placed_state(graph, machine, workload, placement_of(graph))
    assert copies > 0
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert set(state) == set(ref_state)
    for name, value in state.items():
        assert torch.allclose(value, ref_state[name], rtol=1e-5, atol=1e-6), name


class OneHotTargets(nn.Module):
    """Soft targets from F.one_hot of the labels: on real CPU tensors one_hot checks the labels' range first
    (aminmax, .item()), which the importer's fake trace never runs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x, labels):
        targets = nn.functional.one_hot(labels, 5).float() * 0.9 + 0.02
        return -(targets * self.fc(x).log_softmax(-1)).sum(-1).mean()


def test_torch_measurer__a_model_with_one_hot_runs_placed_as_on_one_device(machine, one_torch_thread):
    """Every placement was refused: "the step ran aten.aminmax" where the graph has aten.arange."""
    workload = TorchWorkload(lambda: (OneHotTargets(), (torch.randn(4, 8), torch.tensor([0, 2, 1, 4]))),
                             origin="one-hot")
    built = workload.materialize(0)
    graph = trace_training_step(built.model, built.inputs, name="one-hot")
    ref_loss, ref_state = _state_after_one_step(workload.materialize(0))
    placement = np.random.default_rng(0).integers(0, 3, graph.num_ops)
    loss, state, copies = _placed_state(graph, machine, workload, placement)
    assert copies > 0 and loss == pytest.approx(ref_loss, rel=1e-5)
    for name, value in state.items():
        assert torch.allclose(value, ref_state[name], rtol=1e-5, atol=1e-6), name
