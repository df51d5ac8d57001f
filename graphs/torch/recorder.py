"""Record every aten call of a fake-tensor training step as one op of a graph under construction.

`OpRecorder` is a `TorchDispatchMode` that sits above `FakeTensorMode`: it sees each aten call once, lets
the fake mode compute output metadata, and records the op's kind, FLOPs, bytes, scope, phase, data edges
and colocation links. `graphs.torch.importer.trace_training_step` drives it through forward, backward and
update.

Who wrote a tensor: an op's fresh outputs are registered by tensor identity and by storage; a view only by
tensor identity (it aliases its base); an in-place op re-registers the storage it mutates, an in-place view
(``t_``, ``squeeze_``..., ``set_``: it changes shape, strides or storage, not data) only the tensor. A read
resolves to the tensor's own writer unless its storage was written later (then to that later writer). Every tensor
seen is kept alive, so ``id()`` and storage keys are never reused during a trace. What an op writes is what
its schema marks written, and batch norm's running statistics (``UNDECLARED_WRITES``); an op that writes
the storage of a Variable (a parameter, a buffer, optimizer state) is colocated with that Variable.

Backward → forward: after a forward op returns through autograd its outputs carry ``grad_fn``; the
recorder stamps that node's ``metadata`` with the op id (when the torch-level call returns), and during
backward ``torch._C._current_autograd_node()`` names the node whose backward is running. A module's forward
run again inside the backward (a ``torch.utils.checkpoint`` block recomputing what it did not keep) records
forward ops of that module, in the backward phase, and stamps their nodes too: a reentrant checkpoint's
backward through them follows them.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils._pytree import tree_leaves
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from graphs.errors import PlacerError
from graphs.opgraph import PHASE_CODE
from graphs.torch import LOSS_SCOPE
from graphs.torch.dtype_rules import dtype_problem
from graphs.torch.flops import op_flops

NODE_KEY = "placer_op"  # key in an autograd node's metadata: the forward op it differentiates
# Ops that move no data and are not recorded: aliases (their output resolves to the input's writer),
# device queries and profiler markers. `_local_scalar_dense` (`.item()`) has no data under fake tensors:
# it answers 1 and is not recorded.
ALIAS_OPS = {torch.ops.aten.detach.default, torch.ops.aten.alias.default, torch.ops.aten.lift_fresh.default}
SKIPPED_NAMESPACES = {"prim", "profiler"}
SCALAR_OP = torch.ops.aten._local_scalar_dense.default
MAX_SCALAR_READS = 10_000  # a loop until a value changes reads 1 for ever: the import hung, its memory growing
# In-place views (schema tag ``inplace_view``: squeeze_, unsqueeze_, t_, transpose_, as_strided_, detach_...)
# change only the tensor's shape and strides, as a view does. ``resize_`` / ``resize_as_`` also do unless they
# grow the storage: then they allocate the new storage and copy the old one's bytes into it. ``set_`` points
# the tensor at another tensor's (or a given) storage: it becomes a view of that data, and reads nothing of
# its own.
RESIZE_OPS = {torch.ops.aten.resize_.default, torch.ops.aten.resize_as_.default}
REBINDING_OPS = {torch.ops.aten.set_}
# Kernels that write arguments their schema does not mark as written: batch norm in training updates its
# running statistics in place (``_native_batch_norm_legit`` and ``_batch_norm_with_update``, ``.out`` too,
# declare it; these do not). The ``.out`` overloads write them as well: native_batch_norm.out does on the
# CPU, and ``_batch_norm_with_update.out`` updates them on CUDA by calling cudnn_ / miopen_batch_norm.out.
# The ``_functional`` variants return new statistics and write nothing.
BATCH_NORM_STATS = ("running_mean", "running_var")
UNDECLARED_WRITES = {torch.ops.aten.native_batch_norm.default: BATCH_NORM_STATS,
                     torch.ops.aten.native_batch_norm.out: BATCH_NORM_STATS,
                     torch.ops.aten.cudnn_batch_norm.default: BATCH_NORM_STATS,
                     torch.ops.aten.cudnn_batch_norm.out: BATCH_NORM_STATS,
                     torch.ops.aten.miopen_batch_norm.default: BATCH_NORM_STATS,
                     torch.ops.aten.miopen_batch_norm.out: BATCH_NORM_STATS}


@contextmanager
def without_onednn():
    """oneDNN (mkldnn) off while a step is traced or captured. With it, nn.LSTM on the CPU is one fused
    ``aten.mkldnn_rnn_layer`` per layer (and one backward): no FLOP formula (the layer counted 0 FLOPs), no
    GPU kernel, and no workspace when replayed without autograd. Without it, the layer is its cell's matmuls
    and element-wise ops, step by step, which every device runs. The ops of other models do not change."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


