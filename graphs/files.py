"""Files in and out: writing a file (or a folder) so that readers see the old one or the whole new one, never
half of it, and the wording every loader shares for an input path that is not a readable file."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import secrets
import shutil
import socket
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """``with atomic_file(path) as tmp:`` write ``tmp``; it becomes ``path`` only if the block succeeds, with
    the permissions a plain ``open`` gives (the umask applied by the kernel; mkstemp's 0600 left the files
    unreadable to others). A killed writer leaves its hidden temporary file; the next write of ``path``
    removes it once that writer is certainly gone (as ``remove_stale_staging`` does for folders)."""
    path = Path(path)
    made = missing_folders(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in _temps_of(path.parent, path.name):
        if stale.is_file() and _owner_gone(stale):  # left by a writer of ``path`` that was killed
            stale.unlink(missing_ok=True)
    tmp = path.with_name(_temp_name(path.name))
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a file size limit: the error names the user's file, not the hidden one
        if exc.errno is not None and (exc.filename is None or str(exc.filename) == str(tmp)):
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc  # (a message alone, pyarrow's: kept)
        raise
    finally:
        with suppress(OSError):  # gone, or never made (a name too long: unlinking it fails as making it did)
            tmp.unlink()
        if not os.path.exists(path):  # failed: the folders made for it go too (False for a name too long)
            remove_empty_folders(made)


@contextmanager
def atomic_folder(root: Path, name: str) -> Iterator[Path]:
    """``with atomic_folder(root, name) as staging:`` make the folder ``staging/name``; it becomes ``root/name``
    only if the block succeeds. ``staging`` is a hidden folder under ``root``, removed on any failure (an
    exception, Ctrl-C), and so are the folders above it this call made (``root`` = a/b: a and b), never one
    that was there before. A killed process leaves only the dot-named staging folder; its name says which
    process made it (``_temp_name``), and the next call in ``root`` removes it once that process is gone
    (``remove_stale_staging``)."""
    from graphs.errors import PlacerError

    root = Path(root)
    made = missing_folders(root)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(root)
    staging = root / _temp_name(name)
    try:
        staging.mkdir(mode=0o700)  # inside the try: a name the file system refuses leaves no folder made here
        yield staging
        final = root / name
        if final.exists():  # another writer of the same name finished first
            raise PlacerError(f"folder {final} already exists (made while this one was written)")
        os.rename(staging / name, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty_folders(made)
        raise
    staging.rmdir()  # empty: its folder was renamed out


def being_written(root: Path, name: str) -> bool:
    """Whether ``root`` holds a staging folder of ``name`` (``atomic_folder``'s, of a writer alive or not yet
    cleaned up): a name that will exist once that writer finishes."""
    return bool(_temps_of(root, name))


def _locked(path: Path, named: str) -> int:
    """A descriptor of ``path`` (made if missing) holding its exclusive flock, the holder's pid written in it;
    PlacerError naming ``named`` and the holder if another process holds it."""
    from graphs.errors import PlacerError

    for _ in range(100):
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise PlacerError(f"{named} is in use by another process (pid {holder}): "
                              f"wait for it to end, or stop it, and try again") from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):  # not a file_lock's its holder removed after this one opened it: another
            os.ftruncate(fd, 0)  # process would make and lock a new one at the path
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)
    raise PlacerError(f"{named}: its lock file {path} kept being replaced; try again")


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


@contextmanager
def file_lock(path: Path, named: str) -> Iterator[None]:
    """``path`` (``CHECKPOINT.lock``) locked as ``FolderLock`` locks a folder while the block runs, then removed:
    a second process refused at once, naming the first; nothing left behind once the holder ends. (A process
    that opened the file before its removal and locks it after finds the path gone or another file, and
    opens the path again: ``_locked``.)"""
    fd = _locked(Path(path), named)
    try:
        yield
    finally:
        Path(path).unlink(missing_ok=True)
        os.close(fd)


@contextmanager
def temp_folder(root: Path, name: str) -> Iterator[Path]:
    """``with temp_folder(root, name) as scratch:`` a hidden folder ``root/.<name>.<host>.<pid>.<random>.tmp``
    (``_temp_name``) for files written together and then moved into place; removed on exit. One that a killed
    process left (its owner certainly gone) is removed by the next call for the same ``name`` in ``root``,
    whatever it holds: a ``tempfile`` folder of another name was never cleaned up (73 MB of weights per
    killed OpenVINO IR build in the graph cache)."""
    root = Path(root)
    for stale in _temps_of(root, name):
        if stale.is_dir() and _owner_gone(stale):
            shutil.rmtree(stale, ignore_errors=True)
    folder = root / _temp_name(name)
    folder.mkdir(mode=0o700)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class FolderLock:
    """An exclusive advisory lock (``flock``) on ``folder/.lock``, held from ``acquire`` until ``release`` or
    the process ends. The kernel drops it when its holder dies, SIGKILL included, so a killed run leaves no
    stale lock behind. The file holds the holder's pid, for the error a second process gets."""

    FILE = ".lock"

    def __init__(self, fd: int):
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, folder: Path, what: str) -> "FolderLock":
        """Lock ``folder`` (which must exist); PlacerError naming ``what`` and the holder if another process
        (or another acquire in this one) holds it."""
        return cls(_locked(Path(folder) / cls.FILE, f"{what} {folder}"))

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor of the open file drops the flock
            self._fd = None


