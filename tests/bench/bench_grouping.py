"""Grouping speed and quality: `python tests/bench/bench_grouping.py [--sizes 10000 100000 1000000]
[--graphs rnnlm nmt-2 ...] [--deep 32000 ...] [--groups 256]`.

For each graph and method: wall time, groups, the fraction of tensor bytes that cross groups (lower keeps
heavy edges inside groups) and the heaviest group's nominal cost over the mean (1.0 = perfectly balanced,
what a placement needs to spread work). Synthetic graphs come from ``graphs.synthetic`` when it exists,
else from a seeded layered DAG made here (with forward/backward colocation pairs). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from graphs.grouping import METHODS, group_ops, op_cost_s
from graphs.opgraph import OpGraph


def layered_dag(n: int, seed: int = 0, width: int = 50) -> OpGraph:
    """Layers of ``width`` ops, each reading two ops of the previous 1-3 layers; op i of the first half is
    colocated with op n-1-i (a forward op with its backward op); lognormal flops and tensor sizes."""
    rng = np.random.default_rng(seed)
    dst = np.repeat(np.arange(width, n), 2)
    src = dst - rng.integers(1, 4, len(dst)) * width + rng.integers(-width // 2, width // 2, len(dst))
    src = np.clip(src, 0, dst - 1)
    out_bytes = rng.lognormal(12, 1.5, n).astype(np.int64)
    colocation = np.arange(n)
    colocation[n - 1 - np.arange(n // 2)] = np.arange(n // 2)
    return OpGraph(name=f"layered:{n}", framework="synthetic",
                   op_names=np.array([f"op{i}" for i in range(n)], dtype=object),
                   op_kinds=np.full(n, "aten.mm", dtype=object), flops=rng.lognormal(16, 2, n),
                   bytes_accessed=out_bytes * 3.0, out_bytes=out_bytes, param_bytes=np.zeros(n, np.int64),
                   edge_src=src, edge_dst=dst, edge_bytes=out_bytes[src], colocation=colocation)


def deep_scoped(n: int) -> OpGraph:
    """``layered_dag`` two ops wide (n/2 layers deep) with scopes on its last 3 ops only: every other atom
    inherits one, which took one pass over all edges per layer before (quadratic)."""
    graph = layered_dag(n, width=2)
    scopes = np.full(n, "", dtype=object)
    scopes[-3:] = ["head/a", "head/b", "head/c"]
    return dataclasses.replace(graph, name=f"deep:{n}", scopes=scopes)


def synthetic(n: int) -> OpGraph:
    try:
        from graphs.synthetic import synthetic_from_spec
    except ImportError:
        return layered_dag(n)
    return synthetic_from_spec(f"synthetic:{n}")


def quality(graph: OpGraph, op_group: np.ndarray) -> tuple[float, float]:
    crossing = op_group[graph.edge_src] != op_group[graph.edge_dst]
    cut = graph.edge_bytes[crossing].sum() / max(graph.edge_bytes.sum(), 1)
    cost = np.bincount(op_group, weights=op_cost_s(graph))
    return float(cut), float(cost.max() / cost.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--graphs", nargs="*", default=[], help="benchmark names or graph files")
    parser.add_argument("--deep", type=int, nargs="*", default=[], help="sizes of deep graphs with 3 scoped ops")
    parser.add_argument("--groups", type=int, default=256)
    args = parser.parse_args()
    group_ops(layered_dag(2000), 16, "colocation")  # compile the numba kernels outside the timings
    group_ops(deep_scoped(200), 16, "scope")
    graphs = [(f"synthetic:{n}", lambda n=n: synthetic(n)) for n in args.sizes]
    graphs += [(f"deep:{n}", lambda n=n: deep_scoped(n)) for n in args.deep]
    if args.graphs:
        from graphs.registry import load_graph

        graphs += [(name, lambda name=name: load_graph(name)) for name in args.graphs]
    print("| graph | ops | colocation groups | method | time (s) | groups | cut bytes | max/mean cost |")
    print("|---|---|---|---|---|---|---|---|")
    for label, build in graphs:
        graph = build()
        for method in METHODS:
            start = time.perf_counter()
            grouping = group_ops(graph, args.groups, method)
            elapsed = time.perf_counter() - start
            cut, imbalance = quality(graph, grouping.op_group)
            print(f"| {label} | {graph.num_ops:,} | {len(np.unique(graph.colocation)):,} | {method} | {elapsed:.2f} "
                  f"| {grouping.num_groups} | {cut:.3f} | {imbalance:.2f} |", flush=True)


if __name__ == "__main__":
    main()
