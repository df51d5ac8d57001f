"""HSDAG against the heuristics, a search and the other learners, in one process, on the simulator.

The structure-aware paper's setting is inference graphs on a CPU plus an integrated GPU: the default is the
machine ``cpu-igpu`` with ``inception-v3-infer``, ``resnet-50-infer`` and ``bert-base-infer`` when the
catalogs have them, else ``paper-2gpu`` with ``inception-v3``, ``resnet-50`` and ``transformer``
(training graphs; the header says which). Every policy runs through ``policies.registry.place`` as
``placer search`` / ``placer baselines`` run it (heuristics and hsdag, which groups the graph itself
(registry ``groups_itself``), on colocation groups, the rest on the ``--groups`` coarse groups: 32 ``scope``
groups by default; ``--groups 1024`` puts annealing and the other learners at op level too, the fair
comparison for hsdag); heuristics once, the others once per seed, learners on one torch thread. Prints a
markdown table of step times (mean over seeds, and the range) with ratios against cpu-only and against
the best non-learned method (heuristics and annealing). Usage::

    python tests/bench/bench_hsdag.py [--machine M] [--graphs G ...] [--budget 500] [--seeds 0 1 2] [--groups 32]
        [--policies cpu-only single-gpu heft m-etf annealing reinforce placeto hsdag]
        [--hsdag KEY=VALUE ...]       (HsdagPolicy options, e.g. init=pretrained; repeatable)
        [--warm-start HEURISTIC]      (learners and annealing start from its placement, e.g. heft)
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

PAPER_SETTING = ("cpu-igpu", ("inception-v3-infer", "resnet-50-infer", "bert-base-infer"))
FALLBACK = ("paper-2gpu", ("inception-v3", "resnet-50", "transformer"))
POLICIES = ("cpu-only", "single-gpu", "heft", "m-etf", "annealing", "reinforce", "placeto", "hsdag")
LEARNED_OPTIONS = {"torch_threads": 1}


def default_setting() -> tuple[str, tuple[str, ...]]:
    """The paper's setting when its machine and graphs are registered, else the fallback."""
    from graphs.errors import PlacerError
    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    machine, graphs = PAPER_SETTING
    try:
        load_machine(machine)
        for name in graphs:
            load_graph(name)
    except (PlacerError, KeyError, FileNotFoundError):
        return FALLBACK
    return PAPER_SETTING


def run_policy(name: str, problem, measurer, budget: int, seed: int, hsdag_options: dict,
               warm_start=None) -> tuple[float, float, str]:
    """(step time in s, inf when it failed; wall seconds; notes) of one run; ``warm_start``: an (N,) op
    placement the policies that take one start from."""
    from policies.registry import place, policy_entry

    entry = policy_entry(name)
    options = dict(LEARNED_OPTIONS) if entry.learned else {}
    if name == "hsdag":
        options.update(hsdag_options)
    if warm_start is not None and entry.takes_warm_start:
        options["warm_start"] = [warm_start]
    started = time.perf_counter()
    result = place(name, problem, measurer, budget if entry.kind != "heuristic" else 1, seed, **options)
    wall_s = time.perf_counter() - started
    runtime_s = result.best.runtime_s if result.best is not None and result.best.ok else math.inf
    return runtime_s, wall_s, result.notes


def parse_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                continue
        options[key] = value
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default=None)
    parser.add_argument("--graphs", nargs="+", default=None)
    parser.add_argument("--budget", type=int, default=500)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--groups", type=int, default=None, help="units of the searches and learners "
                        "(default: the search's, graphs.grouping.DEFAULT_MAX_GROUPS)")
    parser.add_argument("--hsdag", nargs="*", default=[], help="HsdagPolicy options KEY=VALUE")
    parser.add_argument("--warm-start", default=None, metavar="HEURISTIC",
                        help="policies that take a warm start (learners, annealing) start from this heuristic's "
                             "placement, as `placer search --warm-start HEURISTIC` does")
    args = parser.parse_args()

    import torch

    from graphs.grouping import DEFAULT_MAX_GROUPS, DEFAULT_METHOD
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import policy_entry

    torch.set_num_threads(1)
    machine_name, graph_names = default_setting()
    machine_name, graph_names = args.machine or machine_name, args.graphs or graph_names
    hsdag_options = parse_options(args.hsdag)
    groups = args.groups or DEFAULT_MAX_GROUPS
    machine = load_machine(machine_name)
    print(f"machine {machine_name}, graphs {' '.join(graph_names)}, budget {args.budget}, seeds "
          f"{' '.join(map(str, args.seeds))}, groups {groups} {DEFAULT_METHOD}, simulator; "
          f"hsdag options {hsdag_options or 'default'}, warm start {args.warm_start or 'none'}\n", flush=True)
    table: dict[str, dict[str, list[float]]] = {p: {} for p in args.policies}
    walls: dict[str, list[float]] = {p: [] for p in args.policies}
    for graph_name in graph_names:
        graph = load_graph(graph_name)
        problem = make_problem(graph, machine, max_groups=groups, grouping_method=DEFAULT_METHOD)
        measurer = SimulatorMeasurer(graph, machine)
        warm = None
        if args.warm_start:
            from policies.registry import place

            warm = place(args.warm_start, problem, measurer, 1, 0).op_placement
        for name in args.policies:
            seeds = args.seeds[:1] if policy_entry(name).kind == "heuristic" else args.seeds
            for seed in seeds:
                runtime_s, wall_s, notes = run_policy(name, problem, measurer, args.budget, seed, hsdag_options,
                                                      warm)
                table[name].setdefault(graph_name, []).append(runtime_s)
                walls[name].append(wall_s)
                print(f"  {graph_name} {name} seed {seed}: {runtime_s * 1e3:.2f} ms in {wall_s:.1f} s"
                      + (f" ({notes})" if name == "hsdag" else ""), flush=True)
    print_table(table, walls, graph_names, args.policies)


def print_table(table, walls, graph_names, policies) -> None:
    from policies.registry import policy_entry

    mean = {p: {g: float(np.mean(v)) for g, v in runs.items()} for p, runs in table.items()}
    non_learned = [p for p in policies if not policy_entry(p).learned]
    print("\nstep time in ms: mean over seeds [min, max]; x cpu = cpu-only / it (speed-up); "
          "x best = it / best non-learned mean (below 1: it wins)\n")
    print("| policy | " + " | ".join(f"{g} ms | x cpu | x best" for g in graph_names) + " | wall s/run |")
    print("|---" * (1 + 3 * len(graph_names) + 1) + "|")
    for p in policies:
        cells = []
        for g in graph_names:
            runs = table[p][g]
            best = min((mean[q][g] for q in non_learned), default=math.nan)
            spread = f" [{min(runs) * 1e3:.1f}, {max(runs) * 1e3:.1f}]" if len(runs) > 1 else ""
            cpu = mean.get("cpu-only", {}).get(g, math.nan)
            cells += [f"{mean[p][g] * 1e3:.2f}{spread}", f"{cpu / mean[p][g]:.2f}", f"{mean[p][g] / best:.3f}"]
        print(f"| {p} | " + " | ".join(cells) + f" | {np.mean(walls[p]):.1f} |")


if __name__ == "__main__":
    main()
