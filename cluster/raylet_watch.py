"""Notice when Ray's raylet on this machine (or the control store of a Ray started here) dies under a running
command, and stop the command as Ctrl-C does.

Ray's C++ core worker ends its driver with ``_exit(1)`` some seconds after the local raylet is gone (``kill
-9``, the OOM killer), once the control store has marked the node dead, and 60 s after the control store is
gone: no Python exception, no error line, and under ``--json`` no document (calls to actors already running go
on until then). The watch polls those processes; once one is gone it records what happened and interrupts the
main thread, so the command closes its run log as after Ctrl-C and reports one error with exit status 1
(cluster/cli.py, cluster/commands/search.py). Should the process not end by itself within ``BACKSTOP_S`` (Ray's
clean-up waiting on the dead process), the watch writes the error line and ends it with status 1 (under
``--json`` without a document then).

Linux only (it reads ``/proc``); elsewhere, or where no raylet runs on this machine (Ray Client), it does not
start. A joined cluster's control store runs elsewhere and is not watched.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from pathlib import Path

POLL_S = 0.5
BACKSTOP_S = 30.0

_watch: "_Watch | None" = None
_lost: str | None = None  # what happened, once a watched process was found gone


def start() -> None:
    """Watch the Ray processes this process cannot go on without (once; ``stop`` ends it)."""
    global _watch, _lost
    if (_watch is not None and _watch.is_alive()) or threading.current_thread() is not threading.main_thread():
        return
    processes = _ray_processes()
    if not processes:
        return
    _lost = None
    _watch = _Watch(processes)
    _watch.start()


def stop() -> None:
    """Stop watching: before this process shuts Ray down (which stops the processes it started)."""
    global _watch
    if _watch is not None:
        _watch.stopped.set()
        _watch = None


def lost_message() -> str | None:
    """Why the command was stopped, if a watched process died under it; None otherwise."""
    return _lost


def stop_fields(measurers_lost: str | None = None) -> dict:
    """The stop reason of an interrupted command's JSON document: ``ray_lost`` and the error, ``measurers_lost``
    and ``measurers_lost`` (a search's ``SearchInterrupted.error``: every measurer node left), or
    ``interrupted``."""
    if _lost:
        return {"stop_reason": "ray_lost", "error": _lost}
    if measurers_lost:
        return {"stop_reason": "measurers_lost", "error": measurers_lost}
    return {"stop_reason": "interrupted"}


class _Watch(threading.Thread):
    def __init__(self, processes: dict[str, int]) -> None:
        super().__init__(name="placer-raylet-watch", daemon=True)
        self.processes = processes  # what the process is ("raylet") -> pid
        self.stopped = threading.Event()

    def run(self) -> None:
        global _lost
        while not self.stopped.wait(POLL_S):
            gone = [(what, pid) for what, pid in self.processes.items() if not _process_alive(pid)]
            # checked after looking: ``ray.shutdown`` (with or without stop()) disconnects before it stops the
            # processes, so one its shutdown stopped is never taken for a death
            if not _ray_connected():
                return
            if not gone:
                continue
            what, pid = gone[0]
            _lost = (f"Ray's {what} on this machine (pid {pid}) stopped while the command ran (killed, or out "
                     f"of memory: its log is in Ray's session folder); Ray cannot go on without it")
            _interrupt_main()
            if not self.stopped.wait(BACKSTOP_S):
                print(f"placer: error: {_lost}", file=sys.stderr, flush=True)
                os._exit(1)
            return


def _interrupt_main() -> None:
    """As a SIGTERM, which a command stops on as on Ctrl-C (cluster/ray_setup.py) and takes also when started in
    the background (`placer ... &` in a script: SIGINT ignored); as a SIGINT where only that one is Python's."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        if callable(signal.getsignal(signum)):
            _thread.interrupt_main(signum)
            return


def _ray_connected() -> bool:
    """False once this process has begun ``ray.shutdown()`` (which stops a raylet it started)."""
    import ray

    return ray.is_initialized()


def _ray_processes() -> dict[str, int]:
    """{what: pid} of the Ray processes this command cannot go on without: the raylet its Ray worker talks to
    (the one it started, else the process on this machine listening on the worker's raylet socket: a joined
    cluster), and the control store if it started one."""
    if not Path("/proc/self").is_dir():
        return {}
    try:
        import ray._private.ray_constants as ray_constants
        from ray._private.worker import global_worker

        node = global_worker.node
        if node is None:
            return {}
        started = {what: node.all_processes.get(kind) for what, kind in (
            ("raylet", ray_constants.PROCESS_TYPE_RAYLET), ("control store", ray_constants.PROCESS_TYPE_GCS_SERVER))}
        socket_name = node.raylet_socket_name
    except (ImportError, AttributeError):
        return {}
    processes = {what: infos[0].process.pid for what, infos in started.items() if infos}
    if "raylet" not in processes and socket_name:
        pid = _pid_with_argument(f"--raylet_socket_name={socket_name}")
        if pid is not None:
            processes["raylet"] = pid
    return processes


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
