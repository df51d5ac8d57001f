"""PyTorch importer: one whole training step (forward, loss, backward, optimizer update) as an OpGraph.

The step runs under ``FakeTensorMode``: parameters, inputs and every intermediate are fake tensors (shapes,
dtypes and strides, no data), so paper-scale models trace without allocating their memory. Models may be
built on ``torch.device("meta")`` for the same reason. `graphs.torch.recorder.OpRecorder` turns every
aten call into one op:

- kind ``aten.<name>`` (overload packet), FLOPs from ``torch.utils.flop_counter``'s formulas (matmuls,
  convolutions, attention) and `graphs.torch.flops`' for the kernels it lacks (the CPU attention kernel, mv,
  dot, addbmm, nn.Bilinear, the FFTs); element-wise ops count 0 FLOPs and are costed by their bytes,
  ``bytes_accessed`` = bytes of tensor inputs + outputs, ``out_bytes`` = bytes of fresh outputs; views,
  in place or not (``view``, ``squeeze``, ``t_``, ``transpose_``, ``as_strided_``, a ``resize_`` that does not
  grow, ``set_``, which makes its tensor a view of its source), move and allocate nothing: 0 and 0; a
  ``resize_`` that grows allocates its new storage (``out_bytes``) and copies the old one (twice its bytes);
- not recorded (they move no data): ``aten.detach``, ``aten.alias``, ``aten.lift_fresh``, ``prim.*``
  (device queries), ``profiler.*`` markers and ``aten._local_scalar_dense`` (``.item()``, answered 1:
  fake tensors hold no data);
- one ``Variable`` op per parameter (scope = owning module, ``param_bytes`` = weight + gradient +
  optimizer moments: 4 x the weight bytes for fp32 Adam, i.e. weight, grad, exp_avg and exp_avg_sq; Adam's
  scalar step counter is not counted; a parameter the loss never reaches gets no gradient and no optimizer
  state in a real step: its weight alone) and per buffer (``param_bytes`` = its bytes); one ``Input`` op per
  example input, target, and constant tensor the model reads. A tensor several modules hold (tied weights:
  ``out.weight = emb.weight``) is one Variable op, in its first holder's scope; ``meta[TIED_PARAMETERS]``
  lists all its names (``[["emb.weight", "out.weight"]]``, not part of the content hash);
- scope = dotted module path active when a forward op ran (loss ops outside the model: ``loss``); a
  backward op takes its forward op's scope and is colocated with it; an update op takes its parameter's
  scope and is colocated with its Variable; other views and in-place ops are colocated with the producer
  of the tensor they view or write. An op that writes a parameter, a buffer or optimizer state in place
  (batch norm's running statistics, which its schema does not declare written) is also colocated with each
  Variable it writes.

Fake tensors do not check every dtype rule of the real kernels; the recorder applies those of
`graphs.torch.dtype_rules` to each aten call, so a step a real run would refuse (a float16 weight fed float32
input, a float index tensor) is one PlacerError naming the op, its module and the dtypes.

oneDNN is off while tracing (`graphs.torch.recorder.without_onednn`): an nn.LSTM is its cell's matmuls and
element-wise ops, step by step, not one fused CPU kernel per layer that no FLOP formula counts.

The optimizer (Adam unless given) is built with ``foreach=False`` so each update op touches one parameter,
and takes one untraced warm-up step first, so its state exists and the traced step is a steady-state step.
"""

from __future__ import annotations

import inspect
import logging
import time
from contextlib import contextmanager
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch._subclasses import FakeTensorMode

from graphs.errors import PlacerError, first_line
from graphs.opgraph import TIED_PARAMETERS, OpGraph, colocation_groups
from graphs.torch import LOSS_SCOPE
from graphs.torch.recorder import GradFnStamper, OpRecorder, OpTable, tensor_bytes, without_onednn


