"""The machine's links as arrays: which link joins two devices, which channel it occupies, what a transfer
on it costs. One table for both simulator engines and for every scheduler or solver that models the links,
so they all read the same numbers and the same cost expression.

A transfer of ``nbytes`` from device ``src`` to ``dst`` (``src != dst``) takes
``latency_s[link] + nbytes / bandwidth_Bps[link]`` seconds (evaluated in that order, as the engines do)
and occupies the link's channel for all of it; transfers on one channel are served one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from measurers.machine import Machine


@dataclass(frozen=True)
class LinkTable:
    link_of: np.ndarray  # (D, D) int64: index into machine.links, -1 on the diagonal
    link_channel: np.ndarray  # (L,) int64: index into channel_names
    latency_s: np.ndarray  # (L,) float64
    bandwidth_Bps: np.ndarray  # (L,) float64
    channel_names: tuple[str, ...]  # sorted

    @property
    def num_channels(self) -> int:
        return len(self.channel_names)

    @property
    def channel_of(self) -> np.ndarray:
        """(D, D) int64: channel of the link from src to dst, -1 on the diagonal."""
        if not len(self.link_channel):  # one device, no links
            return np.full_like(self.link_of, -1)
        return np.where(self.link_of >= 0, self.link_channel[np.maximum(self.link_of, 0)], -1)

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds the simulator gives a transfer of ``nbytes`` from ``src`` to ``dst`` (0 on one device)."""
        if src == dst:
            return 0.0
        link = self.link_of[src, dst]
        return float(self.latency_s[link] + nbytes / self.bandwidth_Bps[link])

    def transfer_matrix_s(self, nbytes: np.ndarray) -> np.ndarray:
        """(..., D, D) seconds to move ``nbytes`` (...) along every device pair; 0 on the diagonal."""
        nbytes = np.asarray(nbytes, dtype=np.float64)[..., None, None]
        if not len(self.link_channel):  # one device, no links
            return np.zeros(nbytes.shape[:-2] + self.link_of.shape)
        link = np.maximum(self.link_of, 0)
        times = self.latency_s[link] + nbytes / self.bandwidth_Bps[link]
        return np.where(self.link_of >= 0, times, 0.0)


def link_table(machine: Machine) -> LinkTable:
    num_devices = machine.num_devices
    link_of = np.full((num_devices, num_devices), -1, dtype=np.int64)
    # Names to indices by dict: a search of the tuples per link made a 200-GPU machine (39,800 links) take 17 s.
    device_of = {device.name: i for i, device in enumerate(machine.devices)}
    for k, link in enumerate(machine.links):
        link_of[device_of[link.src], device_of[link.dst]] = k
    channels = tuple(sorted({link.channel for link in machine.links}))
    channel_of = {name: c for c, name in enumerate(channels)}
    return LinkTable(
        link_of=link_of,
        link_channel=np.array([channel_of[l.channel] for l in machine.links], dtype=np.int64),
        latency_s=np.array([l.latency_s for l in machine.links], dtype=np.float64),
        bandwidth_Bps=np.array([l.bandwidth_Bps for l in machine.links], dtype=np.float64),
        channel_names=channels)
