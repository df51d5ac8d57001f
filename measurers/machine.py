"""Devices, links and machines: what a placement is placed on.

A machine is a list of devices and the links between them. Each link names a *channel*: transfers on
one channel contend (they are served one at a time, first come first served), transfers on different
channels overlap. Units are in the names: bytes, seconds, FLOP/s, bytes per second.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import DEVICE_KINDS, kind_bit


LINK_ARROW = "->"


@dataclass(frozen=True)
class Device:
    name: str  # unique within the machine, e.g. "gpu:0"
    kind: str  # one of graphs.opgraph.DEVICE_KINDS
    model: str  # catalog profile, e.g. "K80"
    peak_flops: float  # FLOP/s at the dtype the graphs use (fp32)
    mem_bandwidth_Bps: float  # device-memory bandwidth, bytes/s
    memory_bytes: int  # capacity available to the step
    op_overhead_s: float  # fixed cost per op (kernel launch / dispatch)
    compute_efficiency: float = 1.0  # fraction of peak_flops a typical dense op reaches
    memory_efficiency: float = 1.0  # fraction of mem_bandwidth_Bps a typical op reaches

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise PlacerError(f"a device's name must be a non-empty string, got {self.name!r}")
        if LINK_ARROW in self.name:  # links are named "src->dst" (simulate --json's link_bytes): two would collide
            raise PlacerError(f"device {self.name!r}: a device's name may not hold {LINK_ARROW!r}, which names links "
                              f"(src{LINK_ARROW}dst)")
        if self.kind not in DEVICE_KINDS:
            raise PlacerError(f"device {self.name!r}: unknown kind {self.kind!r} (known: {', '.join(DEVICE_KINDS)})")
        for key in ("peak_flops", "mem_bandwidth_Bps", "memory_bytes"):
            if not getattr(self, key) > 0:
                raise PlacerError(f"device {self.name!r}: {key} must be positive")
        if not self.memory_bytes < 2**63:  # the simulator and the bound hold capacities as int64
            raise PlacerError(f"device {self.name!r}: memory_bytes must be below 2**63 (int64), "
                              f"got {self.memory_bytes:.4g}")
        if not 0 <= self.op_overhead_s < math.inf:  # NaN fails too (the simulator called it an overflow)
            raise PlacerError(f"device {self.name!r}: op_overhead_s must be a finite number of seconds >= 0, "
                              f"got {self.op_overhead_s}")
        for key in ("compute_efficiency", "memory_efficiency"):
            if not 0 < getattr(self, key) <= 1:
                raise PlacerError(f"device {self.name!r}: {key} must lie in (0, 1]")

    @property
    def kind_bit(self) -> int:
        return kind_bit(self.kind)


@dataclass(frozen=True)
class Link:
    src: str  # device name
    dst: str  # device name
    bandwidth_Bps: float
    latency_s: float
    channel: str  # transfers on the same channel are served one at a time

    def __post_init__(self) -> None:
        if not isinstance(self.channel, str):  # sorted with the others' names (link_table, the trace)
            raise PlacerError(f"link {self.src}->{self.dst}: channel must be a string, got {self.channel!r}")
        if not self.bandwidth_Bps > 0 or not self.latency_s >= 0:  # NaN fails both (it made the simulator loop)
            raise PlacerError(f"link {self.src}->{self.dst}: bandwidth must be positive, latency not negative, "
                              f"got {self.bandwidth_Bps} B/s and {self.latency_s} s")


PROFILE_NAMED_BY = "profile_named_by"
"""``Machine.meta`` key: what named the machine's profile (``machine file 'M.json'``), for the messages about
that profile, which is read only when a simulator is built."""


@dataclass(frozen=True)
class Machine:
    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    description: str = ""
    profile: str = ""  # path of a measured per-op profile the cost model reads for this machine ("" = none)
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():  # it heads every table and names runs
            raise PlacerError(f"a machine's name must be a non-empty string, got {self.name!r}")
        names = [d.name for d in self.devices]
        if not names:
            raise PlacerError(f"machine {self.name!r} has no devices")
        if len(set(names)) != len(names):
            raise PlacerError(f"machine {self.name!r}: device names are not unique")
        pairs = set()
        for link in self.links:  # one link per ordered pair of distinct devices: the simulator reads one
            for end in (link.src, link.dst):
                if end not in names:
                    raise PlacerError(f"machine {self.name!r}: link names unknown device {end!r}")
            if link.src == link.dst:
                raise PlacerError(f"machine {self.name!r}: a link from {link.src!r} to itself")
            if (link.src, link.dst) in pairs:
                raise PlacerError(f"machine {self.name!r}: two links from {link.src!r} to {link.dst!r}")
            pairs.add((link.src, link.dst))
        for a in names:
            for b in names:
                if a != b and (a, b) not in pairs:
                    raise PlacerError(f"machine {self.name!r}: no link from {a!r} to {b!r}")

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def device_index(self, name: str) -> int:
        for i, device in enumerate(self.devices):
            if device.name == name:
                return i
        raise PlacerError(f"machine {self.name!r} has no device {name!r} "
                          f"(devices: {', '.join(d.name for d in self.devices)})")

    def indices_of_kind(self, kind: str) -> list[int]:
        return [i for i, d in enumerate(self.devices) if d.kind == kind]

    @property
    def kind_bits(self) -> np.ndarray:
        """(D,) uint8: each device's bit in an op's allowed_mask."""
        return np.array([d.kind_bit for d in self.devices], dtype=np.uint8)

    def link(self, src: int, dst: int) -> Link:
        a, b = self.devices[src].name, self.devices[dst].name
        for link in self.links:
            if link.src == a and link.dst == b:
                return link
        raise PlacerError(f"machine {self.name!r}: no link from {a!r} to {b!r}")

    def kept_device_indices(self, names: Sequence[str]) -> np.ndarray:
        """(D',) int64, ascending: the indices of the devices that stay when ``names`` leave, i.e. where
        device i of ``without_devices(names)`` sits in this machine (a reduced placement's index i means
        device kept[i] here). An unknown name is a PlacerError listing the devices."""
        gone = {self.device_index(name) for name in names}  # device_index names the machine's devices
        if len(gone) == self.num_devices:
            raise PlacerError(f"machine {self.name!r}: cannot remove the last device "
                              f"(removing {', '.join(names)} leaves none)")
        return np.array([i for i in range(self.num_devices) if i not in gone], dtype=np.int64)

    def without_devices(self, names: Sequence[str]) -> Machine:
        """This machine minus the devices ``names`` and every link touching them (a device that left a
        running search): named "<name>-without-<device>[-<device>...]", the kept devices in their order."""
        kept = self.kept_device_indices(names)
        devices = tuple(self.devices[i] for i in kept)
        left = {d.name for d in devices}
        links = tuple(link for link in self.links if link.src in left and link.dst in left)
        gone = [d.name for i, d in enumerate(self.devices) if i not in set(kept.tolist())]
        return replace(self, name=f"{self.name}-without-{'-'.join(gone)}", devices=devices, links=links)
