"""`placer train` (checkpoint, metrics, resume, JSON, bad input writing nothing) and `placer search --init
--order` with the graph-neural placers: a trained checkpoint placing zero-shot and fine-tuning, bad
checkpoints refused with one error line naming the file before anything starts."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from conftest import one_placer_error  # noqa: E402

pytestmark = pytest.mark.slow
GRAPH = "synthetic:300"
SMALL = ["--machines", "paper-2gpu", "--groups", "8", "--batch", "4", "--hidden", "8", "--layers", "1"]
SEARCH = ["--graph", GRAPH, "--machine", "paper-2gpu", "--groups", "8", "--batch", "4", "--workers", "1",
          "--bound-time-limit", "0"]
SEARCH_HSDAG = ["--graph", GRAPH, "--machine", "paper-2gpu", "--batch", "4", "--workers", "1",
                "--bound-time-limit", "0"]
"""SEARCH for hsdag, which groups the colocation groups itself: --groups is refused with it."""


def _train(out: Path, *flags: str, policy: str = "gdp", budget: int = 48) -> int:
    from cluster.cli import main

    return main(["train", "--policy", policy, "--graphs", GRAPH, *SMALL, "--budget", str(budget), "-o", str(out),
                 *flags])


def _metrics(path: Path):
    import pyarrow.parquet as pq

    return pq.read_table(Path(str(path) + ".metrics.parquet")).to_pylist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A gdp checkpoint of 48 measurements on synthetic:300 and the `--json` document its training printed."""
    out = tmp_path_factory.mktemp("train") / "gdp.pt"
    capture = pytest.MonkeyPatch()
    stdout = io.StringIO()
    capture.setattr(sys, "stdout", stdout)
    try:
        assert _train(out, "--json") == 0
    finally:
        capture.undo()
    return out, stdout.getvalue()


@pytest.fixture(scope="module")
def local_ray():
    from cluster import ray_setup

    ray_setup.init_ray(num_cpus=2)
    yield
    ray_setup.shutdown_ray()


def test_train__writes_a_checkpoint_and_one_metrics_row_per_update(trained):
    from policies.rl.gnn.checkpoint import read_checkpoint
    from policies.rl.gnn.trainer import UpdateMetrics

    out, printed = trained
    data = json.loads(printed)  # exactly one JSON document, nothing else on stdout
    state = read_checkpoint(out, "gdp")
    assert state["progress"]["problems"] == [f"{GRAPH}@paper-2gpu"] == data["problems"]
    assert state["architecture"] == {"kind": "gdp", "hidden_size": 8, "num_layers": 1}
    rows = _metrics(out)
    assert len(rows) == data["updates"] == state["progress"]["updates"] >= 2
    assert list(rows[0]) == [f.name for f in fields(UpdateMetrics)]
    assert [r["iteration"] for r in rows] == list(range(len(rows)))
    assert 40 <= data["measurements"] <= 48 and rows[-1]["measurements_used"] == data["measurements"]
    assert data["stop_reason"] == "budget" and data["checkpoint"] == str(out) and data["policy"] == "gdp"
    assert data["resume"] == str(out) + ".resume"


def test_train__resume_continues_the_same_problems_and_appends_metrics(trained, tmp_path, capsys, monkeypatch):
    from policies.rl.gnn import family
    from policies.rl.gnn.checkpoint import read_checkpoint

    source, printed = trained
    out = tmp_path / "gdp.pt"
    shutil.copy(source, out)
    shutil.copy(str(source) + ".metrics.parquet", str(out) + ".metrics.parquet")
    before, first = json.loads(printed), _metrics(out)
    reads, read_resume_state = [], family.read_resume_state
    monkeypatch.setattr(family, "read_resume_state", lambda *a: reads.append(a) or read_resume_state(*a))
    assert _train(out, "--resume", "--json", budget=96) == 0
    assert len(reads) == 1  # checked once before training, not read again by train_family
    data = json.loads(capsys.readouterr().out)
    rows = _metrics(out)
    assert data["updates"] > before["updates"] and len(rows) == data["updates"]
    assert rows[:len(first)] == first  # the earlier rows kept, the new ones after them
    assert [r["iteration"] for r in rows] == list(range(len(rows)))
    assert read_checkpoint(out, "gdp")["progress"]["problems"] == before["problems"]
    assert before["measurements"] < data["measurements"] <= 96
    # every session's wall time, setup included: it was less than this session's alone (0.15 s against 0.94 s)
    assert data["wall_s"] >= before["wall_s"] + 0.9 * data["session_wall_s"]


def test_train__placeto_trains_and_prints_a_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "placeto.pt"
    assert _train(out, "--order", "bfs", policy="placeto", budget=40) == 0
    table = capsys.readouterr().out
    assert "placeto" in table and str(out) in table and "stopped by" in table
    assert len(_metrics(out)) >= 1


@pytest.mark.parametrize("policy, least", [("gdp", 2), ("placeto", 3), ("giph", 3)])
def test_train__the_least_budget_accepted_makes_an_update(tmp_path, capsys, policy, least):
    """placeto and giph measure their start before their first batch: at 2 both were accepted and trained
    nothing (0 updates, exit 0), and giph's first batch also came up short at 3."""
    out = tmp_path / f"{policy}.pt"
    assert _train(out, "--json", policy=policy, budget=least) == 0
    assert json.loads(capsys.readouterr().out)["updates"] == 1 and len(_metrics(out)) == 1


