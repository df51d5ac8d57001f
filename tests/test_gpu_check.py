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


def test_gpu_check__cpu_smoke_profiles_measures_and_compares_30_placements():
    done = _run("--cpu-smoke")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "(ok)" in line]
    assert len(rows) == 30
    assert "30/30 placements measured ok; Kendall tau" in done.stdout and "MAPE" in done.stdout


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
