"""`placer analyze RUN_OR_EXPERIMENT_DIR [...]`: a summary table of run logs, and plots with ``--plots DIR``.

Reads the Parquet run logs alone (cluster/analysis.py), so it works on a run that is still being written
or one that was killed. ``--plots`` adds, per run, the learning curve, the best placement's simulated
timeline (Gantt chart and Chrome trace) and per-device load (cluster/plots.py).
"""

from __future__ import annotations

import math
from pathlib import Path

from cluster.commands.paths import lies_in, output_folder
from cluster.jsonout import emit_json


def register(subparsers) -> None:
    p = subparsers.add_parser("analyze", help="summarize run logs (one row per run) and plot them",
                              description="Each path is a run folder or a folder with run folders below it "
                                          "(e.g. an experiment of placer reproduce).")
    p.add_argument("paths", nargs="+", metavar="RUN_OR_EXPERIMENT_DIR")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    p.add_argument("--plots", default=None, metavar="DIR", type=output_folder,
                   help="write PNG plots and the best placement's Chrome trace of every run into DIR")
    p.set_defaults(func=run)


def run(args) -> int:
    from cluster.analysis import summarize

    summaries = summarize(args.paths)
    plots = []
    if args.plots:
        from cluster.plots import check_plot_paths, read_run_to_plot, write_run_plots

        _check_plots_outside_runs(args.plots, summaries)
        to_plot = _distinct_names([read_run_to_plot(s.run_dir) for s in summaries])  # all checked before writing
        check_plot_paths(to_plot, args.plots)
        _check_plot_links_outside_runs(to_plot, args.plots, summaries)
        plots = [write_run_plots(logged, args.plots, s.lower_bound_s) for logged, s in zip(to_plot, summaries)]
    if args.json:
        payload = [s.to_json() for s in summaries]
        for entry, made in zip(payload, plots):
            entry["plots"] = {k: (None if v is None else str(v)) for k, v in vars(made).items()}
        emit_json(payload)
    else:
        print_summaries(summaries)
        for made in plots:
            written = [str(v) for v in vars(made).values() if v is not None]
            print("\n".join(written))
    return 0


