"""Joining a cluster that uses token authentication (as README's "Running on a Ray cluster" sets one up): a
client without the cluster's token is refused at once, in one ``placer: error:`` line saying why. Ray itself
retried the refused handshake for 20 s, a warning line a second, then called the cluster unreachable.

The cluster's head runs in a process of its own, started with RAY_AUTH_MODE=token; this process keeps the
tests' RAY_AUTH_MODE=disabled (Ray reads the mode once per process), so the token-mode clients run as
subprocesses."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import placer_stderr

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # starts Ray
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RLLIB_TEST_NO_TF_IMPORT": "1", "RAY_USAGE_STATS_ENABLED": "0",
       "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
HEAD = textwrap.dedent("""
    import sys
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    print(cluster.address, flush=True)
    sys.stdin.read()  # until the test closes it (or ends)
    cluster.shutdown()
""")


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory):
    """(the GCS address, the token) of a one-node Ray whose control store requires that token."""
    token = secrets.token_hex(16)
    home = tmp_path_factory.mktemp("head-home")  # no ~/.ray/auth_token of the user's is read or written
    env = {**ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "HOME": str(home)}
    head = subprocess.Popen([sys.executable, "-c", HEAD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        address = head.stdout.readline().strip()
        assert address, "the token-authenticated head did not start"
        yield address, token
    finally:
        head.stdin.close()
        head.wait(timeout=60)


def _client(tmp_path: Path, **env) -> dict:
    """A client's environment: token mode and what ``env`` adds, a HOME without a token file."""
    home = tmp_path / "client-home"
    home.mkdir(exist_ok=True)
    return {**ENV, "RAY_AUTH_MODE": "token", "HOME": str(home), **env}


def _search(address: str, out: Path, env: dict) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "cluster.cli", "search", "--ray-address", address, "--graph", "synthetic:20",
            "--machine", "paper-2gpu", "--policy", "random", "--budget", "4", "--bound-time-limit", "0",
            "--out", str(out), "--json"]
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


def _one_error(result: subprocess.CompletedProcess) -> str:
    err = placer_stderr(result.stderr)
    assert result.returncode == 2 and result.stdout == "", (result.returncode, result.stdout, err)
    assert err.startswith("placer: error: ") and err.count("\n") == 1, err
    return err


def test_a_client_that_sends_no_token__is_told_to_turn_token_mode_on(token_cluster):
    """This process does not send a token (RAY_AUTH_MODE=disabled): refused within the connect timeout,
    before ray.init, with what to set."""
    from cluster.ray_setup import check_reachable
    from graphs.errors import PlacerError

    address, _ = token_cluster
    started = time.perf_counter()
    with pytest.raises(PlacerError, match=f"the Ray cluster at '{address}' refused this client: it uses token "
                                          "authentication; export RAY_AUTH_MODE=token"):
        check_reachable(address, timeout_s=5.0)
    assert time.perf_counter() - started < 10.0  # the connect timeout's bound, not Ray's 20 s of retries


def test_a_ray_client_address_on_the_control_stores_port__says_which_port_to_give(token_cluster, tmp_path):
    """ray://HOST:GCS_PORT waited 30 s for Ray Client, then said "connection timeout" with a hint about
    tokens; a control store that refuses a client without its token answers all the same."""
    address, _ = token_cluster
    started = time.perf_counter()
    err = _one_error(_search(f"ray://{address}", tmp_path / "runs", {**ENV}))
    assert err == (f"placer: error: 'ray://{address}' is a Ray control store's port, not Ray Client's: give it "
                   f"without ray:// ({address}), or Ray Client's port, 10001 by default\n")
    assert time.perf_counter() - started < 25.0 and not (tmp_path / "runs").exists()


def test_search_with_a_wrong_token__one_error_line_no_run_folder(token_cluster, tmp_path):
    address, _ = token_cluster
    result = _search(address, tmp_path / "runs", _client(tmp_path, RAY_AUTH_TOKEN=secrets.token_hex(16)))
    err = _one_error(result)
    assert err.startswith(f"placer: error: the Ray cluster at '{address}' refused this client's token"), err
    assert "Unauthenticated" not in result.stderr  # none of Ray's retry warnings: it never reached ray.init
    assert not (tmp_path / "runs").exists()


def test_search_in_token_mode_without_any_token__one_error_line(token_cluster, tmp_path):
    address, _ = token_cluster
    err = _one_error(_search(address, tmp_path / "runs", _client(tmp_path)))
    assert err.startswith("placer: error: RAY_AUTH_MODE=token, but no Ray token was found"), err
    assert not (tmp_path / "runs").exists()


def test_the_clusters_token__is_accepted(token_cluster, tmp_path):
    address, token = token_cluster
    check = f"from cluster.ray_setup import check_reachable; check_reachable({address!r}, timeout_s=5.0)"
    result = subprocess.run([sys.executable, "-c", check], env=_client(tmp_path, RAY_AUTH_TOKEN=token), cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
