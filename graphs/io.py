"""Save and load an OpGraph as one Parquet file (one row per op; in-edges as list columns).

The file is readable without project code (pandas, pyarrow, DuckDB). Its schema metadata carries the
format version, the graph's metadata and its content hash; loading recomputes the hash, so a damaged
file is an error, never a silently different graph.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.errors import PlacerError, is_whole_number, one_line
from graphs.files import atomic_file, file_problem
from graphs.opgraph import OpGraph, checked_meta

FORMAT_VERSION = 1
_META_KEY = b"placer.opgraph"


def save_graph(graph: OpGraph, path: str | os.PathLike) -> Path:
    """Write ``graph`` to ``path`` atomically (temp file, then rename). Returns the path."""
    if not isinstance(graph, OpGraph):
        raise PlacerError(f"save_graph needs an OpGraph, not {type(graph).__name__}")
    path = Path(path)
    if path.is_dir():
        raise PlacerError(f"graph file {str(path)!r} is a folder, not a file")
    offsets, edge_ids = graph.pred_csr
    in_src = pa.ListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(graph.edge_src[edge_ids]))
    in_bytes = pa.ListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(graph.edge_bytes[edge_ids]))
    table = pa.table({
        "name": pa.array(list(graph.op_names), pa.string()),
        "kind": pa.array(list(graph.op_kinds), pa.string()),
        "scope": pa.array(list(graph.scopes), pa.string()),
        "phase": pa.array(graph.phases, pa.int8()),
        "flops": pa.array(graph.flops, pa.float64()),
        "bytes_accessed": pa.array(graph.bytes_accessed, pa.float64()),
        "out_bytes": pa.array(graph.out_bytes, pa.int64()),
        "param_bytes": pa.array(graph.param_bytes, pa.int64()),
        "colocation": pa.array(graph.colocation, pa.int64()),
        "allowed_mask": pa.array(graph.allowed_mask, pa.uint8()),
        "in_src": in_src,
        "in_bytes": in_bytes,
    })
    meta = {
        "format_version": FORMAT_VERSION,
        "name": graph.name,
        "framework": graph.framework,
        "batch_size": graph.batch_size,
        "num_params": graph.num_params,
        "source": graph.source,
        "meta": checked_meta(graph.name, graph.meta),  # changed since construction? still plain JSON
        "content_hash": graph.content_hash,
    }
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def graph_file_header(path: str | os.PathLike) -> dict | None:
    """A graph file's metadata (name, source, meta, ...) from its Parquet footer alone, without loading or
    checking the graph; None where it is no readable graph file (load_graph_file says why)."""
    try:
        header = json.loads(pq.read_schema(path).metadata[_META_KEY])
    except Exception:  # pyarrow raises several types for a missing, damaged or foreign file
        return None
    return header if isinstance(header, dict) else None


MODEL_SUFFIXES = {".onnx": "--onnx", ".xml": "--openvino", ".keras": "--keras", ".h5": "--keras",
                  ".pt": "--torch", ".py": "--torch"}  # model files a user may pass where a graph file goes


def _import_hint(path: Path) -> str:
    """For a model file given as a graph file: the `placer graphs import` that makes one from it."""
    flag = MODEL_SUFFIXES.get(path.suffix.lower())
    return f" (a model file? `placer graphs import {flag} ...` makes a graph file from one)" if flag else ""


def load_graph_file(path: str | os.PathLike) -> OpGraph:
    """Read a graph file written by save_graph; any problem is one PlacerError naming the file."""
    path = Path(path)
    if problem := file_problem(path):
        raise PlacerError(f"graph file {str(path)!r} {problem}")
    try:
        _check_unique_columns(pq.read_schema(path))  # read_table's own error dumped the whole schema
        table = pq.read_table(path)
    except PlacerError as exc:
        raise PlacerError(f"graph file {str(path)!r}: {exc}") from None
    except Exception as exc:  # pyarrow raises several types for truncated / non-Parquet files
        raise PlacerError(f"graph file {str(path)!r} is damaged or not a graph file: {one_line(exc)}"
                          f"{_import_hint(path)}") from None
    raw = (table.schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise PlacerError(f"graph file {str(path)!r} is a Parquet file but not a placer graph (no metadata)")
    try:
        meta = json.loads(raw)
        version = meta.get("format_version")
    except (ValueError, AttributeError) as exc:
        raise PlacerError(f"graph file {str(path)!r} is damaged: its metadata is not a JSON object ({exc})") from None
    if type(version) is not int or version != FORMAT_VERSION:  # true and 1.0 equal 1 in Python
        raise PlacerError(f"graph file {str(path)!r} has format version {json.dumps(version)}; "
                          f"this placer reads version {FORMAT_VERSION}")
    recorded = meta.get("content_hash")
    try:
        _check_header(meta)  # the metadata is outside the hash
        _check_columns(table)  # a column of another kind, or nulls: a hand-made file, not flipped bytes
    except PlacerError as exc:
        raise PlacerError(f"graph file {str(path)!r}: {exc}") from None
    try:
        graph = _graph_from_table(table, meta, path)
        content_hash = graph.content_hash
    except PlacerError as exc:  # with a hash recorded, flipped bytes read as a bad value: say both
        maybe = " (damaged, or edited without its content hash)" if isinstance(recorded, str) else ""
        raise PlacerError(f"graph file {str(path)!r}{maybe}: {exc}") from None
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
        raise PlacerError(f"graph file {str(path)!r} is malformed: {one_line(exc)}") from None
    if recorded is None:
        raise PlacerError(f"graph file {str(path)!r} records no content hash: its metadata needs content_hash "
                          f"({graph.content_hash} for the graph it holds)")
    if content_hash != recorded:
        shown = recorded if isinstance(recorded, str) else json.dumps(recorded)
        raise PlacerError(f"graph file {str(path)!r} is damaged: content hash {graph.content_hash} "
                          f"does not match the recorded {shown}")
    return graph


def _check_unique_columns(schema: pa.Schema) -> None:
    seen: set[str] = set()
    for name in schema.names:
        if name in seen:
            raise PlacerError(f"column {name!r} appears twice")
        seen.add(name)


def _check_header(meta: dict) -> None:
    """The metadata's fields have their types (they are not in the content hash: a hand edit passes it)."""
    expected = {"name": (str, "a string"), "framework": (str, "a string"), "source": (str, "a string"),
                "meta": (dict, "a JSON object")}
    for key, (kind, noun) in expected.items():
        if (key in meta or key in ("name", "framework")) and not isinstance(meta.get(key), kind):
            raise PlacerError(f"its metadata's {key!r} is {json.dumps(meta.get(key))}, not {noun}")
    for key in ("batch_size", "num_params"):
        if not is_whole_number(meta.get(key)) or meta[key] < 0:
            raise PlacerError(f"its metadata's {key!r} is {json.dumps(meta.get(key))}, not a whole number >= 0")


