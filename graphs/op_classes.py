"""Op classes: what kind of kernel an op kind string launches, torch ("aten.mm.default"), TensorFlow
("MatMul"), ONNX ("Gemm") and OpenVINO ("Convolution", "Multiply") alike. The simulator's cost model
(measurers.sim.costs) and fusion-aware grouping (graphs.fusion) both read it.

- ``dense``: matrix products and convolutions (mm, bmm, addmm, matmul, linear, einsum, conv*, cudnn RNNs), and
  fused attention kernels, whose work is their two matmuls (torch's ``_scaled_dot_product_*_attention``,
  OpenVINO's ScaledDotProductAttention, ONNX Attention).
- ``elementwise``: pointwise maths, activations and their backward, casts, copies (torch's ``resize_``, which
  copies where it grows) and optimizer updates (add, mul, relu, tanh, ApplyAdam...).
- ``meta``: ops that launch no kernel: parameters (Variable), inputs, constants, views and reshapes,
  identities.
- ``other``: everything else (reductions, softmax, normalization, gathers, concatenation, embeddings...).

(graphs.features has its own, finer classes for the policies' group features.)
"""

from __future__ import annotations

import re
import weakref

import numpy as np

from graphs.opgraph import OpGraph

OP_CLASSES = ("dense", "elementwise", "meta", "other")

_DENSE = re.compile(r"(mm|bmm|addmm|addbmm|baddbmm|addmv|mv|dot|vdot|linear|einsum|tensordot|matmul|batchmatmul\w*|"
                    r"sparsematmul|gemm|(?!convert)\w*conv\w*|\w*convolution\w*|_?cudnn_rnn\w*|_?thnn_fused_\w*|"
                    r"lstm|gru|rnn_\w+|\w*attention\w*)")  # attention kernels: two matmuls and a softmax
_META = re.compile(r"(variable|variablev2|varhandleop|readvariableop|placeholder\w*|input|const|constant|identity\w*|"
                   r"noop|stopgradient|shape|shapeof|size|reshape|squeeze|unsqueeze|expanddims|sym_size|getitem|"
                   r"_assert\w*|output)")
_ATEN_VIEWS = re.compile(r"(view|_unsafe_view|_reshape_alias|expand|expand_as|t|unsqueeze|alias|detach|as_strided|"
                         r"slice|select|split\w*|unbind|permute|transpose|lift_fresh\w*|empty\w*|unflatten|flatten|"
                         r"set)")  # set_: points the tensor at other storage
_ATEN_RESIZES = re.compile(r"resize|resize_as")  # a copy where they grow the storage (ONNX's Resize: "other")
_ELEMENTWISE = re.compile(r"(add|addv2|add_|sub|mul|div|realdiv|neg|abs|exp|log|log1p|sqrt|rsqrt|pow|square|"
                          r"reciprocal|sign|relu\w*|sigmoid\w*|tanh\w*|gelu\w*|silu\w*|elu\w*|selu|softplus\w*|"
                          r"hardtanh\w*|leaky_relu\w*|threshold\w*|clamp\w*|where|select_v2|maximum|minimum|"
                          r"addcmul\w*|addcdiv\w*|lerp\w*|fill\w*|zeros_like|ones_like|copy\w*|clone|_to_copy|"
                          r"cast|biasadd\w*|dropout\w*|native_dropout\w*|bernoulli\w*|masked_fill\w*|eq|ne|lt|le|"
                          r"gt|ge|logical_\w+|floor|ceil|round|_foreach_\w+|\w*apply\w*|assign\w*|sgd\w*|adam\w*|"
                          r"mul_|div_|scalar_tensor|full\w*|zeros|ones|arange|rand\w*|"
                          r"multiply|subtract|divide|power|erf|convert|convertlike|clip|squareddifference|swish|"
                          r"hswish|mish|hsigmoid|prelu|softsign)")
_ATEN_OVERLOAD = re.compile(r"\.(default|tensor|scalar|self|int|dim|dim_intlist|out|using_ints|sym\w*|\w+_\w+)$")


def op_class(kind: str) -> str:
    """The class of an op kind string (see the module docstring)."""
    name = kind.strip().lower()
    is_torch = name.startswith(("aten.", "aten::", "prims.", "torch."))
    if is_torch:
        name = _ATEN_OVERLOAD.sub("", re.split(r"[.:]+", name, maxsplit=1)[1])
        name = name.rstrip("_") if name not in ("add_", "mul_", "div_") else name
        if _ATEN_VIEWS.fullmatch(name):  # torch views alias their input; TF's Transpose, Slice... copy
            return "meta"
        if _ATEN_RESIZES.fullmatch(name):
            return "elementwise"
    for cls, pattern in (("meta", _META), ("dense", _DENSE), ("elementwise", _ELEMENTWISE)):
        if pattern.fullmatch(name):
            return cls
    return "other"


def op_class_codes(graph: OpGraph) -> np.ndarray:
    """(N,) int8: index into OP_CLASSES of every op (classified once per distinct kind; cached per graph)."""
    codes = _CLASS_CODES.get(graph)
    if codes is None:
        kinds = graph.op_kinds.tolist()
        code_of = {kind: OP_CLASSES.index(op_class(kind)) for kind in set(kinds)}
        codes = np.array(list(map(code_of.__getitem__, kinds)), dtype=np.int8).reshape(len(kinds))
        codes.setflags(write=False)
        _CLASS_CODES[graph] = codes
    return codes


_CLASS_CODES: "weakref.WeakKeyDictionary[OpGraph, np.ndarray]" = weakref.WeakKeyDictionary()
