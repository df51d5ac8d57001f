"""GPU validation of the real PyTorch measurer against the profiled simulator (`make gpu-check`).

On one GPU machine, in a few minutes: traces a mid-size RNNLM, profiles every op on the CPU and the GPU,
times copies over the CPU-GPU links, measures about 30 placements across CPU and GPU with the PyTorch
measurer, simulates the same placements with the profile (once with the catalog's link figures, once with
links fitted to the timed copies: `measurers/link_calibration.py`), and prints a table plus Kendall tau and
the mean absolute percentage error between simulated and measured step times. ``--save DIR`` keeps what is
needed to simulate the run again elsewhere. Then forces an out-of-memory placement (a per-process GPU memory
fraction) and shows the ``oom`` status followed by a successful measurement.

Without CUDA it exits 0 with a message. ``--cpu-smoke`` runs the same pipeline on the CPU instead (a tiny
model, the paper-2gpu machine with every device mapped to the CPU), to check the script itself.

    python tests/gpu_check.py [--cpu-smoke] [--save DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

GPU_CONFIG = dict(batch_size=32, seq_len=10, hidden=1024, vocab=8000, layers=2)  # CPU parts stay seconds
SMOKE_CONFIG = dict(batch_size=2, seq_len=3, hidden=8, vocab=20, layers=2)
SCOPES = ("embed", "lstm.layer0", "lstm.layer1", "softmax")


def rnnlm_gpu():
    """(model, example_inputs) of the RNNLM this check traces on a GPU node: a spec for `placer graphs import
    --torch tests/gpu_check.py:rnnlm_gpu` (tests/gpu_cli_check.py)."""
    from graphs.benchmarks.torch_models import rnnlm_model

    return rnnlm_model(**GPU_CONFIG)


def rnnlm_smoke():
    from graphs.benchmarks.torch_models import rnnlm_model

    return rnnlm_model(**SMOKE_CONFIG)


def scope_placements(graph, cpu: int, gpu: int) -> list[np.ndarray]:
    """Every CPU/GPU choice for the model's four parts (16 placements); ops outside them go with the GPU."""
    scopes = np.array([str(s) for s in graph.scopes], dtype=object)
    groups = np.unique(graph.colocation, return_inverse=True)[1].reshape(-1)
    out = []
    for mask in range(1 << len(SCOPES)):
        op_dev = np.full(graph.num_ops, gpu, dtype=np.int64)
        for bit, scope in enumerate(SCOPES):
            if mask >> bit & 1:
                op_dev[[s == scope or s.startswith(scope + ".") for s in scopes]] = cpu
        first = np.full(groups.max() + 1, -1)
        for op in range(graph.num_ops):  # a colocation group follows its first op
            if first[groups[op]] < 0:
                first[groups[op]] = op_dev[op]
        out.append(first[groups])
    return out


def random_placements(graph, cpu: int, gpu: int, count: int, seed: int) -> list[np.ndarray]:
    groups = np.unique(graph.colocation, return_inverse=True)[1].reshape(-1)
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        p_gpu = (0.6, 0.85, 0.97)[k % 3]
        choice = np.where(rng.random(groups.max() + 1) < p_gpu, gpu, cpu)
        out.append(choice[groups])
    return out


def save_run(folder: Path, graph, machines: dict, profile, placements: list, rows: list, copies: list) -> None:
    """Everything needed to simulate this run again elsewhere: graph, machines, profile, placements, times."""
    from dataclasses import asdict

    from graphs.io import save_graph
    from measurers.machine_json import machine_to_json
    from measurers.sim.costs import save_profile

    folder.mkdir(parents=True, exist_ok=True)
    save_graph(graph, folder / "graph.parquet")
    save_profile(profile, folder / "profile.json")
    (folder / "machines.json").write_text(json.dumps({k: machine_to_json(m) for k, m in machines.items()}))
    np.save(folder / "placements.npy", np.stack(placements))  # (K, N) device per op
    (folder / "measured.json").write_text(json.dumps({"rows": rows, "copies": [asdict(c) for c in copies]}))


def print_copies(copies: list) -> None:
    if copies:
        print("\n| copy | bytes | median s | GB/s |\n|---|---|---|---|")
    for copy in copies:
        print(f"| {copy.src}->{copy.dst} | {copy.size_bytes} | {copy.median_s:.6f} | "
              f"{copy.size_bytes / copy.median_s / 1e9:.2f} |")


def print_agreement(rows: list, labels: list) -> None:
    """Kendall tau and mean absolute percentage error of each simulation against the measured steps."""
    # scipy is imported only now: its BLAS threads next to torch's slow every CPU op several-fold
    from scipy.stats import kendalltau

    ok = [row for row in rows if row["status"] == "ok"]
    measured_s = np.array([row["measured_s"] for row in ok])  # (K,)
    print()
    for label in labels:
        simulated_s = np.array([row[label] for row in ok])  # (K,)
        tau = kendalltau(measured_s, simulated_s).statistic
        mape = float(np.mean(np.abs(simulated_s - measured_s) / measured_s))
        print(f"{len(ok)}/{len(rows)} placements measured ok; Kendall tau {tau:.3f}; MAPE {mape:.1%} "
              f"(simulated with {label})")


