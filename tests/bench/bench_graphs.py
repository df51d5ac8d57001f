"""Every registered benchmark graph built from scratch: `python tests/bench/bench_graphs.py [NAME ...]`.

The disk cache is bypassed, so the trace time is the real cost of building the graph (fake-tensor tracing for
PyTorch models, GraphDef import for Keras ones). Prints a markdown table: name, framework, ops, edges,
colocation groups, training-step FLOPs, parameters, trace seconds.
"""

from __future__ import annotations

import argparse
import time

from graphs.registry import benchmark_graph, list_benchmarks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to build (default: every registered one)")
    args = parser.parse_args()
    names = args.names or [b.name for b in list_benchmarks()]
    print("| benchmark | framework | ops | edges | groups | step FLOPs | params | trace (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        started = time.perf_counter()
        graph = benchmark_graph(name, use_cache=False)
        trace_s = time.perf_counter() - started
        print(f"| {name} | {graph.framework} | {graph.num_ops:,} | {graph.num_edges:,} | "
              f"{graph.num_colocation_groups:,} | {graph.total_flops / 1e12:.3f} T | {graph.num_params / 1e6:.2f} M "
              f"| {trace_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
