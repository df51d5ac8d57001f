"""A machine's JSON form, both ways: what catalog files, user machine files and the seeded families share.

See measurers/catalog.py for the format. ``machine_from_json`` validates every field and fills a device's
missing fields from its catalog ``model`` profile; ``machine_to_json`` writes the fully spelled-out form.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields, replace
from pathlib import Path

from graphs.errors import PlacerError
from graphs.files import atomic_file, file_problem
from measurers.devices import device_profiles
from measurers.machine import PROFILE_NAMED_BY, Device, Link, Machine

NOTE_FIELDS = ("source", "notes")  # free text allowed in profiles and device entries

DEVICE_FIELDS = {f.name: f.type for f in fields(Device)}
LINK_FIELDS = {f.name: f.type for f in fields(Link)}
_NUMBER_FIELDS = {"peak_flops", "mem_bandwidth_Bps", "memory_bytes", "op_overhead_s", "compute_efficiency",
                  "memory_efficiency", "bandwidth_Bps", "latency_s"}


def machine_from_json(data: object, where: str = "machine", base_dir: Path | None = None) -> Machine:
    """Build a Machine from its JSON form (see the module docstring), validating every field. A
    ``profile`` path (a file of `placer profile`) is taken relative to ``base_dir`` (the file's folder)."""
    if not isinstance(data, dict):
        raise PlacerError(f"{where}: the top level must be an object")
    name = _field(data, "name", str, where)
    devices = _field(data, "devices", list, where)
    links = _field(data, "links", list, where)
    unknown = set(data) - {"name", "devices", "links", "description", "profile"}
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    description = _field(data, "description", str, where) if "description" in data else ""
    profile = _field(data, "profile", str, where) if "profile" in data else ""
    if profile:
        profile_path = Path(profile) if base_dir is None else Path(base_dir) / profile
        if problem := file_problem(profile_path):
            raise PlacerError(f"{where}: profile file {str(profile_path)!r} {problem}")
        profile = str(profile_path.resolve())
    try:
        machine = Machine(
            name=name,
            devices=tuple(_device(entry, f"{where}: devices[{i}]") for i, entry in enumerate(devices)),
            links=tuple(_link(entry, f"{where}: links[{i}]") for i, entry in enumerate(links)),
            description=str(description),
            profile=profile,
            meta={PROFILE_NAMED_BY: where} if profile else {},
        )
    except PlacerError as exc:
        if str(exc).startswith(where):
            raise
        raise PlacerError(f"{where}: {exc}") from None
    return machine


def machine_to_json(machine: Machine) -> dict:
    """The fully spelled-out JSON form of ``machine`` (loads back to an equal Machine)."""
    data = {
        "name": machine.name,
        "description": machine.description,
        "devices": [{key: getattr(d, key) for key in DEVICE_FIELDS} for d in machine.devices],
        "links": [{key: getattr(link, key) for key in LINK_FIELDS} for link in machine.links],
    }
    if machine.profile:
        data["profile"] = machine.profile
    return data


def save_machine(machine: Machine, path: str | Path) -> None:
    """Write ``machine`` as a machine file (atomically). The profile it names is written relative to the
    file's folder, where ``machine_from_json`` looks for it, so the two files can move together."""
    path = Path(path)
    if machine.profile:
        relative = os.path.relpath(Path(machine.profile).resolve(), path.resolve().parent)
        machine = replace(machine, profile=relative)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(machine_to_json(machine), indent=1))


def _device(entry: object, where: str) -> Device:
    if not isinstance(entry, dict):
        raise PlacerError(f"{where} must be an object")
    values: dict = {}
    model = entry.get("model")
    if isinstance(model, str) and model in device_profiles():
        values.update({k: v for k, v in device_profiles()[model].items() if k not in NOTE_FIELDS})
    elif "kind" not in entry:  # a model we do not know and no spelled-out fields
        raise PlacerError(f"{where}: model {model!r} is not in the catalog "
                          f"(models: {', '.join(device_profiles())}) and the entry has no field 'kind'")
    unknown = set(entry) - set(DEVICE_FIELDS) - set(NOTE_FIELDS)
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    values.update({k: v for k, v in entry.items() if k not in NOTE_FIELDS})
    values = {key: _field(values, key, DEVICE_FIELDS[key], where) for key in DEVICE_FIELDS if key in values
              or key not in ("compute_efficiency", "memory_efficiency")}
    values["memory_bytes"] = int(values["memory_bytes"])
    return Device(**values)


def _link(entry: object, where: str) -> Link:
    if not isinstance(entry, dict):
        raise PlacerError(f"{where} must be an object")
    unknown = set(entry) - set(LINK_FIELDS)
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    return Link(**{key: _field(entry, key, LINK_FIELDS[key], where) for key in LINK_FIELDS})


def _is_finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past every float
        return False


def _short_repr(value) -> str:
    if isinstance(value, int) and abs(value) >= 10**40:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def _field(data: dict, key: str, expected, where: str):
    """``data[key]`` checked against the expected type; numbers are any int or float but not bool."""
    if key not in data:
        raise PlacerError(f"{where}: missing field {key!r}")
    value = data[key]
    if key in _NUMBER_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PlacerError(f"{where}: field {key!r} must be a number, got {value!r}")
        if not _is_finite(value):
            raise PlacerError(f"{where}: field {key!r} must be finite, got {_short_repr(value)}")
        if key == "memory_bytes" and value != int(value):  # 1.5 was truncated to a 1-byte device
            raise PlacerError(f"{where}: field 'memory_bytes' must be a whole number of bytes, got {value!r}")
        return float(value) if key != "memory_bytes" else value
    expected_type = {"str": str, "list": list}.get(expected, expected) if isinstance(expected, str) else expected
    if expected_type in (str, list) and not isinstance(value, expected_type):
        raise PlacerError(f"{where}: field {key!r} must be a {expected_type.__name__}, got {value!r}")
    return value
