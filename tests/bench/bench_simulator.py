"""Simulator speed: fast vs reference, ops/s, growth to 1M ops, compile time, batch amortization, timeline cost.

Run: python tests/bench/bench_simulator.py [--quick]   (prints markdown tables)
     python tests/bench/bench_simulator.py --part timeline [--timeline-graphs nmt-8 inception-v3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from graphs.grouping import group_ops
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.sim.fast import warm_up
from measurers.sim.measurer import SimulatorMeasurer
from policies.registry import place_once
from measurers.sim.reference import Simulator, simulate


def best_of(repeats: int, func) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        func()
        times.append(time.perf_counter() - began)
    return min(times)


def compile_time_s() -> float:
    """warm_up() in a fresh process with an empty numba cache: the cost of compiling from scratch."""
    with tempfile.TemporaryDirectory() as cache:
        code = "from measurers.sim.fast import warm_up; print(warm_up())"
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NUMBA_CACHE_DIR": cache},
                             capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])


def side_by_side(machine, num_ops: int) -> None:
    graph = synthetic_graph(num_ops, 0)
    placement = _placement(graph, machine, "round-robin")
    reference, fast = Simulator(graph, machine, engine="reference"), Simulator(graph, machine, engine="fast")
    ref_s = best_of(1, lambda: reference.run(placement))
    fast_s = best_of(5, lambda: fast.run(placement))
    assert reference.run(placement).runtime_s == fast.run(placement).runtime_s
    print(f"\n## Fast vs reference, synthetic:{num_ops} on {machine.name}, round-robin (run only, set-up excluded)\n")
    print("| engine | run s | ops/s |\n|---|---:|---:|")
    print(f"| reference | {ref_s:.3f} | {num_ops / ref_s:,.0f} |")
    print(f"| fast | {fast_s:.4f} | {num_ops / fast_s:,.0f} |")
    print(f"\nspeed-up: {ref_s / fast_s:.0f}x")


def growth(machine, sizes) -> None:
    print(f"\n## Growth on {machine.name} (fast engine; run = best of 9 up to 100k ops, else 3; one placement)\n")
    print("| ops | edges | build s | set-up s | policy | run s | ops/s | transfers |\n|---:|---:|---:|---:|---|---:|---:|---:|")
    for num_ops in sizes:
        began = time.perf_counter()
        graph = synthetic_graph(num_ops, 0)
        build_s = time.perf_counter() - began
        began = time.perf_counter()
        simulator = Simulator(graph, machine)
        setup_s = time.perf_counter() - began
        for policy in ("single-gpu", "round-robin"):
            placement = _placement(graph, machine, policy)
            run_s = best_of(9 if num_ops <= 100_000 else 3, lambda: simulator.run(placement))  # noisy shared cores
            transfers = len(simulator.run(placement, timeline=True).timeline.transfer_op)
            print(f"| {num_ops:,} | {graph.num_edges:,} | {build_s:.2f} | {setup_s:.2f} | {policy} | {run_s:.4f} | "
                  f"{num_ops / run_s:,.0f} | {transfers:,} |")


def batch(machine, graph_name: str) -> None:
    from graphs.registry import load_graph

    graph = load_graph(graph_name)
    rng = np.random.default_rng(0)
    placements = rng.integers(1, machine.num_devices, size=(64, graph.num_ops))
    singles_s = best_of(1, lambda: [simulate(graph, machine, p) for p in placements])
    batch_s = best_of(1, lambda: Simulator(graph, machine).run_batch(placements))
    print(f"\n## Batch of 64 placements, {graph.name} ({graph.num_ops:,} ops) on {machine.name}\n")
    print("| how | total s | per placement ms |\n|---|---:|---:|")
    print(f"| 64 x simulate() | {singles_s:.3f} | {singles_s / 64 * 1e3:.2f} |")
    print(f"| Simulator(...).run_batch(64) | {batch_s:.3f} | {batch_s / 64 * 1e3:.2f} |")


def timeline_cost(machine, graph_names, rounds: int = 8, runs: int = 10) -> None:
    """Runs with and without a timeline, in blocks of ``runs`` of each, alternating, ``rounds`` blocks: each
    kind of run sees the same load and the allocator state the other leaves behind. Page faults are counted
    because freed memory glibc hands back to the system is faulted in again by the next run."""
    from graphs.registry import load_graph

    print(f"\n## Timeline cost on {machine.name} (fast engine; 32 scope groups on random GPUs, seed 0; "
          f"best of {rounds * runs} runs)\n")
    print("| graph | ops | transfers | run ms | run with timeline ms | ratio | page faults per timeline run |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in graph_names:
        graph = load_graph(name)
        op_group = group_ops(graph, 32).op_group
        placement = np.random.default_rng(0).integers(1, machine.num_devices, size=op_group.max() + 1)[op_group]
        simulator = Simulator(graph, machine)
        plain_s, timeline_s, faults = [], [], []
        for _ in range(rounds):
            plain_s += [best_of(1, lambda: simulator.run(placement)) for _ in range(runs)]
            for _ in range(runs):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                timeline_s.append(best_of(1, lambda: simulator.run(placement, timeline=True)))
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        transfers = len(simulator.run(placement, timeline=True).timeline.transfer_op)
        best_plain_s, best_timeline_s = min(plain_s), min(timeline_s)
        print(f"| {name} | {graph.num_ops:,} | {transfers:,} | {best_plain_s * 1e3:.2f} | "
              f"{best_timeline_s * 1e3:.2f} | {best_timeline_s / best_plain_s:.2f} | {int(np.median(faults))} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller graphs (10k-50k ops instead of up to 1M)")
    parser.add_argument("--batch-graph", default="synthetic:20000", metavar="NAME",
                        help="graph of the batch-amortization table (default synthetic:20000)")
    parser.add_argument("--part", choices=("all", "timeline"), default="all",
                        help="every table (default), or only the timeline's cost")
    parser.add_argument("--timeline-graphs", nargs="+", default=["nmt-8", "inception-v3"], metavar="NAME",
                        help="graphs of the timeline-cost table (default nmt-8 inception-v3)")
    args = parser.parse_args()
    quick = args.quick
    paper4 = load_machine("paper-4gpu")
    if args.part == "timeline":
        warm_up()
        timeline_cost(paper4, args.timeline_graphs)
        return
    print(f"# Simulator benchmark ({'quick' if quick else 'full'})\n")
    print(f"compile from scratch: {compile_time_s():.1f} s; load from cache (this process): {warm_up():.2f} s")
    side_by_side(paper4, 10_000 if quick else 100_000)
    growth(paper4, [10_000, 50_000] if quick else [10_000, 50_000, 100_000, 1_000_000])
    growth(load_machine("h200x8"), [50_000] if quick else [50_000, 1_000_000])
    batch(paper4, args.batch_graph)
    timeline_cost(paper4, args.timeline_graphs)


def _placement(graph, machine, policy: str):
    return place_once(policy, graph, machine, SimulatorMeasurer(graph, machine)).op_placement


if __name__ == "__main__":
    main()
