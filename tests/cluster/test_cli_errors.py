"""Bad input across the commands: argparse's own errors, output paths that cannot be written, damaged run
and experiment folders, a cluster address nobody answers. Each is one ``placer: error:`` line on stderr,
exit status 2, nothing on stdout and nothing written, before any work starts."""

from __future__ import annotations

import json
import os
import sys
import shutil
import socket
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.experiments import settings_for
from graphs.registry import load_graph
from conftest import one_placer_error

GRAPH = ["--graph", "synthetic:60", "--machine", "paper-2gpu"]


def _exit_status(argv: list[str]) -> int:
    """main's return value, or the status of the SystemExit argparse raises."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.mark.parametrize("argv, message", [
    (["simulate", *GRAPH, "--engine", "nosuch"], "placer: error: simulate: argument --engine: invalid choice"),
    (["graphs", "export"], "placer: error: graphs export: the following arguments are required"),
    (["machines", "list", "--json"], "placer: error: machines list: unrecognized arguments: --json"),
    (["reproduce", "mirhoseini2017", "--bogus"], "placer: error: reproduce: unrecognized arguments: --bogus"),
    (["search", *GRAPH, "--budget", "many"], "placer: error: search: argument --budget: invalid int value"),
])
def test_argparse_errors__one_line_naming_the_command(capsys, argv, message):
    assert _exit_status(argv) == 2
    assert one_placer_error(capsys).startswith(message)


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "F"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("argv_of, message_of", [
    (lambda d, f: ["graphs", "export", "synthetic:60", "-o", str(d)], lambda d, f: f"{d} is a folder, not a file"),
    (lambda d, f: ["graphs", "export", "synthetic:60", "-o", str(f / "g.parquet")],
     lambda d, f: f"{f} is a file, so {f / 'g.parquet'} cannot be written"),
    (lambda d, f: ["simulate", *GRAPH, "--policy", "single-gpu", "--trace", str(d)],
     lambda d, f: "argument --trace: "),
    (lambda d, f: ["train", "--policy", "gdp", "--graphs", "synthetic:60", "--machines", "paper-2gpu", "--budget",
                   "8", "-o", str(d)], lambda d, f: "train: argument -o/--out: "),
    (lambda d, f: ["search", *GRAPH, "--out", str(f)], lambda d, f: f"{f} is a file, not a folder"),
    (lambda d, f: ["baselines", *GRAPH, "--out", str(f / "runs")], lambda d, f: f"{f} is a file"),
    (lambda d, f: ["reproduce", "mirhoseini2017", "--quick", "--out", str(f)], lambda d, f: "argument --out: "),
    (lambda d, f: ["analyze", str(d), "--plots", str(f / "plots")], lambda d, f: "argument --plots: "),
    (lambda d, f: ["profile", *GRAPH, "--measurer", "torch", "-o", str(d)], lambda d, f: "argument -o/--output: "),
    # a name longer than the file system allows: pathlib's OSError was a traceback
    (lambda d, f: ["simulate", *GRAPH, "--policy", "single-gpu", "--trace", str(d / ("a" * 300 + ".json"))],
     lambda d, f: "argument --trace: " + str(d / ("a" * 300 + ".json")) + ": File name too long"),
    (lambda d, f: ["search", *GRAPH, "--out", str(d / ("a" * 300))], lambda d, f: "File name too long"),
])
def test_output_paths__refused_when_parsed(tmp_path, a_file, capsys, argv_of, message_of):
    folder = tmp_path / "folder"
    folder.mkdir()
    assert _exit_status(argv_of(folder, a_file)) == 2
    assert message_of(folder, a_file) in one_placer_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["F", "folder"] and list(folder.iterdir()) == []


@pytest.mark.parametrize("command", [["search", *GRAPH], ["baselines", *GRAPH], ["reproduce", "mirhoseini2017",
                                                                                   "--quick"]])
@pytest.mark.parametrize("inside", ["", "sub"])
def test_output_paths__a_run_folder_or_one_inside_it_is_refused_as_out(tmp_path, capsys, command, inside):
    """A search made its run inside another run's folder, where analyze (which reads a run folder's own log
    and looks no deeper) never found it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    out = run / inside if inside else run
    assert _exit_status([*command, "--out", str(out)]) == 2
    assert f"lies inside {run}, a run folder" in one_placer_error(capsys) if inside else \
        f"{run} is a run folder: run folders are made beside each other" in one_placer_error(capsys)
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json"]


def test_output_paths__the_run_manifest_name_is_the_run_logs():
    from cluster.commands.paths import RUN_MANIFEST
    from cluster.runlog import MANIFEST_FILE

    assert RUN_MANIFEST == MANIFEST_FILE


@pytest.mark.parametrize("argv_of", [
    lambda d: ["graphs", "export", "synthetic:60", "-o", str(d / "g.parquet")],
    lambda d: ["simulate", *GRAPH, "--policy", "single-gpu", "--trace", str(d / "sub" / "t.json")],
    lambda d: ["search", *GRAPH, "--out", str(d)],
])
def test_output_paths__a_folder_that_cannot_be_written_is_refused_when_parsed(tmp_path, capsys, argv_of):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes into read-only folders (root)")
        assert _exit_status(argv_of(locked)) == 2
        assert f"{locked} is not writable" in one_placer_error(capsys)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc here")
