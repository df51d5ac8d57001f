"""OpenVINO IR (``model.xml`` + ``model.bin`` beside it) -> inference OpGraph.

Contract with the OpenVINO measurer: op names are the nodes' friendly names (unique in a model, or the
import fails), Parameter, Result and Constant nodes are not ops, nor is a Convert of a float16 Constant (the
decompression of float16-compressed weights, ``ov.save_model``'s and ``ovc``'s default, which OpenVINO folds
when it compiles: its output is the weight), ``meta["model_file"]`` is the .xml path.
A Constant's bytes (a decompressed one's as its Convert gives them) are resident ``param_bytes`` of its first
consumer (counted once: Constants that share one stored weight's data, as the converter makes of a weight two
layers or a Loop's body and the model read, are one weight; a ShapeOf, which reads only its shape, owns it
only when nothing else reads it) and read bytes (``bytes_accessed``) of every consumer; a tensor from a
Parameter is read bytes, not an edge.
A node that reads one tensor twice reads it once; an output nothing reads (MaxPool's indices) adds no
output bytes. ``num_params`` counts the scalars of floating-point weights as the IR stores them, each once (after
the converter's folding, e.g. batch norms folded into one scale and shift).

Subgraph ops (If, Loop, TensorIterator: what ``openvino.convert_model`` makes of ONNX's If, Loop and Scan) are
one op each and cost their bodies, which the OpenVINO API hands over (``get_function``, ``get_then_body``,
``get_else_body``) with their shapes: a body's ops are costed as the model's, recursively, and summed (the
op's own inputs and outputs are among what they read and write, not counted again). A Loop or TensorIterator
multiplies its body by ``get_num_iterations()`` when OpenVINO knows it (a Loop's trip count a Constant and its
condition constant true; a TensorIterator's sliced inputs' length); when it does not (-1), the op keeps no
FLOPs (listed in ``ops_without_flops``), its own inputs and outputs its bytes accessed, and why is in
``meta["bodies_not_costed"]``. An If takes the larger of its branches' FLOPs and of their bytes (an upper
bound of the one that runs). The Constants inside bodies (the converter moves the weights a body reads
into it) are resident ``param_bytes`` of the subgraph op, once, unless an op before it owns them (a weight
read before the loop too), and count in ``num_params``; outputs of
dynamic shape are counted by op type in ``meta["unsized_tensors_by_op"]``, those inside bodies included.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

from graphs.errors import PlacerError
from graphs.files import file_problem
from graphs.inference.assemble import (BodyCost, ImportedModel, NodeCost, TripCountOverflow, Uncosted, body_cost,
                                       costlier, repeated, to_opgraph)
from graphs.inference.flops import Shape, op_flops
from graphs.inference.input_shapes import InputShapes, sized_inputs
from graphs.opgraph import OpGraph

NOT_OPS = ("Parameter", "Result", "Constant")
SUBGRAPH_OPS = ("If", "Loop", "TensorIterator")
SHAPE_READERS = ("ShapeOf",)  # ops that read only their input's shape, not its data
NO_ITERATIONS = {"Loop": "a trip count or a condition computed at run time",  # why get_num_iterations() is -1
                 "TensorIterator": "its sliced inputs' length is not static"}
F16 = ("f16", "bf16")  # the element types of compressed float weights (compress_to_fp16)


def import_openvino_ir(xml_path: str, name: str | None = None, input_shapes: InputShapes | None = None) -> OpGraph:
    """The OpGraph of the OpenVINO IR at ``xml_path`` (framework "openvino", every op forward); ``input_shapes``
    sizes the inputs the IR leaves without sizes (``--input-shape``; graphs.inference.input_shapes)."""
    xml_file, ir_version = _checked_ir_files(xml_path)
    model = _read_model(xml_file, ir_version)
    given = input_shapes or {}
    sized = size_ir_inputs(model, f"OpenVINO IR {xml_file}", given)
    ops = _ops_of(model)
    if not ops:
        raise PlacerError(f"OpenVINO IR {xml_file} has no ops: only Parameters, Constants and Results")
    _require_unique_names(xml_file, ops)
    try:
        nodes, uncosted = _cost_ops(ops, [node.get_friendly_name() for node in ops])
    except TripCountOverflow as exc:
        raise PlacerError(f"OpenVINO IR {xml_file}: {exc}") from None
    return to_opgraph(ImportedModel(name or xml_file.stem, "openvino", str(xml_file), nodes, _edges(ops),
                                    _batch_size(model), _num_params(model), sized if given else {},
                                    dict(_outputs_without_size(ops)),
                                    dict(uncosted.without_flops), uncosted.not_costed))


def _cost_ops(ops: list, names: list[str], owned: set | None = None,
              data_read: set | None = None) -> tuple[list[NodeCost], Uncosted]:
    """One NodeCost per op, the model's or (recursively) a subgraph body's: a stored weight (``_stored``: the
    Constants that share its data are one) is owned (``param_bytes``) by its first consumer, read by each.
    ``owned``: the weights owned already, by the ops before these (the model's ops and the bodies' share one
    set); ``data_read``: the weights some op other than a ShapeOf reads, in the model or a body (a ShapeOf reads
    only a weight's shape, and owns one only when nothing else reads it)."""
    owned = set() if owned is None else owned
    data_read = _data_read(ops) if data_read is None else data_read
    costs, uncosted = [], Uncosted()
    for node, name in zip(ops, names):
        in_bytes = weight_bytes = param_bytes = 0
        reads_data = node.get_type_name() not in SHAPE_READERS
        for source in _distinct_sources(node):
            producer, size = source.get_node(), _bytes(source)
            if producer.get_type_name() != "Constant" and not _is_weight(producer):
                in_bytes += size
                continue
            weight_bytes += size
            stored = _stored(producer)
            if stored not in owned and (reads_data or stored not in data_read):
                param_bytes += size
                owned.add(stored)
        flops, body_bytes = None, None
        if node.get_type_name() in SUBGRAPH_OPS:
            body = _subgraph_cost(node, name, owned, data_read)
            flops, body_bytes, param_bytes = body.flops, body.bytes_accessed, param_bytes + body.param_bytes
            uncosted.add(body.uncosted)
        else:
            flops = op_flops(node.get_type_name(), [_shape(p.get_source_output()) for p in node.inputs()],
                             [_shape(out) for out in node.outputs()], node.get_attributes())
        costs.append(NodeCost(name, node.get_type_name(), flops, in_bytes,
                              sum(_bytes(out) for out in _used_outputs(node)), weight_bytes, param_bytes, body_bytes))
    return costs, uncosted


def _stored(weight) -> tuple:
    """What identifies the bytes a Constant (or a decompressing Convert's Constant) holds: the address and size
    of its data. The IR reader gives every Constant of one stored weight (a weight shared by two layers, or read
    before, inside and after a Loop's body, which the converter gives a Constant each) the same data, in the
    .bin; ``ov.save_model`` stores equal weights once, so they are one too. A Constant whose data cannot be
    had is itself."""
    constant = weight.input_value(0).get_node() if weight.get_type_name() == "Convert" else weight
    try:
        return "data", constant.data.ctypes.data, constant.get_byte_size()
    except (RuntimeError, TypeError, ValueError, AttributeError):  # an element type numpy has no view of
        return "node", constant.get_instance_id()


def _data_read(ops: list) -> set:
    """The stored weights (``_stored``) that some op other than a ShapeOf reads among ``ops`` or (recursively)
    in their subgraph bodies."""
    found = set()
    for node in ops:
        if node.get_type_name() not in SHAPE_READERS:
            found.update(_stored(source.get_node()) for source in _distinct_sources(node)
                         if source.get_node().get_type_name() == "Constant" or _is_weight(source.get_node()))
        for body in _bodies(node):
            found |= _data_read(_ops_of(body))
    return found


def _edges(ops: list) -> list[tuple[int, int, int]]:
    """(producer, consumer, bytes) per tensor an op reads from another op (not a Parameter or a Constant)."""
    index = {node.get_instance_id(): i for i, node in enumerate(ops)}
    return [(index[source.get_node().get_instance_id()], i, _bytes(source))
            for i, node in enumerate(ops) for source in _distinct_sources(node)
            if source.get_node().get_type_name() not in NOT_OPS and not _is_weight(source.get_node())]


def _subgraph_cost(node, path: str, owned: set, data_read: set) -> BodyCost:
    """An If costs its costlier branch (graphs.inference.assemble.costlier: an upper bound); a Loop or a
    TensorIterator its body times its iterations, when OpenVINO knows them statically (``get_num_iterations``:
    a Loop's trip count a Constant and its condition constant true; a TensorIterator's sliced inputs' length)."""
    bodies = [_body_cost(body, path, owned, data_read) for body in _bodies(node)]
    if node.get_type_name() == "If":
        return costlier(bodies)
    iterations = node.get_num_iterations()
    why = f"{node.get_type_name()}: OpenVINO gives no static iteration count ({NO_ITERATIONS[node.get_type_name()]})"
    return repeated(bodies[0], iterations if iterations >= 0 else None, path, why, node.get_type_name())


def _body_cost(body, path: str, owned: set, data_read: set) -> BodyCost:
    """One run of a body (an ``ov.Model``): its ops costed as the model's, summed (its weights owned unless an
    op before it, in the model or another body, owns them)."""
    ops = _ops_of(body)
    return body_cost(*_cost_ops(ops, [f"{path}/{node.get_friendly_name()}" for node in ops], owned, data_read))


def _ops_of(model) -> list:
    return [node for node in model.get_ordered_ops() if node.get_type_name() not in NOT_OPS and not _is_weight(node)]


def _bodies(node) -> list:
    """The ``ov.Model`` bodies of a subgraph op (an If's two branches, a Loop's or TensorIterator's body)."""
    kind = node.get_type_name()
    if kind == "If":
        return [node.get_then_body(), node.get_else_body()]
    return [node.get_function()] if kind in SUBGRAPH_OPS else []


def _is_weight(node) -> bool:
    """A Convert of a float16 (or bfloat16) Constant: compressed weights decompressed, folded by OpenVINO into a
    float32 Constant when it compiles (as the uncompressed IR's). As an op it cost a kernel and, placed apart
    from its reader, a copy. Integer weights (int8 compression: Convert, Subtract, Multiply) stay ops."""
    if node.get_type_name() != "Convert":
        return False
    source = node.input_value(0)
    return source.get_node().get_type_name() == "Constant" and source.get_element_type().get_type_name() in F16


def size_inputs(model, where: str, given: InputShapes) -> InputShapes:
    """Reshape ``model`` (an ``ov.Model``, in place) so every input has sizes, and return them: ``given``
    applied (an input of unknown rank must be given), a leading dim without a size 1 when nothing is given,
    anything else refused (graphs.inference.input_shapes). An IR names no dims, so a size given for one input's leading dim is not
    carried to another's: with sizes given, every input whose leading dim is dynamic must be given too (the
    error names them), rather than left at 1 beside a batch of 8 or guessed to share it (a leading dim need
    not be the batch). A model whose inputs are static and not given is left as it is. The OpenVINO measurer
    calls this with the graph's recorded sizes (every input's, when any was given)."""
    ports = {_input_name(port): port for port in model.inputs}
    aliases = {alias: name for name, port in ports.items() for alias in port.get_names()}
    named = {}  # any of an input's names, once
    for key, sizes in given.items():
        name = aliases.get(key, key)
        if name in named:
            raise PlacerError(f"{where}: --input-shape gives input {name!r} twice ({named[name][0]!r} and {key!r} "
                              f"are its names)")
        named[name] = (key, sizes)
    given = {name: sizes for name, (_, sizes) in named.items()}
    dims = {name: _dims(port.get_partial_shape()) for name, port in ports.items()}  # None: unknown rank
    sized = sized_inputs(where, dims, given)
    changed = {ports[name]: list(sizes) for name, sizes in sized.items() if sizes != dims[name]}
    if changed:
        try:
            model.reshape(changed)
        except (RuntimeError, TypeError) as exc:  # the sizes contradict an op (a Reshape to a fixed size)
            given_text = ", ".join(f"{port_name}={','.join(map(str, sized[port_name]))}"
                                   for port_name in sized if ports[port_name] in changed)
            raise PlacerError(f"{where}: OpenVINO cannot size the model's inputs as {given_text}: "
                              f"{reshape_failure(exc)}") from None
    return sized


def size_ir_inputs(model, where: str, given: InputShapes) -> InputShapes:
    """``size_inputs``, then the nodes the reshape made numbered as ``number_counter_named_nodes`` numbers them.
    Sizing a dynamic input rebuilds shape arithmetic over it (a Gather of a ShapeOf becomes a Gather of a
    Constant) under OpenVINO's counter names, which differ between processes (``Gather_108`` at import,
    another number in the measurer's process): the import and the OpenVINO measurer both size an IR this way,
    so its graph's op names are the measurer's node names."""
    before = {node.get_friendly_name() for node in model.get_ordered_ops()}
    sized = size_inputs(model, where, given)
    number_counter_named_nodes(model, keep=before)
    return sized


OPENVINO_COUNTER_NAME = re.compile(r"([A-Z][A-Za-z0-9]*)_\d+")  # Transpose_241: OpenVINO's own name for a node
MODEL_NAMED = ("Parameter", "Result")  # the model's inputs and outputs: named by the model, whatever the form


def number_counter_named_nodes(model, keep: frozenset | set = frozenset()) -> None:
    """Number the nodes named after OpenVINO's counter (``<Type>_<n>``) by their prefix's order in the model,
    but those named in ``keep``. OpenVINO names a node nothing named after a counter of every node the process
    has made (``Transpose_241`` in one process, ``Transpose_11637`` after another model was converted; a node a
    transformation made keeps the name of the one it replaced, a Convolution ``Transpose_3555``), and the
    importer takes those names as op names: the same benchmark hashed differently with what the process had
    converted before. The model's inputs and outputs keep the names it gave them (a Keras input ``Image_1`` is
    not OpenVINO's counter)."""
    nodes = model.get_ordered_ops()
    counted = [None if node.get_type_name() in MODEL_NAMED or node.get_friendly_name() in keep else
               OPENVINO_COUNTER_NAME.fullmatch(node.get_friendly_name()) for node in nodes]
    taken = {node.get_friendly_name() for node, match in zip(nodes, counted) if match is None}
    counts: dict[str, int] = {}
    for node, match in zip(nodes, counted):
        if match is None:
            continue
        prefix = match.group(1)
        while True:
            counts[prefix] = counts.get(prefix, 0) + 1
            name = f"{prefix}_{counts[prefix]}"
            if name not in taken:
                break
        node.set_friendly_name(name)
        taken.add(name)


# OpenVINO's "While validating node 'opset1::Concat cat (...) -> (...)' with friendly_name 'cat':"
_VALIDATING = re.compile(r"While validating node '(?:\w+::)?(\w+) .*' with friendly_name '(.*)':\s*$")


def reshape_failure(exc: Exception) -> str:
    """What OpenVINO's reshape error says, shortly: the node that failed (type and name), why (its last line),
    and the input shapes it was given where it says them; its first line (the C++ check) when it names none."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    node = next((match for match in map(_VALIDATING.match, lines) if match), None)
    if node is None or len(lines) < 3:
        return lines[0] if lines else type(exc).__name__
    shapes = next((line.removeprefix("Shape inference input shapes ") for line in lines
                   if line.startswith("Shape inference input shapes ")), "")
    return (f"node {node.group(2)!r} ({node.group(1)}) fails: {lines[-1]}"
            + (f" (its input shapes {shapes})" if shapes else ""))


def _input_name(port) -> str:
    """The name an input goes by: its Parameter's, where the port carries it, else the least of the port's
    tensor names. A converter that removed a Cast after an input gave the port the Cast's output name too
    ("/layer/Cast_output_0" beside "mask"), and the least of them was the internal one."""
    names = port.get_names()
    friendly = port.get_node().get_friendly_name()
    return friendly if friendly in names or not names else min(names)


def _dims(shape) -> tuple | None:
    """One size per axis (None where dynamic); None for a dynamic rank."""
    if shape.rank.is_dynamic:
        return None
    return tuple(dim.get_length() if dim.is_static else None for dim in shape)


def _distinct_sources(node) -> list:
    """The outputs ``node`` reads, each once: ``Multiply(y, y)`` reads y once, one edge's worth of bytes."""
    sources = {}
    for port in node.inputs():
        source = port.get_source_output()
        sources.setdefault((source.get_node().get_instance_id(), source.get_index()), source)
    return list(sources.values())


def _used_outputs(node) -> list:
    """The outputs something reads (an op or a Result): MaxPool's indices output, read by nothing, is no
    tensor the op hands on."""
    return [out for out in node.outputs() if out.get_target_inputs()]


def _outputs_without_size(ops: list) -> Counter:
    """{op type: count} of the op outputs whose shape still has a dynamic dim after the inputs are sized (each
    counted as 1), the ops inside subgraph bodies included."""
    counts = Counter(node.get_type_name() for node in ops for out in node.outputs()
                     if out.get_partial_shape().is_dynamic)
    for body in [body for node in ops for body in _bodies(node)]:
        counts.update(_outputs_without_size(_ops_of(body)))
    return counts


def _checked_ir_files(xml_path: str) -> tuple[Path, str]:
    """The resolved .xml path and its IR version (``<net version=...>``), after checking it is IR XML with
    layers and a version, and that its .bin is there when it has weights (so a damaged file is named plainly
    instead of by every OpenVINO frontend in turn)."""
    xml_file = Path(xml_path).resolve()
    if problem := file_problem(xml_file):
        raise PlacerError(f"OpenVINO IR {xml_file} {problem}")
    try:
        root = ElementTree.parse(xml_file).getroot()
    except ElementTree.ParseError as exc:
        raise PlacerError(f"OpenVINO IR {xml_file} is not well-formed XML ({exc})") from None
    if root.tag != "net":
        raise PlacerError(f"{xml_file} is not an OpenVINO IR: its root element is <{root.tag}>, not <net>")
    if root.find("layers/layer") is None:
        raise PlacerError(f"OpenVINO IR {xml_file} has no layers")
    if not root.get("version"):  # the IR reader reads such a <net> as a model of nothing
        raise PlacerError(f"OpenVINO IR {xml_file}: its <net> has no version attribute, which the IR reader needs")
    has_weights = any(layer.get("type") == "Const" for layer in root.iter("layer"))
    if has_weights and not xml_file.with_suffix(".bin").is_file():
        raise PlacerError(f"OpenVINO IR {xml_file}: its weights file {xml_file.with_suffix('.bin')} is missing")
    return xml_file, root.get("version")


def _read_model(xml_file: Path, ir_version: str):
    """The ``ov.Model`` of the IR, read by OpenVINO's IR frontend alone (it takes the .bin beside the .xml):
    ``Core.read_model`` hands a file its IR reader refuses to every other frontend in turn, and TensorFlow's
    prints its parse errors (absl log lines) on stderr before the import's one error line."""
    import openvino as ov

    frontend = ov.frontend.FrontEndManager().load_by_framework("ir")
    try:
        supported = frontend.supported(str(xml_file))
    except RuntimeError:  # a version that is no number: "stoll"
        supported = False
    if not supported:
        raise PlacerError(f"OpenVINO cannot read IR {xml_file}: its IR reader does not take IR version "
                          f"{ir_version!r}")
    try:
        return frontend.convert(frontend.load(str(xml_file)))
    except RuntimeError as exc:  # OpenVINO raises RuntimeError for every parse or validation failure
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise PlacerError(f"OpenVINO cannot read IR {xml_file}: {lines[-1] if lines else 'no detail'}") from None


def _require_unique_names(xml_file: Path, ops: list) -> None:
    counts = Counter(node.get_friendly_name() for node in ops)
    repeated = sorted(name for name, count in counts.items() if count > 1)
    if repeated:
        raise PlacerError(f"OpenVINO IR {xml_file}: friendly names are not unique ({len(repeated)} repeated, "
                          f"e.g. {repeated[0]!r}); the OpenVINO measurer addresses ops by friendly name")


def _shape(output) -> Shape:
    """Static dims of an output port; a dynamic dim counts as 1, a dynamic rank gives None."""
    shape = output.get_partial_shape()
    if shape.rank.is_dynamic:
        return None
    return tuple(dim.get_length() if dim.is_static else 1 for dim in shape)


def _bytes(output) -> int:
    shape = _shape(output)
    return 0 if shape is None else math.prod(shape) * output.get_element_type().size


def _batch_size(model) -> int:
    """The first Parameter's leading dim when it is static, else 1."""
    for parameter in model.get_parameters():
        shape = parameter.get_output_partial_shape(0)
        if shape.rank.is_static and shape.rank.get_length() > 0 and shape[0].is_static:
            return max(1, shape[0].get_length())
        return 1
    return 1


def _num_params(model) -> int:
    """Scalars of the floating-point stored weights (``_stored``: the Constants sharing one weight's data count
    it once), those inside subgraph bodies included."""
    return sum(math.prod(_shape(node.output(0)) or ()) for node in _real_constants(model, {}).values())


def _real_constants(model, found: dict) -> dict:
    """{stored weight: its first Constant} of the floating-point Constants of ``model`` and its bodies, added to
    ``found``."""
    for node in model.get_ordered_ops():
        if node.get_type_name() == "Constant" and node.get_output_element_type(0).is_real():
            found.setdefault(_stored(node), node)
        for body in _bodies(node):
            _real_constants(body, found)
    return found
