"""Closing a run without losing its log to an impatient Ctrl-C.

A search interrupted by Ctrl-C closes its pool and run log in a ``finally``; people press Ctrl-C again while
that runs (killing actors takes a moment), and the second KeyboardInterrupt used to land inside the closing,
skipping the flush of the rows still buffered: measurements already paid for were lost to the resume.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


@dataclass
class HeldInterrupt:
    pressed: bool = False  # Ctrl-C came during the block (the caller stops as it would have)


@contextmanager
def interrupts_deferred(what: str) -> Iterator[HeldInterrupt]:
    """Run the block with Ctrl-C held back: the first press during it prints one line naming ``what`` and sets
    the yielded ``pressed``, for the caller to stop once the block is done; a second press raises
    KeyboardInterrupt at once (a way out of a closing that hangs). Off the main thread, where Python delivers no
    signal, the block runs as it is."""
    held = HeldInterrupt()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def hold(signum, frame) -> None:
        if held.pressed:
            raise KeyboardInterrupt
        held.pressed = True
        print(f"placer: {what}; press Ctrl-C again to quit without it", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
