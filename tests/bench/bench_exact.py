"""Issue 16's table: how far from optimal? `exact` (CP-SAT) and the proven bound against every method.

Rows: nmt-2, nmt-4, rnnlm and inception-v3 at 32 scope groups on paper-2gpu and paper-4gpu. Per row, two
jobs, each in a fresh process (a pool of ``--jobs`` workers):

- ``exact``: ``placer search --policy exact`` through the registry with ``--time-limit`` seconds
  (default 600), its placement measured by the noise-free simulator; the solver's own makespan, its bound
  (for the model in which groups run whole) and its status.
- ``bound``: ``policies.exact.bound.proven_bound`` on the same 32 groups with ``--bound-time-limit``
  seconds, plus the quick heuristics' simulated step times (on colocation groups, as `placer baselines`
  runs them).

The searches' figures come from ``--searches`` (JSON lines written by ``bench_learned_vs_search.py``, e.g.
``--methods cem annealing``, same rows, 2,048 measurements, seeds 0-2); their best over seeds is what
``exact`` must reach. Each finished job is appended to ``--out``; running the same command again resumes.
Usage::

    python tests/bench/bench_exact.py [--jobs 2] [--time-limit 600] [--budget 16] [--bound-time-limit 300]
        [--rows nmt-2:paper-2gpu ...] [--searches runs/searches.jsonl] [--out FILE] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

ROWS = tuple(f"{graph}:{machine}" for graph in ("nmt-2", "nmt-4", "rnnlm", "inception-v3")
             for machine in ("paper-2gpu", "paper-4gpu"))
HEURISTICS = ("single-gpu", "expert", "m-topo", "m-etf", "m-sct", "heft")
GROUPS, GROUPING = 32, "scope"
BUDGET = 16  # exact's measurements by default, and in records written before the budget was recorded


@dataclass(frozen=True)
class Job:
    graph: str
    machine: str
    kind: str  # "exact" | "bound"
    time_limit_s: float
    solver: str = ""  # exact's solver (cpsat | highs); "" for the bound job
    budget: int = BUDGET  # exact's measurements

    @property
    def key(self) -> tuple:
        return tuple(asdict(self).values())


def build(job: Job):
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem

    graph, machine = load_graph(job.graph), load_machine(job.machine)
    problem = make_problem(graph, machine, max_groups=GROUPS, grouping_method=GROUPING)
    return problem, SimulatorMeasurer(graph, machine)


def run_exact(job: Job) -> dict:
    from policies.registry import place

    problem, measurer = build(job)
    started = time.perf_counter()
    result = place("exact", problem, measurer, job.budget, 0, time_limit_s=job.time_limit_s, solver=job.solver)
    return {"runtime_s": result.best.runtime_s if result.best.ok else math.nan, "status": result.best.status,
            "solver_makespan_s": result.solver_makespan_s, "solver_bound_s": result.solver_bound_s,
            "solver_status": result.solver_status, "measurements": result.measurements,
            "notes": result.notes, "wall_s": time.perf_counter() - started}


def run_bound(job: Job) -> dict:
    from graphs.errors import PlacerError
    from policies.exact.bound import proven_bound
    from policies.registry import place

    problem, measurer = build(job)
    report = proven_bound(problem, job.time_limit_s)
    heuristics = {}
    for name in HEURISTICS:
        try:
            best = place(name, problem, measurer, 1, 0).best
            heuristics[name] = best.runtime_s if best.ok else math.nan
        except PlacerError:
            heuristics[name] = math.nan
    return {"bound": {k: v for k, v in asdict(report).items()}, "heuristics": heuristics}


def run_job(job: Job) -> dict:
    record = asdict(job)
    try:
        record.update(run_exact(job) if job.kind == "exact" else run_bound(job))
        record["error"] = None
    except Exception as exc:  # recorded, retried on the next run
        record["error"] = f"{type(exc).__name__}: {exc}"
    return record


def load_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def search_bests(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    """(graph, machine) -> method -> best step time over the seeds in ``path``: searches of the 32 scope groups
    the bound holds for (records of other group counts, or of groups split by a heuristic, are skipped)."""
    bests: dict[tuple[str, str], dict[str, float]] = {}
    for record in load_records(path):
        if record.get("error") or record.get("best_s") is None:
            continue
        searched = (record.get("groups", GROUPS), record.get("grouping", GROUPING), record.get("split_groups", ""))
        if searched != (GROUPS, GROUPING, ""):
            continue
        row = bests.setdefault((record["graph"], record["machine"]), {})
        row[record["method"]] = min(row.get(record["method"], math.inf), float(record["best_s"]))
    return bests


def fmt(value, digits: int = 4) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}f}"


def report(records: list[dict], searches: dict, solvers: list[str], budget: int) -> None:
    """The table of the records of exact runs with ``budget`` measurements, and of the bound jobs where the file
    has them (without, the proven bound is exact's own and the heuristics are left out)."""
    done = {(r["graph"], r["machine"], r["kind"], r.get("solver", "")): r for r in records
            if not r.get("error") and (r["kind"] != "exact" or r.get("budget", BUDGET) == budget)}
    summary = []
    for row in ROWS:
        graph, machine = row.split(":")
        bound = done.get((graph, machine, "bound", ""))
        exact = {solver: done[(graph, machine, "exact", solver)] for solver in solvers
                 if (graph, machine, "exact", solver) in done}
        if not exact:
            continue
        b = bound["bound"] if bound else None  # without the bound job: exact's own bound, no heuristics
        proven_s = max(([b["best_s"]] if b else []) + [e["solver_bound_s"] for s, e in exact.items()
                                                      if s == "highs" and e["solver_bound_s"] is not None
                                                      and math.isfinite(e["solver_bound_s"])], default=math.nan)
        closed_s = b["closed_form_s"] if b else math.nan
        own = searches.get((graph, machine), {})
        methods = {**(bound["heuristics"] if bound else {}), **own,
                   **{f"exact ({s})": e["runtime_s"] for s, e in exact.items()}}
        print(f"\n#### {graph} on {machine}\n")
        if b:
            print(f"closed-form bound {fmt(closed_s)} s (every placement); LP {fmt(b['lp_s'])} s; MIP "
                  f"{fmt(b['mip_s'])} s ({b['mip_status']}, {b['time_limit_s']:.0f} s limit); best proven "
                  f"{fmt(proven_s)} s for {b['holds_for']}\n")
        for solver, e in exact.items():
            print(f"- exact ({solver}, {e['time_limit_s']:.0f} s limit): measured {fmt(e['runtime_s'])} s; solver's "
                  f"makespan {fmt(e['solver_makespan_s'])} s, bound {fmt(e['solver_bound_s'])} s, "
                  f"{e['solver_status']}; {e['measurements']} measured; {e['wall_s']:.0f} s")
        print("\n| method | step time (s) | x closed-form bound | x proven bound |\n|---|---|---|---|")
        for name, value in sorted(methods.items(), key=lambda kv: (not math.isfinite(kv[1]), kv[1])):
            print(f"| {name} | {fmt(value)} | {fmt(value / closed_s, 2)} | {fmt(value / proven_s, 2)} |")
        best_search = min(own.values(), default=math.nan)
        summary.append((row, {s: e["runtime_s"] for s, e in exact.items()}, best_search, proven_s))
    print("\n| row | " + " | ".join(f"exact {s} (s)" for s in solvers) + " | best search at 2,048 (s) | exact at or "
          "below | proven bound (s) | best found / proven bound |\n" + "|---" * (len(solvers) + 5) + "|")
    for row, exact_s, search_s, proven_s in summary:
        best_exact = min(exact_s.values())
        verdict = "yes" if best_exact <= search_s * (1 + 1e-9) else "no"
        cells = " | ".join(fmt(exact_s.get(s, math.nan)) for s in solvers)
        print(f"| {row} | {cells} | {fmt(search_s)} | {verdict} | {fmt(proven_s)} | "
              f"{fmt(min(best_exact, search_s) / proven_s, 2)}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), metavar="GRAPH:MACHINE")
    parser.add_argument("--time-limit", type=float, default=600.0, help="exact's solver limit, seconds")
    parser.add_argument("--bound-time-limit", type=float, default=300.0, help="the relaxation's limit, seconds")
    parser.add_argument("--kinds", nargs="+", default=["exact", "bound"], choices=["exact", "bound"])
    parser.add_argument("--solvers", nargs="+", default=["highs"], choices=["cpsat", "highs"], help="exact's")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", type=int, default=BUDGET, help="exact's measurements (the searches': 2048)")
    parser.add_argument("--searches", default="runs/searches.jsonl")
    parser.add_argument("--out", default="runs/bench_exact.jsonl")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()

    out = Path(args.out)
    if not args.report_only:
        finished = {Job(r["graph"], r["machine"], r["kind"], r["time_limit_s"], r.get("solver", ""),
                        r.get("budget", BUDGET)).key
                    for r in load_records(out) if not r.get("error")}
        jobs = [Job(*row.split(":"), "bound", args.bound_time_limit) for row in args.rows if "bound" in args.kinds]
        jobs += [Job(*row.split(":"), "exact", args.time_limit, solver, args.budget) for row in args.rows
                 for solver in args.solvers if "exact" in args.kinds]
        jobs = [job for job in jobs if job.key not in finished]
        out.parent.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
            futures = {pool.submit(run_job, job): job for job in jobs}
            for future in as_completed(futures):
                record = future.result()
                with out.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"{record['graph']}:{record['machine']} {record['kind']} {record['solver']}: "
                      f"{record.get('error') or 'done'}", flush=True)
    report(load_records(out), search_bests(Path(args.searches)), args.solvers, args.budget)


if __name__ == "__main__":
    main()
