"""Per-op-type FLOP formulas for TensorFlow ops, from static shapes.

A multiply-add counts as 2 FLOPs. Ops not listed fall back to one FLOP per output element
(elementwise math); data-movement and bookkeeping ops (reshape, gather, cast, reads, ...) cost 0, and so
does an op whose outputs are all integer or boolean (shape arithmetic, indices, masks). An op with no
outputs changes state (a variable, a scatter) that the fallback cannot see: unless a table lists its type,
its 0 FLOPs is a miss, not a rule (``without_flops``; the importer records it in ``meta["ops_without_flops"]``).
Unknown dimensions must be filled before these formulas run (see ``tensor_dims``).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

from graphs.einsum import einsum_flops
from graphs.resize import resize_flops

# Ops that only move, view, describe, check or print data: no arithmetic.
ZERO_FLOP_KINDS = frozenset({
    "Placeholder", "Const", "Identity", "IdentityN", "StopGradient", "PreventGradient", "Snapshot", "NoOp",
    "Reshape", "Shape", "ShapeN", "Size", "Rank", "Squeeze", "ExpandDims", "Transpose", "ConcatV2", "Concat",
    "Pack", "Unpack", "Slice", "StridedSlice", "StridedSliceGrad", "GatherV2", "GatherNd", "ResourceGather",
    "Tile", "BroadcastTo", "Fill", "ZerosLike", "OnesLike", "Pad", "PadV2", "MirrorPad", "Cast", "Bitcast",
    "ReadVariableOp", "VarHandleOp", "AssignVariableOp", "Range", "Split", "SplitV", "DynamicStitch",
    "BroadcastGradientArgs", "ConcatOffset", "InvertPermutation", "ReverseV2", "OneHot", "Where",
    "ScatterNd", "TensorScatterUpdate", "Variable", "Input", "If", "StatelessIf", "While", "StatelessWhile",
    "Case", "StatelessCase", "Assert", "PrintV2", "ResourceScatterUpdate", "ResourceScatterNdUpdate",
    "ResourceStridedSliceAssign", "ResizeNearestNeighbor",
})

# Optimizer kernels: FLOPs per element of the variable they update (rough operation counts of the kernels).
APPLY_FLOPS_PER_ELEMENT = {
    "ResourceApplyGradientDescent": 2, "ApplyGradientDescent": 2,
    "ResourceApplyMomentum": 4, "ApplyMomentum": 4, "ResourceApplyKerasMomentum": 4,
    "ResourceApplyAdam": 10, "ApplyAdam": 10, "ResourceApplyAdamWithAmsgrad": 12,
    "ResourceApplyAdagrad": 5, "ResourceApplyAdagradV2": 6, "ResourceApplyRMSProp": 8,
    "ResourceApplyCenteredRMSProp": 10, "ResourceApplyAdadelta": 10, "ResourceApplyAdaMax": 9,
    "ResourceApplyFtrl": 15, "ResourceApplyFtrlV2": 16, "ResourceApplyProximalAdagrad": 8,
    "AssignAddVariableOp": 1, "AssignSubVariableOp": 1,
}

# Normalization, softmax-like and reduction ops: FLOPs per element of their main (first) input.
PER_INPUT_ELEMENT_FLOPS = {
    "FusedBatchNorm": 5, "FusedBatchNormV2": 5, "FusedBatchNormV3": 5,
    "FusedBatchNormGrad": 8, "FusedBatchNormGradV2": 8, "FusedBatchNormGradV3": 8,
    "Softmax": 5, "LogSoftmax": 5,
    "SoftmaxCrossEntropyWithLogits": 6, "SparseSoftmaxCrossEntropyWithLogits": 6,
    "Sum": 1, "Mean": 1, "Max": 1, "Min": 1, "Prod": 1, "All": 0, "Any": 0, "ArgMax": 1, "ArgMin": 1,
    "BiasAddGrad": 1, "L2Loss": 2, "EuclideanNorm": 2,
    "ResizeNearestNeighborGrad": 1,  # adds each incoming gradient element (input 0) into the one input it copied
    "UnsortedSegmentSum": 1,  # an embedding's sparse gradient: adds each row of its data (input 0) into the table
}

OpShapes = list[list[int]]  # one list of dims per tensor


def _numel(dims: list[int]) -> int:
    return math.prod(dims) if dims else 1


def _matmul(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    a = ins[0]
    k = a[-2] if attrs.get("transpose_a") or attrs.get("adj_x") else a[-1]
    return 2.0 * _numel(outs[0]) * k


def _conv_forward(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    """The filter is [(d,) h, w, in per group, out]: every dim but the last is MACs per output element."""
    return 2.0 * _numel(outs[0]) * _numel(ins[1][:-1])


def _conv_backprop_input(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    return 2.0 * _numel(ins[2]) * _numel(ins[1][:-1])  # as many MACs as the forward conv


def _conv_backprop_filter(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    return 2.0 * _numel(ins[2]) * _numel(outs[0][:-1])  # the output is the filter's gradient


def _einsum(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    return einsum_flops(attrs.get("equation", b""), [tuple(dims) for dims in ins])


def _depthwise_forward(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    return 2.0 * _numel(outs[0]) * ins[1][0] * ins[1][1]


def _depthwise_backprop_input(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    return 2.0 * _numel(ins[2]) * ins[1][0] * ins[1][1]


def _depthwise_backprop_filter(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    return 2.0 * _numel(ins[2]) * outs[0][0] * outs[0][1]


def _window(attrs: dict) -> int:
    ksize = attrs.get("ksize") or [1, 1, 1, 1]
    return _numel(list(ksize))


def _pool(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    return float(_numel(outs[0]) * _window(attrs))


def _pool_grad_from_output_grad(ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    # MaxPoolGrad(orig_input, orig_output, grad) and AvgPoolGrad(orig_input_shape, grad): one pass per window
    return float(_numel(ins[-1]) * _window(attrs))


def _resize(taps: int, ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    """ResizeBilinear / ResizeBicubic (images [N, H, W, C] -> [N, H', W', C]), as the ONNX importer counts
    Resize (graphs.resize): each output element is a weighted sum of taps^k input values.
    ResizeNearestNeighbor gathers: 0 (ZERO_FLOP_KINDS); its gradient scatter-adds: 1 FLOP per incoming
    gradient element (PER_INPUT_ELEMENT_FLOPS)."""
    return resize_flops(taps, ins[0], outs[0], _numel(outs[0]))


def _resize_grad(taps: int, ins: OpShapes, outs: OpShapes, attrs: dict) -> float:
    """ResizeBilinearGrad / ResizeBicubicGrad (grads [N, H', W', C], original image -> [N, H, W, C]): each
    gradient element is spread over the taps^k inputs its forward element read, the forward's multiply-adds."""
    return resize_flops(taps, ins[0], outs[0], _numel(ins[0]))


