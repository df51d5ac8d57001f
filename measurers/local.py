"""The ``local`` machine: the devices this process really has, so real measurers and the simulator agree.

- one CPU device: its model name (``/proc/cpuinfo``), usable cores (scheduler affinity) and memory
  (``/proc/meminfo`` MemTotal);
- one GPU device per CUDA device torch sees (inside a Ray actor: the GPUs Ray gave it, through
  ``CUDA_VISIBLE_DEVICES``), named ``gpu:0``... in torch's order, with the real name and memory.

Speeds come from the catalog profile whose model name's parts appear, in order, among the words of the
device's name (``catalog_model``: ``"NVIDIA H200"`` -> ``H200``, ``"NVIDIA H100 PCIe"`` -> ``H100-PCIe``,
``"Intel(R) Xeon(R) CPU E5-2699 v3 @ 2.30GHz"`` -> ``Xeon-E5-2699v3``; ``"NVIDIA L40S"`` is not ``L4``);
otherwise from a generic profile (CPU: cores x 2.5 GHz x 32 fp32 FLOP/cycle). Links: host copies as the torch
measurer makes them (pageable memory, ``HOST_COPY_*``) between the CPU and each GPU (one channel per direction
per GPU) and, between GPUs, PCIe 4.0 x16 figures with one egress channel per GPU.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from measurers.devices import device_profiles
from measurers.machine import Device, Link, Machine

PCIE_BANDWIDTH_Bps = 25e9  # PCIe 4.0 x16, effective: between GPUs
PCIE_LATENCY_s = 1e-5
# Host <-> GPU as the torch measurer copies (Tensor.to, pageable host memory), timed on an H200 node: 21 us for
# 4 KB, 13 GB/s at 16 MB (BENCHMARKS.md, "GPU validation"); `placer profile --machine-out` times this node's own
HOST_COPY_BANDWIDTH_Bps = 13e9
HOST_COPY_LATENCY_s = 2e-5
GENERIC_GPU = {"peak_flops": 15e12, "mem_bandwidth_Bps": 900e9, "op_overhead_s": 5e-6, "compute_efficiency": 0.6,
               "memory_efficiency": 0.8}
CPU_HZ, CPU_FLOP_PER_CYCLE = 2.5e9, 32


def cpu_name(cpuinfo: str) -> str:
    match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else "unknown CPU"


def total_memory_bytes(meminfo: str) -> int:
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 8 * 2**30


def catalog_model(device_name: str, kind: str) -> str | None:
    """The catalog profile of ``kind`` whose model appears in ``device_name`` (the longest such model), if any:
    the model's words ("Xeon-E5-2699v3": xeon, e5, 2699v3) appear in the name's words in that order, others
    between them allowed ("(R) CPU"), each as one word or as consecutive words run together ("2699 v3"), and
    never as part of a longer word ("L4" is not in "L40S", nor "H100" in "H1000")."""
    name_words = _words(device_name)
    found = [model for model, profile in device_profiles().items()
             if profile.get("kind") == kind and _in_order(_words(model), name_words)]
    return max(found, key=len) if found else None


def _words(text: str) -> list[str]:
    return re.findall(r"[0-9a-z]+", text.lower())


def _in_order(words: list[str], name_words: list[str]) -> bool:
    at = 0
    for word in words:
        while at < len(name_words) and _run_end(word, name_words, at) is None:
            at += 1
        if at == len(name_words):
            return False
        at = _run_end(word, name_words, at)
    return True


def _run_end(word: str, name_words: list[str], start: int) -> int | None:
    """The index after the consecutive name words from ``start`` that run together spell ``word``, if any."""
    run, end = "", start
    while end < len(name_words) and len(run) < len(word):
        run += name_words[end]
        end += 1
    return end if run == word else None


def cpu_device(name: str, cores: int, memory_bytes: int) -> Device:
    model = catalog_model(name, "cpu")
    if model is not None:
        profile = {k: v for k, v in device_profiles()[model].items() if k not in ("source", "notes", "kind")}
        profile["memory_bytes"] = memory_bytes
        return Device(name="cpu:0", kind="cpu", model=model, **profile)
    return Device(name="cpu:0", kind="cpu", model=f"local-cpu ({name}, {cores} cores)",
                  peak_flops=cores * CPU_HZ * CPU_FLOP_PER_CYCLE, mem_bandwidth_Bps=20e9 * min(cores, 8) / 2,
                  memory_bytes=memory_bytes, op_overhead_s=5e-6, compute_efficiency=0.4, memory_efficiency=0.7)


def gpu_device(index: int, name: str, memory_bytes: int) -> Device:
    model = catalog_model(name, "gpu")
    if model is not None:
        profile = {k: v for k, v in device_profiles()[model].items() if k not in ("source", "notes", "kind")}
        profile["memory_bytes"] = memory_bytes
        return Device(name=f"gpu:{index}", kind="gpu", model=model, **profile)
    return Device(name=f"gpu:{index}", kind="gpu", model=f"local-gpu ({name})", memory_bytes=memory_bytes,
                  **GENERIC_GPU)


def visible_gpus() -> list[tuple[str, int]]:
    """(name, total memory bytes) of every CUDA device torch sees; none without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [(torch.cuda.get_device_properties(i).name, int(torch.cuda.get_device_properties(i).total_memory))
            for i in range(torch.cuda.device_count())]


def local_machine(gpus: list[tuple[str, int]] | None = None, cpuinfo: str | None = None,
                  meminfo: str | None = None, cores: int | None = None) -> Machine:
    """The machine this process runs on (arguments override what is read, for tests)."""
    cpuinfo = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    meminfo = meminfo if meminfo is not None else _read("/proc/meminfo")
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    gpus = visible_gpus() if gpus is None else gpus
    devices = [cpu_device(cpu_name(cpuinfo), cores, total_memory_bytes(meminfo))]
    devices += [gpu_device(i, name, memory) for i, (name, memory) in enumerate(gpus)]
    links = []
    for i, _ in enumerate(gpus):
        links.append(Link("cpu:0", f"gpu:{i}", HOST_COPY_BANDWIDTH_Bps, HOST_COPY_LATENCY_s, f"pcie:gpu{i}:h2d"))
        links.append(Link(f"gpu:{i}", "cpu:0", HOST_COPY_BANDWIDTH_Bps, HOST_COPY_LATENCY_s, f"pcie:gpu{i}:d2h"))
        for j, _ in enumerate(gpus):
            if i != j:
                links.append(Link(f"gpu:{i}", f"gpu:{j}", PCIE_BANDWIDTH_Bps, PCIE_LATENCY_s, f"p2p:gpu{i}:out"))
    description = f"this node: {cpu_name(cpuinfo)} ({cores} cores)" + "".join(f", {n}" for n, _ in gpus)
    return Machine("local", tuple(devices), tuple(links), description, meta={"local": "1"})


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
