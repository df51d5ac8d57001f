"""The PyTorch measurer: the real training step of a traced graph, every op on its assigned device.

The step (model, inputs, optimizer) is rebuilt from the graph's origin (`measurers.torch.workload`),
captured once as aten calls on the CPU and checked op for op against the graph (same kind at every
index), then replayed per placement (`measurers.torch.program`): leaves (parameters, optimizer state,
inputs) live on their Variable / Input op's device, every other op runs on its own device, and a tensor
crosses to another device once per destination. Timing follows `measurers.timing` (warm-up runs, then N
timed runs, device-synchronized, the median).

Statuses: a placement of the wrong length, with an unknown device or a device kind an op may not use is
``error`` before anything runs; CUDA out-of-memory is ``oom`` (memory released, the measurer keeps
working); any other failure ``error`` with its text; past ``timeout_s`` ``timeout``. Example::

    measurer = TorchMeasurer(graph, load_machine("local"), runs=5, warmup=5)
    [m.runtime_s for m in measurer.measure([placement])]
"""

from __future__ import annotations

import gc
import time
from typing import Callable, Sequence

import numpy as np
import torch

from graphs.errors import PlacerError, first_line
from graphs.opgraph import OpGraph
from graphs.torch.recorder import tensor_bytes
from measurers.base import Measurement, failed_measurement, rebuild_step_now
from measurers.machine import Machine
from measurers.placement import check_placement
from measurers.timing import REAL_TIMING, TimingSettings, time_runs
from measurers.torch.program import PlacedReplay, Program, SlotRef, capture_step
from measurers.torch.workload import MaterializedStep, TorchWorkload, workload_from_graph

LEAF_KINDS = ("Variable", "Input")


