"""FLOPs of one aten call: ``torch.utils.flop_counter``'s formulas, and those of kernels it lacks (matmul-like, FFT).

torch's table covers mm, addmm, bmm, baddbmm, the convolutions and the GPU attention kernels. A trace on the
CPU also reaches kernels it has no formula for, which would count 0 FLOPs without a word:

- ``F.scaled_dot_product_attention`` (and ``nn.MultiheadAttention(need_weights=False)``) is
  ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward: counted as torch counts the flash
  kernel (Q K^T and P V forward; five batched matmuls backward, the scores recomputed);
- matrix-vector and vector products ``aten.mv``, ``addmv``, ``dot``, ``vdot``, and ``addbmm`` (a bmm whose
  products are summed over the batch): a multiply-add is 2 FLOPs, as in torch's mm;
- ``aten._trilinear`` (``nn.Bilinear`` and its backward): the two pairwise products torch computes;
- the FFTs ``aten._fft_c2c``, ``_fft_r2c`` and ``_fft_c2r`` (``torch.fft.*`` and their backwards): by the
  usual convention for a radix-2 complex FFT, 5 N log2 N real FLOPs per transform of length N, and half of
  that for a real signal (r2c, and c2r whose output is real), whatever N's factors.

One of torch's formulas is corrected: ``aten.convolution_backward``'s weight gradient of a grouped
convolution (``_convolution_backward``).

As in torch's ``addmm`` formula, the added term (``addmv``'s vector, ``addbmm``'s matrix) is not counted.
Every formula but the FFTs' counts real multiply-adds: a product of complex tensors counts 4 times as many
(a complex multiply-add is 4 real multiplies and 4 adds).
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

# CPU kernels that do the work of a kernel torch's table has a formula for, with the same leading arguments
SAME_FLOPS_AS = {
    aten._scaled_dot_product_flash_attention_for_cpu: aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: aten._scaled_dot_product_flash_attention_backward,
}


def _mv(mat: torch.Tensor, vec: torch.Tensor, *args, **kwargs) -> int:
    return 2 * mat.numel()


def _addmv(_added: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *args, **kwargs) -> int:
    return 2 * mat.numel()


def _dot(a: torch.Tensor, b: torch.Tensor, *args, **kwargs) -> int:
    return 2 * a.numel()


def _addbmm(_added: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *args, **kwargs) -> int:
    return 2 * batch1.numel() * batch2.shape[-1]


def _trilinear(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1, expand2, expand3, sumdim,
               *args, **kwargs) -> int:
    """Each input is unsqueezed at its ``expand`` dims into one iteration space. torch multiplies i1 by i2
    over the dims either has, summing the ``sumdim`` dims i3 lacks (is expanded at), then that product by
    i3, summing the other ``sumdim`` dims: 2 FLOPs per point of each of the two products, as a matmul."""
    shape1, shape2, shape3 = (_unsqueezed(t.shape, e) for t, e in ((i1, expand1), (i2, expand2), (i3, expand3)))
    first = [max(a, b) for a, b in zip(shape1, shape2)]
    kept = [1 if d in sumdim and d in expand3 else size for d, size in enumerate(first)]
    second = [max(a, b) for a, b in zip(kept, shape3)]
    return 2 * math.prod(first) + 2 * math.prod(second)


def _unsqueezed(shape, expand) -> list[int]:
    dims = list(shape)
    for d in sorted(expand):
        dims.insert(d, 1)
    return dims


def _fft_flops(shape, dims, complex_signal: bool) -> int:
    """FLOPs of the FFTs over ``dims`` of a signal of ``shape`` (its full length, not the one-sided half):
    one 1-D FFT of length N per line along each dim, 5 N log2 N each for a complex signal, half for a real
    one; summed over the dims, 5 x elements x log2(product of the lengths)."""
    elements = math.prod(shape)
    lengths = [shape[d % len(shape)] for d in dims] if shape else []
    if elements == 0 or not lengths:
        return 0
    per_element = 5.0 if complex_signal else 2.5
    return round(per_element * elements * math.log2(math.prod(lengths)))


def _fft_c2c(x: torch.Tensor, dim, normalization, forward, *args, **kwargs) -> int:
    return _fft_flops(tuple(x.shape), dim, complex_signal=True)


def _fft_r2c(x: torch.Tensor, dim, normalization, onesided, *args, **kwargs) -> int:
    return _fft_flops(tuple(x.shape), dim, complex_signal=False)


def _fft_c2r(x: torch.Tensor, dim, normalization, last_dim_size, *args, **kwargs) -> int:
    """``x`` is the one-sided half spectrum; the real output is ``last_dim_size`` long along the last dim."""
    full = list(x.shape)
    if full and dim:
        full[dim[-1] % len(full)] = int(last_dim_size)
    return _fft_flops(tuple(full), dim, complex_signal=False)


def _convolution_backward(grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                          output_mask, *args, **kwargs) -> int:
    """torch's formula, but the weight gradient of a grouped convolution divided by ``groups``: torch counts
    it as if ungrouped (``groups`` times the forward's FLOPs: a depthwise convolution's backward came out 17x
    its forward on 16 channels, where the Keras importer counts 2x). Its input gradient is counted right."""
    torch_formula = flop_registry[aten.convolution_backward]
    common = (grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    grad_input = torch_formula(*common, [output_mask[0], False], *args, **kwargs)
    grad_weight = torch_formula(*common, [False, output_mask[1]], *args, **kwargs)
    return grad_input + grad_weight // max(int(groups), 1)


OWN_FORMULAS = {
    aten.mv: _mv, aten.addmv: _addmv, aten.addmv_: _addmv, aten.dot: _dot, aten.vdot: _dot,
    aten.addbmm: _addbmm, aten.addbmm_: _addbmm, aten._trilinear: _trilinear,
    aten._fft_c2c: _fft_c2c, aten._fft_r2c: _fft_r2c, aten._fft_c2r: _fft_c2r,
}
CORRECTED = {aten.convolution_backward: _convolution_backward}  # torch has a formula, counted differently here


FFTS = frozenset({aten._fft_c2c, aten._fft_r2c, aten._fft_c2r})  # counted in real FLOPs already
COMPLEX_MULTIPLY_ADD = 4  # real FLOPs of a complex multiply-add (8) over a real one's (2)


def op_flops(func, args, kwargs, out) -> int:
    """FLOPs of the call ``func(*args, **kwargs) -> out``; 0 for a kernel without a formula (element-wise
    and data-movement ops: the simulator costs those by their bytes). A product of complex tensors (a complex
    matmul, convolution) counts ``COMPLEX_MULTIPLY_ADD`` times the real formula: it was a quarter of the work."""
    packet = func._overloadpacket
    formula = CORRECTED.get(packet) or flop_registry.get(packet) or flop_registry.get(SAME_FLOPS_AS.get(packet))
    if formula is not None:
        flops = formula(*args, out_val=out, **kwargs)
    else:
        own = OWN_FORMULAS.get(packet)
        flops = own(*args, **kwargs) if own is not None else 0
    if flops and packet not in FFTS and _any_complex(args):
        flops *= COMPLEX_MULTIPLY_ADD
    return flops


def _any_complex(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_complex() for a in args)