@pytest.mark.parametrize("flags, message", [
    (["--policy", "reinforce"], "unknown graph-neural policy 'reinforce'"),
    (["--graphs", "nmt-3"], "unknown graph 'nmt-3'"),
    (["--graphs", "families:x"], "bad --graphs entry 'families:x'"),
    (["--machines", "paper-3gpu"], "unknown machine 'paper-3gpu'"),
    (["--budget", "0"], "--budget must be a whole number of at least 1"),
    (["--budget", "1"], "--budget must be at least 2 measurements for gdp"),
    (["--policy", "placeto", "--budget", "2"], "--budget must be at least 3 measurements for placeto"),  # 0 updates
    (["--policy", "giph", "--budget", "2"], "--budget must be at least 3 measurements for giph"),
    (["--entropy", "nan"], "--entropy must be a finite number >= 0, got nan"),
    (["--entropy", "inf"], "--entropy must be a finite number >= 0, got inf"),  # trained nothing, exit 0
    (["--lr", "inf"], "--lr must be in (0, 1]"),  # NaN weights: a traceback from the sampler
    (["--lr", "1e30"], "--lr must be in (0, 1]"),
    (["--layers", "1000"], "--layers must be in 1..64"),
    (["--seed", "18446744073709551616"], "--seed must be a whole number in 0..4294967295"),  # METIS' traceback
    (["--groups", "0"], "--groups must be a whole number of at least 1"),
    (["--policy", "placeto", "--order", "sideways"], "unknown --order 'sideways'"),
    (["--order", "bfs"], "--order: only for --policy placeto (it visits groups in order), not 'gdp'"),  # ignored
    (["--graphs", "families:0"], "--graphs families:0: no graph to train on"),  # drew the bar first
    (["--graphs", "families:100000000"], "--graphs families:100000000: 100000000 graphs is more "
                                         "than the 10,000"),  # a list of 10^8 names: MemoryError
    (["--teacher-budget", "7"], "--teacher-budget 7 for each of 1 problem spends 7 of --budget 8"),
    (["--hidden", "7"], "gdp's --hidden must be a multiple of 4"),
    (["--resume"], "no such file"),
    (["--graphs", "synthetic:30", "synthetic:30:0"], "--graphs: 'synthetic:30' and 'synthetic:30:0' are the same "
                                                     "graph: give it once"),  # trained twice as often
    (["--machines", "paper-2gpu", "measurers/catalog/paper-2gpu.json"], "--machines: 'paper-2gpu' and "
     "'measurers/catalog/paper-2gpu.json' are the same machine: give it once"),
])
def test_train__bad_input_is_one_error_and_writes_nothing(tmp_path, capsys, flags, message):
    from cluster.cli import main

    base = {"--policy": "gdp", "--graphs": GRAPH, "--machines": "paper-2gpu", "--budget": "8", "--groups": "8"}
    args = ["train", "-o", str(tmp_path / "c.pt")]
    for flag, value in base.items():
        args += [flag, value] if flag not in flags else []
    assert main(args + flags) == 2
    assert message in one_placer_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_train__existing_output_and_bad_resumes_are_refused(trained, tmp_path, capsys):
    source, _ = trained
    out = tmp_path / "c.pt"
    out.write_bytes(b"mine")
    assert _train(out) == 2
    assert f"{out} exists: pass --resume to continue it, or choose another path" in one_placer_error(capsys)
    assert _train(out, "--resume") == 2  # random bytes: damaged
    assert f"checkpoint {out} is damaged" in one_placer_error(capsys)
    other = tmp_path / "other.pt"
    shutil.copy(source, other)
    assert _train(other, "--resume", policy="placeto") == 2
    assert f"checkpoint {other} is a gdp checkpoint, not placeto" in one_placer_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "other.pt"] and out.read_bytes() == b"mine"


def test_train__a_resume_that_differs_is_refused_before_training(trained, tmp_path, capsys, monkeypatch):
    """Another network or a budget below what the checkpoint measured: one error before the progress bar
    (training is never entered) and the checkpoint unchanged."""
    import cluster.commands.train as train_command

    source, _ = trained
    out = tmp_path / "gdp.pt"
    shutil.copy(source, out)
    before = out.read_bytes()
    monkeypatch.setattr(train_command, "_train", lambda *a, **k: pytest.fail("training started"))
    wider = [*SMALL[:-4], "--hidden", "16", "--layers", "1"]
    from cluster.cli import main
    assert main(["train", "--policy", "gdp", "--graphs", GRAPH, *wider, "--budget", "96", "-o", str(out),
                 "--resume"]) == 2
    assert "holds a network" in one_placer_error(capsys)
    assert _train(out, "--resume", budget=8) == 2
    assert f"--budget 8: checkpoint {out} has made " in one_placer_error(capsys)
    assert _train(out, "--resume", "--lr", "0.002", "--entropy", "0", budget=96) == 2
    assert f"checkpoint {out} was trained with --lr 0.001 (not 0.002), --entropy 0.01 (not 0.0): resume with the " \
           "same training settings" in one_placer_error(capsys)
    assert out.read_bytes() == before


def test_train__a_resume_with_a_teacher_the_run_did_not_have_is_refused(trained, tmp_path, capsys, monkeypatch):
    """A resume keeps --teacher-budget and --imitation-steps as it keeps the other settings: a new teacher
    budget ran teachers and imitation mid-training."""
    import cluster.commands.train as train_command

    out = tmp_path / "gdp.pt"
    shutil.copy(trained[0], out)
    monkeypatch.setattr(train_command, "_train", lambda *a, **k: pytest.fail("training started"))
    assert _train(out, "--resume", "--teacher-budget", "8", "--imitation-steps", "5", budget=96) == 2
    err = one_placer_error(capsys)
    assert f"checkpoint {out} was trained with --teacher-budget unset (not 8), --imitation-steps unset (not 5)" in err
    assert _train(out, "--resume", "--seed", "4", budget=96) == 2  # the whole settings dicts were printed
    assert f"checkpoint {out} was trained with --seed 0 (not 4): resume with the same settings" in \
        one_placer_error(capsys)


def test_train__writes_the_memo_beside_the_checkpoint_and_a_cut_short_one_is_refused_writing_nothing(
        trained, tmp_path, capsys):
    """The memo of measured placements is in CHECKPOINT.resume, not in the checkpoint; a resume file of
    another update than its checkpoint (a save cut short) is one error naming it, exit 2, and the checkpoint,
    the metrics and the resume file stay as they were."""
    import torch

    from policies.rl.gnn.checkpoint import read_checkpoint, resume_path

    source, _ = trained
    assert "slots" not in read_checkpoint(source, "gdp")["progress"] and resume_path(source).is_file()
    out, metrics = tmp_path / "gdp.pt", Path(str(tmp_path / "gdp.pt") + ".metrics.parquet")
    for suffix in ("", ".metrics.parquet", ".resume"):
        shutil.copy(str(source) + suffix, str(out) + suffix)
    state = torch.load(resume_path(out), weights_only=True)
    state["updates"] += 1
    torch.save(state, resume_path(out))
    before = {path: path.read_bytes() for path in (out, metrics, resume_path(out))}
    assert _train(out, "--resume", budget=96) == 2
    assert f"{resume_path(out)} was written at update" in one_placer_error(capsys)
    assert {path: path.read_bytes() for path in before} == before


