"""Dtype rules the real kernels enforce and fake tensors do not: a step breaking one fails on its first real run.

A fake tensor's output comes from the op's meta function, and many meta functions never compare their
operands' dtypes: a float16 weight fed float32 input, a matmul of float32 and int64, a float index tensor
given to ``index_select`` all trace. `dtype_problem` checks each aten call against the rules below, chosen as
rules of the op rather than gaps of one device's kernels; each was checked against torch 2.13's CPU kernels
(none against CUDA's: no GPU was at hand):

- matrix products, convolutions, ``grid_sampler``, ``binary_cross_entropy`` and the index writes
  (``index_add``, ``index_copy``, ``index_put``, ``index_reduce``): the operands named in `SAME_DTYPE` share
  one dtype (no promotion);
- normalizations (`NORM_PARAMS`): weight, bias and running statistics share one dtype, the input's, or
  float32 under a float16 / bfloat16 input (the mixed-precision case the kernels accept);
- an argument the op's schema names ``index`` or ``indices`` holds positions: an integer tensor (for the
  tensor lists of ``aten.index`` / ``index_put``, a bool mask too);
- ``nll_loss`` (and so ``cross_entropy`` with class indices): targets are int64 or uint8;
- in-place arithmetic (`PROMOTING_IN_PLACE`): an operand of a higher kind (bool < integer < float < complex)
  than the tensor written would give a result it cannot hold (``int64.mul_(0.5)``).

Not checked: rules of one device's kernels only (CUDA's matmuls take no integers), the dtypes a kernel
supports at all, and ops not listed here whose meta function skips a check. Ops that promote (``add``,
``cat``, ``where``, ``mse_loss``...) are fine as they are.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

SAME_DTYPE = {  # overload packet -> the arguments that must share one dtype
    aten.mm: ("self", "mat2"),
    aten.addmm: ("self", "mat1", "mat2"),
    aten.bmm: ("self", "mat2"),
    aten.baddbmm: ("self", "batch1", "batch2"),
    aten.addbmm: ("self", "batch1", "batch2"),
    aten.mv: ("self", "vec"),
    aten.addmv: ("self", "mat", "vec"),
    aten.dot: ("self", "tensor"),
    aten.convolution: ("input", "weight", "bias"),
    aten._convolution: ("input", "weight", "bias"),
    aten.grid_sampler_2d: ("input", "grid"),
    aten.grid_sampler_3d: ("input", "grid"),
    aten.index_add: ("self", "source"),
    aten.index_add_: ("self", "source"),
    aten.index_copy: ("self", "source"),
    aten.index_copy_: ("self", "source"),
    aten.index_reduce: ("self", "source"),
    aten.index_reduce_: ("self", "source"),
    aten.index_put: ("self", "values"),
    aten.index_put_: ("self", "values"),
    aten._index_put_impl_: ("self", "values"),
    aten.binary_cross_entropy: ("self", "target", "weight"),
}
_BATCH_NORM_PARAMS = ("weight", "bias", "running_mean", "running_var")
NORM_PARAMS = {  # overload packet -> the parameters checked against the input
    aten.native_layer_norm: ("weight", "bias"),
    aten.native_group_norm: ("weight", "bias"),
    aten.native_batch_norm: _BATCH_NORM_PARAMS,
    aten._native_batch_norm_legit: _BATCH_NORM_PARAMS,
    aten._native_batch_norm_legit_functional: _BATCH_NORM_PARAMS,
    aten._native_batch_norm_legit_no_training: _BATCH_NORM_PARAMS,
}
CLASS_TARGET_DTYPES = (torch.int64, torch.uint8)  # the two index types the nll_loss kernels dispatch on
CLASS_TARGETS = {aten.nll_loss_forward, aten.nll_loss2d_forward}  # cross_entropy's class-index form too
PROMOTING_IN_PLACE = {aten.mul_, aten.addcmul_}  # the others of their kind are refused by their meta functions
INDEX_ARGUMENTS = ("index", "indices")
REDUCED_FLOATS = (torch.float16, torch.bfloat16)


def dtype_problem(func, args: tuple, kwargs: dict) -> str | None:
    """Why ``func(*args, **kwargs)`` cannot run on real tensors of these dtypes, or None."""
    if not _has_rules(func):
        return None
    named = _named_arguments(func, args, kwargs)
    packet = func._overloadpacket
    if packet in SAME_DTYPE:
        problem = _mixed_dtypes(named, SAME_DTYPE[packet])
    elif packet in NORM_PARAMS:
        problem = _norm_params_problem(named, NORM_PARAMS[packet])
    elif packet in CLASS_TARGETS:
        problem = _class_target_problem(named.get("target"))
    elif packet in PROMOTING_IN_PLACE:
        problem = _in_place_problem(named)
    else:
        problem = None
    return problem or _index_problem(named)


@functools.cache
def _has_rules(func) -> bool:
    """Whether any rule concerns this overload (most ops, element-wise ones, are skipped at once)."""
    packet = func._overloadpacket
    tables = (SAME_DTYPE, NORM_PARAMS, CLASS_TARGETS, PROMOTING_IN_PLACE)
    return any(packet in table for table in tables) or \
        any(a.name in INDEX_ARGUMENTS and not a.is_out for a in func._schema.arguments)


def _named_arguments(func, args: tuple, kwargs: dict) -> dict:
    """Argument name -> value, for the arguments the op reads (not its ``out=`` tensors)."""
    schema_args = func._schema.arguments
    named = {a.name: value for a, value in zip(schema_args, args)}
    named.update(kwargs)
    writes_only = {a.name for a in schema_args if a.is_out}
    return {name: value for name, value in named.items() if name not in writes_only}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _mixed_dtypes(named: dict, names: tuple) -> str | None:
    present = [(n, named[n]) for n in names if isinstance(named.get(n), torch.Tensor)]
    if len({t.dtype for _, t in present}) <= 1:
        return None
    listed = ", ".join(f"{n} {_dtype_name(t.dtype)}" for n, t in present)
    return f"its operands must share one dtype (no promotion), got {listed}"


def _norm_params_problem(named: dict, param_names: tuple) -> str | None:
    x = named.get("input")
    params = [(n, named[n]) for n in param_names if isinstance(named.get(n), torch.Tensor)]
    if not isinstance(x, torch.Tensor) or not params:
        return None
    allowed = {x.dtype, torch.float32} if x.dtype in REDUCED_FLOATS else {x.dtype}
    dtypes = {t.dtype for _, t in params}
    if len(dtypes) == 1 and dtypes <= allowed:
        return None
    listed = ", ".join(f"{n} {_dtype_name(t.dtype)}" for n, t in params)
    want = " or float32" if x.dtype in REDUCED_FLOATS else ""
    return (f"the parameters must share one dtype, the input's ({_dtype_name(x.dtype)}){want}, "
            f"got {listed}")


def _class_target_problem(target) -> str | None:
    if not isinstance(target, torch.Tensor) or target.dtype in CLASS_TARGET_DTYPES:
        return None
    return f"class targets must be int64 (or uint8), got {_dtype_name(target.dtype)}"


def _kind_rank(value) -> int | None:
    """bool 0 < integer 1 < floating 2 < complex 3, for a tensor or a Python number (None otherwise)."""
    if isinstance(value, torch.Tensor):
        dtype = value.dtype
        return 0 if dtype == torch.bool else 3 if dtype.is_complex else 2 if dtype.is_floating_point else 1
    for rank, kind in enumerate((bool, int, float, complex)):  # bool before int: True is an int too
        if isinstance(value, kind):
            return rank
    return None


def _in_place_problem(named: dict) -> str | None:
    target = named.get("self")
    if not isinstance(target, torch.Tensor):
        return None
    target_rank = _kind_rank(target)
    for name, value in named.items():
        rank = _kind_rank(value)
        if name != "self" and rank is not None and rank > target_rank:
            got = _dtype_name(value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__
            return f"self is {_dtype_name(target.dtype)} and cannot hold the result of its {name} ({got})"
    return None


def _index_problem(named: dict) -> str | None:
    for name in INDEX_ARGUMENTS:
        value = named.get(name)
        masks_allowed = isinstance(value, (list, tuple))  # aten.index / index_put: per-dimension tensors
        for t in value if masks_allowed else [value]:
            if not isinstance(t, torch.Tensor):
                continue
            integer = not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)
            if not (integer or (masks_allowed and t.dtype == torch.bool)):
                kinds = "integer or bool" if masks_allowed else "integer"
                return f"{name} must be an {kinds} tensor, got {_dtype_name(t.dtype)}"
    return None
