"""FLOPs of a resize, one formula for every importer (TensorFlow's ``ResizeBilinear`` / ``ResizeBicubic`` and
their gradients, ONNX's ``Resize`` / ``Upsample``, OpenVINO's ``Interpolate``): each element on the larger side
is a weighted sum of taps^k values of the other, k the dims whose size changes, a multiply-add (2 FLOPs) each;
nearest (1 tap) is a gather, 0. The weights' own arithmetic (per coordinate, not per element) is not counted.
"""

from __future__ import annotations

RESIZE_TAPS = {"nearest": 1, "linear": 2, "cubic": 4}  # values read along each resized dim


def resize_flops(taps: int, before, after, elements: int) -> float:
    """``elements`` weighted sums of ``taps``^k values, k the dims that differ between the shapes ``before``
    and ``after`` (the forward's output elements; a gradient's incoming gradient elements)."""
    resized = sum(1 for a, b in zip(before, after) if a != b)
    return 0.0 if taps == 1 or resized == 0 else 2.0 * taps ** resized * elements
