"""`placer search` as a user first meets it: from a plain shell (none of the Makefile's settings), bad
flags refused before anything is drawn, and no warning the user cannot act on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RLLIB_NOISE = ("Not importing TensorFlow", "deprecat", "oneDNN", "cuda drivers")  # case-insensitive

# `placer search` itself (cluster.cli.main), then what it imported: RLlib, and not TensorFlow.
SEARCH_THEN_REPORT_IMPORTS = (
    "import sys\n"
    "from cluster.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print('imported:', 'ray.rllib' in sys.modules, 'tensorflow' in sys.modules, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _plain_shell_env(under_make: bool = False) -> dict[str, str]:
    """The environment of an activated venv: without RLLIB_TEST_NO_TF_IMPORT, which `make` sets (Ray's
    token authentication stays off so the test writes no token); ``under_make``: with it."""
    env = {k: v for k, v in os.environ.items() if k != "RLLIB_TEST_NO_TF_IMPORT"}
    return {**env, "RAY_AUTH_MODE": "disabled", **({"RLLIB_TEST_NO_TF_IMPORT": "1"} if under_make else {})}


def test_search_cli__bad_graph_is_refused_before_the_progress_bar(tmp_path):
    out = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "search", "--graph", "nmt-3", "--out", str(out)],
                          cwd=REPO, env=_plain_shell_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()]  # one line, no progress bar before it
    assert done.stderr.startswith("placer: error: unknown graph 'nmt-3'")
    assert done.stdout == "" and not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--machine", "paper-3gpu"], "unknown machine 'paper-3gpu'"),
    (["--budget", "0"], "--budget must be a whole number of at least 1"),
    (["--workers", "0"], "--workers must be from 1 to 256, got 0"),
    (["--workers", "99999"], "--workers must be from 1 to 256, got 99999"),  # flooded Ray with actors, hung
    (["--runs", "99999999999"], "--runs must be from 1 to 10,000"),  # a 20-line error, a run folder left
    (["--warmup", "10001"], "--warmup must be from 0 to 10,000"),
    (["--warmup", "2"], "--warmup 2: the simulator runs no warm-up"),  # it was recorded in the manifest, unused
    (["--noise", "-0.1"], "--noise must be a number from 0 to 10"),
    (["--measurer", "openvino", "--noise", "0.1"],  # ignored by a real measurer, and recorded as the run's
     "--noise applies to the simulator only, not to the openvino measurer's real steps"),
    (["--bound-time-limit", "-1"], "--bound-time-limit must be a finite number of seconds >= 0"),
    (["--resume", "no-such-run"], "no-such-run is not a run folder"),
    (["--policy", "exact", "--groups", "1500"], "--groups 1500: policy 'exact' places at most 1000 groups"),
    (["--policy", "exact", "--time-limit", "0"], "--time-limit must be a positive, finite number"),
    (["--time-limit", "inf"], "--time-limit must be a positive, finite number of seconds, got inf"),
    (["--policy", "annealing", "--batch", "4"], "--batch: only for a learned --policy"),  # it was recorded, unused
    (["--policy", "reinforce", "--warm-start", "expert"],  # it ran without a warm start, and said only "expert"
     "--warm-start expert: no expert rule for graph 'synthetic:300:0'"),
])
def test_search_cli__bad_flags_are_one_error_before_anything_starts(tmp_path, capsys, flags, message):
    from cluster.cli import main

    out = tmp_path / "runs"
    assert main(["search", "--graph", "synthetic:300", "--out", str(out), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"placer: error: {message}") and captured.err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("under_make", [False, True], ids=["plain-shell", "make"])
def test_search_cli__first_run_prints_no_rllib_noise_and_never_imports_tensorflow(tmp_path, under_make):
    """From a plain shell and under `make`: no "Not importing TensorFlow" lines, no RLlib deprecation
    warning, and RLlib (which the learner uses) without TensorFlow (which it would import, taking seconds)."""
    command = [sys.executable, "-c", SEARCH_THEN_REPORT_IMPORTS, "search", "--graph", "synthetic:300",
               "--budget", "32", "--batch", "16", "--workers", "1", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, env=_plain_shell_env(under_make), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    noise = [line for line in done.stderr.splitlines() if any(n.lower() in line.lower() for n in RLLIB_NOISE)]
    assert noise == [], "\n".join(noise[:5])
    assert "imported: True False" in done.stderr  # RLlib yes, TensorFlow no
    assert "32 scope groups searched, 32 measurements, stopped by budget" in " ".join(done.stdout.split())


def test_search_cli__measurer_that_cannot_run_the_graph_writes_nothing(tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "runs"
    assert main(["search", "--graph", "synthetic:50", "--measurer", "torch", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "synthetic graph and cannot be rebuilt as a real PyTorch step: only the simulator times it" in err, err
    assert not out.exists()  # no run folder that looks like a stopped run


def test_search_cli__resume_on_a_changed_machine_is_refused_and_changes_nothing(tmp_path, capsys):
    import json

    from cluster.cli import main

    machine_file = tmp_path / "box.json"
    machine_file.write_text((REPO / "measurers/catalog/paper-2gpu.json").read_text())
    out = tmp_path / "runs"
    assert main(["search", "--graph", "synthetic:300", "--machine", str(machine_file), "--policy", "reinforce",
                 "--budget", "8", "--batch", "4", "--workers", "1", "--out", str(out), "--json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])  # a learner: it may go on to a larger budget
    spec = json.loads(machine_file.read_text())
    spec["links"][0]["bandwidth_Bps"] /= 2  # the box changed since the run
    machine_file.write_text(json.dumps(spec))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert main(["search", "--resume", str(run_dir), "--budget", "16"]) == 2
    assert "describes other devices or links" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_search_cli__a_run_another_process_holds_is_not_resumed_and_nothing_changes(tmp_path, capsys):
    from cluster.cli import main
    from graphs.files import FolderLock

    out = tmp_path / "runs"
    assert main(["search", "--graph", "synthetic:300", "--policy", "reinforce", "--budget", "8", "--batch", "4",
                 "--workers", "1", "--out", str(out), "--json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    lock = FolderLock.acquire(run_dir, "run folder")  # as the run still going, or the same resume started twice
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    try:
        assert main(["search", "--resume", str(run_dir), "--budget", "16", "--json"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.strip() == (f"placer: error: run folder {run_dir} is in use by another process "
                                        f"(pid {os.getpid()}): wait for it to end, or stop it, and try again")
        assert {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    finally:
        lock.release()
    assert main(["search", "--resume", str(run_dir), "--budget", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measurements"] == 16


def test_search_cli__a_run_of_relative_graph_and_machine_files_resumes_from_another_folder(tmp_path, capsys,
                                                                                          monkeypatch):
    """The run kept the paths as typed: from another folder its resume read no file, and the same files'
    full paths were refused as another graph and machine."""
    import json

    from cluster.cli import main
    from graphs.io import save_graph
    from graphs.registry import load_graph

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    save_graph(load_graph("synthetic:300"), first / "g.parquet")
    (first / "box.json").write_text((REPO / "measurers/catalog/paper-2gpu.json").read_text())
    monkeypatch.chdir(first)
    assert main(["search", "--graph", "g.parquet", "--machine", "box.json", "--policy", "reinforce", "--budget", "8",
                 "--batch", "4", "--workers", "1", "--out", str(tmp_path / "runs"), "--json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    monkeypatch.chdir(second)
    assert main(["search", "--resume", str(run_dir), "--graph", str(first / "g.parquet"), "--machine",
                 str(first / "box.json"), "--budget", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measurements"] == 16


def test_search_cli__openvino_measures_an_imported_ir_through_the_pool(tmp_path, capsys):
    import json

    from cluster.cli import main
    from measurers.openvino.sample import save_sample_model

    graph_file = tmp_path / "sample.parquet"
    assert main(["graphs", "import", "--openvino", str(save_sample_model(tmp_path)), "-o", str(graph_file)]) == 0
    capsys.readouterr()
    out = tmp_path / "runs"
    assert main(["search", "--graph", str(graph_file), "--machine", "openvino", "--measurer", "openvino",
                 "--policy", "random", "--budget", "2", "--workers", "1", "--runs", "2", "--warmup", "1",
                 "--bound-time-limit", "0", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["measurer"] == "openvino" and 0 < result["overall_best_runtime_s"] < 1.0
    manifest = json.loads(next(out.glob("*/manifest.json")).read_text())
    assert (manifest["runs"], manifest["warmup"]) == (2, 1)


def test_search_cli__openvino_on_a_traced_graph_writes_nothing(tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "runs"
    assert main(["search", "--graph", "synthetic:50", "--machine", "openvino", "--measurer", "openvino",
                 "--out", str(out)]) == 2
    assert "model file" in capsys.readouterr().err and not out.exists()


def test_search_cli__json_interrupted_while_the_run_closes_still_prints_its_folder(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the pool or Ray shut down (the log complete, no result yet): a plain KeyboardInterrupt,
    and stdout was empty under --json."""
    import cluster.jobs
    from cluster.cli import main

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text("{}")  # the run it opened is still there

    def interrupted_while_closing(*args, on_start=None, **kwargs):
        on_start(run_dir)
        raise KeyboardInterrupt()

    monkeypatch.setattr(cluster.jobs, "run_search", interrupted_while_closing)
    assert main(["search", "--graph", "synthetic:300", "--out", str(tmp_path / "runs"), "--json"]) == 130
    assert json.loads(capsys.readouterr().out) == {"stop_reason": "interrupted", "run_dir": str(run_dir),
                                                   "resume": ["placer", "search", "--resume", str(run_dir)]}
    # a run that removes devices cannot be resumed: no command to resume it, which was always refused
    assert main(["search", "--graph", "synthetic:300", "--policy", "hsdag", "--remove-device", "gpu:1@8",
                 "--out", str(tmp_path / "runs"), "--json"]) == 130
    assert json.loads(capsys.readouterr().out) == {"stop_reason": "interrupted", "run_dir": str(run_dir),
                                                   "resume": None}


