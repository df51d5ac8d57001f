"""A raylet that dies under a command: one error, exit 1, one JSON document, a run folder that resumes.

Before cluster/raylet_watch.py a search went on while calls to its existing actors still worked, and Ray's core
worker ended the driver with ``_exit(1)`` once the node was marked dead (seconds later): status 1, no error line,
an empty stdout under --json. A short run could finish first, with status 0 (this test's run did).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import placer_stderr

pytestmark = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="the watch reads /proc (Linux)")

REPO = Path(__file__).resolve().parents[2]


def _children_running(parent: int, program: str) -> list[int]:
    """Pids of ``parent``'s child processes whose first argument ends with ``program``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            first = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and first.endswith(program):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("program, what, sigint", [("raylet/raylet", "raylet", signal.SIG_IGN),
                                                   ("gcs/gcs_server", "control store", signal.SIG_DFL)],
                         ids=["raylet-sigint-ignored", "control-store"])
def test_search_cli__a_ray_process_killed_mid_run_is_one_error_exit_1_and_the_run_folder_to_resume(tmp_path, program,
                                                                                                   what, sigint):
    """The control store killed: the search went on for 60 s, then Ray ended it the same silent way. The raylet
    killed under a search started with SIGINT ignored (`placer search ... &` in a script), where an interrupt
    sent as SIGINT would do nothing."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    search = [sys.executable, "-m", "cluster.cli", "search", "--graph", "synthetic:1000:1", "--budget", "640",
              "--batch", "16", "--workers", "1", "--out", str(tmp_path), "--json"]
    driver = subprocess.Popen(search, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("*/checkpoint/learner.pt")) and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    (killed,) = _children_running(driver.pid, program)
    os.kill(killed, signal.SIGKILL)
    out, err = driver.communicate(timeout=120)

    (run_dir,) = list(tmp_path.iterdir())
    errors = [line for line in placer_stderr(err).splitlines() if line.startswith("placer: ")]
    assert driver.returncode == 1, err[-3000:]
    assert len(errors) == 1 and errors[0].startswith(f"placer: error: Ray's {what} on this machine (pid {killed}) "
                                                     "stopped while the command ran"), errors
    assert f"the run log is complete up to now in {run_dir}" in errors[0]
    document = json.loads(out)  # exactly one document
    assert document["stop_reason"] == "ray_lost" and f"pid {killed}" in document["error"]
    assert document["run_dir"] == str(run_dir) and document["resume"] == ["placer", "search", "--resume", str(run_dir)]
    assert not (run_dir / "result.json").exists()


def test_watch__finds_a_joined_clusters_raylet_and_ends_quietly_with_ray():
    """Joined (not started here): the raylet is found by its socket among this machine's processes (the control
    store, elsewhere in general, is not watched). A plain
    ``ray.shutdown()`` (not shutdown_ray) ends the watch, so the raylet stopping after it is no alarm."""
    import ray
    from ray.cluster_utils import Cluster

    from cluster import ray_setup, raylet_watch

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        ray_setup.init_ray(cluster.address)
        head_raylet = cluster.head_node.all_processes["raylet"][0].process.pid
        assert raylet_watch._watch is not None and raylet_watch._watch.processes == {"raylet": head_raylet}
        watch = raylet_watch._watch
        ray.shutdown()
        watch.join(timeout=5 * raylet_watch.POLL_S)
        assert not watch.is_alive()
    finally:
        ray_setup.shutdown_ray()
        cluster.shutdown()
    time.sleep(3 * raylet_watch.POLL_S)  # an alarm now would interrupt this test
    assert raylet_watch.lost_message() is None
