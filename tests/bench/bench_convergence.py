"""Convergence: best step time against measurements used, learners and black-box searches, same budget and seeds.

Every method searches the same problem (graph grouped into ``--groups`` groups, on ``--machine``) with the
same in-process, noise-free simulator, the same budget and the same seeds. ``reinforce`` and ``ppo`` run
through ``policies.rl.loop.train_placer``; ``cem``, ``annealing`` and ``random`` through
``policies.registry.place``. Prints two markdown tables: the best step time after a few fractions of the
budget (mean over seeds), each seed's final best, and the measurements each method needed to get within 5%
of its own final best; and the one-measurement heuristics (single GPU, expert, metis, m-etf) with the lower
bound for reference, plus the learners' seconds per update next to the time of the batched measure call
they drive. Usage::

    python tests/bench/bench_convergence.py [--graph nmt-2] [--machine paper-2gpu] [--budget 2048]
        [--seeds 0] [--methods reinforce ppo cem annealing random] [--batch 16] [--groups 32]
        [--grouping scope]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import numpy as np  # noqa: E402

LEARNERS = ("reinforce", "ppo")
HEURISTICS = ("single-gpu", "expert", "metis", "m-etf")
FRACTIONS = (0.1, 0.25, 0.5, 1.0)


@dataclass
class Curve:
    best_s: np.ndarray  # (budget,) float64: best ok runtime after each measurement, inf before the first
    wall_s: float
    seconds_per_update: float = math.nan  # learners: sampling + update per iteration
    seconds_per_measure_call: float = math.nan  # learners: one batched measure call


def best_curve(runtimes: list[float], budget: int) -> np.ndarray:
    """(budget,) running minimum of the runtimes (inf for failures), padded with the last value."""
    values = np.full(budget, np.inf)
    values[:len(runtimes)] = runtimes[:budget]
    if len(runtimes) < budget and runtimes:
        values[len(runtimes):] = np.inf
    curve = np.minimum.accumulate(values)
    return curve


def run_learner(problem, measurer, trainer: str, budget: int, seed: int, batch: int) -> Curve:
    from policies.rl.config import RLConfig
    from policies.rl.loop import train_placer

    runtimes: list[float] = []

    def on_batch(_iteration, _groups, _ops, measurements, _rewards):
        runtimes.extend(m.runtime_s if m.ok else math.inf for m in measurements)

    started = time.perf_counter()
    result = train_placer(problem.graph, problem.machine, problem.grouping, measurer, budget_measurements=budget,
                          config=RLConfig(trainer=trainer, seed=seed, batch_size=batch), on_batch=on_batch)
    return Curve(best_curve(runtimes, budget), time.perf_counter() - started, result.seconds_per_update,
                 result.seconds_per_measure_call)


def run_search(problem, measurer, name: str, budget: int, seed: int) -> Curve:
    from policies.registry import place

    runtimes: list[float] = []
    started = time.perf_counter()
    place(name, problem, measurer, budget, seed,
          on_measurement=lambda _p, m: runtimes.append(m.runtime_s if m.ok else math.inf))
    return Curve(best_curve(runtimes, budget), time.perf_counter() - started)


def heuristic_runtime_s(problem, measurer, name: str) -> float:
    from graphs.errors import PlacerError
    from policies.registry import place

    try:
        best = place(name, problem, measurer, 1, 0).best
    except PlacerError:
        return math.nan
    return best.runtime_s if best.ok else math.nan


def within_5pct(curve: np.ndarray) -> int:
    """Measurements needed to get within 5% of the curve's final best."""
    final = curve[-1]
    if not math.isfinite(final):
        return -1
    return int(np.flatnonzero(curve <= final * 1.05)[0]) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="nmt-2")
    parser.add_argument("--machine", default="paper-2gpu")
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=[*LEARNERS, "cem", "annealing", "random"])
    parser.add_argument("--batch", type=int, default=16, help="learners' placements per iteration")
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--grouping", default="scope", help="grouping method (the search's default: scope)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()

    import torch

    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem

    torch.set_num_threads(args.threads)
    graph, machine = load_graph(args.graph), load_machine(args.machine)
    problem = make_problem(graph, machine, max_groups=args.groups, grouping_method=args.grouping)
    measurer = SimulatorMeasurer(graph, machine)
    print(f"{args.graph} on {args.machine}: {graph.num_ops} ops, {problem.num_units} {args.grouping} groups, budget "
          f"{args.budget}, seeds {args.seeds}, lower bound {problem.lower_bound_s:.4f} s; {os.cpu_count()} CPUs\n")
    marks = [max(1, int(round(f * args.budget))) for f in FRACTIONS]
    print("| method | " + " | ".join(f"best after {m}" for m in marks)
          + " | final best per seed | measurements to within 5% of final | wall s | learner s / update"
            " | measure s / batch |")
    print("|---" * (len(marks) + 6) + "|", flush=True)
    for method in args.methods:
        curves = [run_learner(problem, measurer, method, args.budget, seed, args.batch) if method in LEARNERS
                  else run_search(problem, measurer, method, args.budget, seed) for seed in args.seeds]
        mean_curve = np.mean([c.best_s for c in curves], axis=0)  # (budget,)
        cells = " | ".join(f"{mean_curve[m - 1]:.4f}" for m in marks)
        needed = np.mean([within_5pct(c.best_s) for c in curves])
        wall = np.mean([c.wall_s for c in curves])
        upd = np.mean([c.seconds_per_update for c in curves])
        meas = np.mean([c.seconds_per_measure_call for c in curves])
        fmt = (lambda v: "-" if math.isnan(v) else f"{v:.3f}")
        per_seed = " / ".join(f"{c.best_s[-1]:.4f}" for c in curves)
        print(f"| {method} | {cells} | {per_seed} | {needed:.0f} | {wall:.0f} | {fmt(upd)} | {fmt(meas)} |",
              flush=True)
    print("\n| reference | step time (s) |\n|---|---|")
    for name in HEURISTICS:
        print(f"| {name} | {heuristic_runtime_s(problem, measurer, name):.4f} |")
    print(f"| lower bound | {problem.lower_bound_s:.4f} |")


if __name__ == "__main__":
    main()
