"""graphs/files.py: atomic_file's temporary files, atomic_folder's staging folders and FolderLock, and what a
killed process leaves of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from graphs.errors import PlacerError
from graphs.files import FolderLock, _host_tag, atomic_file, atomic_folder, remove_stale_staging

REPO = Path(__file__).resolve().parents[2]

# A process that writes half a folder, says so, and waits to be killed.
WRITER = """
import sys, time
from pathlib import Path
from graphs.files import atomic_folder
with atomic_folder(Path(sys.argv[1]), sys.argv[2]) as staging:
    (staging / sys.argv[2]).mkdir()
    (staging / sys.argv[2] / "part.txt").write_text("half")
    print("writing", flush=True)
    time.sleep(600)
"""

# A process that writes half of a file through atomic_file, says so, and waits to be killed.
FILE_WRITER = """
import sys, time
from pathlib import Path
from graphs.files import atomic_file
with atomic_file(Path(sys.argv[1])) as tmp:
    tmp.write_text("half")
    print("writing", flush=True)
    time.sleep(600)
"""

# A process that locks a folder, says so, and waits to be killed.
LOCKER = """
import sys, time
from pathlib import Path
from graphs.files import FolderLock
FolderLock.acquire(Path(sys.argv[1]), "run folder")
print("writing", flush=True)
time.sleep(600)
"""

posix_only = pytest.mark.skipif(os.name != "posix" or not Path("/proc/self/stat").exists(),
                                reason="pids are checked through POSIX signals and /proc")


def start_writer(root: Path, name: str, script: str = WRITER) -> subprocess.Popen:
    """A child process inside atomic_folder(root, name), its half-written folder made (``FILE_WRITER``:
    inside atomic_file(root), half of it written)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    child = subprocess.Popen([sys.executable, "-c", script, str(root), name], stdout=subprocess.PIPE, text=True,
                             env=env)
    assert child.stdout.readline() == "writing\n"
    return child


def write_folder(root: Path, name: str) -> None:
    with atomic_folder(root, name) as staging:
        (staging / name).mkdir()
        (staging / name / "done.txt").write_text("all")


@posix_only
def test_atomic_folder__a_later_call_removes_what_a_sigkilled_writer_left(tmp_path):
    child = start_writer(tmp_path, "run-a")
    child.kill()  # SIGKILL: no finally runs
    assert child.wait() == -signal.SIGKILL
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".run-a.") and (left / "run-a" / "part.txt").read_text() == "half"

    write_folder(tmp_path, "run-b")

    assert [p.name for p in tmp_path.iterdir()] == ["run-b"]
    assert (tmp_path / "run-b" / "done.txt").read_text() == "all"


@posix_only
def test_atomic_folder__a_killed_writer_not_yet_reaped_is_dead_too(tmp_path):
    child = start_writer(tmp_path, "run-a")
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, but a zombie: its pid still answers
    os.kill(child.pid, 0)

    write_folder(tmp_path, "run-b")

    assert [p.name for p in tmp_path.iterdir()] == ["run-b"]
    child.wait()


@posix_only
def test_atomic_folder__a_live_writers_staging_folder_is_kept(tmp_path):
    child = start_writer(tmp_path, "run-a")
    try:
        write_folder(tmp_path, "run-b")
        (left,) = [p for p in tmp_path.iterdir() if p.name != "run-b"]
        assert (left / "run-a" / "part.txt").read_text() == "half"
        assert remove_stale_staging(tmp_path) == []
    finally:
        child.kill()
        child.wait()
    assert remove_stale_staging(tmp_path) == [left]