@dataclass
class OpTable:
    """The growing graph: one entry per op in every list, edges as parallel lists."""

    names: list = field(default_factory=list)
    kinds: list = field(default_factory=list)
    flops: list = field(default_factory=list)
    bytes_accessed: list = field(default_factory=list)
    out_bytes: list = field(default_factory=list)
    param_bytes: list = field(default_factory=list)
    scopes: list = field(default_factory=list)
    phases: list = field(default_factory=list)
    edge_src: list = field(default_factory=list)
    edge_dst: list = field(default_factory=list)
    edge_bytes: list = field(default_factory=list)
    colocate_pairs: list = field(default_factory=list)  # (op, op) that must share a device

    def add(self, name: str, kind: str, scope: str, phase: str, flops: float = 0.0, bytes_accessed: float = 0.0,
            out_bytes: int = 0, param_bytes: int = 0) -> int:
        self.names.append(name)
        self.kinds.append(kind)
        self.flops.append(float(flops))
        self.bytes_accessed.append(float(bytes_accessed))
        self.out_bytes.append(int(out_bytes))
        self.param_bytes.append(int(param_bytes))
        self.scopes.append(scope)
        self.phases.append(PHASE_CODE[phase])
        return len(self.names) - 1


@dataclass(frozen=True)
class _Schema:
    """What an op does to its arguments, read once per overload from its schema."""

    mutated: tuple  # indices of arguments written in place
    mutated_names: tuple  # their names (for keyword-only arguments such as out=)
    is_view: bool  # some output aliases an input without writing it
    restrides: bool  # an in-place view: writes its argument's shape and strides, not its data (RESIZE_OPS: unless
    # it grows the storage)
    rebinds: bool  # REBINDING_OPS: the in-place view takes its source's storage and reads nothing of its own


def _schema_of(func) -> _Schema:
    args = func._schema.arguments
    mutated = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
    view = any(r.alias_info is not None for r in func._schema.returns) and not mutated
    restrides = torch.Tag.inplace_view in func.tags
    return _Schema(mutated, tuple(args[i].name for i in mutated), view, restrides,
                   func._overloadpacket in REBINDING_OPS)


@dataclass(frozen=True)
class _Growth:
    """A resize that grew its tensor's storage: allocated ``after_bytes``, copied ``before_bytes`` into them."""

    before_bytes: int
    after_bytes: int


def _storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def undeclared_writes(func, args, kwargs) -> list[int]:
    """Indices of the arguments ``func`` writes in place although its schema does not say so (the
    ``UNDECLARED_WRITES`` kernels, called with ``training`` true)."""
    written = UNDECLARED_WRITES.get(func)
    if written is None:
        return []
    schema = func._schema.arguments
    training = next(i for i, a in enumerate(schema) if a.name == "training")
    if not argument(args, kwargs, training, "training"):
        return []
    return [i for i, a in enumerate(schema) if a.name in written]


def argument(args, kwargs, index: int, name: str):
    """The value of a call's argument ``index`` called ``name``, given positionally or by keyword."""
    return args[index] if index < len(args) else kwargs.get(name)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(tree) -> list:
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _costed_bytes(schema: _Schema, inputs: list, outputs: list, mutated: list, metadata_only: bool,
                  growth: _Growth | None) -> tuple[int, int]:
    """(bytes accessed, fresh out bytes) of one call.

    A view or an in-place write allocates nothing: its outputs live in its input's storage. A view (in place
    or not, ``set_`` too) moves no data either. Edges out of it still carry the tensor's bytes (a consumer
    elsewhere needs the data). Approximation: the base's memory is freed with its last direct consumer (the
    view op), not with the view's consumers. A resize that grows allocates the new storage and reads and
    writes the old one's bytes (the new part is left uninitialized).
    """
    if growth is not None:
        return 2 * growth.before_bytes, growth.after_bytes
    fresh_bytes = sum(tensor_bytes(t) for t in outputs if not schema.is_view and not any(t is m for m in mutated))
    if metadata_only:
        return 0, fresh_bytes
    return sum(tensor_bytes(t) for t in inputs) + sum(tensor_bytes(t) for t in outputs), fresh_bytes


