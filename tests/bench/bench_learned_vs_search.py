"""Issue 13's table: does the best learned placer reach plain search (cem, annealing) at the same budget?

Each (row, method, seed) is one job, run in a fresh process (a pool of ``--jobs`` workers, one torch thread
each) through ``bench_convergence.run_method``: the in-process simulator, ``--groups`` groups by
``--grouping``, the same budget for every method; ``NAME+ws`` is a learned policy (or annealing)
warm-started from the quick heuristics. Each finished job is appended to ``--out`` as one JSON line, so an interrupted run is
resumed by running the same command again (done jobs are skipped; failed ones are retried). Prints, per
row, each method's mean best step time and each seed's, as a multiple of the lower bound, and whether the
best learned method (mean over seeds) is at or below min(cem, annealing) and below the expert. Usage::

    python tests/bench/bench_learned_vs_search.py [--jobs 2] [--budget 2048] [--seeds 0 1 2]
        [--rows nmt-2:paper-2gpu ...] [--nmt8] [--methods reinforce ppo ...] [--out FILE] [--report-only]
        [--references expert single-gpu m-etf ...] [--split-groups HEURISTIC] [--planner-groups G]

A row's graph may be a graph file (``runs/outside/torch-mlp.parquet:paper-4gpu``). Each row also prints the
best learned method against every non-learned one run there (the searches and the ``--references``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import MISSING, asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

ROWS = ("nmt-2:paper-2gpu", "nmt-2:paper-4gpu", "nmt-4:paper-2gpu", "nmt-4:paper-4gpu", "rnnlm:paper-2gpu",
        "rnnlm:paper-4gpu")
NMT8_ROWS = ("nmt-8:paper-8gpu", "nmt-8:paper-4gpu")
METHODS = ("reinforce", "ppo", "hierarchical", "post", "reinforce+ws", "post+ws", "hierarchical+ws", "cem",
           "annealing")
SEARCHES = ("cem", "annealing")  # what the best learned method must reach
REFERENCES = ("expert", "single-gpu")


@dataclass(frozen=True)
class Job:
    graph: str
    machine: str
    method: str
    seed: int
    budget: int
    groups: int
    grouping: str
    batch: int
    hidden: int
    planner_groups: int = 256  # the hierarchical planner's G (records written before it existed: 256)
    reference_names: str = " ".join(REFERENCES)  # heuristics scored once per job, beside the search
    split_groups: str = ""  # a heuristic whose devices split the groups (`placer search --split-groups`)

    @property
    def key(self) -> tuple:
        """What the search depends on: every field but ``reference_names`` (a job already done keeps the
        references it was run with)."""
        return tuple(v for k, v in asdict(self).items() if k not in NOT_IN_KEY)


def run_job(job: Job) -> dict:
    """One method, one seed, one row, in this (fresh) process: the record written to the output file."""
    import numpy as np
    import torch

    from bench_convergence import heuristic_result, run_method
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem

    torch.set_num_threads(1)
    record = asdict(job)
    started = time.perf_counter()
    try:
        graph, machine = load_graph(job.graph), load_machine(job.machine)
        problem = make_problem(graph, machine, max_groups=job.groups, grouping_method=job.grouping)
        if job.split_groups:
            from policies.registry import heuristic_op_placement
            problem = problem.split_by(heuristic_op_placement(job.split_groups, problem))
        measurer = SimulatorMeasurer(graph, machine)
        curve = run_method(problem, measurer, job.method, job.budget, job.seed, job.batch, job.hidden,
                           planner_groups=job.planner_groups)
        references = {}
        for name in job.reference_names.split():
            result = heuristic_result(problem, measurer, name)
            ok = result is not None and result.best is not None and result.best.ok
            references[name] = result.best.runtime_s if ok else None
        best = float(curve.best_s[-1])
        record.update(best_s=best if math.isfinite(best) else None, lower_bound_s=problem.lower_bound_s,
                      measurements=int(np.isfinite(curve.best_s).sum()), references=references,
                      seconds_per_update=None if math.isnan(curve.seconds_per_update) else curve.seconds_per_update,
                      curve=curve_points(curve.best_s), error=None)
    except Exception as exc:  # one failed job must not end the table: recorded, retried on the next run
        record.update(best_s=None, error=f"{type(exc).__name__}: {exc}")
    record["wall_s"] = time.perf_counter() - started
    return record


def curve_points(best_s) -> dict[str, float | None]:
    """The best step time after 1, 2, 4, ... measurements and after the last one (None before the first
    ok placement): enough to read off how many measurements a method needed to get within x% of a figure."""
    points = sorted({min(2 ** k, len(best_s)) for k in range(len(best_s).bit_length() + 1)} | {len(best_s)})
    return {str(n): (float(best_s[n - 1]) if math.isfinite(best_s[n - 1]) else None) for n in points if n >= 1}


def read_records(path: Path) -> list[dict]:
    """Every JSON line of the output file (a torn last line, from a killed run, is skipped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


NOT_IN_KEY = ("reference_names",)


def record_key(record: dict) -> tuple:
    fields = [f for f in Job.__dataclass_fields__.values() if f.name not in NOT_IN_KEY]
    return tuple(record.get(f.name, f.default) if f.default is not MISSING else record[f.name] for f in fields)


def pending_jobs(jobs: list[Job], records: list[dict]) -> list[Job]:
    done = {record_key(r) for r in records if r.get("error") is None}
    return [job for job in jobs if job.key not in done]


def latest_records(jobs: list[Job], records: list[dict]) -> list[dict]:
    """One record per wanted job: its last success, else its last error."""
    wanted, chosen = {job.key for job in jobs}, {}
    for record in records:
        key = record_key(record)
        if key in wanted and (record.get("error") is None or chosen.get(key, record).get("error") is not None):
            chosen[key] = record
    return list(chosen.values())


def run_jobs(jobs: list[Job], out: Path, workers: int) -> None:
    """Each job in a fresh spawned process; each result appended to ``out`` as soon as it arrives."""
    out.parent.mkdir(parents=True, exist_ok=True)
    context = get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, max_tasks_per_child=1) as pool, \
            out.open("a") as sink:
        if out.stat().st_size and not out.read_bytes().endswith(b"\n"):
            sink.write("\n")  # a killed run's torn last line stays a line of its own
        futures = {pool.submit(run_job, job): job for job in jobs}
        for i, future in enumerate(as_completed(futures), 1):
            record = future.result()
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            what = record["error"] or f"best {record['best_s']} s"
            print(f"[{i}/{len(jobs)}] {record['graph']} {record['machine']} {record['method']} seed "
                  f"{record['seed']}: {what}, {record['wall_s']:.0f} s", file=sys.stderr, flush=True)


