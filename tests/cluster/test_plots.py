"""Plots: the PNGs are written and show the data (coloured pixels where the data is), plus the Chrome trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import build_graph
from matplotlib import colors
from matplotlib.image import imread
from test_analysis import _graph, write_run

from cluster.analysis import learning_curve
from cluster.cli import main
from cluster.plots import (FAILURE_COLOUR, PHASE_COLOURS, TRANSFER_COLOUR, best_placement_caption, plot_device_load,
                           plot_learning_curve, plot_run, plot_timeline, read_run_to_plot)
from cluster.runlog import read_run
from graphs.errors import PlacerError
from graphs.io import save_graph
from measurers.catalog import load_machine
from measurers.sim.reference import Simulator


def _pixels(path) -> np.ndarray:
    return imread(str(path))[..., :3]  # (H, W, 3) float in [0, 1]


def _share_of_colour(path, colour: str, tol: float = 0.06) -> float:
    """Fraction of the image's pixels within ``tol`` of ``colour``."""
    image = _pixels(path)
    target = np.array(colors.to_rgb(colour))
    return float((np.abs(image - target).max(axis=-1) < tol).mean())


def _not_blank(path) -> None:
    image = _pixels(path)
    non_white = (image < 0.95).any(axis=-1).mean()
    assert image.std() > 0.05 and non_white > 0.02, f"{path} looks blank"


def test_plot_learning_curve__draws_points_and_marks_failures(tmp_path):
    curve = learning_curve(read_run(write_run(tmp_path)))
    png = plot_learning_curve(curve, tmp_path / "curve.png", "test", lower_bound_s=0.5)
    _not_blank(png)
    assert _share_of_colour(png, FAILURE_COLOUR) > 1e-4  # red crosses for the 4 failures
    only_ok = learning_curve(read_run(write_run(tmp_path / "ok", rows=[("cem", 2.0 - i / 10, "ok", False)
                                                                          for i in range(8)])))
    png_ok = plot_learning_curve(only_ok, tmp_path / "ok.png")
    _not_blank(png_ok)
    assert _share_of_colour(png_ok, FAILURE_COLOUR) == 0.0


def test_plot_timeline__gantt_shows_ops_and_transfers(tmp_path):
    graph, machine = _graph(), load_machine("paper-2gpu")
    result = Simulator(graph, machine).run(np.array([1, 1, 2, 1, 1, 1]), timeline=True)
    assert len(result.timeline.transfer_op) > 0
    png = plot_timeline(graph, machine, result.timeline, tmp_path / "gantt.png")
    _not_blank(png)
    assert _share_of_colour(png, TRANSFER_COLOUR) > 1e-4
    assert _share_of_colour(png, PHASE_COLOURS["forward"]) > 1e-4
    alone = Simulator(graph, machine).run(np.ones(6, dtype=np.int64), timeline=True)
    png_alone = plot_timeline(graph, machine, alone.timeline, tmp_path / "alone.png")
    assert _share_of_colour(png_alone, TRANSFER_COLOUR) == 0.0  # no transfers, no purple


def test_plot_device_load__over_capacity_in_red(tmp_path):
    png = plot_device_load(["cpu:0", "gpu:0"], [0.5, 1.5], [1e9, 3e9], [10e9, 2e9], tmp_path / "load.png")
    _not_blank(png)
    assert _share_of_colour(png, FAILURE_COLOUR) > 1e-3
    fits = plot_device_load(["cpu:0", "gpu:0"], [0.5, 1.5], [1e9, 1e9], [10e9, 2e9], tmp_path / "fits.png")
    assert _share_of_colour(fits, FAILURE_COLOUR) == 0.0


def test_plot_run__all_plots_and_a_chrome_trace_of_the_best(tmp_path):
    graph = _graph()
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(graph, graph_file)
    run = write_run(tmp_path / "runs", graph=graph, graph_file=graph_file)
    made = plot_run(run, tmp_path / "plots")
    for png in (made.learning_curve, made.timeline, made.device_load):
        _not_blank(png)
    trace = json.loads(made.trace.read_text())
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["cat"] != "transfer"]
    assert len(ops) == graph.num_ops
    best_placement = [(6 + k) % 3 for k in range(6)]  # row 6 (1.5 s) is the run's best
    assert sorted({e["pid"] for e in ops}) == sorted(set(best_placement))


