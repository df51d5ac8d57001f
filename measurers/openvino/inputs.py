"""Seeded random inputs of a model's shapes and dtypes, and OpenVINO's error text made readable."""

from __future__ import annotations

import re

import numpy as np

# a failed C++ check's condition and source line, wherever it stands ("[CPU] Reshape node with name 'y' Check ...")
CHECK_PREFIX = re.compile(r"Check '.*' failed at \S+:\d+:\s*")


def random_inputs(model, seed: int, batch_size: int = 0) -> list[np.ndarray]:
    """One array per model input, in order: floats ~ N(0, 1), integers in {0, 1} (safe as indices, e.g.
    token ids), booleans fair coins; a bfloat16 input's as uint16 bits (``input_tensors`` makes them bf16). A
    dynamic dimension is ``batch_size`` (when positive) at axis 0, else 1."""
    import openvino as ov

    rng = np.random.default_rng(seed)
    arrays = []
    for port in model.inputs:
        shape = [_dim(d, axis, batch_size) for axis, d in enumerate(port.get_partial_shape())]
        dtype = np.dtype(port.get_element_type().to_dtype())
        if port.get_element_type() == ov.Type.bf16:  # numpy has none: its bits, the high half of a float32's
            normal = np.ascontiguousarray(rng.standard_normal(shape).astype(np.float32))
            arrays.append((normal.view(np.uint32) >> 16).astype(np.uint16))
        elif dtype == np.bool_:
            arrays.append(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


def input_tensors(model, arrays: list[np.ndarray]) -> list:
    """``random_inputs``'s arrays as OpenVINO tensors of the model's input types: a bfloat16 input's bits
    went in as float16, which OpenVINO refused ("Failed to set tensor ... precision: f16"), every placement
    an error."""
    import openvino as ov

    tensors = []
    for port, array in zip(model.inputs, arrays):
        array = np.require(array, requirements="C")  # (np.require keeps a rank-0 input's shape: an If's condition)
        bf16 = port.get_element_type() == ov.Type.bf16
        tensors.append(ov.Tensor(array, list(array.shape), ov.Type.bf16) if bf16 else ov.Tensor(array))
    return tensors


def _dim(dimension, axis: int, batch_size: int) -> int:
    if not dimension.is_dynamic:
        return dimension.get_length()
    return batch_size if axis == 0 and batch_size > 0 else 1


def ov_message(exc: BaseException) -> str:
    """OpenVINO's exception text without its C++ source locations ("Exception from src/...:" lines, the
    "Check '...' failed at src/...:" prefix)."""
    lines = [CHECK_PREFIX.sub("", line).strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith("Exception from ")]
    return " ".join(kept) or type(exc).__name__
