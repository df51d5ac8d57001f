"""Seeded random inputs of a model's shapes and dtypes, and OpenVINO's error text made readable."""

from __future__ import annotations

import re

import numpy as np

# a failed C++ check's condition and source line, wherever it stands ("[CPU] Reshape node with name 'y' Check ...")
CHECK_PREFIX = re.compile(r"Check '.*' failed at \S+:\d+:\s*")


def random_inputs(model, seed: int, batch_size: int = 0) -> list[np.ndarray]:
    """One array per model input, in order: floats ~ N(0, 1), integers in {0, 1} (safe as indices, e.g.
    token ids), booleans fair coins. A dynamic dimension is ``batch_size`` (when positive) at axis 0, else 1."""
    rng = np.random.default_rng(seed)
    arrays = []
    for port in model.inputs:
        shape = [_dim(d, axis, batch_size) for axis, d in enumerate(port.get_partial_shape())]
        dtype = np.dtype(port.get_element_type().to_dtype())
        if dtype == np.bool_:
            arrays.append(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


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
