"""The memory-constrained heuristics on benchmark graphs x catalog machines, one JSON line per run (status,
step, simulated peaks, notes, a hash of the op placement): run it before and after a change to the
heuristics or their memory repair (policies/spill.py) and compare the lines.

    python tests/bench/bench_memory_repair.py GRAPHS MACHINES POLICIES OUT.jsonl
    python tests/bench/bench_memory_repair.py transformer,nmt-4 cpu-igpu m-topo,m-etf,heft,m-sct runs/after.jsonl
"""
import hashlib, json, sys, time
import numpy as np
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
from policies.problem import make_problem
from policies.registry import place

graphs = sys.argv[1].split(",")
machines = sys.argv[2].split(",")
policies = sys.argv[3].split(",")
out = open(sys.argv[4], "a")
for gname in graphs:
    g = load_graph(gname)
    for mname in machines:
        m = load_machine(mname)
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
            rec = {"graph": gname, "machine": mname, "policy": name, "status": r.best.status,
                   "runtime_s": r.best.runtime_s, "peak_bytes": list(r.best.peak_bytes),
                   "capacity_bytes": [int(d.memory_bytes) for d in m.devices], "notes": r.notes,
                   "hash": hashlib.sha1(np.asarray(r.op_placement, dtype=np.int64).tobytes()).hexdigest()[:16],
                   "wall_s": round(time.perf_counter() - t, 2)}
            print(json.dumps(rec), file=out, flush=True)