def openvino_line() -> str:
    """The OpenVINO check's line (an Intel GPU, through OpenVINO's HETERO mode), or why it was skipped: a GPU
    machine's own Python may have torch and no OpenVINO, and the CUDA check must still run there."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "skipped: OpenVINO is not installed"
    from measurers.openvino.check import gpu_check_openvino

    return gpu_check_openvino()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="check the pipeline on the CPU (tiny model)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's; 1 with "
                        "--cpu-smoke: on a small shared box, a process that imported numba ran torch's CPU ops "
                        "many times slower with several threads)")
    parser.add_argument("--save", type=Path, help="write graph, machine, profile, placements and times here")
    args = parser.parse_args()
    if args.save and args.save.exists() and not args.save.is_dir():  # found only at the end, after the GPU run
        parser.error(f"--save {args.save} is a file, not a folder")
    import torch

    if args.threads or args.cpu_smoke:
        torch.set_num_threads(args.threads or 1)

    if not args.cpu_smoke:
        print(f"gpu-check (OpenVINO): {openvino_line()}")
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu-check: no CUDA device visible; nothing to validate (skipped)")
        return 0
    began = time.perf_counter()
    from graphs.benchmarks.torch_models import build_rnnlm
    from measurers.catalog import load_machine
    from measurers.link_calibration import calibrated_machine, time_torch_copies
    from measurers.profiler import profile_torch
    from measurers.sim.reference import Simulator
    from measurers.torch.measurer import TorchMeasurer, default_torch_devices

    config = SMOKE_CONFIG if args.cpu_smoke else GPU_CONFIG
    graph = build_rnnlm(**config)
    machine = load_machine("paper-2gpu" if args.cpu_smoke else "local")
    devices = (lambda m: ["cpu"] * m.num_devices) if args.cpu_smoke else default_torch_devices
    cpu, gpu = machine.indices_of_kind("cpu")[0], machine.indices_of_kind("gpu")[0]
    print(f"# gpu-check: rnnlm {config}, {graph.num_ops} ops, machine {machine.name}: "
          + ", ".join(f"{d.name}={d.model}" for d in machine.devices))
    measurer = TorchMeasurer(graph, machine, runs=3, warmup=2, torch_devices=devices)
    measurer.program()
    print(f"captured the step in {time.perf_counter() - began:.1f} s")
    profile = profile_torch(graph, machine, runs=3, warmup=1, measurer=measurer)
    print(f"profiled {len(profile.op_names)} (op, device) times in {time.perf_counter() - began:.1f} s")
    copies = time_torch_copies(machine, measurer.torch_devices)
    machines = {"catalog links": machine, "measured links": calibrated_machine(machine, copies)}
    print_copies(copies)
    simulators = {label: Simulator(graph, m, profile=profile) for label, m in machines.items()}
    placements = scope_placements(graph, cpu, gpu) + random_placements(graph, cpu, gpu, 14, seed=0)
    rows = []
    print("\n| # | ops on GPU | measured s | " + " | ".join(f"simulated s, {label} | error" for label in simulators)
          + " |\n|---|---|---|" + "---|---|" * len(simulators))
    for k, placement in enumerate(placements):
        measured = measurer.measure([placement])[0]
        row = {"measured_s": measured.runtime_s, "status": measured.status}
        cells = []
        for label, simulator in simulators.items():
            row[label] = simulator.run(placement).runtime_s
            err = abs(row[label] - measured.runtime_s) / measured.runtime_s if measured.ok else float("nan")
            cells.append(f"{row[label]:.5f} | {err:.0%}")
        rows.append(row)
        print(f"| {k} | {np.mean(placement == gpu):.0%} | {measured.runtime_s:.5f} ({measured.status}) | "
              + " | ".join(cells) + " |")
    print_agreement(rows, list(simulators))
    if args.save:
        save_run(args.save, graph, machines, profile, placements, rows, copies)
        print(f"saved the run in {args.save}")
    if not args.cpu_smoke:
        oom_check(measurer, graph, gpu)
    print(f"gpu-check finished in {time.perf_counter() - began:.1f} s")
    return 0


def oom_check(measurer, graph, gpu: int) -> None:
    import torch

    placement = np.full(graph.num_ops, gpu, dtype=np.int64)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.0002, 0)  # about 28 MB of an H200: the step does not fit
    try:
        squeezed = measurer.measure([placement])[0]
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    after = measurer.measure([placement])[0]
    print(f"\nout-of-memory check: with 0.02% of GPU memory -> {squeezed.status} ({squeezed.error[:80]}); "
          f"then -> {after.status} ({after.runtime_s:.5f} s)")


if __name__ == "__main__":
    sys.exit(main())
