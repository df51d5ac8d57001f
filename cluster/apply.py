"""From a found placement to the user's own training run.

A run folder (`cluster.runlog`) holds the best placement a search found (``best_placement.json``, per group
or per op; ``groups.parquet`` maps groups to ops), the machine and the content hash of the graph it was
found for. ``apply_torch`` / ``apply_keras`` rebuild the user's training step from the same kind of
function `placer graphs import` takes, trace it, refuse it unless its graph has the run's hash (a
placement for another model, or another version of it, would put ops on the wrong devices), and return
the step placed (`measurers.torch.apply.PlacedStep`, `measurers.tf.apply.PlacedKerasStep`)::

    from cluster.apply import apply_torch
    step = apply_torch("runs/my_model__reinforce__0__20261130T120000", my_model)
    for x, y in batches:
        loss = step(x, y)
    step.copy_to(model)

The source may also be an (N,) op placement array; the machine (a Machine, or a catalog name or file)
must then be given, and there is no hash to check. ``run_summary`` is what `placer apply` prints. Reading
the run and finding its graph: `cluster.run_best`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from cluster.placement_summary import PlacementSummary, summarize_placement
from cluster.run_best import RunBest, read_run_best, run_graph
from graphs.errors import PlacerError
from graphs.opgraph import OpGraph
from measurers.catalog import load_machine
from measurers.machine import Machine
from measurers.placement import check_placement


def run_summary(run_dir: str | os.PathLike, graph_file: str | os.PathLike | None = None,
                scope_depth: int = 2) -> tuple[RunBest, PlacementSummary]:
    run = read_run_best(run_dir)
    graph = run_graph(run, graph_file)
    return run, summarize_placement(graph, run.machine, run.op_placement(graph), scope_depth)


@dataclass(frozen=True)
class _Target:
    """Where a placement comes from: what the user's graph must be named and hash to, and the machine."""

    graph_name: str | None  # None: the user's function name
    graph_hash: str | None  # None: nothing to check (an array placement)
    machine: Machine
    run: RunBest | None
    placement: np.ndarray | None  # the array given, or None for a run


def _target(source, machine) -> _Target:
    if isinstance(source, (str, os.PathLike)):
        if machine is not None:
            raise PlacerError("a run folder names its machine: pass machine only with a placement array")
        run = read_run_best(source)
        return _Target(run.manifest.graph_name, run.manifest.graph_hash, run.machine, run, None)
    if machine is None:
        raise PlacerError("an op placement array needs its machine (a Machine, a catalog name or a file)")
    return _Target(None, None, machine if isinstance(machine, Machine) else load_machine(str(machine)), None,
                   np.asarray(source))


def _checked(graph: OpGraph, origin: str, target: _Target) -> np.ndarray:
    """The op placement for ``graph`` once its hash is the run's."""
    if target.run is None:
        return check_placement(graph, target.machine, target.placement)
    if graph.content_hash != target.graph_hash:
        raise PlacerError(f"{origin} builds a model whose training step has graph hash {graph.content_hash}, but "
                          f"run {target.run.run_dir} placed graph {target.graph_name!r} with hash "
                          f"{target.graph_hash}: a placement of another model (or another version, batch size "
                          "or optimizer of it) is refused")
    return target.run.op_placement(graph)


def apply_torch(source, build_fn: Callable[[], tuple], *, machine=None, torch_devices: Callable | None = None,
                optimizer_options: dict | None = None):
    """The user's PyTorch step placed as ``source`` says: a run folder (its best placement, machine and
    graph hash) or an (N,) op placement array with ``machine``. ``build_fn() -> (model, example_inputs[,
    loss_fn])``. ``torch_devices(machine) -> [torch device per machine device]`` (default: CPUs to ``cpu``,
    the k-th GPU to ``cuda:k``). Returns a `measurers.torch.apply.PlacedStep`."""
    from measurers.torch.apply import place_user_step, trace_user_step
    from measurers.torch.measurer import default_torch_devices

    target = _target(source, machine)
    user = trace_user_step(build_fn, target.graph_name or getattr(build_fn, "__name__", "model"))
    placement = _checked(user.graph, user.origin, target)
    return place_user_step(user, placement, target.machine, torch_devices or default_torch_devices,
                           optimizer_options)


def apply_keras(source, build_fn: Callable, *, machine=None, batch_size: int | None = None, seed: int = 0,
                tf_devices: Callable | None = None):
    """The user's Keras step placed as ``source`` says (as ``apply_torch``). ``build_fn()`` returns a
    compiled model (``batch_size`` made-up examples, default 32: use the import's ``--batch-size``) or
    ``(model, inputs, targets[, loss])``; it runs in a fresh Keras session seeded with ``seed``.
    ``tf_devices(machine) -> [TensorFlow device per machine device]`` (default: the k-th CPU to
    ``/device:CPU:k``, the k-th GPU to ``/device:GPU:k``). Returns a `measurers.tf.apply.PlacedKerasStep`
    (close it, or use ``with``)."""
    from measurers.tf.apply import place_user_keras_step, trace_user_keras_step
    from measurers.tf.measurer import tf_device_names

    target = _target(source, machine)
    name = target.graph_name or getattr(build_fn, "__name__", "keras")
    user = trace_user_keras_step(build_fn, name, batch_size, seed)
    return place_user_keras_step(user, _checked(user.graph, user.origin, target), target.machine,
                                 tf_devices or tf_device_names)
