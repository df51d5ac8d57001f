"""ONNX model file -> inference OpGraph: one op per ONNX node (Constants aside), tensors between nodes as edges.

Graph inputs, initializers and default-domain Constant nodes are not ops: an initializer's (or a Constant's
tensor's, graphs.inference.onnx_constants: OpenVINO reads both as its Constant) bytes are resident
``param_bytes`` of the first node that reads it (each counted once), and every node that reads it pays its
bytes in ``bytes_accessed``; the float ones count in ``num_params``. Nor are the nodes no graph output depends
on (graphs.inference.onnx_live: OpenVINO's reader leaves them out, no runtime runs them), inside bodies too;
a weight only they read, or none, is no parameter. An op's scope is the module path torch's current exporter
records in its node's metadata (graphs.inference.onnx_scopes), else the one its name gives (the legacy
exporter's ``/module/Op``: graphs.inference.assemble.scope_of). Tensor sizes come from
``onnx.shape_inference``, run after the inputs' sizes are fixed (graphs.inference.input_shapes: a leading dim
without a size is the batch, 1, unless sizes are given; a named dim takes the size given for its name; any
other must be given), helped through the shape arithmetic of older exports it leaves unknown
(graphs.inference.shape_folding); a shape the model declares gives way to what the inputs' sizes give
(graphs.inference.declared_shapes: a batch-dynamic model declared at batch 1 is costed at the batch given).
A dim inference still leaves symbolic inside the graph counts as 1, and the tensors that have one are
counted in ``meta["tensors_without_size"]``; a node output of unknown shape (or rank) is 0 bytes, and counted
there too (``meta["unsized_tensors_by_op"]``: the same count by the op type that makes them). A node that
reads one tensor twice (``Mul(y, y)``) reads it once: one edge's worth of bytes.

Subgraph ops (If, Loop, Scan, SequenceMap) are one op each: the tensors their bodies read from the outer graph
are edges into them (an outer initializer one reads is theirs, as any reader's), and they cost their bodies. A
body's nodes are costed as the main graph's (same formulas, shapes from the same inference, which infers
inside bodies: a Scan's from its inputs' slices, a SequenceMap's from its sequences' tensors, an If's branches
from the outer tensors, a Loop's from the shapes its body declares for its carried values, which onnx does not
carry in since they may change from one iteration to the next; a body tensor it leaves unsized counts as the
main graph's do), recursively for nested subgraph ops, and summed: FLOPs, and bytes accessed (every body node's
reads and writes, weights included: the op's own inputs and outputs are among them, not counted again). A Loop
multiplies its body by its trip count when that is static (``M`` a known value and a condition that cannot stop
it early), a Scan by its scan inputs' length (one of them sized along its scan axis is enough), a SequenceMap
by its input sequence's length where the ops that make it say it (graphs.inference.onnx_trips); an If takes the
larger of its two branches' FLOPs, and of their bytes: an upper bound of the one that runs. A Loop's scan
outputs, which onnx's inference leaves a symbolic leading dim, are as long as its static trip count, and what
reads them is inferred again with that size; so is a ConcatFromSequence's concatenated dim, where its
sequence's length and its tensors' dims are known, and the tensors of a sequence a Loop carries, the shape of
those its body inserts (a list appended in a loop: its length is its initial one + the trip count x the inserts
of one run). A Loop, Scan or SequenceMap whose runs are not known statically
keeps no FLOPs (listed in ``ops_without_flops``) and its own inputs, outputs and weights as its bytes accessed;
why is in ``meta["bodies_not_costed"]`` ({op name, a nested one's path: why}), which ``placer graphs import``
warns of. A body's own initializers are resident weights of its top-level subgraph op, counted once whatever
the trip count (``param_bytes``, ``num_params``); its intermediate tensors live only while the op runs, so the
op's ``out_bytes`` are its own outputs (a sequence is 0 bytes, counted with the outputs of unknown shape). The
ops that copy tensors into or out of a sequence (flops.SEQUENCE_COPIES) cost 0 FLOPs and what a copy moves:
their sequence side counts the bytes of their tensor side (read and written, as a Concat or a Split). An
op type without a formula inside a body is listed in ``ops_without_flops`` too (one per body node), its
subgraph op's FLOPs lacking it.
"""

from __future__ import annotations

import math
import sys
from collections import ChainMap, Counter
from functools import cached_property
from pathlib import Path
from typing import Mapping

