"""ONNX model file -> inference OpGraph: one op per ONNX node, tensors between nodes as edges.

Graph inputs and initializers are not ops: an initializer's bytes are resident ``param_bytes`` of the first
node that reads it (each initializer counted once), and every node that reads it pays its bytes in
``bytes_accessed``. Tensor sizes come from ``onnx.shape_inference``, run after the inputs' sizes are fixed
(graphs.inference.input_shapes: a leading dim without a size is the batch, 1; any other must be given), and
helped through the shape arithmetic of older exports it leaves unknown (graphs.inference.shape_folding).
A dim inference still leaves symbolic inside the graph counts as 1, and the tensors that have one are
counted in ``meta["tensors_without_size"]``; a node output of unknown shape (or rank) is 0 bytes, and counted
there too (``meta["unsized_tensors_by_op"]``: the same count by the op type that makes them). A node that
reads one tensor twice (``Mul(y, y)``) reads it once: one edge's worth of bytes.

Subgraph ops (If, Loop, Scan) are one op each: the tensors their bodies read from the outer graph are
edges into them, but they have no FLOP formula, so their body's FLOPs are not counted and they are listed in
``meta["ops_without_flops"]`` with any other op type the table in ``graphs.inference.flops`` lacks.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from graphs.errors import PlacerError
from graphs.files import file_problem
from graphs.inference.assemble import ImportedModel, NodeCost, to_opgraph, unique_names
from graphs.inference.flops import Shape, op_flops
from graphs.inference.input_shapes import InputShapes, sized_inputs
from graphs.inference.shape_folding import infer_with_folded_shapes, static_dim
from graphs.opgraph import OpGraph

FLOAT_TYPES = ("FLOAT", "FLOAT16", "DOUBLE", "BFLOAT16")


def import_onnx(path: str, name: str | None = None, input_shapes: InputShapes | None = None) -> OpGraph:
    """The OpGraph of the ONNX model at ``path`` (framework "onnx", every op forward); ``input_shapes``
    sizes the inputs the model leaves without sizes (``--input-shape``)."""
    model_file = _existing(path)
    model, given = _load_checked(model_file, input_shapes or {})
    graph = model.graph
    if not graph.node:
        raise PlacerError(f"ONNX model {model_file} has no nodes")
    tensors = _tensor_table(graph)
    initializers = {init.name: init for init in graph.initializer}
    names = unique_names([node.name or f"{node.op_type}_{i}" for i, node in enumerate(graph.node)])
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    nodes, edges, owned = [], [], set()
    for i, node in enumerate(graph.node):
        inputs = list(dict.fromkeys([t for t in node.input if t] + _outer_reads(node, set(node.input))))
        in_bytes = weight_bytes = param_bytes = 0
        for tensor in inputs:
            size = _bytes(tensors.get(tensor))
            if tensor in producer:
                edges.append((producer[tensor], i, size))
                in_bytes += size
            elif tensor in initializers:
                weight_bytes += size
                param_bytes += 0 if tensor in owned else size
                owned.add(tensor)
            else:
                in_bytes += size  # a graph input
        outputs = [t for t in node.output if t]
        flops = op_flops(node.op_type, [_shape(tensors.get(t)) for t in node.input if t],
                         [_shape(tensors.get(t)) for t in outputs], _attributes(node))
        nodes.append(NodeCost(names[i], node.op_type, flops, in_bytes,
                              sum(_bytes(tensors.get(t)) for t in outputs), weight_bytes, param_bytes))
    num_params = sum(math.prod(init.dims) for init in initializers.values()
                     if _type_name(init.data_type) in FLOAT_TYPES)
    return to_opgraph(ImportedModel(name or model_file.stem, "onnx", str(model_file), nodes, edges,
                                    _batch_size(graph, initializers), int(num_params), given,
                                    _unsized_by_op(graph, tensors)))


def _existing(path: str) -> Path:
    model_file = Path(path).resolve()
    if problem := file_problem(model_file):
        raise PlacerError(f"ONNX model {model_file} {problem}")
    return model_file


def _load_checked(model_file: Path, given: InputShapes):
    """The model with its inputs sized and its shapes inferred, and the sizes ``given`` (checked); any
    failure of the onnx package (a foreign library whose parse and check errors have no common base)
    becomes one PlacerError naming the file."""
    import onnx

    def load():
        onnx.checker.check_model(str(model_file))
        return onnx.load(str(model_file))

    model = _foreign(model_file, load)
    _size_inputs(model.graph, sized_inputs(f"ONNX model {model_file}", _input_dims(model.graph), given))
    return _foreign(model_file, lambda: infer_with_folded_shapes(model)), given


def _foreign(model_file: Path, call):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - DecodeError, ValidationError, InferenceError, OSError, ...
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "no detail"
        raise PlacerError(f"{model_file} is not a valid ONNX model ({type(exc).__name__}: {message})") from None


def _model_inputs(graph) -> list:
    """The graph inputs that are fed (not initializers), of known rank."""
    initializers = {init.name for init in graph.initializer}
    return [value for value in graph.input if value.name not in initializers
            and value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape")]


def _input_dims(graph) -> dict:
    return {value.name: tuple(d.dim_value if static_dim(d) else None for d in value.type.tensor_type.shape.dim)
            for value in _model_inputs(graph)}


def _size_inputs(graph, sized: InputShapes) -> None:
    for value in _model_inputs(graph):
        for dim, size in zip(value.type.tensor_type.shape.dim, sized[value.name]):
            dim.dim_value = size  # replaces a symbolic dim_param (one of the two)


def _unsized_by_op(graph, tensors: dict[str, TensorInfo]) -> dict[str, int]:
    """{op type: count} of the tensors whose shape inference left a dim symbolic (each counted as 1), and of
    the node outputs it gave no shape at all (an op of a domain it does not know, e.g. com.microsoft's Gelu:
    0 bytes, said, not silent), by the op type that makes them: a user sees which ops to look at (a Reshape
    whose target shape is computed at run time through an op graphs.inference.shape_folding does not fold)."""
    producer = {tensor: node.op_type for node in graph.node for tensor in node.output if tensor}
    counts = Counter(producer.get(value.name, "graph input") for value in [*graph.output, *graph.value_info]
                     if value.type.HasField("tensor_type")
                     and any(not static_dim(d) for d in value.type.tensor_type.shape.dim))
    counts.update(node.op_type for node in graph.node for tensor in node.output
                  if tensor and _shape(tensors.get(tensor)) is None)
    return dict(counts)


TensorInfo = tuple[Shape, int]  # (shape with unknown dims as 1, or None for unknown rank; bytes per element)


def _tensor_table(graph) -> dict[str, TensorInfo]:
    """Every tensor the graph declares: inputs, outputs, inferred value_info, then initializers."""
    table = {}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.HasField("tensor_type"):
            tensor_type = value.type.tensor_type
            shape = tuple(_dim(d) for d in tensor_type.shape.dim) if tensor_type.HasField("shape") else None
            table[value.name] = (shape, _itemsize(tensor_type.elem_type))
    for init in graph.initializer:
        table[init.name] = (tuple(init.dims), _itemsize(init.data_type))
    return table


def _dim(dim) -> int:
    return dim.dim_value if static_dim(dim) else 1


def _itemsize(elem_type: int) -> int:
    import onnx

    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    except (KeyError, TypeError, ValueError):  # UNDEFINED and the like: no fixed size
        return 0
    return 0 if dtype.kind == "O" else dtype.itemsize  # STRING maps to numpy's object (pointer-sized) dtype


def _type_name(elem_type: int) -> str:
    import onnx

    return onnx.TensorProto.DataType.Name(elem_type)


def _shape(info: TensorInfo | None) -> Shape:
    return None if info is None else info[0]


def _bytes(info: TensorInfo | None) -> int:
    if info is None or info[0] is None:
        return 0
    return math.prod(info[0]) * info[1]


def _attributes(node) -> dict:
    """The node's int, float and string attributes (the formulas read kernel_shape, transA, ...)."""
    import onnx

    kinds = {onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT,
             onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRING}
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.type in kinds}


def _outer_reads(node, listed: set[str]) -> list[str]:
    """Tensors a subgraph op's bodies read from the enclosing graph (implicit inputs), in first-read order."""
    import onnx

    reads: list[str] = []
    for attribute in node.attribute:
        bodies = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for body in bodies:
            reads += [t for t in _free_names(body) if t not in listed and t not in reads]
    return reads


def _free_names(body) -> list[str]:
    """Names a (nested) graph reads but neither defines nor receives as inputs."""
    defined = {v.name for v in body.input} | {init.name for init in body.initializer}
    free: list[str] = []
    for node in body.node:
        for tensor in [t for t in node.input if t] + _outer_reads(node, set(node.input)):
            if tensor not in defined and tensor not in free:
                free.append(tensor)
        defined.update(node.output)
    return free


def _batch_size(graph, initializers: dict) -> int:
    """The first real graph input's leading dim when it is static, else 1."""
    for value in graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            return int(dims[0].dim_value)
        return 1
    return 1