def test_train__resume_with_a_damaged_metrics_file_is_refused_and_a_missing_one_noted(trained, tmp_path, capsys):
    source, printed = trained
    out, metrics = tmp_path / "gdp.pt", Path(str(tmp_path / "gdp.pt") + ".metrics.parquet")
    shutil.copy(source, out)
    before = out.read_bytes()
    metrics.write_bytes(b"not parquet")
    assert _train(out, "--resume", budget=96) == 2
    assert f"{metrics} is damaged" in one_placer_error(capsys)
    assert out.read_bytes() == before and metrics.read_bytes() == b"not parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"op": ["a", "b"], "device": [0, 1]}), metrics)  # another Parquet file
    assert _train(out, "--resume", budget=96) == 2
    assert f"{metrics} is not a training metrics file (columns op, device)" in one_placer_error(capsys)
    assert out.read_bytes() == before
    metrics.unlink()
    assert _train(out, "--resume", "--json", budget=96) == 0
    captured = capsys.readouterr()
    assert f"placer: note: {metrics} is missing: it will hold the rows of this run's updates only" in captured.err
    data = json.loads(captured.out)
    assert len(_metrics(out)) == data["session_updates"] == data["updates"] - json.loads(printed)["updates"] > 0


def test_train__an_interrupt_stops_after_a_whole_update_saves_the_checkpoint_and_resume_continues(
        tmp_path, capsys, monkeypatch):
    import signal

    import cluster.commands.train as train_command
    from policies.rl.gnn.checkpoint import read_checkpoint

    real_update = train_command._Progress.update

    def update_then_interrupt(self, metrics):
        real_update(self, metrics)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C during the first update's bookkeeping

    monkeypatch.setattr(train_command._Progress, "update", update_then_interrupt)
    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs as a background job
    out = tmp_path / "gdp.pt"
    assert _train(out, "--json") == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out)["stop_reason"] == "interrupted"
    assert "placer: train interrupted; the checkpoint holds its 1 updates: pass --resume" in captured.err
    assert read_checkpoint(out, "gdp")["progress"]["updates"] == 1 and len(_metrics(out)) == 1
    assert signal.getsignal(signal.SIGINT) is handler_before  # the handler is put back
    monkeypatch.undo()
    assert _train(out, "--resume", "--json") == 0
    assert json.loads(capsys.readouterr().out)["stop_reason"] == "budget" and len(_metrics(out)) > 1


def test_train__progress_in_a_log_shows_before_training_ends(capsys):
    """In a Ray job's log (no terminal) rich drew the bar only when training ended."""
    from types import SimpleNamespace

    from cluster.commands import train as train_command

    with train_command._Progress(96) as progress:
        progress.update(SimpleNamespace(problem="nmt-2/paper-2gpu", batch_best_runtime_s=0.5, measurements_used=16))
        err = capsys.readouterr().err  # while training still runs
    line, = [line for line in err.splitlines() if line]
    assert line.startswith("train ") and "16/96" in line and "batch best 0.5000 s" in line, err


