"""Every baseline on every paper benchmark, on paper-2gpu and paper-4gpu, scored by the simulator.

    python tests/bench/bench_baselines.py [--graphs rnnlm,nmt-2] [--machines paper-2gpu] [--budget 300]

Prints one markdown table per (graph, machine): step time, status, ratio to the lower bound and to the
best single GPU, placement time (deciding only) and measurements. Graphs that cannot be built here (a
missing framework) are reported and skipped.
"""

from __future__ import annotations

import argparse
import math
import time

PAPER_GRAPHS = ("rnnlm", "nmt-2", "nmt-4", "nmt-8", "inception-v3", "resnet-50", "transformer")
MACHINES = ("paper-2gpu", "paper-4gpu")


def fmt(x: float, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def bench(graph_name: str, machine_name: str, policies, budget: int, groups: int, grouping: str, seed: int) -> None:
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.table import run_baselines

    graph, machine = load_graph(graph_name), load_machine(machine_name)
    start = time.perf_counter()
    problem = make_problem(graph, machine, max_groups=groups, grouping_method=grouping, seed=seed)
    setup_s = time.perf_counter() - start
    table = run_baselines(problem, SimulatorMeasurer(graph, machine, seed=seed), policies, budget, seed)
    print(f"\n### {graph_name} ({graph.num_ops} ops, {problem.num_units} groups) on {machine_name}: "
          f"lower bound {table.lower_bound_s:.4g} s, single GPU {fmt(table.single_gpu_s, '.4g')} s "
          f"(problem set-up {setup_s:.1f} s)\n")
    print("| policy | step time (s) | status | x lower bound | x single GPU | placement time (s) | measurements |")
    print("|---|---|---|---|---|---|---|")
    for row in table.rows:
        print(f"| {row.policy} | {fmt(row.runtime_s, '.4g')} | {row.status} | {fmt(row.ratio_to_lower_bound, '.2f')} "
              f"| {fmt(row.ratio_to_single_gpu, '.2f')} | {row.placement_time_s:.3g} | {row.measurements} |")
    for row in table.rows:
        if row.status != "ok":
            print(f"- {row.policy}: {row.notes}")


def main() -> None:
    from policies.registry import baseline_names

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default=",".join(PAPER_GRAPHS))
    parser.add_argument("--machines", default=",".join(MACHINES))
    parser.add_argument("--policies", default=",".join(baseline_names()))
    parser.add_argument("--budget", type=int, default=300, help="measurements per search")
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--grouping", default="metis", help="metis: as the table in BENCHMARKS.md was measured")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"budget {args.budget} measurements per search, {args.groups} {args.grouping} groups, seed {args.seed}")
    for graph_name in args.graphs.split(","):
        for machine_name in args.machines.split(","):
            try:
                bench(graph_name, machine_name, args.policies.split(","), args.budget, args.groups,
                      args.grouping, args.seed)
            except Exception as exc:  # a benchmark that cannot be built here is reported, not fatal
                print(f"\n### {graph_name} on {machine_name}: not run ({type(exc).__name__}: {exc})")


if __name__ == "__main__":
    main()
