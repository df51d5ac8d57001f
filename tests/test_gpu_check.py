"""The GPU validation script (`make gpu-check`): its CPU smoke mode runs the whole pipeline, and without
CUDA the plain run says it skipped and exits 0."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tests/gpu_check.py", *args], cwd=REPO, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)


def test_gpu_check__cpu_smoke_profiles_measures_and_compares_30_placements(tmp_path):
    done = _run("--cpu-smoke", "--save", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "(ok)" in line]
    assert len(rows) == 30
    assert "30/30 placements measured ok; Kendall tau" in done.stdout and "MAPE" in done.stdout
    _check_saved_run_simulates_again(tmp_path / "run")


def _check_saved_run_simulates_again(folder: Path) -> None:
    """--save keeps what simulating the run again elsewhere needs: the same simulated times come back."""
    import json

    import numpy as np

    from graphs.io import load_graph_file
    from measurers.catalog import machine_from_json
    from measurers.sim.costs import load_profile
    from measurers.sim.reference import Simulator

    graph, profile = load_graph_file(folder / "graph.parquet"), load_profile(folder / "profile.json")
    placements = np.load(folder / "placements.npy")  # (K, N)
    rows = json.loads((folder / "measured.json").read_text())["rows"]
    machines = json.loads((folder / "machines.json").read_text())
    assert len(rows) == len(placements) == 30 and set(machines) == {"catalog links", "measured links"}
    for label, machine_json in machines.items():
        simulator = Simulator(graph, machine_from_json(machine_json), profile=profile)
        assert [simulator.run(p).runtime_s for p in placements] == pytest.approx([row[label] for row in rows])


def test_gpu_check__without_cuda_skips_cleanly():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the plain run validates it instead")
    done = _run()
    assert done.returncode == 0 and "skipped" in done.stdout
    assert "gpu-check (OpenVINO): skipped: no OpenVINO GPU" in done.stdout  # this box has no Intel GPU either


def test_gpu_check__without_openvino_says_so_and_goes_on(tmp_path):
    """A GPU machine's Python may lack OpenVINO: the OpenVINO line says so and the CUDA check still runs."""
    blocker = tmp_path / "openvino"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked for this test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    done = subprocess.run([sys.executable, "tests/gpu_check.py"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gpu-check (OpenVINO): skipped: OpenVINO is not installed" in done.stdout


def test_gpu_check__save_to_a_file_is_refused_before_the_run(tmp_path):
    """It ran the whole validation (minutes of a lent GPU) and then failed to make the folder."""
    taken = tmp_path / "results"
    taken.write_text("")
    done = _run("--cpu-smoke", "--save", str(taken))
    assert done.returncode == 2 and f"--save {taken} is a file, not a folder" in done.stderr
    assert "captured the step" not in done.stdout


def test_gpu_cli_check__cpu_smoke_runs_the_users_commands_each_in_its_own_process():
    done = subprocess.run([sys.executable, "tests/gpu_cli_check.py", "--cpu-smoke"], cwd=REPO, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "machine with no link to measure (one device)" in done.stdout
    assert "| cpu-only | " in done.stdout and "(ok)" in done.stdout
    assert "gpu-cli-check: 1/1 placements measured ok" in done.stdout


def test_gpu_cli_check__without_cuda_skips_cleanly():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the plain run validates it instead")
    done = subprocess.run([sys.executable, "tests/gpu_cli_check.py"], cwd=REPO, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "skipped" in done.stdout
