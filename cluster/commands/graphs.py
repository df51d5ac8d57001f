"""`placer graphs list|show|export|import`: inspect benchmark graphs and graph files, write graph files."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cluster.commands.notes import note_fewer_groups_than_asked, note_groups_above_colocation
from cluster.commands.paths import graph_output_file
from graphs.tensorflow_quiet import import_tensorflow_quietly
from cluster.jsonout import emit_json
from graphs.errors import PlacerError
from graphs.opgraph import PHASE_CODE
from graphs.grouping import DEFAULT_MAX_GROUPS, METHODS

SYNTHETIC_ENTRY = ("synthetic:N[:SEED]", "seeded random layered DAG of N ops (scale tests, up to 20,000,000)")


def register(subparsers) -> None:
    parser = subparsers.add_parser("graphs", help="list, show, export and import op graphs")
    commands = parser.add_subparsers(dest="graphs_command", required=True, metavar="ACTION")

    listing = commands.add_parser("list", help="the built-in benchmark graphs")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_list)

    show = commands.add_parser("show", help="figures of a benchmark or graph file")
    show.add_argument("graph", metavar="NAME_OR_FILE")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.add_argument("--groups", type=int, default=None, metavar="G",  # None: not given, DEFAULT_MAX_GROUPS
                      help=f"group to at most G (default {DEFAULT_MAX_GROUPS})")
    show.add_argument("--method", default=None, help="grouping method (default: the grouping default)")
    show.set_defaults(func=_show)

    export = commands.add_parser("export", help="write a benchmark (or graph file) as a Parquet graph file")
    export.add_argument("graph", metavar="NAME_OR_FILE")
    export.add_argument("-o", "--output", required=True, metavar="FILE", type=graph_output_file)
    export.set_defaults(func=_export, positional_args=("graph",))  # named so in errors (cluster/commands/paths.py)

    importer = commands.add_parser("import", help="trace a PyTorch or Keras model, or read an ONNX model or "
                                                  "OpenVINO IR, into a graph file")
    source = importer.add_mutually_exclusive_group(required=True)
    source.add_argument("--torch", metavar="FILE_OR_MODULE:FUNCTION",
                        help="a function of no arguments returning (model, example inputs[, loss_fn]): inputs a "
                             "tensor or a tuple of tensors; without loss_fn the model's output is the loss "
                             "(summed if not a scalar); the step is forward, loss, backward and an Adam update")
    source.add_argument("--keras", metavar="FILE_OR_MODULE:FUNCTION",
                        help="a function returning a compiled Keras model or (model, inputs, targets[, loss]), "
                             "or a .keras file")
    source.add_argument("--onnx", metavar="FILE", help="an ONNX model file (an inference graph, batch as exported)")
    source.add_argument("--openvino", metavar="FILE.xml",
                        help="an OpenVINO IR .xml (its .bin beside it; an inference graph)")
    importer.add_argument("--input-shape", action="append", dest="input_shapes", metavar="NAME=D0,D1,...",
                          help="--onnx and --openvino: the sizes of an input the model leaves dynamic (repeatable; "
                               "a dynamic leading dim is the batch and counts as 1, any other must be given)")
    importer.add_argument("-o", "--output", required=True, metavar="FILE", type=graph_output_file)
    importer.add_argument("--batch-size", type=int, default=None, metavar="N",
                          help="--keras only: examples per step for a compiled model alone or a .keras file "
                               "(default 32); it must match the batch of returned inputs")
    importer.set_defaults(func=_import)


def _list(args: argparse.Namespace) -> int:
    from graphs.registry import list_benchmarks

    rows = [(b.name, b.description) for b in list_benchmarks()] + [SYNTHETIC_ENTRY]
    if args.json:
        emit_json([{"name": name, "description": text} for name, text in rows])
        return 0
    from cluster.commands.console import text_console
    from rich.table import Table

    table = Table("name", "description", title="benchmark graphs")
    for name, text in rows:
        table.add_row(name, text)
    text_console().print(table)
    return 0


def _show(args: argparse.Namespace) -> int:
    from graphs.grouping import DEFAULT_METHOD, group_ops
    from graphs.registry import load_graph

    given = args.groups is not None
    max_groups = args.groups if given else DEFAULT_MAX_GROUPS
    if max_groups < 1:
        raise PlacerError(f"--groups must be at least 1, got {max_groups}")
    method = args.method or DEFAULT_METHOD
    if method not in METHODS:  # before the graph: building (and caching) one takes minutes for the large
        raise PlacerError(f"unknown grouping method {method!r} (known: {', '.join(METHODS)})")
    graph = load_graph(args.graph)
    grouping = group_ops(graph, max_groups=max_groups, method=method)
    note_groups_above_colocation(max_groups, graph.num_colocation_groups, graph.name, given=given)
    note_fewer_groups_than_asked(max_groups, grouping.num_groups, graph.num_colocation_groups, graph.name,
                                 grouping.method or method, given=given)
    figures = graph.summary()
    figures.update(groups=grouping.num_groups, max_groups=max_groups, grouping_method=grouping.method or method,
                   colocation_groups=graph.num_colocation_groups)
    if args.json:
        emit_json(figures)
        return 0
    from cluster.commands.console import text_console
    from rich.table import Table

    table = Table("figure", "value", title=f"graph {graph.name}")
    training = bool((graph.phases == PHASE_CODE["backward"]).any())
    for key, value in figures.items():
        table.add_row(key, _readable(key, value, training))
    text_console().print(table)
    return 0


def _readable(key: str, value, training: bool = False) -> str:
    if key in ("flops", "forward_flops"):
        return _flops_text(value)
    if key == "param_bytes":  # a training step keeps more than the weights resident
        held = ": weights, gradients and optimizer state" if training else ""
        return f"{value:,} ({value / 2**20:.1f} MiB{held})"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


FLOP_UNITS = (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3))


def _flops_text(flops: float) -> str:
    """``3.262e+09 (3.262 GFLOP)``: the largest unit the count reaches, so a small graph is not 0.000 TFLOP."""
    for unit, scale in FLOP_UNITS:
        if flops >= scale:
            return f"{flops:.4g} ({flops / scale:.3f} {unit})"
    return f"{flops:.4g} FLOP"


def _export(args: argparse.Namespace) -> int:
    from graphs.io import save_graph
    from graphs.registry import load_graph

    graph = load_graph(args.graph)  # built completely before anything is written
    path = save_graph(graph, args.output)
    print(f"wrote {path} ({graph.num_ops:,} ops, {graph.num_edges:,} edges, hash {graph.content_hash})")
    return 0


def _import(args: argparse.Namespace) -> int:
    from graphs.io import save_graph

    if (args.onnx or args.openvino) and args.batch_size is not None:
        raise PlacerError("--batch-size applies to --keras only: an ONNX model or OpenVINO IR has its batch "
                          "in its input shapes (--input-shape sizes a dynamic one)")
    if args.input_shapes and not (args.onnx or args.openvino):
        raise PlacerError("--input-shape applies to --onnx and --openvino only: a traced model's inputs are its "
                          "example inputs")
    _check_output_is_not_an_input(args)
    graph = _read_model_file(args) if args.onnx or args.openvino else _trace_model(args)
    _note_unrolled_layers(graph.meta.get("unrolled_layers") or [])
    _note_own_train_step(graph.meta.get("own_train_step") or "", graph.name)
    _note_default_step(graph.meta.get("default_step") or "", args.keras or "")
    _warn_ops_without_flops(graph.meta.get("ops_without_flops") or {}, graph.meta.get("bodies_not_costed") or {})
    _warn_loops_counted_once(graph.meta.get("loops_counted_once", 0))
    _warn_tensors_without_size(graph.meta.get("tensors_without_size", 0), graph.meta.get("unsized_tensors_by_op", {}))
    path = save_graph(graph, args.output)
    print(f"wrote {path} ({graph.num_ops:,} ops, {graph.num_edges:,} edges, hash {graph.content_hash})")
    return 0


def _check_output_is_not_an_input(args: argparse.Namespace) -> None:
    """``-o`` naming one of the model's own files (its module, saved model, weights, ONNX external data)
    would replace the user's model with the graph file."""
    from graphs.tf.importer import KERAS_FILE_SUFFIXES

    output = Path(args.output)
    if not output.exists():
        return
    if args.onnx or args.openvino:
        inputs = [Path(args.onnx or args.openvino)]
        inputs += [inputs[0].with_suffix(".bin")] if args.openvino else _onnx_external_data_files(inputs[0])
    elif args.keras and args.keras.endswith(KERAS_FILE_SUFFIXES):
        inputs = [Path(args.keras)]
    else:
        module = (args.torch or args.keras).rpartition(":")[0]
        inputs = [Path(module if module.endswith(".py") else module.replace(".", os.sep) + ".py")]
    for model_file in inputs:
        if model_file.exists() and os.path.samefile(output, model_file):
            raise PlacerError(f"-o {args.output} is the model's own file {str(model_file)!r}: it would be "
                              "overwritten; write the graph to another path")