def trace_training_step(model: nn.Module, example_inputs, loss_fn: Callable | None = None,
                        optimizer_cls: type = torch.optim.Adam, name: str = "model", batch_size: int = 0,
                        optimizer_kwargs: dict | None = None, source: str = "") -> OpGraph:
    """Trace ``loss = loss_fn(model(*example_inputs)); loss.backward(); optimizer.step()``.

    ``example_inputs``: a tensor or a tuple of tensors (real or meta; only their shapes and dtypes are
    used). With ``loss_fn=None`` the model's output is the loss (a model that takes its targets as inputs
    and returns the loss); a non-scalar loss is summed. ``loss_fn(output)`` may close over target tensors.
    ``batch_size=0`` takes the leading dimension of the first input.
    """
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    check_distinct_inputs(inputs)
    started = time.perf_counter()
    table = OpTable()
    recorder = OpRecorder(table)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    named_params = dict(model.named_parameters())
    # (a frozen one read so is a constant in the real step too: it has no gradient to miss)
    recorder.real_parameters = {id(p): name for name, p in named_params.items() if p.requires_grad}
    named_buffers = dict(model.named_buffers())
    with fake_mode:
        fake_params = {k: _fake_like(p, requires_grad=p.requires_grad) for k, p in named_params.items()}
        fake_buffers = {k: _fake_like(b) for k, b in named_buffers.items()}
        fake_inputs = tuple(_fake_like(x) if isinstance(x, torch.Tensor) else x for x in inputs)
    trainable = {k: p for k, p in fake_params.items() if p.requires_grad}
    optimizer = _make_optimizer(optimizer_cls, list(trainable.values()), optimizer_kwargs)
    with fake_mode:
        _warm_up(optimizer, trainable.values(), recorder)
    _add_leaf_ops(recorder, table, trainable, fake_params, fake_buffers, fake_inputs, optimizer)
    hooks = _scope_hooks(model, recorder)
    fakes = {id(t): fake for name, fake in {**fake_params, **fake_buffers}.items()
             for t in [named_params.get(name, named_buffers.get(name))]}
    try:
        with _fake_tensor_log_quiet(), without_onednn(), _swapped_in(model, fakes), fake_mode, recorder, \
                GradFnStamper(recorder), _tolist_unrecorded(recorder):
            output = model(*fake_inputs)
            loss = _loss(output, loss_fn, recorder)
            recorder.stamp_pending()
            recorder.phase = "backward"
            loss.backward()
            for index, p in enumerate(trainable.values()):
                if p.grad is not None:
                    recorder.set_owner(p.grad, index)
                else:  # the loss never reaches it: no gradient, and Adam makes no state for it in a real run
                    table.param_bytes[recorder.param_ops[index]] = tensor_bytes(p)
            recorder.phase = "update"
            optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
    if batch_size == 0 and inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() > 0:
        batch_size = int(inputs[0].shape[0])
    num_params = sum(p.numel() for p in trainable.values())
    meta = {"optimizer": optimizer_cls.__name__, "trace_s": f"{time.perf_counter() - started:.3f}"}
    tied = _tied_names(model)
    if tied:
        meta[TIED_PARAMETERS] = tied
    return _to_opgraph(table, name, batch_size, num_params, source or f"torch trace of {type(model).__name__}",
                       meta)


@contextmanager
def _tolist_unrecorded(recorder: OpRecorder):
    """``tensor.tolist()`` reads values as ``.item()`` does (each answers 1, counted), without the
    ``aten.unbind`` a fake tensor's tolist dispatches to get at its elements: a real tensor's reads its data
    directly, and the torch measurer refused the step ("is aten.unbind in the graph but the step ran
    aten.select")."""
    from torch._subclasses.fake_tensor import FakeTensor

    fake_tolist = FakeTensor.tolist

    def tolist(self):
        muted, recorder.muted = recorder.muted, True
        try:
            return fake_tolist(self)
        finally:
            recorder.muted = muted

    FakeTensor.tolist = tolist
    try:
        yield
    finally:
        FakeTensor.tolist = fake_tolist


@contextmanager
def _fake_tensor_log_quiet():
    """FakeTensorMode logs a traceback (~20 lines on stderr) for an op that fails on its shapes before it
    raises; the exception itself becomes the one error line (bad input), so its log is silenced."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@contextmanager
def _swapped_in(model: nn.Module, replacements: dict[int, torch.Tensor]):
    """Every parameter and buffer of ``model`` (tied ones wherever they are held) replaced by its fake tensor,
    ``replacements`` by id of the real one, for forward, loss and backward: a checkpointed block
    (``torch.utils.checkpoint``) runs its forward again in the backward, and must read the traced parameters
    then too (with the real ones its recomputed ops read constants, and a reentrant checkpoint's gradients
    missed the parameters, whose updates were then left out of the step)."""
    swapped = []
    for module in model.modules():
        for slots in (module._parameters, module._buffers):
            for key, t in slots.items():
                if t is not None and id(t) in replacements:
                    swapped.append((slots, key, t))
                    slots[key] = replacements[id(t)]
    try:
        yield
    finally:
        for slots, key, t in reversed(swapped):
            slots[key] = t


def _fake_like(t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
    """A fake tensor of ``t``'s shape and dtype (on CPU when ``t`` lives on the meta device)."""
    device = "cpu" if t.device.type == "meta" else t.device
    fake = torch.empty(t.shape, dtype=t.dtype, device=device)
    return fake.requires_grad_(requires_grad) if requires_grad else fake


