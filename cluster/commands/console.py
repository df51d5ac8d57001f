"""The rich console every command prints its tables and bars with."""

from __future__ import annotations

import functools
import math
import time

PROGRESS_LINE_EVERY_S = 30.0  # a progress bar's line in a log (a Ray job's, a file): the first, then this often
PROGRESS_LINE_WIDTH = 160  # columns of that line: room for a long problem name beside the count


def text_console(**options):
    """A rich Console that prints names as they are, in its tables and lines alike: rich's emoji codes turned
    ``synthetic:100:0`` into ``synthetic💯0``, and its markup printed a machine named ``lab[gpu]`` as ``lab``
    (``lab[/gpu]`` was a MarkupError). Style a cell with ``rich.text.Text(..., style=...)``."""
    return _pipe_console_class()(emoji=False, markup=False, **options)


@functools.cache
def _pipe_console_class():
    """rich's Console (imported when first needed) whose broken pipe is Python's: a reader that left (`placer
    graphs list | head`) ends the command quietly with status 141 (cli.main), as plain and --json output do;
    rich's own handler exited 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipeConsole


def seconds_text(seconds: float) -> str:
    """A step time for a table: 4 decimals (0.4712), or 4 significant digits below 10 ms, where 4 decimals
    would print every step of a small graph as 0.0004 or 0.0000."""
    return f"{seconds:.4f}" if abs(seconds) >= 0.01 or seconds == 0 else f"{seconds:.4g}"


class ProgressLines:
    """A rich progress bar's line, printed to its console every ``every_s`` seconds (the first at the first
    ``tick``) when that console is no terminal: there rich draws the bar once, when it stops, so
    `ray job logs --follow` of a search showed nothing until the search ended. A terminal keeps the live bar."""

    def __init__(self, bar, every_s: float = PROGRESS_LINE_EVERY_S, clock=time.monotonic):
        self._bar, self._every_s, self._clock = bar, every_s, clock
        self._due_s = None if bar.console.is_terminal else -math.inf  # None: the live bar shows progress
        if not bar.console.is_terminal:  # a log's 80 columns cut train's line before its count of the budget
            bar.console.width = max(bar.console.width, PROGRESS_LINE_WIDTH)

    def tick(self) -> None:
        if self._due_s is None or self._clock() < self._due_s:
            return
        self._due_s = self._clock() + self._every_s
        self._bar.console.print(self._bar.make_tasks_table(self._bar.tasks))


def column_figure(value: float, width: int, decimals: int) -> str:
    """``value`` right-aligned in ``width`` with ``decimals``, or in 3 significant digits where that shows
    it as 0 or runs past the column (a 1 MB/s link read "0.0" GB/s, a 1e300 B/s one 300 digits)."""
    text = f"{value:{width}.{decimals}f}"
    if len(text) > width or (value > 0 and float(text) == 0):
        text = f"{value:{width}.3g}"
    return text
