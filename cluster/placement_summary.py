"""What a placement does, in terms a person can act on: which modules went where, what each device holds
and computes, and what crosses between devices each step.

``summarize_placement(graph, machine, placement)`` gives a `PlacementSummary`:

- per device: ops, parameter bytes (``OpGraph.param_bytes``: weights, gradients and optimizer state) and
  FLOPs; the parameter bytes of all devices add up to the graph's;
- per scope prefix (the top ``scope_depth`` levels of each op's module / name scope, e.g. ``encoder.layer1``):
  ops on each device, parameter bytes and FLOPs;
- transfers per step, counted as the simulator counts them: one per (producer, destination device) that
  a consumer on another device needs, of the largest edge's bytes among those consumers;
- ``modules``: every scope -> one device name, the device a user would put that module on: the one
  holding most of its parameter bytes, else running most of its FLOPs, else most of its ops (ties: the
  lower device index); ``split_modules`` names the scopes whose ops run on more than one device. A parent
  comes before its children (shallower scopes first), so applied in order (``.to()`` per entry) a child's
  own entry wins over its parent's. A torch model's own parameters and buffers (registered on the model,
  not on a submodule: their Variable ops' scope is "") are under ``ROOT_MODULE`` (``model.get_submodule("")``
  is the model), the first entry, when it holds any: applied first, its ``.to()`` moves the whole model,
  and every other entry then moves its own. The torch importer's scope for the ops of the loss function,
  ``loss``, is not a module and is left out (when it holds no parameters). A graph that records which
  scopes are layers (``meta[LAYER_SCOPES]``: the Keras importer's) maps layers only: an op counts for the
  innermost layer its scope lies in, and the optimizer's, the loss's and a bare TF op's scopes ("adam",
  "mse", "Add") are no module (their ops still count in the device totals; the importer puts a weight's
  gradient and optimizer state on its variable op, colocated with its updates, so parameters still decide
  a layer's device, where the variable is named in the layer's scope).
- ``tied``: modules that hold one parameter or buffer (tied weights, ``out.weight = emb.weight``), from the
  torch importer's record (``meta[TIED_PARAMETERS]``). ``.to()`` on any of them moves the one tensor for
  all, so the map puts them all on one device: the one its Variable op is placed on (for modules tied
  through several tensors, the device holding most of their bytes), and lists every holder, also one with
  no ops of its own (else a parent's entry applied after the other holders could move the tensor), and the
  model itself (``ROOT_MODULE``) where it holds the tensor too (``self.head.weight = self.shared``). A graph
  without the record has none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import LAYER_SCOPES, TIED_PARAMETERS, OpGraph
from graphs.torch import LOSS_SCOPE
from measurers.machine import Machine

UNSCOPED = "(top level)"  # ops outside any submodule: inputs, constants, the root module's own ops
ROOT_MODULE = ""  # the module map's key for a torch model itself (its own parameters): model.get_submodule("")


@dataclass(frozen=True)
class DeviceLoad:
    device: str
    ops: int
    param_bytes: int
    flops: float


@dataclass(frozen=True)
class ScopeLoad:
    scope: str  # the top scope_depth levels, or UNSCOPED
    ops_per_device: dict  # device name -> ops (devices with none left out)
    param_bytes: int
    flops: float


@dataclass(frozen=True)
class Transfers:
    count: int  # per step: (producer, destination device) pairs
    total_bytes: int


@dataclass(frozen=True)
class TiedModules:
    """Modules holding one parameter (tied weights): one device in the module map."""
    modules: tuple  # dotted module paths, in map order
    parameters: tuple  # the shared tensors' names (their Variable ops' ``param:NAME``)
    device: str  # where the shared tensors' Variable ops are placed: each module's entry in the map


@dataclass(frozen=True)
class PlacementSummary:
    graph: str
    graph_hash: str
    framework: str
    machine: str
    devices: tuple  # DeviceLoad per machine device, in machine order
    scopes: tuple  # ScopeLoad per scope prefix, in order of first op
    transfers: Transfers
    modules: dict  # full scope -> device name
    split_modules: tuple  # scopes whose ops run on more than one device
    tied: tuple  # TiedModules: modules sharing a parameter, put on one device in ``modules``

    def to_json(self) -> dict:
        return asdict(self)


def summarize_placement(graph: OpGraph, machine: Machine, placement: np.ndarray,
                        scope_depth: int = 2) -> PlacementSummary:
    """``placement``: (N,) int64 device of every op (already checked against graph and machine)."""
    placement = np.asarray(placement, dtype=np.int64)  # (N,)
    names = [d.name for d in machine.devices]
    num_devices = machine.num_devices
    devices = tuple(DeviceLoad(names[d], int(np.sum(placement == d)), int(graph.param_bytes[placement == d].sum()),
                               float(graph.flops[placement == d].sum())) for d in range(num_devices))
    prefixes = np.array([".".join(s.split(".")[:scope_depth]) if s else UNSCOPED for s in graph.scopes], dtype=object)
    scopes = tuple(_scope_load(str(p), prefixes == p, graph, placement, names) for p in _in_order(prefixes))
    modules, split = _modules(graph, placement, names)
    tied = _tied_modules(graph, placement, names)
    modules = _with_tied(modules, tied)
    return PlacementSummary(graph.name, graph.content_hash, graph.framework, machine.name, devices, scopes,
                            transfers_per_step(graph, placement), modules, split, _in_map_order(tied, modules))


def transfers_per_step(graph: OpGraph, placement: np.ndarray) -> Transfers:
    """One transfer per (producer, destination device) with a consumer there, of its largest edge's bytes."""
    placement = np.asarray(placement, dtype=np.int64)
    dst_device = placement[graph.edge_dst]  # (E,)
    cut = placement[graph.edge_src] != dst_device  # (E,) bool
    if not cut.any():
        return Transfers(0, 0)
    keys = graph.edge_src[cut] * (int(placement.max()) + 1) + dst_device[cut]  # (C,) producer x destination
    unique, inverse = np.unique(keys, return_inverse=True)
    largest = np.zeros(len(unique), dtype=np.int64)  # (T,) bytes of each transfer
    np.maximum.at(largest, inverse, graph.edge_bytes[cut])
    return Transfers(len(unique), int(largest.sum()))


