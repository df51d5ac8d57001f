"""The rich console every command prints its tables and bars with."""

from __future__ import annotations


def text_console(**options):
    """A rich Console that prints names as they are: rich's emoji codes turned ``synthetic:100:0`` into
    ``synthetic💯0``."""
    from rich.console import Console

    return Console(emoji=False, **options)