def test_search_cli__the_stop_line_comes_after_the_progress_bars_last_frame(tmp_path, capsys, monkeypatch):
    """The bar was stopped after the line was printed: its last frame came below "placer: error: no measurer
    actors left ...", which was then not the last thing the user saw."""
    import cluster.jobs
    from cluster.cli import main

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text("{}")

    def interrupted_mid_run(*args, on_start=None, progress=None, **kwargs):
        on_start(run_dir)
        progress(3, 0.25, 0.1)
        raise KeyboardInterrupt()

    monkeypatch.setattr(cluster.jobs, "run_search", interrupted_mid_run)
    assert main(["search", "--graph", "synthetic:300", "--budget", "8", "--out", str(tmp_path / "runs")]) == 130
    err = capsys.readouterr().err
    assert "3/8" in err and err.endswith(f"placer: interrupted; its run folder is {run_dir}\n"), err[-300:]


def test_search_cli__interrupted_after_closing_removed_its_folder_names_no_folder(tmp_path, capsys, monkeypatch):
    """Ctrl-C after a new run with nothing measured removed its folder (before its SearchInterrupted): the
    message and --json's run_dir and resume named the folder just removed."""
    import cluster.jobs
    from cluster.cli import main

    run_dir = tmp_path / "runs" / "r"

    def interrupted_after_removing(*args, on_start=None, **kwargs):
        on_start(run_dir)  # opened, then removed by the search's closing (it measured nothing)
        raise KeyboardInterrupt()

    monkeypatch.setattr(cluster.jobs, "run_search", interrupted_after_removing)
    assert main(["search", "--graph", "synthetic:300", "--out", str(tmp_path / "runs"), "--json"]) == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"stop_reason": "interrupted", "run_dir": None, "resume": None}
    assert f"placer: interrupted; its run folder {run_dir} was removed: nothing was measured\n" in captured.err


