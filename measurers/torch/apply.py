"""A user's own PyTorch training step with a placement applied: every op on its device, step after step.

``trace_user_step(build_fn, name)`` calls the function the user wrote (the kind `placer graphs import
--torch` takes: it returns ``(model, example_inputs)`` or ``(model, example_inputs, loss_fn)``) once and
traces it as the importer does, so the caller can compare the graph's content hash with the one the
placement was found for. ``place_user_step`` then captures the real step once on the CPU and places it
with the torch measurer's machinery (`measurers.torch.program`, `measurers.torch.measurer.place_program`).

What the `PlacedStep` runs is the importer's step: forward, loss, backward and an Adam update
(``foreach=False``, one update per parameter, as traced), with Python reads kept live so Adam's bias
correction follows the step count. Every op runs on its placed device, a tensor crosses to another device
once per destination, and parameters and optimizer state stay on their devices between calls. The
optimizer starts fresh (step 0, zero moments), as ``torch.optim.Adam(model.parameters())`` would. Example::

    user = trace_user_step(my_model, "my_model")          # my_model() -> (model, (x, y))
    step = place_user_step(user, placement, machine)      # placement: (N,) device per op of user.graph
    for x, y in batches:
        loss = step(x, y)                                 # same shapes and dtypes as the example inputs
    step.copy_to(user.step.model)                         # the trained weights back into the model
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph
from graphs.specs import function_label
from graphs.torch.importer import check_distinct_inputs, check_spec_result, trace_training_step
from measurers.machine import Machine
from measurers.placement import check_placement, framework_devices
from measurers.torch.measurer import (capture_training_step, check_program_matches, default_torch_devices,
                                      place_program)
from measurers.torch.program import PlacedReplay
from measurers.torch.workload import MaterializedStep


@dataclass
class UserTorchStep:
    """What the user's function built, and the graph of its training step."""

    graph: OpGraph
    step: MaterializedStep  # the user's model (real weights, CPU), example inputs and loss function
    origin: str  # the function, for messages: "module:function"


def trace_user_step(build_fn: Callable[[], tuple], graph_name: str) -> UserTorchStep:
    """Call ``build_fn`` once and trace its training step into a graph named ``graph_name`` (the name is
    part of the content hash, so the caller passes the name of the graph it compares with)."""
    origin = function_label(build_fn)
    try:
        result = build_fn()
    except Exception as error:  # the user's code
        raise PlacerError(f"torch function {origin!r} raised {type(error).__name__}: {error}") from error
    model, inputs, loss_fn = check_spec_result(origin, result)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise PlacerError(f"torch function {origin!r}: the model has tensors on the meta device; applying a "
                          "placement trains real weights, so build the model with them")
    if any(isinstance(t, torch.Tensor) and t.is_meta for t in inputs):
        raise PlacerError(f"torch function {origin!r}: an example input is on the meta device; applying a "
                          "placement runs the step, so give inputs with values")
    # Each input its own contiguous copy, as the import traced it (fresh, contiguous fakes): (x, x.view(...))
    # shared one leaf (the step fed the first's values to both, silently), and slices of one token tensor,
    # (tok[:, :-1], tok[:, 1:]), ran a clone the graph does not have (every apply refused).
    copies = tuple(x.detach().clone(memory_format=torch.contiguous_format) if isinstance(x, torch.Tensor) else x
                   for x in inputs)
    try:
        check_distinct_inputs(inputs)  # the user's own: (x, x) is one tensor given twice, its copies are not
        graph = trace_training_step(model, copies, loss_fn, name=graph_name, source=f"torch:{origin}")
    except PlacerError as error:
        raise PlacerError(f"torch function {origin!r}: {error}") from error
    except Exception as error:  # the model's own forward/backward failed on the example inputs
        raise PlacerError(f"torch function {origin!r}: tracing the training step failed: "
                          f"{type(error).__name__}: {error}") from error
    # The model trains in the mode its function returned it in, as it was traced (a model returned in eval
    # mode, BatchNorm's statistics frozen, was switched to train mode here: its step then differed from its
    # graph, and every apply was refused).
    return UserTorchStep(graph, MaterializedStep(model, copies, loss_fn, torch.optim.Adam), origin)


