"""`placer`: the command line. Subcommands live in cluster/commands/, one module each."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import importlib
import logging
import os
import re
import signal
import sys

from cluster import ray_setup, raylet_watch
from cluster.commands import COMMAND_MODULES
from cluster.commands.paths import check_outputs_spare_inputs, standard_output_file
from cluster.jsonout import emit_json, json_emitted, json_stdout, writes_to_fd1
from graphs.errors import PlacerError


PATH_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EROFS,
               errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG}
"""What a path can do wrong (permissions, place, space): one error line. Any other OSError is a bug's."""

OPTIONAL_IMPORTS = {"ray": "ray", "gymnasium": "ray", "tensorflow": "tensorflow", "ortools": "ortools",
                    "highspy": "highspy", "torch_geometric": "torch_geometric", "onnx": "onnx", "openvino": "openvino",
                    "pymetis": "pymetis"}
"""The dependencies a command imports only when it needs them (a GPU node's own Python may lack some), by
import name, and the distribution that brings each (gymnasium comes with Ray's RLlib): a command that needs a
missing one says so in one line. Any other missing module is a bug's."""


def install_hint(distribution: str) -> str:
    """What installs ``distribution`` as this project requires it (pyproject.toml's pin, extras included)."""
    from importlib import metadata

    try:
        required = metadata.requires("placer") or []
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        required = []
    for requirement in required:
        name = re.split(r"[\[=<>~!; ]", requirement, maxsplit=1)[0]
        if name.lower() == distribution and ";" not in requirement:
            return requirement.replace(" ", "")
    return distribution