def test_output_paths__a_folder_that_refuses_new_files_whatever_its_permissions_is_refused_when_parsed(capsys):
    assert _exit_status(["graphs", "export", "synthetic:60", "-o", "/proc/g.parquet"]) == 2
    assert "/proc is not writable, so /proc/g.parquet cannot be written" in one_placer_error(capsys)


def test_unwritable_path__any_os_error_naming_a_path_found_late_is_one_error(capsys, monkeypatch):
    import errno

    import graphs.io

    def no_space(graph, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(graphs.io, "save_graph", no_space)
    assert main(["graphs", "export", "synthetic:60", "-o", "g.parquet"]) == 2
    assert one_placer_error(capsys) == "placer: error: g.parquet: No space left on device\n"


def test_unwritable_path__found_late_is_still_one_error(tmp_path, capsys, monkeypatch):
    """A path that passes the parse-time check and still cannot be written (here: a folder appears there
    before the write) is one error naming it, not a traceback."""
    import graphs.io

    target = tmp_path / "g.parquet"

    def save_into_a_folder(graph, path):
        target.mkdir()
        open(path, "wb").close()  # IsADirectoryError, as the real write would raise

    monkeypatch.setattr(graphs.io, "save_graph", save_into_a_folder)
    assert main(["graphs", "export", "synthetic:60", "-o", str(target)]) == 2
    assert one_placer_error(capsys) == f"placer: error: {target}: Is a directory\n"


def test_damaged_run_log__analyze_and_resume_refuse_it(tmp_path, capsys):
    from test_analysis import write_run

    from cluster.jobs import GROUPING_FILE
    from cluster.runlog import MEASUREMENTS_DIR

    run = write_run(tmp_path, graph=load_graph("synthetic:60"))  # a graph a resume can load by name
    (run / GROUPING_FILE).write_bytes(b"")
    part = sorted((run / MEASUREMENTS_DIR).glob("*.parquet"))[0]
    part.write_bytes(b"garbage, not parquet")
    for command in (["analyze", str(run), "--json"], ["search", "--resume", str(run), "--json"]):
        assert main(command) == 2
        assert f"{part} is damaged" in one_placer_error(capsys)  # the part named, for both
    shutil.rmtree(run / MEASUREMENTS_DIR)  # the log gone: not a run that measured nothing
    for command in (["analyze", str(run), "--json"], ["search", "--resume", str(run), "--json"]):
        assert main(command) == 2
        assert f"{run}: its measurement log (measurements/) is missing" in one_placer_error(capsys)


def test_damaged_grouping__resume_names_the_file(tmp_path, capsys):
    from test_analysis import write_run

    from cluster.jobs import GROUPING_FILE

    run = write_run(tmp_path, graph=load_graph("synthetic:60"))  # a graph a resume can load by name
    (run / GROUPING_FILE).write_bytes(b"PK not a zip")
    assert main(["search", "--resume", str(run), "--json"]) == 2
    assert f"{run / GROUPING_FILE} is damaged" in one_placer_error(capsys)


def test_reproduce__damaged_settings_and_a_lower_budget_are_refused_before_the_banner(tmp_path, capsys):
    folder = tmp_path / "mirhoseini2017"
    folder.mkdir()
    settings = folder / "experiment.json"
    settings.write_text("{not json")
    args = ["reproduce", "mirhoseini2017", "--quick", "--rows", "rnnlm:paper-2gpu", "--out", str(tmp_path)]
    assert main([*args, "--json"]) == 2
    assert f"{settings} is damaged" in one_placer_error(capsys)
    quick = asdict(settings_for(quick=True))
    settings.write_text(json.dumps({"settings": {**quick, "budget": 64}}))
    assert main([*args, "--budget", "32"]) == 2
    assert "run with --budget 64: pick another --out, or a budget of at least 64 (not 32)" in one_placer_error(capsys)
    assert json.loads(settings.read_text())["settings"]["budget"] == 64
    shutil.rmtree(folder)
    folder.write_text("a file where the experiment folder goes")  # said at once, not after Ray started
    assert main(args) == 2
    assert f"{folder} is a file, not an experiment folder: pick another --out" in one_placer_error(capsys)


def test_unreachable_cluster__one_error_within_the_timeout():
    from cluster.ray_setup import check_reachable
    from graphs.errors import PlacerError

    with socket.socket() as probe:  # a port nothing listens on once this socket closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.perf_counter()
    with pytest.raises(PlacerError, match=f"cannot reach the Ray cluster at '127.0.0.1:{port}'"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=5.0)
    assert time.perf_counter() - started < 5.0
    check_reachable("auto")  # Ray's to resolve: no check


@pytest.mark.parametrize("address", ["localhost", "head:port", ":6379", "ray://head", "head:²"])
def test_cluster_address_without_a_port__one_error_and_a_reproduce_writes_nothing(tmp_path, capsys, address):
    """Ray's own "Invalid address format" came out as a traceback, after reproduce wrote its folder."""
    assert main(["reproduce", "mirhoseini2017", "--quick", "--rows", "rnnlm:paper-2gpu", "--ray-address", address,
                 "--out", str(tmp_path / "out")]) == 2
    assert f"Ray address {address!r} is not HOST:PORT" in one_placer_error(capsys)
    assert not (tmp_path / "out").exists()


def test_cluster_address_of_a_web_server__one_error_not_minutes_of_retries(tmp_path):
    """The dashboard's port (8265) given without http://: Ray retried its handshake for minutes."""
    import http.server
    import threading

    from cluster.ray_setup import check_reachable
    from graphs.errors import PlacerError

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(PlacerError, match="answers HTTP, as a dashboard does, not Ray's control store"):
            check_reachable(f"127.0.0.1:{server.server_address[1]}", timeout_s=5.0)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("server", ["silent", "another gRPC service", "a banner", "closes at once"])
def test_cluster_address_that_is_no_control_store__one_error_not_a_hang(server):
    """A port that takes the connection and never answers (or a raylet's port: gRPC, no control store) passed
    the checks, and ray.init then waited for minutes, deaf to Ctrl-C and SIGTERM; one that speaks no gRPC (an
    SSH server's banner, a close at once: UNAVAILABLE) for about 12 minutes."""
    import threading
    from concurrent import futures

    import grpc

    from cluster.ray_setup import check_reachable
    from graphs.errors import PlacerError

    if server in ("silent", "a banner", "closes at once"):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        accepted = []

        def serve():
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:  # closed: the test is over
                    return
                accepted.append(connection)
                if server == "a banner":
                    connection.sendall(b"SSH-2.0-OpenSSH_8.9\r\n")
                elif server == "closes at once":
                    connection.close()

        threading.Thread(target=serve, daemon=True).start()
        port, stop = listener.getsockname()[1], listener.close
    else:
        rpc = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # no service: every call UNIMPLEMENTED
        port = rpc.add_insecure_port("127.0.0.1:0")
        rpc.start()
        stop = lambda: rpc.stop(None)  # noqa: E731
    started = time.perf_counter()
    try:
        with pytest.raises(PlacerError, match=f"^'127.0.0.1:{port}' accepts connections but does not answer as a "
                                              "Ray control store"):
            check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    finally:
        stop()
    assert time.perf_counter() - started < 8.0  # the TCP check, the HTTP probe and the call: 2 s each at most


def test_baselines__a_negative_seed_is_refused_before_the_run_folder(tmp_path, capsys):
    assert main(["baselines", *GRAPH, "--seed", "-1", "--policies", "single-gpu", "--bound-time-limit", "0",
                 "--out", str(tmp_path / "runs")]) == 2
    assert "--seed must be a whole number in 0..4294967295, got -1" in one_placer_error(capsys)
    assert not (tmp_path / "runs").exists()


def test_unreachable_cluster__an_address_with_auth_in_its_name_is_not_called_an_auth_failure():
    from cluster.ray_setup import init_ray
    from graphs.errors import PlacerError

    with pytest.raises(PlacerError, match="^cannot reach the Ray cluster at 'auth-head.invalid:6379'"):
        init_ray("auth-head.invalid:6379")


def test_reproduce__a_folder_where_its_settings_file_belongs_is_refused_before_the_banner(tmp_path, capsys):
    (tmp_path / "mirhoseini2017" / "experiment.json").mkdir(parents=True)
    args = ["reproduce", "mirhoseini2017", "--quick", "--rows", "rnnlm:paper-2gpu", "--out", str(tmp_path)]
    assert main(args) == 2
    assert f"{tmp_path / 'mirhoseini2017' / 'experiment.json'} is not a file" in one_placer_error(capsys)


def test_reproduce__a_negative_seed_is_refused_before_the_banner_and_writes_nothing(tmp_path, capsys):
    args = ["reproduce", "mirhoseini2017", "--quick", "--seed", "-1", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert "--seed must be a whole number in 0..4294967295, got -1" in one_placer_error(capsys)
    assert not (tmp_path / "out").exists()


def test_unwritable_path__a_rename_names_its_target_not_the_temp_file(tmp_path, capsys, monkeypatch):
    import graphs.io
    from cluster.runlog import write_text_atomic

    target = tmp_path / "g.json"
    target.mkdir()
    monkeypatch.setattr(graphs.io, "save_graph", lambda graph, path: write_text_atomic(target, "{}"))
    assert main(["graphs", "export", "synthetic:60", "-o", str(tmp_path / "g.parquet")]) == 2
    err = one_placer_error(capsys)
    assert err.startswith(f"placer: error: {target}: ") and ".tmp" not in err, err


def test_resume__a_flag_given_with_the_default_the_run_used_is_no_change_and_another_is_refused(tmp_path):
    """No --init, --order or --passes in the manifest: gdp took the committed checkpoint, hsdag scratch, placeto
    2 passes and the order its committed checkpoint was trained in. ``--init scratch`` on the hsdag run and
    ``--passes 2`` / ``--order`` of the checkpoint on the placeto run were refused as changes (a review)."""
    from test_analysis import write_run

    from cluster.jobs.resume import resume_config
    from graphs.errors import PlacerError
    from policies.registry import make_policy

    runs = {}
    for policy in ("gdp", "hsdag", "placeto"):
        runs[policy] = write_run(tmp_path / policy, policy=policy, graph=load_graph("synthetic:60"))
        manifest = json.loads((runs[policy] / "manifest.json").read_text())
        manifest["config"]["policy"] = policy
        (runs[policy] / "manifest.json").write_text(json.dumps(manifest))
        (runs[policy] / "grouping.npz").write_bytes(b"")  # a search run's (resume_config refuses others)
    trained_order = make_policy("placeto").config(0).order
    other_order = next(order for order in ("topo", "bfs") if order != trained_order)
    assert resume_config(runs["gdp"], {"init": "pretrained"}).init == "pretrained"
    assert resume_config(runs["hsdag"], {"init": "scratch"}).init == "scratch"
    assert resume_config(runs["placeto"], {"passes": 2, "order": trained_order}).passes == 2
    for policy, flags, message in (
            ("gdp", {"init": "scratch"}, "--init 'scratch': run .* searches without --init, and"),
            ("hsdag", {"init": "pretrained"}, r"--init 'pretrained': run .* searches without --init \(so with "
                                              r"'scratch'\), and"),
            ("placeto", {"passes": 3}, r"--passes 3: run .* searches without --passes \(so with 2\), and"),
            ("placeto", {"order": other_order}, rf"--order '{other_order}': run .* searches without --order "
                                                rf"\(so with '{trained_order}'\), and")):
        with pytest.raises(PlacerError, match=message):
            resume_config(runs[policy], flags)


def test_resume__the_grouping_method_that_made_the_runs_groups_is_no_change(tmp_path):
    """The run asked for scope groups and got metis ones (a graph with no scopes): every output names "metis",
    and `--resume RUN --grouping metis` was refused as "searches with 'scope'"."""
    import numpy as np
    from test_analysis import write_run

    from cluster.jobs.resume import resume_config
    from graphs.errors import PlacerError

    run = write_run(tmp_path / "runs", graph=load_graph("synthetic:60"))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["grouping"] = "scope"
    (run / "manifest.json").write_text(json.dumps(manifest))
    np.savez(run / "grouping.npz", op_group=np.zeros(60, dtype=np.int64), group_allowed_mask=np.array([3]),
             method=np.array("metis"))
    assert resume_config(run, {"grouping": "metis"}).grouping == "scope"  # the run's own, as asked for
    assert resume_config(run, {"grouping": "scope"}).grouping == "scope"
    with pytest.raises(PlacerError, match="--grouping 'topo': run .* searches with 'scope'"):
        resume_config(run, {"grouping": "topo"})


@pytest.mark.parametrize("command", ["search", "baselines"])
def test_search__a_real_measurer_with_no_node_for_the_machines_gpus_is_refused_before_the_run(tmp_path, capsys,
                                                                                                  monkeypatch, command):
    """--measurer torch on a machine with GPUs, and a Ray with no GPU node (this one): CPU actors would fail
    every placement, so it is one error and no run folder (baselines measured them all as errors, exit 0)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    graph_file = tmp_path / "mlp.parquet"
    assert main(["graphs", "import", "--torch", "tests/fixtures/tiny_models.py:tiny_torch_mlp",
                 "-o", str(graph_file)]) == 0
    capsys.readouterr()
    out = tmp_path / "runs"
    policy = ["--policy", "random"] if command == "search" else ["--policies", "single-gpu", "--bound-time-limit", "0"]
    assert main([command, "--graph", str(graph_file), "--machine", "paper-2gpu", "--measurer", "torch",
                 *policy, "--budget", "4", "--out", str(out)]) == 2
    # The check needs the cluster, started first; Ray's start line came before the error.
    assert one_placer_error(capsys).startswith("placer: error: --measurer torch runs machine 'paper-2gpu''s 2 GPUs "
                                               "on one node, but the Ray cluster has no node with 2 GPUs")
    assert not out.exists()


@pytest.mark.parametrize("command", ["search", "baselines"])
def test_search__a_graph_op_no_device_of_the_machine_may_run_is_refused_before_the_progress_bar(tmp_path, capsys,
                                                                                               command):
    """An op allowed only on the CPU and a machine of GPUs: search found it inside the policy, after Ray
    had started and the progress bar was drawn, its run folder made and removed again."""
    from conftest import build_graph
    from graphs.io import save_graph
    from measurers.catalog import load_machine
    from measurers.machine_json import save_machine

    graph = build_graph([(0, 1, 10**6), (1, 2, 10**6)], out_bytes=[10**6] * 3, allowed_mask=[1, 3, 3])
    save_graph(graph, tmp_path / "cpu_only.parquet")
    save_machine(load_machine("paper-2gpu").without_devices(["cpu:0"]), tmp_path / "gpus.json")
    out = tmp_path / "runs"
    assert main([command, "--graph", str(tmp_path / "cpu_only.parquet"), "--machine", str(tmp_path / "gpus.json"),
                 "--budget", "4", "--out", str(out), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err == (f"placer: error: group 0 of graph {graph.name!r} has no device on machine "
                            "'paper-2gpu-without-cpu:0' that all its ops may run on\n")


@pytest.mark.parametrize("out", [False, True])
def test_baselines__a_gpu_only_op_and_a_machine_without_gpus_is_refused(tmp_path, capsys, out):
    """baselines skipped every row (exit 0, every figure null); with --out it failed on its own manifest
    ("lower_bound_s inf is not a number of seconds"), naming a staging folder. search refused it."""
    from conftest import build_graph
    from graphs.io import save_graph
    from measurers.catalog import load_machine
    from measurers.machine_json import save_machine

    graph = build_graph([(0, 1, 10**6), (1, 2, 10**6)], out_bytes=[10**6] * 3, allowed_mask=[2, 3, 3])
    save_graph(graph, tmp_path / "gpu_only.parquet")
    save_machine(load_machine("paper-2gpu").without_devices(["gpu:0", "gpu:1"]), tmp_path / "cpu.json")
    runs = ["--out", str(tmp_path / "runs")] if out else []
    assert main(["baselines", "--graph", str(tmp_path / "gpu_only.parquet"), "--machine", str(tmp_path / "cpu.json"),
                 "--policies", "heft", "--bound-time-limit", "0", *runs, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not (tmp_path / "runs").exists()
    assert captured.err == (f"placer: error: group 0 of graph {graph.name!r} has no device on machine "
                            "'paper-2gpu-without-gpu:0-gpu:1' that all its ops may run on\n")


def test_reproduce__a_real_measurer_with_no_node_for_the_machines_gpus_writes_no_experiment_folder(tmp_path, capsys,
                                                                                                     monkeypatch):
    """reproduce --measurer torch and a Ray with no GPU node (this one): the first row's search refused it
    after experiment.json and the row's folder were written, and that folder then refused a run with
    another measurer ("pick another --out")."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    out = tmp_path / "out"
    assert main(["reproduce", "mirhoseini2017", "--quick", "--measurer", "torch", "--rows", "rnnlm:paper-2gpu",
                 "--out", str(out), "--json"]) == 2
    assert one_placer_error(capsys).startswith("placer: error: --measurer torch runs machine 'paper-2gpu''s 2 GPUs "
                                               "on one node, but the Ray cluster has no node with 2 GPUs")
    assert not out.exists()


def test_resume_config__the_session_settings_are_this_sessions_not_the_stopped_ones(tmp_path):
    """A run started with --ray-address, resumed without it (the command a stop prints, or a `ray job submit`
    job with RAY_ADDRESS set), joined the stopped session's cluster: "cannot reach the Ray cluster at ..."
    once that cluster was gone."""
    from test_analysis import write_run

    from cluster.jobs.config import SearchConfig
    from cluster.jobs.resume import resume_config

    run = write_run(tmp_path / "runs")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"].update(ray_address="192.0.2.1:6379", workers=7)
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "grouping.npz").write_bytes(b"")  # a search run's
    resumed = resume_config(run, {})
    assert (resumed.ray_address, resumed.workers) == (None, SearchConfig.workers)
    given = resume_config(run, {"ray_address": "192.0.2.2:6379", "workers": 3})
    assert (given.ray_address, given.workers) == ("192.0.2.2:6379", 3)


def test_search_resume__a_baselines_run_is_no_search_run_whatever_the_flags(tmp_path, capsys):
    """With a flag, --resume of a `placer baselines --out` folder compared the flag with a search's defaults:
    "--policy 'random': run ... searches with 'reinforce'", a policy the folder never ran."""
    assert main(["baselines", *GRAPH, "--policies", "m-etf", "--bound-time-limit", "0", "--out", str(tmp_path),
                 "--json"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    for flags in ([], ["--policy", "random"], ["--budget", "100"]):
        assert main(["search", "--resume", run_dir, *flags, "--json"]) == 2
        assert one_placer_error(capsys) == f"placer: error: run folder {run_dir} has no grouping.npz: not a search " \
                                           "run\n"


def test_output_file__a_pipe_or_a_trailing_slash_is_refused_and_a_symlink_written_through(tmp_path, capsys):
    """A fifo given as --trace became a plain file, /dev/null as root too, a symbolic link was replaced by a
    file (its target left as it was), and train -o DIR/ wrote a file named DIR."""
    import os

    from cluster.commands.paths import output_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sim = ["simulate", "--graph", "synthetic:20", "--machine", "paper-2gpu", "--policy", "single-gpu"]
    assert _exit_status([*sim, "--trace", str(fifo), "--json"]) == 2
    assert "is not a regular file" in one_placer_error(capsys) and fifo.is_fifo()
    assert _exit_status(["graphs", "export", "synthetic:20", "-o", f"{tmp_path}/out/"]) == 2
    assert "names a folder (it ends in /)" in one_placer_error(capsys) and not (tmp_path / "out").exists()
    target, link = tmp_path / "trace.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    assert output_file(str(link)) == str(target)
    assert _exit_status([*sim, "--trace", str(link)]) == 0
    capsys.readouterr()
    assert link.is_symlink() and json.loads(target.read_text())["traceEvents"]


def test_output_file__a_name_too_long_for_its_temporary_name_is_refused_before_the_work(tmp_path, capsys):
    """A file is written under a hidden temporary name up to 56 bytes longer: `profile -o` of a 240-byte name
    measured the graph, then failed ("File name too long") naming the temporary file."""
    long_name = tmp_path / ("p" * 230 + ".json")
    assert _exit_status(["simulate", "--graph", "synthetic:20", "--machine", "paper-2gpu", "--policy", "single-gpu",
                         "--trace", str(long_name)]) == 2
    assert one_placer_error(capsys).endswith(f"{long_name}: a name of 235 bytes is too long: at most 199 (it is "
                                             "written under a name 56 bytes longer first)\n")
    assert list(tmp_path.iterdir()) == []
    fits = tmp_path / ("p" * 194 + ".json")
    assert _exit_status(["simulate", "--graph", "synthetic:20", "--machine", "paper-2gpu", "--policy", "single-gpu",
                         "--trace", str(fits)]) == 0
    capsys.readouterr()
    assert fits.is_file()


def test_output_folder__a_link_to_a_missing_folder_is_refused_when_parsed(tmp_path, capsys):
    """search --out LINK (a dangling link) started Ray and scored the baselines, then said "File exists"."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    assert _exit_status(["baselines", "--graph", "synthetic:20", "--machine", "paper-2gpu", "--policies", "m-etf",
                         "--out", str(link)]) == 2
    assert one_placer_error(capsys).endswith(f"{link} is a symbolic link to {tmp_path / 'nowhere'}, which does not "
                                             "exist\n")
    assert [p.name for p in tmp_path.iterdir()] == ["link"]
    for flag, below in (("--out", link / "sub"), ("--trace", link / "t.json")):  # a folder above it, too
        command = ["baselines", "--graph", "synthetic:20", "--machine", "paper-2gpu", "--policies", "m-etf"] \
            if flag == "--out" else ["simulate", "--graph", "synthetic:20", "--machine", "paper-2gpu"]
        assert _exit_status([*command, flag, str(below)]) == 2
        assert one_placer_error(capsys).endswith(f"{link} is a symbolic link to {tmp_path / 'nowhere'}, which does "
                                                 f"not exist, so {below} cannot be written\n")
    assert [p.name for p in tmp_path.iterdir()] == ["link"]


def test_output_paths__a_leading_tilde_is_the_home_folder(tmp_path, monkeypatch):
    from cluster.commands.paths import output_file, output_folder

    monkeypatch.setenv("HOME", str(tmp_path))
    assert output_folder("~/placer-runs") == str(tmp_path / "placer-runs")
    assert output_file("~/c.pt") == str(tmp_path / "c.pt")


@pytest.mark.parametrize("command", [["reproduce", "mirhoseini2017", "--quick"],
                                     ["baselines", "--graph", "synthetic:20", "--machine", "paper-2gpu"]])
def test_ray_address__nothing_answering_and_a_dashboard_address_are_refused_before_anything_is_written(
        tmp_path, capsys, command):
    out = ["--out", str(tmp_path / "out")]
    for address, message in (("127.0.0.1:1", "cannot reach the Ray cluster at '127.0.0.1:1'"),
                             ("http://127.0.0.1:8265", "is a dashboard address")):
        assert main([*command, *out, "--ray-address", address]) == 2
        assert message in one_placer_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_leaves_stdout_early_ends_the_command_quietly(capsys, monkeypatch):
    """`placer machines show paper-2gpu | head -2`: writing to a pipe whose reader left."""
    import sys

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

        def isatty(self):
            return False

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["machines", "show", "paper-2gpu"]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("words", [["graphs", "list", "--json"], ["graphs", "list"]], ids=["json", "rich-table"])
def test_a_reader_that_leaves_before_the_output_ends_the_command_quietly(words):
    """`placer graphs list --json | true`: the JSON goes to a pipe nobody reads. A rich table (`graphs list |
    true`) exited 1 through rich's own broken-pipe handler where plain and JSON output exit 141."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RLLIB_TEST_NO_TF_IMPORT": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", "cluster.cli", *words], stdout=write_end,
                              stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2], env=env, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == b"", done.stderr[-2000:]


@pytest.mark.parametrize("command", [["bound", "--time-limit", "0"], ["search", "--policy", "random"]])
@pytest.mark.parametrize("seed", ["-1", "9223372036854775808"])
def test_seed_out_of_range__one_error_before_any_work(tmp_path, capsys, command, seed):
    """bound took -1, and a seed past 2**63 reached METIS' options as a TypeError traceback."""
    out = ["--out", str(tmp_path / "runs")] if command[0] == "search" else []
    assert main([*command, "--graph", "synthetic:40", "--machine", "paper-2gpu", "--seed", seed, *out]) == 2
    assert f"--seed must be a whole number in 0..4294967295, got {seed}" in one_placer_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_search__a_real_measurer_that_measures_nothing_stops_after_the_quick_baselines(tmp_path, capsys,
                                                                                        monkeypatch):
    """The model's source edited after its import (ReLU -> Tanh): the torch measurer cannot rebuild the step
    the graph describes. The search spent its whole budget on errors and exited 0."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    source = tmp_path / "mymodel.py"
    source.write_text("import torch\nfrom torch import nn\n\n\ndef net():\n"
                      "    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)), torch.randn(4, 8)\n")
    graph_file = tmp_path / "net.parquet"
    assert main(["graphs", "import", "--torch", f"{source}:net", "-o", str(graph_file)]) == 0
    source.write_text(source.read_text().replace("nn.ReLU()", "nn.Tanh()"))
    capsys.readouterr()
    out = tmp_path / "runs"
    assert main(["search", "--graph", str(graph_file), "--machine", "local", "--measurer", "torch", "--policy",
                 "random", "--budget", "64", "--runs", "1", "--warmup", "0", "--out", str(out), "--json"]) == 2
    err = capsys.readouterr()
    assert err.out == "" and "every quick baseline failed to measure (" in err.err
    (error,) = [line for line in err.err.splitlines() if line.startswith("placer: error:")]
    assert "does not match graph" in error and "Traceback" not in err.err  # its last line, not the traceback
    from cluster.runlog import read_run

    (run_dir,) = list(out.iterdir())
    assert len(read_run(run_dir)) < 64  # the baselines' rows, not the budget's


def test_cli__an_output_that_is_an_input_file_is_refused_before_any_work(tmp_path, capsys):
    """`placer profile --graph g.parquet -o g.parquet` replaced the graph with its profile."""
    from cluster.cli import main

    graph = tmp_path / "g.parquet"
    assert main(["graphs", "export", "synthetic:12:0", "-o", str(graph)]) == 0
    before = graph.read_bytes()
    capsys.readouterr()
    assert main(["profile", "--graph", str(graph), "--measurer", "torch", "-o", str(graph)]) == 2
    assert "--output " + str(graph) + " is the --graph file this command reads" in capsys.readouterr().err
    assert main(["simulate", "--graph", str(graph), "--machine", "paper-2gpu", "--policy", "single-gpu", "--trace",
                 str(tmp_path / "." / "g.parquet")]) == 2
    assert "--trace" in capsys.readouterr().err and graph.read_bytes() == before
    assert main(["graphs", "export", str(graph), "-o", str(graph)]) == 2  # the graph is a positional argument there
    assert f"--output {graph} is the graph file this command reads" in capsys.readouterr().err
    assert graph.read_bytes() == before
    # a machine file's profile is read too: a trace written over it left the machine file unusable
    from measurers.catalog import load_machine
    from measurers.machine_json import machine_to_json

    (tmp_path / "p.json").write_text("{}")
    machine = tmp_path / "m.json"
    machine.write_text(json.dumps({**machine_to_json(load_machine("paper-2gpu")), "profile": "p.json"}))
    assert main(["simulate", "--graph", str(graph), "--machine", str(machine), "--policy", "single-gpu", "--trace",
                 str(tmp_path / "p.json")]) == 2
    assert f"is the profile file of --machine {machine} this command reads" in capsys.readouterr().err
    assert (tmp_path / "p.json").read_text() == "{}"


def test_cli__an_output_over_the_model_file_a_graph_is_rebuilt_from_is_refused(tmp_path, capsys):
    """`placer profile -o model.py` (or --machine-out model.py) replaced the module the torch measurer
    rebuilds the step from: the graph could no longer be profiled or measured."""
    model = tmp_path / "models.py"
    shutil.copy(Path(__file__).parents[1] / "fixtures" / "tiny_models.py", model)
    graph = tmp_path / "clf.parquet"
    assert main(["graphs", "import", "--torch", f"{model}:tiny_torch_classifier", "-o", str(graph)]) == 0
    before = model.read_bytes()
    capsys.readouterr()
    for flags in (["-o", str(model)], ["-o", str(tmp_path / "p.json"), "--machine-out", str(tmp_path / "." / model.name)]):
        assert main(["profile", "--graph", str(graph), "--measurer", "torch", "--runs", "1", *flags]) == 2
        assert f"is the model file of --graph {graph} this command reads" in one_placer_error(capsys)
    assert model.read_bytes() == before and not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("argv", [
    ["simulate", "--graph", "models", "--machine", "paper-2gpu", "--policy", "single-gpu"],
    ["train", "--policy", "gdp", "--graphs", "models", "--machines", "paper-2gpu", "--budget", "8", "-o", "c.pt"],
])
def test_graph__a_folder_is_called_a_folder_as_a_machine_folder_is(tmp_path, monkeypatch, capsys, argv):
    """It said "not a file and not a benchmark" of a folder that exists."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert main(argv) == 2
    assert one_placer_error(capsys).startswith("placer: error: unknown graph 'models': a folder, not a graph file, "
                                               "and not a benchmark (benchmarks: ")
    assert main(["no-such-graph" if arg == "models" else arg for arg in argv]) == 2
    assert "unknown graph 'no-such-graph': not a file and not a benchmark" in one_placer_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


@pytest.mark.parametrize("flags, message", [
    (["--lr", "-1"], "--lr must be in (0, 1], got -1.0"),  # "lr must be in (0, 1] and failure_factor above 1"
    (["--batch", "1"], "--batch must be at least 2, got 1"),  # "batch_size must ..."
    (["--hidden", "0"], "--hidden must be in 4..4096, got 0"),  # "hidden_size must be ... and num_layers ..."
    (["--layers", "0"], "--layers must be in 1..64, got 0"),
    (["--entropy", "-1"], "--entropy must be a finite number >= 0, got -1.0"),  # "entropy_coeff must ..."
    (["--seed", "-1"], "--seed must be a whole number in 0..4294967295, got -1"),  # "seed must ..."
    (["--policy", "giph", "--episode-steps", "0"], "--episode-steps must be at least 1, got 0"),
    (["--policy", "giph", "--discount", "0"], "--discount must be in (0, 1], got 0.0"),
    (["--imitation-steps", "-2"], "--imitation-steps must not be negative, got -2"),  # named with --teacher-budget
])
def test_train__bad_network_settings_are_named_by_their_flags(tmp_path, capsys, flags, message):
    argv = ["train", "--graphs", "synthetic:20", "--machines", "paper-2gpu", "--budget", "8",
            "-o", str(tmp_path / "c.pt"), *flags]
    assert main(argv if "--policy" in flags else [*argv, "--policy", "gdp"]) == 2
    assert one_placer_error(capsys) == f"placer: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


def test_search__a_baseline_error_that_is_a_traceback_is_named_by_its_last_line():
    """`--runs 99999999999` failed every quick baseline with an actor's traceback, and the one-line error
    quoted all twenty lines of it."""
    from cluster.jobs.search import _last_line

    traceback = ('Traceback (most recent call last):\n  File "measurer.py", line 65, in measure\n'
                 '    samples = np.full(self.runs, x)\nnumpy.core._exceptions._ArrayMemoryError: Unable to allocate'
                 ' 745. GiB\n\n')
    assert _last_line(traceback) == "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 745. GiB"
    assert _last_line("the real step does not match graph 'net'") == "the real step does not match graph 'net'"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("argv, stdout", [(["graphs", "list"], "full"), (["machines", "show", "paper-2gpu", "--json"],
                                                                           "closed")])
def test_cli__an_output_that_cannot_be_written_is_one_error_line(argv, stdout):
    """`placer graphs list > /dev/full` and `... --json >&-` ended in tracebacks (errno 28, errno 9)."""
    import subprocess

    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "cluster.cli", *argv], env=env, capture_output=False,
                              stdout=full if stdout == "full" else None, stderr=subprocess.PIPE, text=True,
                              preexec_fn=None if stdout == "full" else lambda: os.close(1), timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("placer: error: cannot write the output: ") and done.stderr.count("\n") == 1, \
        done.stderr


@pytest.mark.parametrize("name", ["/dev/stdout", "out.json"])
def test_cli__an_output_file_that_is_where_stdout_goes_is_refused(tmp_path, name):
    """`placer simulate --json --trace /dev/stdout > out.json` renamed the trace over out.json and printed the
    report into the replaced file: out.json held the trace alone, exit 0."""
    import subprocess

    out = tmp_path / "out.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with open(out, "w") as stdout:
        done = subprocess.run([sys.executable, "-m", "cluster.cli", "simulate", *GRAPH, "--policy", "single-gpu",
                               "--json", "--trace", name], cwd=tmp_path, env=env, stdout=stdout,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "is the file this command's standard output goes to" in done.stderr and done.stderr.count("\n") == 1
    assert out.read_text() == "" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_cli__an_argument_that_is_not_utf8_is_one_error_before_anything_runs(tmp_path, capsys):
    """A path of other bytes: pyarrow and Ray's workers encode paths as UTF-8; `graphs export` and `search`
    ended in tracebacks, `train` left a checkpoint behind, `graphs show` called a good file damaged."""
    out = os.fsdecode(bytes(tmp_path) + b"/graph\xff.parquet")
    assert main(["graphs", "export", "synthetic:5", "-o", out]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"placer: error: argument {os.fsencode(out)!r} is not UTF-8: give paths and names in UTF-8\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("words", [["graphs", "export", "synthetic:5", "-o"],
                                   ["simulate", "--graph", "synthetic:5", "--trace"]])
def test_an_empty_file_path_is_refused_naming_it_empty_not_as_this_folder(tmp_path, monkeypatch, capsys, words):
    """`-o "$FILE"` with FILE unset: Path("") is ".", and the error said ". is a folder", a path nobody typed."""
    monkeypatch.chdir(tmp_path)
    assert _exit_status([*words, ""]) == 2
    assert one_placer_error(capsys).endswith(": an empty path: name a file\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["graphs", "list"], ["graphs", "export", "synthetic:5", "-o", "never.parquet"]])
def test_cli__a_closed_stdout_is_one_error_line_before_the_command_runs(tmp_path, argv):
    """`placer graphs list >&-`: Python starts without a sys.stdout, the command printed nothing, then failed
    with an AttributeError; `graphs export` wrote its file first."""
    import subprocess

    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "cluster.cli", *argv], cwd=tmp_path, env=env,
                          stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=120)
    assert done.returncode == 1
    assert done.stderr == "placer: error: cannot write the output: Bad file descriptor\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("words", [["search", "--policy", "random", "--out"], ["baselines", "--out"],
                                   ["reproduce", "mirhoseini2017", "--quick", "--out"], ["analyze", "runs", "--plots"]])
