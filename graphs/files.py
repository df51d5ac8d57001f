"""Files in and out: writing one so that readers see the old file or the whole new one, never half of it, and
the wording every loader shares for an input path that is not a readable file."""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """``with atomic_file(path) as tmp:`` write ``tmp``; it becomes ``path`` only if the block succeeds, with
    the permissions a plain ``open`` gives (the umask applied by the kernel; mkstemp's 0600 left the files
    unreadable to others)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def file_problem(path: Path) -> str:
    """Why ``path`` cannot be read as a file ("is a folder, not a file" / "does not exist"), or "" for a file.
    A folder was reported as missing, which sent users looking for a typo in a path that exists."""
    if path.is_file():
        return ""
    return "is a folder, not a file" if path.is_dir() else "does not exist"