def test_search_cli__an_interrupt_before_the_run_folder_exists_says_interrupted(tmp_path, capsys, monkeypatch):
    import cluster.jobs
    from cluster.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt()  # Ctrl-C while Ray starts: no message of its own

    monkeypatch.setattr(cluster.jobs, "run_search", interrupted)
    assert main(["search", "--graph", "synthetic:300", "--out", str(tmp_path / "runs")]) == 130
    assert capsys.readouterr().err.endswith("placer: interrupted\n")
    # with --json, still one document (stdout was empty): no run folder, nothing to resume
    assert main(["search", "--graph", "synthetic:300", "--out", str(tmp_path / "runs"), "--json"]) == 130
    assert json.loads(capsys.readouterr().out) == {"stop_reason": "interrupted", "run_dir": None, "resume": None}


@pytest.mark.parametrize("command", [["baselines", "--graph", "synthetic:50", "--machine", "paper-2gpu"],
                                     ["reproduce", "mirhoseini2017", "--quick", "--rows", "rnnlm:paper-2gpu"]])
def test_cli__any_json_command_interrupted_prints_one_document(tmp_path, capsys, monkeypatch, command):
    """`baselines --json` and `reproduce --json` interrupted printed nothing on stdout."""
    import cluster.experiments
    import cluster.jobs
    from cluster.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt()

    monkeypatch.setattr(cluster.experiments, "run_experiment", interrupted)
    monkeypatch.setattr(cluster.jobs, "run_baselines", interrupted)
    assert main([*command, "--out", str(tmp_path / "out"), "--json"]) == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"stop_reason": "interrupted", "command": command[0]}
    assert captured.err.endswith("placer: interrupted\n")