def remove_stale_staging(root: Path) -> list[Path]:
    """Remove the staging folders under ``root`` that ``atomic_folder`` made in a process now certainly gone
    (SIGKILL, the OOM killer): made on this host, in this boot and pid namespace, by a pid no process has now
    (or a zombie has), and holding nothing but the folder being written. A live run's folder, another host's
    or boot's, and any folder this code did not make are kept. Returns the folders removed."""
    removed = []
    for folder in sorted(Path(root).glob(".*.tmp")):
        if _is_stale_staging(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _temp_name(name: str) -> str:
    """``.<name>.<host>.<pid>.<random>.tmp``: hidden from readers, and naming the process that writes it."""
    return f".{name}.{_host_tag()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


NAME_MAX_BYTES = 255  # the longest file name ext4, XFS, Btrfs and tmpfs take
# What _temp_name adds to a name at most (a host tag of 24 + 9 characters, a pid of 7 digits): the same on
# every host, so a name one machine takes another does too
TEMP_NAME_EXTRA_BYTES = len(f"..{'h' * 33}.{'9' * 7}.{'0' * 8}.tmp")


def name_too_long(name: str) -> str | None:
    """Why a file or folder named ``name`` cannot be written (its temporary name, ``_temp_name``, is longer,
    and a name too long for that failed the write after the command's work was done), else None."""
    size, most = len(name.encode("utf-8", "surrogateescape")), NAME_MAX_BYTES - TEMP_NAME_EXTRA_BYTES
    if size <= most:
        return None
    return f"a name of {size} bytes is too long: at most {most} (it is written under a name " \
           f"{TEMP_NAME_EXTRA_BYTES} bytes longer first)"


_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>[0-9]+)\.[0-9a-f]{8}\.tmp")


def _owner_gone(temp: Path) -> str | None:
    """The name ``temp`` (a ``_temp_name``) was written for, if this host's process that made it is gone."""
    match = _TEMP.fullmatch(temp.name)
    if match is None or match["host"] != _host_tag() or not _process_gone(int(match["pid"])):
        return None
    return match["name"]


def _temps_of(root: Path, name: str) -> list[Path]:
    """``root``'s hidden temporary files and folders (``_temp_name``) written for ``name``, links left out."""
    return [temp for temp in Path(root).glob(f".{glob.escape(name)}.*.tmp") if not temp.is_symlink()
            and (match := _TEMP.fullmatch(temp.name)) is not None and match["name"] == name]


def _is_stale_staging(folder: Path) -> bool:
    if folder.is_symlink() or not folder.is_dir():
        return False
    name = _owner_gone(folder)
    if name is None:
        return False
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    if any(entry.name != name or entry.is_symlink() or not entry.is_dir() for entry in entries):
        return False  # not what atomic_folder leaves: someone else's folder, left alone
    return True


def _host_tag() -> str:
    """This host's name (letters, digits and ``-`` only), then a hash of it with the kernel's boot id and
    the pid namespace: a pid names one process only within those, so a folder made in another container
    with the same host name, or before a reboot, never matches (and is kept: its owner may be alive)."""
    host = socket.gethostname()
    where = "\0".join((host, _read_proc("/proc/sys/kernel/random/boot_id"), _pid_namespace()))
    digest = hashlib.sha256(where.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9-]', '-', host)[:24]}-{digest}"


def _read_proc(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _process_gone(pid: int) -> bool:
    """Whether process ``pid`` is certainly not running: none has that pid, or it is a zombie (dead, not yet
    reaped by its parent). False where that cannot be told (another user's process, not POSIX)."""
    if os.name != "posix" or not 0 < pid < 2**31:
        return False  # os.kill(0, ...) signals a process group, and on Windows os.kill ends the process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    stat = _read_proc(f"/proc/{pid}/stat")  # "pid (command) state ...": the command may hold spaces
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def missing_folders(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first: what ``mkdir(parents=True)`` makes."""
    missing = []
    for folder in (path.absolute(), *path.absolute().parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty: one something else wrote into stays, and so do
    the folders above it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def written_through(path: Path) -> Path:
    """Where writing ``path`` should go: the file a symbolic link names (an atomic write is a rename, which
    replaced the link itself and left its file as it was), else ``path``."""
    return Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)


def is_file(path: Path) -> bool:
    """``Path.is_file``, False for a name no file can have: Python 3.11 raises "File name too long" for a name
    past 255 bytes, such as a benchmark or machine name with a long seed, which is a name, not a path."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


def is_dir(path: Path) -> bool:
    """``Path.is_dir``, False for a name no folder can have (as ``is_file``)."""
    try:
        return Path(path).is_dir()
    except OSError:
        return False


def file_problem(path: Path) -> str:
    """Why ``path`` cannot be read as a file ("is a folder, not a file" / "does not exist"), or "" for a file.
    A folder was reported as missing, which sent users looking for a typo in a path that exists."""
    if path.is_file():
        return ""
    return "is a folder, not a file" if path.is_dir() else "does not exist"


def loads_json_once(text: str, where: str):
    """``json.loads`` of a file a user writes (``where``: how errors name it), refusing an object that names a
    key twice (PlacerError): the JSON reader keeps the last and drops the first without a word (a placement's
    op run on the wrong device, a machine's memory_bytes given twice)."""
    import json

    from graphs.errors import PlacerError

    def refuse_a_key_twice(pairs: list[tuple[str, object]]) -> dict:
        seen = set()
        for key, _value in pairs:
            if key in seen:
                raise PlacerError(f"{where}: {key!r} is named twice in one object")
            seen.add(key)
        return dict(pairs)

    return json.loads(text, object_pairs_hook=refuse_a_key_twice)
