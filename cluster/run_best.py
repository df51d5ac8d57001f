"""A run's best placement with what it was found for: the machine, the group map and the graph, whose
content hash must be the run's. `cluster.plots` simulates it; `cluster.apply` puts it on the user's step::

    run = read_run_best("runs/my_model__reinforce__0__20261130T120000")
    graph = run_graph(run)                  # PlacerError unless it hashes as the run's graph
    placement = run.op_placement(graph)     # (N,) device of every op
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cluster.runlog_format import (BEST_FILE, MANIFEST_FILE, RESULT_FILE, BestPlacement, RunManifest,
                                   check_measurement_log, op_placement_of, ran_ok, read_best, read_groups,
                                   read_manifest, read_run, removed_device_indices, rows_without_devices)
from graphs.errors import PlacerError
from graphs.opgraph import OpGraph
from measurers.catalog import machine_from_json
from measurers.machine import Machine
from measurers.placement import check_placement


@dataclass(frozen=True)
class RunBest:
    """A run's best placement as logged, with what it was found for."""

    run_dir: Path
    manifest: RunManifest
    machine: Machine
    best: BestPlacement
    group_of_op: np.ndarray | None  # (N,) group of each op; None when the run logs op placements

    def op_placement(self, graph: OpGraph) -> np.ndarray:
        """(N,) int64 device of every op of ``graph`` (group placements expanded), checked."""
        placement = op_placement_of(self.best.placement, self.group_of_op, graph.num_ops, self.run_dir,
                                    level=self.best.placement_level)
        return check_placement(graph, self.machine, placement)


def read_run_best(run_dir: str | os.PathLike) -> RunBest:
    """PlacerError when ``run_dir`` is not a run folder, has no best placement yet or a damaged one, or its
    measurement log is damaged (a part file lost: analyze and --resume refuse it, and so do the commands
    reading its best: a best whose row the log lacks is no run's best)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    check_measurement_log(run_dir)
    best = read_best(run_dir)
    if best is None:
        raise PlacerError(f"run {run_dir} has no best placement (no {BEST_FILE}): {_why_no_best(run_dir, manifest)}")
    machine = machine_from_json(manifest.machine, where=f"{run_dir}/manifest.json")
    return RunBest(run_dir, manifest, machine, best, read_groups(run_dir))


def _why_no_best(run_dir: Path, manifest: RunManifest) -> str:
    """Why a run has no best placement file: none of its placements ran yet or at all, or, where its log has
    placements that ran, the file was removed."""
    ran = int(ran_ok(rows_without_devices(read_run(run_dir), removed_device_indices(manifest))).sum())
    if ran:
        return (f"its log holds {ran} placement{'s' * (ran != 1)} measured ok, so the file was removed or lost "
                "after it was written")
    if (run_dir / RESULT_FILE).exists():
        return "it finished without one: no placement it measured ran (out of memory or failed)"
    return "no placement has been measured ok yet"


def read_run_best_of(run_dir: str | os.PathLike, graph: OpGraph, what: str) -> RunBest:
    """``read_run_best``, and one PlacerError starting with ``what`` (the flag and path given) unless the
    run placed ``graph`` (its content hash)."""
    run = read_run_best(run_dir)
    if run.manifest.graph_hash != graph.content_hash:
        raise PlacerError(f"{what}: that run placed a graph with hash {run.manifest.graph_hash}; graph "
                          f"{graph.name!r} has hash {graph.content_hash}")
    return run


def load_placement(path: str | os.PathLike, graph: OpGraph, machine: Machine) -> np.ndarray:
    """(N,) op placement from ``--placement PATH``: a placement file (measurers/placement.py), or a run folder
    or its ``best_placement.json`` (the run's best, groups expanded by the run's own grouping); a run of
    another graph or machine is one PlacerError."""
    from measurers.catalog import machine_to_json
    from measurers.placement import load_placement_file

    path = Path(path)
    run_dir = placement_run_folder(path)
    if run_dir is None:
        return load_placement_file(path, graph, machine)
    run = read_run_best_of(run_dir, graph, f"--placement {path}")
    placed_on, given = machine_to_json(run.machine), machine_to_json(machine)
    if placed_on != given:
        raise PlacerError(f"--placement {path}: run {run_dir} placed it on machine {run.machine.name!r}, "
                          f"not on {machine.name!r} as it is given{_same_name_differs(placed_on, given)}")
    return run.op_placement(graph)


def placement_run_folder(path: Path) -> Path | None:
    """The run folder a ``--placement PATH`` names: the folder itself, or the run folder whose best placement
    file ``path`` is (a link to one followed); None for a placement file (a user's own may be named
    best_placement.json too)."""
    if path.is_dir():
        return path
    if path.name != BEST_FILE:
        return None
    folder = path.resolve().parent
    return folder if (folder / MANIFEST_FILE).is_file() else None


def _same_name_differs(placed_on: dict, given: dict) -> str:
    """What tells two machine descriptions of one name apart (two machine files of one name, or one edited
    after a run searched with it)."""
    if placed_on.get("name") != given.get("name"):
        return ""
    fields = [key for key in dict.fromkeys([*placed_on, *given]) if placed_on.get(key) != given.get(key)]
    return f" (both are named {given.get('name')!r} but differ in {', '.join(fields)}: give --machine the machine " \
           "file the run searched with)"


def _recorded(run: RunBest) -> str:
    """Where the run read its graph, when that is not the name looked up from here."""
    recorded = run.manifest.graph_file
    name = str(run.manifest.config.get("graph", run.manifest.graph_name))
    if not recorded or recorded == name:
        return ""
    state = "holds another graph now" if os.path.isfile(recorded) else "is gone"
    return f"; {recorded}, which the run read, {state}"


def run_graph(run: RunBest, graph_file: str | os.PathLike | None = None) -> OpGraph:
    """The graph the run placed: ``graph_file``, else the run's graph file or cached benchmark, else the
    benchmark rebuilt; PlacerError unless it has the run's content hash."""
    from cluster.analysis import cached_graph
    from graphs.io import load_graph_file
    from graphs.registry import load_graph

    name = str(run.manifest.config.get("graph", run.manifest.graph_name))
    if graph_file is not None:
        graph = load_graph_file(graph_file)
    else:
        graph = cached_graph(run.manifest)
        if graph is None:
            try:
                graph = load_graph(name)
            except PlacerError as exc:
                raise PlacerError(f"cannot find graph {name!r} of run {run.run_dir} ({exc}{_recorded(run)}): pass "
                                  "its graph file (--graph of apply and simulate)") from None
    if graph.content_hash != run.manifest.graph_hash:
        raise PlacerError(f"graph {graph.name!r} has content hash {graph.content_hash}, but run {run.run_dir} "
                          f"placed a graph with hash {run.manifest.graph_hash}")
    return graph
