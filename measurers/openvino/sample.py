"""A small OpenVINO model and its op graph, for the GPU check and the measurer's tests.

``save_sample_model(directory)`` writes ``sample.xml`` / ``sample.bin``: Parameter -> Convolution -> Relu
-> Reshape -> MatMul -> Result, in fp32. ``sample_graph(model_file)`` is the op graph of such a file as
the measurer reads it: every node but Parameter / Constant / Result is an op named by its friendly name,
an edge wherever one op reads another's output, its bytes from the static output shape (no FLOP or cost
figures: those are the importer's business, graphs/inference/).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphs.opgraph import OpGraph

NOT_OPS = ("Parameter", "Constant", "Result")


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


def sample_graph(model_file: str | Path, name: str = "openvino-sample") -> OpGraph:
    """The op graph of ``model_file`` (names, kinds, edges, output bytes); ``meta["model_file"]`` set."""
    import openvino as ov

    nodes = [n for n in ov.Core().read_model(str(model_file)).get_ordered_ops() if n.get_type_name() not in NOT_OPS]
    index = {n.get_name(): i for i, n in enumerate(nodes)}
    out_bytes = [sum(_bytes(n, k) for k in range(n.get_output_size())) for n in nodes]
    edges = [(index[v.get_node().get_name()], i, _bytes(v.get_node(), v.get_index()))
             for i, n in enumerate(nodes) for v in n.input_values() if v.get_node().get_name() in index]
    src, dst, size = (np.array(column, dtype=np.int64) for column in zip(*edges)) if edges else ([], [], [])
    n = len(nodes)
    return OpGraph(name=name, framework="openvino", op_names=np.array([x.get_friendly_name() for x in nodes], object),
                   op_kinds=np.array([x.get_type_name() for x in nodes], object), flops=np.zeros(n),
                   bytes_accessed=np.zeros(n), out_bytes=np.array(out_bytes, np.int64),
                   param_bytes=np.zeros(n, np.int64), edge_src=src, edge_dst=dst, edge_bytes=size,
                   batch_size=1, source=str(model_file), meta={"model_file": str(Path(model_file).resolve())})


def _bytes(node, output: int) -> int:
    shape = node.get_output_partial_shape(output)
    count = int(np.prod([d.get_length() for d in shape])) if shape.is_static else 0
    return count * node.get_output_element_type(output).size
