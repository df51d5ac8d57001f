"""Issue 14's tables: do the graph-neural placers (gdp, placeto) generalize to graphs and machines they
never trained on?

Every row is a held-out graph (never in a training set) on a machine, searched as `placer search` does
(32 scope groups, the in-process simulator). References: the from-scratch REINFORCE runs of
``bench_learned_vs_search.py`` (JSON lines with their curves, ``--reinforce``), the quick heuristics
(one measurement each) and annealing. Sections::

    zero-shot   gdp and placeto (``--policies``: giph too) with --budget 1 (one forward pass, one
                measurement) on paper-2gpu/4gpu
    fine-tune   each policy from its checkpoint, --budget 204 (10x fewer than 2,048), seeds 0 1 2, cold and
                warm-started (+ws: the quick heuristics' placements, measured in the budget); annealing
                (+ws) beside them at the same budget
    devices     zero-shot on paper-8gpu, dgx1-v100, h200x8 against annealing given 64 measurements
    orders      placeto trained with each visiting order (--order-init ORDER=PATH ...): zero-shot and
                after --budget measurements; with --graphs families:12:24 --seeds 0, on validation graphs
                (family draws past the training family's 24) instead of the held-out ones
    checkpoints checkpoints of one policy (--policies P --checkpoints PATH ...), the same way as orders: with
                --graphs families:12:24 --seeds 0, the validation score that chose the committed ones

Usage::

    python tests/bench/bench_generalize.py [SECTION] [--policies gdp placeto giph] [--init-gdp PATH]
        [--init-placeto PATH] [--init-giph PATH] [--reinforce runs/bench_reinforce_heldout.jsonl]
        [--seeds 0 1 2] [--out runs/bench_generalize.jsonl] [--graphs NAME_OR_FILE ...] [--checkpoints PATH ...]

Each finished job is one JSON line in ``--out``; a rerun skips the jobs already there. The REINFORCE
references missing from ``--reinforce`` are run first (bench_learned_vs_search.py's jobs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
sys.path.insert(0, str(Path(__file__).parent))

from bench_learned_vs_search import read_records as read_lines  # noqa: E402
from cluster.commands.train import expand_graphs  # noqa: E402
from graphs.families import HELD_OUT  # noqa: E402
from policies.rl.gnn.config import KINDS  # noqa: E402  gdp, placeto and giph (issue 15's, on the same encoder)

PAPER_MACHINES = ("paper-2gpu", "paper-4gpu")
OTHER_MACHINES = ("paper-8gpu", "dgx1-v100", "h200x8")
FINE_TUNE_BUDGET = 204
ANNEALING_BUDGET = 64


def problem_for(graph_name: str, machine_name: str):
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem

    graph, machine = load_graph(graph_name), load_machine(machine_name)
    return make_problem(graph, machine, max_groups=32, grouping_method="scope"), SimulatorMeasurer(graph, machine)


def run_job(job: dict) -> dict:
    """One job: {"kind": zero-shot|fine-tune|quick|annealing, graph, machine, policy, seed, budget, init, order}."""
    import torch

    from graphs.errors import PlacerError
    from policies.registry import place

    torch.set_num_threads(1)
    problem, measurer = problem_for(job["graph"], job["machine"])
    started = time.perf_counter()
    record = dict(job)
    if job["kind"] == "quick":
        runtimes = {}
        from policies.registry import QUICK_HEURISTICS
        for name in QUICK_HEURISTICS:
            try:
                best = place(name, problem, measurer, 1, 0).best
            except PlacerError:
                continue
            runtimes[name] = best.runtime_s if best.ok else None
        record["runtimes"] = runtimes
    else:
        options = {}
        if job["policy"] in KINDS:
            options["init"] = job["init"]
            if job.get("order"):
                options["order"] = job["order"]
        if job.get("warm_start"):  # the quick heuristics' placements, best first, measured in the budget
            options["warm_start"] = _warm_start(job["graph"], job["machine"], problem, measurer)
        curve: list[float] = []
        best_so_far = [math.inf]

        def on_measurement(_placement, measurement):
            if measurement.ok:
                best_so_far[0] = min(best_so_far[0], measurement.runtime_s)
            curve.append(best_so_far[0])
        result = place(job["policy"], problem, measurer, job["budget"], job["seed"], on_measurement, **options)
        record["best_s"] = result.best.runtime_s if result.best is not None and result.best.ok else None
        record["measurements"] = result.measurements
        record["curve"] = {str(n): (curve[n - 1] if math.isfinite(curve[n - 1]) else None)
                           for n in sorted({1, 8, 16, 32, 64, 128, len(curve)}) if 1 <= n <= len(curve)}
    record["wall_s"] = time.perf_counter() - started
    return record


_WARM_STARTS: dict[tuple[str, str], list] = {}


def _warm_start(graph: str, machine: str, problem, measurer) -> list:
    """The quick heuristics' op placements, fastest first, once per row (m-SCT takes 20 s on nmt-8)."""
    from bench_convergence import warm_start_placements

    if (graph, machine) not in _WARM_STARTS:
        _WARM_STARTS[graph, machine] = warm_start_placements(problem, measurer)
    return _WARM_STARTS[graph, machine]


