"""Seconds per learner update (G=256 groups, B=64 placements) against the measurement time it drives.

Runs the seq2seq learner on a synthetic graph grouped into 256 groups on the paper's 1 CPU + 2 GPU machine,
times the exploration pass, the learner update and the one batched simulator call per iteration, and prints
a markdown table. Usage::

    python tests/bench/bench_learner.py [--iterations 1] [--hidden 128 256] [--threads 1] [--ops 3000]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1, help="timed iterations after a warm-up one")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--trainers", nargs="+", default=["reinforce", "ppo"])
    args = parser.parse_args()

    from graphs.grouping import group_ops
    from graphs.synthetic import synthetic_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.rl.config import RLConfig
    from policies.rl.loop import train_placer

    graph = synthetic_graph(args.ops, seed=0)
    machine = load_machine("paper-2gpu")
    grouping = group_ops(graph, max_groups=args.groups)
    measurer = SimulatorMeasurer(graph, machine)
    print(f"graph: synthetic {graph.num_ops} ops, {grouping.num_groups} groups; machine paper-2gpu; "
          f"B={args.batch}; torch {torch.__version__}; {os.cpu_count()} CPUs\n")
    print("| trainer | hidden | threads | sample s | update s | learner s / iteration | measure s (B sims) |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for trainer in args.trainers:
        for hidden in args.hidden:
            for threads in args.threads:
                config = RLConfig(trainer=trainer, batch_size=args.batch, hidden_size=hidden, torch_threads=threads)
                result = train_placer(graph, machine, grouping, measurer, config=config,
                                      budget_measurements=args.batch * (args.iterations + 1))
                history = result.history[1:]  # the first iteration includes one-time set-up
                sample_s = np.mean([m.sample_s for m in history])
                update_s = np.mean([m.update_s for m in history])
                measure_s = np.mean([m.measure_s for m in history])
                print(f"| {trainer} | {hidden} | {threads} | {sample_s:.2f} | {update_s:.2f} | "
                      f"{sample_s + update_s:.2f} | {measure_s:.3f} |", flush=True)


if __name__ == "__main__":
    main()