def _make_optimizer(optimizer_cls: type, params: list, kwargs: dict | None) -> torch.optim.Optimizer:
    kwargs = dict(kwargs or {})
    if "foreach" in inspect.signature(optimizer_cls).parameters:
        kwargs.setdefault("foreach", False)  # one update op per parameter, colocatable with its Variable
    if not params:
        raise PlacerError("the model has no trainable parameters: there is no training step to trace")
    return optimizer_cls(params, **kwargs)


def _warm_up(optimizer: torch.optim.Optimizer, params, recorder: OpRecorder) -> None:
    """One untraced step so the optimizer's state exists before the traced step."""
    recorder.muted = True
    with recorder:
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    recorder.muted = False


def _add_leaf_ops(recorder: OpRecorder, table: OpTable, trainable: dict, params: dict, buffers: dict,
                  inputs: tuple, optimizer: torch.optim.Optimizer) -> None:
    """Variable ops (parameters, then buffers) and Input ops, registered as the writers of their tensors."""
    for index, (name, p) in enumerate(trainable.items()):
        state = {key: s for key, s in optimizer.state[p].items() if isinstance(s, torch.Tensor)}
        # Moments have the parameter's shape; scalar state (Adam's step counter) does not count, also where
        # the parameter itself has one element
        moments = [s for key, s in state.items() if key != "step" and s.shape == p.shape]
        resident = 2 * tensor_bytes(p) + sum(tensor_bytes(s) for s in moments)  # weight + grad + moments
        scope = _owner_scope(name)
        op = table.add(f"param:{name}", "Variable", scope, "other", out_bytes=tensor_bytes(p),
                       param_bytes=resident)
        recorder.register_variable(p, op)
        recorder.param_ops.append(op)
        recorder.param_scopes.append(scope)
        for t in state.values():
            recorder.register_variable(t, op)
        for t in [p, *state.values()]:
            recorder.set_owner(t, index)
    frozen = {k: v for k, v in params.items() if k not in trainable}
    for name, t in {**frozen, **buffers}.items():
        op = table.add(f"param:{name}", "Variable", _owner_scope(name), "other", out_bytes=tensor_bytes(t),
                       param_bytes=tensor_bytes(t))
        recorder.register_variable(t, op)
    for index, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            recorder.register(x, table.add(f"input:{index}", "Input", "", "other", out_bytes=tensor_bytes(x)))


def check_distinct_inputs(inputs: tuple) -> None:
    """One tensor given as two example inputs (an autoencoder's ``(x, x)``) is refused: the graph names a
    tensor once, so one input had no readers, and a placed step fed the other's value to both."""
    first: dict[int, int] = {}
    for index, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            if id(x) in first:
                raise PlacerError(f"example inputs {first[id(x)]} and {index} are the same tensor: pass a copy "
                                  f"as one of them (e.g. (x, x.clone())), so that each input is fed on its own")
            first[id(x)] = index


def _owner_scope(param_name: str) -> str:
    return param_name.rpartition(".")[0]


def _tied_names(model: nn.Module) -> list[list[str]]:
    """The names of each parameter or buffer ``model`` holds under more than one name (tied weights, a module
    registered twice), the name of its Variable op first. The step has one Variable op for it, in the first
    holder's scope; `.to()` on any holder moves it for all, so `placer apply`'s module map puts them on one
    device."""
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    return [held for held in names.values() if len(held) > 1]


def _scope_hooks(model: nn.Module, recorder: OpRecorder) -> list:
    """Forward pre/post hooks on every submodule that push and pop its dotted path."""
    handles = []
    for path, module in model.named_modules():
        if not path:
            continue

        def push(_module, _args, path=path):
            recorder.scope_stack.append(path)

        def pop(_module, _args, _output):
            recorder.scope_stack.pop()
            if recorder.phase == "backward" and recorder._pending:
                # A reentrant checkpoint's recomputed forward runs where GradFnStamper sees no torch-level
                # call: stamp its nodes here, outside dispatch, or their backward ops took whatever scope
                # the incoming gradient's producer had (the next module's) and no colocation.
                recorder.stamp_pending()

        handles.append(module.register_forward_pre_hook(push))
        handles.append(module.register_forward_hook(pop, always_call=True))
    return handles