FORMULAS: dict[str, Callable[[OpShapes, OpShapes, dict], float]] = {
    "MatMul": _matmul, "BatchMatMul": _matmul, "BatchMatMulV2": _matmul, "BatchMatMulV3": _matmul,
    "Conv2D": _conv_forward, "Conv3D": _conv_forward, "Einsum": _einsum,
    "Conv2DBackpropInput": _conv_backprop_input, "Conv2DBackpropInputV2": _conv_backprop_input,
    "Conv2DBackpropFilter": _conv_backprop_filter, "Conv2DBackpropFilterV2": _conv_backprop_filter,
    "Conv3DBackpropInputV2": _conv_backprop_input, "Conv3DBackpropFilterV2": _conv_backprop_filter,
    "DepthwiseConv2dNative": _depthwise_forward,
    "DepthwiseConv2dNativeBackpropInput": _depthwise_backprop_input,
    "DepthwiseConv2dNativeBackpropFilter": _depthwise_backprop_filter,
    "MaxPool": _pool, "MaxPoolV2": _pool, "AvgPool": _pool, "MaxPool3D": _pool, "AvgPool3D": _pool,
    "MaxPoolGrad": _pool_grad_from_output_grad, "MaxPoolGradV2": _pool_grad_from_output_grad,
    "AvgPoolGrad": _pool_grad_from_output_grad, "MaxPool3DGrad": _pool_grad_from_output_grad,
    "AvgPool3DGrad": _pool_grad_from_output_grad,
    "ResizeBilinear": partial(_resize, 2), "ResizeBicubic": partial(_resize, 4),
    "ResizeBilinearGrad": partial(_resize_grad, 2), "ResizeBicubicGrad": partial(_resize_grad, 4),
}

FORMULA_ATTRS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "ksize", "equation")  # attrs the formulas read


def op_flops(kind: str, in_dims: OpShapes, out_dims: OpShapes, attrs: dict, float_output: bool) -> float:
    """FLOPs of one op from its input and output dims (fully known) and the attrs in FORMULA_ATTRS."""
    if kind in FORMULAS:
        return FORMULAS[kind](in_dims, out_dims, attrs)
    if kind in APPLY_FLOPS_PER_ELEMENT:
        value_dims = in_dims[-1] if kind.startswith("Assign") else _apply_grad_dims(in_dims)
        return float(APPLY_FLOPS_PER_ELEMENT[kind] * _numel(value_dims))
    if kind in PER_INPUT_ELEMENT_FLOPS:
        return float(PER_INPUT_ELEMENT_FLOPS[kind] * (_numel(in_dims[0]) if in_dims else 0))
    if kind in ZERO_FLOP_KINDS or not float_output or not out_dims:
        return 0.0
    return float(sum(_numel(d) for d in out_dims))  # elementwise: one FLOP per output element


def without_flops(kind: str, num_outputs: int) -> bool:
    """True when ``op_flops``'s 0 for an op of ``kind`` is a miss: no table lists the type and the op has no
    outputs, so neither a formula nor the elementwise fallback saw its work (e.g. ResourceScatterAdd, or an
    optimizer kernel missing from APPLY_FLOPS_PER_ELEMENT). Listed zero-cost types and ops with only integer
    or boolean outputs cost 0 by rule; unlisted ops with a float output get the elementwise fallback."""
    listed = kind in FORMULAS or kind in APPLY_FLOPS_PER_ELEMENT or kind in PER_INPUT_ELEMENT_FLOPS \
        or kind in ZERO_FLOP_KINDS
    return not listed and num_outputs == 0


def _apply_grad_dims(in_dims: OpShapes) -> list[int]:
    """The gradient is the largest input of a ResourceApply* op (the others are handles and scalars)."""
    return max(in_dims, key=_numel) if in_dims else []
