"""Which OpenVINO device runs each machine device, and a machine made of the OpenVINO devices present.

A machine device maps to an OpenVINO device name: explicitly (``ov_devices``, one name per machine device,
or ``machine.meta["openvino_devices"]``, comma-separated, as ``openvino_machine`` records it), else by kind:
``cpu`` -> ``CPU``, the k-th ``gpu`` of the machine -> ``GPU.k`` (or ``GPU`` where OpenVINO lists a single
GPU under that name). A name the runtime lacks is a PlacerError naming the machine device. Machine devices
that map to one OpenVINO device (two ``cpu`` devices: both ``CPU``) run as that one device: a placement
split between them is no split. Example::

    machine = openvino_machine()                         # e.g. cpu:0 -> CPU, gpu:0 -> GPU.0
    names = openvino_device_names(machine, openvino_core().available_devices)
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from graphs.errors import PlacerError
from measurers.local import local_machine
from measurers.machine import Machine
from measurers.openvino.core import openvino_core

META_KEY = "openvino_devices"  # machine.meta entry: the OpenVINO device of each machine device, comma-separated


def openvino_device_names(machine: Machine, available: Sequence[str],
                          ov_devices: Sequence[str] | None = None) -> list[str]:
    """(D,) the OpenVINO device name of each machine device; PlacerError for one the runtime lacks."""
    if ov_devices is not None:
        names = list(ov_devices)
    else:
        names = _names_from_meta(machine) or _names_by_kind(machine, available)
    if len(names) != machine.num_devices:
        raise PlacerError(f"machine {machine.name!r} has {machine.num_devices} devices but {len(names)} "
                          f"OpenVINO device names were given ({', '.join(names)})")
    for device, name in zip(machine.devices, names):
        if name not in available:
            raise PlacerError(f"machine {machine.name!r} device {device.name!r} needs OpenVINO device {name!r}, "
                              f"which this runtime lacks (available: {', '.join(available) or 'none'})")
    return names


def _names_from_meta(machine: Machine) -> list[str]:
    text = machine.meta.get(META_KEY, "")
    return [name.strip() for name in text.split(",")] if text else []


def _names_by_kind(machine: Machine, available: Sequence[str]) -> list[str]:
    names, gpu = [], 0
    for device in machine.devices:
        if device.kind == "cpu":
            names.append("CPU")
            continue
        lone = [n for n in available if n.startswith("GPU")] == ["GPU"]
        names.append("GPU" if lone and gpu == 0 else f"GPU.{gpu}")
        gpu += 1
    return names


def openvino_gpus(core) -> list[tuple[str, str, int]]:
    """(OpenVINO name, full device name, memory bytes) of every GPU the runtime lists, in its order."""
    gpus = []
    for name in core.available_devices:
        if name.startswith("GPU"):
            full = str(core.get_property(name, "FULL_DEVICE_NAME"))
            try:
                memory = int(core.get_property(name, "GPU_DEVICE_TOTAL_MEM_SIZE"))
            except (RuntimeError, TypeError, ValueError):
                memory = 2**30  # the plugin did not say; a small figure, not a guess of the real one
            gpus.append((name, full, memory))
    return gpus


def openvino_machine(core=None) -> Machine:
    """This node's CPU plus every GPU OpenVINO lists, with the local machine's catalog-like profiles and
    links (measurers.local); ``meta["openvino_devices"]`` records the OpenVINO name of each device."""
    core = core or openvino_core()
    gpus = openvino_gpus(core)
    base = local_machine(gpus=[(full, memory) for _, full, memory in gpus])
    names = ["CPU"] + [name for name, _, _ in gpus]
    description = base.description.replace("this node", "this node through OpenVINO", 1)
    return dataclasses.replace(base, name="openvino", description=description, meta={META_KEY: ",".join(names)})
