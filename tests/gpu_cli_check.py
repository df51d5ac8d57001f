"""The user's path on a GPU node, command by command (`make gpu-check`, after tests/gpu_check.py).

Each `placer` command runs in a process of its own, as a user runs them: import a model, profile it with
`--machine-out`, then simulate and measure a few heuristics' placements on the machine file written. A fresh
process matters: the first GPU run found `placer measure --machine FILE` failing every placement, which the
in-process check could not see (its `local` machine had initialized CUDA already). Exits 1 if a command
fails or a measurement is not ``ok``.

    python tests/gpu_cli_check.py [--cpu-smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_POLICIES = ("single-gpu", "cpu-only", "m-topo", "heft")
SMOKE_POLICIES = ("cpu-only",)  # a node without GPUs: one device


def placer(*args: str) -> str:
    """Run one `placer` command in a fresh process; its stdout, or SystemExit naming the failed command."""
    command = [sys.executable, "-c", "import sys; from cluster.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"gpu-cli-check: `placer {' '.join(args)}` failed ({done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny model on this node's CPU")
    args = parser.parse_args()
    spec, policies = ("rnnlm_smoke", SMOKE_POLICIES) if args.cpu_smoke else ("rnnlm_gpu", GPU_POLICIES)
    if not args.cpu_smoke:
        import torch

        if not torch.cuda.is_available():
            print("gpu-cli-check: no CUDA device visible; nothing to validate (skipped)")
            return 0
    with tempfile.TemporaryDirectory() as folder:
        graph, profile, machine = (str(Path(folder) / name) for name in ("g.parquet", "p.json", "node.json"))
        placer("graphs", "import", "--torch", f"tests/gpu_check.py:{spec}", "-o", graph)
        print(placer("profile", "--graph", graph, "--measurer", "torch", "-o", profile, "--machine-out", machine),
              end="")
        print("\n| policy | simulated s | measured s | measured / simulated |\n|---|---|---|---|")
        failed = 0
        for policy in policies:
            common = ["--graph", graph, "--machine", machine, "--policy", policy, "--json"]
            simulated = json.loads(placer("simulate", *common))
            measured = json.loads(placer("measure", *common, "--measurer", "torch", "--runs", "3"))
            failed += measured["status"] != "ok"
            print(f"| {policy} | {simulated['runtime_s']:.5f} | {measured['runtime_s']:.5f} ({measured['status']}) | "
                  f"{measured['runtime_s'] / simulated['runtime_s']:.2f} |")
    print(f"\ngpu-cli-check: {len(policies) - failed}/{len(policies)} placements measured ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
