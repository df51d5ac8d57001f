"""The memory repair's last step (policies/spill.py, a tabu search over one-group moves) on small random
graphs with tight memory: for each graph, every placement is simulated to know whether one fits, then m-TOPO,
m-ETF, m-SCT and HEFT place it without the last step and with it, side by side in one run.

    python tests/bench/bench_memory_repair_small.py [--graphs N] [--first SEED]

Random DAGs of 5-8 ops (1-2 inputs each, edges of 10-290 MB, parameters of 0-400 MB an op, some ops CPU-only
or GPU-only) on paper-2gpu with each device's memory drawn from 100 MB to 1.5 GB, seeds FIRST.. FIRST+N-1.
Prints the runs where some placement fits, and how many of them each way ended out of memory.
"""
import argparse, dataclasses, itertools, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # conftest's build_graph
from conftest import build_graph
from graphs.opgraph import kind_bit
from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
import policies.spill
from policies.problem import make_problem
from policies.registry import place

HEURISTICS = ("m-topo", "m-etf", "m-sct", "heft")
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--graphs", type=int, default=80, help="random graphs (default 80)")
parser.add_argument("--first", type=int, default=0, help="the first graph's seed (default 0)")
args = parser.parse_args()


def random_case(seed: int, base):
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(5, 9))
    edges = [(int(i), j, int(rng.integers(1, 30)) * 10**7) for j in range(1, n)
             for i in rng.choice(j, size=min(j, int(rng.integers(1, 3))), replace=False)]
    allowed = np.full(n, kind_bit("cpu") | kind_bit("gpu"), dtype=np.uint8)
    for kind in ("cpu", "gpu"):
        if rng.random() < 0.3:
            allowed[int(rng.integers(0, n))] = kind_bit(kind)
    params = rng.integers(0, 5, n) * 10**8
    out = [max([e[2] for e in edges if e[0] == i], default=10**6) for i in range(n)]
    graph = build_graph(edges, n, flops=rng.integers(1, 20, n) * 1e9, out_bytes=out, param_bytes=params,
                        allowed_mask=allowed, name=f"small{seed}")
    memory = rng.integers(1, 16, 3) * 10**8
    machine = dataclasses.replace(base, devices=tuple(dataclasses.replace(d, memory_bytes=int(b))
                                                      for d, b in zip(base.devices, memory)))
    return graph, machine


def some_placement_fits(problem, measurer) -> bool:
    choices = [np.flatnonzero(row) for row in problem.unit_allowed]
    return any(measurer.measure([problem.expand(np.array(units))])[0].ok for units in itertools.product(*choices))


base, default_simulations = load_machine("paper-2gpu"), policies.spill.DESCENT_SIMULATIONS
runs, oom = 0, {"without the last step": 0, "with it": 0}
seconds = dict.fromkeys(oom, 0.0)
for seed in range(args.first, args.first + args.graphs):
    graph, machine = random_case(seed, base)
    problem, measurer = make_problem(graph, machine), SimulatorMeasurer(graph, machine)
    if not problem.unit_allowed.any(axis=1).all() or not some_placement_fits(problem, measurer):
        continue
    for name in HEURISTICS:
        runs += 1
        for way, simulations in (("without the last step", 0), ("with it", default_simulations)):
            policies.spill.DESCENT_SIMULATIONS = simulations
            began = time.perf_counter()
            result = place(name, problem, measurer, 1, 0)
            seconds[way] += time.perf_counter() - began
            oom[way] += not result.best.ok
print(f"{runs} runs (graphs x {len(HEURISTICS)} heuristics) where some placement fits")
for way in oom:
    print(f"  {way}: {oom[way]} ended out of memory; {seconds[way]:.1f} s placing")
