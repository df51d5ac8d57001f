"""The machine catalog, user machine files and `placer machines`."""

import json

import pytest

from cluster.cli import main
from graphs.errors import PlacerError
from measurers.catalog import (CATALOG_DIR, device_profiles, list_machines, load_machine, machine_from_json,
                               machine_to_json)


def test_catalog__has_the_papers_and_modern_machines():
    assert {"paper-2gpu", "paper-4gpu", "dgx1-v100", "h200x8"} <= set(list_machines())
    assert {"K40", "K80", "P100", "V100", "A100", "H100", "H200"} <= set(device_profiles())
    assert any(p["kind"] == "cpu" for p in device_profiles().values())


@pytest.mark.parametrize("name", ["paper-2gpu", "paper-4gpu", "dgx1-v100", "h200x8"])
def test_catalog_machine__loads_and_round_trips_through_json(name):
    machine = load_machine(name)
    assert machine_from_json(json.loads(json.dumps(machine_to_json(machine)))) == machine


def test_save_machine__names_its_profile_relative_to_its_folder_and_loads_back(tmp_path):
    """What `placer profile --machine-out` writes: the two files can move together."""
    import dataclasses

    from measurers.machine_json import save_machine

    (tmp_path / "p").mkdir()
    profile = tmp_path / "p" / "profile.json"
    profile.write_text("{}")
    machine = dataclasses.replace(load_machine("paper-2gpu"), profile=str(profile))
    save_machine(machine, tmp_path / "m" / "node.json")
    assert json.loads((tmp_path / "m" / "node.json").read_text())["profile"] == "../p/profile.json"
    (tmp_path / "moved").mkdir()
    for folder in ("p", "m"):
        (tmp_path / folder).rename(tmp_path / "moved" / folder)
    moved = load_machine(str(tmp_path / "moved" / "m" / "node.json"))
    assert moved == dataclasses.replace(machine, profile=str((tmp_path / "moved" / "p" / "profile.json").resolve()))


def test_paper_machines__one_cpu_and_k80_dies_through_the_host():
    for name, gpus in (("paper-2gpu", 2), ("paper-4gpu", 4)):
        machine = load_machine(name)
        assert len(machine.indices_of_kind("cpu")) == 1 and len(machine.indices_of_kind("gpu")) == gpus
        k80 = machine.devices[1]
        assert k80.model == "K80" and k80.peak_flops == 4.37e12 and k80.memory_bytes == 12 * 2**30
        peer = machine.link(1, 2)
        assert peer.channel == "host:staging" and peer.bandwidth_Bps < machine.link(0, 1).bandwidth_Bps


def test_dgx1__nvlink_pairs_are_faster_than_host_pairs():
    machine = load_machine("dgx1-v100")
    assert machine.link(1, 2).channel.startswith("nvlink")  # gpu:0 -> gpu:1
    assert machine.link(1, 6).channel == "host:staging"  # gpu:0 -> gpu:5 has no NVLink
    assert machine.link(1, 4).bandwidth_Bps == 2 * machine.link(1, 2).bandwidth_Bps  # gpu:0-gpu:3: two links


def user_file(tmp_path, mutate):
    data = machine_to_json(load_machine("paper-2gpu"))
    data["devices"][1] = {"name": "gpu:0", "model": "K80", "memory_bytes": 6 * 10**9}  # a profile + an override
    mutate(data)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    return path


def test_user_machine_file__profile_reference_with_override(tmp_path):
    machine = load_machine(str(user_file(tmp_path, lambda d: None)))
    assert machine.devices[1].memory_bytes == 6 * 10**9 and machine.devices[1].peak_flops == 4.37e12