def method_problem(methods: list[str]) -> str:
    """Why the method names cannot run ('' when they can): unknown names, a warm-started non-learner."""
    from bench_convergence import WS_SUFFIX, split_method
    from graphs.errors import PlacerError
    from policies.registry import policy_entry

    for method in methods:
        try:
            takes = policy_entry(split_method(method)[0]).takes_warm_start
        except PlacerError as exc:
            return f"--methods: {exc}"
        if method.endswith(WS_SUFFIX) and not takes:
            return f"--methods: {method!r}: that policy takes no warm start ({WS_SUFFIX})"
    return ""


def heuristic_problem(references: list[str], split_groups: str) -> str:
    """Why ``--references`` or ``--split-groups`` name something that is not a heuristic ('' when all are)."""
    from policies.registry import heuristic_choices, is_heuristic

    wrong = [name for name in references + ([split_groups] if split_groups else []) if not is_heuristic(name)]
    return f"not a heuristic: {', '.join(wrong)} (heuristics: {heuristic_choices()})" if wrong else ""


def is_learned(method: str) -> bool:
    from bench_convergence import split_method
    from policies.registry import policy_entry

    return policy_entry(split_method(method)[0]).learned


def mean_or_nan(values: list) -> float:
    finite = [v for v in values if v is not None]
    return sum(finite) / len(finite) if finite and len(finite) == len(values) else math.nan


def row_table(graph: str, machine: str, methods: list[str], seeds: list[int], records: list[dict]) -> list[str]:
    """The markdown lines of one row: each method's mean and per-seed best, and the verdicts."""
    by = {(r["method"], r["seed"]): r for r in records if r["graph"] == graph and r["machine"] == machine}
    some = next((r for r in by.values() if r.get("lower_bound_s")), None)
    lower = some["lower_bound_s"] if some else math.nan
    lines = [f"### {graph} on {machine}", "", "| method | mean best (s) | per seed | x lower bound |",
             "|---|---|---|---|"]
    means = {}
    for method in methods:
        cells = [by.get((method, seed)) for seed in seeds]
        values = [None if c is None else c.get("best_s") for c in cells]
        means[method] = mean_or_nan(values)
        per_seed = " / ".join("-" if c is None else "error" if c.get("error") else
                              "fail" if c["best_s"] is None else f"{c['best_s']:.4f}" for c in cells)
        mean = means[method]
        lines.append(f"| {method} | {'-' if math.isnan(mean) else f'{mean:.4f}'} | {per_seed} | "
                     f"{'-' if math.isnan(mean / lower) else f'{mean / lower:.2f}'} |")
    refs = some["references"] if some else {}
    for name in refs:
        value = refs.get(name)
        lines.append(f"| _{name}_ | {'-' if value is None else f'{value:.4f}'} | | "
                     f"{'-' if value is None else f'{value / lower:.2f}'} |")
    lines.append(f"| _lower bound_ | {lower:.4f} | | 1.00 |")
    lines += ["", verdict(means, refs.get("expert")), "", against_all(means, refs)]
    return lines