def test_plot_run__the_timeline_says_whose_overall_best_it_shows(tmp_path):
    """The timeline of a run whose best row was a baseline's said "best placement (found by m-etf)" under the
    policy's name, beside analyze's best, which is the policy's own."""
    graph = _graph()
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(graph, graph_file)
    rows = [("annealing", 2.0, "ok", False), ("m-etf", 1.2, "ok", False)]
    run = read_run_to_plot(write_run(tmp_path / "runs", rows=rows, graph=graph, graph_file=graph_file))
    assert best_placement_caption(run) == "overall best placement, found by m-etf, not by annealing"
    own = read_run_to_plot(write_run(tmp_path / "own", rows=rows[:1], graph=graph, graph_file=graph_file))
    assert best_placement_caption(own) == "overall best placement, found by annealing"
    baselines = read_run_to_plot(write_run(tmp_path / "baselines", rows=[("m-etf", 1.2, "ok", False)],
                                           policy="baselines", graph=graph, graph_file=graph_file))
    assert best_placement_caption(baselines) == "overall best placement, found by m-etf"  # not "not by baselines"


def test_plot_run__no_ok_measurement_gives_the_curve_only(tmp_path):
    run = write_run(tmp_path, rows=[("cem", math.nan, "error", False), ("cem", 3.0, "oom", False)])
    made = plot_run(run, tmp_path / "plots")
    _not_blank(made.learning_curve)
    assert made.timeline is None and made.trace is None


def test_plot_run__a_damaged_best_placement_is_one_error_naming_the_file(tmp_path):
    run = write_run(tmp_path)
    (run / "best_placement.json").write_text('{"run_id": "cut short')
    with pytest.raises(PlacerError, match=r"best_placement\.json is damaged"):
        plot_run(run, tmp_path / "plots")


@pytest.mark.parametrize("change", ["replaced", "moved"])
def test_plot_run__a_graph_changed_or_moved_leaves_the_curve_and_a_note(tmp_path, capsys, change):
    """The learning curve needs no graph: `analyze --plots` used to fail whole (exit 2, no table) when a run's
    graph file had moved, naming a flag analyze does not have."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs", graph_file=graph_file)
    changed = build_graph([(0, 1), (1, 2)], name="tiny6")
    if change == "replaced":
        save_graph(changed, graph_file)  # the file the run names now holds another graph
    else:
        graph_file.rename(tmp_path / "elsewhere.parquet")
    made = plot_run(run, tmp_path / "plots")
    _not_blank(made.learning_curve)
    assert (made.timeline, made.device_load, made.trace) == (None, None, None)
    err = capsys.readouterr().err
    assert err.startswith("placer: note: no timeline of run ") and err.count("\n") == 1
    assert (f"content hash {changed.content_hash}" if change == "replaced" else "cannot find graph") in err


def test_plot_run__a_machine_profile_moved_since_leaves_the_curve_and_a_note(tmp_path, capsys):
    """A run on a machine file that names a profile (`placer profile --machine-out`) whose profile was moved
    since: `analyze --plots` failed whole, exit 2, no plot of any run (analyze without --plots read it)."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs", graph_file=graph_file)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["machine"]["profile"] = str(tmp_path / "moved" / "profile.json")
    (run / "manifest.json").write_text(json.dumps(manifest))
    made = plot_run(run, tmp_path / "plots")
    _not_blank(made.learning_curve)
    assert (made.timeline, made.device_load, made.trace) == (None, None, None)
    err = capsys.readouterr().err
    assert err.startswith("placer: note: no timeline of run ") and "profile.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("measurer", ["sim", "torch"])
def test_plot_run__a_real_measurers_unmeasured_peaks_are_the_simulators_and_said_so(tmp_path, monkeypatch,
                                                                                     measurer):
    """The torch and OpenVINO measurers measure GPU memory only and log 0 for the CPU: the load plot drew
    "0/25.3 GB" as if measured, beside busy times the simulator gives."""
    import cluster.plots

    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs", rows=[("annealing", 1.5, "ok", False)], graph_file=graph_file)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["measurer"] = measurer
    (run / "manifest.json").write_text(json.dumps(manifest))
    drawn = {}
    monkeypatch.setattr(cluster.plots, "plot_device_load",
                        lambda names, busy_s, peak, capacity, path, title, source: drawn.update(peak=peak, source=source))
    to_plot = read_run_to_plot(run)
    simulated = Simulator(to_plot.graph, to_plot.best.machine).run(to_plot.op_placement).peak_bytes
    plot_run(run, tmp_path / "plots")
    logged = [1000, 0, 0]  # write_run's row: 1000 bytes on the CPU, 0 on the GPUs
    if measurer == "sim":
        assert list(drawn["peak"]) == logged and drawn["source"] == ""
    else:
        assert list(drawn["peak"]) == [simulated[0], 0, 0] and simulated[0] > 0
        assert drawn["source"] == "GPUs measured, other devices simulated"


