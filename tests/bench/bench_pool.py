"""Measurer-pool benchmarks: overhead next to in-process simulation, and scaling over actors.

    python tests/bench/bench_pool.py                 # both parts
    python tests/bench/bench_pool.py --part overhead --ops 300 2000
    python tests/bench/bench_pool.py --part scaling --actors 1 2 4 8 16

Part 1 (overhead): the simulator measurer on batches of 64 fresh placements, called in this process and
through a pool of one CPU actor (and of two). Target: the pool reaches at least 80% of the in-process
throughput at batch 64.
Part 2 (scaling): a measurer that sleeps 100 ms per placement, 1..16 actors on a fake cluster (a CPU head
and two 4-GPU nodes), 8 placements per actor per batch. Target: at least 90% of the ideal throughput
(actors x 10 placements/s). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
import ray

from cluster.pool import MeasurerPool, PoolConfig
from graphs.synthetic import synthetic_graph
from measurers.base import Measurement
from measurers.catalog import load_machine
from measurers.factory import MeasurerSpec, build_measurer

BATCH = 64


class SleepMeasurer:
    """Every placement takes exactly ``sleep_s``."""

    def __init__(self, sleep_s: float):
        self.sleep_s = sleep_s

    def measure(self, placements):
        out = []
        for _ in placements:
            time.sleep(self.sleep_s)
            out.append(Measurement(self.sleep_s, (self.sleep_s,), "ok", (), self.sleep_s))
        return out


def _batches(num_ops: int, num_devices: int, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, num_devices, size=(BATCH, num_ops)) for _ in range(count)]  # (B, N) each


def _interleaved_throughput(measures, batches_per_measure) -> list[float]:
    """Placements per second of each measure function, taking turns batch by batch so that every one sees the
    same background load (this machine is shared); one warm-up batch each first."""
    spent_s = [0.0] * len(measures)
    for measure, batches in zip(measures, batches_per_measure):
        measure(list(batches[0]))
    for i in range(1, len(batches_per_measure[0])):
        for k, (measure, batches) in enumerate(zip(measures, batches_per_measure)):
            t0 = time.perf_counter()
            measure(list(batches[i]))
            spent_s[k] += time.perf_counter() - t0
    return [BATCH * (len(batches_per_measure[0]) - 1) / s for s in spent_s]


def bench_overhead(op_counts: list[int], reps: int) -> None:
    machine = load_machine("paper-4gpu")
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    print(f"\n### Pool overhead, simulator, batch {BATCH} (placements/s over {reps} batches, interleaved)\n")
    print("| ops | in-process | pool, 1 actor | ratio | pool, 2 actors | ratio | overhead per placement |")
    print("|---|---|---|---|---|---|---|")
    for num_ops in op_counts:
        spec = MeasurerSpec("sim", synthetic_graph(num_ops, seed=0), machine)
        one = MeasurerPool(spec, PoolConfig(num_cpu_actors=1, use_gpus=False))
        two = MeasurerPool(spec, PoolConfig(num_cpu_actors=2, use_gpus=False))
        try:
            batches = [_batches(num_ops, machine.num_devices, reps + 1, seed) for seed in (1, 2, 3)]
            local, pooled1, pooled2 = _interleaved_throughput(
                [build_measurer(spec).measure, one.measure, two.measure], batches)
        finally:
            one.close()
            two.close()
        overhead_us = (1 / pooled1 - 1 / local) * 1e6
        print(f"| {num_ops} | {local:,.0f} | {pooled1:,.0f} | {pooled1 / local:.2f} | {pooled2:,.0f} | "
              f"{pooled2 / local:.2f} | {overhead_us:+.0f} µs |")
    ray.shutdown()


def bench_scaling(actor_counts: list[int], sleep_s: float, per_actor: int, reps: int) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=0, num_gpus=4)
    ray.init(address=cluster.address)
    print(f"\n### Scaling, {sleep_s * 1000:.0f} ms per placement, {per_actor} placements per actor per batch "
          f"(median of {reps})\n")
    print("| actors | placements | wall s | placements/s | ideal/s | efficiency |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    try:
        for actors in actor_counts:
            config = PoolConfig(num_cpu_actors=actors, use_gpus=False)
            with MeasurerPool(functools.partial(SleepMeasurer, sleep_s), config, start_timeout_s=300) as pool:
                walls = []
                for _ in range(reps):
                    batch = list(rng.integers(0, 1 << 30, size=(actors * per_actor, 4)))
                    t0 = time.perf_counter()
                    pool.measure(batch)
                    walls.append(time.perf_counter() - t0)
            wall = statistics.median(walls)
            rate, ideal = actors * per_actor / wall, actors / sleep_s
            print(f"| {actors} | {actors * per_actor} | {wall:.3f} | {rate:.1f} | {ideal:.1f} | {rate / ideal:.1%} |")
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("overhead", "scaling", "both"), default="both")
    parser.add_argument("--ops", type=int, nargs="+", default=[300, 2000])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.part in ("overhead", "both"):
        bench_overhead(args.ops, args.reps)
    if args.part in ("scaling", "both"):
        bench_scaling(args.actors, 0.1, 8, 3)


if __name__ == "__main__":
    main()
