"""Files in and out: writing a file (or a folder) so that readers see the old one or the whole new one, never
half of it, and the wording every loader shares for an input path that is not a readable file."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
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


@contextmanager
def atomic_folder(root: Path, name: str) -> Iterator[Path]:
    """``with atomic_folder(root, name) as staging:`` make the folder ``staging/name``; it becomes ``root/name``
    only if the block succeeds. ``staging`` is a hidden folder under ``root``, removed on any failure (an
    exception, Ctrl-C), and so are the folders above it this call made (``root`` = a/b: a and b), never one
    that was there before. A killed process leaves only the dot-named staging folder."""
    from graphs.errors import PlacerError

    root = Path(root)
    made = _missing_folders(root)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        yield staging
        final = root / name
        if final.exists():  # another writer of the same name finished first
            raise PlacerError(f"folder {final} already exists (made while this one was written)")
        os.rename(staging / name, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(made)
        raise
    staging.rmdir()  # empty: its folder was renamed out


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first: what ``mkdir(parents=True)`` makes."""
    missing = []
    for folder in (path.absolute(), *path.absolute().parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty: one something else wrote into stays, and so do
    the folders above it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def file_problem(path: Path) -> str:
    """Why ``path`` cannot be read as a file ("is a folder, not a file" / "does not exist"), or "" for a file.
    A folder was reported as missing, which sent users looking for a typo in a path that exists."""
    if path.is_file():
        return ""
    return "is a folder, not a file" if path.is_dir() else "does not exist"