_TEXT_COLUMNS = ("name", "kind", "scope")
_NUMBER_COLUMNS = ("phase", "flops", "bytes_accessed", "out_bytes", "param_bytes", "colocation", "allowed_mask")
_LIST_COLUMNS = ("in_src", "in_bytes")


def _check_columns(table: pa.Table) -> None:
    """Every column save_graph writes is there, of its kind (text, numbers, lists of numbers) and without
    nulls: a hand-made file's problem named, not pyarrow's conversion error."""
    missing = [name for name in (*_TEXT_COLUMNS, *_NUMBER_COLUMNS, *_LIST_COLUMNS) if name not in table.column_names]
    if missing:
        raise PlacerError(f"it has no column {', '.join(map(repr, missing))}")
    is_number = lambda kind: pa.types.is_integer(kind) or pa.types.is_floating(kind)  # noqa: E731
    for name in (*_TEXT_COLUMNS, *_NUMBER_COLUMNS, *_LIST_COLUMNS):
        column = table.column(name)
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type  # pandas' categories
        if name in _TEXT_COLUMNS:
            ok = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            noun = "text"
        elif name in _NUMBER_COLUMNS:
            ok, noun = is_number(kind), "numbers"
        else:
            ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and is_number(kind.value_type)
            noun = "lists of numbers"
        if not ok:
            raise PlacerError(f"its column {name!r} holds {kind}, not {noun}")
        # a null list is an op without inputs (pandas writes None for []); a null inside one is no input
        nulls = column.combine_chunks().flatten().null_count if name in _LIST_COLUMNS else column.null_count
        if nulls:
            raise PlacerError(f"its column {name!r} has {nulls} null value(s)")


def _plain(array: pa.Array) -> pa.Array:
    """A dictionary-encoded column (pandas' categories) as its values."""
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _graph_from_table(table: pa.Table, meta: dict, path: Path) -> OpGraph:
    """The graph of a table whose columns ``_check_columns`` passed."""
    columns = {name: _plain(table.column(name).combine_chunks()) for name in table.column_names}
    in_src, in_bytes = columns["in_src"], columns["in_bytes"]
    lengths = in_src.value_lengths().fill_null(0).to_numpy()
    byte_lengths = in_bytes.value_lengths().fill_null(0).to_numpy()
    if len(byte_lengths) != len(lengths) or np.any(byte_lengths != lengths):
        bad = int(np.flatnonzero(byte_lengths != lengths)[0]) if len(byte_lengths) == len(lengths) else 0
        raise PlacerError(f"op {bad}'s in_src and in_bytes lists differ in length")
    edge_dst = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    return OpGraph(
        name=meta["name"],
        framework=meta["framework"],
        op_names=np.array(columns["name"].to_pylist(), dtype=object),
        op_kinds=np.array(columns["kind"].to_pylist(), dtype=object),
        scopes=np.array(columns["scope"].to_pylist(), dtype=object),
        phases=columns["phase"].to_numpy(),
        flops=columns["flops"].to_numpy(),
        bytes_accessed=columns["bytes_accessed"].to_numpy(),
        out_bytes=columns["out_bytes"].to_numpy(),
        param_bytes=columns["param_bytes"].to_numpy(),
        colocation=columns["colocation"].to_numpy(),
        allowed_mask=columns["allowed_mask"].to_numpy(),
        edge_src=in_src.flatten().to_numpy(),
        edge_dst=edge_dst,
        edge_bytes=in_bytes.flatten().to_numpy(),
        batch_size=meta["batch_size"],
        num_params=meta["num_params"],
        source=meta.get("source", str(path)),
        meta=meta.get("meta", {}),
    )