def key(job: dict) -> str:
    return json.dumps({k: job.get(k) for k in ("kind", "graph", "machine", "policy", "seed", "budget", "init", "order",
                                               "warm_start")}, sort_keys=True)


def run_all(jobs: list[dict], out: Path) -> list[dict]:
    done = {key(r): r for r in read_lines(out)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as sink:
        for i, job in enumerate(jobs, 1):
            if key(job) in done:
                continue
            record = run_job(job)
            done[key(job)] = record
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            print(f"[{i}/{len(jobs)}] {job['kind']} {job['graph']} {job['machine']} {job.get('policy', '')} "
                  f"seed {job.get('seed')}: {record.get('best_s', '')} ({record['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    return [done[key(job)] for job in jobs]


def ensure_reinforce_reference(path: Path, rows, seeds) -> None:
    """Run the from-scratch REINFORCE references (bench_learned_vs_search's jobs, 2,048 measurements) that
    ``path`` does not hold yet, so the tables always have their reference."""
    from bench_learned_vs_search import Job, pending_jobs, read_records, run_jobs

    jobs = [Job(g, m, "reinforce", seed, 2048, 32, "scope", 16, 256) for g, m in rows for seed in seeds]
    todo = pending_jobs(jobs, read_records(path))
    if todo:
        print(f"{len(todo)} REINFORCE reference runs to do first, into {path}", file=sys.stderr, flush=True)
        run_jobs(todo, path, 1)


def reinforce_reference(path: Path) -> dict[tuple[str, str], list[dict]]:
    """(graph, machine) -> the from-scratch REINFORCE records (each with best_s and its curve)."""
    refs: dict[tuple[str, str], list[dict]] = {}
    for record in sorted(read_lines(path), key=lambda r: r.get("seed", 0)):  # seed order, as the tables print
        if record.get("method") == "reinforce" and record.get("best_s") is not None:
            refs.setdefault((record["graph"], record["machine"]), []).append(record)
    return refs


def quick_best(records: list[dict], graph: str, machine: str) -> tuple[str, float]:
    runtimes = next(r["runtimes"] for r in records if r["kind"] == "quick" and r["graph"] == graph
                    and r["machine"] == machine)
    ok = {k: v for k, v in runtimes.items() if v is not None}
    name = min(ok, key=ok.get)
    return name, ok[name]


def mean(values) -> float:
    """The mean, nan when any value is missing (a failed run must not make a row look better)."""
    values = list(values)
    return sum(values) / len(values) if values and all(v is not None for v in values) else math.nan


def zero_shot_section(args, rows) -> None:
    jobs = [dict(kind="quick", graph=g, machine=m) for g, m in rows]
    jobs += [dict(kind="zero-shot", graph=g, machine=m, policy=p, seed=0, budget=1, init=args.init[p])
             for g, m in rows for p in args.policies]
    records = run_all(jobs, args.out)
    refs = reinforce_reference(args.reinforce)
    print("| graph | machine | " + " | ".join(f"{p} zero-shot (s)" for p in args.policies) +
          " | best quick (s) | REINFORCE 2,048 mean (s) | best zero-shot / REINFORCE | within 10% | <= best quick |")
    print("|---" * (len(args.policies) + 7) + "|")
    for g, m in rows:
        shots = {p: next(r["best_s"] for r in records if r["kind"] == "zero-shot" and r["graph"] == g and
                         r["machine"] == m and r["policy"] == p) for p in args.policies}
        name, quick = quick_best(records, g, m)
        ref = mean(r["best_s"] for r in refs.get((g, m), []))
        best = min((v for v in shots.values() if v is not None), default=math.inf)
        cells = " | ".join("fail" if v is None else f"{v:.4f}" for v in shots.values())
        print(f"| {g} | {m} | {cells} | {quick:.4f} ({name}) | {ref:.4f} | {best / ref:.3f} | "
              f"{'yes' if best <= 1.1 * ref else 'no'} | {'yes' if best <= quick * (1 + 1e-9) else 'no'} |")


def fine_tune_section(args, rows) -> None:
    """Each policy from its checkpoint, and annealing (the non-learned rival) at the same budget and seeds."""
    policies = [*args.policies, "annealing"]
    jobs = [dict(kind="fine-tune", graph=g, machine=m, policy=p, seed=s, budget=args.budget, init=args.init.get(p),
                 warm_start=ws) for g, m in rows for p in policies for s in args.seeds for ws in (False, True)]
    records = run_all(jobs, args.out)
    refs = reinforce_reference(args.reinforce)
    print(f"| graph | machine | policy | best after {args.budget} (mean; per seed) | REINFORCE 2,048 (mean) | "
          "ratio | within 5% | REINFORCE's measurements to within 5% of its own final |")
    print("|---" * 8 + "|")
    for g, m in rows:
        ref_runs = refs.get((g, m), [])
        ref = mean(r["best_s"] for r in ref_runs)
        needed = [_first_within(r["curve"], r["best_s"] * 1.05) for r in ref_runs]
        for p in policies:
            for ws in (False, True):
                mine = [r["best_s"] for r in records if r["kind"] == "fine-tune" and r["graph"] == g and
                        r["machine"] == m and r["policy"] == p and bool(r.get("warm_start")) == ws]
                value = mean(mine)
                seeds = " / ".join("fail" if v is None else f"{v:.4f}" for v in mine)
                print(f"| {g} | {m} | {p}{'+ws' if ws else ''} | {value:.4f}; {seeds} | {ref:.4f} | "
                      f"{value / ref:.3f} | {'yes' if value <= 1.05 * ref else 'no'} | "
                      f"{' / '.join(str(n) for n in needed)} |")


def _first_within(curve: dict, target_s: float) -> str:
    for n in sorted(curve, key=int):
        if curve[n] is not None and curve[n] <= target_s:
            return f"<= {n}"
    return "-"


def devices_section(args) -> None:
    rows = [(g, m) for m in OTHER_MACHINES for g in HELD_OUT]
    jobs = [dict(kind="zero-shot", graph=g, machine=m, policy=p, seed=0, budget=1, init=args.init[p])
            for g, m in rows for p in args.policies]
    jobs += [dict(kind="annealing", graph=g, machine=m, policy="annealing", seed=s, budget=ANNEALING_BUDGET)
             for g, m in rows for s in args.seeds]
    records = run_all(jobs, args.out)
    print("| graph | machine | " + " | ".join(f"{p} zero-shot (s)" for p in args.policies) +
          f" | annealing {ANNEALING_BUDGET} (mean; per seed) | best zero-shot better |")
    print("|---" * (len(args.policies) + 4) + "|")
    for g, m in rows:
        shots = [next(r["best_s"] for r in records if r["kind"] == "zero-shot" and r["graph"] == g and
                      r["machine"] == m and r["policy"] == p) for p in args.policies]
        ann = [r["best_s"] for r in records if r["kind"] == "annealing" and r["graph"] == g and r["machine"] == m]
        best = min((v for v in shots if v is not None), default=math.inf)
        print(f"| {g} | {m} | " + " | ".join("fail" if v is None else f"{v:.4f}" for v in shots) +
              f" | {mean(ann):.4f}; {' / '.join('fail' if v is None else f'{v:.4f}' for v in ann)} | "
              f"{'yes' if best < mean(ann) else 'no'} |")


def orders_section(args, rows) -> None:
    """Placeto trained with each visiting order (one checkpoint each, the same problems and budget), each
    used with its own order: zero-shot, and the mean best after ``--budget`` measurements over the seeds."""
    orders = dict(item.split("=", 1) for item in args.order_init)
    _variants_section(args, rows, "placeto", {order: dict(init=path, order=order) for order, path in orders.items()})


def checkpoints_section(args, rows) -> None:
    """Checkpoints of one policy (the first of ``--policies``) side by side, e.g. training runs of other seeds:
    with ``--graphs families:12:24 --seeds 0``, the validation score that chose the committed checkpoints
    (BENCHMARKS.md, issue 14, "The committed checkpoints")."""
    _variants_section(args, rows, args.policies[0], {path: dict(init=path) for path in args.checkpoints})


def _variants_section(args, rows, policy: str, variants: dict[str, dict]) -> None:
    """Each variant (label -> the job fields it sets: init, order) zero-shot and after ``--budget``
    measurements on every row, then the geometric means and the score sqrt(zero-shot x tuned)."""
    jobs = [dict(kind=kind, graph=g, machine=m, policy=policy, seed=s, budget=budget, **fields)
            for g, m in rows for fields in variants.values()
            for kind, budget, seeds in (("zero-shot", 1, [0]), ("fine-tune", args.budget, args.seeds)) for s in seeds]
    records = run_all(jobs, args.out)
    print("| graph | machine | " + " | ".join(f"{v}: zero-shot / {args.budget}" for v in variants) + " |")
    print("|---" * (len(variants) + 2) + "|")
    totals = {label: [] for label in variants}
    for g, m in rows:
        cells = []
        for label, fields in variants.items():
            mine = [r for r in records if r["graph"] == g and r["machine"] == m and r["policy"] == policy
                    and all(r.get(k) == fields.get(k) for k in ("init", "order"))]
            shot = mean(r["best_s"] for r in mine if r["kind"] == "zero-shot")
            tuned = mean(r["best_s"] for r in mine if r["kind"] == "fine-tune")
            totals[label].append((shot, tuned))
            cells.append(f"{shot:.4f} / {tuned:.4f}")
        print(f"| {g} | {m} | " + " | ".join(cells) + " |")
    print("| geometric mean over the rows | | " + " | ".join(
        f"{_geomean(v[0] for v in totals[label]):.4f} / {_geomean(v[1] for v in totals[label]):.4f}"
        for label in variants) + " |")
    print("| score: geometric mean of sqrt(zero-shot x tuned) | | " + " | ".join(
        f"{_geomean(math.sqrt(shot * tuned) for shot, tuned in totals[label]):.4f}" for label in variants) + " |")


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", nargs="?", default="all", choices=("all", "zero-shot", "fine-tune", "devices", "orders", "checkpoints"),
                        help="all (the default): zero-shot, fine-tune, devices, and orders when --order-init is given")
    parser.add_argument("--policies", nargs="+", default=["gdp", "placeto"], choices=KINDS)
    for kind in KINDS:
        parser.add_argument(f"--init-{kind}", default="pretrained")
    parser.add_argument("--order-init", nargs="*", default=[], metavar="ORDER=PATH")
    parser.add_argument("--checkpoints", nargs="*", default=[], metavar="PATH",
                        help="checkpoints section: checkpoints of the first --policies ('pretrained': the committed one)")
    parser.add_argument("--reinforce", type=Path, default=Path("runs/bench_reinforce_heldout.jsonl"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=FINE_TUNE_BUDGET)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_generalize.jsonl"))
    parser.add_argument("--graphs", nargs="+", default=list(HELD_OUT), metavar="NAME_OR_FILE",
                        help="the held-out graphs of the zero-shot, fine-tune and orders rows (default: "
                             "graphs.families.HELD_OUT; graph files from outside the project are held out too); "
                             "families:N:START as in placer train (orders on validation graphs: families:12:24)")
    args = parser.parse_args()
    args.init = {kind: getattr(args, f"init_{kind}") for kind in KINDS}
    rows = [(g, m) for g in expand_graphs(args.graphs) for m in PAPER_MACHINES]
    if args.section in ("all", "zero-shot", "fine-tune"):
        ensure_reinforce_reference(args.reinforce, rows, args.seeds)
    sections = {"zero-shot": lambda: zero_shot_section(args, rows), "fine-tune": lambda: fine_tune_section(args, rows),
                "devices": lambda: devices_section(args), "orders": lambda: orders_section(args, rows),
                "checkpoints": lambda: checkpoints_section(args, rows)}
    chosen = [args.section] if args.section != "all" else ["zero-shot", "fine-tune", "devices"] + (
        ["orders"] if args.order_init else [])
    for name in chosen:
        print(f"\n### {name}\n", flush=True)
        sections[name]()


if __name__ == "__main__":
    main()
