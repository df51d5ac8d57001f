"""`placer measure`: one real measurement from the command line, JSON report, clean failures."""

import json

import pytest

from cluster.cli import main
from measurers.factory import MeasurerSpec, build_measurer
from measurers.catalog import load_machine
from conftest import one_placer_error

SPEC = "tests/fixtures/tiny_models.py:tiny_torch_mlp"


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "mlp.parquet"
    assert main(["graphs", "import", "--torch", SPEC, "-o", str(path)]) == 0
    return path


def test_measure__torch_json_report(mlp_file, capsys):
    capsys.readouterr()
    code = main(["measure", "--graph", str(mlp_file), "--machine", "local", "--measurer", "torch",
                 "--policy", "cpu-only", "--runs", "3", "--warmup", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["status"] == "ok"
    assert len(report["samples_s"]) == 3 and report["runtime_s"] == sorted(report["samples_s"])[1]
    assert report["runs"] == 3 and report["warmup"] == 1 and report["devices"][0]["name"] == "cpu:0"
    assert report["devices"][0]["peak_bytes"] is None  # a CPU's peak is not measured: it was a measured 0


def test_measure__text_report_of_a_timeout_and_of_cpus_memory(mlp_file, capsys):
    """It said "step inf s (timeout), median of 0" and "peak 0.000 GB" for a CPU, whose memory no measurer
    reads."""
    capsys.readouterr()
    args = ["measure", "--graph", str(mlp_file), "--machine", "local", "--measurer", "torch", "--policy", "cpu-only"]
    assert main([*args, "--runs", "1", "--warmup", "0", "--timeout", "1e-9"]) == 1
    out = capsys.readouterr().out
    assert "no step time (timeout, " in out and "inf s" not in out
    assert "peak not measured" in out and "GB" not in out


def test_measure__placement_file_of_wrong_length_is_a_clean_error(mlp_file, tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(["cpu:0"] * 3))
    code = main(["measure", "--graph", str(mlp_file), "--measurer", "torch", "--placement", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("placer: error:") and "has 3 entries, but graph" in err, err


def test_measure__graph_that_cannot_be_rebuilt_is_a_clean_error(capsys):
    code = main(["measure", "--graph", "synthetic:20:1", "--measurer", "torch", "--policy", "cpu-only"])
    assert code == 2 and "cannot be rebuilt" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--runs", "0"], "--runs must be from 1 to 10,000, got 0"),  # "measurer runs must ..."
    (["--warmup", "-1"], "--warmup must be from 0 to 10,000, got -1"),
    (["--runs", "99999999999"], "--runs must be from 1 to 10,000, got 99999999999"),  # 745 GiB of samples
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0.0"),  # "measurer timeout_s ..."
    (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
    (["--seed", "-1"], "--seed must be a whole number in 0..4294967295, got -1"),  # "a seed must ..."
])
def test_measure__bad_numbers_are_named_by_their_flags(capsys, flags, message):
    argv = ["measure", "--graph", "synthetic:20:1", "--measurer", "torch", "--policy", "cpu-only", *flags]
    assert main(argv) == 2
    assert one_placer_error(capsys) == f"placer: error: {message}\n"


def test_measure__a_step_whose_spec_file_is_gone_is_bad_input(tmp_path, capsys):
    import shutil

    models = tmp_path / "my_models.py"
    shutil.copy("tests/fixtures/tiny_models.py", models)
    graph_file = tmp_path / "mlp.parquet"
    assert main(["graphs", "import", "--torch", f"{models}:tiny_torch_mlp", "-o", str(graph_file)]) == 0
    models.unlink()
    capsys.readouterr()
    code = main(["measure", "--graph", str(graph_file), "--measurer", "torch", "--policy", "cpu-only", "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and f"no file '{models}'" in captured.err
    assert captured.err.count("\n") == 1 and captured.err.startswith("placer: error: ")


def test_measure__a_gpu_this_process_lacks_is_bad_input(mlp_file, capsys):
    """The measurement runs in this process: a machine with GPUs torch cannot see here is one error and
    exit 2, not a report of an ``error`` measurement."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA devices")
    code = main(["measure", "--graph", str(mlp_file), "--machine", "paper-2gpu", "--measurer", "torch",
                 "--policy", "cpu-only", "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == "placer: error: machine 'paper-2gpu' has GPU 'gpu:0' but torch sees only 0 CUDA devices\n"


def test_measure__a_policy_the_machine_cannot_run_fails_before_the_step_is_captured(mlp_file, capsys, monkeypatch):
    """The heuristic places in the simulator first: on a machine without GPUs, ``single-gpu`` is one error
    in seconds, not after the real step is built and captured (3 minutes for the full-size RNNLM)."""
    from measurers.torch.measurer import TorchMeasurer

    captures = []
    monkeypatch.setattr(TorchMeasurer, "_capture", lambda self: captures.append(self.graph.name))
    code = main(["measure", "--graph", str(mlp_file), "--machine", "local", "--measurer", "torch",
                 "--policy", "single-gpu", "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and captures == []
    assert captured.err == "placer: error: machine 'local' has no gpu device\n"


def test_build_measurer__torch_spec_builds_a_working_measurer(mlp_file):
    from graphs.io import load_graph_file
    from conftest import policy_placement

    graph = load_graph_file(mlp_file)
    machine = load_machine("local")
    measurer = build_measurer(MeasurerSpec("torch", graph, machine, runs=2, warmup=0))
    result = measurer.measure([policy_placement(graph, machine, "cpu-only")])[0]
    assert result.status == "ok" and len(result.samples_s) == 2


def test_measure__tf_json_report_for_an_imported_keras_spec(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    path = tmp_path / "keras.parquet"
    assert main(["graphs", "import", "--keras", "tests/fixtures/tiny_models.py:tiny_keras_mlp", "-o", str(path)]) == 0
    capsys.readouterr()
    code = main(["measure", "--graph", str(path), "--measurer", "tf", "--policy", "cpu-only", "--runs", "2",
                 "--warmup", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["status"] == "ok" and len(report["samples_s"]) == 2 and report["runtime_s"] > 0


def test_profile__torch_profile_covers_every_op_and_feeds_the_simulator(mlp_file, tmp_path, capsys):
    from graphs.io import load_graph_file
    from measurers.sim.costs import load_profile

    out = tmp_path / "profile.json"
    assert main(["profile", "--graph", str(mlp_file), "--measurer", "torch", "--runs", "2", "-o", str(out)]) == 0
    graph = load_graph_file(mlp_file)
    profile = load_profile(out)
    timed = {i for i, k in enumerate(graph.op_kinds) if k not in ("Variable", "Input")}
    assert set(profile.op_names) == {graph.op_names[i] for i in timed}
    assert set(profile.device_models) == {load_machine("local").devices[0].model}
    assert profile.graph_hash == graph.content_hash and (profile.time_s > 0).all()
    capsys.readouterr()
    common = ["simulate", "--graph", str(mlp_file), "--machine", "local", "--policy", "cpu-only", "--json"]
    assert main([*common, "--profile", str(out)]) == 0
    profiled = json.loads(capsys.readouterr().out)["runtime_s"]
    # the step is a chain on one device: its simulated time is the sum of the measured op times
    assert profiled == pytest.approx(float(profile.time_s.sum()), rel=1e-6)


def test_profile__unknown_graph_origin_is_a_clean_error(capsys):
    code = main(["profile", "--graph", "synthetic:20:1", "--measurer", "torch", "-o", "/tmp/never.json"])
    assert code == 2 and "cannot be rebuilt" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-5", "99999999999999999999"])
def test_profile__a_seed_out_of_range_is_one_error_before_profiling(capsys, tmp_path, seed):
    """torch took -5; past 2**63 it was a traceback."""
    out = tmp_path / "p.json"
    assert main(["profile", "--graph", "synthetic:20:1", "--measurer", "torch", "--seed", seed, "-o", str(out)]) == 2
    assert f"--seed must be a whole number in 0..4294967295, got {seed}" in capsys.readouterr().err
    assert not out.exists()


def test_profile__a_step_that_fails_is_one_error_and_writes_nothing(mlp_file, tmp_path, capsys, monkeypatch):
    """A step that raised while profiled (out of memory on a GPU, say) was a traceback."""
    import measurers.profiler

    def failing(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setattr(measurers.profiler, "profile_graph", failing)
    out = tmp_path / "p.json"
    assert main(["profile", "--graph", str(mlp_file), "--measurer", "torch", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "failed while it was profiled on local (RuntimeError: CUDA error: an " \
        "illegal memory access was encountered); no profile was written" in err
    assert not out.exists()
    assert main(["profile", "--graph", str(mlp_file), "--measurer", "torch", "--runs", "20000", "-o", str(out)]) == 2
    assert "--runs must be from 1 to 10,000, got 20000" in capsys.readouterr().err


def test_profile__named_inside_a_machine_file_is_used_by_the_simulator(mlp_file, tmp_path, capsys):
    from measurers.catalog import machine_to_json
    from measurers.sim.costs import load_profile

    profile_file = tmp_path / "profile.json"
    assert main(["profile", "--graph", str(mlp_file), "--measurer", "torch", "--runs", "2", "-o",
                 str(profile_file)]) == 0
    machine_json = machine_to_json(load_machine("local"))
    machine_json["profile"] = "profile.json"  # relative to the machine file
    machine_file = tmp_path / "local-profiled.json"
    machine_file.write_text(json.dumps(machine_json))
    capsys.readouterr()
    assert main(["simulate", "--graph", str(mlp_file), "--machine", str(machine_file), "--policy", "cpu-only",
                 "--json"]) == 0
    runtime_s = json.loads(capsys.readouterr().out)["runtime_s"]
    assert runtime_s == pytest.approx(float(load_profile(profile_file).time_s.sum()), rel=1e-6)
    machine_json["profile"] = "missing.json"
    machine_file.write_text(json.dumps(machine_json))
    assert main(["machines", "show", str(machine_file)]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_profile__machine_out_writes_a_machine_that_names_the_profile(mlp_file, tmp_path, capsys):
    """On this CPU-only node there is no link to time: the machine file is the local machine plus the profile,
    and the simulator reads both from it."""
    from measurers.sim.costs import load_profile

    profile_file, machine_file = tmp_path / "p" / "profile.json", tmp_path / "m" / "node.json"
    for folder in (profile_file.parent, machine_file.parent):
        folder.mkdir()
    assert main(["profile", "--graph", str(mlp_file), "--measurer", "torch", "--runs", "2", "-o", str(profile_file),
                 "--machine-out", str(machine_file)]) == 0
    assert f"machine with no link to measure (one device) -> {machine_file}" in capsys.readouterr().out
    written = json.loads(machine_file.read_text())
    assert written["profile"] == "../p/profile.json"
    assert written["name"] == "local@node"  # not `local`, whose runs `placer analyze` would mix with these
    assert [d["name"] for d in written["devices"]] == [d.name for d in load_machine("local").devices]
    assert main(["simulate", "--graph", str(mlp_file), "--machine", str(machine_file), "--policy", "cpu-only",
                 "--json"]) == 0
    runtime_s = json.loads(capsys.readouterr().out)["runtime_s"]
    assert runtime_s == pytest.approx(float(load_profile(profile_file).time_s.sum()), rel=1e-6)
    assert main(["machines", "show", str(machine_file)]) == 0  # it showed the device figures alone
    shown = capsys.readouterr().out
    assert f"profile {profile_file.resolve()} (measured op times: the simulator uses them" in shown
    assert "links: none (one device)" in shown and "latency us" not in shown  # not a header over no rows


def test_profile__machine_out_says_which_links_it_did_not_time(mlp_file, tmp_path, capsys):
    """Two CPUs are one torch device: no copy between them to time, so their links keep the given figures.
    It printed those figures as "measured links"."""
    machine_json, given = _two_cpu_machine(tmp_path)
    machine_out = tmp_path / "measured.json"
    assert main(["profile", "--graph", str(mlp_file), "--machine", str(given), "--measurer", "torch", "--runs", "1",
                 "-o", str(tmp_path / "p.json"), "--machine-out", str(machine_out)]) == 0
    out = capsys.readouterr().out
    assert "machine with no link measured; 2 kept as given (both ends one torch device)" in out
    assert "measured here" not in out
    assert json.loads(machine_out.read_text())["links"] == machine_json["links"]


def test_profile__machine_out_prints_only_the_timed_links_as_measured(mlp_file, tmp_path, capsys, monkeypatch):
    from measurers import link_calibration
    from measurers.link_calibration import CopyTiming

    def one_link_timed(machine, torch_devices):  # as if cpu:1 were another torch device, reached one way only
        return [CopyTiming("cpu:0", "cpu:1", size, 3e-5 + size / 2e9) for size in (4096, 1 << 20)]

    monkeypatch.setattr(link_calibration, "time_torch_copies", one_link_timed)
    _, given = _two_cpu_machine(tmp_path)
    assert main(["profile", "--graph", str(mlp_file), "--machine", str(given), "--measurer", "torch", "--runs", "1",
                 "-o", str(tmp_path / "p.json"), "--machine-out", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "machine with links measured here (cpu:0->cpu:1 2.00 GB/s + 30.0 us); 1 kept as given" in out


def test_profile__a_link_fit_that_fails_keeps_the_profile(mlp_file, tmp_path, capsys, monkeypatch):
    """The copies were timed after the profile, and a link fit that failed threw the finished profile away."""
    from measurers import link_calibration
    from measurers.link_calibration import CopyTiming

    def flat_copies(machine, torch_devices):  # bigger copies no slower: no bandwidth to fit
        return [CopyTiming("cpu:0", "cpu:1", size, 3e-5) for size in (4096, 1 << 20)]

    monkeypatch.setattr(link_calibration, "time_torch_copies", flat_copies)
    _, given = _two_cpu_machine(tmp_path)
    profile_file, machine_file = tmp_path / "p.json", tmp_path / "m.json"
    assert main(["profile", "--graph", str(mlp_file), "--machine", str(given), "--measurer", "torch", "--runs", "1",
                 "-o", str(profile_file), "--machine-out", str(machine_file)]) == 2
    err = capsys.readouterr().err
    assert "no bandwidth to fit" in err and f"the profile was saved to {profile_file}" in err
    assert err.count("\n") == 1 and profile_file.exists() and not machine_file.exists()


def _two_cpu_machine(folder) -> tuple[dict, object]:
    """This node's CPU twice, linked both ways: (its JSON, the file it is written to)."""
    from measurers.catalog import machine_to_json

    machine_json = machine_to_json(load_machine("local"))
    machine_json["devices"].append({**machine_json["devices"][0], "name": "cpu:1"})
    machine_json["links"] = [{"src": src, "dst": dst, "bandwidth_Bps": 3e10, "latency_s": 1e-6, "channel": "upi"}
                             for src, dst in (("cpu:0", "cpu:1"), ("cpu:1", "cpu:0"))]
    path = folder / "two-cpus.json"
    path.write_text(json.dumps(machine_json))
    return machine_json, path


def test_profile__machine_out_needs_the_torch_measurer(mlp_file, tmp_path, capsys):
    out, machine_out = tmp_path / "p.json", tmp_path / "m.json"
    assert main(["profile", "--graph", str(mlp_file), "--measurer", "tf", "-o", str(out), "--machine-out",
                 str(machine_out)]) == 2
    assert "--machine-out times copies with PyTorch: it needs --measurer torch, not tf" in capsys.readouterr().err
    assert not out.exists() and not machine_out.exists()


def test_profile__machine_out_that_is_the_profile_file_is_refused_before_profiling(mlp_file, tmp_path, capsys,
                                                                                  monkeypatch):
    """It wrote the profile, then the machine file over it (naming itself as its profile), and exited 0."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.json").write_text("kept")
    assert main(["profile", "--graph", str(mlp_file), "--measurer", "torch", "--runs", "1", "-o", "p.json",
                 "--machine-out", "./sub/../p.json"]) == 2
    assert "--machine-out and -o are the same file (p.json)" in capsys.readouterr().err
    assert (tmp_path / "p.json").read_text() == "kept"


def test_measure__openvino_inference_of_an_imported_ir(tmp_path, capsys):
    from measurers.openvino.sample import save_sample_model

    xml = save_sample_model(tmp_path)
    graph_file = tmp_path / "sample.parquet"
    assert main(["graphs", "import", "--openvino", str(xml), "-o", str(graph_file)]) == 0
    capsys.readouterr()
    code = main(["measure", "--graph", str(graph_file), "--machine", "openvino", "--measurer", "openvino",
                 "--policy", "cpu-only", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["status"] == "ok" and report["runtime_s"] > 0
    assert (report["runs"], report["warmup"]) == (10, 3) and len(report["samples_s"]) == 10  # inference defaults
    assert report["machine"] == "openvino" and report["devices"][0]["name"] == "cpu:0"


def test_measure__openvino_on_a_graph_without_a_model_file_is_a_clean_error(capsys):
    code = main(["measure", "--graph", "synthetic:20:1", "--machine", "openvino", "--measurer", "openvino",
                 "--policy", "cpu-only"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("placer: error:") and "names no model file" in err, err


def test_profile__openvinos_reason_for_a_failed_step_is_in_the_error(mlp_file, tmp_path, capsys, monkeypatch):
    """OpenVINO's first line is a C++ source location: the error quoted only "Exception from
    src/inference/src/cpp/core.cpp:117:", its reason (the line after) left out."""
    import measurers.profiler

    def failing(*args, **kwargs):
        raise RuntimeError("Exception from src/inference/src/cpp/core.cpp:117:\nException from src/plugins/intel_cpu/"
                           "src/node.cpp:41:\nCPU plug-in doesn't support Parameter operation with dynamic rank.\n")

    monkeypatch.setattr(measurers.profiler, "profile_graph", failing)
    out = tmp_path / "p.json"
    assert main(["profile", "--graph", str(mlp_file), "--machine", "openvino", "--measurer", "openvino",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(RuntimeError: CPU plug-in doesn't support Parameter operation with dynamic " \
        "rank.); no profile was written" in err, err
    assert not out.exists()