class OpRecorder(TorchDispatchMode):
    """Records ops into ``table``; the driver sets ``phase``, pushes scopes and registers leaves."""

    def __init__(self, table: OpTable) -> None:
        super().__init__()
        self.table = table
        self.phase = "forward"
        self.muted = False  # pass calls through unrecorded (optimizer warm-up)
        self.scope_stack: list[str] = []
        self.param_scopes: list[str] = []  # scope of each parameter's Variable op, by owner index
        self.param_ops: list[int] = []  # Variable op of each parameter, by owner index
        self._tensor_writer: dict[int, tuple[int, int]] = {}  # id(tensor) -> (op, stamp)
        self._storage_writer: dict[int, tuple[int, int]] = {}  # storage key -> (op, stamp)
        self._owner: dict[int, int] = {}  # storage key -> parameter index (update phase)
        self._variable: dict[int, int] = {}  # storage key -> Variable op holding it (parameters, buffers, state)
        self._keep: list = []  # strong references: ids and storage keys stay unique
        self._pending: list[tuple[int, list]] = []  # forward ops whose outputs' grad_fn is not stamped
        self._schemas: dict = {}
        self._num_consts = 0
        self._scalar_reads = 0  # .item() and bool() of a tensor: each answers 1 (``_one_like``)
        self.real_parameters: dict[int, str] = {}  # id(the model's own parameter) -> its name (set by the tracer)

    # -- registration -----------------------------------------------------------------------------------
    def register(self, t: torch.Tensor, op: int, storage: bool = True) -> None:
        self._keep.append(t)
        self._tensor_writer[id(t)] = (op, op)
        if storage:
            self._storage_writer[_storage_key(t)] = (op, op)

    def register_variable(self, t: torch.Tensor, op: int) -> None:
        """``t`` is resident with Variable ``op`` (a parameter, a buffer, optimizer state): an op that writes its
        storage in place is colocated with ``op``."""
        self.register(t, op)
        self._variable[_storage_key(t)] = op

    def set_owner(self, t: torch.Tensor, param_index: int) -> None:
        self._keep.append(t)
        self._owner[_storage_key(t)] = param_index

    def writer_of(self, t: torch.Tensor) -> int:
        """The op whose output ``t`` is (a constant Input op for a tensor never seen before)."""
        by_tensor = self._tensor_writer.get(id(t))
        by_storage = self._storage_writer.get(_storage_key(t))
        if by_tensor is not None and (by_storage is None or by_storage[1] <= by_tensor[1]):
            return by_tensor[0]
        if by_storage is not None:
            return by_storage[0]
        if id(t) in self.real_parameters:
            raise PlacerError(self._parameter_reached_around_its_module(self.real_parameters[id(t)]))
        op = self.table.add(f"const:{self._num_consts}", "Input", "", "other", out_bytes=tensor_bytes(t))
        self._num_consts += 1
        self.register(t, op)
        return op

    @staticmethod
    def _parameter_reached_around_its_module(name: str) -> str:
        """A parameter the step reads through a reference made before the trace (a list of
        ``model.parameters()`` for weight decay, a tied weight kept in a plain list) is the real tensor, not
        the one traced: it became a constant input, its gradient bypassed the parameter's Variable op, and
        the measurer refused the step with a mismatch naming neither."""
        return (f"parameter {name!r} is read through a reference the trace cannot follow (a list, a closure or "
                f"another object holding the tensor itself, made before the step ran): its gradient would miss "
                f"the parameter. Read it from the model as the step runs (its attribute {name!r}, or "
                f"model.parameters() inside the loss function), or hold such tensors in an nn.ParameterList")

    def current_scope(self) -> str:
        return self.scope_stack[-1] if self.scope_stack else ""

    def recomputing(self) -> bool:
        """A module's forward runs inside the backward: a checkpointed block (``torch.utils.checkpoint``)
        recomputing what it did not keep. Its ops are forward ops of that module, run in the backward pass."""
        return self.phase == "backward" and bool(self.scope_stack)

    # -- dispatch ---------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SCALAR_OP:
            self._count_scalar_read()
            return _one_like(args[0])
        if self.muted or func.namespace in SKIPPED_NAMESPACES:
            return func(*args, **kwargs)
        if func in ALIAS_OPS:
            out = func(*args, **kwargs)
            source = _tensors(args)[0]
            self._keep.append(out)
            self._tensor_writer[id(out)] = (self.writer_of(source), self._tensor_writer_stamp(source))
            return out
        self._check_dtypes(func, args, kwargs)
        node = torch._C._current_autograd_node() if self.phase == "backward" else None
        resized = args[0] if func in RESIZE_OPS else None
        storage_bytes = _storage_nbytes(resized) if resized is not None else 0
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException) as error:
            raise PlacerError(self._data_dependent(func)) from error
        grown_bytes = _storage_nbytes(resized) if resized is not None else 0
        self._record(func, args, kwargs, out, node,
                     _Growth(storage_bytes, grown_bytes) if grown_bytes > storage_bytes else None)
        return out

    def _data_dependent(self, func) -> str:
        """Fake tensors hold no data: an op whose output shape depends on it cannot be traced."""
        return (f"aten.{func._overloadpacket.__name__} {self._where()} makes a tensor whose shape depends on "
                "the data (nonzero, boolean-mask indexing x[mask], masked_select, unique, bincount, ...), and the "
                "trace has shapes, not data: give the model fixed shapes (a dense mask with torch.where, or "
                "torch.topk with gather / index_add for routing)")

    def _check_dtypes(self, func, args, kwargs) -> None:
        """Fake tensors let through dtypes a real kernel refuses (graphs.torch.dtype_rules)."""
        problem = dtype_problem(func, args, kwargs)
        if problem is not None:
            raise PlacerError(f"aten.{func._overloadpacket.__name__} {self._where()} cannot run: {problem}")

    def _count_scalar_read(self) -> None:
        self._scalar_reads += 1
        if self._scalar_reads > MAX_SCALAR_READS:
            raise PlacerError(f"the step read a tensor's value more than {MAX_SCALAR_READS:,} times (.item(), or a "
                              f"tensor in an if or while), the last {self._where()}: traced without data, every "
                              "read answers 1 (True), so a loop until a value changes never ends; give such a "
                              "loop a fixed number of steps")

    def _where(self) -> str:
        scope = self.current_scope()
        if self.phase != "forward" or not scope:
            return f"in the {self.phase} pass"
        return "in the loss" if scope == LOSS_SCOPE else f"in module {scope!r}"

    def stamp_pending(self) -> None:
        """Tag the autograd nodes of finished forward ops with their op ids (called by `GradFnStamper`).

        Latest op first: an in-place op's node is its own, not its input producer's. Reading ``grad_fn`` of
        a view whose base was written in place makes autograd rebuild the view's node, which may dispatch
        ops: those are bookkeeping and pass through unrecorded (``muted``).
        """
        pending, self._pending = self._pending, []
        muted, self.muted = self.muted, True
        try:
            for op, outputs in reversed(pending):
                for t in outputs:
                    node = t.grad_fn
                    if node is not None and NODE_KEY not in node.metadata:
                        node.metadata[NODE_KEY] = op
        finally:
            self.muted = muted

    def _tensor_writer_stamp(self, t: torch.Tensor) -> int:
        by_tensor = self._tensor_writer.get(id(t))
        by_storage = self._storage_writer.get(_storage_key(t))
        stamps = [w[1] for w in (by_tensor, by_storage) if w is not None]
        return max(stamps) if stamps else 0

    def _record(self, func, args, kwargs, out, node, growth: _Growth | None = None) -> None:
        """Record one call; ``growth``: a resize that grew its tensor's storage (it allocated and copied)."""
        schema = self._schemas.get(func)
        if schema is None:
            schema = self._schemas[func] = _schema_of(func)
        metadata_only = schema.is_view or (schema.restrides and growth is None)
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        kind = f"{func.namespace}.{func._overloadpacket.__name__}"
        flops = op_flops(func, args, kwargs, out)
        mutated = self._mutated_tensors(func, schema, args, kwargs)
        sources = self._rebinding_sources(args, kwargs, inputs, mutated) if schema.rebinds else \
            [(self.writer_of(t), tensor_bytes(t)) for t in inputs]
        scope, partner = self._scope_and_partner(node, sources, inputs, self._base(schema, sources, mutated))
        accessed_bytes, fresh_bytes = _costed_bytes(schema, inputs, outputs, mutated, metadata_only, growth)
        op = self.table.add(f"{kind}_{len(self.table.names)}", kind, scope, self.phase, flops,
                            accessed_bytes, fresh_bytes)
        for src, size in sources:
            self.table.edge_src.append(src)
            self.table.edge_dst.append(op)
            self.table.edge_bytes.append(size)
        if partner is not None:
            self.table.colocate_pairs.append((partner, op))
        for variable in self._variables_written(mutated):
            if variable != partner:
                self.table.colocate_pairs.append((variable, op))
        for t in mutated:  # an in-place view leaves the storage's data, and so its other views' writer, as it was
            self.register(t, op, storage=not metadata_only)
        for t in outputs:
            if not any(t is m for m in mutated):  # an in-place op returns the tensor it wrote
                self.register(t, op, storage=not schema.is_view)
        if self.phase == "update":
            self._propagate_owner(inputs, outputs)
        elif self.phase == "forward" or self.recomputing():
            self._pending.append((op, outputs))

    def _base(self, schema: _Schema, sources: list, mutated: list) -> int | None:
        """The op that wrote the data this call views or writes in place (``set_``: its source's), or None."""
        if mutated and not schema.rebinds:
            return self.writer_of(mutated[0])
        return sources[0][0] if sources and (schema.is_view or schema.rebinds) else None

    def _rebinding_sources(self, args, kwargs, inputs, mutated) -> list[tuple[int, int]]:
        """(writer op, bytes) of what ``set_`` reads: its source tensor, or the storage it was given (by its
        writer, when known; ``set_(tensor, offset, size)`` reaches the recorder as the storage variant). Not the
        tensor it rebinds: its old data is dropped, not read."""
        rebound = mutated[0]
        sources = [(self.writer_of(t), tensor_bytes(t)) for t in inputs if t is not rebound]
        for leaf in tree_leaves((args, kwargs)):
            writer = self._storage_writer.get(leaf._cdata) if isinstance(leaf, torch.UntypedStorage) else None
            if writer is not None:
                sources.append((writer[0], tensor_bytes(rebound)))
        return sources

    def _mutated_tensors(self, func, schema: _Schema, args, kwargs) -> list:
        found = []
        for index, name in zip(schema.mutated, schema.mutated_names):
            found.extend(_tensors(argument(args, kwargs, index, name)))
        for index in undeclared_writes(func, args, kwargs):
            found.extend(_tensors(argument(args, kwargs, index, func._schema.arguments[index].name)))
        return found

    def _variables_written(self, mutated: list) -> list[int]:
        """The Variable ops whose storage (a parameter, a buffer such as batch norm's running statistics, or
        optimizer state) the op writes in place: a real run writes it on the device that holds it."""
        found = (self._variable.get(_storage_key(t)) for t in mutated)
        return list(dict.fromkeys(v for v in found if v is not None))

    def _scope_and_partner(self, node, sources, inputs, base) -> tuple[str, int | None]:
        """Scope of the op being recorded and the op it must be colocated with (or None).

        Backward ops follow the forward op they differentiate, update ops their parameter; only ops
        without such a link join the producer of the tensor they view or mutate (``base``), so chains of
        views never merge whole layers.
        """
        if self.recomputing():
            return self.current_scope(), base
        if self.phase == "backward":
            forward_op = node.metadata.get(NODE_KEY) if node is not None else None
            if forward_op is not None:
                return self.table.scopes[forward_op], forward_op
            leaf = getattr(node, "variable", None)  # AccumulateGrad: the gradient arrives at its parameter
            owner = self._owner.get(_storage_key(leaf)) if isinstance(leaf, torch.Tensor) else None
            if owner is not None:
                return self.param_scopes[owner], self.param_ops[owner]
            scope = self.table.scopes[sources[0][0]] if sources else ""
            return scope, base
        if self.phase == "update":
            owner = self._owner_of(inputs)
            if owner is not None:
                return self.param_scopes[owner], self.param_ops[owner]
            return "optimizer", base
        return self.current_scope(), base

    def _owner_of(self, inputs) -> int | None:
        for t in inputs:
            owner = self._owner.get(_storage_key(t))
            if owner is not None:
                return owner
        return None

    def _propagate_owner(self, inputs, outputs) -> None:
        owner = self._owner_of(inputs)
        if owner is not None:
            for t in outputs:
                self.set_owner(t, owner)


class GradFnStamper(TorchFunctionMode):
    """Stamps autograd nodes after each torch-level call that returns a tensor needing a gradient has
    returned through autograd.

    Not inside ``__torch_dispatch__``: there autograd may still hold a view's lock while it rebuilds that
    view's ``grad_fn``, and reading ``grad_fn`` then deadlocks. Not after calls without such a tensor: the
    ops of a custom ``torch.autograd.Function``'s forward run without gradients, and the tensor it returns
    gets the Function's node only once ``apply`` has returned (the device queries in between would stamp
    too early); their node is stamped at the next call, with the op that made the tensor.
    """

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.recorder._pending and any(t.requires_grad for t in _tensors(out)):
            self.recorder.stamp_pending()
        return out


def _one_like(t: torch.Tensor):
    """What ``.item()`` answers under fake tensors: 1 of the tensor's type (there is no data)."""
    if t.dtype == torch.bool:
        return True
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return 1.0
    return 1
