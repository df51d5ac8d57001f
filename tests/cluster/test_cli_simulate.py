"""`placer simulate`: JSON report, placement files, traces, engines, and clean failures."""

import json
import os
from pathlib import Path

import pytest

from cluster.cli import main
from graphs.io import save_graph
from graphs.synthetic import synthetic_graph
from measurers.catalog import CATALOG_DIR, load_machine
from conftest import one_placer_error, policy_placement
from measurers.placement import save_placement_file


def simulate_json(capsys, *args):
    assert main(["simulate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate__json_report_keys_and_lower_bound(capsys):
    report = simulate_json(capsys, "--graph", "synthetic:2000:1", "--machine", "paper-4gpu", "--policy", "round-robin")
    assert {"runtime_s", "status", "lower_bound_s", "simulate_s", "devices"} <= set(report)
    assert report["status"] == "ok" and report["runtime_s"] >= report["lower_bound_s"] > 0
    assert [d["name"] for d in report["devices"]] == ["cpu:0", "gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert all(set(d) == {"name", "busy_s", "peak_bytes", "capacity_bytes"} for d in report["devices"])
    assert report["devices"][0]["busy_s"] == 0 and report["devices"][1]["busy_s"] > 0


def test_simulate__engines_agree_and_placement_file_matches_policy(tmp_path, capsys):
    graph = synthetic_graph(1500, 2)
    graph_file = save_graph(graph, tmp_path / "g.parquet")
    machine = load_machine("dgx1-v100")
    placement = save_placement_file(tmp_path / "p.json", graph, machine, policy_placement(graph, machine, "round-robin"))
    common = ["--graph", str(graph_file), "--machine", "dgx1-v100"]
    by_policy = simulate_json(capsys, *common, "--policy", "round-robin")
    by_file = simulate_json(capsys, *common, "--placement", str(placement), "--engine", "reference")
    assert by_file["runtime_s"] == by_policy["runtime_s"] and by_file["devices"] == by_policy["devices"]


def test_simulate__trace_file_is_chrome_trace_format(tmp_path, capsys):
    trace = tmp_path / "new folder" / "t.json"  # missing folders are made, as for every output file
    assert main(["simulate", "--graph", "synthetic:300", "--machine", "paper-2gpu", "--policy", "round-robin",
                 "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "lower bound" in out and f"trace: {trace} " in out  # where it went: it was written without a word
    events = json.loads(trace.read_text())["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] != "transfer"]
    transfers = [e for e in events if e["ph"] == "X" and e["cat"] == "transfer"]
    assert len(ops) == 300 and transfers and all(e["dur"] >= 0 for e in ops + transfers)
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} >= {"gpu:0 (K80)", "channel host:staging"}


def test_simulate__profile_changes_the_step_time(tmp_path, capsys):
    graph = synthetic_graph(50, 0)
    profile = tmp_path / "prof.json"
    entries = [{"op": name, "device_model": "K80", "time_s": 0.5} for name in graph.op_names]
    profile.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "entries": entries}))
    args = ["--graph", "synthetic:50", "--machine", "paper-2gpu", "--policy", "single-gpu"]
    measured = simulate_json(capsys, *args, "--profile", str(profile))
    assert measured["runtime_s"] == pytest.approx(50 * 0.5)
    assert simulate_json(capsys, *args)["runtime_s"] < 1
    other = tmp_path / "other.json"  # the same op names, measured on another graph: refused
    other.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "graph_hash": "0" * 16,
                                 "entries": entries}))
    assert main(["simulate", *args, "--profile", str(other)]) == 2
    err = capsys.readouterr().err
    assert "was measured on a graph with hash 0000000000000000" in err and err.count("\n") == 1
    elsewhere = tmp_path / "elsewhere.json"  # measured on this machine's CPU model only: K80s keep their times
    elsewhere.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "entries": [
        {**entry, "device_model": "Ryzen 5"} for entry in entries]}))
    assert main(["simulate", *args, "--profile", str(elsewhere), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["runtime_s"] < 1
    assert (f"placer: note: --profile {elsewhere} has times for Ryzen 5, none of the device models of machine "
            "'paper-2gpu' (K80, Xeon-E5-2699v3): it changes nothing"
            in captured.err)
    misnamed = tmp_path / "misnamed.json"  # K80 times of ops the graph lacks (a hand-written file's names): said too
    misnamed.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "entries": [
        {**entry, "op": f"x/{entry['op']}"} for entry in entries]}))
    assert main(["simulate", *args, "--profile", str(misnamed), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["runtime_s"] < 1
    assert (f"placer: note: --profile {misnamed} has times for 50 ops, none of them an op of graph 'synthetic:50:0': "
            "it changes nothing\n" == captured.err)
    crossed = tmp_path / "crossed.json"  # this graph's ops timed on a CPU model, another graph's on K80s: no pair
    crossed.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "entries": [
        {"op": graph.op_names[0], "device_model": "Ryzen 5", "time_s": 0.5},
        {"op": "elsewhere/op", "device_model": "K80", "time_s": 0.5}]}))
    assert main(["simulate", *args, "--profile", str(crossed), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["runtime_s"] < 1
    assert (f"placer: note: --profile {crossed} has no time of an op of graph 'synthetic:50:0' on a device model of "
            "machine 'paper-2gpu' (this graph's ops were timed on other models): it changes nothing\n"
            == captured.err)


def test_simulate__a_heuristic_plans_with_the_profile_it_is_scored_with(tmp_path, capsys):
    """HEFT planned with the cost model's times (K80s fast) and was scored with --profile's (every op 0.5 s on
    a K80): it kept its ops on the GPUs."""
    graph = synthetic_graph(50, 0)
    profile = tmp_path / "prof.json"
    entries = [{"op": name, "device_model": "K80", "time_s": 0.5} for name in graph.op_names]
    profile.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "entries": entries}))
    measured = simulate_json(capsys, "--graph", "synthetic:50", "--machine", "paper-2gpu", "--policy", "heft",
                             "--profile", str(profile))
    assert measured["runtime_s"] < 1  # the CPU's, not 0.5 s an op on the K80s


