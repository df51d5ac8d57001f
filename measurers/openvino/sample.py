"""A small OpenVINO model for the GPU check and the measurer's tests.

``save_sample_model(directory)`` writes ``sample.xml`` / ``sample.bin``: Parameter -> Convolution (``conv``)
-> Relu (``relu``) -> Reshape (``flat``) -> MatMul (``logits``) -> Result, in fp32; its op graph is
``graphs.inference.openvino_import.import_openvino_ir(path)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def save_sample_model(directory: str | Path, channels: int = 4, size: int = 8, classes: int = 5,
                      seed: int = 0) -> Path:
    """Write the sample model (input (1, 3, size, size) fp32) and return the .xml path."""
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(seed)
    x = ops.parameter([1, 3, size, size], np.float32, name="x")
    kernel = ops.constant(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), name="kernel")
    conv = ops.convolution(x, kernel, [1, 1], [1, 1], [1, 1], [1, 1], name="conv")
    relu = ops.relu(conv, name="relu")
    flat = ops.reshape(relu, ops.constant(np.array([1, -1], np.int64), name="flat_shape"), False, name="flat")
    dense = ops.constant(rng.standard_normal((channels * size * size, classes)).astype(np.float32), name="dense")
    logits = ops.matmul(flat, dense, False, False, name="logits")
    model = ov.Model([ops.result(logits, name="out")], [x], "sample")
    path = Path(directory) / "sample.xml"
    ov.save_model(model, path, compress_to_fp16=False)
    return path