def test_train__families_expand_and_held_out_benchmarks_are_noted(capsys, monkeypatch):
    from cluster.cli import main
    from cluster.commands import train

    assert train.expand_graphs(["families:2:5", GRAPH, "families:1"]) == [
        "family:rnn:5", "family:cnn:6", GRAPH, "family:rnn:0"]

    def stop(*_args):
        raise KeyboardInterrupt

    held_out = _problem(SimpleNamespace(source="benchmark transformer {'layers': 6}", name="transformer",
                                        framework="torch"))
    monkeypatch.setattr(train, "_problems", lambda *_args: [held_out])  # the graphs as loaded
    monkeypatch.setattr(train, "MetricsLog", stop)  # after the note, before anything is written
    assert main(["train", "--policy", "gdp", "--graphs", "transformer", GRAPH, "--machines", "paper-2gpu",
                 "--budget", "8", "-o", "/nonexistent-dir/c.pt"]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("placer: note: training on held-out benchmark transformer: the committed")


def test_train__groups_above_a_graphs_colocation_groups_are_noted(capsys):
    """`--groups 16 32 64` on a graph of 6 colocation groups trained one problem three times, saying nothing
    (search, baselines and graphs show say "using 6")."""
    from cluster.commands import train

    args = SimpleNamespace(groups=[4, 64], grouping=None, seed=0)
    problems = train._problems(["synthetic:30"], ["paper-2gpu"], args)
    colocation = problems[0].problem.graph.num_colocation_groups
    assert 4 < colocation < 64
    err = capsys.readouterr().err.splitlines()
    assert err == [f"placer: note: --groups 64 is more than the {colocation} colocation groups of graph "
                   f"'synthetic:30:0'; using {colocation}"]


def _problem(graph, machine_name: str = "paper-2gpu"):
    return SimpleNamespace(problem=SimpleNamespace(graph=graph, machine=SimpleNamespace(name=machine_name)))


def test_held_out_notes__by_the_graphs_own_source_imported_graphs_and_held_out_machines():
    """The held-out check read the --graphs names only: a file exported from nmt-8, an imported model and
    hetero:1000 trained with no note."""
    from cluster.commands.train import held_out_notes

    exported = SimpleNamespace(source="benchmark nmt-8 {'layers': 8}", name="nmt-8", framework="torch")
    imported = SimpleNamespace(source="keras mobilenetv2_1.00_224 + SGD", name="keras-mobilenetv2",
                               framework="tensorflow")
    family = SimpleNamespace(source="family:rnn:1: rnnlm {}", name="family:rnn:1", framework="torch")
    trained_on = SimpleNamespace(source="benchmark nmt-2 {'layers': 2}", name="nmt-2", framework="torch")
    assert held_out_notes([_problem(family), _problem(trained_on), _problem(trained_on, "hetero:999")]) == []
    notes = held_out_notes([_problem(exported), _problem(imported), _problem(family, "hetero:1000")])
    assert [note.split(":")[0] for note in notes] == ["training on held-out benchmark nmt-8",
                                                      "training on imported graph keras-mobilenetv2",
                                                      "training on held-out machine hetero"]


def test_search__gdp_from_a_checkpoint_places_zero_shot_then_fine_tunes(trained, local_ray, tmp_path, capsys):
    from cluster.cli import main
    from cluster.runlog import read_manifest

    checkpoint, _ = trained
    out = tmp_path / "runs"
    assert main(["search", *SEARCH, "--policy", "gdp", "--init", str(checkpoint), "--budget", "1", "--out", str(out),
                 "--json"]) == 0
    zero_shot = json.loads(capsys.readouterr().out)
    assert zero_shot["policy"] == "gdp" and zero_shot["measurements"] == 1
    assert zero_shot["policy_best_runtime_s"] > 0
    assert read_manifest(zero_shot["run_dir"]).config["init"] == str(checkpoint)
    assert zero_shot["policy_notes"].startswith(f"weights: {checkpoint}")  # which weights it placed with
    assert main(["search", *SEARCH, "--policy", "gdp", "--init", str(checkpoint), "--budget", "1", "--out", str(out)]) == 0
    assert f"gdp: weights: {checkpoint}" in capsys.readouterr().out.replace("\n", "")  # the table says so too
    assert main(["search", *SEARCH, "--policy", "gdp", "--init", str(checkpoint), "--budget", "32", "--out", str(out),
                 "--json"]) == 0
    tuned = json.loads(capsys.readouterr().out)
    assert 1 < tuned["measurements"] <= 32 and tuned["seconds_per_update"] > 0
    assert tuned["policy_best_runtime_s"] <= zero_shot["policy_best_runtime_s"]  # it measures the zero shot first


def test_search__a_gdp_run_resumes_from_any_folder_after_its_init_file_moved(trained, local_ray, tmp_path, capsys,
                                                                              monkeypatch):
    """The manifest holds --init as an absolute path, and a resume reads the run's own learner.pt, not the
    --init file: it was refused ("checkpoint ../init.pt: no such file") from another folder or once moved."""
    import shutil

    from cluster.cli import main
    from cluster.runlog import read_manifest

    (tmp_path / "work").mkdir()
    shutil.copy(trained[0], tmp_path / "init.pt")
    monkeypatch.chdir(tmp_path / "work")
    assert main(["search", *SEARCH, "--policy", "gdp", "--init", "../init.pt", "--budget", "12", "--out", "runs",
                 "--json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"]).resolve()
    assert read_manifest(run_dir).config["init"] == str(tmp_path / "init.pt")
    (tmp_path / "init.pt").rename(tmp_path / "moved.pt")
    monkeypatch.chdir(tmp_path)
    assert main(["search", "--resume", str(run_dir), "--budget", "24", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["measurements"] == 24


def _bad_checkpoints(source: Path, folder: Path) -> list[tuple[Path, str, str]]:
    """(file, policy it is given to, what the error says) for each kind of bad --init."""
    import numpy as np
    import torch

    truncated = folder / "truncated.pt"
    truncated.write_bytes(source.read_bytes()[:1000])
    noise = folder / "noise.pt"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    learner = folder / "learner.pt"  # what a reinforce search's checkpoint folder holds
    torch.save({"policy": "reinforce", "iteration": 3, "weights": {"w": torch.zeros(2)}}, learner)
    edited = folder / "edited.pt"
    state = torch.load(source, weights_only=True)
    first = next(iter(state["feature_layout"]))
    state["feature_layout"][first] = state["feature_layout"][first][::-1]
    torch.save(state, edited)
    array = folder / "placement.npy"  # a numpy file (a pickle of objects torch's safe loader refuses)
    np.save(array, np.zeros(3, dtype=object), allow_pickle=True)
    return [(truncated, "gdp", "damaged or truncated"), (noise, "gdp", "damaged or not a checkpoint placer"),
            (array, "gdp", "damaged or not a checkpoint placer wrote: torch's safe loader refuses it (Unsupported"),
            (learner, "gdp", "not a gdp/placeto/giph checkpoint"), (source, "placeto", "a gdp checkpoint, not placeto"),
            (edited, "gdp", "another feature layout"), (_flipped(source, folder), "gdp", "fails its checksum"),
            *_broken_archives(source, folder), *_edited_networks(source, folder)]


def _broken_archives(source: Path, folder: Path) -> list[tuple[Path, str, str]]:
    """The checkpoint with one byte flipped in the zip's own records: a member's name in its local header
    (zipfile raised UnicodeDecodeError) and the zip64 end record (BadZipFile, "span multiple disks")."""
    data = source.read_bytes()
    broken = []
    for name, offset in (("flipped-name", 40), ("flipped-end", len(data) - 37)):
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        path = folder / f"{name}.pt"
        path.write_bytes(bytes(flipped))
        broken.append((path, "gdp", "is damaged"))
    return broken


def _flipped(source: Path, folder: Path) -> Path:
    """The checkpoint with bytes flipped inside its largest tensor (a zip entry whose CRC no longer fits)."""
    import zipfile

    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        entry = max(archive.infolist(), key=lambda info: info.file_size)
    header = entry.header_offset
    name_length, extra_length = (int.from_bytes(data[header + k:header + k + 2], "little") for k in (26, 28))
    start = header + 30 + name_length + extra_length + entry.file_size // 2  # the middle of its data
    data[start:start + 16] = bytes(b ^ 0xFF for b in data[start:start + 16])
    path = folder / "flipped.pt"
    path.write_bytes(bytes(data))
    return path


def _edited_networks(source: Path, folder: Path) -> list[tuple[Path, str, str]]:
    """Checkpoints that read and pass the format checks but hold a network this version cannot run."""
    import torch

    def edited(name: str, change) -> Path:
        state = torch.load(source, weights_only=True)
        change(state)
        path = folder / f"{name}.pt"
        torch.save(state, path)
        return path

    def first_weight(state) -> str:
        return next(iter(state["trainer"]["net"]))

    return [
        (edited("odd-width", lambda s: s["architecture"].update(hidden_size=7)), "gdp", "multiple of 4"),
        (edited("other-kind", lambda s: s["architecture"].update(kind="zzz")), "gdp", "holds a 'zzz' network"),
        (edited("bad-shape", lambda s: s["trainer"]["net"].update({first_weight(s): torch.zeros(3)})), "gdp",
         "do not fit its architecture"),
        # integer weights were taken, read as zeros
        (edited("int-weights", lambda s: s["trainer"]["net"].update({first_weight(s): s["trainer"]["net"][
            first_weight(s)].to(torch.int64)})), "gdp", "holds torch.int64, not torch.float32"),
        (edited("nan", lambda s: s["trainer"]["net"][first_weight(s)].fill_(float("nan"))), "gdp",
         "NaN or infinite"),
        (edited("huge", lambda s: s["architecture"].update(num_layers=10**12)), "gdp",  # built: 23 GB and on
         "num_layers must be in 1..64"),
        (edited("no-config", lambda s: s["trainer"].pop("config")), "gdp", "lacks its trainer settings"),
        # a resumed training run went on from these: `train --resume` ended in a traceback
        (edited("text-count", lambda s: s["progress"].update(measurements_used="abc")), "gdp",
         "progress.measurements_used is 'abc', not a whole number"),
        (edited("negative-updates", lambda s: s["progress"].update(updates=-3)), "gdp",
         "progress.updates is -3, not a whole number"),
        (edited("nan-wall", lambda s: s["progress"].update(wall_s=float("nan"))), "gdp",
         "progress.wall_s is nan, not a time"),
    ]


def test_search__bad_init_files_are_one_error_naming_the_file(trained, tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "runs"
    for path, policy, message in _bad_checkpoints(trained[0], tmp_path):
        assert main(["search", *SEARCH, "--policy", policy, "--init", str(path), "--budget", "8",
                     "--out", str(out)]) == 2, path
        err = one_placer_error(capsys)
        assert f"checkpoint {path}" in err and message in err, err
    assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--policy", "reinforce", "--init", "scratch"], "--init: only for --policy gdp or placeto or giph or hsdag, not 'reinforce'"),
    (["--policy", "hsdag", "--init", "gdp.pt"], "--init: hsdag starts from scratch or pretrained"),
    (["--policy", "random", "--order", "bfs"], "--order: only for --policy placeto (it visits groups in order)"),
    (["--policy", "gdp", "--init", "scratch", "--order", "bfs"], "--order: only for --policy placeto"),
    (["--policy", "placeto", "--init", "scratch", "--order", "sideways"], "--order: unknown order 'sideways'"),
    (["--policy", "gdp", "--passes", "2"], "--passes: only for --policy placeto (its zero-shot decode), not 'gdp'"),
    (["--policy", "placeto", "--passes", "0"], "--passes must be a whole number from 1 to 64, got 0"),
    # 10**8 passes decoded for minutes before the first measurement, deaf to --time-limit
    (["--policy", "placeto", "--passes", "100000000"], "--passes must be a whole number from 1 to 64, got 100000000"),
])
def test_search__init_order_and_passes_belong_to_the_graph_neural_policies(tmp_path, capsys, flags, message):
    from cluster.cli import main

    search = SEARCH_HSDAG if "hsdag" in flags else SEARCH
    assert main(["search", *search, *flags, "--budget", "8", "--out", str(tmp_path / "runs")]) == 2
    assert message in one_placer_error(capsys)
    assert not (tmp_path / "runs").exists()


def test_search__passes_sets_placetos_zero_shot_decode_and_its_run_records_it(tmp_path, capsys):
    """On synthetic:300 / paper-2gpu the committed placeto.pt's second greedy pass moves groups: one pass and
    the default two give other zero shots."""
    from cluster.cli import main

    zero_shot = ["search", "--graph", "synthetic:300", "--machine", "paper-2gpu", "--policy", "placeto",
                 "--budget", "1", "--workers", "1", "--bound-time-limit", "0", "--out", str(tmp_path), "--json"]
    steps_s, passes = [], []
    for flags in (["--passes", "1"], []):
        assert main([*zero_shot, *flags]) == 0
        result = json.loads(capsys.readouterr().out)
        steps_s.append(result["policy_best_runtime_s"])
        passes.append(json.loads((Path(result["run_dir"]) / "manifest.json").read_text())["config"]["passes"])
    assert passes == [1, None]
    assert steps_s[0] != steps_s[1]


def test_search__a_missing_pretrained_checkpoint_says_to_pass_init_scratch(tmp_path, capsys, monkeypatch):
    from cluster.cli import main
    from policies.rl.gnn import checkpoint

    monkeypatch.setattr(checkpoint, "PRETRAINED_DIR", tmp_path / "pretrained")
    assert main(["search", *SEARCH, "--policy", "placeto", "--budget", "8", "--out", str(tmp_path / "runs")]) == 2
    err = one_placer_error(capsys)
    assert str(tmp_path / "pretrained" / "placeto.pt") in err and "--init scratch" in err
    assert not (tmp_path / "runs").exists()


def test_search__hsdag_pretrained_with_a_damaged_gdp_checkpoint_is_refused_before_the_run_folder(
        tmp_path, capsys, monkeypatch):
    """hsdag's --init pretrained reads gdp's committed checkpoint: read with the other settings, not after the
    run folder held a manifest, the grouping and a part of the measurements."""
    from cluster.cli import main
    from policies.rl.gnn import checkpoint
    from policies.rl.gnn.hsdag.policy import _pretrained_state

    damaged = tmp_path / "pretrained" / "gdp.pt"
    damaged.parent.mkdir()
    damaged.write_bytes(checkpoint.pretrained_path("gdp").read_bytes()[:1000])
    monkeypatch.setattr(checkpoint, "PRETRAINED_DIR", damaged.parent)
    _pretrained_state.cache_clear()  # an earlier test may have read the committed one
    try:
        assert main(["search", *SEARCH_HSDAG, "--policy", "hsdag", "--init", "pretrained", "--budget", "8",
                     "--out", str(tmp_path / "runs")]) == 2
    finally:
        _pretrained_state.cache_clear()
    err = one_placer_error(capsys)
    assert f"checkpoint {damaged}" in err and "damaged or truncated" in err, err
    assert not (tmp_path / "runs").exists()


def test_search__an_hsdag_resume_whose_learner_does_not_fit_is_refused_before_the_folder_changes(tmp_path):
    """A resumed hsdag run's own learner.pt is checked with the other settings (gdp, placeto and giph's were
    already): a wrong-shape weight raised a RuntimeError after the resume was recorded."""
    import torch

    from cluster.jobs import SearchConfig, check_search_config
    from graphs.errors import PlacerError
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.base import RunContext
    from policies.problem import make_problem
    from policies.rl.gnn.hsdag.policy import HsdagPolicy

    graph, machine = load_graph("synthetic:60"), load_machine("paper-2gpu")
    run = tmp_path / "run"
    HsdagPolicy(RunContext(checkpoint_dir=run / "checkpoint"), init="scratch").place(
        make_problem(graph, machine, max_groups=8), SimulatorMeasurer(graph, machine), 2, 0)
    learner = run / "checkpoint" / "learner.pt"
    state = torch.load(learner, weights_only=True)
    state["trainer"]["net"]["encoder.embed.0.weight"] = torch.zeros(3, 3)
    torch.save(state, learner)
    before = learner.read_bytes()
    with pytest.raises(PlacerError, match="its weights do not fit hsdag's network") as error:
        check_search_config(SearchConfig(graph="synthetic:60", policy="hsdag", init="scratch", budget=16,
                                         groups=8, resume=str(run)))
    assert str(learner) in str(error.value)
    assert [p.name for p in run.rglob("*")] == ["checkpoint", "learner.pt"] and learner.read_bytes() == before


def test_train__several_group_counts_and_a_teacher(tmp_path, capsys):
    """--groups 4 6 trains on the graph grouped both ways (one problem each, named /G); --teacher-budget
    gives every problem a teacher the checkpoint keeps, inside the budget."""
    from cluster.cli import main
    from policies.rl.gnn.checkpoint import read_checkpoint

    out = tmp_path / "gdp.pt"
    flags = ["--machines", "paper-2gpu", "--groups", "4", "6", "--batch", "4", "--hidden", "8", "--layers", "1"]
    assert main(["train", "--policy", "gdp", "--graphs", GRAPH, *flags, "--budget", "60", "-o", str(out),
                 "--teacher-budget", "12", "--imitation-steps", "5", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["problems"] == [f"{GRAPH}@paper-2gpu/4", f"{GRAPH}@paper-2gpu/6"]
    progress = read_checkpoint(out, "gdp")["progress"]
    assert set(progress["teachers"]) == set(summary["problems"])
    assert progress["measurements_used"] <= 60 and summary["measurements"] == progress["measurements_used"]
    # a checkpoint taught before its settings kept the teacher's: it resumes with the flags it was trained with
    from policies.rl.gnn.checkpoint import write_checkpoint

    state = read_checkpoint(out, "gdp")
    assert {"teacher_budget": 12, "imitation_steps": 5}.items() <= state["progress"]["settings"].items()
    for key in ("teacher_budget", "imitation_steps"):
        del state["progress"]["settings"][key]
    write_checkpoint(out, "gdp", state["trainer"], state["progress"])
    assert main(["train", "--policy", "gdp", "--graphs", GRAPH, *flags, "--budget", "64", "-o", str(out),
                 "--resume", "--teacher-budget", "12", "--imitation-steps", "5", "--json"]) == 0, capsys.readouterr()


def test_train__an_interrupt_while_the_teachers_search_writes_nothing(tmp_path, capsys, monkeypatch):
    """Teachers kept from part of the problems would never be completed by a resume (it skips teaching):
    so a stop before every teacher is done keeps nothing, and the run starts again."""
    import signal

    import policies.rl.gnn.family as family

    real_teach = family.teach

    def teach_then_interrupt(*args, **kwargs):
        found = real_teach(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while the first teacher searched
        return found

    monkeypatch.setattr(family, "teach", teach_then_interrupt)
    out = tmp_path / "gdp.pt"
    assert _train(out, "--teacher-budget", "8", "--json") == 130
    captured = capsys.readouterr()
    assert "interrupted while its teachers searched: nothing was written" in captured.err
    assert list(tmp_path.iterdir()) == []
    summary = json.loads(captured.out)  # it names no file it never wrote
    assert (summary["checkpoint"], summary["resume"], summary["metrics"], summary["stop_reason"]) == (
        None, None, None, "interrupted")


def test_train__a_crash_before_the_first_checkpoint_writes_nothing_and_the_path_stays_free(tmp_path, monkeypatch):
    """What a failure mid-training leaves: before a checkpoint is due, nothing (not a metrics file whose
    checkpoint is missing), so the same -o starts again without --resume."""
    from policies.rl.gnn.trainer import GnnTrainer

    real_iterate, calls = GnnTrainer.iterate, []

    def iterate_then_crash(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the simulator crashed")
        return real_iterate(self, *args, **kwargs)

    monkeypatch.setattr(GnnTrainer, "iterate", iterate_then_crash)
    out = tmp_path / "runs" / "gdp.pt"
    with pytest.raises(RuntimeError, match="the simulator crashed"):
        _train(out)
    assert not out.exists() and not Path(str(out) + ".metrics.parquet").exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    monkeypatch.undo()
    assert _train(out) == 0 and out.is_file()


@pytest.mark.parametrize("suffix, what", [(".metrics.parquet", "the metrics"), (".resume", "the resume state")])
def test_train__a_folder_where_the_metrics_or_the_resume_state_go_is_refused_before_training(tmp_path, capsys,
                                                                                              suffix, what):
    """Found only when they were first written: the metrics after training (the checkpoint written then made
    the same command fail as "exists"); the resume state at the first save, which it precedes, so no
    checkpoint was written at all."""
    out = tmp_path / "c.pt"
    Path(str(out) + suffix).mkdir()
    assert _train(out) == 2
    assert f"c.pt{suffix}, where {what} of -o" in one_placer_error(capsys)
    assert not out.exists()


def test_train__an_out_name_too_long_for_the_metrics_beside_it_is_refused_before_training(tmp_path, capsys):
    """-o of 215 bytes fits, but its .metrics.parquet's temporary name did not: the whole training ran, then
    failed without metrics, and a --resume failed the same way at its end."""
    out = tmp_path / ("c" * 190)
    assert _train(out) == 2
    assert one_placer_error(capsys).endswith(f"-o {out}: {out.name}.metrics.parquet, where the metrics go, cannot "
                                             "be written: a name of 206 bytes is too long: at most 199 (it is "
                                             "written under a name 56 bytes longer first); choose a shorter -o\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix, what", [(".metrics.parquet", "the metrics"), (".resume", "the resume state")])
def test_train__a_graph_file_read_where_the_metrics_or_the_resume_state_go_is_refused(tmp_path, capsys, suffix,
                                                                                     what):
    """`--graphs c.pt.metrics.parquet -o c.pt` trained, then wrote the metrics over the graph it read: exit 0,
    and the graph file was gone."""
    from cluster.cli import main
    from graphs.io import save_graph
    from graphs.registry import load_graph

    out = tmp_path / "c.pt"
    graph_file = Path(str(out) + suffix)
    save_graph(load_graph("synthetic:40"), graph_file)
    before = graph_file.read_bytes()
    assert main(["train", "--policy", "gdp", "--graphs", str(graph_file), *SMALL, "--budget", "8",
                 "-o", str(out)]) == 2
    assert one_placer_error(capsys) == (f"placer: error: {graph_file}, where {what} of -o {out} go, is a --graphs "
                                        "file this command reads: writing it would replace it; choose another -o\n")
    assert graph_file.read_bytes() == before and not out.exists()


def test_train__a_full_disk_at_the_first_checkpoint_is_one_error_naming_it_and_leaves_nothing(tmp_path, capsys,
                                                                                             monkeypatch):
    """torch's own writer turned a full disk into a RuntimeError ("unexpected pos 293760 vs 293648"): a
    traceback, and the resume state written before the checkpoint was left alone beside no checkpoint."""
    import errno

    real_write_bytes = Path.write_bytes

    def full_at_the_checkpoint(path, data):  # the checkpoint's temporary file: .c.pt.<pid>...tmp
        if path.name.startswith(".c.pt.") and not path.name.startswith(".c.pt.resume."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write_bytes(path, data)

    monkeypatch.setattr(Path, "write_bytes", full_at_the_checkpoint)
    out = tmp_path / "c.pt"
    assert _train(out, budget=8) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"placer: error: {out}: No space left on device"
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("policy", ["giph", "placeto"])
def test_train__a_graph_whose_step_costs_nothing_learns_with_finite_losses(tmp_path, capsys, policy):
    """synthetic:1 (one op of 0 FLOPs: a 0 s step from every placement): the moves' rewards were divided by the
    start's 0 s, every loss in the metrics was NaN and RLlib warned of NaN gradients, twice per parameter."""
    from cluster.cli import main

    out = tmp_path / "c.pt"
    assert main(["train", "--policy", policy, "--graphs", "synthetic:1", "--machines", "paper-2gpu", "--batch", "4",
                 "--hidden", "8", "--layers", "1", "--budget", "20", "-o", str(out), "--json"]) == 0
    losses = [row["loss"] for row in _metrics(out)]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert "nan/inf" not in capsys.readouterr().err


def test_train__a_second_process_on_the_same_checkpoint_is_refused_and_no_lock_file_stays(tmp_path, capsys):
    """Two trains (or two --resume) on one -o both ran and one overwrote the other's checkpoint; a resume
    reading while the other saved was refused as "a save was cut short", whose advice deletes the memo."""
    from graphs.files import file_lock

    out = tmp_path / "c.pt"
    with file_lock(Path(f"{out}.lock"), "another train"):  # as another process holding it
        assert _train(out, budget=8) == 2
        assert one_placer_error(capsys) == (f"placer: error: checkpoint {out} is in use by another process (pid "
                                            f"{os.getpid()}): wait for it to end, or stop it, and try again\n")
    assert not out.exists()
    assert _train(out, budget=8) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "c.pt.metrics.parquet", "c.pt.resume"]


def test_train__a_checkpoint_in_a_folder_not_made_yet_is_locked_too(tmp_path, capsys):
    """No lock was taken where -o's folder did not exist yet: two trains into a new folder both ran, the
    second overwriting the first's checkpoint, and both reported success."""
    from cluster.commands.train import _checkpoint_lock
    from graphs.errors import PlacerError

    out = tmp_path / "new" / "deeper" / "c.pt"
    with _checkpoint_lock(str(out)):
        assert Path(f"{out}.lock").is_file()
        with pytest.raises(PlacerError, match=f"checkpoint {out} is in use by another process"):
            with _checkpoint_lock(str(out)):
                pass
    assert not (tmp_path / "new").exists()  # nothing saved: the folders made for the lock are gone
    assert _train(out, "--batch", "0", budget=8) == 2  # refused after the lock was taken: nothing left either
    capsys.readouterr()
    assert not (tmp_path / "new").exists()
    assert _train(out, budget=8) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["c.pt", "c.pt.metrics.parquet", "c.pt.resume"]


def test_train__a_folder_another_train_removed_before_the_lock_is_made_again(tmp_path, monkeypatch):
    """Another train that saved nothing removed the folder it had made between this one's mkdir and its lock:
    "No such file or directory ... c.pt.lock" instead of the lock, which was free."""
    import shutil

    import graphs.files
    from cluster.commands.train import _checkpoint_lock

    real_lock, tries = graphs.files.file_lock, []

    def removed_first(path, named):
        tries.append(path)
        if len(tries) == 1:
            shutil.rmtree(path.parent)
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_lock(path, named)

    monkeypatch.setattr(graphs.files, "file_lock", removed_first)
    (tmp_path / "shared").mkdir()
    out = tmp_path / "shared" / "c.pt"
    with _checkpoint_lock(str(out)):
        assert Path(f"{out}.lock").is_file() and len(tries) == 2


@pytest.mark.parametrize("section", ["optimizers", "rng", "progress"])
def test_train__resume_of_a_checkpoint_without_what_resuming_reads_is_one_error(trained, tmp_path, capsys, section):
    import torch

    state = torch.load(trained[0], weights_only=True)
    if section == "progress":
        state["progress"] = None
    else:
        del state["trainer"][section]
    out = tmp_path / "gdp.pt"
    torch.save(state, out)
    assert _train(out, "--resume", budget=96) == 2
    name = section if section == "progress" else f"trainer.{section}"
    assert f"checkpoint {out} lacks {name}, which training reads to continue" in one_placer_error(capsys)


def test_train__resume_of_a_checkpoint_whose_progress_is_not_numbers_is_one_error(trained, tmp_path, capsys):
    """A text count passed the checks and ended `train --resume` in a traceback (int('abc'))."""
    import torch

    state = torch.load(trained[0], weights_only=True)
    for key, value, message in (("measurements_used", "abc", "progress.measurements_used is 'abc', not a whole"),
                                ("idle", 1.5, "progress.idle is 1.5, not a whole number"),
                                ("round", ["x"], "progress.round is ['x'], not a list of problem indices"),
                                ("round", [7], "progress.round names a problem past its 1"),
                                # these three ended it in an AttributeError or a TypeError
                                ("settings", "abc", "progress.settings is 'abc', not a table of settings"),
                                ("config", [1, 2], "progress.config is [1, 2], not a table of settings"),
                                ("problem_digests", 5, "progress.problem_digests is 5, not a list of strings")):
        edited = {**state, "progress": {**state["progress"], key: value}}
        out = tmp_path / f"{key}.pt"
        torch.save(edited, out)
        assert _train(out, "--resume", budget=96) == 2
        assert f"checkpoint {out}: {message}" in one_placer_error(capsys)


def test_train__a_time_limit_that_ends_the_teachers_writes_nothing_and_says_so_exit_1(tmp_path, capsys, monkeypatch):
    """It exited 0 with nothing written and nothing said: a scheduled job reported success."""
    import policies.rl.gnn.family as family

    real_teach, clock = family.teach, [0.0]

    def slow_teach(*args, **kwargs):
        clock[0] += 1e6  # as if the teacher searched past the limit
        return real_teach(*args, **kwargs)

    monkeypatch.setattr(family, "teach", slow_teach)
    real_early_stop = family.early_stop
    monkeypatch.setattr(family, "early_stop", lambda started, limit, should_stop: real_early_stop(
        started - clock[0], limit, should_stop))
    out = tmp_path / "gdp.pt"
    assert _train(out, "--teacher-budget", "8", "--time-limit", "60", "--json") == 1
    captured = capsys.readouterr()
    assert captured.err.count("placer: error: --time-limit 60 s ended train while its teachers searched before its "
                              "first update") == 1
    assert json.loads(captured.out)["checkpoint"] is None and list(tmp_path.iterdir()) == []


def test_train__a_time_limit_that_ends_it_before_its_first_update_writes_nothing_exit_1(tmp_path, capsys,
                                                                                         monkeypatch):
    """Building the learner took longer than --time-limit 3: it exited 0 and wrote a checkpoint of untrained
    weights, which `search --init` took."""
    import policies.rl.gnn.family as family

    monkeypatch.setattr(family, "early_stop", lambda started, limit, should_stop: "time_limit")
    out = tmp_path / "gdp.pt"
    assert _train(out, "--time-limit", "3", "--json") == 1
    captured = capsys.readouterr()
    assert captured.err.count("placer: error: --time-limit 3 s ended train before its first update: nothing was "
                              "written (0 measurements spent); give it more time\n") == 1
    assert json.loads(captured.out)["checkpoint"] is None and list(tmp_path.iterdir()) == []


def test_train__resume_on_a_graph_file_whose_contents_changed_is_refused(tmp_path, capsys):
    """Problems were named by path only: the old graph's measured placements were reused at their old costs."""
    from cluster.cli import main

    graph = tmp_path / "g.parquet"
    assert main(["graphs", "export", "synthetic:60", "-o", str(graph)]) == 0
    out = tmp_path / "gdp.pt"
    train = ["train", "--policy", "gdp", "--graphs", str(graph), *SMALL, "-o", str(out)]
    assert main([*train, "--budget", "24"]) == 0
    assert main(["graphs", "export", "synthetic:60:7", "-o", str(graph)]) == 0  # the same file, other contents
    capsys.readouterr()
    before = out.read_bytes()
    assert main([*train, "--budget", "48", "--resume"]) == 2
    assert f"checkpoint {out} was trained on other contents of {graph}@paper-2gpu" in one_placer_error(capsys)
    assert out.read_bytes() == before


def test_train__resume_keeps_the_metrics_rows_of_the_checkpoints_updates_by_iteration(trained, tmp_path, capsys):
    """A run killed between its checkpoint and the metrics file's rewrite: the rows were kept by position,
    and nothing said that some were missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cluster.commands.train import _schema

    source, printed = trained
    out, metrics = tmp_path / "gdp.pt", Path(str(tmp_path / "gdp.pt") + ".metrics.parquet")
    shutil.copy(source, out)
    rows = _metrics(source)
    kept = rows[:1] + rows[2:]  # the row of update 1 lost, and one of an update past the checkpoint
    kept.append({**rows[-1], "iteration": len(rows)})
    pq.write_table(pa.Table.from_pylist(kept, schema=_schema()), metrics)
    assert _train(out, "--resume", "--json", budget=96) == 0
    captured = capsys.readouterr()
    assert f"holds the rows of {len(rows) - 1} of the checkpoint's {len(rows)} updates" in captured.err
    iterations = [r["iteration"] for r in _metrics(out)]
    assert iterations == [0] + list(range(2, json.loads(captured.out)["updates"]))  # no duplicate, none after


def test_train__names_with_brackets_are_shown_as_they_are(tmp_path, capsys, monkeypatch):
    """A graph file under a folder `c[` raised rich's MarkupError: a traceback, exit 1."""
    from cluster.cli import main

    monkeypatch.setenv("COLUMNS", "300")
    folder = tmp_path / "c["
    folder.mkdir()
    graph = folder / "i].parquet"  # ".../c[/i].parquet": a closing tag with nothing open
    assert main(["graphs", "export", "synthetic:40", "-o", str(graph)]) == 0
    out = tmp_path / "gdp.pt"
    assert main(["train", "--policy", "gdp", "--graphs", str(graph), *SMALL, "--budget", "16", "-o", str(out)]) == 0
    assert f"{graph}@paper-2gpu" in capsys.readouterr().out.replace("\n", "")
