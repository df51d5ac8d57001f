"""File descriptor 1 silenced for C libraries that print on it (METIS's warnings, HiGHS's banner): their
lines landed in a command's table, or broke a ``--json`` document."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

_C_STDOUT_LOCK = threading.RLock()  # fd 1 is the process's: one redirect at a time (nested: fine)


@contextmanager
def c_stdout_dropped() -> Iterator[None]:
    """File descriptor 1 sent to /dev/null while the block runs, C's stdio buffers flushed at both ends. One
    block at a time (two threads' blocks interleaved left fd 1 at /dev/null for good); where fd 1 is closed
    there is nothing to keep clean, and the block runs as it is."""
    with _C_STDOUT_LOCK:
        try:
            saved = os.dup(1)
        except OSError:  # closed
            saved = None
        if saved is None:
            yield
            return
        libc = ctypes.CDLL(None)
        if sys.stdout is not None:
            sys.stdout.flush()
        libc.fflush(None)
        try:
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), 1)
                yield
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