class OneLineParser(argparse.ArgumentParser):
    """argparse with the project's error format: one ``placer: error: [COMMAND: ]MESSAGE`` line on stderr
    and exit status 2, instead of a usage block (``placer COMMAND --help`` shows the usage). Subcommand
    parsers are made of the same class (``add_subparsers`` uses the parent's)."""

    def error(self, message: str):
        command = self.prog.removeprefix("placer").strip()
        self.exit(2, f"placer: error: {command + ': ' if command else ''}{message}\n")

    def parse_known_args(self, args=None, namespace=None):
        """Arguments a command does not know are refused by that command's parser, so the error names the
        command (argparse would leave them to the top parser, which names none)."""
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="placer", description="Device placement of neural-network graphs.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (130 after Ctrl-C). ``console_main`` is the program."""
    args = None
    if problem := _command_line_problem(sys.argv[1:] if argv is None else argv):
        print(f"placer: error: {problem}", file=sys.stderr)
        return 1 if sys.stdout is None else 2
    try:
        # `kill`, `ray job stop`: stopped as Ctrl-C stops it (exit 130), also while the commands load
        with ray_setup.sigterm_as_ctrl_c():
            args = build_parser().parse_args(argv)  # imports every command's module: Ctrl-C may come here too
            stdout_file = standard_output_file()
            if getattr(args, "json", False):
                with json_stdout():  # stdout: the one JSON document; everything else (Ray, C libraries): stderr
                    return _run(args, stdout_file)
            return _run(args, stdout_file)
    except BrokenPipeError:  # the reader of stdout left (`placer ... | head`): stop quietly, as shell tools do
        _stdout_to_devnull()
        return 141
    except OSError as exc:  # a full or closed stdout (`> /dev/full`, `>&-`), or a full disk: was a traceback
        if exc.errno not in WRITE_ERRNOS:
            raise
        _stdout_to_devnull()  # Python's flush of stdout at exit would fail again
        where = f" {exc.filename}" if exc.filename else " the output"
        print(f"placer: error: cannot write{where}: {exc.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # outside the command: while loading it, or at json_stdout's end
        return _interrupted(args if args is not None else _argv_as_parsed_so_far(argv))


def _command_line_problem(words: list[str]) -> str:
    """What keeps any command from running, said before one starts: a closed stdout (`>&-`: Python then has
    no sys.stdout, and a command printed nothing, then failed with a traceback), or an argument that is not
    UTF-8 (a path of other bytes: pyarrow, Ray's workers and the run log's JSON encode every path as UTF-8,
    and failed with tracebacks and half-written files)."""
    if sys.stdout is None:
        return f"cannot write the output: {os.strerror(errno.EBADF)}"
    for word in words:
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            return f"argument {os.fsencode(word)!r} is not UTF-8: give paths and names in UTF-8"
    return ""


def console_main() -> None:
    """The `placer` program (and `python -m cluster.cli`): main's exit status, 130 once Ctrl-C came, whenever
    it came. A Ctrl-C after main returned (its last output flushed, Ray's exit, Python's) raised a
    KeyboardInterrupt no one caught: Python then kills itself with SIGINT (a parent sees -2, not 130)."""
    late = _InterruptAfterMain()
    atexit.register(late.exit_if_pressed)  # before a command imports Ray: it runs after Ray's own exit handler
    status = 130
    try:
        status = main()
    except KeyboardInterrupt:  # a second Ctrl-C while main reported the first
        pass
    finally:
        late.install()
    late.status = 130 if late.pressed else int(status or 0)
    sys.exit(late.status)


class _InterruptAfterMain:
    """SIGINT once main has returned: marks the exit status 130 and lets the exit go on (Ray's shutdown,
    flushing the output); a second one ends the process at once, in case the exit hangs."""

    def __init__(self):
        self.pressed = False
        self.status: int | None = None  # main's exit status once it returned; None: it raised

    def install(self) -> None:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored by the parent (`cmd &`): it stays so
            signal.signal(signal.SIGINT, self._press)

    def _press(self, signum, frame) -> None:
        if self.pressed:
            self._exit(130)
        self.pressed = True

    def exit_if_pressed(self) -> None:
        """atexit, after every handler a command registered (Ray's): Python's exit status is fixed before its exit
        handlers run, and a Ctrl-C during them still counts. The process ends here, with main's status: in
        Python's finalization that follows (50-400 ms with torch and Ray loaded) SIGINT gets its default action
        back, and a Ctrl-C then killed the process (status -2, not 130)."""
        if self.pressed:
            self._exit(130)
        if self.status is not None:
            self._exit(self.status)

    @staticmethod
    def _exit(status: int) -> None:
        """Exit at once: the exit handlers registered before console_main's are skipped (logging's, and any a
        site-wide startup file registered, e.g. coverage's), so do what logging's would: flush log handlers and
        the standard streams (a stdout that cannot take its last bytes turns a status of 0 into 120, Python's
        own status for that)."""
        with contextlib.suppress(Exception):
            logging.shutdown()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        try:
            sys.stdout.flush()
        except Exception:
            status = status or 120
        os._exit(status)


def _interrupted(args: argparse.Namespace, measurers_lost: str | None = None) -> int:
    """Ctrl-C: one line on stderr and exit status 130; with --json still one document for a pipe's reader,
    unless the command printed its own before the Ctrl-C came. A Ray process that died under the command
    (cluster/raylet_watch.py), or a search inside it whose measurer nodes all left (``measurers_lost``: a
    ``SearchInterrupted``'s error, in `placer reproduce`), stops it the same way, reported as an error with
    exit status 1."""
    lost = raylet_watch.lost_message() or measurers_lost
    print(f"placer: error: {lost}" if lost else "placer: interrupted", file=sys.stderr)
    stop = raylet_watch.stop_fields(measurers_lost)
    if getattr(args, "json", False) and not json_emitted():
        if getattr(args, "command", None) == "search":  # its own document (README), before any run folder
            emit_json(stop | {"run_dir": None, "resume": None})
        else:
            emit_json(stop | {"command": args.command})
    return 1 if lost else 130


COMMAND_NAMES = frozenset(module.rpartition(".")[2] for module in COMMAND_MODULES)  # search, analyze...


def _argv_as_parsed_so_far(argv: list[str] | None) -> argparse.Namespace:
    """The command and --json of a command line not parsed yet (Ctrl-C while the commands load)."""
    words = sys.argv[1:] if argv is None else argv
    return argparse.Namespace(command=next((w for w in words if w in COMMAND_NAMES), None), json="--json" in words)


def _run(args: argparse.Namespace, stdout_file: tuple[int, int] | None = None) -> int:
    try:
        check_outputs_spare_inputs(args, stdout_file)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader that left is caught, not at the interpreter's exit
        return status
    except PlacerError as exc:
        print(f"placer: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # main's: after json_stdout has put file descriptor 1 back
    except OSError as exc:
        # a path the user gave that cannot be written or read as asked (most are refused when parsed:
        # cluster/commands/paths.py); the message names the path (a rename's target, not its temp file)
        path = exc.filename2 or exc.filename
        if path is None or exc.errno not in PATH_ERRNOS:
            raise
        print(f"placer: error: {path}: {exc.strerror}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        package = (exc.name or "").partition(".")[0]
        if package not in OPTIONAL_IMPORTS:
            raise
        print(f"placer: error: {args.command} needs the Python package {package}, which this Python lacks "
              f"(pip install '{install_hint(OPTIONAL_IMPORTS[package])}')", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return _interrupted(args, getattr(exc, "error", None))


WRITE_ERRNOS = (errno.ENOSPC, errno.EBADF, errno.EIO, errno.EDQUOT, errno.EFBIG)  # no room, or no stream


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null, so Python's flush of stdout at exit cannot fail again."""
    if not writes_to_fd1(sys.stdout):  # a test's capture: nothing to point elsewhere
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


if __name__ == "__main__":
    console_main()