from graphs.errors import PlacerError, first_line
from graphs.files import file_problem
from graphs.inference.assemble import (BodyCost, ImportedModel, NodeCost, TripCountOverflow, Uncosted, body_cost,
                                       costlier, repeated, to_opgraph, unique_names)
from graphs.inference.declared_shapes import infer_preferring_inputs
from graphs.inference.flops import SEQUENCE_COPIES, Shape, op_flops, sorted_counts
from graphs.inference.input_shapes import InputShapes, sized_inputs
from graphs.inference.onnx_constants import DEFAULT_DOMAINS, constant_tensors, is_constant, op_indices, op_nodes
from graphs.inference.onnx_live import live_nodes, reads
from graphs.inference.onnx_scopes import recorded_scope
from graphs.inference.onnx_trips import (graph_attribute, loop_trips, scan_trips, sequence_lengths,
                                         sequence_map_trips, size_concat_from_sequences, size_loop_carried_outputs,
                                         size_loop_scan_outputs, size_loop_sequences)
from graphs.inference.shape_folding import (ShapeConflict, bodies, graphs_within, infer_with_folded_shapes,
                                            known_values, reshape_conflict, shape_conflict, static_dim, tensor_dims)
from graphs.opgraph import OpGraph

FLOAT_TYPES = ("FLOAT", "FLOAT16", "DOUBLE", "BFLOAT16")


def import_onnx(path: str, name: str | None = None, input_shapes: InputShapes | None = None) -> OpGraph:
    """The OpGraph of the ONNX model at ``path`` (framework "onnx", every op forward); ``input_shapes``
    sizes the inputs the model leaves without sizes (``--input-shape``). The nodes no graph output depends on
    are left out (graphs.inference.onnx_live), said on stderr and counted in ``meta["unused_nodes"]``."""
    model_file = _existing(path)
    model, given = _load_checked(model_file, input_shapes or {})
    graph = model.graph
    _refuse_without_ops(graph, model_file)
    scope = _Scope(graph, _default_opset(model))
    try:
        nodes, uncosted = _cost_nodes(scope, _op_names(graph))
    except TripCountOverflow as exc:
        raise PlacerError(f"ONNX model {model_file}: {exc}") from None
    unused = _unused_by_op(graph)
    _note_unused(model_file, unused)
    return to_opgraph(ImportedModel(name or model_file.stem, "onnx", str(model_file), nodes,
                                    _edges(graph, scope.tensors), _batch_size(graph, scope.initializers),
                                    _num_params(graph), given, dict(_unsized_by_op(graph, scope.tensors)),
                                    dict(uncosted.without_flops), uncosted.not_costed, sorted_counts(unused)))


def _refuse_without_ops(graph, model_file: Path) -> None:
    """A model with no op to place: no nodes, Constants alone, or nodes no graph output depends on alone
    (its outputs are its inputs or weights), which OpenVINO would not run either."""
    if op_nodes(graph):
        return
    if any(not is_constant(node) for node in graph.node):
        raise PlacerError(f"ONNX model {model_file}: no graph output depends on any of its nodes (Constants "
                          "aside), so none would run")
    raise PlacerError(f"ONNX model {model_file} has no nodes" + (" but Constants" if graph.node else ""))


def _unused_by_op(graph) -> Counter:
    """{op type: count} of the nodes (Constants aside) no output of their graph depends on, in the main graph
    and in the bodies of the subgraph ops kept: what the import leaves out."""
    kept = set(op_indices(graph))
    counts = Counter(node.op_type for i, node in enumerate(graph.node) if i not in kept and not is_constant(node))
    for body in [body for node in op_nodes(graph) for body in bodies(node)]:
        counts.update(_unused_by_op(body))
    return counts


def _note_unused(model_file: Path, unused: Counter) -> None:
    if unused:
        listed = ", ".join(f"{kind} ({count})" for kind, count in sorted_counts(unused).items())
        print(f"placer: note: ONNX model {model_file}: {sum(unused.values())} node(s) no graph output depends on "
              f"left out, as OpenVINO's reader leaves them out: {listed}", file=sys.stderr)


def _num_params(graph) -> int:
    """Elements of the float weights the ops read, in the main graph and (recursively) in the bodies of its
    subgraph ops: a weight nothing kept reads is no parameter, as it is no op's ``param_bytes``."""
    weights, ops = _weights(graph), op_nodes(graph)
    read = {tensor for node in ops for tensor in reads(node) if tensor in weights}
    own = sum(math.prod(weights[t].dims) for t in read if _type_name(weights[t].data_type) in FLOAT_TYPES)
    return int(own) + sum(_num_params(body) for node in ops for body in bodies(node))


