"""PNG plots of a run (matplotlib, Agg backend) and the best placement's Chrome trace.

    plot_learning_curve(curve, path)        step time of every measurement and the best so far,
                                            against measurements and against wall time; failures marked
    plot_timeline(graph, machine, timeline, path)
                                            the device timeline as a Gantt chart: one row per device (ops,
                                            coloured by phase) and one per transfer channel
    plot_device_load(names, busy_s, peak_bytes, capacity_bytes, path)
                                            compute busy time per device; peak memory against capacity
    plot_run(run_dir, out_dir)              all of the above for one run folder, plus <run>__trace.json
                                            (read_run_to_plot reads and checks first, check_plot_paths
                                            that no plot's path is a folder, write_run_plots writes)

The timeline is the simulator's, also for a run measured on real hardware: it shows how the cost model
sees the best placement. Only ``plot_run`` needs the graph (from a graph file or the benchmark cache,
built if missing); the learning curve needs the Parquet log alone.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError
from graphs.files import atomic_file, written_through

PHASE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "update": "#55A868", "other": "#8C8C8C"}
FAILURE_COLOUR = "#C44E52"
TRANSFER_COLOUR = "#8172B3"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Write the figure to a temporary name and rename it, so a failed plot leaves nothing half-written."""
    path = Path(path)
    try:
        with atomic_file(path) as tmp:  # the temporary name ends in ".tmp": the format comes from ``path``
            fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png")
    finally:
        _pyplot().close(fig)
    return path


