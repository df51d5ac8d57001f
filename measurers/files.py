"""The wording every loader here shares for an input path that is not a readable file."""

from __future__ import annotations

from pathlib import Path


def file_problem(path: Path) -> str:
    """Why ``path`` cannot be read as a file ("is a folder, not a file" / "does not exist"), or "" for a file.
    A folder was reported as missing, which sent users looking for a typo in a path that exists."""
    if path.is_file():
        return ""
    return "is a folder, not a file" if path.is_dir() else "does not exist"