def against_all(means: dict[str, float], refs: dict[str, float | None]) -> str:
    """The best learned method against every non-learned one run on the row: searches (warm-started ones
    too) and the heuristics scored beside them."""
    learned = learned_means(means)
    rivals = [(v, m) for m, v in means.items() if not is_learned(m) and not math.isnan(v)]
    rivals += [(v, f"_{name}_") for name, v in refs.items() if v is not None]
    if not learned or not rivals:
        return "against every non-learned method: cannot tell"
    (best_s, best), (rival_s, rival) = min(learned), min(rivals)
    return (f"against every non-learned method: best learned {best} {best_s:.4f} s vs {rival} {rival_s:.4f} s "
            f"({best_s / rival_s - 1:+.1%}): at or below: **{'yes' if best_s <= rival_s else 'no'}**")


def learned_means(means: dict[str, float]) -> list[tuple[float, str]]:
    """(mean, method) of every learned method with a mean."""
    return [(v, m) for m, v in means.items() if is_learned(m) and not math.isnan(v)]


def verdict(means: dict[str, float], expert_s: float | None) -> str:
    learned = learned_means(means)
    searches = [m for m in SEARCHES if m in means and not math.isnan(means[m])]
    if not learned or not searches:
        return "verdict: cannot tell (a learned method or both searches missing)"
    best_s, best = min(learned)
    target = min(means[m] for m in searches)
    at_or_below = "yes" if best_s <= target else "no"
    vs_expert = "-" if expert_s is None else ("yes" if best_s < expert_s else "no")
    return (f"verdict: best learned {best} {best_s:.4f} s vs min({', '.join(searches)}) {target:.4f} s "
            f"({best_s / target - 1:+.1%}): at or below: **{at_or_below}**; below the expert: **{vs_expert}**")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), metavar="GRAPH:MACHINE")
    parser.add_argument("--nmt8", action="store_true", help=f"add {', '.join(NMT8_ROWS)}")
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--grouping", default="scope")
    parser.add_argument("--batch", type=int, default=16, help="learners' placements per iteration")
    parser.add_argument("--hidden", type=int, default=256, help="learners' hidden size")
    parser.add_argument("--planner-groups", type=int, default=256,
                        help="hierarchical: the groups its grouper makes (default 256, the paper's)")
    parser.add_argument("--references", nargs="+", default=list(REFERENCES), metavar="HEURISTIC",
                        help=f"heuristics scored on each row beside the searches (default {' '.join(REFERENCES)}; "
                             f"jobs already in --out keep the ones they were run with)")
    parser.add_argument("--split-groups", default="", metavar="HEURISTIC",
                        help="split the groups by this heuristic's devices, as `placer search --split-groups`")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--out", default="runs/bench_learned_vs_search.jsonl", help="JSON lines, one per job")
    parser.add_argument("--report-only", action="store_true", help="print the table from --out, run nothing")
    args = parser.parse_args()

    rows = [tuple(r.rsplit(":", 1)) for r in args.rows + (list(NMT8_ROWS) if args.nmt8 else [])]
    if any(len(r) != 2 for r in rows):
        parser.error("--rows take GRAPH:MACHINE")
    problem = method_problem(args.methods) or heuristic_problem(args.references, args.split_groups)
    if problem:
        parser.error(problem)
    jobs = [Job(graph, machine, method, seed, args.budget, args.groups, args.grouping, args.batch, args.hidden,
                args.planner_groups, " ".join(args.references), args.split_groups)
            for graph, machine in rows for method in args.methods for seed in args.seeds]
    out = Path(args.out)
    todo = pending_jobs(jobs, read_records(out))
    if not args.report_only and todo:
        print(f"{len(todo)} of {len(jobs)} jobs to run ({len(jobs) - len(todo)} done in {out}), {args.jobs} workers",
              file=sys.stderr, flush=True)
        run_jobs(todo, out, args.jobs)
    records = latest_records(jobs, read_records(out))
    split = f", split by {args.split_groups}'s devices" if args.split_groups else ""
    print(f"Simulator, budget {args.budget}, {args.groups} {args.grouping} groups{split} (hierarchical: "
          f"{args.planner_groups} of its own), batch {args.batch}, hidden {args.hidden}, seeds {args.seeds}; "
          f"results in {out}\n")
    for graph, machine in rows:
        print("\n".join(row_table(graph, machine, args.methods, args.seeds, records)) + "\n", flush=True)


if __name__ == "__main__":
    main()