def dead_pid() -> int:
    """A pid no process has now: a child that already exited and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_atomic_folder__a_name_the_file_system_refuses_leaves_no_folder_it_made(tmp_path):
    root = tmp_path / "runs" / "new"
    with pytest.raises(OSError, match="too long"):
        with atomic_folder(root, "x" * 300):
            pass
    assert not (tmp_path / "runs").exists()


@posix_only
def test_remove_stale_staging__keeps_folders_it_cannot_prove_are_a_dead_writers(tmp_path):
    pid, tag = dead_pid(), _host_tag()
    kept = {
        f".run.other-host-0123abcd.{pid}.89abcdef.tmp": ["run"],  # another host (or container, or boot)
        f".run.{tag}.{pid}.89abcdef.tmp": ["run", "notes.txt"],  # more than atomic_folder writes
        f".run.{tag}.{pid}.89abcdef-x.tmp": ["run"],  # not atomic_folder's name
        ".run.abc123xy.tmp": ["run"],  # an older atomic_folder's (no owner in the name)
        f".notes.{tag}.{pid}.0123abcd.tmp": [],  # a file, not a folder
    }
    for name, entries in kept.items():
        if not entries:
            (tmp_path / name).write_text("a file")
        for entry in entries:
            (tmp_path / name / entry).mkdir(parents=True)
    stale = tmp_path / f".run.v2.{tag}.{pid}.0123abcd.tmp"  # a dotted name is fine
    (stale / "run.v2" / "measurements").mkdir(parents=True)
    empty = tmp_path / f".other.{tag}.{pid}.0123abcd.tmp"  # killed before its folder was made
    empty.mkdir()

    assert remove_stale_staging(tmp_path) == sorted([empty, stale])

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


@posix_only
def test_temp_folder__removed_after_and_a_killed_writers_removed_by_the_next_call(tmp_path):
    """An OpenVINO IR build killed mid-write left its tempfile folder (.ir-XXXX, 73 MB) in the graph cache for
    good; a folder of this name and a dead writer's pid is removed, a live writer's and another name's kept."""
    from graphs.files import temp_folder

    stale = tmp_path / f".ir.{_host_tag()}.{dead_pid()}.0123abcd.tmp"
    live = tmp_path / f".ir.{_host_tag()}.{os.getpid()}.0123abcd.tmp"
    other = tmp_path / f".xml.{_host_tag()}.{dead_pid()}.0123abcd.tmp"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "model.bin").write_bytes(b"weights")
    with temp_folder(tmp_path, "ir") as scratch:
        assert scratch.is_dir() and scratch.name.startswith(".ir.")
        (scratch / "model.xml").write_text("<net/>")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_atomic_file__the_next_write_removes_the_temporary_file_of_a_sigkilled_writer(tmp_path):
    path = tmp_path / "model.ckpt"
    path.write_text("old")
    child = start_writer(path, "", FILE_WRITER)
    child.kill()
    child.wait()
    (left,) = [p for p in tmp_path.iterdir() if p != path]
    assert left.name.startswith(".model.ckpt.") and left.read_text() == "half" and path.read_text() == "old"
    live = start_writer(path, "", FILE_WRITER)  # another writer of the same file, still running
    try:
        other = tmp_path / f".model.ckpt.bak.{_host_tag()}.{dead_pid()}.0123abcd.tmp"  # another file's
        other.write_text("kept")

        with atomic_file(path) as tmp:
            tmp.write_text("new")

        assert path.read_text() == "new"
        (live_temp,) = [p for p in tmp_path.iterdir() if p not in (path, other)]
        assert live_temp != left and str(live.pid) in live_temp.name.split(".")
    finally:
        live.kill()
        live.wait()


def test_atomic_file__a_write_that_fails_names_the_file_and_leaves_no_folder_it_made(tmp_path):
    """`ulimit -f 4; placer graphs export ... -o new/sub/g.parquet`: "cannot write the output: File too large"
    named no file, and new/sub stayed, empty; an error opening the temporary file named the hidden one."""
    import errno

    path = tmp_path / "new" / "sub" / "g.parquet"
    with pytest.raises(OSError) as error:
        with atomic_file(path) as tmp:
            tmp.write_text("half")
            raise OSError(errno.EFBIG, "File too large")  # what write() raises: no file name
    assert error.value.filename == str(path) and str(error.value) == f"[Errno 27] File too large: '{path}'"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as error:
        with atomic_file(tmp_path / ("x" * 250)):
            pass
    assert error.value.filename == str(tmp_path / ("x" * 250)) and list(tmp_path.iterdir()) == []
    with pytest.raises(OSError, match="^Parquet writer: column chunk too large$"):  # a message alone: as it was
        with atomic_file(path):
            raise OSError("Parquet writer: column chunk too large")


def test_atomic_file__an_error_mid_write_keeps_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "graph.parquet"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(path) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == [path] and path.read_text() == "old"


@posix_only
def test_file_lock__a_lock_file_removed_after_it_was_opened_is_not_taken(tmp_path, monkeypatch):
    """A process that opened CHECKPOINT.lock just before its holder removed it, and locked it just after, held a
    lock on a file no longer at the path, while a third process made and locked a new one: two trains on one
    -o. The lock is taken again on the file at the path."""
    import graphs.files
    from graphs.errors import PlacerError
    from graphs.files import file_lock

    path = tmp_path / "c.pt.lock"
    path.write_text("")
    removed = os.open(path, os.O_RDWR)  # opened, then its holder removed it
    path.unlink()
    real_open, calls = os.open, []

    def open_the_removed_file_first(*args, **kwargs):
        calls.append(args[0])
        return removed if len(calls) == 1 else real_open(*args, **kwargs)

    monkeypatch.setattr(graphs.files.os, "open", open_the_removed_file_first)
    with file_lock(path, "checkpoint c.pt"):
        assert len(calls) == 2 and path.is_file()
        monkeypatch.setattr(graphs.files.os, "open", real_open)
        with pytest.raises(PlacerError, match="checkpoint c.pt is in use by another process"):
            with file_lock(path, "checkpoint c.pt"):
                pass
    assert not path.exists()


def test_folder_lock__a_second_holder_is_refused_naming_the_first_until_it_is_killed(tmp_path):
    child = start_writer(tmp_path, "unused", LOCKER)
    try:
        with pytest.raises(PlacerError, match=rf"run folder {tmp_path} is in use by another process "
                                              rf"\(pid {child.pid}\)"):
            FolderLock.acquire(tmp_path, "run folder")
    finally:
        child.kill()  # SIGKILL: no finally runs, and the kernel drops its lock
        child.wait()
    FolderLock.acquire(tmp_path, "run folder").release()


def test_folder_lock__released_it_can_be_taken_again_and_held_it_cannot(tmp_path):
    first = FolderLock.acquire(tmp_path, "run folder")
    with pytest.raises(PlacerError, match=f"pid {os.getpid()}"):
        FolderLock.acquire(tmp_path, "run folder")  # another open file: refused in one process too
    first.release()
    first.release()  # twice is harmless
    FolderLock.acquire(tmp_path, "run folder").release()