def _in_order(labels: np.ndarray) -> list:
    """Distinct labels in order of first appearance."""
    _, first = np.unique(labels, return_index=True)
    return [labels[i] for i in sorted(first)]


def _scope_load(scope: str, mask: np.ndarray, graph: OpGraph, placement: np.ndarray, names: list) -> ScopeLoad:
    counts = np.bincount(placement[mask], minlength=len(names))  # (D,)
    return ScopeLoad(scope, {names[d]: int(c) for d, c in enumerate(counts) if c},
                     int(graph.param_bytes[mask].sum()), float(graph.flops[mask].sum()))


def _modules(graph: OpGraph, placement: np.ndarray, names: list) -> tuple[dict, tuple]:
    modules, split = {}, []
    module_of_op = _module_of_op(graph)  # (N,) object
    scopes = sorted(_in_order(module_of_op), key=_depth)  # stable: parents first
    for scope in scopes:
        if scope == ROOT_MODULE and not _root_holds_parameters(graph, module_of_op):
            continue
        mask = module_of_op == scope
        on = placement[mask]  # (n,) devices of the module's ops
        by = [np.bincount(on, weights=w, minlength=len(names)) for w in
              (graph.param_bytes[mask].astype(np.float64), graph.flops[mask], np.ones(len(on)))]  # 3 x (D,)
        best = max(range(len(names)), key=lambda d: (by[0][d], by[1][d], by[2][d], -d))
        modules[str(scope)] = names[best]
        if len(np.unique(on)) > 1:
            split.append(str(scope))
    return modules, tuple(split)


def _depth(module: str) -> int:
    """Levels of a module path: 0 for the model itself (ROOT_MODULE), 1 for "fc1", 2 for "fc2.inner"."""
    return module.count(".") + 1 if module else 0


def _root_holds_parameters(graph: OpGraph, module_of_op: np.ndarray) -> bool:
    """A torch model holds parameters or buffers of its own (their Variable ops have scope "")."""
    return graph.framework == "torch" and bool(graph.param_bytes[module_of_op == ROOT_MODULE].any())


