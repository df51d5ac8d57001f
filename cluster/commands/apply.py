"""`placer apply RUN_DIR`: what a run's best placement does, as something a person can act on.

Which modules / name scopes went to which device (grouped by their top ``--depth`` scope levels), parameter
bytes and FLOPs per device, and the transfers per step (`cluster.placement_summary`). ``--module-map FILE``
writes ``{module: device}`` for every module (or Keras layer) as JSON, a torch model itself under "" when it
holds parameters of its own, and the modules that share a parameter (tied weights, ``tied``: one device for
all of them): a file the user reads when moving their model, written only when asked, so the command never
changes the run folder. To train with the placement itself, use
``cluster.apply.apply_torch`` / ``apply_keras`` (README, "Use the result").
"""

from __future__ import annotations

import json

from cluster.commands.paths import output_file
from cluster.jsonout import emit_json


def register(subparsers) -> None:
    p = subparsers.add_parser("apply", help="summarize a run's best placement: modules per device, memory, "
                                            "FLOPs, transfers; write a module -> device map")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of placer search")
    p.add_argument("--graph", default=None, metavar="FILE",
                   help="the run's graph file, when it is not where the run found it")
    p.add_argument("--depth", type=int, default=2, metavar="N", help="scope levels to group modules by (default 2)")
    p.add_argument("--module-map", default=None, metavar="FILE", type=output_file,
                   help="write {module: device} as JSON to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from cluster.apply import run_summary
    from cluster.runlog import write_text_atomic
    from graphs.errors import PlacerError

    if args.depth < 1:
        raise PlacerError(f"--depth must be at least 1, got {args.depth}")
    run, summary = run_summary(args.run_dir, args.graph, args.depth)
    if args.module_map:
        _check_spares_runs(Path(args.module_map))
        _check_spares_graphs(Path(args.module_map), run.manifest.graph_file)
    if args.module_map:
        tied = summary.to_json()["tied"]
        write_text_atomic(Path(args.module_map), json.dumps({"graph": summary.graph, "graph_hash": summary.graph_hash,
                                                             "machine": summary.machine, "modules": summary.modules,
                                                             "tied": tied}, indent=2))
    if args.json:
        emit_json({"run": run.manifest.run_id, "run_dir": str(run.run_dir), "runtime_s": run.best.runtime_s,
                   "module_map_file": args.module_map, **summary.to_json()})
        return 0
    _print(run, summary, args.module_map)
    return 0


def _check_spares_runs(module_map) -> None:
    """The map may not land in a run folder, this run's or another's (it replaced the other's manifest.json):
    a folder with a manifest and a measurement log (a web project's manifest.json alone is no run)."""
    from cluster.runlog import MANIFEST_FILE
    from cluster.runlog_format import MEASUREMENTS_DIR
    from graphs.errors import PlacerError

    folder = next((f for f in module_map.resolve().parents
                   if (f / MANIFEST_FILE).is_file() and (f / MEASUREMENTS_DIR).is_dir()), None)
    if folder is not None:
        raise PlacerError(f"--module-map {module_map} lies inside the run folder {folder}, which apply never "
                          "changes: write the map elsewhere")


def _check_spares_graphs(module_map, graph_file: str) -> None:
    """The map may not overwrite the graph file the run read (found from its manifest, which --graph's own
    check does not see): the next apply found the graph damaged. (A cached graph every command's output check
    spares: paths.check_outputs_spare_inputs.)"""
    from pathlib import Path

    from graphs.errors import PlacerError

    if graph_file and module_map.resolve() == Path(graph_file).resolve():
        raise PlacerError(f"--module-map {module_map} is the graph file the run read ({graph_file}): write the map "
                          "elsewhere")


def _si(value: float, unit: str) -> str:
    """``value`` with an SI prefix: 2304 -> "2.3 kB", 3.2e9 -> "3.2 G"."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _print(run, summary, module_map: str | None) -> None:
    from cluster.commands.console import text_console
    from rich.table import Table

    console = text_console(width=160)
    console.print(f"{summary.graph} on {summary.machine}: best placement of run {run.manifest.run_id} "
                  f"({run.best.runtime_s:.4g} s per step, logged as seq {run.best.seq} in its measurements)")
    devices = Table(title="per device")
    for header in ("device", "ops", "parameters", "FLOPs"):
        devices.add_column(header, justify="left" if header == "device" else "right")
    for d in summary.devices:
        devices.add_row(d.device, str(d.ops), _si(d.param_bytes, "B"), _si(d.flops, ""))
    console.print(devices)
    scopes = Table(title="modules / name scopes")
    for header in ("scope", "devices (ops)", "parameters", "FLOPs"):
        scopes.add_column(header, justify="left" if header in ("scope", "devices (ops)") else "right")
    for s in summary.scopes:
        where = ", ".join(f"{name} ({count})" for name, count in s.ops_per_device.items())
        scopes.add_row(s.scope, where, _si(s.param_bytes, "B"), _si(s.flops, ""))
    console.print(scopes)
    t = summary.transfers
    console.print(f"transfers per step: {t.count} ({_si(t.total_bytes, 'B')}), one per (producer, "
                  "destination device)")
    if summary.split_modules:
        console.print(f"modules split across devices: {_module_list(summary.split_modules)}")
    for t in summary.tied:
        holders = _module_list(t.modules)
        console.print(f"tied weights: {holders} share {', '.join(t.parameters)}, so the module map puts "
                      f"each on {t.device}, where the shared parameter is placed")
    if module_map:
        console.print(f"module -> device map: {module_map}")


def _module_list(modules) -> str:
    """Module paths for a line of text; the model's own (ROOT_MODULE, '') would print as nothing."""
    return ", ".join(module or "the model itself ('')" for module in modules)
