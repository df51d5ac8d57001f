"""Link figures measured on this node: each link's latency and bandwidth, fitted to copies timed the way the
PyTorch measurer makes them (``Tensor.to``, host tensors in pageable memory), so that the simulator charges a
cut edge what the real step pays for it.

Why: on an H200 node the catalog's PCIe figures (25 GB/s, 10 us) were 2-20x too optimistic for such copies
(a 64 MB copy to the host ran at 1.3 GB/s), and the simulator put placements that cut many edges at a fifth of
their measured step (BENCHMARKS.md, "GPU validation").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError
from measurers.machine import Machine

LINKS_MEASURED_NOTE = "; links measured"  # ends the description of a calibrated machine
COPY_SIZES_BYTES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)  # the sizes a training step's cut edges span


@dataclass(frozen=True)
class CopyTiming:
    src: str  # machine device names
    dst: str
    size_bytes: int
    median_s: float


def time_torch_copies(machine: Machine, torch_devices: Sequence, sizes_bytes: Sequence[int] = COPY_SIZES_BYTES,
                      runs: int = 9, warmup: int = 2) -> list[CopyTiming]:
    """The median time of one copy of each size over each link whose two ends are different torch devices
    (``torch_devices[d]`` is machine device d's), each copy bracketed by synchronizing both ends."""
    import torch

    names = [d.name for d in machine.devices]
    out = []
    for link in machine.links:
        source, target = (torch.device(torch_devices[names.index(end)]) for end in (link.src, link.dst))
        if source == target:  # the measurer makes no copy there: nothing to time
            continue
        on_cuda = [d for d in (source, target) if d.type == "cuda"]

        def sync() -> None:
            for device in on_cuda:
                torch.cuda.synchronize(device)

        for size in sizes_bytes:
            tensor = torch.ones(max(size // 4, 1), dtype=torch.float32, device=source)
            samples = []
            for _ in range(warmup + runs):
                sync()
                began = time.perf_counter()
                tensor.to(target)
                sync()
                samples.append(time.perf_counter() - began)
            out.append(CopyTiming(link.src, link.dst, int(tensor.numel() * 4), float(np.median(samples[warmup:]))))
    return out


def fit_link(timings: Sequence[CopyTiming]) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of ``time = latency + bytes / bandwidth``, least squares over the timings
    (in seconds, so the large copies that dominate a step's transfer time weigh most); a negative latency is
    refitted as zero."""
    size_bytes = np.array([t.size_bytes for t in timings], dtype=np.float64)  # (K,)
    time_s = np.array([t.median_s for t in timings], dtype=np.float64)  # (K,)
    if len(timings) < 2 or len(set(size_bytes.tolist())) < 2:
        raise PlacerError("a link fit needs copies of at least two sizes")
    (latency_s, s_per_byte), *_ = np.linalg.lstsq(np.stack([np.ones_like(size_bytes), size_bytes], 1), time_s,
                                                  rcond=None)
    if latency_s < 0:
        latency_s, s_per_byte = 0.0, float(size_bytes @ time_s / (size_bytes @ size_bytes))
    if not s_per_byte > 0:
        raise PlacerError(f"copies of {timings[0].src}->{timings[0].dst} took no longer with more bytes: "
                          "no bandwidth to fit")
    return float(latency_s), float(1.0 / s_per_byte)


def calibrated_machine(machine: Machine, timings: Sequence[CopyTiming]) -> Machine:
    """``machine`` with each timed link's latency and bandwidth fitted to its copies (channels unchanged);
    links without timings keep the figures they had."""
    by_link: dict[tuple[str, str], list[CopyTiming]] = {}
    for timing in timings:
        by_link.setdefault((timing.src, timing.dst), []).append(timing)
    links = []
    for link in machine.links:
        found = by_link.get((link.src, link.dst))
        if found:
            latency_s, bandwidth_Bps = fit_link(found)
            link = replace(link, latency_s=latency_s, bandwidth_Bps=bandwidth_Bps)
        links.append(link)
    noted = not by_link or machine.description.endswith(LINKS_MEASURED_NOTE)  # a machine file calibrated before
    description = machine.description + ("" if noted else LINKS_MEASURED_NOTE)
    return replace(machine, links=tuple(links), description=description)
