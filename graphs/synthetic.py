"""Seeded synthetic training-step graphs for scale tests: ``synthetic:N[:SEED]``.

A graph of exactly N ops, shaped like a training step:

- a few ``Input`` ops (the batch) and ``Variable`` ops (~1 in 12 ops) whose ``param_bytes`` hold weights,
  gradient and two Adam moments (4x the weight bytes); every ``MatMul``/``Conv2D`` reads a Variable drawn at
  random, so most Variables feed one, but some (6-8%) are read only by their update op;
- compute ops in layers (the first half "forward", the second "backward"), each reading one op of the layer
  before and often a second one up to four layers back (skip connections); layer width varies around
  N^0.4, so large graphs are long and moderately wide like real unrolled models;
- one ``ApplyAdam`` update op per Variable, colocated with it, reading the Variable and a late ("gradient") op.

Sizes are log-normal (tensor bytes median 2 MB, dense-op FLOPs median 0.2 GFLOP, weight tensors median 256 kB), op kinds mix dense,
elementwise, other and view-like ops, so the cost model sees all of its op classes. Everything is numpy
vectorized: a million ops build in a few seconds. The same (N, seed) always gives the same graph.
"""

from __future__ import annotations

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import PHASE_CODE, OpGraph

MAX_OPS = 20_000_000
_KINDS = {  # op kind -> (share of compute ops, FLOPs per output element, bytes accessed / out bytes)
    "MatMul": (0.15, None, 3.0), "Conv2D": (0.10, None, 3.0),
    "Add": (0.12, 1.0, 3.0), "Mul": (0.08, 1.0, 3.0), "Relu": (0.12, 1.0, 2.0),
    "Tanh": (0.06, 4.0, 2.0), "Sigmoid": (0.07, 4.0, 2.0),
    "Softmax": (0.05, 10.0, 2.0), "Mean": (0.05, 1.0, 1.2), "ConcatV2": (0.05, 0.0, 2.0),
    "FusedBatchNormV3": (0.05, 8.0, 2.5), "Reshape": (0.05, 0.0, 0.0), "Identity": (0.05, 0.0, 0.0),
}


def synthetic_from_spec(spec: str) -> OpGraph:
    """``synthetic:N`` or ``synthetic:N:SEED`` -> synthetic_graph(N, SEED)."""
    return synthetic_graph(*parse_synthetic_spec(spec))


def parse_synthetic_spec(spec: str) -> tuple[int, int]:
    """``synthetic:N[:SEED]`` -> (N, SEED), checked without building the graph (so a command can refuse a
    bad name before it starts anything)."""
    parts = spec.split(":")
    if parts[0] != "synthetic" or len(parts) not in (2, 3) or not all(x.isascii() and x.isdigit() for x in parts[1:]):
        raise PlacerError(f"bad synthetic graph name {spec!r}: expected synthetic:N or synthetic:N:SEED")
    num_ops, seed = int(parts[1]), int(parts[2]) if len(parts) == 3 else 0
    _check_num_ops(num_ops)
    return num_ops, seed


def full_graph_name(name: str) -> str:
    """The name a graph called ``name`` carries: ``synthetic:N`` is built as ``synthetic:N:0``; any other
    name is its own."""
    try:
        num_ops, seed = parse_synthetic_spec(name)
    except PlacerError:
        return name
    return f"synthetic:{num_ops}:{seed}"


def _check_num_ops(num_ops: int) -> None:
    if not 1 <= num_ops <= MAX_OPS:
        raise PlacerError(f"synthetic graphs have 1..{MAX_OPS} ops, not {num_ops}")


