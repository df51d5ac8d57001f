"""FLOP formulas per op type from static shapes, shared by the ONNX and OpenVINO IR importers.

One table maps both vocabularies (ONNX ``Conv``, OpenVINO ``Convolution``, ...) to a few families. A
multiply-add counts as 2 FLOPs (the project's convention: ResNet-50 at 224x224 is about 2 x 4.1e9 FLOPs).
Elementwise ops (transcendental ones included) cost one FLOP per output element; normalizations and
softmax a few per input element; data-movement ops (Reshape, Transpose, Concat, Gather, Cast, ...) cost 0,
deliberately: they have a formula. An op that the other format spells as several costs what they would
(OpenVINO's ScaledDotProductAttention and ONNX's Attention: two matmuls, a scale, a mask and a softmax;
ONNX's LayerNormalization: OpenVINO's MVN, Multiply and Add), except activations: a Gelu or a Swish is one
elementwise op, 1 FLOP an element, where an export that writes it out pays for each of its ops. An op type
absent from the table has no formula: ``op_flops`` returns None and the importers list it in
``graph.meta["ops_without_flops"]``.

Shapes are tuples of ints (unknown dims already replaced by 1) or None for a tensor of unknown rank (or an
optional ONNX input left out before one given); a formula that needs a shape it lacks gives 0.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import partial
from typing import Callable

from graphs.einsum import einsum_flops
from graphs.resize import RESIZE_TAPS, resize_flops

Shape = tuple[int, ...] | None
Formula = Callable[[list[Shape], list[Shape], dict], float]


def numel(shape: Shape) -> int:
    """Elements of a tensor of ``shape`` (a scalar has 1; unknown rank counts 0)."""
    return 0 if shape is None else math.prod(shape)


def _first(shapes: list[Shape]) -> Shape:
    return shapes[0] if shapes else None


def _zero(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    return 0.0


def _per_output(per_element: float, ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    return float(per_element * sum(numel(s) for s in outs))


def _per_input(per_element: float, ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    return float(per_element * numel(_first(ins)))


def _conv(skip_weight_dims: int, over_input: bool, ins: list[Shape], outs: list[Shape], attrs: dict,
          bias_input: bool = False) -> float:
    """2 x (output elements) x (weight elements per output element). The weight dims after the first
    ``skip_weight_dims`` are the MACs per output element (per input element for transposed convolutions).
    ``bias_input``: a third input is a bias, one add per output element (ONNX Conv and ConvTranspose; an
    OpenVINO ConvolutionBackpropData's third input is its output shape)."""
    weight = ins[1] if len(ins) > 1 else None
    pixels = ins[0] if over_input else _first(outs)
    if weight is None or pixels is None:
        return 0.0
    flops = 2.0 * numel(pixels) * math.prod(weight[skip_weight_dims:])
    if len(ins) > 2 and bias_input:
        flops += numel(_first(outs))
    return flops


def _matmul(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    a = _first(ins)
    if a is None or not a or _first(outs) is None:
        return 0.0
    k = a[-2] if attrs.get("transpose_a") and len(a) > 1 else a[-1]
    return 2.0 * numel(_first(outs)) * k


def _gemm(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    """ONNX Gemm: alpha*A'B' + beta*C; A is 2-D, transposed when transA."""
    a, out = _first(ins), _first(outs)
    if a is None or len(a) != 2 or out is None:
        return 0.0
    k = a[0] if attrs.get("transA") else a[1]
    return 2.0 * numel(out) * k + (numel(out) if len(ins) > 2 else 0)


def _pool(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    """One FLOP per window element per output element (ONNX ``kernel_shape``, OpenVINO ``kernel``)."""
    kernel = attrs.get("kernel_shape") or attrs.get("kernel") or ()
    return float(numel(_first(outs)) * math.prod(kernel))


def _recurrent(w_index: int, per_hidden: int, ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    """A recurrent op, a whole sequence (ONNX RNN / GRU / LSTM, OpenVINO *Sequence) or one step (*Cell). Per
    time step, example and direction: the input and recurrent matmuls, 2 x gates*hidden x (input + hidden);
    one add per bias element (ONNX's B holds W's and R's biases, 2 x gates*hidden; OpenVINO's one sum of
    them, gates*hidden, or (gates + 1)*hidden for a GRU with linear_before_reset); and ``per_hidden`` FLOPs of
    gate arithmetic per hidden unit (sums, activations, products: RNN 2, GRU 11, LSTM 13). ``ins[w_index]``
    is W ((directions,) gates*hidden x input), the next R (... x hidden), then the bias; steps x examples is
    X's elements over the input size, whatever X's layout."""
    x = _first(ins)
    w, r, bias = (ins[i] if len(ins) > i else None for i in range(w_index, w_index + 3))
    if x is None or w is None or r is None or len(w) < 2 or not r or not w[-1]:
        return 0.0
    gates_hidden, input_size, hidden = w[-2], w[-1], r[-1]
    directions = w[0] if len(w) == 3 else 1
    biased = bias is not None and len(bias) > 0 and bias[-1] >= gates_hidden  # not sequence_lens ([batch])
    per_step = 2 * gates_hidden * (input_size + hidden) + (bias[-1] if biased else 0) + per_hidden * hidden
    return float(numel(x) // input_size * directions * per_step)


def _resize(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    """ONNX Resize / Upsample, OpenVINO Interpolate: each output element is a weighted sum of taps^k input
    values, k the dims whose size changes and taps 2 for linear modes, 4 for cubic ones (a multiply-add, 2
    FLOPs, each); nearest is a gather, 0. The weights' own arithmetic (per output coordinate, not element)
    is not counted (graphs.resize). A mode named neither linear nor cubic counts as nearest."""
    x, y = _first(ins), _first(outs)
    if x is None or y is None or len(x) != len(y):
        return 0.0
    mode = attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    taps = next((n for name, n in RESIZE_TAPS.items() if name in mode), 1)
    return resize_flops(taps, x, y, numel(y))


def _attention(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    """OpenVINO ScaledDotProductAttention(query [..., L, E], key [..., S, E], value [..., S, Ev][, mask[,
    scale]]; causal): per score (L x S of them per head) the ops its specification spells out, as this table
    costs them: Q K^T and P V (2 x E and 2 x Ev: a multiply-add is 2), the scale (1), the mask's add (1, when
    causal or given a mask of more than one element; a scalar mask is the specification's zero) and the
    softmax (5, as Softmax)."""
    q, k, v = (ins[i] if len(ins) > i else None for i in range(3))
    out = _first(outs)
    if q is None or k is None or v is None or out is None or len(k) < 2 or not q or not v or not v[-1]:
        return 0.0
    scores = numel(out) // v[-1] * k[-2]
    masked = bool(attrs.get("causal")) or (len(ins) > 3 and numel(ins[3]) > 1)
    return float(scores * (2 * q[-1] + 2 * v[-1] + 1 + (1 if masked else 0) + PER_INPUT_ELEMENT["Softmax"]))


def _onnx_attention(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    """ONNX Attention (opset 23): Q, K, V[, attn_mask, past_key, past_value], each 4D (batch, heads, sequence,
    head size) or 3D (batch, sequence, heads x head size; the heads given by q_num_heads, kv_num_heads).
    Per score, batch x query heads x query length x (past_key's length + K's), what ScaledDotProductAttention
    costs (_attention): 2 x head size and 2 x V's head size for the two matmuls, 1 for the scale, 1 for the
    mask (is_causal, or an attn_mask of more than one element) and 5 for the softmax; with a softcap, 3 more
    (softcap x tanh(score / softcap)). A 3D layout without its head counts gives 0. The present key and
    value are concatenations: 0. ``ins`` by position (an absent optional input None)."""
    q, k, v, mask, past_key = (ins[i] if len(ins) > i else None for i in range(5))
    if any(s is None or len(s) != len(q or ()) for s in (k, v)) or q is None or len(q) not in (3, 4):
        return 0.0
    if len(q) == 3:
        q_heads, kv_heads = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
        if not q_heads or not kv_heads:
            return 0.0
        batch, q_length, head_size, v_head_size = q[0], q[1], q[2] // q_heads, v[2] // kv_heads
    else:
        batch, q_heads, q_length, head_size, v_head_size = q[0], q[1], q[2], q[3], v[3]
    past_length = past_key[-2] if past_key is not None and len(past_key) == 4 else 0
    scores = batch * q_heads * q_length * (past_length + k[-2])
    masked = bool(attrs.get("is_causal")) or numel(mask) > 1
    softcap = 3 if attrs.get("softcap") else 0
    return float(scores * (2 * head_size + 2 * v_head_size + 1 + (1 if masked else 0) + softcap
                           + PER_INPUT_ELEMENT["Softmax"]))


def _affine_normalization(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    """ONNX LayerNormalization, InstanceNormalization, GroupNormalization: MVN's 5 FLOPs per element of X
    (the mean's sum, the subtraction, the square, the variance's sum, the scaling by its inverse root), then
    1 for each of the scale and bias inputs present (LayerNormalization's bias is optional). OpenVINO spells
    them MVN, Multiply and Add: 7 in all there too."""
    return float((PER_INPUT_ELEMENT["MVN"] + len(ins[1:3])) * numel(_first(ins)))


def _einsum(ins: list[Shape], outs: list[Shape], attrs: dict) -> float:
    return einsum_flops(attrs.get("equation", ""), ins)


ZERO_FLOP_TYPES = (
    # ONNX
    "Reshape", "Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Flatten", "Slice", "Split",
    "Unsqueeze", "Squeeze", "Cast", "CastLike", "Shape", "Size", "Identity", "Expand", "Tile", "Pad",
    "Constant", "ConstantOfShape", "Range", "Dropout", "ScatterND", "ScatterElements", "DepthToSpace",
    "SpaceToDepth", "OneHot", "NonZero", "Trilu", "EyeLike",
    *("SequenceEmpty", "SequenceLength", "SequenceErase"),  # sequence bookkeeping
    *("SplitToSequence", "ConcatFromSequence", "SequenceAt", "SequenceInsert", "SequenceConstruct"),  # SEQUENCE_COPIES
    # OpenVINO
    "ShapeOf", "StridedSlice", "Broadcast", "Convert", "ConvertLike", "VariadicSplit", "ScatterUpdate",
    "ScatterNDUpdate", "ScatterElementsUpdate", "Roll", "ReverseSequence",
)
# Ops that copy tensors into or out of a sequence. A sequence has no size an importer knows (0 bytes), so they
# cost what a Concat or Split moving their tensors does: what they read of tensors, they write, and conversely.
SEQUENCE_COPIES = ("SplitToSequence", "ConcatFromSequence", "SequenceAt", "SequenceInsert", "SequenceConstruct")
ELEMENTWISE_TYPES = (
    # ONNX
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Relu", "Tanh", "Sigmoid", "Erf", "Gelu", "Exp", "Log", "Neg",
    "Abs", "Max", "Min", "Mean", "Sum", "Clip", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
    "PRelu", "Softplus", "Softsign", "Mish", "Reciprocal", "Floor", "Ceil", "Round", "Sin", "Cos", "Sign",
    "Where", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Mod",
    "IsNaN", "IsInf", "BitShift", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
    "ThresholdedRelu", "Shrink", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
    # OpenVINO
    "Multiply", "Subtract", "Divide", "Power", "Maximum", "Minimum", "SquaredDifference", "Clamp", "Negative",
    "Ceiling", "HSwish", "HSigmoid", "Swish", "Select", "NotEqual", "LogicalAnd", "LogicalOr", "LogicalNot",
    "LogicalXor", "FloorMod", "FakeQuantize", "SoftPlus", "SoftSign", "GreaterEqual", "LessEqual", "IsFinite",
)
PER_INPUT_ELEMENT = {
    # normalization and softmax: a few FLOPs per element of the main input
    "BatchNormalization": 2, "BatchNormInference": 2,  # inference: one scale and one shift per element
    "MVN": 5, "MeanVarianceNormalization": 5,  # no scale or bias (LayerNormalization: _affine_normalization)
    "NormalizeL2": 3, "LpNormalization": 3, "LRN": 5,
    "Softmax": 5, "LogSoftmax": 5, "SoftMax": 5,
    # reductions: one pass over the input
    "ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1, "ReduceL1": 2,
    "ReduceL2": 2, "ReduceSumSquare": 2, "ReduceLogSum": 2, "ReduceLogSumExp": 3, "ArgMax": 1, "ArgMin": 1,
    "TopK": 1, "CumSum": 1,
    # global pooling: one pass over the input
    "GlobalAveragePool": 1, "GlobalMaxPool": 1, "AdaptiveAvgPool": 1, "AdaptiveMaxPool": 1,
}

FORMULAS: dict[str, Formula] = {
    **{name: _zero for name in ZERO_FLOP_TYPES},
    **{name: partial(_per_output, 1) for name in ELEMENTWISE_TYPES},
    **{name: partial(_per_input, factor) for name, factor in PER_INPUT_ELEMENT.items()},
    "Conv": partial(_conv, 1, False, bias_input=True), "Convolution": partial(_conv, 1, False),
    "GroupConvolution": partial(_conv, 2, False),
    "ConvTranspose": partial(_conv, 1, True, bias_input=True), "ConvolutionBackpropData": partial(_conv, 1, True),
    "GroupConvolutionBackpropData": partial(_conv, 2, True),
    "MatMul": _matmul, "Gemm": _gemm, "Einsum": _einsum, "ScaledDotProductAttention": _attention,
    "Attention": _onnx_attention,  # ONNX's (opset 23; com.microsoft's differs: the importer gives it none)
    **{name: _affine_normalization for name in ("LayerNormalization", "InstanceNormalization", "GroupNormalization")},
    "MaxPool": _pool, "AveragePool": _pool, "AvgPool": _pool, "LpPool": _pool,
    "Resize": _resize, "Upsample": _resize, "Interpolate": _resize,
    # recurrent: where W is among the inputs (ONNX X, W, R, B; OpenVINO X, H[, C], seq_lengths, W, R, B)
    "RNN": partial(_recurrent, 1, 2), "GRU": partial(_recurrent, 1, 11), "LSTM": partial(_recurrent, 1, 13),
    "RNNSequence": partial(_recurrent, 3, 2), "GRUSequence": partial(_recurrent, 3, 11),
    "LSTMSequence": partial(_recurrent, 4, 13),
    "RNNCell": partial(_recurrent, 2, 2), "GRUCell": partial(_recurrent, 2, 11), "LSTMCell": partial(_recurrent, 3, 13),
}


def op_flops(op_type: str, in_shapes: list[Shape], out_shapes: list[Shape], attrs: dict) -> float | None:
    """FLOPs of one op, or None when ``op_type`` has no formula (the importer then keeps its bytes only)."""
    formula = FORMULAS.get(op_type)
    return None if formula is None else float(formula(in_shapes, out_shapes, attrs))


def sorted_counts(counts: Counter) -> dict[str, int]:
    """``{op_type: count}`` sorted by type name: what ``meta["ops_without_flops"]`` holds."""
    return {name: int(counts[name]) for name in sorted(counts)}