class _Scope:
    """What the nodes of one graph see: its tensors and initializers, and those of the graphs around it (a
    subgraph body reads the enclosing graph's tensors by name). The known values (Loop trip counts), the dims
    (Scan lengths) and the sequences' lengths (SequenceMap's) are computed when first asked for: a model
    without loops never is."""

    def __init__(self, graph, opset: int, outer: _Scope | None = None):
        self.graph, self.opset, self.outer = graph, opset, outer
        self.own_initializers = _weights(graph)
        self.tensors = ChainMap(_tensor_table(graph), *([outer.tensors] if outer else []))
        self.initializers = ChainMap(self.own_initializers, *([outer.initializers] if outer else []))

    def body(self, graph) -> _Scope:
        return _Scope(graph, self.opset, self)

    @cached_property
    def values(self) -> dict:
        return known_values(self.graph, self.outer.values if self.outer else None)

    @cached_property
    def dims(self) -> ChainMap:
        return ChainMap(tensor_dims(self.graph), *([self.outer.dims] if self.outer else []))

    @cached_property
    def sequence_lengths(self) -> dict[str, int]:
        return sequence_lengths(self.graph, self.values, self.dims, self.outer.sequence_lengths if self.outer else None)


def _cost_nodes(scope: _Scope, names: list[str]) -> tuple[list[NodeCost], Uncosted]:
    """One NodeCost per node of ``scope.graph``, with its shapes from ``scope``: the main graph's ops, and
    (recursively) a subgraph body's. A weight is owned (``param_bytes``) by its graph's first node that reads
    it; a body node reading an enclosing graph's weight reads it (``weight_bytes``) without owning it: the
    top-level subgraph op, whose implicit input it is, does."""
    costs, uncosted, owned = [], Uncosted(), set()
    for node, name in zip(op_nodes(scope.graph), names):
        in_bytes = weight_bytes = param_bytes = 0
        for tensor in reads(node):
            size = _bytes(scope.tensors.get(tensor))
            if tensor not in scope.initializers:
                in_bytes += size  # another node's output, or an input of the graph
                continue
            weight_bytes += size
            if tensor in scope.own_initializers and tensor not in owned:
                param_bytes += size
                owned.add(tensor)
        outputs = [t for t in node.output if t]
        flops, body_bytes = None, None
        if _is_subgraph_op(node):
            body = _subgraph_cost(node, scope, name)
            flops, body_bytes, param_bytes = body.flops, body.bytes_accessed, param_bytes + body.param_bytes
            uncosted.add(body.uncosted)
        elif node.domain not in DEFAULT_DOMAINS and node.op_type in DEFAULT_DOMAIN_ONLY:
            flops = None  # com.microsoft's Attention: other inputs than the formula of ONNX's reads
        else:
            flops = op_flops(node.op_type, _input_shapes(node, scope.tensors),
                             [_shape(scope.tensors.get(t)) for t in outputs], _attributes(node))
        out_bytes = sum(_bytes(scope.tensors.get(t)) for t in outputs)
        if node.op_type in SEQUENCE_COPIES and node.domain in DEFAULT_DOMAINS:
            out_bytes = max(in_bytes + weight_bytes, out_bytes)  # a copy: the sequence side (0 bytes) as the other
            in_bytes = out_bytes - weight_bytes
        costs.append(NodeCost(name, node.op_type, flops, in_bytes, out_bytes, weight_bytes, param_bytes, body_bytes,
                              recorded_scope(node)))
    return costs, uncosted


def _input_shapes(node, tensors) -> list[Shape]:
    """A node's input shapes by position: an optional input left out ("") before one given is None, so a
    formula finds each input at its index (Attention's past_key after an absent attn_mask); trailing ones
    left out are dropped."""
    names = list(node.input)
    while names and not names[-1]:
        names.pop()
    return [_shape(tensors.get(name)) if name else None for name in names]


def _edges(graph, tensors) -> list[tuple[int, int, int]]:
    """(producer, consumer, bytes) per tensor an op reads from another op (explicitly or in a body); a
    Constant's tensor is a weight, no edge."""
    ops = op_nodes(graph)
    producer = {out: i for i, node in enumerate(ops) for out in node.output if out}
    return [(producer[tensor], i, _bytes(tensors.get(tensor)))
            for i, node in enumerate(ops) for tensor in reads(node) if tensor in producer]


SUBGRAPH_OPS = ("If", "Loop", "Scan", "SequenceMap")
DEFAULT_DOMAIN_ONLY = ("Attention",)  # op types whose formula is the default domain's alone