def _loss(output, loss_fn: Callable | None, recorder: OpRecorder) -> torch.Tensor:
    recorder.scope_stack.append(LOSS_SCOPE)
    try:
        loss = loss_fn(output) if loss_fn is not None else output
        if not isinstance(loss, torch.Tensor):
            raise PlacerError(_not_a_loss(loss, loss_fn is None))
        if not loss.requires_grad:
            raise PlacerError("the loss does not depend on any trainable parameter (it has no gradient: an "
                              "argmax, an integer output or a detached value?), so there is no backward to trace")
        return loss if loss.dim() == 0 else loss.sum()
    finally:
        recorder.scope_stack.pop()


def _not_a_loss(loss, from_model: bool) -> str:
    """Why ``loss`` is no loss; for a model's dict or tuple output, how to pick the loss from it."""
    if not from_model:
        return f"the loss must be a tensor, but loss_fn returned {type(loss).__name__}"
    pick = {dict: "out['loss']", tuple: "out[0]", list: "out[0]"}.get(type(loss))
    how = f": return (model, example_inputs, loss_fn) with loss_fn picking it, e.g. lambda out: {pick}" if pick else ""
    return f"the model's output is the loss unless a loss_fn is given, and it returned {type(loss).__name__}{how}"


def _to_opgraph(table: OpTable, name: str, batch_size: int, num_params: int, source: str,
                meta: dict) -> OpGraph:
    return OpGraph(
        name=name, framework="torch",
        op_names=np.array(table.names, dtype=object), op_kinds=np.array(table.kinds, dtype=object),
        flops=np.array(table.flops, dtype=np.float64),
        bytes_accessed=np.array(table.bytes_accessed, dtype=np.float64),
        out_bytes=np.array(table.out_bytes, dtype=np.int64),
        param_bytes=np.array(table.param_bytes, dtype=np.int64),
        edge_src=np.array(table.edge_src, dtype=np.int64), edge_dst=np.array(table.edge_dst, dtype=np.int64),
        edge_bytes=np.array(table.edge_bytes, dtype=np.int64),
        colocation=colocation_groups(len(table.names), table.colocate_pairs),
        scopes=np.array(table.scopes, dtype=object), phases=np.array(table.phases, dtype=np.int8),
        batch_size=batch_size, num_params=num_params, source=source, meta=meta,
    )


def import_torch_spec(spec: str) -> OpGraph:
    """Trace the model that ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` returns.

    The function takes no arguments and returns ``(model, example_inputs)`` or
    ``(model, example_inputs, loss_fn)``. Any failure to get there is one PlacerError naming the spec.
    """
    from graphs.specs import absolute_spec, call_spec

    result = call_spec(spec, "torch")
    func_name = spec.rpartition(":")[2]
    model, example_inputs, loss_fn = check_spec_result(spec, result)
    try:
        return trace_training_step(model, example_inputs, loss_fn, name=func_name,
                                   source=f"torch:{absolute_spec(spec)}")
    except PlacerError as error:
        raise PlacerError(f"torch spec {spec!r}: {error}") from error
    except Exception as error:  # the model's own forward/backward failed on the example inputs
        raise PlacerError(f"torch spec {spec!r}: tracing the training step failed: "
                          f"{type(error).__name__}: {first_line(error)}") from error


def check_spec_result(spec: str, result) -> tuple:
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise PlacerError(f"torch spec {spec!r}: the function must return (model, example_inputs) or "
                          f"(model, example_inputs, loss_fn), got {type(result).__name__}")
    model, example_inputs, loss_fn = (*result, None) if len(result) == 2 else result
    if not isinstance(model, nn.Module):
        raise PlacerError(f"torch spec {spec!r}: the model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise PlacerError(f"torch spec {spec!r}: example_inputs must be a tensor or a tuple of tensors")
    if loss_fn is not None and not callable(loss_fn):
        raise PlacerError(f"torch spec {spec!r}: loss_fn must be callable, got {type(loss_fn).__name__}")
    return model, tuple(inputs), loss_fn
