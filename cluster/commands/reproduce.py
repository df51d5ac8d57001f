"""`placer reproduce EXPERIMENT`: run a paper's table (cluster/experiments.py) and print it beside the paper's.

Each row's searches are run folders under ``<out>/<experiment>/``; running the command again skips the
finished ones and resumes the rest. ``--quick`` shrinks every budget so the whole table takes minutes.
"""

from __future__ import annotations

import math
import sys
import time

from cluster.commands.paths import runs_folder
from cluster.jsonout import emit_json
from graphs.errors import PlacerError

HEADERS = {"cpu-only": "CPU only", "single-gpu": "1 GPU", "metis": "METIS\n(Scotch/MinCut)", "expert": "expert",
           "m-etf": "m-ETF", "m-sct": "m-SCT", "annealing": "annealing",
           "reinforce": "RL\n(REINFORCE)", "hierarchical": "RL\n(hierarchical)"}
DEFAULT_OUT = "runs/reproduce"


def default_out(quick: bool) -> str:
    """The folder experiments are made in without --out: quick runs apart from full ones. Checked as --out is."""
    from argparse import ArgumentTypeError

    text = DEFAULT_OUT + ("-quick" if quick else "")
    try:
        return runs_folder(text)
    except ArgumentTypeError as exc:
        raise PlacerError(f"--out (default {text}): {exc}") from None


def columns(experiment) -> tuple[tuple[str, str], ...]:
    """(method, header) of each column: the experiment's methods, its learned policy among them."""
    return tuple((m, HEADERS.get(m, f"RL\n({m})")) for m in experiment.methods)


def register(subparsers) -> None:
    from cluster.experiments import EXPERIMENTS, QUICK, Settings

    p = subparsers.add_parser("reproduce", help="run a paper's experiment and compare with its published table",
                              description="Rows are run folders under OUT/EXPERIMENT; an interrupted run "
                                          "continues where it stopped when the command is run again.")
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--measurer", default="sim", choices=("sim", "torch", "tf"))
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help=f"measurements per search (default {Settings.budget}; --quick: {QUICK.budget})")
    p.add_argument("--groups", type=int, default=None, metavar="G",
                   help=f"groups to place (default {Settings.groups})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", nargs="+", default=(), metavar="ROW",
                   help="run and show only these rows: GRAPH (on every machine) or GRAPH:MACHINE")
    p.add_argument("--quick", action="store_true", help="small budgets: the whole table in a few minutes")
    p.add_argument("--out", default=None, metavar="DIR", type=runs_folder,
                   help=f"folder the experiment folder is made in (default {DEFAULT_OUT}; with --quick "
                        f"{DEFAULT_OUT}-quick)")
    p.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one (or RAY_ADDRESS)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from cluster.experiments import (cell_results, check_experiment_folder, get_experiment, run_experiment,
                                     settings_for)

    experiment = get_experiment(args.experiment).select(args.rows)
    settings = settings_for(args.quick, args.measurer, args.budget, args.groups, args.seed)
    out = args.out if args.out is not None else default_out(args.quick)
    check_experiment_folder(experiment, out, settings)  # before the banner: bad input is one line
    if args.ray_address:
        from cluster.ray_setup import check_reachable
        check_reachable(args.ray_address)  # before the experiment folder is written

    def banner() -> None:
        if settings.quick:
            print(f"QUICK run of {experiment.name}: {settings.budget} measurements per search, {settings.groups} "
                  f"groups — a smoke test, not the paper's budget", file=sys.stderr)

    started = time.perf_counter()
    folder = run_experiment(experiment, out, settings, on_event=_print_event, ray_address=args.ray_address,
                            on_start=banner)
    elapsed_s = time.perf_counter() - started
    results = cell_results(experiment, folder)
    if args.json:
        emit_json(result_json(experiment, settings, results, folder, elapsed_s, args.rows))
    else:
        print_table(experiment, settings, results, folder, elapsed_s, args.rows)
    return 0


def result_json(experiment, settings, results, folder, elapsed_s: float, rows=()) -> dict:
    """The --json payload: ``settings.batch`` is the batch the learned runs used (null when rows differ: each
    row's ``rl_batch``), not the one a new run would take."""
    from dataclasses import asdict

    from cluster.experiments import batch_used

    return {"experiment": experiment.name, "title": experiment.title, "learned": experiment.learned,
            "quick": settings.quick, "selected_rows": list(rows),
            "settings": {**asdict(settings), "batch": batch_used(results, settings.batch)},
            "folder": str(folder), "elapsed_s": elapsed_s, "rows": [r.to_json() for r in results]}


def _batch_text(settings, results) -> str:
    """The RL batch the rows used: one number, or each row's when a resumed run kept another."""
    from cluster.experiments import batch_used

    batch = batch_used(results, settings.batch)
    if batch is not None:
        return str(batch)
    return ", ".join(f"{r.rl_batch} ({r.cell.graph} on {r.cell.gpus} GPUs)" for r in results if r.rl_batch is not None)


