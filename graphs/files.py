"""Writing a file so that readers see the old file or the whole new one, never half of it."""

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
