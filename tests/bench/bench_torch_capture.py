"""Memory of the PyTorch measurer's capture: one eager training step, the capture as it runs (tensors the
step can no longer reach released), and a capture that holds every tensor until the end (as it did before).

Each is run in a process of its own, after the model and Adam's state are built; the figure is the peak
resident memory above that point (``ru_maxrss``). Prints a markdown table.

    python tests/bench/bench_torch_capture.py            # RNNLM at hidden 512
    python tests/bench/bench_torch_capture.py --full     # and the full-size RNNLM (eager and released only)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SMALL = dict(batch_size=32, seq_len=35, hidden=512, vocab=10000)
FULL = dict()  # the benchmark's own sizes: hidden 2048, batch 64, 35 steps, vocab 10k
MODES = ("eager", "capture", "capture holding every tensor")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, config: dict) -> dict:
    import torch

    from graphs.benchmarks.torch_models import rnnlm_model
    from measurers.torch import program
    from measurers.torch.measurer import capture_training_step
    from measurers.torch.workload import TorchWorkload

    torch.set_num_threads(1)
    step = TorchWorkload(lambda: rnnlm_model(**config)).materialize(0)
    optimizer = step.make_optimizer()
    base_mb, began = _peak_mb(), time.perf_counter()
    steps = None
    if mode == "eager":
        step.loss().backward()
        optimizer.step()
    else:
        if mode == "capture holding every tensor":
            program._Capture._release_unreachable = lambda self: None
        steps = len(capture_training_step(step, optimizer).steps)
    return {"above_model_mb": _peak_mb() - base_mb, "seconds": time.perf_counter() - began, "steps": steps}


def run(mode: str, config: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", mode, json.dumps(config)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also the full-size RNNLM (several minutes)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], json.loads(args.child[1]))))
        return
    rows = [("RNNLM hidden 512, batch 32", SMALL, MODES)]
    if args.full:
        rows.append(("RNNLM full size (hidden 2048, batch 64)", FULL, MODES[:2]))
    print("| graph | " + " | ".join(f"{m}: MB above the model (s)" for m in MODES) + " |")
    print("|---|" + "---|" * len(MODES))
    for name, config, modes in rows:
        cells = []
        for mode in MODES:
            if mode not in modes:
                cells.append("not run")
                continue
            result = run(mode, config)
            cells.append(f"{result['above_model_mb']:.0f} ({result['seconds']:.1f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