def default_torch_devices(machine: Machine) -> list[torch.device]:
    """The torch device of each machine device: CPUs -> ``cpu``, the k-th GPU -> ``cuda:k``."""
    devices, gpu = [], 0
    for device in machine.devices:
        if device.kind == "gpu":
            if gpu >= (torch.cuda.device_count() if torch.cuda.is_available() else 0):
                raise PlacerError(f"machine {machine.name!r} has GPU {device.name!r} but torch sees only "
                                  f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA devices")
            devices.append(torch.device("cuda", gpu))
            gpu += 1
        else:
            devices.append(torch.device("cpu"))
    return devices


ALLOCATION_FAILURES = ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                       "DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
"""What a plain RuntimeError says when memory is exhausted outside PyTorch's CUDA allocator (cuBLAS or cuDNN
making their workspaces, the CUDA runtime itself), or in the CPU's allocator (a placement too big for host
memory: TensorFlow's measurer reports the same as ``oom``)."""


def _out_of_memory(exc: BaseException) -> bool:
    """The step ran out of memory: PyTorch's OutOfMemoryError, or an allocator's or library's failure
    (reported as ``error`` before, as if the step had crashed, not as a placement that does not fit)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(words in str(exc) for words in ALLOCATION_FAILURES)


class TorchMeasurer:
    def __init__(self, graph: OpGraph, machine: Machine, *, runs: int = REAL_TIMING.runs, warmup: int = REAL_TIMING.warmup,
                 timeout_s: float = REAL_TIMING.timeout_s, seed: int = 0, workload: TorchWorkload | None = None,
                 torch_devices: Callable[[Machine], list] = default_torch_devices,
                 clock: Callable[[], float] = time.perf_counter):
        self.graph, self.machine, self.seed, self.clock = graph, machine, seed, clock
        self.settings = TimingSettings(runs, warmup, timeout_s)
        self.workload = workload or workload_from_graph(graph)
        self._torch_devices_of = torch_devices  # resolved on first use: a driver may see no GPUs
        self._torch_devices: list[torch.device] | None = None
        self.counted_ops = counted_op_indices(graph)  # (M,) graph op of each step
        self._program: Program | None = None

    @property
    def torch_devices(self) -> list[torch.device]:
        if self._torch_devices is None:
            devices = [torch.device(d) for d in self._torch_devices_of(self.machine)]
            if any(d.type == "cuda" for d in devices):
                # CUDA's per-device memory statistics exist only once CUDA is initialized. Without this,
                # `placer measure --machine FILE` on an H200 node reset them before anything had (`local`
                # does, reading the GPUs): every measurement was "error: Invalid device argument"
                torch.cuda.init()
            self._torch_devices = devices
        return self._torch_devices

    def check_ready(self) -> None:
        """Resolve the machine's devices and rebuild the step in this process now: a GPU this process cannot
        see, or a step it cannot rebuild (its spec's file gone), is one PlacerError here, for a caller that
        measures in this process (``placer measure``), instead of an ``error`` measurement. A failure of the
        user's own step is left to the measurement, which reports it as its status."""
        _ = self.torch_devices
        rebuild_step_now(self.program)

    # -- the program, captured once ---------------------------------------------------------------------
    def program(self) -> Program:
        if self._program is None:
            self._program = self._capture()
        return self._program

    def _capture(self) -> Program:
        step = self.workload.materialize(self.seed)
        optimizer = step.make_optimizer()
        program = capture_training_step(step, optimizer)
        check_program_matches(self.graph, program)
        return program

    # -- measuring --------------------------------------------------------------------------------------
    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        return [self._measure_one(p) for p in placements]

    def replay_for(self, placement: np.ndarray) -> PlacedReplay:
        """The placed step (leaves copied to their devices), ready to ``run()``."""
        return place_program(self.graph, self.program(), placement, self.torch_devices)

    def _measure_one(self, placement) -> Measurement:
        began, clock_began = time.perf_counter(), self.clock()  # set-up counts toward the timeout, as in the pool
        try:
            placement = check_placement(self.graph, self.machine, placement)
        except PlacerError as exc:
            return failed_measurement("error", (0,) * self.machine.num_devices, began, str(exc))
        replay = None
        try:
            _ = self.torch_devices  # resolved first: else the first placement's peaks were never reset
            self._release()  # the previous placement's memory is not this one's
            self._reset_peaks()
            replay = self.replay_for(placement)
            timing = time_runs(replay.run, self.settings, sync=self.sync, clock=self.clock, began=clock_began)
            return timing.measurement(self.settings, self._peaks(), began)
        except Exception as exc:  # noqa: BLE001  any failure of the user's step is a status
            if _out_of_memory(exc):
                status, error = "oom", first_line(exc, "CUDA out of memory")
            else:
                status, error = "error", f"{type(exc).__name__}: {exc}"
        # Outside the except block: the traceback (frames holding this placement's tensors) is gone now.
        replay = None  # noqa: F841
        peaks = self._peaks()
        self._release()
        return failed_measurement(status, peaks, began, error)

    # -- devices ----------------------------------------------------------------------------------------
    def _cuda_devices(self) -> list[torch.device]:
        return sorted({d for d in self._torch_devices or () if d.type == "cuda"}, key=str)

    def sync(self) -> None:
        """Wait for every CUDA device of this measurer to finish its queued work (nothing on the CPU)."""
        for device in self._cuda_devices():
            torch.cuda.synchronize(device)

    def _reset_peaks(self) -> None:
        for device in self._cuda_devices():
            torch.cuda.reset_peak_memory_stats(device)

    def _peaks(self) -> tuple[int, ...]:
        devices = self._torch_devices or [torch.device("cpu")] * self.machine.num_devices
        return tuple(int(torch.cuda.max_memory_allocated(d)) if d.type == "cuda" else 0 for d in devices)

    def _release(self) -> None:
        if self._cuda_devices():
            gc.collect()
            torch.cuda.empty_cache()


def capture_training_step(step: MaterializedStep, optimizer: torch.optim.Optimizer,
                          live_scalars: bool = False) -> Program:
    """The program of one step (forward, loss, backward, ``optimizer.step()``), run once on the CPU.
    Parameters and buffers are named in ``Program.param_slots``; see ``capture_step`` for ``live_scalars``."""

    def step_fn():
        loss = step.loss()
        loss.backward()
        optimizer.step()
        return loss

    named = {**dict(step.model.named_parameters()), **dict(step.model.named_buffers())}
    return capture_step(step_fn, leaf_names(step, optimizer), named, live_scalars)


def counted_op_indices(graph: OpGraph) -> np.ndarray:
    """(M,) int: the graph op of each counted step of the program, in order (every op but the leaves:
    Variable and Input ops)."""
    return np.flatnonzero(~np.isin(graph.op_kinds, LEAF_KINDS))


def check_program_matches(graph: OpGraph, program: Program) -> None:
    """PlacerError unless the program's counted steps are the graph's non-leaf ops, kind for kind."""
    counted_ops = counted_op_indices(graph)
    ran = program.counted_kinds
    expected = graph.op_kinds[counted_ops].tolist()
    for index, (want, got) in enumerate(zip(expected, ran)):
        if want != got:
            op = graph.op_names[counted_ops[index]]
            raise PlacerError(f"the real step does not match graph {graph.name!r}: its op {index} "
                              f"(graph op {op!r}) is {want} in the graph but the step ran {got}")
    if len(expected) != len(ran):
        raise PlacerError(f"the real step does not match graph {graph.name!r}: the graph has "
                          f"{len(expected)} ops besides variables and inputs, the step ran {len(ran)}")
    _check_leaf_sizes(graph, program)
    _check_output_sizes(graph, program, counted_ops)


def _check_output_sizes(graph: OpGraph, program: Program, counted_ops: np.ndarray) -> None:
    """Each counted call that neither views nor writes a tensor made the bytes its graph op records: a model
    edited since the import in what its parameters and inputs do not show (a convolution's stride), or a
    step whose sizes follow a value it reads (``x[:int(n.item())]``, which the import answers with 1), ran
    other work than the graph's and was timed and reported as the graph's."""
    counted = [step for step in program.steps if step.counted]
    for index, step in enumerate(counted):
        op = counted_ops[index]
        if step.out_bytes >= 0 and step.out_bytes != int(graph.out_bytes[op]):
            raise PlacerError(f"the real step does not match graph {graph.name!r}: its op {index} (graph op "
                              f"{graph.op_names[op]!r}, {graph.op_kinds[op]}) made {step.out_bytes:,} bytes, "
                              f"{int(graph.out_bytes[op]):,} in the graph (the model changed since the import, or "
                              "its sizes follow a value it reads, which the import answers with 1)")


def _check_leaf_sizes(graph: OpGraph, program: Program) -> None:
    """Each parameter, buffer and input the step reads has the bytes of its Variable / Input op: a model file
    edited since the import to other widths or another batch (the same ops, kind for kind) was timed and
    reported as the graph's."""
    op_index = {name: i for i, name in enumerate(graph.op_names)}
    leaves = {**{slot: name for slot, name in program.leaf_ops.items() if name.startswith("input:")},
              **{slot: f"param:{name}" for name, slot in program.param_slots.items()}}  # not optimizer state
    for slot, name in sorted(leaves.items()):
        value, i = program.leaf_values.get(slot), op_index.get(name)
        if i is None or not isinstance(value, torch.Tensor):
            continue
        size = tensor_bytes(value)
        if size != int(graph.out_bytes[i]):
            raise PlacerError(f"the real step does not match graph {graph.name!r}: its {name} holds {size:,} bytes, "
                              f"{int(graph.out_bytes[i]):,} in the graph (the model changed since the import?)")


def place_program(graph: OpGraph, program: Program, placement: np.ndarray,
                  torch_devices: list[torch.device]) -> PlacedReplay:
    """The program with ``placement`` (an (N,) op placement of ``graph``) applied: counted steps on their
    ops' devices, parameters, optimizer state and inputs on their Variable / Input op's device, constants
    the graph does not name where they are first read. Leaves are copied to their devices here."""
    step_devices = np.asarray(placement)[counted_op_indices(graph)].tolist()
    op_index = {name: i for i, name in enumerate(graph.op_names)}
    leaf_device = {}
    first_use = _first_consumers(program)
    for slot in program.leaf_values:
        op = op_index.get(program.leaf_ops.get(slot, ""))
        if op is not None:
            leaf_device[slot] = int(placement[op])
        else:  # a constant the graph does not name: it starts where it is first read
            step = first_use.get(slot)
            leaf_device[slot] = int(step_devices[step]) if step is not None else 0
    return PlacedReplay(program, step_devices, torch_devices, leaf_device)


def leaf_names(step: MaterializedStep, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """id(tensor) -> graph leaf op name, as the importer names them (param:NAME, input:I)."""
    names = {}
    for name, p in step.model.named_parameters():
        names[id(p)] = f"param:{name}"
        for state in optimizer.state.get(p, {}).values():
            if isinstance(state, torch.Tensor):
                names[id(state)] = f"param:{name}"
    for name, b in step.model.named_buffers():
        names[id(b)] = f"param:{name}"
    for index, x in enumerate(step.inputs):
        if isinstance(x, torch.Tensor):
            names[id(x)] = f"input:{index}"
    return names


def _first_consumers(program: Program) -> dict[int, int]:
    """Leaf slot -> index (among counted steps) of the first counted step that reads it."""
    from torch.utils._pytree import tree_flatten

    first: dict[int, int] = {}
    counted = -1
    for step in program.steps:
        if step.counted:
            counted += 1
            for x in tree_flatten((step.args, step.kwargs))[0]:
                if isinstance(x, SlotRef) and x.slot in program.leaf_values:
                    first.setdefault(x.slot, counted)
    return first
