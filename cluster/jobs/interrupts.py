"""Signals held back while a run must finish a step: a search's closing, a training update.

A search interrupted by Ctrl-C closes its pool and run log in a ``finally``; people press Ctrl-C again while
that runs (killing actors takes a moment), and the second KeyboardInterrupt used to land inside the closing,
skipping the flush of the rows still buffered: measurements already paid for were lost to the resume.
``placer train`` holds Ctrl-C and SIGTERM the same way while it trains, stopping after a whole update.
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
    pressed: bool = False  # a signal came during the block (the caller stops as it would have)


@contextmanager
def interrupts_deferred(what: str | None = None,
                        signals: tuple[int, ...] = (signal.SIGINT,)) -> Iterator[HeldInterrupt]:
    """Run the block with ``signals`` held back: the first one during it sets the yielded ``pressed``, for the
    caller to stop once it can, prints one line naming ``what`` (if given), and puts that signal's handler back,
    so a second one acts as it would have outside the block (Ctrl-C: KeyboardInterrupt at once, a way out of a
    closing that hangs). A signal the process ignores (a parent's SIG_IGN) stays ignored. Off the main thread,
    where Python delivers no signal, the block runs as it is."""
    held = HeldInterrupt()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    before = {signum: signal.getsignal(signum) for signum in signals}
    signals = tuple(s for s in signals if before[s] is not signal.SIG_IGN)  # ignored by the parent (`cmd &`): stays so

    def restore(signum: int) -> None:
        previous = before[signum]
        signal.signal(signum, previous if previous is not None else signal.default_int_handler)

    def hold(signum, frame) -> None:
        held.pressed = True
        restore(signum)
        if what:
            print(f"placer: {what}; press Ctrl-C again to quit without it", file=sys.stderr, flush=True)

    for signum in signals:
        signal.signal(signum, hold)
    try:
        yield held
    finally:
        for signum in signals:
            restore(signum)
