"""Ctrl-C at any moment of a `placer` process exits 130: the program (`python -m cluster.cli`, as the `placer`
script) run in a subprocess that sends itself SIGINT at a chosen point outside a command's own handling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}

LOADING = """
    import cluster.commands.machines as machines
    register = machines.register
    def register_with_signal(subparsers):
        os.kill(os.getpid(), signal.{signal})
        register(subparsers)
    machines.register = register_with_signal
    """

CTRL_C_AT = {
    # after the command printed its --json document, as json_stdout puts stdout back
    "json_stdout_end": """
        import cluster.jsonout as jsonout
        emit, flush, emitted = jsonout.emit_json, jsonout._flush_all, []
        def emit_json(payload):
            emit(payload)
            emitted.append(True)
        def flush_all(stream):
            flush(stream)
            if emitted:
                os.kill(os.getpid(), signal.SIGINT)
        jsonout.emit_json, jsonout._flush_all = emit_json, flush_all
        """,
    # while Python exits, after main returned (Ray's exit handler runs then, registered once Ray is imported)
    "exit": """
        import atexit
        import cluster.commands.machines as machines
        show = machines._show
        def show_then_ctrl_c_at_exit(args):
            atexit.register(os.kill, os.getpid(), signal.SIGINT)
            return show(args)
        machines._show = show_then_ctrl_c_at_exit
        """,
    # while main loads the commands, before any command runs
    "loading": LOADING.format(signal="SIGINT"),
    # `kill` while main loads the commands: SIGTERM killed the process there (status 143, no --json document)
    "loading_sigterm": LOADING.format(signal="SIGTERM"),
}


def _placer_with_ctrl_c(at: str, *args: str) -> subprocess.CompletedProcess:
    script = "import os, runpy, signal, sys\n" + textwrap.dedent(CTRL_C_AT[at]) + (
        "sys.argv = ['placer', *sys.argv[1:]]\nrunpy.run_module('cluster.cli', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("at", sorted(CTRL_C_AT))
def test_cli__ctrl_c_outside_the_command_exits_130_with_no_traceback(at):
    """Ctrl-C just after a command finished escaped main as a KeyboardInterrupt: Python killed itself with
    SIGINT (status -2, a traceback); at exit it was ignored (status 0); while loading commands, -2 too."""
    done = _placer_with_ctrl_c(at, "machines", "show", "paper-2gpu", "--json")
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    (document,) = _json_documents(done.stdout)  # --json: still exactly one document
    if at.startswith("loading"):
        assert done.stderr.endswith("placer: interrupted\n")
        assert document == {"stop_reason": "interrupted", "command": "machines"}
    else:
        assert document["name"] == "paper-2gpu"  # the command's own, printed before the Ctrl-C came


def test_cli__ctrl_c_while_loading_a_search_prints_the_searchs_own_document():
    """It printed the other commands' {"stop_reason", "command"}: a reader of search's --json looks for
    ``run_dir`` and ``resume`` (null: no run folder was made)."""
    done = _placer_with_ctrl_c("loading", "search", "--json")
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert _json_documents(done.stdout) == [{"stop_reason": "interrupted", "run_dir": None, "resume": None}]


def _json_documents(text: str) -> list:
    decoder, documents, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        document, at = decoder.raw_decode(text, at)
        documents.append(document)
    return documents


def test_cli__a_second_ctrl_c_after_main_returned_ends_the_process_at_once():
    """After main returned, a first Ctrl-C marks the status 130 and lets the exit go on; a second ends it (a
    hung exit stays stoppable)."""
    from cluster.cli import _InterruptAfterMain

    late = _InterruptAfterMain()
    late._press(signal.SIGINT, None)
    assert late.pressed
    code = ("from cluster.cli import _InterruptAfterMain\n"
            "late = _InterruptAfterMain()\nlate._press(2, None)\nlate._press(2, None)\nprint('not reached')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 130 and "not reached" not in done.stdout


@pytest.mark.parametrize("delay_s", [0.0, 0.02, 0.05])
def test_cli__ctrl_c_while_python_exits_after_the_document_is_never_a_death_by_sigint(delay_s):
    """Once its exit handlers had run, Python's finalization (tens to hundreds of ms with pyarrow, torch or Ray
    loaded) gave SIGINT its default action back: a Ctrl-C then killed the process (status -2). The process now
    ends after its exit handlers, so a Ctrl-C is either counted (130) or comes after it ended (its status, 0)."""
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", "graphs", "list", "--json"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    decoder, text = json.JSONDecoder(), b""
    while True:
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, proc.stderr.read().decode()[-2000:]
        text += chunk
        try:
            decoder.decode(text.decode())
            break
        except ValueError:
            continue
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), (proc.returncode, err.decode()[-2000:])


def test_cli__a_ctrl_c_the_parent_ignores_stays_ignored_while_ray_starts_and_after_main():
    """A script's `placer ... &` starts with SIGINT ignored; interrupts_deferred (Ray's start, train) and the
    handler console_main installs after main put a handler in its place, and a SIGINT then stopped the command."""
    from cluster.cli import _InterruptAfterMain
    from cluster.jobs.interrupts import interrupts_deferred

    from cluster.ray_setup import sigterm_as_ctrl_c

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    term_before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with sigterm_as_ctrl_c():  # SIGTERM alike
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        with interrupts_deferred("starting", (signal.SIGINT, signal.SIGTERM)) as held:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert not held.pressed and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        _InterruptAfterMain().install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, term_before)


def test_cli__sigterm_stops_a_command_without_ray_as_ctrl_c_does(tmp_path):
    """Only search turned SIGTERM into Ctrl-C: `kill` ended a simulator `placer baselines` at once (status 143),
    with no --json document and its staging folder left behind."""
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", "baselines", "--graph", "synthetic:300", "--machine", "paper-2gpu",
                             "--policies", "annealing", "--budget", "10000000", "--out", str(out), "--json"],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (out.is_dir() and any(out.iterdir())):
        time.sleep(0.05)
    time.sleep(0.5)  # into the searches
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, stderr.decode()[-2000:])
    assert _json_documents(stdout.decode()) == [{"stop_reason": "interrupted", "command": "baselines"}]
    assert not out.exists() or not any(out.iterdir())