def _num(x: float, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def print_summaries(summaries) -> None:
    from cluster.commands.console import text_console
    from rich.table import Table

    from cluster.jobs.config import BASELINES_POLICY

    table = Table(title=f"{len(summaries)} run(s)")
    headers = ("graph", "machine", "policy", "policy best (s)", "x lower bound", "x proven bound", "x best baseline",
               "measurements", "failures", "log wall (s)", "meas/s", "state", "run")
    for header in headers:
        table.add_column(header, justify="left" if header in ("graph", "machine", "policy", "failures", "state",
                                                               "run") else "right")
    for s in summaries:
        failures = ", ".join(f"{k} {v}" for k, v in sorted(s.failures.items())) or "none"
        baseline = _num(s.ratio_to_best_baseline, ".3f")
        if s.best_baseline:
            baseline += f" ({s.best_baseline})"
        table.add_row(s.graph, s.machine, s.policy or "-", _num(s.policy_best_runtime_s, ".4g"),
                      _num(s.ratio_to_lower_bound, ".3f"), _num(s.ratio_to_proven_bound, ".3f"), baseline,
                      measurements_cell(s), failures,
                      _num(s.wall_s, ".1f"), _num(s.measurements_per_s, ".2f"),
                      "finished" if s.finished else "running or stopped", s.run_id)
    # wide enough for every cell whole: cut to 240 columns, two run ids of one graph and policy started the
    # same hour printed alike, and the lines below the table name runs by the whole id
    console = text_console(width=max(240, text_console(width=10_000).measure(table).maximum))
    console.print(table)
    _print_proven_bounds(console, summaries)
    for s in summaries:
        if s.overall_best_source and s.overall_best_source != s.policy and s.policy != BASELINES_POLICY:
            console.print(f"{s.run_id}: its overall best, {s.overall_best_runtime_s:.4g} s, was found by "
                          f"{s.overall_best_source}, not by {s.policy} ({_best_file_text(s.run_dir)})")
        if s.best_baseline_run:
            console.print(f"{s.run_id}: its best baseline, {s.best_baseline}, was logged by run {s.best_baseline_run} "
                          f"(same graph, machine, measurer, noise and timing)")
    for s in summaries:
        for removed in s.removed_devices:
            console.print(f"{s.run_id}: {removed.device} left after {removed.at_measurement} measurements (then "
                          f"{removed.machine_after}); its bests count only placements without it")


def _best_file_text(run_dir) -> str:
    from cluster.runlog import BEST_FILE

    return f"{BEST_FILE} holds it" if (Path(run_dir) / BEST_FILE).is_file() else f"its {BEST_FILE} is missing"


def measurements_cell(s) -> str:
    """The run's policy's measurements, as `placer search` counts them against its budget (cache hits included),
    then the other policies' rows scored in the run (its baselines) and the cache hits among all rows."""
    from cluster.jobs.config import BASELINES_POLICY

    others = 0 if s.policy == BASELINES_POLICY else s.measurements + s.cache_hits - s.policy_measurements
    notes = ([f"+{others} others"] if others else []) + ([f"{s.cache_hits} cached"] if s.cache_hits else [])
    return f"{s.policy_measurements}" + (f" ({', '.join(notes)})" if notes else "")


def _print_proven_bounds(console, summaries) -> None:
    """Which placements each distinct proven bound holds for; a graph and machine with several bounds (graphs
    of one name, other groupings) name their runs."""
    from collections import Counter

    bounds: dict[tuple, list[str]] = {}
    for s in summaries:
        if math.isfinite(s.proven_bound_s):
            key = (s.graph, s.machine, s.proven_bound_holds_for, s.proven_bound_s)
            bounds.setdefault(key, []).append(s.run_id)
    per_pair = Counter((graph, machine) for graph, machine, _, _ in bounds)
    digits = _distinct_digits([key[3] for key in bounds])
    for (graph, machine, holds_for, bound_s), run_ids in bounds.items():
        which = f" (run{'s' * (len(run_ids) > 1)} {', '.join(run_ids)})" if per_pair[(graph, machine)] > 1 else ""
        console.print(f"{graph} on {machine}: proven bound {bound_s:.{digits}g} s holds for {holds_for}{which}")


def _distinct_digits(values_s: list[float]) -> int:
    """Significant digits (4 or more) that print distinct bounds apart: two solves of one problem that stop
    at their time limit differ in the 5th digit, and their lines read as one printed twice."""
    distinct = set(values_s)
    for digits in range(4, 17):
        if len({format(v, f".{digits}g") for v in distinct}) == len(distinct):
            return digits
    return 17


def _check_plots_outside_runs(plots_dir: str, summaries) -> None:
    """--plots may not be, or lie in, a run folder analyze reads: PNGs written into its measurements/
    folder were read back as damaged log parts."""
    from graphs.errors import PlacerError

    for summary in summaries:
        if lies_in(plots_dir, Path(summary.run_dir).resolve()):
            raise PlacerError(f"--plots {plots_dir} lies inside the run folder {summary.run_dir}, which analyze "
                              f"only reads: write the plots elsewhere")


def _check_plot_links_outside_runs(to_plot: list, plots_dir: str, summaries) -> None:
    """A plot file in --plots that is a link into a run folder analyze reads (a trace linked to a manifest):
    the plot was written through it, over the run's file."""
    from cluster.plots import run_plot_paths
    from graphs.errors import PlacerError

    for run in to_plot:
        for path in filter(None, vars(run_plot_paths(run, plots_dir)).values()):  # links followed
            for summary in summaries:
                if lies_in(path, Path(summary.run_dir).resolve()):
                    raise PlacerError(f"--plots: {path}, where run {run.run_id}'s plot would be written, lies "
                                      f"inside the run folder {summary.run_dir}, which analyze only reads")


def _distinct_names(runs: list) -> list:
    """Copies of one run (the same run id in two folders) get ``-2``, ``-3``... (a suffix no run read has:
    make_run_id names a second run started in the same second ``-2`` too) so their plots do not overwrite
    each other's."""
    from dataclasses import replace

    taken = {run.run_id for run in runs}
    seen: set[str] = set()
    named = []
    for run in runs:
        if run.run_id not in seen:
            seen.add(run.run_id)
            named.append(run)
            continue
        copy = 2
        while f"{run.run_id}-{copy}" in taken:
            copy += 1
        taken.add(f"{run.run_id}-{copy}")
        named.append(replace(run, run_id=f"{run.run_id}-{copy}"))
    return named