def plot_learning_curve(curve, path: str | Path, title: str = "", lower_bound_s: float = math.nan) -> Path:
    """``curve``: cluster.analysis.LearningCurve. Failed measurements are drawn as red crosses at their
    step time when one is known, else along the top of the plot."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    index = np.arange(1, len(curve.seq) + 1)  # (M,) measurement number
    finite_best = np.isfinite(curve.best_so_far_s)
    known = np.isfinite(curve.runtime_s)
    top = float(np.nanmax(curve.runtime_s[known])) * 1.05 if known.any() else 1.0
    failed = ~curve.ok
    failed_y = np.where(known, curve.runtime_s, top)
    for ax, x, label in ((axes[0], index, "measurements"), (axes[1], curve.elapsed_s, "wall time (s)")):
        ax.scatter(x[curve.ok], curve.runtime_s[curve.ok], s=9, alpha=0.55, label="measured (ok)")
        if failed.any():
            ax.scatter(x[failed], failed_y[failed], s=22, marker="x", color=FAILURE_COLOUR,
                       label=f"failed ({int(failed.sum())})")
        if finite_best.any():
            ax.step(x[finite_best], curve.best_so_far_s[finite_best], where="post", color="black", lw=1.6,
                    label="best so far")
        if math.isfinite(lower_bound_s):
            ax.axhline(lower_bound_s, color="grey", ls="--", lw=1, label="lower bound")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("step time (s)")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.suptitle(title or "learning curve")
    fig.tight_layout()
    return _save(fig, Path(path))


def plot_timeline(graph, machine, timeline, path: str | Path, title: str = "") -> Path:
    """Gantt chart of a simulated step: ``timeline`` is measurers.sim.result.Timeline."""
    from graphs.opgraph import PHASES

    plt = _pyplot()
    channels = sorted({link.channel for link in machine.links})
    rows = [d.name for d in machine.devices] + [f"channel {c}" for c in channels]
    fig, ax = plt.subplots(figsize=(13, 1.0 + 0.45 * len(rows)))
    phases = np.asarray(graph.phases)
    for d in range(machine.num_devices):
        for p, phase in enumerate(PHASES):
            mine = (timeline.op_device == d) & (phases == p)
            if mine.any():
                start = timeline.op_start_s[mine]
                spans = np.column_stack([start, timeline.op_end_s[mine] - start])  # (K, 2)
                ax.broken_barh(spans, (d - 0.4, 0.8), color=PHASE_COLOURS[phase],
                               label=phase if d == _first_device_with(timeline, phases, p) else None)
    link_channel = np.array([channels.index(link.channel) for link in machine.links], dtype=np.int64)  # (L,)
    if len(timeline.transfer_op):
        row = machine.num_devices + link_channel[timeline.transfer_link]  # (T,)
        for r in np.unique(row):
            mine = row == r
            spans = np.column_stack([timeline.transfer_start_s[mine],
                                     timeline.transfer_end_s[mine] - timeline.transfer_start_s[mine]])
            ax.broken_barh(spans, (r - 0.4, 0.8), color=TRANSFER_COLOUR,
                           label="transfer" if r == row.min() else None)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("time in the step (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8, ncol=5)
    ax.set_title(title or "device timeline (simulated)")
    fig.tight_layout()
    return _save(fig, Path(path))


def _first_device_with(timeline, phases: np.ndarray, phase: int) -> int:
    devices = timeline.op_device[phases == phase]
    return int(devices.min()) if len(devices) else -1


def plot_device_load(device_names, busy_s, peak_bytes, capacity_bytes, path: str | Path, title: str = "",
                     peak_source: str = "") -> Path:
    """Two bar charts: compute busy time per device (the simulator's), and peak memory beside each device's
    capacity; ``peak_source`` says where the peaks come from when not all from one place."""
    plt = _pyplot()
    busy_s = np.asarray(busy_s, dtype=np.float64)  # (D,)
    peak_gb = np.asarray(peak_bytes, dtype=np.float64) / 1e9  # (D,)
    capacity_gb = np.asarray(capacity_bytes, dtype=np.float64) / 1e9  # (D,)
    x = np.arange(len(device_names))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    left.bar(x, busy_s, color=PHASE_COLOURS["forward"])
    left.set_ylabel("compute busy time (s)")
    left.set_title("compute per device (simulated)")
    share = np.divide(peak_gb, capacity_gb, out=np.zeros_like(peak_gb), where=capacity_gb > 0) * 100  # (D,)
    right.bar(x, share, color=np.where(share > 100, FAILURE_COLOUR, PHASE_COLOURS["update"]))
    right.axhline(100, color="black", lw=1, ls="--", label="capacity")
    for i, (peak, cap) in enumerate(zip(peak_gb, capacity_gb)):
        right.annotate(f"{peak:.3g}/{cap:.3g} GB", (i, share[i]), ha="center", va="bottom", fontsize=7)
    right.set_ylabel("peak memory (% of capacity)")
    right.set_title("peak memory against capacity (red: over)" + (f"\n{peak_source}" if peak_source else ""))
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xticks(x, list(device_names), rotation=30)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title or "per-device load")
    fig.tight_layout()
    return _save(fig, Path(path))


@dataclass(frozen=True)
class RunPlots:
    learning_curve: Path
    timeline: Path | None  # None when the run has no ok placement
    device_load: Path | None
    trace: Path | None  # Chrome trace of the best placement


@dataclass(frozen=True)
class RunToPlot:
    """What the plots of one run need, read and checked (``read_run_to_plot``) before any file is written."""
    run_id: str
    title: str
    rows: object  # pandas.DataFrame: the run's measurements (cluster.runlog.read_run)
    curve: object  # cluster.analysis.learning_curve of the searched policy
    best: object | None  # cluster.run_best.RunBest; None when the run has no ok placement, or no graph
    graph: object | None  # the graph the run placed (hash-checked); None when ``best`` is None
    op_placement: np.ndarray | None = None  # [num_ops] device of each op of ``best``, checked against ``graph``


def read_run_to_plot(run_dir: str | Path) -> RunToPlot:
    """The run's log, learning curve, best placement and graph; one PlacerError for a damaged file. A graph
    that cannot be found (its file moved) or no longer has the run's hash, or a machine whose profile file has
    moved, leaves the run without the plots of its best placement, and one note on stderr says so: the
    learning curve needs neither (a moved profile failed every run's plots)."""
    from cluster.analysis import learning_curve
    from cluster.run_best import read_run_best, run_graph
    from cluster.runlog import ran_ok, read_best, read_manifest, read_run
    from measurers.catalog import machine_from_json

    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    rows = read_run(run_dir)
    title = f"{manifest.graph_name} on {manifest.machine_name}, {manifest.policy or 'run'}"
    # the searched policy's own curve; the baselines scored in the same run are not its progress
    own = manifest.policy if manifest.policy and (rows.policy == manifest.policy).any() else None
    curve = learning_curve(rows, policy=own, manifest=manifest)  # the manifest's sessions set its wall time
    best = graph = None
    if read_best(run_dir) is not None or ran_ok(rows).any():  # (ok rows and no file: the note says it was lost)
        try:  # the machine first: a profile its file names that has moved since is a note too, as a graph is
            machine_from_json(manifest.machine, where=f"{run_dir}/manifest.json")
            best = read_run_best(run_dir)
            graph = run_graph(best)
        except PlacerError as exc:
            print(f"placer: note: no timeline of run {manifest.run_id}'s best placement: {exc}", file=sys.stderr)
            best = None
    # a best placement that does not fit its graph is a damaged run: refused here, before any plot is written
    op_placement = best.op_placement(graph) if best is not None else None
    return RunToPlot(manifest.run_id, title, rows, curve, best, graph, op_placement)


def plot_run(run_dir: str | Path, out_dir: str | Path, lower_bound_s: float = math.nan) -> RunPlots:
    """Every plot of one run, named ``<run_id>__<plot>.png``, in ``out_dir`` (made if missing)."""
    return write_run_plots(read_run_to_plot(run_dir), out_dir, lower_bound_s)


def run_plot_paths(run: RunToPlot, out_dir: str | Path) -> RunPlots:
    """Where ``write_run_plots`` writes ``run``'s plots in ``out_dir``: ``<run_id>__<plot>``; a run without a
    best placement gets the learning curve only."""
    prefix = Path(out_dir) / run.run_id
    if run.best is None:
        return RunPlots(written_through(Path(f"{prefix}__learning_curve.png")), None, None, None)
    return RunPlots(*(written_through(Path(f"{prefix}__{name}")) for name in ("learning_curve.png", "timeline.png",
                                                                               "device_load.png", "trace.json")))


def check_plot_paths(runs: Sequence[RunToPlot], out_dir: str | Path) -> None:
    """One PlacerError, before any plot is written, when a plot's path is taken by a folder, or its name is too
    long (a hand-written run id of 240 characters): the runs plotted before it kept their files (`placer
    analyze --plots` left them half-written)."""
    from graphs.files import name_too_long

    for run in runs:
        for path in vars(run_plot_paths(run, out_dir)).values():
            if path is not None and (problem := name_too_long(path.name)):
                raise PlacerError(f"--plots: run {run.run_id}'s plot {path.name} cannot be written: {problem}")
            if path is not None and path.is_dir():
                raise PlacerError(f"--plots: {path} is a folder, so run {run.run_id}'s plot cannot be written there")
            if path is not None and path.exists() and not path.is_file():
                raise PlacerError(f"--plots: {path} is not a regular file (a pipe, a device or a socket), so run "
                                  f"{run.run_id}'s plot cannot replace it")


def best_placement_caption(run: RunToPlot) -> str:
    """What the timeline shows: the run's overall best placement (best_placement.json), which a baseline scored
    in the run may have found rather than the run's policy (whose own best is the learning curve's)."""
    found_by = run.rows.loc[run.rows["seq"] == run.best.best.seq, "policy"]
    source = str(found_by.iloc[0]) if len(found_by) else "?"
    from cluster.jobs.config import BASELINES_POLICY

    policy = run.best.manifest.policy
    if source == policy or not policy or policy == BASELINES_POLICY:  # a baselines run is all baselines
        return f"overall best placement, found by {source}"
    return f"overall best placement, found by {source}, not by {policy}"


def _logged_peak_bytes(rows, seq: int, num_devices: int) -> np.ndarray | None:
    """(D,) int64 the peak bytes the log holds for row ``seq``, or None where it holds none of D devices (no
    such row or column, a null, another length)."""
    if "peak_bytes" not in rows.columns:
        return None
    logged = rows.loc[rows["seq"] == seq, "peak_bytes"]
    value = logged.iloc[0] if len(logged) else None
    if value is None or np.ndim(value) != 1 or len(value) != num_devices:
        return None
    values = np.asarray(value, dtype=np.float64)  # a null inside is NaN here (as int64 it was -9.2e18 bytes)
    return values.astype(np.int64) if np.isfinite(values).all() else None


def write_run_plots(run: RunToPlot, out_dir: str | Path, lower_bound_s: float = math.nan) -> RunPlots:
    from measurers.sim.reference import Simulator
    from measurers.sim.trace import write_trace

    paths = run_plot_paths(run, out_dir)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    curve_png = plot_learning_curve(run.curve, paths.learning_curve, run.title, lower_bound_s)
    if run.best is None:
        return RunPlots(curve_png, None, None, None)
    graph, machine, best, rows = run.graph, run.best.machine, run.best.best, run.rows
    result = Simulator(graph, machine).run(run.op_placement, timeline=True)
    title = f"{run.title}: {best_placement_caption(run)}"
    timeline_png = plot_timeline(graph, machine, result.timeline, paths.timeline,
                                 f"{title}, {result.runtime_s:.4g} s simulated")
    peak = _logged_peak_bytes(rows, best.seq, machine.num_devices)
    if peak is None:  # none logged (a hand-written log may lack the column): the simulator's
        peak = result.peak_bytes
    source = ""
    if run.best.manifest.config.get("measurer", "sim") != "sim":  # a real one measures GPU memory alone (0 logged
        gpus = np.array([d.kind == "gpu" for d in machine.devices])  # elsewhere, drawn as a measured 0 B)
        peak, source = np.where(gpus, peak, result.peak_bytes), "GPUs measured, other devices simulated"
    load_png = plot_device_load([d.name for d in machine.devices], result.busy_s, peak, result.capacity_bytes,
                                paths.device_load, title, source)
    trace = write_trace(paths.trace, graph, machine, result)
    return RunPlots(curve_png, timeline_png, load_png, trace)
