"""Benchmark names -> graphs, built on first use and cached on disk.

A benchmark is a function ``build(**config) -> OpGraph`` registered under a name. Built graphs are cached
under ``$PLACER_CACHE`` (default ``~/.cache/placer``), keyed by the name, the configuration, the
project's version and a digest of the ``graphs`` package's source, so a changed model, importer or cost
rule, or a new release, re-traces (a version bump alone was once forgotten, and the cache kept serving
inference graphs an importer fix had changed). ``family:KIND:SEED`` names
(graphs.families) are built and cached the same way, keyed by their drawn configuration.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from contextlib import suppress
from pathlib import Path

from graphs.benchmarks import BUILTIN, Benchmark
from graphs.errors import PlacerError
from graphs.families import KINDS, family_benchmark, is_family_name, parse_family_name
from graphs.files import is_dir, is_file
from graphs.io import FORMAT_VERSION, load_graph_file, save_graph
from graphs.opgraph import OpGraph

GRAPHS_VERSION = "4"  # bump when a construction changes outside the graphs package (4: Keras steps drop dead ops)


BENCHMARKS: dict[str, Benchmark] = {}


def register(benchmark: Benchmark) -> None:
    BENCHMARKS[benchmark.name] = benchmark


def cache_dir() -> Path:
    """``PLACER_CACHE``, else ``~/.cache/placer`` (an empty one too: it was the current folder, and run from
    the repository the cache went into the ``graphs`` package)."""
    return Path(os.environ.get("PLACER_CACHE") or Path.home() / ".cache" / "placer")


def _cache_path(benchmark: Benchmark) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    try:
        project_version = version("placer")
    except PackageNotFoundError:
        project_version = "dev"
    key = json.dumps([benchmark.name, benchmark.builder, benchmark.config, GRAPHS_VERSION, FORMAT_VERSION,
                      project_version, graphs_source_digest()], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]  # of the whole name: a long one is cut in the file's
    return cache_dir() / "graphs" / f"{benchmark.name[:CACHE_NAME_CHARS]}-{digest}.parquet"


CACHE_NAME_CHARS = 96  # of a benchmark's name in its cache file's (a family seed of 240 digits: "File name too long")


@functools.lru_cache(maxsize=1)
def graphs_source_digest() -> str:
    """A digest of every module of the ``graphs`` package (paths and bytes): what builds a benchmark."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cached_graph_path(name: str) -> Path | None:
    """Where benchmark ``name`` is cached on disk for this configuration and version, if it is."""
    benchmark = _find_benchmark(name)
    if benchmark is None:
        return None
    path = _cache_path(benchmark)
    return path if path.is_file() else None


def _find_benchmark(name: str) -> Benchmark | None:
    """The registered benchmark or the drawn family member ``name`` stands for; None for neither."""
    load_builtin_benchmarks()
    if is_family_name(name):
        return family_benchmark(name)
    return BENCHMARKS.get(name)


def benchmark_graph(name: str, use_cache: bool = True) -> OpGraph:
    """Build (or read from the cache) the benchmark called ``name``."""
    load_builtin_benchmarks()
    if name.startswith("synthetic:"):
        from graphs.synthetic import synthetic_from_spec

        return synthetic_from_spec(name)
    benchmark = _find_benchmark(name)
    if benchmark is None:
        raise _unknown_graph(name)
    path = _cache_path(benchmark)
    if use_cache and path.is_file():
        try:
            cached = load_graph_file(path)
            if _model_file_present(cached):  # an inference benchmark's model file cleared away: built again
                return cached
        except PlacerError:
            pass  # a damaged cache entry is rebuilt
        with suppress(OSError):  # a cache this user cannot write: built and used, and said so below
            path.unlink(missing_ok=True)
    graph = benchmark.build()
    if use_cache:
        try:
            save_graph(graph, path)
        except (OSError, PlacerError) as exc:  # the graph is built: use it, and say why the next command builds it
            # again (a PlacerError: something not a file where the entry goes, a folder made by hand)
            why = getattr(exc, "strerror", None) or exc
            print(f"placer: note: {name} is not cached: cannot write the graph cache {path.parent} ({why}); set "
                  "PLACER_CACHE to a folder this user can write", file=sys.stderr)
    return graph


def _model_file_present(graph: OpGraph) -> bool:
    """Whether the model file a cached graph names (an inference benchmark's ONNX or IR, kept in the cache's
    models folder, which a user may clear to win back its space), if any, is there."""
    model_file = graph.meta.get("model_file")
    if not isinstance(model_file, str) or not model_file:
        return True
    weights = [Path(model_file).with_suffix(".bin")] if model_file.endswith(".xml") else []  # an IR's weights
    return all(path.is_file() for path in [Path(model_file), *weights])


def _unknown_graph(name: str) -> PlacerError:
    what = "a folder, not a graph file, and not" if name and is_dir(Path(name)) else "not a file and not"
    return PlacerError(f"unknown graph {name!r}: {what} a benchmark "
                       f"(benchmarks: {', '.join(sorted(BENCHMARKS))}, synthetic:N[:SEED], "
                       f"family:KIND:SEED with KIND one of {', '.join(KINDS)})")


def _names_a_file(name_or_file: str) -> bool:
    return os.path.sep in name_or_file or name_or_file.endswith(".parquet") or is_file(Path(name_or_file))


def load_graph(name_or_file: str) -> OpGraph:
    """A graph file path or a benchmark name; one PlacerError otherwise."""
    if _names_a_file(name_or_file):
        return load_graph_file(name_or_file)
    return benchmark_graph(name_or_file)


def check_graph_name(name_or_file: str) -> None:
    """The PlacerError ``load_graph`` would raise for a name that names no graph, without building a
    benchmark (a command checks its flags before it starts anything; building nmt-2 takes seconds). A
    graph file is read: its damage only shows then."""
    if _names_a_file(name_or_file):
        load_graph_file(name_or_file)
        return
    if name_or_file.startswith("synthetic:"):
        from graphs.synthetic import parse_synthetic_spec

        parse_synthetic_spec(name_or_file)
        return
    if is_family_name(name_or_file):
        parse_family_name(name_or_file)
        return
    load_builtin_benchmarks()
    if name_or_file not in BENCHMARKS:
        raise _unknown_graph(name_or_file)


def list_benchmarks() -> list[Benchmark]:
    load_builtin_benchmarks()
    return [BENCHMARKS[name] for name in sorted(BENCHMARKS)]


def load_builtin_benchmarks() -> None:
    """Serve the built-in benchmarks (graphs/benchmarks) beside any a user registered."""
    for benchmark in BUILTIN:
        BENCHMARKS.setdefault(benchmark.name, benchmark)