def _onnx_external_data_files(model_path: Path) -> list[Path]:
    """The files an ONNX model keeps its tensors in, beside it (none when it cannot be read: the import says why)."""
    try:
        import onnx

        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # noqa: BLE001  (a damaged model is the importer's error to report)
        return []
    locations = {entry.value for tensor in _onnx_tensors(model.graph) for entry in tensor.external_data
                 if entry.key == "location"}
    return [model_path.parent / location for location in sorted(locations)]


def _onnx_tensors(graph):
    """Every tensor of an ONNX graph: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            yield from ([attribute.t] if attribute.HasField("t") else [])
            yield from attribute.tensors
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _onnx_tensors(subgraph)


def _read_model_file(args: argparse.Namespace):
    from graphs.inference.input_shapes import parse_input_shapes

    shapes = parse_input_shapes(args.input_shapes)
    if args.onnx:
        return _importer("graphs.inference.onnx_import", "import_onnx", "ONNX")(args.onnx, input_shapes=shapes)
    return _importer("graphs.inference.openvino_import", "import_openvino_ir", "OpenVINO")(args.openvino,
                                                                                          input_shapes=shapes)


def _trace_model(args: argparse.Namespace):
    spec = args.torch or args.keras
    if args.torch and args.batch_size is not None:
        raise PlacerError("--batch-size applies to --keras only: a --torch function returns its example inputs, "
                          "whose batch the graph takes")
    if os.getcwd() not in sys.path:  # so `placer graphs import --torch mymodels:build` finds ./mymodels.py: at
        sys.path.append(os.getcwd())  # the end, as a model file's folder (an installed module of the name first)
    if args.torch:
        importer = _importer("graphs.torch.importer", "import_torch_spec", "PyTorch")
    else:
        _check_keras_file(spec)
        import_tensorflow_quietly()
        importer = _importer("graphs.tf.importer", "import_keras_spec", "Keras")
    try:
        return importer(spec) if args.torch else importer(spec, batch_size=args.batch_size)
    except PlacerError:
        raise
    except (ImportError, SyntaxError, AttributeError, FileNotFoundError) as exc:
        raise PlacerError(f"cannot load model spec {spec!r}: {type(exc).__name__}: {exc}") from None


def _check_keras_file(spec: str) -> None:
    """A saved model file (or a spec's .py file) that is not there or not a Keras file: said before TensorFlow
    loads (seconds)."""
    from graphs.specs import check_spec_file
    from graphs.tf.importer import KERAS_FILE_SUFFIXES, saved_model_problem

    if not spec.endswith(KERAS_FILE_SUFFIXES):
        check_spec_file(spec, "keras")
    elif problem := saved_model_problem(spec):
        raise PlacerError(f"Keras model file {spec!r} {problem}")


def _note_unrolled_layers(layers: list[str]) -> None:
    """Keras recurrent layers built with unroll=False were traced unrolled (graphs.tf.recurrent): ``fit`` would
    run their loop, the graph (and the tf measurer's step) has the same computation step by step."""
    if layers:
        print(f"placer: note: {len(layers)} Keras recurrent layer(s) built with unroll=False traced unrolled, so "
              f"every time step's ops are in the graph: {', '.join(layers)}", file=sys.stderr)


def _note_own_train_step(method: str, model: str) -> None:
    """A Keras model whose class overrides ``train_step``: the graph is the importer's step, not that one
    (graphs.tf.importer.own_train_step), and so is what the tf measurer and ``apply_keras`` run."""
    if method:
        print(f"placer: note: {method} of Keras model {model!r} is not traced: the graph is the importer's step "
              "(forward, the loss compiled or returned, else mean squared error, tape gradients, the optimizer's "
              "update), which the tf measurer and apply_keras run too; if yours computes another loss, return "
              "(model, inputs, targets, loss) with it", file=sys.stderr)


def _note_default_step(step: str, spec: str) -> None:
    """A saved Keras model file without ``compile()``: the importer made its loss and optimizer up
    (graphs.tf.importer.DEFAULT_STEP), and the tf measurer times that step."""
    if step:
        print(f"placer: note: Keras model file {spec!r} was saved without compile(): its training step is traced "
              f"with {step}; compile it with its loss and optimizer before saving, or import a function that "
              "returns (model, inputs, targets, loss)", file=sys.stderr)


def _warn_ops_without_flops(missing: dict[str, int], not_costed: dict[str, str]) -> None:
    """One stderr line naming the op types imported with bytes only, so a FLOP total is read knowingly; the
    subgraph ops among them (a Loop, Scan, TensorIterator) are there because their trip count is unknown,
    and the line says so, op by op, with why."""
    if not missing:
        return
    listed = ", ".join(f"{kind} ({count})" for kind, count in missing.items())
    noun = "op type has" if len(missing) == 1 else "op types have"
    why = "; subgraph ops whose bodies are not costed, their trip count unknown: " + ", ".join(
        f"{name} ({reason})" for name, reason in not_costed.items()) if not_costed else ""
    print(f"placer: warning: {len(missing)} {noun} no FLOP formula, imported with bytes only: {listed}{why}",
          file=sys.stderr)


def _warn_loops_counted_once(count: int) -> None:
    """A TF while loop without a static trip count has its body inlined once: its FLOPs and bytes are one
    iteration's (graphs.tf.flatten). Loops with one are costed that many times, and are not warned about."""
    if count:
        print(f"placer: warning: {count} while loop(s) without a static trip count imported with their body "
              "counted once: their FLOPs and bytes are one iteration's (a condition on the loop's data may stop it "
              "at any iteration; a loop bounded only by maximum_iterations, tf.range or a counter compared with a "
              "constant is costed every iteration)", file=sys.stderr)


def _warn_tensors_without_size(count: int, by_op: dict[str, int]) -> None:
    """Shape inference left a dim of some tensors, or their whole shape, unknown (data-dependent shapes, an op
    it does not know): their bytes are a guess. The op types that made them say where to look."""
    if count:
        made_by = ", ".join(f"{kind} ({n})" for kind, n in sorted(by_op.items(), key=lambda item: -item[1]))
        print(f"placer: warning: {count} tensor(s) have a dim or a shape that shape inference could not size "
              f"({'made by ' + made_by + ': ' if made_by else ''}a shape computed at run time, or an op it does "
              "not know); an unknown dim counts as 1, an unknown shape as 0 bytes, in their bytes and FLOPs",
              file=sys.stderr)


def _importer(module_name: str, function_name: str, framework: str):
    import importlib

    try:
        return getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise PlacerError(f"the {framework} importer is not available ({module_name}.{function_name}): "
                          f"{exc}") from None
