"""Convergence: best step time against measurements used, learners and black-box searches, same budget and seeds.

Every method searches the same problem (graph grouped into ``--groups`` groups, on ``--machine``) with the
same in-process, noise-free simulator, the same budget and the same seeds, all through
``policies.registry.place`` (the hierarchical planner groups the graph itself, from the colocation groups).
Learned policies get ``batch_size``, ``hidden_size`` and one torch thread. A method named ``NAME+ws`` is
policy NAME (a learner, or annealing) warm-started from the quick heuristics' placements (`placer search
--warm-start`'s list, cluster.jobs.config.WARM_START_BASELINES; best first, failures dropped), which it
measures inside its own budget.

Prints two markdown tables: the best step time after a few fractions of the budget (mean over seeds), each
seed's final best, the mean final best as a multiple of the lower bound, and the measurements each method
needed to get within 5% of its own final best, with the learners' seconds per update next to the time of
one batched measure call; and the one-measurement heuristics with the lower bound for reference. Usage::

    python tests/bench/bench_convergence.py [--graph nmt-2] [--machine paper-2gpu] [--budget 2048]
        [--seeds 0 1 2] [--methods reinforce ppo hierarchical post reinforce+ws cem annealing random]
        [--batch 16] [--hidden 256] [--groups 32] [--grouping scope]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass, field

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import numpy as np  # noqa: E402

WS_SUFFIX = "+ws"
REFERENCE_HEURISTICS = ("single-gpu", "expert", "metis", "m-etf")
FRACTIONS = (0.1, 0.25, 0.5, 1.0)


@dataclass
class Curve:
    best_s: np.ndarray  # (budget,) float64: best ok runtime after each measurement, inf before the first
    wall_s: float
    seconds_per_update: float = math.nan  # learners: sampling + update per iteration, measuring excluded
    seconds_per_measure_call: float = math.nan  # one batched measure call, mean


@dataclass
class TimedMeasurer:
    """Passes measure calls through, timing each: how long the learner waits for a batch."""
    inner: object
    calls_s: list[float] = field(default_factory=list)

    def measure(self, placements):
        started = time.perf_counter()
        out = self.inner.measure(placements)
        self.calls_s.append(time.perf_counter() - started)
        return out


def best_curve(runtimes: list[float], budget: int) -> np.ndarray:
    """(budget,) running minimum of the runtimes (inf for failures and measurements not made)."""
    values = np.full(budget, np.inf)
    values[:min(len(runtimes), budget)] = runtimes[:budget]
    return np.minimum.accumulate(values)


def split_method(method: str) -> tuple[str, bool]:
    """(registry name, warm-started?) of a method name such as ``reinforce+ws``."""
    if method.endswith(WS_SUFFIX):
        return method[:-len(WS_SUFFIX)], True
    return method, False


def heuristic_result(problem, measurer, name: str):
    """The heuristic's PolicyResult (one measurement), or None when it cannot place this graph."""
    from graphs.errors import PlacerError
    from policies.registry import place

    try:
        return place(name, problem, measurer, 1, 0)
    except PlacerError:
        return None


def warm_start_placements(problem, measurer) -> list[np.ndarray]:
    """The quick heuristics' op placements that ran, fastest first: (N,) int64 each."""
    scored = []
    from cluster.jobs.config import WARM_START_BASELINES  # what `placer search --warm-start` scores

    for name in WARM_START_BASELINES:
        result = heuristic_result(problem, measurer, name)
        if result is not None and result.best is not None and result.best.ok:
            scored.append((result.best.runtime_s, name, np.asarray(result.op_placement, dtype=np.int64)))
    return [placement for _, _, placement in sorted(scored, key=lambda s: (s[0], s[1]))]


