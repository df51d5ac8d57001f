"""Output paths given on the command line, checked when the arguments are parsed: a command that would
fail to write its result (a file path that is a folder, a folder path that is a file, a parent that is a
file, a folder that cannot be written) says so in one error line before it does any work.

Used as argparse ``type=`` converters, so the message comes out as ``placer: error: <command>: argument
-o/--output: ...`` with exit status 2 (cluster/cli.py ``OneLineParser``).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path

from graphs.files import name_too_long, written_through


def _os_errors_refused(check):
    """``check`` with an OSError from the file system (a name longer than it allows, errno 36) as the
    argument's error: pathlib's is_dir() and exists() raise it, and argparse let it out as a traceback."""
    @functools.wraps(check)
    def checked(text: str) -> str:
        try:
            return check(text)
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or exc}") from None
    return checked


@_os_errors_refused
def output_file(text: str) -> str:
    """A file the command will write (created, or replaced): not a folder, and under no file. A leading
    ``~`` is the user's home (a quoted one reaches a Ray job's command line unexpanded). A symbolic link is
    written through: the file it names is replaced (the write is a rename, which replaced the link itself);
    a path that names something other than a file (a pipe, a device: ``/dev/null`` as root was replaced by a
    file) or ends in ``/`` is refused, and so is an empty path (`-o "$FILE"` with FILE unset: it read as ".")."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a file")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text} names a folder (it ends in /), not a file")
    text = str(Path(text).expanduser())
    path = written_through(Path(text))
    text = str(path)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a pipe, a device or a socket): the "
                                         "command writes its result to a new file and would replace it")
    if problem := name_too_long(path.name):
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    _check_parents(path)
    return text


OTHER_FORMATS = (".json", ".csv", ".txt", ".npy", ".npz")  # data formats a graph file (Parquet) is not


def graph_output_file(text: str) -> str:
    """``output_file`` for a graph file, which is Parquet: a name that says another data format (``g.json``)
    is refused rather than written Parquet under it."""
    text = output_file(text)
    suffix = Path(text).suffix.lower()
    if suffix in OTHER_FORMATS:
        raise argparse.ArgumentTypeError(f"{text}: a graph file is Parquet, not {suffix}; name it with .parquet")
    return text


@_os_errors_refused
def output_folder(text: str) -> str:
    """A folder the command will create or write into: not a file, and under no file; ``~`` expanded. An empty
    path (an unset shell variable, `--out "$DIR"`) is refused: Path("") is ".", and the run went there."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a folder (`.` for this one)")
    text = str(Path(text).expanduser())
    path = Path(text)
    _check_not_dangling(path, path)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if path.is_dir() and not _writable(path):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    _check_parents(path)
    return text


RUN_MANIFEST = "manifest.json"  # cluster.runlog_format.MANIFEST_FILE, not imported here (pyarrow, pandas)


def runs_folder(text: str) -> str:
    """``output_folder`` for a folder run folders are made in: not a run folder nor inside one. A run made
    in another's folder was never found: analyze reads a run folder's own log and looks no deeper."""
    text = output_folder(text)
    for folder in (Path(text).absolute(), *Path(text).absolute().parents):
        if (folder / RUN_MANIFEST).is_file():
            where = "is" if folder == Path(text).absolute() else f"lies inside {folder},"
            raise argparse.ArgumentTypeError(f"{text} {where} a run folder: run folders are made beside each "
                                             "other, not in one another; choose another folder")
    return text


def _check_not_dangling(folder: Path, path: Path) -> None:
    """``folder`` (``path`` or one above it) may not be a symbolic link to nothing: made when written, it
    failed with "File exists" after the command's work (Ray started, the baselines scored)."""
    if folder.is_symlink() and not folder.exists():
        where = "" if folder == path else f", so {path} cannot be written"
        raise argparse.ArgumentTypeError(f"{folder} is a symbolic link to {os.readlink(folder)}, which does not "
                                         f"exist{where}")


