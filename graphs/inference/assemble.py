"""Node records -> OpGraph: the part the ONNX and OpenVINO IR importers share.

An importer walks its model in topological order and hands over one ``NodeCost`` per op and the tensors
between ops; this module sums tensors between the same two ops into one edge, derives scopes from the
names (or takes those the model file records), marks every op forward and records what has no FLOP formula.

A subgraph op (ONNX If / Loop / Scan / SequenceMap, OpenVINO If / Loop / TensorIterator) is one op whose
``body_bytes`` are what its bodies' ops read and write over all its runs; where they are known, they are its
bytes accessed (its own inputs and outputs are among what its bodies read and write, not counted again); the
op types without a formula inside bodies, and the subgraph ops whose body could not be costed (why), are the
model's.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from graphs.errors import PlacerError
from graphs.inference.flops import sorted_counts
from graphs.opgraph import MAX_TOTAL_BYTES, PHASE_CODE, OpGraph


@dataclass(frozen=True)
class NodeCost:
    name: str
    op_type: str
    flops: float | None  # None: the op type has no formula (imported with bytes only)
    in_bytes: int  # activations read (from other ops or graph inputs)
    out_bytes: int  # tensors written
    weight_bytes: int  # weights read (initializers / Constants), shared ones included
    param_bytes: int  # weights this op owns: each weight is owned by its first consumer (a subgraph op: and
    # the weights inside its bodies, once)
    body_bytes: int | None = None  # a subgraph op whose bodies are costed: what their ops access (read and
    # write) over all its runs, its bytes accessed (``accessed_bytes``); None: any other op
    scope: str | None = None  # the module path the model file records for the op (torch's current ONNX exporter's
    # metadata: graphs.inference.onnx_scopes); None: its name's (``scope_of``)


@dataclass(frozen=True)
class ImportedModel:
    name: str
    framework: str  # "onnx" | "openvino"
    model_file: str  # absolute path of the model file
    nodes: list[NodeCost]
    edges: list[tuple[int, int, int]]  # (producer op, consumer op, bytes) per tensor; repeats are summed
    batch_size: int
    num_params: int
    input_shapes: dict = field(default_factory=dict)  # every input's sizes when the user gave some (--input-shape)
    unsized_by_op: dict = field(default_factory=dict)  # {op type: tensors it made that the importer could
    # not size} (a symbolic dim counts as 1, an unknown shape as 0 bytes); a graph input's as "graph input"
    body_ops_without_flops: dict = field(default_factory=dict)  # {op type: count} of the ops inside subgraph
    # bodies without a FLOP formula (their subgraph op's FLOPs lack theirs)
    bodies_not_costed: dict = field(default_factory=dict)  # {subgraph op's name (a nested one's path, outer/inner):
    # why its bodies' cost is unknown (its trip count)}: imported with bytes only, as an op without a formula
    unused_by_op: dict = field(default_factory=dict)  # {op type: count} of the nodes no graph output depends on,
    # left out (graphs.inference.onnx_live)


@dataclass
class Uncosted:
    """What the ops inside subgraph bodies leave out: op types without a FLOP formula ({type: count}), and the
    subgraph ops whose bodies could not be costed ({name, a nested one's path outer/inner: why})."""
    without_flops: Counter = field(default_factory=Counter)
    not_costed: dict[str, str] = field(default_factory=dict)

    def add(self, other: Uncosted) -> None:
        self.without_flops.update(other.without_flops)
        self.not_costed.update(other.not_costed)


@dataclass(frozen=True)
class BodyCost:
    """A subgraph op's bodies over all their runs (``flops`` None: how many runs is not known statically)."""
    flops: float | None
    bytes_accessed: int | None  # what the bodies' ops read and write (None with ``flops``)
    param_bytes: int  # the bodies' own weights, resident once however many runs
    uncosted: Uncosted


def body_cost(costs: list[NodeCost], uncosted: Uncosted) -> BodyCost:
    """One run of a body whose ops cost ``costs``: their sums; the op types without a formula are listed."""
    uncosted.without_flops.update(cost.op_type for cost in costs if cost.flops is None)
    return BodyCost(sum(cost.flops or 0.0 for cost in costs),
                    sum(accessed_bytes(cost) for cost in costs),
                    sum(cost.param_bytes for cost in costs), uncosted)


class TripCountOverflow(PlacerError):
    """A loop's static trip count times its body's bytes is past what a graph counts (the importer names the
    model file before the rest)."""


def repeated(body: BodyCost, runs: int | None, path: str, why: str, op_type: str) -> BodyCost:
    """A loop's cost: ``body`` (one run) ``runs`` times; when ``runs`` is None (not static), no FLOPs (listed)
    and no body bytes (the op's own inputs and outputs stand for them), and ``path``'s ``why`` recorded. Its
    weights are resident either way. A trip count that takes a body's bytes past 2**62 is a TripCountOverflow
    naming the op (not the input sizes' fault)."""
    if runs is None:
        return BodyCost(None, None, body.param_bytes, Uncosted(not_costed={path: why}))
    total_bytes = runs * body.bytes_accessed
    if total_bytes >= MAX_TOTAL_BYTES > body.bytes_accessed:
        raise TripCountOverflow(f"{op_type} {path!r} runs its body {runs} times (its static trip count), "
                                f"{body.bytes_accessed} bytes accessed in each run: {total_bytes:.3g} bytes, more "
                                "than a graph counts (2**62)")
    return BodyCost(runs * body.flops, total_bytes, body.param_bytes, body.uncosted)


def costlier(branches: list[BodyCost]) -> BodyCost:
    """An If's cost: the larger of its branches' FLOPs, and of their bytes (an upper bound of the one that
    runs); every branch's weights are resident."""
    uncosted = Uncosted()
    for branch in branches:
        uncosted.add(branch.uncosted)
    return BodyCost(max(b.flops or 0.0 for b in branches), max(b.bytes_accessed for b in branches),
                    sum(b.param_bytes for b in branches), uncosted)


def accessed_bytes(cost: NodeCost) -> int:
    """What an op reads and writes: its inputs, outputs and weights; a subgraph op with costed bodies, what
    they access (its inputs and outputs among that: a body reads its inputs and writes its outputs)."""
    return cost.body_bytes if cost.body_bytes is not None else cost.in_bytes + cost.out_bytes + cost.weight_bytes


def scope_of(name: str) -> str:
    """``/encoder/layer.0/attention/MatMul`` -> ``encoder.layer.0.attention``: the dotted module path the
    torch benchmarks' scopes use (expert placements match scope prefixes); a bare name has no scope.
    ``/enc1/Conv/WithoutBiases``, the half OpenVINO's ONNX reader splits off a Conv or Gemm with a bias (the
    bias Add keeps ``/enc1/Conv``), is ``enc1``'s too."""
    head, _, _ = name.strip("/").removesuffix("/WithoutBiases").rpartition("/")
    return head.replace("/", ".")


def unique_names(names: list[str]) -> list[str]:
    """``names`` with repeats suffixed ``_1``, ``_2``, ... (never colliding with an existing name)."""
    taken, seen, result = set(names), set(), []
    for name in names:
        candidate, k = name, 0
        while candidate in seen or (candidate != name and candidate in taken):
            k += 1
            candidate = f"{name}_{k}"
        seen.add(candidate)
        result.append(candidate)
    return result


def to_opgraph(model: ImportedModel) -> OpGraph:
    """The OpGraph of an imported inference model; meta carries the model file and the op types without
    a FLOP formula, inside subgraph bodies too (``{}`` when every op had one), and where there are any, the
    input sizes the user gave, the count of tensors without a size, the subgraph ops whose bodies could
    not be costed (``bodies_not_costed``) and the nodes left out as no output depends on them
    (``unused_nodes``, ``unused_nodes_by_op``)."""
    nodes = model.nodes
    pair_bytes: dict[tuple[int, int], int] = defaultdict(int)
    for src, dst, size in model.edges:
        if src != dst:
            pair_bytes[(src, dst)] += int(size)
    _check_byte_totals(model, pair_bytes)
    pairs = sorted(pair_bytes)
    missing = Counter(node.op_type for node in nodes if node.flops is None) + Counter(model.body_ops_without_flops)
    model_file = os.path.abspath(model.model_file)
    return OpGraph(
        name=model.name,
        framework=model.framework,
        op_names=np.array([node.name for node in nodes], dtype=object),
        op_kinds=np.array([node.op_type for node in nodes], dtype=object),
        flops=np.array([node.flops or 0.0 for node in nodes], dtype=np.float64),
        bytes_accessed=np.array([accessed_bytes(node) for node in nodes], dtype=np.float64),
        out_bytes=np.array([node.out_bytes for node in nodes], dtype=np.int64),
        param_bytes=np.array([node.param_bytes for node in nodes], dtype=np.int64),
        edge_src=np.array([p[0] for p in pairs], dtype=np.int64),
        edge_dst=np.array([p[1] for p in pairs], dtype=np.int64),
        edge_bytes=np.array([pair_bytes[p] for p in pairs], dtype=np.int64),
        scopes=np.array([scope_of(node.name) if node.scope is None else node.scope for node in nodes], dtype=object),
        phases=np.full(len(nodes), PHASE_CODE["forward"], dtype=np.int8),
        batch_size=model.batch_size,
        num_params=model.num_params,
        source=model_file,
        meta=_meta(model_file, sorted_counts(missing), model),
    )


def _check_byte_totals(model: ImportedModel, pair_bytes: dict) -> None:
    """Sizes past a 64-bit count (absurd input sizes, given or declared by the model) are one PlacerError."""
    totals = {"outputs": sum(node.out_bytes for node in model.nodes),
              "weights": sum(node.param_bytes + node.weight_bytes for node in model.nodes),
              "inputs": sum(node.in_bytes for node in model.nodes), "edges": sum(pair_bytes.values()),
              "subgraph bodies' accesses": sum(node.body_bytes or 0 for node in model.nodes)}
    name, total = max(totals.items(), key=lambda item: item[1])
    if total < MAX_TOTAL_BYTES:
        return
    hint = "check the input sizes (--input-shape)"
    if name == "subgraph bodies' accesses":  # several loops, each within the limit (repeated checks one)
        most = max(model.nodes, key=lambda node: node.body_bytes or 0)
        hint = f"the most from {most.op_type} {most.name!r}, {most.body_bytes:.3g} over its runs: check its trip count"
    raise PlacerError(f"model {model.model_file}: its {name} total {min(total, 10**300):.3g} bytes, more than "
                      f"a graph counts (2**62): {hint}")


def _meta(model_file: str, ops_without_flops: dict, model: ImportedModel) -> dict:
    meta = {"model_file": model_file, "ops_without_flops": ops_without_flops}
    if model.input_shapes:
        meta["input_shapes"] = {name: list(sizes) for name, sizes in model.input_shapes.items()}
    if model.unsized_by_op:
        meta["tensors_without_size"] = sum(model.unsized_by_op.values())
        meta["unsized_tensors_by_op"] = dict(sorted(model.unsized_by_op.items()))
    if model.bodies_not_costed:
        meta["bodies_not_costed"] = dict(model.bodies_not_costed)
    if model.unused_by_op:
        meta["unused_nodes"] = sum(model.unused_by_op.values())
        meta["unused_nodes_by_op"] = dict(sorted(model.unused_by_op.items()))
    return meta
