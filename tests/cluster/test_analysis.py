"""Run-log analysis: small generated run logs with known answers (best, ratios, failures, curves, bad input)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import build_graph, one_placer_error

from cluster import runlog
from cluster.analysis import find_runs, learning_curve, policy_bests, summarize
from cluster.cli import main
from cluster.pool import PoolResult
from cluster.runlog import MANIFEST_FILE, RESULT_FILE, RunLogWriter, compact_run, make_run_id, new_manifest, read_run
from graphs.errors import PlacerError
from graphs.io import save_graph
from measurers.base import Measurement
from measurers.catalog import load_machine
from measurers.sim.lower_bound import lower_bound_s

T0 = 1_700_000_000.0  # the runs' start, seconds since the epoch
STARTED = "2023-11-14T22:13:20+00:00"  # T0 as ISO 8601

# (policy, runtime_s, status, cache_hit): the run's own policy is "annealing"
ROWS = [
    ("single-gpu", 2.2, "ok", False),
    ("expert", 9.0, "oom", False),
    ("annealing", 3.0, "ok", False),
    ("annealing", 2.0, "ok", False),
    ("annealing", 1.0, "oom", False),  # faster but out of memory: never the best
    ("annealing", 2.5, "ok", False),
    ("annealing", 1.5, "ok", False),
    ("annealing", math.nan, "error", False),
    ("annealing", 1.5, "ok", True),  # answered from the cache
    ("annealing", math.nan, "timeout", False),
]


def _graph():
    return build_graph([(0, 1, 4096), (0, 2, 4096), (1, 3, 4096), (2, 3, 4096), (3, 4, 64), (4, 5, 64)],
                       flops=[1e9, 4e9, 4e9, 1e9, 2e9, 1e9], out_bytes=[4096] * 6,
                       phases=["forward", "forward", "forward", "backward", "backward", "update"], name="tiny6")


def write_run(root: Path, rows=ROWS, policy: str = "annealing", graph=None, machine: str = "paper-2gpu",
              close: bool = True, graph_file: Path | None = None, start: str = STARTED,
              budget: int | None = None, placements=None, warm_start: str | None = None) -> Path:
    """A run folder with one measurement per entry of ``rows``, finished 1 s apart from T0 + 1 (each row's
    op placement from ``placements``, else spread over every device)."""
    graph = graph if graph is not None else _graph()
    config = {"graph": str(graph_file) if graph_file is not None else graph.name,
              "budget": len(rows) if budget is None else budget, "warm_start": warm_start}
    manifest = new_manifest(make_run_id(graph.name, policy, 0, when=T0), graph, load_machine(machine),
                            seed=0, policy=policy, config=config, command=["test"])
    manifest = dataclasses.replace(manifest, started_at=start)
    writer = RunLogWriter.create(root, manifest, flush_rows=4)
    devices = load_machine(machine).num_devices
    for i, (tag, runtime_s, status, hit) in enumerate(rows):
        placement = np.array(placements[i] if placements is not None else
                             [(i + k) % devices for k in range(graph.num_ops)], dtype=np.int64)
        m = Measurement(runtime_s, (runtime_s,), status, (1000 * (i + 1),) + (0,) * (devices - 1), 0.01)
        t = T0 + 1 + i
        writer.append(PoolResult(i, placement, m, "a0", "n0", t - 0.5, t - 0.2, t, hit, 1, tag, i))
    if close:
        writer.close()  # else a live run: the whole files of every 4 rows on disk, the rest buffered
    return writer.folder


def test_summarize__best_ratios_failures_and_rates_known(tmp_path):
    run = write_run(tmp_path)
    (s,) = summarize([run])
    assert (s.graph, s.machine, s.policy) == ("tiny6", "paper-2gpu", "annealing")
    assert s.policy_best_runtime_s == 1.5 and s.overall_best_runtime_s == 1.5
    assert s.best_baseline == "single-gpu" and s.best_baseline_s == 2.2
    assert s.ratio_to_best_baseline == pytest.approx(1.5 / 2.2)
    assert s.failures == {"oom": 2, "error": 1, "timeout": 1}
    assert s.measurements == 9 and s.cache_hits == 1
    assert s.wall_s == pytest.approx(10.0)  # T0 to the last row, finished at T0 + 10
    assert s.measurements_per_s == pytest.approx(0.9)
    assert not s.finished
    assert {b.policy: b.status for b in s.baselines} == {"single-gpu": "ok", "expert": "oom"}


def test_summarize__wall_time_leaves_out_the_wait_for_a_resume(tmp_path):
    """Rows finish at T0 + 1 .. T0 + 10; a resume at T0 + 5.5 (the run stopped after T0 + 5): the sessions
    took 5 s and 4.5 s. From T0 to the last row, 10 s, counted the wait (a run resumed after 5 minutes
    showed 4x fewer measurements per second than the same run never stopped)."""
    import datetime as dt

    run = write_run(tmp_path)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    at = dt.datetime.fromtimestamp(T0 + 5.5, dt.timezone.utc).isoformat()
    manifest["resumes"] = [{"at": at, "command": ["placer"], "changed": {}, "cpu": ""}]
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))
    (s,) = summarize([run])
    assert s.wall_s == pytest.approx(9.5) and s.measurements_per_s == pytest.approx(9 / 9.5)
    # the learning curve's wall time too (the plot's axis ran to 10 s, or 46 s after a 30 s wait)
    curve = learning_curve(read_run(run), manifest=runlog.read_manifest(run))
    assert curve.elapsed_s.max() == pytest.approx(9.5)
    assert curve.elapsed_s.tolist() == pytest.approx(sorted(curve.elapsed_s.tolist()))


def test_summarize__lower_bound_from_result_json_else_from_the_graph_file(tmp_path):
    graph = _graph()
    graph_file = tmp_path / "tiny6.parquet"
    save_graph(graph, graph_file)
    run = write_run(tmp_path / "a", graph=graph, graph_file=graph_file)
    (s,) = summarize([run])
    expected = lower_bound_s(graph, load_machine("paper-2gpu"))
    assert s.lower_bound_s == pytest.approx(expected) and s.ratio_to_lower_bound == pytest.approx(1.5 / expected)
    (run / RESULT_FILE).write_text(json.dumps({"lower_bound_s": 0.5}))
    (s,) = summarize([run])
    assert s.lower_bound_s == 0.5 and s.ratio_to_lower_bound == 3.0 and s.finished


def test_summarize__lower_bound_unknown_without_graph(tmp_path):
    (s,) = summarize([write_run(tmp_path)])
    assert math.isnan(s.lower_bound_s) and math.isnan(s.ratio_to_lower_bound)


def test_summarize__proven_bound_from_the_manifest_else_result_json_else_unknown(tmp_path):
    old = write_run(tmp_path / "old")  # made before the proven bound was recorded: its manifest loads without it
    (s,) = summarize([old])
    assert math.isnan(s.proven_bound_s) and math.isnan(s.ratio_to_proven_bound) and s.proven_bound_holds_for == ""
    (old / RESULT_FILE).write_text(json.dumps({"proven_bound_s": 0.75, "proven_bound_holds_for": "every placement"}))
    (s,) = summarize([old])
    assert s.proven_bound_s == 0.75 and s.ratio_to_proven_bound == 2.0 and s.proven_bound_holds_for == "every placement"
    run = write_run(tmp_path / "new")
    path = run / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "proven_bound_s": 0.6,
                                "proven_bound_holds_for": "placements of the 8 scope groups of tiny6"}))
    (s,) = summarize([run])
    assert s.proven_bound_s == 0.6 and s.ratio_to_proven_bound == pytest.approx(2.5)
    assert s.proven_bound_holds_for == "placements of the 8 scope groups of tiny6"


@pytest.mark.parametrize("policy", ["hierarchical", "hsdag"])
def test_summarize__no_ratio_to_the_proven_bound_for_a_policy_that_places_groups_of_its_own(tmp_path, policy):
    """The bound holds for placements of the searched groups, not for a planner's own: analyze printed
    "x proven bound 2.305" for an hsdag run where the search's own table says "-" (and a ratio below 1 would
    have read as a broken proof)."""
    rows = [(policy, 1.5, "ok", False), (policy, 1.7, "ok", False)]
    run = write_run(tmp_path, rows=rows, policy=policy)
    path = run / MANIFEST_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "proven_bound_s": 0.6,
                                "proven_bound_holds_for": "placements of the 8 scope groups of tiny6"}))
    (s,) = summarize([run])
    assert s.proven_bound_s == 0.6 and math.isnan(s.ratio_to_proven_bound)


def test_cli_analyze__every_distinct_proven_bound_is_printed_naming_its_runs_when_a_graph_has_several(tmp_path,
                                                                                                      capsys):
    runs = [write_run(tmp_path / name) for name in ("a", "b", "c")]
    for run, bound_s in zip(runs, (0.6, 0.6, 0.9)):  # two graphs named tiny6, or two groupings of it
        manifest = json.loads((run / MANIFEST_FILE).read_text())
        (run / MANIFEST_FILE).write_text(json.dumps({**manifest, "proven_bound_s": bound_s,
                                                     "proven_bound_holds_for": "every placement"}))
    assert main(["analyze", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "proven bound 0" in line]
    assert lines == [f"tiny6 on paper-2gpu: proven bound 0.6 s holds for every placement (runs {runs[0].name}, "
                     f"{runs[1].name})",
                     f"tiny6 on paper-2gpu: proven bound 0.9 s holds for every placement (run {runs[2].name})"]


def test_cli_analyze__proven_bounds_that_differ_past_the_4th_digit_print_apart(tmp_path, capsys):
    """Bounds of 0.38387 and 0.38386 s (two solves stopped by their time limit) printed as two 0.3839 lines."""
    runs = [write_run(tmp_path / name) for name in ("a", "b")]
    for run, bound_s in zip(runs, (0.383874, 0.383857)):
        manifest = json.loads((run / MANIFEST_FILE).read_text())
        (run / MANIFEST_FILE).write_text(json.dumps({**manifest, "proven_bound_s": bound_s,
                                                     "proven_bound_holds_for": "every placement"}))
    assert main(["analyze", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "proven bound 0" in line]
    assert lines == [f"tiny6 on paper-2gpu: proven bound 0.38387 s holds for every placement (run {runs[0].name})",
                     f"tiny6 on paper-2gpu: proven bound 0.38386 s holds for every placement (run {runs[1].name})"]


def test_summarize__experiment_folder_one_row_per_run_and_sibling_baselines(tmp_path):
    cell = tmp_path / "exp" / "tiny6__paper-2gpu"
    write_run(cell, policy="reinforce", rows=[("single-gpu", 2.0, "ok", False), ("reinforce", 1.8, "ok", False)])
    write_run(cell, policy="annealing", rows=[("annealing", 1.6, "ok", False)])
    write_run(tmp_path / "exp" / "other", policy="annealing", rows=[("annealing", 1.0, "ok", False)],
              machine="paper-4gpu")
    summaries = {(s.policy, s.machine): s for s in summarize([tmp_path / "exp"])}
    assert len(summaries) == 3
    annealing = summaries[("annealing", "paper-2gpu")]
    assert annealing.best_baseline == "single-gpu" and annealing.ratio_to_best_baseline == pytest.approx(0.8)
    assert summaries[("reinforce", "paper-2gpu")].ratio_to_best_baseline == pytest.approx(0.9)
    assert summaries[("annealing", "paper-4gpu")].best_baseline == ""  # another machine: not a sibling


def test_find_runs__finds_the_runs_of_reproduces_default_folder_from_the_folder_above(tmp_path):
    """`placer reproduce` writes runs/reproduce/EXPERIMENT/CELL/RUN; `placer analyze runs` looked 3 folders
    down and left them out without a word when runs of its own were found."""
    deep = write_run(tmp_path / "runs" / "reproduce" / "mirhoseini2017" / "tiny6__paper-2gpu")
    near = write_run(tmp_path / "runs", policy="reinforce", rows=[("reinforce", 1.8, "ok", False)])
    assert sorted(find_runs([tmp_path / "runs"])) == sorted([deep, near])


def test_summarize__a_run_is_compared_with_the_best_baseline_available_and_told_where_it_came_from(tmp_path, capsys):
    """A run whose own baseline ran ok was compared with it, also where another run read alike (another grouping,
    a `placer baselines --out` run in the same folder) had logged a faster one."""
    a = write_run(tmp_path / "a", policy="cem", rows=[("single-gpu", 2.0, "ok", False), ("cem", 1.8, "ok", False)])
    b = write_run(tmp_path / "b", policy="annealing",
                  rows=[("heft", 1.0, "ok", False), ("annealing", 1.2, "ok", False)])
    table = write_run(tmp_path / "c", policy="baselines",  # `placer baselines --out` into the same folder
                      rows=[("m-etf", 1.4, "ok", False), ("expert", 3.0, "ok", False)])
    first, second, _ = summarize([a, b, table])
    assert (first.best_baseline, first.best_baseline_s, first.best_baseline_run) == ("heft", 1.0, b.name)
    assert first.ratio_to_best_baseline == pytest.approx(1.8)
    assert (second.best_baseline, second.best_baseline_run) == ("heft", "")  # its own, the fastest
    first, _ = summarize([a, table])
    assert (first.best_baseline, first.best_baseline_s, first.best_baseline_run) == ("m-etf", 1.4, table.name)
    heuristic = write_run(tmp_path / "d", policy="m-etf",
                          rows=[("single-gpu", 2.0, "ok", False), ("m-etf", 1.3, "ok", False)])
    mine, _ = summarize([heuristic, table])  # the table's m-etf is the run's own policy, no baseline of it
    assert (mine.best_baseline, mine.best_baseline_s, mine.best_baseline_run) == ("single-gpu", 2.0, "")
    assert main(["analyze", str(a), str(table)]) == 0
    assert f"{a.name}: its best baseline, m-etf, was logged by run {table.name}" in capsys.readouterr().out


def test_summarize__a_warm_starts_re_measurement_is_no_baseline(tmp_path):
    """A "warm-start" row re-measures a placement from a file or run folder (another search's best, perhaps this
    policy's own): a comparable run took it for its best baseline, and so did the run that logged it."""
    a = write_run(tmp_path / "a", policy="hsdag", rows=[("single-gpu", 2.0, "ok", False), ("hsdag", 1.0, "ok", False)])
    b = write_run(tmp_path / "b", policy="giph", rows=[("warm-start", 0.98, "ok", False), ("giph", 0.97, "ok", False),
                                                      ("m-etf", 1.5, "ok", False)])
    first, second = summarize([a, b])
    assert (first.best_baseline, first.best_baseline_s, first.best_baseline_run) == ("m-etf", 1.5, b.name)
    assert (second.best_baseline, second.best_baseline_s) == ("m-etf", 1.5)
    assert [b.policy for b in second.baselines] == ["m-etf"]


def test_summarize__a_best_from_a_warm_start_file_is_named_as_result_json_names_it(tmp_path):
    """analyze said "warm-start" (the log's tag), result.json "warm start (runs/old)"."""
    run = write_run(tmp_path / "a", policy="giph", warm_start="runs/old",
                    rows=[("warm-start", 0.9, "ok", False), ("giph", 0.97, "ok", False)])
    (summary,) = summarize([run])
    assert (summary.overall_best_runtime_s, summary.overall_best_source) == (0.9, "warm start (runs/old)")


def test_summarize__the_policys_best_and_the_overall_best_are_named_apart(tmp_path, capsys):
    """result.json's best_runtime_s was the overall best (a baseline's, here), analyze's the policy's own:
    each field now says which it is, and the table says who found an overall best the policy did not."""
    run = write_run(tmp_path, rows=[("annealing", 2.0, "ok", False), ("m-etf", 1.2, "ok", False),
                                    ("single-gpu", 1.2, "ok", False)])
    (s,) = summarize([run])
    assert (s.policy_best_runtime_s, s.overall_best_runtime_s, s.overall_best_source) == (2.0, 1.2, "m-etf")
    assert main(["analyze", str(run), "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert (entry["policy_best_runtime_s"], entry["overall_best_runtime_s"], entry["overall_best_source"]) == (
        2.0, 1.2, "m-etf") and "best_runtime_s" not in entry
    assert main(["analyze", str(run)]) == 0
    assert f"{s.run_id}: its overall best, 1.2 s, was found by m-etf, not by annealing" in capsys.readouterr().out


def test_read_result_json__an_older_runs_fields_read_under_todays_names(tmp_path):
    from cluster.runlog import read_result_json

    (tmp_path / RESULT_FILE).write_text(json.dumps({"best_runtime_s": 1.2, "best_source": "m-etf",
                                                    "policy_best_runtime_s": 2.0}))
    assert read_result_json(tmp_path) == {"overall_best_runtime_s": 1.2, "overall_best_source": "m-etf",
                                          "policy_best_runtime_s": 2.0}


def test_summarize__a_device_that_left_counts_for_no_best(tmp_path, capsys):
    """After gpu:1 (index 2 of paper-2gpu) left, the fastest rows, which used it, are no best any more, as in
    the run's own best placement; the table says which device left and when."""
    on_gpu0, on_both = [1] * 6, [1, 1, 2, 2, 1, 1]
    rows = [("single-gpu", 2.2, "ok", False), ("annealing", 1.0, "ok", False), ("annealing", 1.8, "ok", False),
            ("annealing", 1.2, "ok", False)]
    run = write_run(tmp_path, rows=rows, placements=[on_gpu0, on_both, on_gpu0, on_both])
    (s,) = summarize([run])
    assert s.policy_best_runtime_s == 1.0 and not s.removed_devices
    path = run / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    removal = {"device": "gpu:1", "index": 2, "trigger": "measurements", "requested": "gpu:1@2",
               "at_measurement": 2, "machine_after": "paper-2gpu-without-gpu:1", "at_seq": 3, "at": STARTED}
    path.write_text(json.dumps({**manifest, "device_removals": [removal]}))
    (s,) = summarize([run])
    assert s.policy_best_runtime_s == 1.8 and s.overall_best_runtime_s == 1.8
    curve = learning_curve(read_run(run), policy="annealing", manifest=runlog.read_manifest(run))
    assert curve.best_so_far_s.tolist() == [1.0, 1.0, 1.8]  # from at_seq 3 on, the best without gpu:1
    assert s.ratio_to_best_baseline == pytest.approx(1.8 / 2.2)
    assert s.measurements == 4  # every row is still counted as measured
    assert [(r.device, r.at_measurement) for r in s.removed_devices] == [("gpu:1", 2)]
    assert main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert "gpu:1 left after 2 measurements" in out
    assert main(["analyze", str(run), "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["policy_best_runtime_s"] == 1.8 and entry["removed_devices"][0]["device"] == "gpu:1"


def test_learning_curve__best_so_far_ok_only_and_elapsed(tmp_path):
    run = write_run(tmp_path)
    curve = learning_curve(read_run(run), policy="annealing")
    assert curve.seq.tolist() == list(range(2, 10))
    assert curve.best_so_far_s.tolist() == [3.0, 2.0, 2.0, 2.0, 1.5, 1.5, 1.5, 1.5]
    assert curve.ok.tolist() == [True, True, False, True, True, False, True, False]
    whole = learning_curve(read_run(run))
    assert whole.best_so_far_s.tolist()[:4] == [2.2, 2.2, 2.2, 2.0] and whole.best_so_far_s[-1] == 1.5
    assert whole.elapsed_s.tolist() == pytest.approx(list(np.arange(10.0)))


def test_policy_bests__failed_policy_reports_its_status(tmp_path):
    bests = policy_bests(read_run(write_run(tmp_path)))
    assert list(bests) == ["single-gpu", "expert", "annealing"]
    assert bests["expert"].status == "oom" and math.isnan(bests["expert"].runtime_s)
    assert bests["annealing"].measurements == 8


def test_summarize__live_run_with_stale_temp_file(tmp_path):
    run = write_run(tmp_path, close=False)
    (run / "measurements" / ".part-000099.parquet.123.tmp").write_bytes(b"half a file")
    (s,) = summarize([run])
    assert s.measurements + s.cache_hits == 8  # two whole files of 4 rows; the rest still buffered


class _Crash(Exception):
    pass


def test_summarize__counts_each_row_once_during_and_after_a_compaction(tmp_path, monkeypatch):
    run = write_run(tmp_path)  # 10 rows in 3 parts
    before = summarize([run])[0]

    def crash(parts):
        raise _Crash  # the compacted file is in, no old part deleted yet

    monkeypatch.setattr(runlog, "_delete_parts", crash)
    with pytest.raises(_Crash):
        compact_run(run)
    assert len(list((run / "measurements").glob("part-*.parquet"))) == 4  # every row is in two files
    during = summarize([run])[0]
    monkeypatch.undo()
    compact_run(run)
    after = summarize([run])[0]
    assert len(list((run / "measurements").glob("part-*.parquet"))) == 1
    assert (during.measurements, during.cache_hits, during.failures) == (9, 1, {"oom": 2, "error": 1, "timeout": 1})
    assert during.to_json() == before.to_json() == after.to_json()


def test_summarize__a_run_with_no_rows_yet(tmp_path):
    (s,) = summarize([write_run(tmp_path, rows=[])])
    assert s.measurements == 0 and math.isnan(s.policy_best_runtime_s) and s.wall_s == 0.0


@pytest.mark.parametrize("case", ["missing", "file", "empty", "version", "garbage"])
def test_find_runs__bad_input_is_one_clear_error(tmp_path, case):
    target = tmp_path / "x"
    if case == "file":
        target.write_text("hello")
    elif case == "empty":
        target.mkdir()
    elif case in ("version", "garbage"):
        run = write_run(tmp_path)
        data = json.loads((run / MANIFEST_FILE).read_text())
        data["format_version"] = 99
        (run / MANIFEST_FILE).write_text(json.dumps(data) if case == "version" else "{not json")
        target = run
    with pytest.raises(PlacerError) as info:
        find_runs([target])
    assert str(target) in str(info.value) or "manifest" in str(info.value)
    if case == "version":
        assert "format version 99" in str(info.value)


def test_cli_analyze__bad_input_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["analyze", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("placer: error:") and "not a run folder" in err[0]


def test_cli_analyze__json_rows_for_several_runs(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", policy="reinforce", rows=[("reinforce", 4.0, "ok", False)])
    assert main(["analyze", str(a), str(b), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [p["policy"] for p in payload] == ["annealing", "reinforce"]
    assert payload[0]["policy_best_runtime_s"] == 1.5 and payload[0]["lower_bound_s"] is None
    assert payload[0]["proven_bound_s"] is None and payload[0]["ratio_to_proven_bound"] is None
    assert payload[1]["best_baseline"] == "single-gpu"  # same graph and machine: a's baseline counts


def test_cli_analyze__table_names_every_run(tmp_path, capsys):
    run = write_run(tmp_path)
    assert main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert run.name[:30] in out.replace("\n", "")
    assert "oom 2" in out and "1.5" in out
    assert "x proven bound" in out.replace("\n", " ")  # the column, "-" without a bound


def test_cli_analyze__table_prints_each_run_id_whole(tmp_path, capsys):
    """The run column was cut to fit 240 columns (``...__random__0__20261206T1…``), so two runs of one graph
    and policy started the same hour printed alike, and the lines below the table name runs by the whole id."""
    graph = dataclasses.replace(_graph(), name="keras_efficientnet_b0_from_an_outside_model_at_batch_32")
    run = write_run(tmp_path, graph=graph)
    assert main(["analyze", str(tmp_path)]) == 0
    assert any(run.name in line for line in capsys.readouterr().out.splitlines())


def test_cli_analyze__counts_the_policys_measurements_as_search_does_apart_from_its_baselines(tmp_path, capsys):
    """A `placer search --budget 64` run showed 64 measurements in search's summary and 66 here: its 3
    baselines were counted in, its one cache hit left out. The policy's rows (cache hit included) are what
    search counts against its budget; the baselines and the cache hits are shown apart."""
    run = write_run(tmp_path)  # annealing: 8 rows, 1 a cache hit; 2 baselines
    (s,) = summarize([run])
    assert s.policy_measurements == 8 and (s.measurements, s.cache_hits) == (9, 1)
    assert main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert "8 (+2 others, 1 cached)" in out and "log wall (s)" in out
    assert main(["analyze", str(run), "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert (entry["policy_measurements"], entry["measurements"], entry["cache_hits"]) == (8, 9, 1)
    rows = [("single-gpu", 2.0, "ok", False), ("m-etf", 1.0, "ok", False)]
    (s,) = summarize([write_run(tmp_path / "b", rows=rows, policy="baselines")])  # `placer baselines --out`
    assert s.policy_measurements == 2


def test_find_runs__a_run_named_twice_is_summarized_once(tmp_path):
    run = write_run(tmp_path / "exp" / "cell")
    assert find_runs([run, tmp_path / "exp", str(run) + "/"]) == [run]


def test_summarize__a_damaged_result_json_is_not_finished(tmp_path):
    run = write_run(tmp_path)
    (run / RESULT_FILE).write_text('{"lower_bound_s": 0.5, "cut sh')
    (s,) = summarize([run])
    assert not s.finished and math.isnan(s.lower_bound_s) and math.isnan(s.proven_bound_s)
    (run / RESULT_FILE).write_text('{"lower_bound_s": 0.5}')
    (s,) = summarize([run])
    assert s.finished and s.lower_bound_s == 0.5
    (run / RESULT_FILE).write_text('{"lower_bound_s": 0.5, "proven_bound_s": -1}')  # not a bound: none
    (s,) = summarize([run])
    assert s.finished and math.isnan(s.proven_bound_s)


REMOVAL = {"device": "gpu:1", "index": 2, "trigger": "measurements", "at_measurement": 5, "machine_after": "m"}



def test_summarize__a_run_that_lost_a_device_takes_no_siblings_baseline_on_it(tmp_path):
    """Without baselines of its own, a run takes its siblings' best baseline: not one on a device it lost
    (m-etf on gpu:1 was its "x best baseline" though its own result left that placement out)."""
    on_gpu0, on_both = [1] * 6, [1, 1, 2, 2, 1, 1]
    run = write_run(tmp_path / "run", rows=[("annealing", 1.8, "ok", False), ("annealing", 1.6, "ok", False)],
                    placements=[on_gpu0, on_gpu0])
    write_run(tmp_path / "sibling", rows=[("m-etf", 1.2, "ok", False), ("single-gpu", 2.2, "ok", False)],
              policy="heft", placements=[on_both, on_gpu0])
    (s, _) = summarize([run, tmp_path / "sibling"])
    assert (s.best_baseline, s.best_baseline_s) == ("m-etf", 1.2)  # no device left: the sibling's fastest
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    removal = {"device": "gpu:1", "index": 2, "trigger": "measurements", "requested": "gpu:1@1",
               "at_measurement": 1, "machine_after": "paper-2gpu-without-gpu:1", "at_seq": 1, "at": STARTED}
    (run / MANIFEST_FILE).write_text(json.dumps({**manifest, "device_removals": [removal]}))
    (s, _) = summarize([run, tmp_path / "sibling"])
    assert (s.best_baseline, s.best_baseline_s) == ("single-gpu", 2.2)


@pytest.mark.parametrize("field, value, message", [
    ("proven_bound_s", "abc", "proven_bound_s 'abc' is not a number of seconds >= 0"),
    ("lower_bound_s", "abc", "lower_bound_s 'abc' is not a number of seconds >= 0"),
    ("proven_bound_s", -1.0, "proven_bound_s -1.0 is not a number of seconds >= 0"),
    ("lower_bound_s", True, "lower_bound_s True is not a number of seconds >= 0"),
    ("device_removals", [{**REMOVAL, "index": "x"}], "device_removals[0].index 'x' is not a whole number >= 0"),
    ("device_removals", [{**REMOVAL, "at_measurement": None}],
     "device_removals[0].at_measurement None is not a whole number >= 0"),
    ("device_removals", ["gpu:1"], "device_removals[0] is not an object"),
])
def test_cli_analyze__a_manifest_with_a_damaged_figure_is_one_error(tmp_path, capsys, field, value, message):
    """A bound of "abc" or a removal's index "x" was a ValueError traceback."""
    from cluster.cli import main

    run = write_run(tmp_path)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    (run / MANIFEST_FILE).write_text(json.dumps({**manifest, field: value}))
    assert main(["analyze", str(run)]) == 2
    err = one_placer_error(capsys)
    assert str(run / MANIFEST_FILE) in err and message in err


def _edit_manifest(run: Path, config: dict | None = None, **fields) -> None:
    """The run's manifest with ``fields`` set and ``config`` merged into its config."""
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    manifest.update(fields)
    manifest["config"] = {**manifest["config"], **(config or {})}
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))


FASTER_GPUS = {"peak_flops": 1.5e13}  # an edited copy of paper-2gpu that kept its name


@pytest.mark.parametrize("config, fields", [({"noise_std": 0.5}, {}), ({"measurer": "torch"}, {}),
                                             ({}, {"runs": 3}), ({}, {"warmup": 0}), ({}, {"estimator": "min"}),
                                             ({}, {"machine": FASTER_GPUS})])
def test_summarize__a_sibling_measured_otherwise_lends_no_baseline(tmp_path, capsys, config, fields):
    """A reproduce annealing run (no baselines of its own) took the fastest baseline of every run of its graph
    and machine: a `search --noise 0.5` run named beside it lent its noisy single-gpu (1.582 instead of 1.470)."""
    run = write_run(tmp_path / "run", rows=[("annealing", 1.5, "ok", False)])
    alike = write_run(tmp_path / "alike", policy="reinforce", rows=[("expert", 2.0, "ok", False)])
    other = write_run(tmp_path / "other", policy="random", rows=[("single-gpu", 1.0, "ok", False)])
    if "machine" in fields:  # the same name, other devices
        machine = json.loads((other / MANIFEST_FILE).read_text())["machine"]
        for device in machine["devices"][1:]:
            device.update(fields["machine"])
        fields = {"machine": machine}
    _edit_manifest(other, config, **fields)
    s = summarize([run, alike, other])[0]
    assert (s.best_baseline, s.best_baseline_s) == ("expert", 2.0) and s.best_baseline_run == alike.name
    assert s.ratio_to_best_baseline == pytest.approx(0.75)
    assert main(["analyze", str(run), str(alike), str(other)]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert f"{run.name}: its best baseline, expert, was logged by run {alike.name}" in out


def test_summarize__a_run_whose_own_baselines_all_failed_takes_a_siblings(tmp_path):
    """Its own baselines (an oom) made the list non-empty, so the siblings' were never consulted."""
    run = write_run(tmp_path / "run", rows=[("expert", 9.0, "oom", False), ("annealing", 1.5, "ok", False)])
    sibling = write_run(tmp_path / "sibling", policy="reinforce", rows=[("single-gpu", 2.0, "ok", False)])
    s = summarize([run, sibling])[0]
    assert (s.best_baseline, s.best_baseline_s) == ("single-gpu", 2.0) and s.best_baseline_run == sibling.name
    assert {b.policy: b.status for b in s.baselines} == {"expert": "oom"}  # its own, as logged


@pytest.mark.parametrize("fields, message", [
    ({"resumes": ["x"]}, "resumes ['x'] is not a list of objects"),
    ({"resumes": "x"}, "resumes 'x' is not a list of objects"),
    ({"proven_bound_s": 0.5, "proven_bound_holds_for": ["a"]}, "proven_bound_holds_for ['a'] is not a string or null"),
    ({"graph_file": 5}, "graph_file 5 is not a string or null"),  # no lower bound recorded: the graph is looked for
    ({"runs": [1]}, "runs [1] is not a whole number >= 0 or null"),  # these three: unhashable in comparable_key
    ({"warmup": {"n": 1}}, "warmup {'n': 1} is not a whole number >= 0 or null"),
    ({"estimator": ["median"]}, "estimator ['median'] is not a string"),
])
@pytest.mark.parametrize("as_json", [False, True])
def test_cli_analyze__a_manifest_with_a_damaged_record_or_name_is_one_error(tmp_path, capsys, fields, message,
                                                                           as_json):
    """Each was a traceback (exit 1): an AttributeError reading a resume's time, a TypeError grouping the
    proven bounds, a TypeError opening the graph file."""
    run = write_run(tmp_path)
    _edit_manifest(run, **fields)
    assert main(["analyze", str(run), *(["--json"] if as_json else [])]) == 2
    err = one_placer_error(capsys)
    assert f"{run / MANIFEST_FILE}: not a valid run manifest ({message})" in err


def test_read_manifest__a_null_graph_file_or_proven_bound_text_reads(tmp_path):
    run = write_run(tmp_path)
    _edit_manifest(run, graph_file=None, proven_bound_holds_for=None, resumes=[])
    manifest = runlog.read_manifest(run)
    assert (manifest.graph_file, manifest.proven_bound_holds_for, manifest.resumes) == ("", None, ())


@pytest.mark.parametrize("machine", ["lab[gpu]", "lab[/gpu]"])
def test_cli_analyze__names_print_as_they_are_not_as_markup(tmp_path, capsys, machine):
    """rich read names as markup: a machine named lab[gpu] printed as lab, and lab[/gpu] was a MarkupError."""
    run = write_run(tmp_path)
    _edit_manifest(run, machine_name=machine, graph_name="g[bold]", proven_bound_s=0.5,
                   proven_bound_holds_for="every [x] placement")
    assert main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"│ g[bold] │ {machine} │" in out
    assert f"g[bold] on {machine}: proven bound 0.5 s holds for every [x] placement" in out


def test_text_console__prints_brackets_as_they_are(capsys):
    from cluster.commands.console import text_console

    text_console().print("lab[/gpu] lab[gpu] :100:")
    assert capsys.readouterr().out == "lab[/gpu] lab[gpu] :100:\n"


@pytest.mark.parametrize("inside", [".", "measurements"])
def test_cli_analyze__plots_inside_a_run_it_reads_are_refused_before_anything_is_written(tmp_path, capsys, inside):
    """`--plots RUN/measurements` wrote PNGs there, and every later read of the run called its log damaged."""
    run = write_run(tmp_path / "runs")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert main(["analyze", str(run), "--plots", str(run / inside)]) == 2
    assert "lies inside the run folder" in one_placer_error(capsys)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_read_run__a_file_that_is_no_log_part_is_not_read(tmp_path):
    run = write_run(tmp_path)
    rows = read_run(run)
    (run / "measurements" / "notes.txt").write_text("not Parquet")
    (run / "measurements" / "device_load.png").write_bytes(b"\x89PNG")
    assert read_run(run).equals(rows)
    (s,) = summarize([run])
    assert s.measurements == 9


def test_cli_analyze__a_copy_of_a_run_gets_plot_names_no_other_run_has(tmp_path, capsys):
    """A second copy of run X was named X-2 for its plots, the name make_run_id gives a second run started in
    the same second: with such a run read too, two runs wrote one set of files."""
    import shutil

    run = write_run(tmp_path / "a")
    shutil.copytree(run, tmp_path / "b" / run.name)
    second = write_run(tmp_path / "c", policy="annealing", rows=[("annealing", 1.2, "ok", False)])
    second = second.rename(second.with_name(run.name + "-2"))
    _edit_manifest(second, run_id=run.name + "-2")
    assert main(["analyze", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"), "--json",
                 "--plots", str(tmp_path / "plots")]) == 0
    curves = [entry["plots"]["learning_curve"] for entry in json.loads(capsys.readouterr().out)]
    assert len(curves) == 3 and len(set(curves)) == 3


@pytest.mark.parametrize("winner, ratio", [("hierarchical", None), ("cem", 2.0)])
def test_reproduce_cell__ratio_to_the_proven_bound_only_for_a_winner_that_searched_its_groups(winner, ratio):
    """A hierarchical2018 cell the planner won showed its step over the bound of the scope groups it never
    searched."""
    from cluster.experiments import Cell, CellResult, MethodResult

    methods = {"hierarchical": MethodResult(1.2, "ok"), "cem": MethodResult(1.2, "ok")}
    cell = CellResult(Cell("nmt-2", "paper-2gpu", 2), "hierarchical", methods, 0.5, 0.0, "cem", winner, (), (), 2,
                      1.0, True, proven_bound_s=0.6, proven_bound_holds_for="placements of the 32 scope groups")
    assert (None if math.isnan(cell.ratio_to_proven_bound) else cell.ratio_to_proven_bound) == ratio
