"""Seconds per learner iteration of the seq2seq placer (sampling + update) against the measurement time.

Issue 13's targets, on one torch thread at batch 16 and hidden 256: at most 0.5 s per iteration at 256 groups
and 0.1 s at 32. Runs the learner on a synthetic graph grouped into each group count on the paper's
1 CPU + 2 GPU machine, times the exploration pass, the learner update (PPO: all its epochs; the per-epoch
figure beside it) and the one batched simulator call per iteration, and prints a markdown table, a row per
trainer, group count, hidden size and thread count. Usage::

    python tests/bench/bench_learner.py [--iterations 3] [--groups 256 32] [--hidden 256] [--batch 16] [--cpu-time]

``--cpu-time`` times with this process's CPU time instead of wall time: on a machine shared with other
jobs the wall time counts their share of the cores too (one torch thread: the two agree on an idle machine).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations after a warm-up one")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--groups", type=int, nargs="+", default=[256, 32])
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--trainers", nargs="+", default=["reinforce", "ppo"])
    parser.add_argument("--cpu-time", action="store_true", help="process CPU seconds instead of wall seconds")
    args = parser.parse_args()
    if args.cpu_time:
        _time_loop_by_cpu()

    from graphs.synthetic import synthetic_graph
    from measurers.catalog import load_machine

    graph = synthetic_graph(args.ops, seed=0)
    machine = load_machine("paper-2gpu")
    print(f"graph: synthetic {graph.num_ops} ops; machine paper-2gpu; B={args.batch}; torch {torch.__version__}; "
          f"{os.cpu_count()} CPUs; mean of {args.iterations} iterations after a warm-up one; "
          f"{'CPU' if args.cpu_time else 'wall'} seconds\n")
    print("| trainer | groups | hidden | threads | sample s | update s | per epoch s | sample + update s "
          "| measure s (B sims) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for trainer in args.trainers:
        for groups in args.groups:
            for hidden in args.hidden:
                for threads in args.threads:
                    print(_row(graph, machine, args, trainer, groups, hidden, threads), flush=True)


def _time_loop_by_cpu() -> None:
    """Make the training loop's timers read process CPU time (its sample_s, update_s and measure_s)."""
    import time
    import types

    import policies.rl.loop as loop
    loop.time = types.SimpleNamespace(perf_counter=time.process_time)


def _row(graph, machine, args, trainer: str, groups: int, hidden: int, threads: int) -> str:
    """One table row: the mean seconds of the timed iterations."""
    from graphs.grouping import group_ops
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.rl.config import RLConfig
    from policies.rl.loop import train_placer

    grouping = group_ops(graph, max_groups=groups)
    config = RLConfig(trainer=trainer, batch_size=args.batch, hidden_size=hidden, torch_threads=threads)
    result = train_placer(graph, machine, grouping, SimulatorMeasurer(graph, machine), config=config,
                          budget_measurements=args.batch * (args.iterations + 1))
    history = result.history[1:]  # the first iteration includes one-time set-up
    sample_s = np.mean([m.sample_s for m in history])
    update_s = np.mean([m.update_s for m in history])
    measure_s = np.mean([m.measure_s for m in history])
    epochs = config.ppo_epochs if trainer == "ppo" else 1
    return (f"| {trainer} | {grouping.num_groups} | {hidden} | {threads} | {sample_s:.3f} | {update_s:.3f} | "
            f"{update_s / epochs:.3f} | {sample_s + update_s:.3f} | {measure_s:.3f} |")


if __name__ == "__main__":
    main()