def _is_subgraph_op(node) -> bool:
    return node.op_type in SUBGRAPH_OPS and node.domain in DEFAULT_DOMAINS


def _subgraph_cost(node, scope: _Scope, path: str) -> BodyCost:
    """An If costs its costlier branch (graphs.inference.assemble.costlier: an upper bound); a Loop, Scan or
    SequenceMap its body times its runs when they are known statically (``_trips``)."""
    if node.op_type == "If":
        return costlier([_body_cost(graph_attribute(node, name), scope, path)
                         for name in ("then_branch", "else_branch")])
    trips, why = _trips(node, scope)
    return repeated(_body_cost(graph_attribute(node, "body"), scope, path), trips, path, f"{node.op_type}: {why}",
                    node.op_type)


def _trips(node, scope: _Scope) -> tuple[int | None, str]:
    """(how many times a Loop, Scan or SequenceMap runs its body, "") when that is static; else (None, why):
    graphs.inference.onnx_trips."""
    if node.op_type == "Loop":
        return loop_trips(node, scope.values)
    if node.op_type == "Scan":
        return scan_trips(node, scope.dims, scope.opset)
    return sequence_map_trips(node, scope.sequence_lengths)


def _body_cost(body, scope: _Scope, path: str) -> BodyCost:
    """One run of a body graph: its nodes costed as the main graph's, summed."""
    return body_cost(*_cost_nodes(scope.body(body), [f"{path}/{name}" for name in _op_names(body)]))


def _op_names(graph) -> list[str]:
    """Each op's name, unique: its node's, else its type and its index among all the graph's nodes (so an
    unnamed op keeps the name it had when Constants, and the nodes no output depends on, were ops)."""
    indices = op_indices(graph)
    return unique_names([graph.node[i].name or f"{graph.node[i].op_type}_{i}" for i in indices])


def _weights(graph) -> dict:
    """{tensor name: TensorProto or ConstantTensor} of ``graph``'s weights: its initializers and the tensors of
    its Constant nodes (graphs.inference.onnx_constants), each with ``dims`` and ``data_type``."""
    return {**constant_tensors(graph), **{init.name: init for init in graph.initializer}}


def _default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 0)


def _existing(path: str) -> Path:
    model_file = Path(path).resolve()
    if problem := file_problem(model_file):
        raise PlacerError(f"ONNX model {model_file} {problem}")
    return model_file


def _load_checked(model_file: Path, given: InputShapes):
    """The model with its inputs sized and its shapes inferred, and every input's sizes when some are
    ``given`` (checked; those carried by a dim name and the fixed ones too, what the measurer feeds), else {}; any
    failure of the onnx package (a foreign library whose parse and check errors have no common base)
    becomes one PlacerError naming the file."""
    import onnx

    def load():
        onnx.checker.check_model(str(model_file))
        return onnx.load(str(model_file))

    model = _foreign(model_file, load)
    sized = sized_inputs(f"ONNX model {model_file}", _input_dims(model.graph), given,
                         _input_dim_names(model.graph))
    _size_inputs(model.graph, sized)
    inference = _foreign(model_file, lambda: infer_preferring_inputs(model, _inferred_with_loop_outputs))
    if inference.unsized_from_inputs:  # maybe sizes the model cannot take: which node says so
        _refuse_conflict(model_file, shape_conflict(model), sized, given)
    _refuse_conflict(model_file, reshape_conflict(graphs_within(inference.model.graph)), sized, given)
    return inference.model, sized if given else {}


def _inferred_with_loop_outputs(model):
    """``model`` with its shapes inferred (graphs.inference.shape_folding), the scan outputs of its Loops of a
    static trip count led by that count, their carried outputs of one static shape before and after a run, the
    tensors of the sequences they carry and the concatenations of sequences sized (graphs.inference.onnx_trips),
    and what reads them inferred again: a Loop whose trip count reads another's scan output takes one more
    round."""
    inferred = infer_with_folded_shapes(model)
    rounds = sum(node.op_type in ("Loop", "ConcatFromSequence") for graph in graphs_within(model.graph)
                 for node in graph.node)
    for _ in range(rounds):  # each round sizes some Loop's outputs or concatenations, which stay sized
        sized = [size(inferred.graph) for size in (size_loop_scan_outputs, size_loop_carried_outputs,
                                                   size_loop_sequences, size_concat_from_sequences)]
        if not any(sized):
            break
        inferred = infer_with_folded_shapes(inferred)
    return inferred


