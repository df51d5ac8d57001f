"""The OpenVINO GPU check: where OpenVINO lists a GPU, time the sample model on the CPU, on the GPU and split
between them (convolution and ReLU on the GPU, the rest on the CPU) and report the figures in one line."""

from __future__ import annotations

import tempfile
from typing import Sequence

import numpy as np

from measurers.machine import Machine

SKIP_LINE = "skipped: no OpenVINO GPU"


def gpu_check_openvino(core=None, runs: int = 10, warmup: int = 3) -> str:
    """``split_check`` on this node's OpenVINO machine and its first GPU, or ``SKIP_LINE`` without one."""
    from measurers.openvino.core import openvino_core
    from measurers.openvino.devices import openvino_machine

    core = core or openvino_core()
    if not any(name.startswith("GPU") for name in core.available_devices):
        return SKIP_LINE
    machine = openvino_machine(core)
    return split_check(core, machine, machine.indices_of_kind("gpu")[0], runs=runs, warmup=warmup)


def split_check(core, machine: Machine, other: int, ov_devices: Sequence[str] | None = None, runs: int = 10,
                warmup: int = 3) -> str:
    """One line: the sample model's median ms on device 0, on device ``other`` and split between them, the
    split's HETERO submodel count and its largest difference from the device-0 outputs."""
    from graphs.inference.openvino_import import import_openvino_ir
    from measurers.openvino.measurer import OpenVinoMeasurer
    from measurers.openvino.sample import save_sample_model

    with tempfile.TemporaryDirectory() as directory:
        graph = import_openvino_ir(str(save_sample_model(directory, channels=64, size=64, classes=100)))
        measurer = OpenVinoMeasurer(graph, machine, runs=runs, warmup=warmup, core=core, ov_devices=ov_devices)
        names = measurer.device_names
        on_other = np.isin(graph.op_names, ["conv", "relu"])  # (N,) bool
        placements = {names[0]: np.zeros(graph.num_ops, np.int64), names[other]: np.full(graph.num_ops, other),
                      "split": np.where(on_other, other, 0).astype(np.int64)}
        found = dict(zip(placements, measurer.measure(list(placements.values()))))
        submodels = measurer.compile_for(placements["split"]).get_property("HETERO_NUMBER_OF_SUBMODELS")
        split, alone = (measurer.infer_once(placements[key])[0] for key in ("split", names[0]))
    figures = ", ".join(f"{name} {m.runtime_s * 1e3:.3f} ms" if m.ok else f"{name} {m.status} ({m.error[:80]})"
                        for name, m in found.items())
    full_name = core.get_property(names[other], "FULL_DEVICE_NAME")
    return (f"openvino {names[other]} ({full_name}): {figures}; split submodels {submodels}, "
            f"max |split - {names[0]}| {float(np.abs(split - alone).max()):.2e}")
