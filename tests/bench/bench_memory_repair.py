"""The memory-constrained heuristics on benchmark graphs x catalog machines, one JSON line per run (status,
step, simulated peaks, notes, a hash of the op placement): run it before and after a change to the
heuristics or their memory repair (policies/spill.py) and compare the lines.

    python tests/bench/bench_memory_repair.py [GRAPHS MACHINES POLICIES OUT.jsonl]
    python tests/bench/bench_memory_repair.py transformer,nmt-4 cpu-igpu m-topo,m-etf,heft,m-sct runs/after.jsonl

With no arguments (`make bench`): the nine graphs and nine catalog machines of BENCHMARKS.md's "Memory repair"
section, the four heuristics, appended to runs/bench_memory_repair.jsonl. ``--gpu-memory F``: every GPU of
the machine holds F times the step's one-GPU peak (the simulator's), to see the heuristics under tight memory.
"""
import argparse, dataclasses, hashlib, json, os, time
import numpy as np
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
from policies.problem import make_problem
from policies.registry import place

GRAPHS = "rnnlm,inception-v3,resnet-50,transformer,nmt-2,nmt-4,inception-v3-infer,resnet-50-infer,bert-base-infer"
MACHINES = "paper-2gpu,paper-4gpu,cpu-igpu,desktop-igpu,k80-v100,a100-h100,dgx1-v100,paper-8gpu,h200x8"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("graphs", nargs="?", default=GRAPHS, help="comma-separated graph names")
parser.add_argument("machines", nargs="?", default=MACHINES, help="comma-separated machine names")
parser.add_argument("policies", nargs="?", default="m-topo,m-etf,heft,m-sct", help="comma-separated heuristics")
parser.add_argument("out", nargs="?", default="runs/bench_memory_repair.jsonl", help="JSON lines, appended")
parser.add_argument("--gpu-memory", type=float, default=None, metavar="F",
                    help="each GPU's memory: F times the step's one-GPU peak (default: the catalog's)")
args = parser.parse_args()
graphs, machines, policies = args.graphs.split(","), args.machines.split(","), args.policies.split(",")
os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)  # runs/ is not in a fresh checkout
out = open(args.out, "a")
for gname in graphs:
    g = load_graph(gname)
    for mname in machines:
        m = load_machine(mname)
        p = make_problem(g, m)
        if args.gpu_memory is not None:
            gpu_bytes = int(args.gpu_memory * p.single_device_peak_bytes)
            m = dataclasses.replace(m, devices=tuple(dataclasses.replace(d, memory_bytes=gpu_bytes)
                                                     if d.kind == "gpu" else d for d in m.devices))
            p = make_problem(g, m)
        meas = SimulatorMeasurer(g, m)
        for name in policies:
            t = time.perf_counter()
            try:
                r = place(name, p, meas, 1, 0)
            except Exception as exc:
                record = {"graph": gname, "machine": mname, "policy": name, "error": str(exc)}
                print(json.dumps(record), file=out, flush=True)
                continue
            rec = {"graph": gname, "machine": mname, "gpu_memory": args.gpu_memory, "policy": name,
                   "status": r.best.status, "runtime_s": r.best.runtime_s, "peak_bytes": list(r.best.peak_bytes),
                   "capacity_bytes": [int(d.memory_bytes) for d in m.devices], "notes": r.notes,
                   "hash": hashlib.sha1(np.asarray(r.op_placement, dtype=np.int64).tobytes()).hexdigest()[:16],
                   "wall_s": round(time.perf_counter() - t, 2)}
            print(json.dumps(rec), file=out, flush=True)