@dataclass
class PlacedStep:
    """The user's training step, placed. ``step(*inputs)`` trains once and returns the loss (a 0-dim tensor
    on its op's device); without inputs it reuses the last ones (first, the example inputs)."""

    replay: PlacedReplay
    graph: OpGraph
    machine: Machine
    placement: np.ndarray  # (N,) int64 device of every graph op
    input_slots: tuple  # program slot of each example input (None: the step never reads it)
    example_inputs: tuple  # the example inputs (shapes and dtypes every call must keep)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if inputs:
            self._feed(inputs)
        return self.replay.run()

    @property
    def copies(self) -> int:
        """Cross-device copies the last call made (one per tensor and destination device)."""
        return self.replay.copies

    def parameters(self) -> dict[str, torch.Tensor]:
        """Current parameters and buffers by name, each on its placed device (the live tensors)."""
        program = self.replay.program
        return {name: self.replay.leaves[slot][0] for name, slot in program.param_slots.items()
                if slot in self.replay.leaves}

    def copy_to(self, model: torch.nn.Module) -> None:
        """Write the current parameters and buffers into ``model`` (any module with the same names and shapes).
        Every one is checked to be there before any is written: a wrapped (``nn.Sequential(model)``) or renamed
        model got none, silently, and one of other shapes was left half-written by torch's error."""
        if not isinstance(model, torch.nn.Module):
            raise PlacerError(f"copy_to takes a torch.nn.Module, got {type(model).__name__}")
        state = {**dict(model.named_parameters(remove_duplicate=False)),
                 **dict(model.named_buffers(remove_duplicate=False))}
        values = self.parameters()
        missing = [name for name in values if name not in state]
        if missing:
            listed = _listed([repr(name) for name in missing])
            raise PlacerError(f"copy_to: the model has no {listed} ({len(missing)} of the step's {len(values)} "
                              "parameters and buffers); it takes a model whose modules are named as the traced one's")
        other = [f"{name!r} {tuple(state[name].shape)}, not {tuple(value.shape)}" for name, value in values.items()
                 if state[name].shape != value.shape]
        if other:
            raise PlacerError(f"copy_to: the model's shapes differ from the step's: {_listed(other)}; nothing "
                              "was written")
        with torch.no_grad():
            for name, value in values.items():
                state[name].copy_(value)

    def _feed(self, inputs: tuple) -> None:
        if len(inputs) != len(self.example_inputs):
            raise PlacerError(f"the step takes {len(self.example_inputs)} inputs (as the example inputs), "
                              f"got {len(inputs)}")
        for index, (value, example) in enumerate(zip(inputs, self.example_inputs)):
            if isinstance(value, torch.Tensor) and value.is_meta:
                raise PlacerError(f"input {index} is on the meta device: it has no values to train on")
            if not isinstance(value, torch.Tensor) or value.shape != example.shape or value.dtype != example.dtype:
                got = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
                raise PlacerError(f"input {index} must be a tensor of shape {tuple(example.shape)} and "
                                  f"{example.dtype} (the traced step's), got {got}")
        for value, slot in zip(inputs, self.input_slots):
            if slot is not None:
                self.replay.leaves[slot][0].copy_(value)


def place_user_step(user: UserTorchStep, placement, machine: Machine,
                    torch_devices: Callable[[Machine], list] = default_torch_devices,
                    optimizer_options: dict | None = None) -> PlacedStep:
    """The user's step placed by ``placement`` ((N,) device of every op of ``user.graph``) on ``machine``.
    ``torch_devices``: the torch device of each machine device (the measurer's mapping by default).
    ``optimizer_options``: Adam's own (``lr``); options that add ops (``weight_decay``) make the step
    differ from the graph and are refused."""
    placement = check_placement(user.graph, machine, placement)
    devices = [_torch_device(d) for d in framework_devices(torch_devices, machine, "torch_devices")]
    model = user.step.model
    initial = {name: t.detach().clone() for name, t in model.state_dict().items()}
    optimizer = _fresh_optimizer(user.step, optimizer_options or {})
    program = capture_training_step(user.step, optimizer, live_scalars=True)  # one real step on the CPU
    model.load_state_dict(initial)  # the capture's step is not the user's: the model is as it was built
    optimizer.zero_grad(set_to_none=True)
    check_program_matches(user.graph, program)
    input_slot = {name: slot for slot, name in program.leaf_ops.items() if name.startswith("input:")}
    input_slots = tuple(input_slot.get(f"input:{i}") for i in range(len(user.step.inputs)))
    replay = place_program(user.graph, program, placement, devices)
    return PlacedStep(replay, user.graph, machine, placement, input_slots, tuple(user.step.inputs))


def _torch_device(device) -> torch.device:
    """``device`` as a torch device; one that torch cannot parse, or a CUDA device this process lacks (an
    AssertionError from deep inside torch when the step was built), is a PlacerError naming it."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise PlacerError(f"torch_devices gave {device!r}, not a torch device: {error}") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (parsed.index or 0) >= count:
            raise PlacerError(f"torch_devices gave {device!r}, but torch sees only {count} CUDA devices")
    elif parsed.type == "meta":  # it holds no values: the step failed at its first .item() or copy
        raise PlacerError(f"torch_devices gave {device!r}: the meta device holds no data, so no step runs there")
    elif parsed.type != "cpu":
        try:  # xpu, mps, ...: torch not built with it raised an AssertionError or RuntimeError from deep inside
            torch.empty(0, device=parsed)
        except (AssertionError, RuntimeError) as error:
            raise PlacerError(f"torch_devices gave {device!r}, which this torch cannot use: {error}") from None
    return parsed


def _fresh_optimizer(step: MaterializedStep, options: dict) -> torch.optim.Optimizer:
    """Adam as the importer builds it (its state made by a zero-gradient warm-up step, so the update's
    ops are the traced steady-state ones), then put back to a fresh optimizer's: the parameters as they
    were (a decaying option would have moved them) and the step count at 0 (zero moments stay zero)."""
    params = [p for p in step.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    try:
        optimizer = step.make_optimizer(**options)
    # an unknown option; a value Adam refuses (a negative lr); capturable off CUDA (AssertionError); differentiable
    # (its in-place update of a leaf that requires grad: RuntimeError)
    except (TypeError, ValueError, AssertionError, RuntimeError) as error:
        if not options and isinstance(error, (AssertionError, RuntimeError)):
            raise  # no option to blame (the warm-up step's own failure, e.g. a sparse gradient)
        raise PlacerError(f"optimizer options {options}: {error}") from error
    with torch.no_grad():
        for p, value in zip(params, before):
            p.copy_(value)
        for state in optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"].zero_()
    return optimizer


def _listed(items: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``items``, and how many more."""
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")
