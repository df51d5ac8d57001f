"""The machine catalog: device profiles and named machines, as JSON files a user can copy and edit.

``measurers/catalog/devices.json`` holds device profiles keyed by model (K40, K80, P100, V100, T4, A10, L4,
A100, H100, H200, server CPUs, laptop and desktop CPUs and their integrated GPUs). Every other
``measurers/catalog/<name>.json`` is a machine::

    {"name": "paper-2gpu", "description": "...",
     "devices": [{"name": "cpu:0", "model": "Xeon-E5-2699v3"},
                 {"name": "gpu:0", "model": "K80", "memory_bytes": 6e9}],   # any profile field may be overridden
     "links": [{"src": "cpu:0", "dst": "gpu:0", "bandwidth_Bps": 10e9, "latency_s": 1e-5,
                "channel": "pcie:board0:h2d"}, ...]}                          # one link per ordered device pair

A device entry either names a catalog ``model`` (its fields fill in what the entry leaves out) or spells
out every field. ``machine_to_json`` writes the fully spelled-out form, which loads back unchanged.
"""

from __future__ import annotations

from pathlib import Path

from graphs.errors import PlacerError
from graphs.files import is_dir as is_named_dir, is_file as is_named_file, loads_json_once
from measurers.devices import CATALOG_DIR, DEVICES_FILE, device_profiles
from measurers.machine import Machine
from measurers.machine_json import machine_from_json, machine_to_json

__all__ = [  # the profiles and the JSON form are re-exported: callers need one module
    "device_profiles", "list_machines", "load_machine", "machine_from_json", "machine_to_json"]


def list_machines() -> list[str]:
    """Names of the machines in the catalog, sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.json") if p != DEVICES_FILE)


def load_machine(name_or_file: str) -> Machine:
    """A catalog machine name or a machine JSON file; one PlacerError naming the file and field otherwise."""
    path = Path(name_or_file)
    is_file = is_named_file(path)  # a hetero: seed of 249 digits is a name, not a path
    if name_or_file == "local" and not is_file:
        from measurers.local import local_machine  # the devices this process really has

        return local_machine()
    if name_or_file == "openvino" and not is_file:
        from measurers.openvino.devices import openvino_machine  # the devices OpenVINO sees here

        return openvino_machine()
    if name_or_file.startswith("hetero:") and not is_file:
        from measurers.machine_families import hetero_machine  # seeded heterogeneous boxes

        return hetero_machine(name_or_file)
    if not is_file:
        if name_or_file not in list_machines():
            what = "a folder, not a machine file, and not" if is_named_dir(path) else "not a file and not"
            raise PlacerError(f"unknown machine {name_or_file!r}: {what} in the catalog "
                              f"(machines: {', '.join(list_machines())}, local, openvino, hetero:SEED)")
        path = CATALOG_DIR / f"{name_or_file}.json"
    try:
        data = loads_json_once(path.read_text(), f"machine file {str(path)!r}")
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, bad UTF-8, 4,300+ digits
        raise PlacerError(f"machine file {str(path)!r} is not readable JSON: {exc}") from None
    return machine_from_json(data, where=f"machine file {str(path)!r}", base_dir=path.parent)
