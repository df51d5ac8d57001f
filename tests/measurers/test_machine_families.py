"""Heterogeneous catalog machines and the seeded ``hetero:SEED`` family."""

import json

import pytest

from cluster.cli import main
from graphs.errors import PlacerError
from measurers.catalog import load_machine, machine_from_json, machine_to_json
from measurers.machine_families import HELD_OUT_SEED, hetero_machine


@pytest.mark.parametrize("name", ["k80-v100", "a100-h100", "cpu-igpu", "desktop-igpu"])
def test_heterogeneous_catalog_machine__loads_and_round_trips(name):
    machine = load_machine(name)
    assert machine_from_json(json.loads(json.dumps(machine_to_json(machine)))) == machine


def test_mixed_generation_boxes__hold_two_gpu_models_and_faster_links_between_alike_gpus():
    for name, models in (("k80-v100", {"K80", "V100"}), ("a100-h100", {"A100", "H100-PCIe"})):
        machine = load_machine(name)
        assert {machine.devices[i].model for i in machine.indices_of_kind("gpu")} == models
        alike, mixed = machine.link(3, 4), machine.link(1, 4)  # gpu:2->gpu:3 alike, gpu:0->gpu:3 mixed
        assert alike.bandwidth_Bps > mixed.bandwidth_Bps


def test_cpu_igpu__integrated_gpu_shares_the_hosts_dram():
    machine = load_machine("cpu-igpu")
    cpu, igpu = machine.devices
    assert (cpu.kind, igpu.kind) == ("cpu", "gpu")
    assert igpu.mem_bandwidth_Bps == cpu.mem_bandwidth_Bps  # one DRAM
    assert igpu.memory_bytes + cpu.memory_bytes == 16 * 2**30  # one host memory, split, not counted twice
    assert machine.link(0, 1).channel == machine.link(1, 0).channel == "dram:copy"
    assert igpu.peak_flops > cpu.peak_flops


def test_hetero_family__deterministic_and_varied():
    machines = [hetero_machine(f"hetero:{seed}") for seed in range(40)]
    assert hetero_machine("hetero:7") == machines[7]
    gpu_models = [{m.devices[i].model for i in m.indices_of_kind("gpu")} for m in machines]
    assert sum(len(models) >= 2 for models in gpu_models) >= 10  # mixed generations are common
    assert any({"Iris-Xe-96EU", "UHD-770"} & models for models in gpu_models)  # client boxes appear
    assert all(2 <= m.num_devices <= 5 and m.indices_of_kind("cpu") == [0] for m in machines)
    assert hetero_machine(f"hetero:{HELD_OUT_SEED}") != machines[0]
    for m in machines:  # a client box's CPU and iGPU split one host memory
        models = [d.model for d in m.devices[:2]]
        if models[1] in ("Iris-Xe-96EU", "UHD-770"):
            host = {"Iris-Xe-96EU": 16, "UHD-770": 32}[models[1]] * 2**30
            assert m.devices[0].memory_bytes + m.devices[1].memory_bytes == host


def test_hetero_family__a_seed_longer_than_a_file_name_is_a_machine_name_not_a_path():
    """Python 3.11's is_file raised "File name too long" for 249 digits: the command printed an OS error."""
    assert load_machine("hetero:" + "1" * 300) == hetero_machine("hetero:" + "1" * 300)
    with pytest.raises(PlacerError, match="unknown machine 'xxx"):
        load_machine("x" * 300)


@pytest.mark.parametrize("name", ["hetero:", "hetero:x", "hetero:-1", "hetero:1.5", "hetero:007", "hetero:²"])
def test_hetero_family__bad_names_are_clear_errors(name):
    with pytest.raises(PlacerError, match="hetero:SEED"):
        load_machine(name)


def test_machines_cli__shows_a_hetero_machine_and_lists_the_family(capsys):
    assert main(["machines", "show", "hetero:5"]) == 0
    assert "hetero:5" in capsys.readouterr().out
    assert main(["machines", "list"]) == 0
    out = capsys.readouterr().out
    assert "cpu-igpu" in out and "hetero:SEED" in out
    assert main(["machines", "show", "hetero:nope"]) == 2
