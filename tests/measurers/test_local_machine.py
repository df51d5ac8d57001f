"""The `local` machine: this node's CPU and visible GPUs, with catalog speeds where the model is known."""

import pytest

from measurers.catalog import device_profiles, load_machine
from measurers.local import catalog_model, local_machine
from measurers.sim.reference import Simulator
from conftest import policy_placement

CPUINFO = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
MEMINFO = "MemTotal:       16384 kB\nMemFree:  1 kB\n"


def test_local_machine__gpus_named_from_the_catalog_with_their_real_memory():
    machine = local_machine(gpus=[("NVIDIA H200", 140 * 2**30), ("NVIDIA H100 80GB HBM3", 80 * 2**30)],
                            cpuinfo=CPUINFO, meminfo=MEMINFO, cores=8)
    assert [d.name for d in machine.devices] == ["cpu:0", "gpu:0", "gpu:1"]
    cpu, h200, h100 = machine.devices
    assert (cpu.model, cpu.memory_bytes) == ("Xeon-8480", 16384 * 1024)
    assert (h200.model, h200.memory_bytes, h200.kind) == ("H200", 140 * 2**30, "gpu")
    assert h100.model == "H100" and h100.peak_flops == device_profiles()["H100"]["peak_flops"]
    assert machine.link(1, 2).channel == "p2p:gpu0:out" and machine.link(0, 1).channel == "pcie:gpu0:h2d"


def test_local_machine__unknown_devices_get_generic_profiles():
    machine = local_machine(gpus=[("Mystery Accelerator 9000", 4 * 2**30)], cpuinfo="model name : Toaster CPU\n",
                            meminfo=MEMINFO, cores=4)
    cpu, gpu = machine.devices
    assert "Toaster CPU" in cpu.model and cpu.peak_flops == 4 * 2.5e9 * 32
    assert "Mystery" in gpu.model and gpu.memory_bytes == 4 * 2**30 and gpu.peak_flops > cpu.peak_flops


@pytest.mark.parametrize("name, kind, model", [
    ("NVIDIA A100-SXM4-40GB", "gpu", "A100"), ("Tesla K80", "gpu", "K80"), ("NVIDIA GeForce RTX 4090", "gpu", None),
    ("NVIDIA H100 PCIe", "gpu", "H100-PCIe"), ("NVIDIA H100 80GB HBM3", "gpu", "H100"), ("NVIDIA A10", "gpu", "A10"),
    ("NVIDIA L40S", "gpu", None), ("NVIDIA L40", "gpu", None), ("NVIDIA T400", "gpu", None),  # were L4, L4, T4
    ("Intel(R) UHD Graphics 770 (iGPU)", "gpu", "UHD-770"),  # was the generic GPU
    ("Intel(R) Xeon(R) CPU E5-2699 v3 @ 2.30GHz", "cpu", "Xeon-E5-2699v3"),  # /proc/cpuinfo's spelling: was none
    ("Intel(R) Xeon(R) CPU E5-2698 v4 @ 2.20GHz", "cpu", "Xeon-E5-2698v4"),
    ("Intel(R) Xeon(R) CPU E5-2699 v4 @ 2.20GHz", "cpu", None), ("Intel(R) Xeon(R) Platinum 8480+", "cpu", "Xeon-8480"),
    ("11th Gen Intel(R) Core(TM) i7-1185G7 @ 3.00GHz", "cpu", "Core-i7-1185G7"),
])
def test_catalog_model__matches_whole_model_names_only(name, kind, model):
    assert catalog_model(name, kind) == model


def test_load_machine__local_is_this_node_and_simulates():
    machine = load_machine("local")
    assert machine.name == "local" and machine.devices[0].kind == "cpu" and machine.meta["local"] == "1"
    import torch

    expected_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert len(machine.indices_of_kind("gpu")) == expected_gpus
    from graphs.synthetic import synthetic_graph

    graph = synthetic_graph(50, 1)
    result = Simulator(graph, machine).run(policy_placement(graph, machine, "cpu-only"))
    assert result.status == "ok" and result.runtime_s > 0


def test_build_measurer__local_machine_is_reread_on_the_node_and_must_match():
    from graphs.errors import PlacerError
    from graphs.torch.importer import import_torch_spec
    from measurers.factory import MeasurerSpec, build_measurer

    graph = import_torch_spec("tests/fixtures/tiny_models.py:tiny_torch_mlp")
    here = load_machine("local")
    assert build_measurer(MeasurerSpec("torch", graph, here)).machine.meta["local"] == "1"
    elsewhere = local_machine(gpus=[("NVIDIA H200", 2**30)] * 2, cpuinfo=CPUINFO, meminfo=MEMINFO, cores=2)
    if [d.name for d in elsewhere.devices] == [d.name for d in here.devices]:
        return  # this node really has two GPUs: the spec matches it
    with pytest.raises(PlacerError, match="this node has"):
        build_measurer(MeasurerSpec("torch", graph, elsewhere))


def test_local_machine__host_links_carry_the_pageable_copy_figures_and_gpu_links_pcie():
    from measurers.local import HOST_COPY_BANDWIDTH_Bps, HOST_COPY_LATENCY_s, PCIE_BANDWIDTH_Bps

    machine = local_machine(gpus=[("NVIDIA H200", 141 << 30), ("NVIDIA H200", 141 << 30)], cpuinfo="", meminfo="",
                            cores=4)
    by_ends = {(link.src, link.dst): link for link in machine.links}
    for ends in (("cpu:0", "gpu:0"), ("gpu:1", "cpu:0")):
        assert (by_ends[ends].bandwidth_Bps, by_ends[ends].latency_s) == (HOST_COPY_BANDWIDTH_Bps, HOST_COPY_LATENCY_s)
    assert by_ends[("gpu:0", "gpu:1")].bandwidth_Bps == PCIE_BANDWIDTH_Bps