@pytest.mark.parametrize("damage", ["null", "no column", "a null inside"])
def test_plot_run__a_log_without_the_best_rows_peak_bytes_draws_the_simulators(tmp_path, monkeypatch, damage):
    """A hand-written log without peak_bytes (the reader takes a missing column as nulls), or a null in the best
    row: `analyze --plots` crashed (TypeError, exit 1, --json printed nothing) after writing two of the plots."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import cluster.plots

    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs", rows=[("annealing", 1.5, "ok", False)], graph_file=graph_file)
    (part,) = (run / "measurements").glob("*.parquet")
    table = pq.read_table(part)
    index = table.schema.get_field_index("peak_bytes")
    field = table.schema.field(index)
    if damage == "no column":
        table = table.remove_column(index)
    elif damage == "null":
        table = table.set_column(index, field, pa.nulls(len(table), field.type))
    else:  # pandas reads [1000, null, 0] as floats with a NaN
        table = table.set_column(index, field, pa.array([[1000, None, 0]] * len(table), field.type))
    pq.write_table(table, part)
    drawn = {}
    monkeypatch.setattr(cluster.plots, "plot_device_load",
                        lambda names, busy_s, peak, capacity, path, title, source: drawn.update(peak=peak))
    to_plot = read_run_to_plot(run)
    simulated = Simulator(to_plot.graph, to_plot.best.machine).run(to_plot.op_placement).peak_bytes
    assert plot_run(run, tmp_path / "plots").trace.is_file()
    assert list(drawn["peak"]) == list(simulated)


def test_cli_analyze__plots_of_no_run_are_written_when_one_run_is_damaged(tmp_path, capsys):
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    write_run(tmp_path / "runs" / "a", graph_file=graph_file)
    damaged = write_run(tmp_path / "runs" / "b", graph_file=graph_file)
    (damaged / "best_placement.json").write_text('{"run_id": "cut short')
    assert main(["analyze", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots")]) == 2
    assert "best_placement.json is damaged" in capsys.readouterr().err
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("damage", ["unknown device", "cut short"])
def test_cli_analyze__a_best_placement_that_does_not_fit_its_graph_leaves_no_plot(tmp_path, capsys, damage):
    """The placement was expanded to ops only after the learning curve was saved: a run whose best placement
    names a device the machine lacks, or has too few entries, left plots behind with its exit 2."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    write_run(tmp_path / "runs" / "a", graph_file=graph_file)
    damaged = write_run(tmp_path / "runs" / "b", graph_file=graph_file)
    best = json.loads((damaged / "best_placement.json").read_text())
    best["placement"] = [7] + best["placement"][1:] if damage == "unknown device" else best["placement"][:1]
    (damaged / "best_placement.json").write_text(json.dumps(best))
    assert main(["analyze", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error:") and err.count("\n") == 1
    assert not (tmp_path / "plots").exists()
    assert main(["analyze", str(damaged), "--plots", str(tmp_path / "plots")]) == 2
    assert not (tmp_path / "plots").exists()


def test_cli_analyze__a_run_of_a_relative_graph_file_is_plotted_from_another_folder(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    save_graph(_graph(), "tiny6.parquet")
    run = write_run(tmp_path / "runs", graph_file=Path("tiny6.parquet"))  # as `--graph tiny6.parquet` records it
    monkeypatch.chdir(tmp_path)
    assert plot_run(run, tmp_path / "plots").timeline is not None


def test_cli_analyze__plots_dir_gets_pngs_and_trace(tmp_path, capsys):
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    write_run(tmp_path / "runs", graph_file=graph_file)
    assert main(["analyze", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots")]) == 0
    names = sorted(p.name.split("__")[-1] for p in (tmp_path / "plots").iterdir())
    assert names == ["device_load.png", "learning_curve.png", "timeline.png", "trace.json"]
    assert "timeline.png" in capsys.readouterr().out


def test_cli_analyze__two_copies_of_a_run_get_plots_of_their_own(tmp_path, capsys):
    """The same run id in two folders: the second's plots overwrote the first's."""
    import shutil

    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs" / "a", graph_file=graph_file)
    shutil.copytree(run, tmp_path / "runs" / "b" / run.name)
    assert main(["analyze", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots"), "--json"]) == 0
    curves = [entry["plots"]["learning_curve"] for entry in json.loads(capsys.readouterr().out)]
    assert len(set(curves)) == 2 and all(Path(c).is_file() for c in curves)
    assert curves[1].endswith(f"{run.name}-2__learning_curve.png")


def test_cli_analyze__a_plot_path_taken_by_a_folder_is_refused_before_any_plot_is_written(tmp_path, capsys):
    """The first run's plots and the second's learning curve were written before the folder stopped the rest."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    write_run(tmp_path / "runs" / "a", graph_file=graph_file)
    second = write_run(tmp_path / "runs" / "b", graph_file=graph_file, policy="cem")
    blocker = tmp_path / "plots" / f"{second.name}__timeline.png"
    blocker.mkdir(parents=True)
    assert main(["analyze", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots")]) == 2
    assert [p.name for p in (tmp_path / "plots").iterdir()] == [blocker.name]
    err = capsys.readouterr().err
    assert err.startswith(f"placer: error: --plots: {blocker} is a folder") and err.count("\n") == 1


def test_cli_analyze__a_plot_path_that_is_a_symbolic_link_is_written_through(tmp_path, capsys):
    """The plot replaced the link with a file of its own, the file it named left as it was; every other output
    path (--trace, -o) writes through a link, as the README says."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs" / "a", graph_file=graph_file)
    target = tmp_path / "elsewhere" / "timeline.png"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "plots" / f"{run.name}__timeline.png"
    link.parent.mkdir()
    link.symlink_to(target)
    assert main(["analyze", str(run), "--plots", str(tmp_path / "plots"), "--json"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and target.read_bytes().startswith(b"\x89PNG")


def test_cli_analyze__a_plot_path_linked_into_a_run_it_reads_is_refused_and_the_run_kept(tmp_path, capsys):
    """A trace path linked to the run's manifest: the trace was written through it, over the manifest (exit 0;
    every reader refused the run after)."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs" / "a", graph_file=graph_file)
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    link = tmp_path / "plots" / f"{run.name}__trace.json"
    link.parent.mkdir()
    link.symlink_to(run / "manifest.json")
    assert main(["analyze", str(run), "--plots", str(tmp_path / "plots")]) == 2
    assert one_line_error(capsys) == (f"placer: error: --plots: {run / 'manifest.json'}, where run {run.name}'s plot "
                                      f"would be written, lies inside the run folder {run}, which analyze only reads\n")
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
    assert [p.name for p in (tmp_path / "plots").iterdir()] == [link.name]


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    return captured.err


def test_cli_analyze__a_lost_best_placement_file_is_said_not_claimed(tmp_path, capsys):
    """With best_placement.json deleted, analyze said "(best_placement.json holds it)" and left out the
    timeline, device load and trace without a word."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    run = write_run(tmp_path / "runs", rows=[("annealing", 2.0, "ok", False), ("m-etf", 1.2, "ok", False)],
                    graph_file=graph_file)
    (run / "best_placement.json").unlink()
    assert main(["analyze", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    assert "was found by m-etf, not by annealing (its best_placement.json is missing)" in " ".join(
        captured.out.split())
    assert captured.err == (f"placer: note: no timeline of run {run.name}'s best placement: run {run} has no best "
                            "placement (no best_placement.json): its log holds 2 placements measured ok, so the "
                            "file was removed or lost after it was written\n")
    assert [p.name.split("__")[-1] for p in (tmp_path / "plots").iterdir()] == ["learning_curve.png"]


def test_cli_analyze__a_plot_name_too_long_is_refused_before_any_plot_is_written(tmp_path, capsys):
    """A hand-written run id of 240 characters: the other runs' plots were written, then "File name too long"."""
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(_graph(), graph_file)
    write_run(tmp_path / "runs" / "a", graph_file=graph_file)
    long = write_run(tmp_path / "runs" / "b", graph_file=graph_file, policy="cem")
    manifest = json.loads((long / "manifest.json").read_text())
    manifest["run_id"] = "r" * 240
    (long / "manifest.json").write_text(json.dumps(manifest))
    assert main(["analyze", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"placer: error: --plots: run {'r' * 240}'s plot {'r' * 240}__learning_curve.png cannot "
                          "be written: a name of ") and err.count("\n") == 1
    assert not (tmp_path / "plots").exists() or not list((tmp_path / "plots").iterdir())