def test_an_empty_folder_path_is_refused_not_taken_as_this_folder(tmp_path, monkeypatch, capsys, words):
    """`--out "$DIR"` with DIR unset: Path("") is ".", and the run folder went into the working directory."""
    monkeypatch.chdir(tmp_path)
    assert _exit_status([*words, ""]) == 2
    assert one_placer_error(capsys).endswith(": an empty path: name a folder (`.` for this one)\n")
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("folder", ["models", "graphs"])
def test_output_paths__placers_cache_of_graphs_and_models_is_refused(tmp_path, monkeypatch, capsys, folder):
    """`profile -o` or `simulate --trace` on a benchmark's cached ONNX model replaced the 438 MB model with a
    profile; the cached graph was fine, so the cache never rebuilt the model and every real measurer's command
    on that benchmark failed from then on."""
    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / folder / "bert-base-infer-0123.onnx"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"a model")
    assert main(["simulate", "--graph", "synthetic:30", "--machine", "paper-2gpu", "--policy", "single-gpu",
                 "--trace", str(cached)]) == 2
    assert f"--trace {cached} lies in placer's cache ({tmp_path / 'cache'})" in one_placer_error(capsys)
    assert cached.read_bytes() == b"a model"


def test_output_paths__a_cache_that_cannot_be_located_keeps_no_output_from_being_written(tmp_path, monkeypatch):
    """No home folder (a uid without one, HOME unset): the cache check's Path.home() was a RuntimeError traceback
    for a command that never reads the cache."""
    import graphs.registry

    def nowhere():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(graphs.registry, "cache_dir", nowhere)
    trace = tmp_path / "t.json"
    assert main(["simulate", "--graph", "synthetic:30", "--machine", "paper-2gpu", "--policy", "single-gpu",
                 "--trace", str(trace)]) == 0
    assert trace.is_file()
