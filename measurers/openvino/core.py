"""One OpenVINO ``Core`` per process, shared by the measurer, the device queries and the GPU check.

Why one: OpenVINO's CPU plugin gives the thread that loads it an alternate signal stack, and a released core
puts back the stack the thread had when it was made. Two cores whose lives overlap, released in the order
they were made, leave the thread's stack pointing at the first core's freed memory; the next signal it takes
(a user's Ctrl-C) then kills the process with SIGSEGV. A single core that lives as long as the process never
restores a freed stack (compiles, released compiled models and repeated compiles keep the same one).
Callers that pass their own ``core=`` (tests with a second device) are left to keep theirs apart."""

from __future__ import annotations

import threading

_LOCK = threading.Lock()
_CORE: list = []  # the process's core, once made


def openvino_core():
    """The process-wide ``openvino.Core`` (made on first use, never released before exit)."""
    with _LOCK:
        if not _CORE:
            import openvino as ov

            _CORE.append(ov.Core())
        return _CORE[0]