def _print_event(event) -> None:
    where = f"[{event.index}/{event.total}] {event.cell.graph} on {event.cell.machine}, {event.policy}"
    if event.action == "done":
        best = f"best {event.best_s:.4g} s" if math.isfinite(event.best_s) else "no ok placement"
        print(f"{where}: done, {best}, {event.wall_s:.0f} s", file=sys.stderr, flush=True)
    else:
        print(f"{where}: {event.action}", file=sys.stderr, flush=True)


def _fmt(runtime_s: float, status: str) -> str:
    if math.isfinite(runtime_s):
        return f"{runtime_s:.3f}"
    return {"oom": "OOM", "not run": "-"}.get(status, status.split(":")[0])


def _paper_cells(paper, learned: str) -> dict[str, str]:
    def f(x):
        return "OOM" if x is None else "-" if math.isnan(x) else f"{x:.2f}"

    return {"cpu-only": f(paper.cpu_s), "single-gpu": f(paper.gpu_s),
            "metis": f"{paper.scotch_s:.2f} / {paper.mincut_s:.2f}", "expert": f(paper.expert_s),
            learned: f(paper.rl_s)}


def _searched_text(settings, results) -> str:
    """The groups the rows' runs searched, each count with its method ("194 scope, 256 metis groups": scope can
    give fewer than --groups, and falls back to metis), from their result.json; the settings' where none says."""
    pairs = sorted({(r.groups, r.grouping or settings.grouping) for r in results if r.groups is not None})
    if not pairs:
        return f"{settings.groups} {settings.grouping} groups"
    unknown = any(r.groups is None for r in results)  # runs of an older version record no count
    return ", ".join(f"{count} {method}" for count, method in pairs) + " groups" + (" where known" if unknown else "")


def print_table(experiment, settings, results, folder, elapsed_s: float, rows=()) -> None:
    from cluster.commands.console import text_console
    from rich.table import Table
    from rich.text import Text

    from cluster.experiments import get_experiment

    quick = " [QUICK: small budgets, not the paper's]" if settings.quick else ""
    table = Table(title=f"{experiment.title}: seconds per training step ({settings.measurer}){quick}")
    cols = columns(experiment)
    for header in ("model", "GPUs", "source", *(h for _, h in cols), "lower bound", "proven bound",
                   "best x proven", "RL vs best baseline"):
        table.add_column(header, justify="left" if header in ("model", "source") else "right")
    for r in results:
        cells = [_fmt(r.methods[m].runtime_s, r.methods[m].status) for m, _ in cols]
        if r.winner:
            i = [m for m, _ in cols].index(r.winner)
            cells[i] = Text(cells[i], style="bold")
        gain = "-" if math.isnan(r.rl_gain) else f"{r.rl_gain:+.1%} ({r.best_baseline})"
        lower = "-" if math.isnan(r.lower_bound_s) else f"{r.lower_bound_s:.3f}"
        proven = "-" if math.isnan(r.proven_bound_s) else f"{r.proven_bound_s:.3f}"
        to_proven = "-" if math.isnan(r.ratio_to_proven_bound) else f"{r.ratio_to_proven_bound:.2f}"
        table.add_row(r.cell.graph, str(r.cell.gpus), "here", *cells, lower, proven, to_proven, gain)
        if r.cell.paper is not None:
            paper = _paper_cells(r.cell.paper, experiment.learned)
            table.add_row("", "", "paper (approx.)", *(paper.get(m, "") for m, _ in cols), "", "", "",
                          f"{r.cell.paper.rl_gain:+.1%}", style="dim")
    console = text_console(width=220)
    console.print(table)
    console.print("Does the paper's conclusion hold here?")
    for r in results:
        for claim in r.claims:
            verdict = {True: "holds", False: "differs", None: "cannot tell"}[claim.holds]
            console.print(f"  {r.cell.graph} on {r.cell.gpus} GPUs, {claim.what}: paper {claim.paper}; "
                          f"here {claim.here} -> {verdict}")
    measured = sum(r.measurements for r in results)
    wall = sum(r.wall_s for r in results)
    unfinished = [r.cell.folder_name for r in results if not r.finished]
    console.print(f"{experiment.notes}. Bold: fastest method here. Proven bound (placer bound): for placements "
                  f"of the searched groups ({_searched_text(settings, results)}) when above the lower "
                  f"bound; best x proven: the fastest method over it (heuristics place finer groups and may go "
                  f"below it).")
    console.print(f"budget {settings.budget} measurements per search (RL batch {_batch_text(settings, results)}), "
                  f"{settings.groups} groups asked, seed {settings.seed}; {measured} measurements, "
                  f"{wall:.0f} s of search "
                  f"wall time in all runs, {elapsed_s:.0f} s this invocation{' (QUICK)' if settings.quick else ''}")
    if unfinished:
        console.print(f"unfinished rows: {', '.join(unfinished)}")
    if rows:
        every = len(get_experiment(experiment.name).cells)
        console.print(f"only the rows asked for (--rows {' '.join(rows)}): {len(results)} of the paper's {every}")
    console.print(f"experiment folder: {folder}  (placer analyze {folder} --plots DIR for curves and timelines)")
