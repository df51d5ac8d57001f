"""Seeded heterogeneous machines (``hetero:SEED``): what GiPH-style placers train on and are tested on.

Each seed draws one box: a host CPU and two to four GPUs of one to three different catalog models (mixed
generations, as in GiPH's heterogeneous clusters), or, one time in four, a client machine: a desktop or
laptop CPU with its integrated GPU (the structure-aware paper's setting), sometimes with one discrete GPU
beside it. Links follow the GPU's PCIe generation; alike GPUs may share an NVLink bridge; every other GPU
pair copies through host memory on one shared channel. Figures come from measurers/catalog/devices.json
(the P100, V100 and A100 entries are the SXM parts': the PCIe cards these links imply are 11-12% slower in
compute (P100, V100) or 5% in memory bandwidth (A100); kept, since the committed giph checkpoint trained on
these machines); the link figures are estimates of effective bandwidth, like the catalog machines'.

Seeds below ``HELD_OUT_SEED`` are the training family; seeds from it on are machines a trained placer has
never seen (with the catalog's heterogeneous machines: k80-v100, a100-h100, cpu-igpu, desktop-igpu).
"""

from __future__ import annotations

import numpy as np

from graphs.errors import PlacerError
from measurers.devices import device_profiles
from measurers.machine_json import machine_from_json

PREFIX = "hetero:"
HELD_OUT_SEED = 1000
SERVER_CPUS = ("Xeon-E5-2699v3", "Xeon-E5-2698v4", "Xeon-8480")
CLIENT_PAIRS = (("Core-i7-1185G7", "Iris-Xe-96EU"), ("Core-i9-12900K", "UHD-770"))
PCIE_BANDWIDTH_Bps = {  # one direction, effective; by the GPU's PCIe generation
    "K40": 10e9, "K80": 10e9, "P100": 12e9, "V100": 12e9, "T4": 12e9,
    "A10": 25e9, "L4": 25e9, "A100": 25e9, "H100-PCIe": 50e9,
}
NVLINK_BANDWIDTH_Bps = {"P100": 36e9, "V100": 45e9, "A100": 270e9, "H100-PCIe": 270e9}  # bridge, one way
GPU_MODELS = tuple(PCIE_BANDWIDTH_Bps)
HOST_STAGING_Bps = 5e9
DRAM_COPY_Bps = 30e9


def is_hetero_name(name: str) -> bool:
    return name.startswith(PREFIX)


def parse_hetero_name(name: str) -> int:
    """The seed of ``hetero:SEED``; a PlacerError for anything else."""
    text = name[len(PREFIX):] if is_hetero_name(name) else ""
    if not (text.isascii() and text.isdigit()) or text != str(int(text)):  # hetero:7, not hetero:007 or ²
        raise PlacerError(f"bad machine name {name!r}: expected {PREFIX}SEED with SEED a whole number >= 0")
    return int(text)


def hetero_machine(name: str):
    """The Machine ``hetero:SEED`` stands for (the same seed gives the same machine everywhere)."""
    seed = parse_hetero_name(name)
    rng = np.random.default_rng([seed, 15])
    data = _client_box(rng) if rng.random() < 0.25 else _server_box(rng)
    data["name"] = name
    return machine_from_json(data, where=f"machine {name!r}")


def _server_box(rng: np.random.Generator) -> dict:
    models = rng.choice(GPU_MODELS, size=int(rng.choice((1, 2, 2, 3))), replace=False)
    gpus = [str(rng.choice(models)) for _ in range(int(rng.integers(2, 5)))]
    gpus[: len(models)] = [str(m) for m in models]  # every drawn model appears at least once
    gpus.sort(key=GPU_MODELS.index)
    cpu = str(rng.choice(SERVER_CPUS))
    devices = [{"name": "cpu:0", "model": cpu}] + [{"name": f"gpu:{i}", "model": m} for i, m in enumerate(gpus)]
    links = []
    for i, model in enumerate(gpus):
        links += _both_ways("cpu:0", f"gpu:{i}", PCIE_BANDWIDTH_Bps[model], 1e-5, f"pcie:gpu{i}")
    bridged = {m for m in sorted(set(gpus)) if gpus.count(m) > 1 and m in NVLINK_BANDWIDTH_Bps and rng.random() < 0.5}
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if i == j:
                continue
            if a == b and a in bridged:
                links.append(_link(f"gpu:{i}", f"gpu:{j}", NVLINK_BANDWIDTH_Bps[a], 3e-6, f"nvlink:gpu{i}:out"))
            else:
                links.append(_link(f"gpu:{i}", f"gpu:{j}", HOST_STAGING_Bps, 2.5e-5, "host:staging"))
    description = f"seeded heterogeneous server: {cpu} + " + ", ".join(gpus) + (
        f"; NVLink bridges between alike {', '.join(sorted(bridged))}" if bridged else "")
    return {"description": description, "devices": devices, "links": links}


def _client_box(rng: np.random.Generator) -> dict:
    cpu, igpu = CLIENT_PAIRS[int(rng.integers(len(CLIENT_PAIRS)))]
    host_bytes, igpu_bytes = device_profiles()[cpu]["memory_bytes"], device_profiles()[igpu]["memory_bytes"]
    devices = [{"name": "cpu:0", "model": cpu, "memory_bytes": host_bytes - igpu_bytes},  # one DRAM, shared
               {"name": "gpu:0", "model": igpu}]
    links = _both_ways("cpu:0", "gpu:0", DRAM_COPY_Bps, 5e-6, "dram:copy", same_channel=True)
    description = f"seeded client machine: {cpu} + integrated {igpu} sharing host memory"
    if rng.random() < 0.5:
        model = str(rng.choice(("T4", "A10", "L4")))
        devices.append({"name": "gpu:1", "model": model})
        links += _both_ways("cpu:0", "gpu:1", PCIE_BANDWIDTH_Bps[model], 1e-5, "pcie:gpu1")
        links += _both_ways("gpu:0", "gpu:1", PCIE_BANDWIDTH_Bps[model] / 2, 1.5e-5, "host:staging",
                            same_channel=True)
        description += f", and a discrete {model}"
    return {"description": description, "devices": devices, "links": links}


def _both_ways(a: str, b: str, bandwidth_Bps: float, latency_s: float, channel: str,
               same_channel: bool = False) -> list[dict]:
    """Links a->b and b->a; on ``channel`` both when ``same_channel``, else on its h2d / d2h halves."""
    there, back = (channel, channel) if same_channel else (f"{channel}:h2d", f"{channel}:d2h")
    return [_link(a, b, bandwidth_Bps, latency_s, there), _link(b, a, bandwidth_Bps, latency_s, back)]


def _link(src: str, dst: str, bandwidth_Bps: float, latency_s: float, channel: str) -> dict:
    return {"src": src, "dst": dst, "bandwidth_Bps": bandwidth_Bps, "latency_s": latency_s, "channel": channel}