def test_user_machine_file__largest_int64_memory_is_accepted(tmp_path):
    machine = load_machine(str(user_file(tmp_path, lambda d: d["devices"][1].update(memory_bytes=2**63 - 1))))
    assert machine.devices[1].memory_bytes == 2**63 - 1


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["devices"][2].update(model="my-gpu") or d["devices"][2].pop("peak_flops"),
     r"devices\[2\]: missing field 'peak_flops'"),  # spelled out (no catalog model), one field short
    (lambda d: d["devices"][2].update(memory_bytes="lots"), r"devices\[2\]: field 'memory_bytes' must be a number"),
    (lambda d: d["devices"][1].update(model="K90"), r"devices\[1\]: model 'K90' is not in the catalog"),
    (lambda d: d["links"][0].pop("channel"), r"links\[0\]: missing field 'channel'"),
    (lambda d: d.pop("links"), "missing field 'links'"),
    (lambda d: d["links"].pop(), "no link from 'gpu:1' to 'gpu:0'"),
    (lambda d: d["devices"][2].update(op_overhead_s=-1.0), "op_overhead_s must be a finite number of seconds >= 0, got -1.0"),
    (lambda d: d["devices"][2].update(speed=3), "unknown field 'speed'"),
    (lambda d: d["devices"][1].update(memory_bytes=2**63), r"memory_bytes must be below 2\*\*63"),  # int64 overflow
    (lambda d: d["devices"][1].update(memory_bytes=1e300), r"memory_bytes must be below 2\*\*63"),
    (lambda d: d.update(profile="."), r"profile file '.*' is a folder, not a file"),
    (lambda d: d.update(profile=False), "field 'profile' must be a str, got False"),  # was a file named 'False'
    (lambda d: d.update(description=["x"]), r"field 'description' must be a str, got \['x'\]"),
    (lambda d: d["devices"][1].update(memory_bytes=1.5), "'memory_bytes' must be a whole number of bytes, got 1.5"),
    (lambda d: d["links"][0].update(bandwidth_Bps=10**400), "field 'bandwidth_Bps' must be finite, got an integer "
                                                             "of 401 digits"),  # was an OverflowError traceback
    # One link per ordered pair: a second one silently replaced the first in the simulator (159 s steps).
    (lambda d: d["links"].append({**d["links"][0], "bandwidth_Bps": 1e6}), "two links from 'cpu:0' to 'gpu:0'"),
    (lambda d: d["links"].append({**d["links"][0], "dst": d["links"][0]["src"]}), "a link from 'cpu:0' to itself"),
    # An empty name was taken: tables read "g1 on : step 5.56 s"
    (lambda d: d.update(name=""), "a machine's name must be a non-empty string, got ''"),
    (lambda d: d.update(name=" "), "a machine's name must be a non-empty string, got ' '"),
    (lambda d: d["devices"][2].update(name="") or d["links"].clear(), "a device's name must be a non-empty string, "
                                                                      "got ''"),
    # simulate --json names links "src->dst": devices a, b->c, a->b, c gave links a->b->c twice, one's bytes lost
    (lambda d: d["devices"][2].update(name="gpu->1") or d["links"].clear(), r"device 'gpu->1': a device's name may "
                                                                           r"not hold '->', which names links"),
])
def test_user_machine_file__bad_field_is_one_error_naming_file_and_field(tmp_path, mutate, message):
    path = user_file(tmp_path, mutate)
    with pytest.raises(PlacerError, match=message) as error:
        load_machine(str(path))
    assert "mine.json" in str(error.value)


def test_load_machine__unknown_name_or_bad_json(tmp_path):
    with pytest.raises(PlacerError, match="unknown machine 'dgx9': not a file and not in the catalog"):
        load_machine("dgx9")
    with pytest.raises(PlacerError, match="a folder, not a machine file, and not in the catalog"):
        load_machine(str(tmp_path))
    for text in ("{", '{"name": ' + "1" * 5000 + "}", "[" * 100_000 + "]" * 100_000):  # digits, depth: Python limits
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(PlacerError, match="not readable JSON"):
            load_machine(str(tmp_path / "bad.json"))


def test_load_machine__a_key_named_twice_is_one_error(tmp_path):
    """A device's "memory_bytes": 1000 then 32e9 loaded as 32 GB, the first dropped without a word, where a
    placement file refuses the same."""
    path = tmp_path / "dup.json"
    path.write_text('{"name": "dup", "devices": [{"name": "gpu:0", "model": "V100", "memory_bytes": 1000, '
                    '"memory_bytes": 32000000000}], "links": []}')
    with pytest.raises(PlacerError, match="dup.json': 'memory_bytes' is named twice in one object$"):
        load_machine(str(path))


def test_cli_machines__list_show_and_json(capsys):
    assert main(["machines", "list"]) == 0
    assert "paper-4gpu" in capsys.readouterr().out
    assert main(["machines", "show", "h200x8"]) == 0
    assert "H200" in capsys.readouterr().out
    assert main(["machines", "show", "dgx1-v100", "--json"]) == 0
    assert machine_from_json(json.loads(capsys.readouterr().out)) == load_machine("dgx1-v100")
    assert main(["machines", "show", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "unknown machine 'nope'" in captured.err


def test_cli_machines_show__tiny_and_huge_figures_read_as_figures(tmp_path, capsys):
    """A 1 MB/s link printed as "0.0" GB/s, a 1,000-byte device as "0.0" GB, and 1e300 B/s as 300 digits
    that broke the table."""
    machine = json.loads((CATALOG_DIR / "paper-2gpu.json").read_text())
    machine["links"][0]["bandwidth_Bps"], machine["links"][1]["bandwidth_Bps"] = 1e6, 1e300
    machine["devices"][1]["memory_bytes"] = 1000
    (tmp_path / "m.json").write_text(json.dumps(machine))
    assert main(["machines", "show", str(tmp_path / "m.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split()[4] == "1e-06"  # memory GB of gpu:0
    assert lines[6].split()[1] == "0.001" and lines[7].split()[1] == "1e+291"
    assert len({len(line) for line in lines[2:5]}) == 1  # the device rows keep their columns


@pytest.mark.parametrize("overhead_s", [float("nan"), float("inf"), -1e-9])
def test_device__an_overhead_that_is_no_finite_time_is_refused(overhead_s):
    """NaN passed (``nan < 0`` is False) and the simulator later called the step an overflow."""
    from measurers.machine import Device

    with pytest.raises(PlacerError, match="device 'gpu:0': op_overhead_s must be a finite number of seconds >= 0"):
        Device("gpu:0", "gpu", "X", 1e12, 1e11, 10**9, overhead_s)


def test_link__a_channel_that_is_no_string_is_refused():
    """None passed, and sorting the channels with the others' names raised a TypeError."""
    from measurers.machine import Link

    with pytest.raises(PlacerError, match="link cpu:0->gpu:0: channel must be a string, got None"):
        Link("cpu:0", "gpu:0", 1e9, 0.0, None)