def _module_of_op(graph: OpGraph) -> np.ndarray:
    """(N,) object: the module each op counts for in ``modules``, "" for none. A graph that records its
    layers (``meta[LAYER_SCOPES]``, Keras) maps each op to the innermost layer its scope lies in, so that the
    optimizer's, the loss's and a bare TF op's scopes are no module; others map each op to its own scope,
    less the ops of the torch loss function (when they hold no parameters)."""
    layers = graph.meta.get(LAYER_SCOPES)
    if layers is not None:
        if not isinstance(layers, list) or not all(isinstance(scope, str) for scope in layers):
            raise PlacerError(f"graph {graph.name!r}: meta[{LAYER_SCOPES!r}] must be a list of scope names, "
                              f"got {layers!r:.80}")
        layers = frozenset(layers)
        layer_of = {scope: _innermost_layer(scope, layers) for scope in _in_order(graph.scopes)}
        return np.array([layer_of[scope] for scope in graph.scopes], dtype=object)
    module_of_op = graph.scopes.copy()
    loss = graph.scopes == LOSS_SCOPE  # (N,) bool
    if graph.framework == "torch" and not graph.param_bytes[loss].any():
        module_of_op[loss] = ""
    return module_of_op


def _innermost_layer(scope: str, layers: frozenset) -> str:
    """The longest dotted prefix of ``scope`` in ``layers`` ("block.conv" for "block.conv.moments"), or ""."""
    parts = scope.split(".") if scope else []
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in layers:
            return ".".join(parts[:k])
    return ""


def _tied_modules(graph: OpGraph, placement: np.ndarray, names: list) -> list:
    """TiedModules per set of modules tied through one or more shared tensors (``meta[TIED_PARAMETERS]``),
    on the device holding most of those tensors' Variable ops' bytes (ties: more of them, then the lower
    index); modules in no particular order yet."""
    clusters = []  # [(holder modules, first names)], merged where they share a module
    for held in _tied_record(graph):
        modules, firsts = {name.rpartition(".")[0] for name in held}, [held[0]]  # ROOT_MODULE: the model's own
        for other in [c for c in clusters if c[0] & modules]:
            clusters.remove(other)
            modules, firsts = modules | other[0], other[1] + firsts
        clusters.append((modules, firsts))
    clusters = [c for c in clusters if len(c[0]) > 1]  # a tensor held twice by one module ties it to nothing
    op_of = {name: op for op, name in enumerate(graph.op_names)}
    tied = []
    for modules, firsts in clusters:
        missing = [name for name in firsts if f"param:{name}" not in op_of]
        if missing:
            raise PlacerError(f"graph {graph.name!r}: meta[{TIED_PARAMETERS!r}] names {missing[0]!r}, but the graph "
                              f"has no Variable op 'param:{missing[0]}'")
        ops = np.array([op_of[f"param:{name}"] for name in firsts], dtype=np.int64)  # (k,) Variable ops
        held_bytes = np.bincount(placement[ops], weights=graph.param_bytes[ops].astype(np.float64),
                                 minlength=len(names))  # (D,)
        held = np.bincount(placement[ops], minlength=len(names))  # (D,)
        best = max(range(len(names)), key=lambda d: (held_bytes[d], held[d], -d))
        tied.append(TiedModules(tuple(modules), tuple(firsts), names[best]))
    return tied


def _tied_record(graph: OpGraph) -> list:
    """``meta[TIED_PARAMETERS]``, checked: a list of lists of two or more names; [] for a graph without it."""
    record = graph.meta.get(TIED_PARAMETERS, [])
    if not isinstance(record, list) or not all(
            isinstance(held, list) and len(held) > 1 and all(isinstance(name, str) for name in held)
            for held in record):
        raise PlacerError(f"graph {graph.name!r}: meta[{TIED_PARAMETERS!r}] must be a list of lists of two or more "
                          f"parameter names, got {record!r:.80}")
    return record


def _with_tied(modules: dict, tied: list) -> dict:
    """``modules`` with every holder of a tied tensor on its TiedModules' device, holders without ops of their
    own added, parents still before their children (stable: the others keep their order)."""
    merged = {**modules, **{module: t.device for t in tied for module in sorted(t.modules)}}
    return dict(sorted(merged.items(), key=lambda item: _depth(item[0])))


def _in_map_order(tied: list, modules: dict) -> tuple:
    """``tied`` with each one's modules in the map's order, and ordered by their first module."""
    position = {module: k for k, module in enumerate(modules)}
    tied = [TiedModules(tuple(sorted(t.modules, key=position.get)), t.parameters, t.device) for t in tied]
    return tuple(sorted(tied, key=lambda t: position[t.modules[0]]))
