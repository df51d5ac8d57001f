"""Capture one real training step as a list of aten calls, and replay it with every op on its own device.

Why not run the step under autograd with a dispatch mode that moves tensors: autograd checks that the
gradient of a tensor lives on that tensor's device, so any cross-device edge fails in backward. Instead
`capture_step` runs the step once on the CPU under a recording `TorchDispatchMode` (the same aten stream
the importer traced: forward, backward, optimizer update) and keeps every call with its arguments, tensors
replaced by slot numbers. `PlacedReplay` then calls those aten ops directly (no autograd) with:

- every tensor input moved to the op's device, one copy per (tensor, destination device) until the tensor
  is written again (as the simulator assumes: each tensor sent once per destination);
- ``device=`` of factory ops (zeros, arange...) set to the op's device;
- views and aliases (no kernel, no data) run where their base lives, so they stay views of it, and so do
  in-place view ops (``transpose_``: a new shape, no data);
- an in-place write to a tensor that lives elsewhere is computed on the op's device and copied back (batch
  norm's running statistics included, which its schema does not mark as written).

Values read by Python during the step (``.item()``, e.g. Adam's step count) are baked into the program
as the capture saw them: every replay repeats the same step arithmetic, which is what a timing needs.
Training needs them live: ``capture_step(..., live_scalars=True)`` records each float read as a step of
its own and the arguments computed from it as expressions (`measurers.torch.live_scalars`), so every
replay reads the value anew and recomputes them (Adam's bias correction follows the step count).
"""

from __future__ import annotations

import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from graphs.torch.recorder import (ALIAS_OPS, SCALAR_OP, SKIPPED_NAMESPACES, tensor_bytes, undeclared_writes,
                                   without_onednn)
from measurers.torch.live_scalars import LiveArg, LiveFloat, ScalarReads


@dataclass(frozen=True)
class SlotRef:
    slot: int


@dataclass
class Step:
    func: object  # torch OpOverload, None for a re-striding of ``base``, SCALAR_OP for a live read of inputs[0]
    args: tuple  # arguments with SlotRef in place of tensors (and LiveArg in place of live floats)
    kwargs: dict
    out: object  # output structure with SlotRef leaves
    counted: bool  # the importer recorded this call as a graph op
    is_view: bool  # output aliases an input (or the call is an alias op)
    mutated: tuple  # slots written in place
    restride: tuple = ()  # (base slot, size, stride, offset) for func None
    inputs: tuple = ()  # every input slot, in argument order
    invalidates: tuple = ()  # slots whose copies go stale (all aliases of the mutated slots)
    # A plan for the common case (filled by `capture_step`): top-level tensor arguments, fresh outputs.
    arg_refs: tuple = ()  # (argument index, slot)
    simple: bool = False  # no tensor inside a list argument or a keyword, no device= keyword
    out_refs: tuple = ()  # (index among the output's leaves, slot) of outputs that are new slots
    call: object = None  # the C++ op behind ``func`` (skips OpOverload's Python wrapper)
    frees: tuple = ()  # slots read for the last time here (or never read): dropped after the step
    out_bytes: int = -1  # its outputs' bytes as captured, for a counted call that neither views nor writes


@dataclass
class Program:
    steps: list
    num_slots: int
    leaf_values: dict  # slot -> CPU tensor value at first sight (params, state, inputs, constants)
    leaf_ops: dict  # slot -> graph leaf op name ("param:w", "input:0") where known
    storage_group: list  # slot -> storage group id (aliasing slots share one)
    loss_slot: int
    param_slots: dict = field(default_factory=dict)  # parameter (or buffer) name -> slot

    @property
    def counted_kinds(self) -> list[str]:
        return [f"{s.func.namespace}.{s.func._overloadpacket.__name__}" for s in self.steps if s.counted]


def _mutated_args(func, args: tuple, kwargs: dict) -> tuple[tuple, tuple, bool]:
    """(indices, names) of the arguments ``func`` writes, and whether it is a view. An in-place view op
    (``transpose_``) changes its tensor's shape, not its data: it counts as a view, so it runs where the
    tensor lives, and as a write, so copies made before it go stale."""
    schema = func._schema.arguments
    mutated = [i for i, a in enumerate(schema) if a.alias_info is not None and a.alias_info.is_write]
    mutated += undeclared_writes(func, args, kwargs)  # batch norm's running statistics
    inplace_view = torch.Tag.inplace_view in func.tags
    is_view = inplace_view or (any(r.alias_info is not None for r in func._schema.returns) and not mutated)
    return tuple(mutated), tuple(schema[i].name for i in mutated), is_view


