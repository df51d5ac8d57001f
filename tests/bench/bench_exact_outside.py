"""Issue 16 on graphs from outside the project: Keras MobileNetV2, imported as bench_schedule_agreement.py
imports it (the default), or graph files (``--graphs``: e.g. outside_models.py's runs/outside/*.parquet), at
32 scope groups on paper-2gpu and paper-4gpu: the proven bound (60 s), `exact` (``--time-limit``, 60 s), cem
and annealing at 2,048 measurements (seed 0) and the list schedulers (``--exact-only``: `exact` alone), one JSON
line per graph and machine.
Usage::

    python tests/bench/bench_exact_outside.py [--graphs FILE ...] [--time-limit S] [--exact-only]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MACHINES = ("paper-2gpu", "paper-4gpu")
HEURISTICS = ("single-gpu", "m-etf", "m-sct", "heft")
SEARCHES = ("cem", "annealing")


def row(graph, machine_name: str, exact_time_limit_s: float = 60.0, exact_only: bool = False) -> dict:
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.exact.bound import proven_bound
    from policies.problem import make_problem
    from policies.registry import place

    machine = load_machine(machine_name)
    problem = make_problem(graph, machine, max_groups=32, grouping_method="scope")
    measurer = SimulatorMeasurer(graph, machine)
    out = {"graph": graph.name, "machine": machine_name}
    if not exact_only:
        bound = proven_bound(problem, 60)
        out.update(closed_form_s=bound.closed_form_s, lp_s=bound.lp_s, mip_s=bound.mip_s,
                   mip_status=bound.mip_status, proven_bound_s=bound.best_s)
        for name in HEURISTICS:
            out[name] = place(name, problem, measurer, 1, 0).best.runtime_s
        for name in SEARCHES:
            out[name] = place(name, problem, measurer, 2048, 0).best.runtime_s
    exact = place("exact", problem, measurer, 16, 0, time_limit_s=exact_time_limit_s)
    out["exact"], out["exact_bound_s"] = exact.best.runtime_s, exact.solver_bound_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=None, metavar="FILE", help="graph files (default: MobileNetV2)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="exact's solver limit, seconds")
    parser.add_argument("--exact-only", action="store_true", help="only exact (to compare two versions of it)")
    args = parser.parse_args()
    from bench_schedule_agreement import KERAS_NAME, load

    for graph in [load(name) for name in args.graphs] if args.graphs else [load(KERAS_NAME)]:
        for machine_name in MACHINES:
            print(json.dumps(row(graph, machine_name, args.time_limit, args.exact_only)), flush=True)


if __name__ == "__main__":
    main()