def _check_parents(path: Path) -> None:
    """The nearest existing ancestor of ``path`` must be a folder this process may write into (missing
    ones are made when written; the result is written there under a temporary name, then renamed)."""
    for parent in path.absolute().parents:
        _check_not_dangling(parent, path)
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{parent} is a file, so {path} cannot be written")
            if not _writable(parent):
                raise argparse.ArgumentTypeError(f"{parent} is not writable, so {path} cannot be written")
            return


def _writable(folder: Path) -> bool:
    """Whether a file can be made in ``folder``: permissions, a read-only file system, and folders that
    refuse new files whatever the permissions say (/proc, /sys) are all tried by making one."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


INPUT_FILE_ARGS = ("graph", "machine", "profile", "placement", "onnx", "openvino",  # argparse dests of files read
                   "graphs", "machines")  # (train's lists; not its --init: training on from a checkpoint into the
# same file is a use)
OUTPUT_FILE_ARGS = ("output", "machine_out", "trace", "out", "module_map")  # ... and files written
RUN_FOLDER_ARGS = ("placement",)  # ... and run folders read (a run folder or its best placement file)


def check_outputs_spare_inputs(args: argparse.Namespace, stdout_file: tuple[int, int] | None = None) -> None:
    """No file the command writes may be a file it reads (`placer profile --graph g.parquet -o g.parquet`
    replaced the graph with the profile), nor ``stdout_file`` (standard_output_file()). One PlacerError
    naming the arguments, before any work."""
    from graphs.errors import PlacerError

    outputs = [(dest, value) for dest in OUTPUT_FILE_ARGS if isinstance(value := getattr(args, dest, None), str)]
    if not outputs:  # nothing written: no input file (or a graph file's footer) to read for this
        return
    _check_outputs_spare_stdout(outputs, stdout_file)
    _check_outputs_outside_cache(outputs)
    inputs = files_read(args)
    for dest, value in outputs:
        if read_as := inputs.get(Path(value).expanduser().resolve()):
            raise PlacerError(f"--{dest.replace('_', '-')} {value} is the {read_as} this command reads: writing it "
                              "would replace it")
    _check_outputs_outside_runs_read(args)


def files_read(args: argparse.Namespace) -> dict[Path, str]:
    """Each file the command reads (resolved) -> what it is, for messages: "--graph file", "profile file of
    --machine m.json", "model file of --graph g.parquet" (a real measurer rebuilds from it)."""
    inputs = {}
    for dest in INPUT_FILE_ARGS:
        given = getattr(args, dest, None)
        for value in given if isinstance(given, list) else [given]:
            if not isinstance(value, str) or not Path(value).expanduser().is_file():
                continue
            read_label = dest if dest in getattr(args, "positional_args", ()) else f"--{dest}"
            inputs[Path(value).expanduser().resolve()] = f"{read_label.replace('_', '-')} file"
            if dest in ("machine", "machines") and (profile := _machine_profile(Path(value).expanduser())) is not None:
                inputs[profile] = f"profile file of --{dest} {value}"
            if dest in ("graph", "graphs"):
                for model_file in _graph_model_files(Path(value).expanduser()):
                    inputs[model_file] = f"model file of --{dest} {value}"
    return inputs


def standard_output_file() -> tuple[int, int] | None:
    """(device, inode) of the regular file standard output goes to, or None (a pipe, a terminal, none): read
    before --json points file descriptor 1 at stderr."""
    import stat

    try:
        stdout = os.fstat(1)
    except OSError:
        return None
    return (stdout.st_dev, stdout.st_ino) if stat.S_ISREG(stdout.st_mode) else None


def _check_outputs_spare_stdout(outputs: list[tuple[str, str]], stdout_file: tuple[int, int] | None) -> None:
    """No file the command writes may be the file its standard output goes to: `placer simulate --json --trace
    /dev/stdout > out.json` renamed the trace over out.json, the report went to the replaced file, exit 0.
    (A pipe or a terminal is no regular file: output_file refuses those when parsed.)"""
    from graphs.errors import PlacerError

    for dest, value in outputs if stdout_file is not None else ():
        try:
            written = os.stat(Path(value).expanduser())
        except OSError:  # not there yet (or unreadable: writing it says why)
            continue
        if (written.st_dev, written.st_ino) == stdout_file:
            raise PlacerError(f"--{dest.replace('_', '-')} {value} is the file this command's standard output goes "
                              "to: writing it would replace the command's own report")