def run_method(problem, measurer, method: str, budget: int, seed: int, batch: int = 16, hidden: int = 256,
               warm_start: list[np.ndarray] | None = None, planner_groups: int | None = None) -> Curve:
    """One run of ``method`` (a registry name, ``+ws`` for a warm-started learner) through ``place``;
    ``planner_groups``: the hierarchical planner's G (None: its own 256)."""
    from graphs.errors import PlacerError
    from policies.registry import place, policy_entry
    from policies.rl.gnn.config import GRAPH_NEURAL

    name, warm = split_method(method)
    entry = policy_entry(name)
    if warm and not entry.takes_warm_start:
        raise PlacerError(f"{method!r}: {name!r} takes no warm start")
    options = {}
    if entry.learned:  # the graph-neural placers keep their own sizes, as `placer search` gives them
        own_sizes = name in GRAPH_NEURAL
        options = {"torch_threads": 1} if own_sizes else {"batch_size": batch, "hidden_size": hidden,
                                                          "torch_threads": 1}
    if name == "hierarchical" and planner_groups is not None:
        options["num_groups"] = planner_groups
    if warm:
        options["warm_start"] = warm_start if warm_start is not None else warm_start_placements(problem, measurer)
    runtimes: list[float] = []
    timed = TimedMeasurer(measurer)
    started = time.perf_counter()
    result = place(name, problem, timed, budget, seed,
                   on_measurement=lambda _p, m: runtimes.append(m.runtime_s if m.ok else math.inf), **options)
    per_call = float(np.mean(timed.calls_s)) if entry.learned and timed.calls_s else math.nan
    return Curve(best_curve(runtimes, budget), time.perf_counter() - started, result.seconds_per_update, per_call)


def within_5pct(curve: np.ndarray) -> int:
    """Measurements needed to get within 5% of the curve's final best."""
    final = curve[-1]
    if not math.isfinite(final):
        return -1
    return int(np.flatnonzero(curve <= final * 1.05)[0]) + 1


def fmt(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="nmt-2")
    parser.add_argument("--machine", default="paper-2gpu")
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="e.g. 0 1 2")
    parser.add_argument("--methods", nargs="+",
                        default=["reinforce", "ppo", "hierarchical", "post", "reinforce+ws", "cem", "annealing",
                                 "random"])
    parser.add_argument("--batch", type=int, default=16, help="learners' placements per iteration")
    parser.add_argument("--hidden", type=int, default=256, help="learners' hidden size")
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--grouping", default="scope", help="grouping method (the search's default: scope)")
    args = parser.parse_args()

    import torch

    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem

    torch.set_num_threads(1)
    graph, machine = load_graph(args.graph), load_machine(args.machine)
    problem = make_problem(graph, machine, max_groups=args.groups, grouping_method=args.grouping)
    measurer = SimulatorMeasurer(graph, machine)
    lower_s = problem.lower_bound_s
    warm = warm_start_placements(problem, measurer) if any(m.endswith(WS_SUFFIX) for m in args.methods) else None
    print(f"{args.graph} on {args.machine}: {graph.num_ops} ops, {problem.num_units} {args.grouping} groups, budget "
          f"{args.budget}, seeds {args.seeds}, lower bound {lower_s:.4f} s; {os.cpu_count()} CPUs\n")
    marks = [max(1, int(round(f * args.budget))) for f in FRACTIONS]
    print("| method | " + " | ".join(f"best after {m}" for m in marks)
          + " | final best per seed | x lower bound | measurements to within 5% of final | wall s"
            " | learner s / update | measure s / batch |")
    print("|---" * (len(marks) + 7) + "|", flush=True)
    for method in args.methods:
        curves = [run_method(problem, measurer, method, args.budget, seed, args.batch, args.hidden, warm)
                  for seed in args.seeds]
        mean_curve = np.mean([c.best_s for c in curves], axis=0)  # (budget,)
        cells = " | ".join(f"{mean_curve[m - 1]:.4f}" for m in marks)
        needed = np.mean([within_5pct(c.best_s) for c in curves])
        per_seed = " / ".join(f"{c.best_s[-1]:.4f}" for c in curves)
        print(f"| {method} | {cells} | {per_seed} | {mean_curve[-1] / lower_s:.2f} | {needed:.0f} "
              f"| {np.mean([c.wall_s for c in curves]):.0f} | {fmt(np.mean([c.seconds_per_update for c in curves]))} "
              f"| {fmt(np.mean([c.seconds_per_measure_call for c in curves]))} |", flush=True)
    print("\n| reference | step time (s) | x lower bound |\n|---|---|---|")
    for name in REFERENCE_HEURISTICS:
        result = heuristic_result(problem, measurer, name)
        runtime_s = result.best.runtime_s if result is not None and result.best is not None and result.best.ok \
            else math.nan
        print(f"| {name} | {fmt(runtime_s, 4)} | {fmt(runtime_s / lower_s, 2)} |")
    print(f"| lower bound | {lower_s:.4f} | 1.00 |")


if __name__ == "__main__":
    main()