@pytest.mark.parametrize("measured, stop_reason, shown", [
    (1, "budget", (1, 1)),  # a heuristic: one placement of the budget, not "1/2048"
    (96, "converged", (96, 96)),  # a resumed run whose every measurement was logged: not "0/96"
    (500, "time_limit", (500, 2048)),  # cut short: the bar says so
])
def test_search_progress__ends_full_unless_the_search_was_cut_short(measured, stop_reason, shown):
    from cluster.commands.search import _Progress

    with _Progress(2048, enabled=True) as progress:
        progress.start()
        progress.finish(measured, stop_reason, 0.5, 0.25)
        task = progress._bar.tasks[0]
        assert (task.completed, task.total) == shown
        assert task.fields["best"] == "best 0.5000 s (2.00x LB)"  # a resumed run's bar showed "best -"


def test_search_progress__in_a_log_a_line_at_the_first_update_not_only_at_the_end(capsys):
    """A Ray job's stderr is a file: rich drew the bar there once, when the search ended, so `ray job logs
    --follow` showed no progress for the whole search."""
    from cluster.commands.search import _Progress

    with _Progress(64, enabled=True) as progress:
        progress.start()
        progress.update(8, 0.5, 0.25)
        err = capsys.readouterr().err  # while the search still runs
    line, = err.splitlines()
    assert line.startswith("search ") and "8/64" in line and "best 0.5000 s (2.00x LB)" in line, err


def test_search_progress__a_resumed_run_shows_this_sessions_rate(monkeypatch):
    """A resumed search showed 358.8/s where it measured about 130/s: the earlier sessions' measurements,
    counted on the bar, went into the rate too, over this session's time."""
    from cluster.commands import console
    from cluster.commands.search import _Progress

    now_s = [1000.0]
    real_console = console.text_console
    monkeypatch.setattr(console, "text_console", lambda **options: real_console(get_time=lambda: now_s[0],
                                                                                **options))
    with _Progress(2048, enabled=True) as progress:
        progress.start()
        progress.measured_before(960)  # the learner's checkpoint: 960 measured by earlier sessions
        now_s[0] += 10.0
        progress.update(960 + 40, 0.5, 0.25)
        task = progress._bar.tasks[0]
        assert task.completed == 1000 and task.fields["rate"] == "4.0/s"  # not 100.0/s