def _refuse_conflict(model_file: Path, conflict: ShapeConflict | None, sized: InputShapes,
                     given: InputShapes) -> None:
    """One PlacerError naming the input sizes and the node whose shapes contradict each other at them, if any:
    a U-Net's Concat of halves of different heights at a size that is no multiple of its poolings', which
    onnx's strict inference finds (asked when the lenient one, from the input sizes alone, graphs.inference.
    declared_shapes, left an output unsized); or a Reshape to a fixed size other than its input's
    (``reshape_conflict``), which no inference checks. Either way the import would go on to a graph that
    OpenVINO refuses to run at those sizes, or one costed at the sizes the model was exported at."""
    if conflict is None:
        return
    sizes = ", ".join(f"{name}={','.join(map(str, dims))}" for name, dims in sized.items())
    source = "--input-shape" if given else "the model's own"
    node = f"{conflict.node_name!r} ({conflict.op_type})" if conflict.node_name else f"an unnamed {conflict.op_type}"
    raise PlacerError(f"ONNX model {model_file}: at the input sizes {sizes} ({source}), node {node} fails shape "
                      f"inference: {conflict.reason}")


def _foreign(model_file: Path, call):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - DecodeError, ValidationError, InferenceError, OSError, ...
        raise PlacerError(f"{model_file} is not a valid ONNX model ({type(exc).__name__}: {first_line(exc)})") from None


def _model_inputs(graph) -> list:
    """The graph inputs that are fed (not initializers), of known rank."""
    initializers = {init.name for init in graph.initializer}
    return [value for value in graph.input if value.name not in initializers
            and value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape")]


def _input_dims(graph) -> dict:
    return {value.name: tuple(d.dim_value if static_dim(d) else None for d in value.type.tensor_type.shape.dim)
            for value in _model_inputs(graph)}


def _input_dim_names(graph) -> dict[str, tuple[str | None, ...]]:
    """Each input axis's symbolic name (``dim_param``; None for a size or an unnamed dim): axes of one name
    are one size, so a size given for one carries to the others (graphs.inference.input_shapes)."""
    return {value.name: tuple(None if static_dim(d) else (d.dim_param or None)
                              for d in value.type.tensor_type.shape.dim) for value in _model_inputs(graph)}


def _size_inputs(graph, sized: InputShapes) -> None:
    for value in _model_inputs(graph):
        for dim, size in zip(value.type.tensor_type.shape.dim, sized[value.name]):
            dim.dim_value = size  # replaces a symbolic dim_param (one of the two)


def _unsized_by_op(graph, tensors: Mapping[str, TensorInfo]) -> Counter:
    """{op type: count} of the tensors whose shape inference left a dim symbolic (each counted as 1), and of
    the node outputs it gave no shape at all (an op of a domain it does not know, e.g. com.microsoft's Gelu:
    0 bytes, said, not silent), by the op type that makes them: a user sees which ops to look at (a Reshape
    whose target shape is computed at run time through an op graphs.inference.shape_folding does not fold).
    The tensors of the nodes no output depends on are not counted: the import leaves those nodes out."""
    nodes = live_nodes(graph)
    producer = {tensor: node.op_type for node in nodes for tensor in node.output if tensor}
    unused = {tensor for node in graph.node for tensor in node.output} - producer.keys()
    counts = Counter(producer.get(value.name, "graph input") for value in [*graph.output, *graph.value_info]
                     if value.name not in unused and value.type.HasField("tensor_type")
                     and any(not static_dim(d) for d in value.type.tensor_type.shape.dim))
    counts.update(node.op_type for node in nodes for tensor in node.output
                  if tensor and _shape(tensors.get(tensor)) is None)
    for body in [body for node in nodes for body in bodies(node)]:  # a body's tensors, seen as its nodes do
        counts.update(_unsized_by_op(body, ChainMap(_tensor_table(body), tensors)))
    return counts


TensorInfo = tuple[Shape, int]  # (shape with unknown dims as 1, or None for unknown rank; bytes per element)


def _tensor_table(graph) -> dict[str, TensorInfo]:
    """Every tensor the graph declares: inputs, outputs, inferred value_info, then its weights (initializers
    and Constants' tensors)."""
    table = {}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.HasField("tensor_type"):
            tensor_type = value.type.tensor_type
            shape = tuple(_dim(d) for d in tensor_type.shape.dim) if tensor_type.HasField("shape") else None
            table[value.name] = (shape, _itemsize(tensor_type.elem_type))
    for name, weight in _weights(graph).items():
        table[name] = (tuple(weight.dims), _itemsize(weight.data_type))
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
