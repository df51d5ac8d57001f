"""Notice when the Ray raylet on this machine dies under a running command, and stop the command as Ctrl-C does.

Ray's C++ core worker ends its driver with ``_exit(1)`` some seconds after the local raylet is gone (``kill
-9``, the OOM killer), once the control store has marked the node dead: no Python exception, no error line, and
under ``--json`` no document (calls to actors already running go on until then). The watch polls
the raylet's process; once it is gone it records what happened and interrupts the main thread, so the
command closes its run log as after Ctrl-C and reports one error with exit status 1 (cluster/cli.py,
cluster/commands/search.py). Should the process not end by itself within ``BACKSTOP_S`` (Ray's clean-up
waiting on the dead raylet), the watch writes the error line and ends it with status 1.

Linux only (it reads ``/proc``); elsewhere, or where no raylet runs on this machine (Ray Client), it does not
start.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
from pathlib import Path

POLL_S = 0.5
BACKSTOP_S = 30.0

_watch: "_Watch | None" = None
_lost: str | None = None  # what happened, once the raylet was found gone


def start() -> None:
    """Watch the raylet of the Ray this process is connected to (once; ``stop`` ends it)."""
    global _watch, _lost
    if (_watch is not None and _watch.is_alive()) or threading.current_thread() is not threading.main_thread():
        return
    pid = _raylet_pid()
    if pid is None:
        return
    _lost = None
    _watch = _Watch(pid)
    _watch.start()


def stop() -> None:
    """Stop watching: before this process shuts Ray down (which stops the raylet it started)."""
    global _watch
    if _watch is not None:
        _watch.stopped.set()
        _watch = None


def lost_message() -> str | None:
    """Why the command was stopped, if the raylet died under it; None otherwise."""
    return _lost


class _Watch(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(name="placer-raylet-watch", daemon=True)
        self.pid = pid
        self.stopped = threading.Event()

    def run(self) -> None:
        global _lost
        while not self.stopped.wait(POLL_S):
            if not _ray_connected():  # shut down without stop() (``ray.shutdown`` disconnects, then stops it)
                return
            if _process_alive(self.pid) or self.stopped.is_set() or not _ray_connected():
                continue
            _lost = (f"Ray's raylet on this machine (pid {self.pid}) stopped while the command ran (killed, or out "
                     f"of memory: its log is in Ray's session folder); Ray cannot go on without it")
            _thread.interrupt_main()
            if not self.stopped.wait(BACKSTOP_S):
                print(f"placer: error: {_lost}", file=sys.stderr, flush=True)
                os._exit(1)
            return


def _ray_connected() -> bool:
    """False once this process has begun ``ray.shutdown()`` (which stops a raylet it started)."""
    import ray

    return ray.is_initialized()


def _raylet_pid() -> int | None:
    """The pid of the raylet this process's Ray worker talks to: the one it started, else the process on this
    machine listening on the worker's raylet socket (a joined cluster)."""
    if not Path("/proc/self").is_dir():
        return None
    try:
        import ray._private.ray_constants as ray_constants
        from ray._private.worker import global_worker

        node = global_worker.node
        started = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) if node is not None else None
        if started:
            return started[0].process.pid
        socket_name = node.raylet_socket_name if node is not None else None
    except (ImportError, AttributeError):
        return None
    return _pid_with_argument(f"--raylet_socket_name={socket_name}") if socket_name else None


def _pid_with_argument(argument: str) -> int | None:
    wanted = argument.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "cmdline").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return None


def _process_alive(pid: int) -> bool:
    """Running, not a zombie (a raylet this process started stays one until Ray reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