def _graph_model_files(graph_file: Path) -> list[Path]:
    """The files a real measurer reads to rebuild a graph file's step: a torch import's ``path.py`` (its
    source ``torch:path.py:FUNCTION``), an ONNX or OpenVINO import's model file (and an IR's ``.bin``),
    resolved; none for other graphs, or when the file is no readable graph file (loading it says why)."""
    from graphs.io import graph_file_header
    from graphs.specs import names_a_file

    header = graph_file_header(graph_file)
    if header is None:  # not a graph file: not this check's to say
        return []
    source, inner = str(header.get("source", "")), header.get("meta")
    model_file = inner.get("model_file") if isinstance(inner, dict) else None
    files = []
    target = source.removeprefix("torch:").rpartition(":")[0] if source.startswith("torch:") else ""
    if target and names_a_file(target):
        files.append(Path(target))
    if isinstance(model_file, str) and model_file:
        files += [Path(model_file)] + ([Path(model_file).with_suffix(".bin")] if model_file.endswith(".xml") else [])
    return [f.resolve() for f in files if f.is_file()]


def _machine_profile(machine_file: Path) -> Path | None:
    """The op-profile file a machine file names (``profile``, relative to the machine file's folder), resolved;
    None without one or when the file is not readable JSON (loading it says why, later)."""
    import json

    try:
        data = json.loads(machine_file.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    profile = data.get("profile") if isinstance(data, dict) else None
    return (machine_file.parent / profile).resolve() if isinstance(profile, str) and profile else None


def _check_outputs_outside_runs_read(args: argparse.Namespace) -> None:
    """No file the command writes may lie in a run folder it reads: `placer simulate --placement RUN --trace
    RUN/manifest.json` replaced the run's manifest with the trace."""
    from graphs.errors import PlacerError

    runs = {}
    for dest in RUN_FOLDER_ARGS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and (folder := _run_folder_of(Path(value).expanduser())) is not None:
            runs[folder] = (dest, value)
    for dest in OUTPUT_FILE_ARGS:
        value = getattr(args, dest, None)
        if not isinstance(value, str):
            continue
        for folder, (read_as, given) in runs.items():
            if lies_in(value, folder):
                raise PlacerError(f"--{dest.replace('_', '-')} {value} lies inside the run folder of "
                                  f"--{read_as.replace('_', '-')} {given}, which this command only reads: write "
                                  "it elsewhere")


CACHED = ("graphs", "models")  # the folders of placer's cache that hold what commands read (graphs.registry)


def _check_outputs_outside_cache(outputs: list[tuple[str, str]]) -> None:
    """No file the command writes may lie in placer's cache of graphs and model files: `placer profile --graph
    bert-base-infer -o CACHE/models/bert-base-infer-....onnx` replaced the model with the profile, and every
    real measurer's command on that benchmark failed from then on (the cached graph itself was fine, so the
    cache never rebuilt the model)."""
    from graphs.errors import PlacerError
    from graphs.registry import cache_dir

    try:
        folders = [(cache_dir() / name).resolve() for name in CACHED]
    except (RuntimeError, OSError):  # no home folder (a uid without one, HOME unset), a symbolic-link loop:
        return  # no cache this command could read either
    for dest, value in outputs:
        if any(lies_in(value, folder) for folder in folders):
            raise PlacerError(f"--{dest.replace('_', '-')} {value} lies in placer's cache ({cache_dir()}), which "
                              "holds the graphs and model files commands read: write it elsewhere")


def lies_in(path: str | Path, folder: Path) -> bool:
    """Whether ``path`` (``~`` expanded) is ``folder`` or lies anywhere below it (``folder`` resolved)."""
    resolved = Path(path).expanduser().resolve()
    return resolved == folder or folder in resolved.parents


def _run_folder_of(path: Path) -> Path | None:
    """The run folder a ``--placement`` names (cluster.run_best.placement_run_folder), resolved."""
    from cluster.run_best import placement_run_folder  # here: pandas and pyarrow load only for a placement given

    folder = placement_run_folder(path)
    return None if folder is None else folder.resolve()
