"""The rich console every command prints its tables and bars with."""

from __future__ import annotations


def text_console(**options):
    """A rich Console that prints names as they are, in its tables and lines alike: rich's emoji codes turned
    ``synthetic:100:0`` into ``synthetic💯0``, and its markup printed a machine named ``lab[gpu]`` as ``lab``
    (``lab[/gpu]`` was a MarkupError). Style a cell with ``rich.text.Text(..., style=...)``."""
    from rich.console import Console

    return Console(emoji=False, markup=False, **options)


def seconds_text(seconds: float) -> str:
    """A step time for a table: 4 decimals (0.4712), or 4 significant digits below 10 ms, where 4 decimals
    would print every step of a small graph as 0.0004 or 0.0000."""
    return f"{seconds:.4f}" if abs(seconds) >= 0.01 or seconds == 0 else f"{seconds:.4g}"
