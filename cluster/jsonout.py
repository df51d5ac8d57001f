"""``--json`` output: stdout carries exactly one JSON document, everything else goes to stderr.

Other writers share stdout with a command: C libraries (METIS prints its warnings with ``printf``), the
processes Ray starts (they inherit file descriptor 1), Ray's driver printing worker logs
(``(raylet) A worker died ...``), progress bars and stray ``print`` calls. Redirecting ``sys.stdout``
alone catches only the Python ones, so ``json_stdout`` moves file descriptor 1 itself onto stderr for
the duration of the command and keeps a private duplicate of the real stdout, which only ``emit_json``
writes to.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import sys
from typing import IO, Iterator

_json_stream: IO[str] | None = None  # the real stdout while json_stdout() is active
_documents_emitted = 0  # emit_json calls since the last json_stdout() began


def emit_json(payload) -> None:
    """Print ``payload`` as the command's one JSON document (indented, newline-terminated) on the real
    stdout, even while everything else written to stdout is being sent to stderr. Infinities and NaN
    become null: JSON has no such numbers, and `jq` refuses Python's ``Infinity``."""
    global _documents_emitted
    stream = _json_stream if _json_stream is not None else sys.stdout
    _documents_emitted += 1  # counted before writing: a Ctrl-C mid-write must not add a second document
    stream.write(json.dumps(json_safe(payload), indent=2, allow_nan=False) + "\n")
    stream.flush()


def json_emitted() -> bool:
    """Whether the command has printed its JSON document (since its json_stdout() began): a Ctrl-C after that
    must not print another."""
    return _documents_emitted > 0


def json_safe(value):
    """``value`` with every non-finite float (also inside dicts, lists and tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@contextlib.contextmanager
def json_stdout() -> Iterator[None]:
    """Send everything written to stdout (``sys.stdout`` and file descriptor 1) to stderr until the block
    ends; ``emit_json`` inside the block still reaches the real stdout."""
    global _json_stream, _documents_emitted
    _documents_emitted = 0
    original = sys.stdout
    _flush_all(original)
    saved_fd = os.dup(1)
    # A replaced sys.stdout (pytest's capsys, a caller's StringIO) is where the JSON belongs; a plain one
    # writes to descriptor 1, which is about to point at stderr, so the JSON goes to the saved duplicate.
    target = open(saved_fd, "w", closefd=False, encoding="utf-8") if writes_to_fd1(original) else original
    previous_stream = _json_stream
    try:
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        _json_stream = target
        yield
    finally:
        _flush_all(sys.stdout)  # C buffers too: left there, they would reach the real stdout at exit
        os.dup2(saved_fd, 1)
        sys.stdout = original
        _json_stream = previous_stream
        try:
            if target is not original:
                target.close()  # closefd=False: closes the wrapper only
        except BrokenPipeError:
            pass  # the reader left: the error that brought us here says so (cluster/cli.py)
        finally:
            os.close(saved_fd)


def writes_to_fd1(stream) -> bool:
    try:
        return stream.fileno() == 1
    except (AttributeError, OSError, ValueError):
        return False


def _flush_all(stream) -> None:
    """Flush a Python stream and the C library's stdio buffers (METIS's printf output may sit there)."""
    with contextlib.suppress(Exception):
        stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)