@pytest.mark.parametrize("bad", ["length", "device", "machine", "graph"])
def test_simulate__bad_input_exits_2_with_one_line_and_writes_no_trace(tmp_path, capsys, bad):
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps({"length": ["gpu:0"] * 3, "device": ["tpu:9"] * 100}.get(bad, ["gpu:0"] * 100)))
    graph = "synthetic:1:1:1" if bad == "graph" else "synthetic:100"
    machine = "nowhere-9gpu" if bad == "machine" else "paper-2gpu"
    trace = tmp_path / "t.json"
    code = main(["simulate", "--graph", graph, "--machine", machine, "--placement", str(placement),
                 "--trace", str(trace)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("placer: error: ") and captured.err.count("\n") == 1
    assert list(tmp_path.iterdir()) == [placement]


def test_simulate__a_run_folder_is_a_placement_its_best(tmp_path, capsys, monkeypatch):
    """--placement RUN_DIR (or its best_placement.json): the run's best, groups expanded by its own grouping;
    the same step the search logged. A run of another machine is refused."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    common = ["--graph", "synthetic:100", "--machine", "paper-2gpu"]
    assert main(["search", *common, "--policy", "cem", "--budget", "8", "--groups", "8", "--workers", "1",
                 "--out", str(tmp_path / "runs"), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    for path in (found["run_dir"], f"{found['run_dir']}/best_placement.json"):
        report = simulate_json(capsys, *common, "--placement", path)
        assert report["runtime_s"] == pytest.approx(found["overall_best_runtime_s"])
    for graph, machine, message in (("synthetic:100", "paper-4gpu", "placed it on machine 'paper-2gpu', not on "
                                                                     "'paper-4gpu'"),
                                    ("synthetic:100:2", "paper-2gpu", "placed a graph with hash")):
        code = main(["simulate", "--graph", graph, "--machine", machine, "--placement", found["run_dir"]])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1


def test_simulate__a_file_named_best_placement_json_is_a_run_best_only_inside_a_run_folder(tmp_path, capsys):
    """A user's own placement file named best_placement.json was refused ("... is not a run folder (no
    manifest.json)"), and so was a link to a run's best_placement.json from another folder."""
    common = ["--graph", "synthetic:30:1", "--machine", "paper-2gpu"]
    assert main(["baselines", *common, "--policies", "m-etf", "--bound-time-limit", "0", "--out",
                 str(tmp_path / "runs"), "--json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    run_best_s = simulate_json(capsys, *common, "--placement", str(run_dir))["runtime_s"]
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "best_placement.json").symlink_to(run_dir / "best_placement.json")
    assert simulate_json(capsys, *common, "--placement", str(tmp_path / "linked" / "best_placement.json"))[
        "runtime_s"] == run_best_s
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "best_placement.json").write_text(json.dumps({"ops": ["gpu:0"] * 30}))
    (tmp_path / "mine" / "other.json").write_text(json.dumps({"ops": ["gpu:0"] * 30}))
    reports = [simulate_json(capsys, *common, "--placement", str(tmp_path / "mine" / name))
               for name in ("best_placement.json", "other.json")]
    assert reports[0]["runtime_s"] == reports[1]["runtime_s"] and reports[0]["devices"] == reports[1]["devices"]
    # nor is its folder a run folder the trace may not be written in ("lies inside the run folder of --placement")
    simulate_json(capsys, *common, "--placement", str(tmp_path / "mine" / "best_placement.json"), "--trace",
                  str(tmp_path / "mine" / "trace.json"))
    assert (tmp_path / "mine" / "trace.json").is_file()


def test_simulate__a_trace_inside_the_placement_run_folder_is_refused_and_the_run_kept(tmp_path, capsys):
    """--placement RUN --trace RUN/manifest.json wrote the trace over the run's manifest (exit 0; the run was
    unreadable after): any file inside the run folder read is refused before simulating."""
    common = ["--graph", "synthetic:30:1", "--machine", "paper-2gpu"]
    assert main(["baselines", *common, "--policies", "m-etf", "--bound-time-limit", "0", "--out",
                 str(tmp_path / "runs"), "--json"]) == 0
    run_dir = tmp_path / "runs" / os.path.basename(json.loads(capsys.readouterr().out)["run_dir"])
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    for placement in (run_dir, run_dir / "best_placement.json"):
        for trace in (run_dir / "manifest.json", run_dir / "traces" / "t.json"):
            assert main(["simulate", *common, "--placement", str(placement), "--trace", str(trace)]) == 2
            assert f"--trace {trace} lies inside the run folder of --placement {placement}" in one_placer_error(capsys)
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before
    assert simulate_json(capsys, *common, "--placement", str(run_dir), "--trace", str(tmp_path / "t.json"))["runtime_s"]


def test_simulate__a_run_on_another_machine_of_the_same_name_says_what_differs(tmp_path, capsys):
    """A run searched with an edited machine file that keeps its machine's name, and simulate or measure given
    that machine, said "placed it on machine 'local', not on 'local'", naming no difference."""
    machine = json.loads((CATALOG_DIR / "paper-2gpu.json").read_text())
    machine["links"][0]["bandwidth_Bps"] /= 2
    (tmp_path / "m.json").write_text(json.dumps(machine))
    assert main(["baselines", "--graph", "synthetic:30:1", "--machine", str(tmp_path / "m.json"), "--policies",
                 "m-etf", "--bound-time-limit", "0", "--out", str(tmp_path / "runs"), "--json"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    assert main(["simulate", "--graph", "synthetic:30:1", "--machine", "paper-2gpu", "--placement", run_dir]) == 2
    assert one_placer_error(capsys).endswith("placed it on machine 'paper-2gpu', not on 'paper-2gpu' as it is given "
                                             "(both are named 'paper-2gpu' but differ in links: give --machine the "
                                             "machine file the run searched with)\n")


def test_simulate__a_machine_files_profile_of_another_graph_is_refused(tmp_path, capsys):
    """A profile named in the machine file is the one search, baselines, bound and train read: it was
    applied to any graph whose op names matched."""
    graph = synthetic_graph(20, 1)
    entries = [{"op": name, "device_model": "K80", "time_s": 1.0} for name in graph.op_names]
    (tmp_path / "prof.json").write_text(json.dumps({"format": "placer-op-profile", "version": 1,
                                                    "graph_hash": graph.content_hash, "entries": entries}))
    machine = json.loads((CATALOG_DIR / "paper-2gpu.json").read_text())
    (tmp_path / "m.json").write_text(json.dumps({**machine, "name": "profiled", "profile": "prof.json"}))
    args = ["simulate", "--machine", str(tmp_path / "m.json"), "--policy", "single-gpu", "--json"]
    assert main([*args, "--graph", "synthetic:20:1"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime_s"] == pytest.approx(20.0)
    assert main([*args, "--graph", "synthetic:20:0"]) == 2  # the same op names, another graph
    err = capsys.readouterr().err
    assert (f"machine file {str(tmp_path / 'm.json')!r}: profile file {str(tmp_path / 'prof.json')!r} was measured "
            "on a graph with hash") in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", [["simulate", "--policy", "single-gpu"], ["bound", "--time-limit", "0"]])
@pytest.mark.parametrize("text, problem", [('{"format": "placer-op-profile", "ver', " is damaged or not a profile: "),
                                           ('{"hello": 1}', ": not a placer-op-profile version 1 file")],
                         ids=["truncated", "not-a-profile"])
def test_simulate__a_machine_files_damaged_profile_is_named_with_the_machine_file(tmp_path, capsys, command, text,
                                                                                  problem):
    """A missing profile was named with the machine file that names it, a damaged one by its own path alone
    (the user typed the machine file's)."""
    (tmp_path / "prof.json").write_text(text)
    machine = json.loads((CATALOG_DIR / "paper-2gpu.json").read_text())
    (tmp_path / "m.json").write_text(json.dumps({**machine, "name": "profiled", "profile": "prof.json"}))
    assert main([*command, "--graph", "synthetic:20:1", "--machine", str(tmp_path / "m.json")]) == 2
    assert one_placer_error(capsys).startswith(f"placer: error: machine file {str(tmp_path / 'm.json')!r}: profile "
                                               f"file {str(tmp_path / 'prof.json')!r}{problem}")


def test_cli__a_node_without_ray_rllib_or_tensorflow_simulates_and_lists_machines():
    """A GPU node's own Python (torch, no Ray, RLlib's gymnasium or TensorFlow) ran no `placer` command at all:
    every command's registration imported the learners' settings, which imported gymnasium."""
    import subprocess
    import sys
    from pathlib import Path

    blocked = "import sys; sys.modules.update(dict.fromkeys(['ray', 'gymnasium', 'tensorflow']))"
    run = (f"{blocked}; from cluster.cli import main; "
           "sys.exit(main(['machines', 'list']) or main(['simulate', '--graph', 'synthetic:20:1', '--machine', "
           "'paper-2gpu', '--policy', 'single-gpu']))")
    done = subprocess.run([sys.executable, "-c", run], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "paper-2gpu" in done.stdout and "step" in done.stdout


def test_cli__a_command_that_needs_a_missing_package_names_it_in_one_line(tmp_path):
    """`placer search` on a Python without Ray was a traceback ending in ModuleNotFoundError."""
    import subprocess
    import sys
    from pathlib import Path

    run = ("import sys; sys.modules['ray'] = None; from cluster.cli import main; "
           "sys.exit(main(['search', '--graph', 'synthetic:20:1', '--policy', 'cem', '--budget', '8']))")
    done = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == ("placer: error: search needs the Python package ray, which this Python lacks "
                           "(pip install 'ray[rllib]==2.60.0')\n")
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("policy, where", [
    ("reinforce", "it needs a budget (placer search --policy reinforce)"),
    ("annealing", "it needs a budget (placer search --policy annealing, or placer baselines --policies annealing)"),
])
def test_simulate__a_policy_that_needs_a_budget_names_the_command_that_runs_it(capsys, policy, where):
    """A learner was sent to `placer baselines` too, which refuses learners."""
    assert main(["simulate", "--graph", "synthetic:40", "--machine", "paper-2gpu", "--policy", policy]) == 2
    assert one_placer_error(capsys).endswith(where + "\n")


def test_simulate__a_policy_places_with_the_seed_baselines_was_given(capsys):
    """`baselines --seed 3` placed metis with seed 3; `simulate --policy metis` always with 0 and refused --seed,
    so the README's "as `placer baselines` makes it" held for the default seed alone."""
    flags = ["--graph", "synthetic:300", "--machine", "h200x8"]
    assert main(["baselines", *flags, "--policies", "metis", "--seed", "3", "--bound-time-limit", "0", "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out)["results"] if r["policy"] == "metis"]
    runtimes = {}
    for seed in ("0", "3"):
        assert main(["simulate", *flags, "--policy", "metis", "--seed", seed, "--json"]) == 0
        runtimes[seed] = json.loads(capsys.readouterr().out)["runtime_s"]
    assert runtimes["3"] == row["runtime_s"] != runtimes["0"]
    assert main(["simulate", *flags, "--policy", "metis", "--seed", "-1"]) == 2
    assert "--seed" in one_placer_error(capsys)