class _Capture(TorchDispatchMode):
    def __init__(self, leaf_names: dict[int, str]):
        super().__init__()
        self.leaf_names = leaf_names  # id(tensor) -> graph leaf op name
        self.steps: list[Step] = []
        self.kept: dict[int, torch.Tensor] = {}  # slot -> tensor, held until the step can no longer reach it
        self._release_after = (_RELEASE_EVERY_SLOTS, _RELEASE_EVERY_BYTES)  # new slots, new storage bytes
        self._new_since_release = [0, 0]
        self.slot_of: dict[int, int] = {}  # id(tensor) -> slot, for the tensors held
        self.by_storage: dict[int, list[int]] = {}  # storage key -> slots viewing it, while the storage lives
        self._storage_watch: list[weakref.finalize] = []
        self.group: list[int] = []
        self.leaf_values: dict[int, torch.Tensor] = {}
        self.leaf_ops: dict[int, str] = {}
        self.scalars: ScalarReads | None = None  # set when the capture keeps Python reads live
        self.num_reads = 0

    def _new_slot(self, t: torch.Tensor) -> int:
        slot = len(self.group)  # one storage group entry per slot, appended below
        self.kept[slot] = t
        self.slot_of[id(t)] = slot
        storage = t.untyped_storage()
        key = storage._cdata
        members = self.by_storage.get(key)
        if members is None:  # the key leaves when the storage dies, before its address can be reused
            members = self.by_storage[key] = []
            self._storage_watch.append(weakref.finalize(storage, _forget_storage, self.by_storage, key, members))
            self._new_since_release[1] += storage.nbytes()
        self._new_since_release[0] += 1
        self.group.append(self.group[members[0]] if members else slot)
        members.append(slot)
        return slot

    def _release_unreachable(self) -> None:
        """Let go of the tensors that nothing but the capture holds: no Python name and no C++ owner
        (autograd's saved tensors, views, the optimizer), so the step can never read them again and eager
        PyTorch would have freed them. A capture that held every tensor could not capture the full-size RNNLM
        in 24 GB (BENCHMARKS.md, "Real measurers": tests/bench/bench_torch_capture.py).
        A tensor that C++ still owns is kept too: its Python object lives on, and so does its slot.

        Why the capture holds tensors at all: autograd accumulates a gradient in place, or steals it for
        ``.grad``, when nothing else holds it. The importer traces with every tensor held, so the capture
        holds each one for as long as the step can reach it, and makes the same calls."""
        alone = _references_in({0: torch.empty(0)}, 0)
        for slot in reversed(list(self.kept)):  # newest first: a view goes before the base it holds
            if _references_in(self.kept, slot) == alone and self.kept[slot]._use_count() == 1:
                del self.slot_of[id(self.kept.pop(slot))]
        held_bytes = _storage_bytes(self.kept.values())
        # The next release after a quarter more slots or bytes than are held now: linear time in all.
        self._release_after = (max(_RELEASE_EVERY_SLOTS, len(self.kept) // 4),
                               max(_RELEASE_EVERY_BYTES, held_bytes // 4))
        self._new_since_release = [0, 0]

    def close(self) -> None:
        """Stop watching the storages that outlive the capture (parameters, optimizer state)."""
        for watch in self._storage_watch:
            watch.detach()
        self._storage_watch.clear()
        self.kept.clear()

    def slot(self, t: torch.Tensor) -> int:
        """The slot of ``t``: known by identity, else a re-striding of a tensor on the same storage, else a leaf."""
        slot = self.slot_of.get(id(t))
        if slot is not None:
            return slot
        members = self.by_storage.get(t.untyped_storage()._cdata)
        if members:
            base = members[0]
            slot = self._new_slot(t)
            self.steps.append(Step(None, (), {}, SlotRef(slot), False, True, (),
                                   (base, tuple(t.shape), tuple(t.stride()), t.storage_offset())))
            return slot
        slot = self._new_slot(t)
        self.leaf_values[slot] = t.detach().clone()
        if id(t) in self.leaf_names:
            self.leaf_ops[slot] = self.leaf_names[id(t)]
        return slot

    def record_read(self, t: torch.Tensor) -> int:
        """A live ``.item()`` of ``t``: a step the replay runs to read it again; returns the read's index."""
        slot = self.slot(t)
        self.steps.append(Step(SCALAR_OP, (SlotRef(slot),), {}, None, False, False, (), inputs=(slot,)))
        self.num_reads += 1
        return self.num_reads - 1

    def _ref(self, x):
        if isinstance(x, torch.Tensor):
            return SlotRef(self.slot(x))
        if isinstance(x, LiveFloat):
            return LiveArg(x.expr)
        live = self.scalars.live_values if self.scalars is not None else None
        if live and type(x) is float and x in live:
            return LiveArg(live[x])
        return x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SCALAR_OP or func.namespace in SKIPPED_NAMESPACES:
            return func(*args, **kwargs)  # a Python value or a device query: baked in, not replayed
        t_args, t_kwargs = tree_map(self._ref, args), tree_map(self._ref, kwargs)
        out = func(*args, **kwargs)
        mutated_idx, mutated_names, is_view = _mutated_args(func, args, kwargs)
        mutated = []
        for index, name in zip(mutated_idx, mutated_names):
            value = t_args[index] if index < len(t_args) else t_kwargs.get(name)
            mutated.extend(x.slot for x in tree_flatten(value)[0] if isinstance(x, SlotRef))
        inputs = {id(x) for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)}

        def out_ref(x):
            if not isinstance(x, torch.Tensor):
                return x
            return SlotRef(self.slot_of[id(x)] if id(x) in inputs else self._new_slot(x))

        t_out = tree_map(out_ref, out)
        in_slots = tuple(x.slot for x in tree_flatten((t_args, t_kwargs))[0] if isinstance(x, SlotRef))
        plain = func not in ALIAS_OPS and not is_view and not mutated  # the importer's out bytes: all its outputs
        out_bytes = sum(tensor_bytes(x) for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)) if plain else -1
        self.steps.append(Step(func, t_args, t_kwargs, t_out, func not in ALIAS_OPS,
                               is_view or func in ALIAS_OPS, tuple(mutated), inputs=in_slots, out_bytes=out_bytes))
        if any(new >= limit for new, limit in zip(self._new_since_release, self._release_after)):
            self._release_unreachable()
        return out


def capture_step(step_fn: Callable[[], torch.Tensor], leaf_names: dict[int, str],
                 params: dict[str, torch.Tensor], live_scalars: bool = False) -> Program:
    """Run ``step_fn`` (forward, loss, backward, update; returns the loss) once and record it.
    ``live_scalars``: float ``.item()`` reads and what is computed from them stay live (module docstring)."""
    capture = _Capture(leaf_names)
    try:
        if live_scalars:
            capture.scalars = ScalarReads(capture.record_read)
            with without_onednn(), _view_replay(), _OneHotAsTraced(), capture, capture.scalars:
                loss = step_fn()
        else:
            with without_onednn(), _view_replay(), _OneHotAsTraced(), capture:
                loss = step_fn()
        loss_slot = capture.slot_of.get(id(loss))
    finally:
        capture.close()
    if loss_slot is None:
        raise RuntimeError("the step's loss was not produced by any recorded op")
    members: dict[int, list[int]] = {}
    for slot, group in enumerate(capture.group):
        members.setdefault(group, []).append(slot)
    for step in capture.steps:
        step.invalidates = tuple(m for slot in step.mutated for m in members[capture.group[slot]])
        _plan(step)
    _plan_frees(capture.steps, loss_slot)
    return Program(capture.steps, len(capture.group), capture.leaf_values, capture.leaf_ops, capture.group,
                   loss_slot, {name: capture.slot_of[id(p)] for name, p in params.items() if id(p) in capture.slot_of})


class _OneHotAsTraced(TorchFunctionMode):
    """``F.one_hot(x, n)`` as the importer's trace records it: ``arange(n)``, ``eq`` with ``x.unsqueeze(-1)``,
    then to int64. On real CPU tensors PyTorch first checks the labels' range (``aminmax``, then ``.item()``)
    and scatters into zeros, which the fake trace never does: the captured step did not match its graph and
    every placement of a model with one_hot was refused. (Labels out of range are no longer an error here.)"""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.one_hot:
            tensor, num_classes = args[0], (args[1] if len(args) > 1 else kwargs.get("num_classes", -1))
            if num_classes >= 0:  # -1 (classes from the labels) is data-dependent: the importer refuses it
                index = torch.arange(num_classes, dtype=tensor.dtype, device=tensor.device)
                return torch.eq(tensor.unsqueeze(-1), index).to(torch.long)
        return func(*args, **kwargs)


def _view_replay():
    """Autograd rebuilds a view written in place (``x[:, :4].mul_(2)`` on a tensor that needs a gradient) by
    replaying its view ops on the base (``slice``), as it always does for the importer's fake tensors, not by
    one ``as_strided`` as it does for plain tensors: the captured ops are then the traced graph's."""
    return torch.autograd._force_original_view_tracking(True)


_RELEASE_EVERY_SLOTS = 256  # at least this many new slots, or new storage bytes, between two releases
_RELEASE_EVERY_BYTES = 64 * 2**20


def _references_in(holder: dict, key) -> int:
    """Python references to ``holder[key]``, counted the same way for a probe and for a candidate."""
    value = holder[key]
    return sys.getrefcount(value)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under ``tensors``."""
    return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}.values())


def _forget_storage(by_storage: dict, key: int, members: list) -> None:
    if by_storage.get(key) is members:
        del by_storage[key]


def _plan(step: Step) -> None:
    if step.func is None or step.func is SCALAR_OP:
        return
    step.arg_refs = tuple((i, x.slot) for i, x in enumerate(step.args) if type(x) is SlotRef)
    step.call = getattr(step.func, "_op", step.func)
    nested = any(type(x) in (list, tuple) and any(type(y) is SlotRef for y in _leaves(x)) for x in step.args)
    keyword_refs = any(type(y) is SlotRef for v in step.kwargs.values() for y in _leaves(v))
    live = any(type(y) is LiveArg for y in (*_leaves(list(step.args)), *_leaves(list(step.kwargs.values()))))
    step.simple = not nested and not keyword_refs and not live and step.kwargs.get("device") is None
    step.out_refs = tuple((i, ref.slot) for i, ref in enumerate(_leaves(step.out))
                          if type(ref) is SlotRef and ref.slot not in step.inputs)


def _plan_frees(steps: list, keep: int) -> None:
    """Free each slot after its last reader (or its producer, when nothing reads it), as eager PyTorch
    frees a tensor after its last use, so a placement's peak memory is the step's, not every tensor's."""
    last: dict[int, int] = {}
    for index, step in enumerate(steps):
        reads = (step.restride[0],) if step.func is None else step.inputs
        outs = (step.out.slot,) if step.func is None else tuple(slot for _, slot in step.out_refs)
        for slot in (*outs, *reads):
            last[slot] = index
    frees: dict[int, list[int]] = {}
    for slot, index in last.items():
        if slot != keep:
            frees.setdefault(index, []).append(slot)
    for index, step in enumerate(steps):
        step.frees = tuple(frees.get(index, ()))


class PlacedReplay:
    """One placement of a program: leaves placed once, then ``run()`` replays the step (no autograd).

    ``step_devices``: logical device of every counted step, in order. ``torch_devices``: the torch device of
    each logical device (several logical devices may share one torch device: copies still happen, which
    is how CPU-only tests exercise the copy logic). ``leaf_device``: logical device of each leaf slot.
    """

    def __init__(self, program: Program, step_devices: list[int], torch_devices: list[torch.device],
                 leaf_device: dict[int, int]):
        self.program, self.step_devices, self.torch_devices = program, step_devices, torch_devices
        self.copies = 0  # cross-device copies made by the last run
        self._reads: list = []  # live ``.item()`` values of the run under way
        self.leaves = {slot: (program.leaf_values[slot].to(torch_devices[d], copy=True), d)
                       for slot, d in leaf_device.items()}

    def run(self, step_times_s: list | None = None, sync=None) -> torch.Tensor:
        """Replay the step once; returns the loss (on its device). With ``step_times_s`` (a list), the time
        of every counted step is appended to it, each bracketed by ``sync()`` (used by the profiler)."""
        program = self.program
        home: list = [None] * program.num_slots  # slot -> tensor where it lives
        where: list = [-1] * program.num_slots  # slot -> logical device
        for slot, (t, d) in self.leaves.items():
            home[slot], where[slot] = t, d
        cache: dict[int, dict[int, torch.Tensor]] = {}  # slot -> device -> copy
        self.copies = 0
        self._reads = []  # this run's live ``.item()`` values, in order
        counted = iter(self.step_devices)
        with torch.no_grad():
            for step in program.steps:
                device = next(counted) if step.counted else None
                if step.func is None:
                    base, size, stride, offset = step.restride
                    out_slot = step.out.slot
                    home[out_slot], where[out_slot] = home[base].as_strided(size, stride, offset), where[base]
                    self._free(step, home, cache)
                    continue
                if step.func is SCALAR_OP:
                    self._reads.append(home[step.inputs[0]].item())
                    self._free(step, home, cache)
                    continue
                if step_times_s is not None and step.counted:
                    sync()
                    began = time.perf_counter()
                    self._run_step(step, device, home, where, cache)
                    sync()
                    step_times_s.append(time.perf_counter() - began)
                else:
                    self._run_step(step, device, home, where, cache)
                self._free(step, home, cache)
        return home[program.loss_slot]

    @staticmethod
    def _free(step: Step, home: list, cache: dict) -> None:
        for slot in step.frees:
            home[slot] = None
            cache.pop(slot, None)

    def _run_step(self, step: Step, device, home: list, where: list, cache: dict) -> None:
        if step.is_view or device is None:
            device = where[step.inputs[0]] if step.inputs else (device or 0)
        if step.simple and all(where[slot] == device for slot in step.inputs):  # the fast path: all local
            args = list(step.args)
            for index, slot in step.arg_refs:
                args[index] = home[slot]
            out = step.call(*args, **step.kwargs)
        else:
            out = self._run_moving(step, device, home, where, cache)
        for slot in step.invalidates:
            cache.pop(slot, None)
        if step.out_refs:
            leaves = _leaves(out)
            for index, slot in step.out_refs:  # an input returned (in place) keeps its home
                home[slot], where[slot] = leaves[index], device

    def _run_moving(self, step: Step, device: int, home: list, where: list, cache: dict):
        """Run ``step`` on ``device``, copying inputs that live elsewhere (cached per destination)."""
        torch_device = self.torch_devices[device]
        written_back: list[tuple[int, torch.Tensor]] = []

        def fetch(slot: int) -> torch.Tensor:
            if where[slot] == device:
                return home[slot]
            if slot in step.mutated:  # written here: a private copy, copied back afterwards
                copy = home[slot].to(torch_device, copy=True)
                written_back.append((slot, copy))
                self.copies += 1
                return copy
            copies = cache.setdefault(slot, {})
            copy = copies.get(device)
            if copy is None:
                copy = copies[device] = home[slot].to(torch_device, copy=True)
                self.copies += 1
            return copy

        args = tuple(_subst(x, fetch, self._reads) for x in step.args)
        kwargs = {k: _subst(v, fetch, self._reads) for k, v in step.kwargs.items()}
        if kwargs.get("device") is not None:
            kwargs["device"] = torch_device
        out = step.func(*args, **kwargs)
        for slot, copy in written_back:
            home[slot].copy_(copy)
        return out


def _subst(x, fetch, reads: list):
    """``x`` with every SlotRef replaced by ``fetch(slot)`` and every LiveArg by its value under ``reads``
    (arguments nest only lists and tuples)."""
    kind = type(x)
    if kind is SlotRef:
        return fetch(x.slot)
    if kind is LiveArg:
        return x.value(reads)
    if kind is list or kind is tuple:
        return kind(_subst(item, fetch, reads) for item in x)
    return x


def _leaves(x) -> list:
    if type(x) is list or type(x) is tuple:
        return [leaf for item in x for leaf in _leaves(item)]
    return [x]