def synthetic_graph(num_ops: int, seed: int = 0) -> OpGraph:
    """A seeded random layered training-step DAG of exactly ``num_ops`` ops (see the module docstring)."""
    _check_num_ops(num_ops)
    rng = np.random.default_rng(seed)
    n_in = 1 if num_ops < 48 else 4
    n_var = (num_ops - n_in) // 12
    n_comp = num_ops - n_in - 2 * n_var
    first_comp, first_upd = n_in + n_var, n_in + n_var + n_comp

    widths = _layer_widths(rng, n_comp)
    layer = np.repeat(np.arange(len(widths)), widths)  # (C,) layer of each compute op
    layer_start = np.concatenate([[0], np.cumsum(widths)])  # (L+1,)
    kinds = np.array(list(_KINDS), dtype=object)
    kind_idx = rng.choice(len(kinds), size=n_comp, p=np.array([v[0] for v in _KINDS.values()]) / 1.0)

    out_bytes = np.zeros(num_ops, dtype=np.int64)
    flops = np.zeros(num_ops, dtype=np.float64)
    bytes_accessed = np.zeros(num_ops, dtype=np.float64)
    param_bytes = np.zeros(num_ops, dtype=np.int64)
    op_kinds = np.empty(num_ops, dtype=object)

    op_kinds[:n_in] = "Input"
    out_bytes[:n_in] = _lognormal_bytes(rng, 8e6, 1.0, n_in)
    weight_bytes = _lognormal_bytes(rng, 256e3, 2.0, n_var)
    op_kinds[n_in:first_comp] = "Variable"
    out_bytes[n_in:first_comp] = weight_bytes
    param_bytes[n_in:first_comp] = 4 * weight_bytes
    op_kinds[first_upd:] = "ApplyAdam"
    flops[first_upd:] = 10.0 * weight_bytes / 4
    bytes_accessed[first_upd:] = 4.0 * weight_bytes

    comp = slice(first_comp, first_upd)
    op_kinds[comp] = kinds[kind_idx]
    out_bytes[comp] = _lognormal_bytes(rng, 2e6, 1.5, n_comp)
    per_element = np.array([np.nan if v[1] is None else v[1] for v in _KINDS.values()])[kind_idx]
    dense = np.isnan(per_element)
    flops[comp] = np.where(dense, np.clip(rng.lognormal(np.log(2e8), 1.5, n_comp), 1e5, 1e12),
                           np.nan_to_num(per_element) * out_bytes[comp] / 4)
    bytes_accessed[comp] = np.array([v[2] for v in _KINDS.values()])[kind_idx] * out_bytes[comp]

    src, dst = _edges(rng, n_in, n_var, first_comp, first_upd, layer, layer_start, dense)
    phases = np.full(num_ops, PHASE_CODE["other"], dtype=np.int8)
    phases[comp] = np.where(layer < (len(widths) + 1) // 2, PHASE_CODE["forward"], PHASE_CODE["backward"])
    phases[first_upd:] = PHASE_CODE["update"]
    colocation = np.arange(num_ops, dtype=np.int64)
    colocation[first_upd:] = np.arange(n_in, first_comp)  # an update stays with its Variable
    scopes = np.empty(num_ops, dtype=object)
    scopes[:first_comp] = "params"
    scopes[comp] = np.array([f"layer{i}" for i in range(len(widths))], dtype=object)[layer]
    scopes[first_upd:] = "optimizer"
    return OpGraph(
        name=f"synthetic:{num_ops}:{seed}", framework="synthetic",
        op_names=np.array([f"op{i}" for i in range(num_ops)], dtype=object), op_kinds=op_kinds,
        flops=flops, bytes_accessed=bytes_accessed, out_bytes=out_bytes, param_bytes=param_bytes,
        edge_src=src, edge_dst=dst, edge_bytes=out_bytes[src], colocation=colocation, scopes=scopes,
        phases=phases, batch_size=0, num_params=int(weight_bytes.sum() // 4),
        source=f"graphs.synthetic.synthetic_graph({num_ops}, seed={seed})")


def _layer_widths(rng: np.random.Generator, n_comp: int) -> np.ndarray:
    """(L,) int64 widths summing to n_comp, each in 1..2*mean-1 with mean about n_comp**0.4."""
    if n_comp == 0:
        return np.zeros(0, dtype=np.int64)
    mean = max(1, int(round(n_comp ** 0.4)))
    widths = rng.integers(1, 2 * mean, size=n_comp // mean + 2)
    while widths.sum() < n_comp:
        widths = np.concatenate([widths, rng.integers(1, 2 * mean, size=n_comp // mean + 2)])
    widths = widths[: np.searchsorted(np.cumsum(widths), n_comp) + 1]
    widths[-1] -= widths.sum() - n_comp
    return widths.astype(np.int64)


def _edges(rng, n_in, n_var, first_comp, first_upd, layer, layer_start, dense):
    """(E,) src and dst arrays (duplicates allowed: OpGraph merges them)."""
    n_comp = len(layer)
    ops = np.arange(first_comp, first_upd)
    srcs, dsts = [], []
    first_layer = layer == 0
    srcs.append(rng.integers(0, n_in, size=int(first_layer.sum())))  # layer 0 reads the batch
    dsts.append(ops[first_layer])
    for lookback, share in ((1, 1.0), (None, 0.5)):  # one input from the layer before, sometimes a skip
        rest = ~first_layer & (rng.random(n_comp) < share)
        back = 1 if lookback else rng.integers(1, 5, size=n_comp)
        source_layer = np.maximum(layer - back, 0)[rest]
        lo, hi = layer_start[source_layer], layer_start[source_layer + 1]
        srcs.append(first_comp + lo + (rng.random(len(lo)) * (hi - lo)).astype(np.int64))
        dsts.append(ops[rest])
    if n_var:
        srcs.append(rng.integers(n_in, first_comp, size=int(dense.sum())))  # dense ops read a weight
        dsts.append(ops[dense])
        updates = np.arange(first_upd, first_upd + n_var)
        late = n_comp // 2 + (rng.random(n_var) * (n_comp - n_comp // 2)).astype(np.int64)
        srcs += [np.arange(n_in, first_comp), first_comp + late]  # the Variable and its "gradient"
        dsts += [updates, updates]
    return np.concatenate(srcs).astype(np.int64), np.concatenate(dsts).astype(np.int64)


def _lognormal_bytes(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    values = np.clip(rng.lognormal(np.log(median), sigma, size), 256, 512e6)
    return (values // 4 * 4).astype(np.int64)