def test_progress_lines__every_interval_in_a_log_and_never_on_a_terminal(capsys):
    import io

    from cluster.commands.console import ProgressLines, text_console
    from rich.progress import MofNCompleteColumn, Progress, TextColumn

    now_s = [100.0]
    for terminal in (False, True):
        console = text_console(file=io.StringIO(), force_terminal=terminal, width=80)
        with Progress(TextColumn("search"), MofNCompleteColumn(), console=console, auto_refresh=False) as bar:
            task = bar.add_task("search", total=64)
            lines = ProgressLines(bar, every_s=30.0, clock=lambda: now_s[0])
            for done, now_s[0] in ((1, 100.0), (2, 129.0), (3, 130.0), (4, 131.0)):
                bar.update(task, completed=done)
                lines.tick()
            printed = console.file.getvalue()
        if terminal:  # the live bar shows it: no line of ours
            assert "1/64" not in printed and "3/64" not in printed, printed
        else:  # at the first tick and 30 s later
            assert [" ".join(line.split()) for line in printed.splitlines() if line] == ["search 1/64",
                                                                                         "search 3/64"], printed


def test_progress_lines__a_log_line_keeps_every_column_of_trains_bar():
    """train's line in a log (80 columns there) lost its count of the budget and its elapsed time."""
    import io
    from types import SimpleNamespace

    from cluster.commands.train import _Progress

    with _Progress(2048) as progress:
        progress._bar.console.file = io.StringIO()
        assert not progress._bar.console.is_terminal
        metrics = SimpleNamespace(problem="synthetic:40@/a/rather/long/folder/of/machines/cpu-only.json",
                                measurements_used=64, batch_best_runtime_s=0.0213)
        progress.update(metrics)
        printed = progress._bar.console.file.getvalue()
    line = " ".join(printed.split())
    assert "64/2048" in line and "cpu-only.json: batch best 0.0213 s" in line and "0:00:0" in line, printed


def test_search_cli__the_tf_measurers_actors_print_no_tensorflow_start_up_lines(tmp_path):
    """`--measurer tf` through the pool: each actor's TensorFlow wrote its C++ start-up lines (oneDNN, "could
    not find cuda drivers", CPU features) to stderr, which Ray forwarded to the user's terminal."""
    from measurers.machine import Device, Link, Machine
    from measurers.machine_json import save_machine

    env = {k: v for k, v in _plain_shell_env(under_make=True).items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    graph, machine = tmp_path / "mlp.parquet", tmp_path / "two-cpus.json"
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "graphs", "import", "--keras",
                           "tests/fixtures/tiny_models.py:tiny_keras_mlp", "-o", str(graph)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    devices = tuple(Device(f"cpu:{i}", "cpu", "test-cpu", 1e11, 1e10, 2**30, 1e-6) for i in range(2))
    save_machine(Machine("two-cpus", devices, (Link("cpu:0", "cpu:1", 1e9, 1e-6, "a"),
                                               Link("cpu:1", "cpu:0", 1e9, 1e-6, "b"))), machine)
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "search", "--graph", str(graph), "--machine",
                           str(machine), "--measurer", "tf", "--policy", "random", "--budget", "4", "--workers", "1",
                           "--runs", "1", "--warmup", "0", "--out", str(tmp_path / "runs"), "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["measurements"] == 4
    noise = [line for line in done.stderr.splitlines()
             if any(n in line.lower() for n in ("onednn", "cuda drivers", "cpu_feature_guard", "absl", "cuinit"))]
    assert noise == [], "\n".join(noise[:5])
