"""How much the PyTorch measurer's replay adds to a training step: eager autograd step vs placed replay.

Both run the same RNNLM training step (forward, loss, backward, Adam) on the CPU, single device; the
replay calls the captured aten ops directly (no autograd, no Python model code) and adds its own
bookkeeping per op. Prints a markdown table (median of 7 steps after 2 warm-up steps).

    python tests/bench/bench_torch_replay.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from graphs.benchmarks.torch_models import build_rnnlm
from measurers.catalog import load_machine
from measurers.torch.measurer import TorchMeasurer
from measurers.torch.workload import workload_from_graph

CONFIGS = [dict(batch_size=8, seq_len=5, hidden=32, vocab=100, layers=2),
           dict(batch_size=32, seq_len=10, hidden=256, vocab=2000, layers=2)]


def median_s(fn, warmup: int = 2, runs: int = 7) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    torch.set_num_threads(1)
    machine = load_machine("local")
    print("| config | ops | eager step ms | replay ms | replay overhead per op us |\n|---|---|---|---|---|")
    for config in CONFIGS:
        graph = build_rnnlm(**config)
        step = workload_from_graph(graph).materialize(0)
        optimizer = step.make_optimizer()

        def eager():
            optimizer.zero_grad(set_to_none=True)
            step.loss().backward()
            optimizer.step()

        measurer = TorchMeasurer(graph, machine)
        replay = measurer.replay_for(np.zeros(graph.num_ops, dtype=np.int64))
        eager_s, replay_s = median_s(eager), median_s(replay.run)
        steps = len(measurer.program().steps)
        print(f"| hidden {config['hidden']}, seq {config['seq_len']}, batch {config['batch_size']} | {graph.num_ops} "
              f"| {eager_s * 1e3:.2f} | {replay_s * 1e3:.2f} | {(replay_s - eager_s) / steps * 1e6:.1f} |")


if __name__ == "__main__":
    main()
