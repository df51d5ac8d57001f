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
