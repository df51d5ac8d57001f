"""The OpGraph IR and its file format: validation, canonical edges, hashing, exact round trip, bad files."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphs.errors import PlacerError
from graphs.io import FORMAT_VERSION, load_graph_file, save_graph
from graphs.opgraph import ANY_DEVICE, PHASE_CODE, OpGraph, kind_bit
from graphs.registry import load_graph
from conftest import build_graph


def _diamond(**overrides) -> OpGraph:
    """a -> b, a -> c, b -> d, c -> d with hand-picked sizes."""
    fields = dict(
        name="diamond", framework="manual",
        op_names=np.array(["a", "b", "c", "d"], dtype=object),
        op_kinds=np.array(["Input", "aten.mm", "aten.relu", "aten.add"], dtype=object),
        flops=np.array([0.0, 2e9, 1e6, 1e6]),
        bytes_accessed=np.array([0.0, 3e6, 2e6, 3e6]),
        out_bytes=np.array([1000, 2000, 3000, 4000]),
        param_bytes=np.array([0, 512, 0, 0]),
        edge_src=np.array([2, 0, 1, 0]), edge_dst=np.array([3, 1, 3, 2]), edge_bytes=np.array([3000, 1000, 2000, 1000]),
        colocation=np.array([0, 1, 1, 2]),
        scopes=np.array(["", "layer0", "layer0", "head"], dtype=object),
        phases=np.array([PHASE_CODE["other"], PHASE_CODE["forward"], PHASE_CODE["forward"], PHASE_CODE["backward"]]),
        allowed_mask=np.array([ANY_DEVICE, ANY_DEVICE, kind_bit("gpu"), ANY_DEVICE]),
        batch_size=8, num_params=128, source="hand-made",
    )
    fields.update(overrides)
    return OpGraph(**fields)


def test_opgraph__edges_are_sorted_and_duplicates_merged_keeping_the_larger_tensor():
    graph = _diamond(edge_src=np.array([2, 0, 1, 0, 0]), edge_dst=np.array([3, 1, 3, 2, 1]),
                     edge_bytes=np.array([3000, 1000, 2000, 1000, 1500]))
    assert graph.edge_src.tolist() == [0, 0, 1, 2]
    assert graph.edge_dst.tolist() == [1, 2, 3, 3]
    assert graph.edge_bytes.tolist() == [1500, 1000, 2000, 3000]
    assert graph.topo_order.tolist() == [0, 1, 2, 3]


def test_opgraph__summary_figures():
    summary = _diamond().summary()
    assert (summary["ops"], summary["edges"], summary["flops"]) == (4, 4, 2e9 + 2e6)
    assert (summary["params"], summary["param_bytes"], summary["groups"]) == (128, 512, 3)


def test_opgraph__csr_views_list_successors_and_predecessors():
    graph = _diamond()
    offsets, ids = graph.pred_csr
    assert sorted(graph.edge_src[ids[offsets[3]:offsets[4]]].tolist()) == [1, 2]
    offsets, ids = graph.succ_csr
    assert sorted(graph.edge_dst[ids[offsets[0]:offsets[1]]].tolist()) == [1, 2]


@pytest.mark.parametrize("overrides, problem", [
    ({"edge_src": np.array([0, 1, 3]), "edge_dst": np.array([1, 3, 1]), "edge_bytes": np.array([1, 1, 1])}, "cycle"),
    ({"edge_src": np.array([0, 2]), "edge_dst": np.array([2, 2]), "edge_bytes": np.array([1, 1])}, "feeds itself"),
    ({"edge_src": np.array([0]), "edge_dst": np.array([7]), "edge_bytes": np.array([1])}, "outside 0..3"),
    ({"out_bytes": np.array([1, -2, 3, 4])}, "out_bytes[1] is negative"),
    ({"flops": np.array([0.0, np.nan, 0.0, 0.0])}, "non-finite"),
    ({"op_names": np.array(["a", "b", "b", "d"], dtype=object)}, "'b' is not unique"),
    # the hash joins names with NUL: ["x\0y", "z"] and ["x", "y\0z"] hashed alike
    ({"op_names": np.array(["a", "b\0c", "d", "e"], dtype=object)}, r"op_names entry 'b\x00c' holds a control"),
    ({"scopes": np.array(["", "s\1", "", ""], dtype=object)}, r"scopes entry 's\x01' holds a control"),
    ({"param_bytes": np.array([0, 1, 2])}, "param_bytes has 3 entries for 4 ops"),
    ({"allowed_mask": np.array([0, 3, 3, 3])}, "allowed_mask"),
    ({"out_bytes": np.array([1.5, 2, 3, 4])}, "whole numbers"),
    # found later, naming no file, or shown as inf: a reviewer's hand-edited graph files
    ({"flops": np.full(4, 1e308)}, "flops totals more than a float holds"),
    ({"colocation": np.array([0, 0, 2, 3]), "allowed_mask": np.array([1, 2, 3, 3])},
     "colocation group of ops 'a', 'b' has no device kind allowed for all of its ops"),
])
def test_opgraph__bad_graph_is_one_clear_error(overrides, problem):
    with pytest.raises(PlacerError, match="diamond") as info:
        _diamond(**overrides)
    assert problem in str(info.value)


@pytest.mark.parametrize("short_key", ["edge_src", "edge_dst", "edge_bytes"])
@pytest.mark.parametrize("change", [-1, 1])
def test_opgraph__edge_arrays_of_different_lengths_are_one_clear_error(short_key, change):
    """Checked before the edges are sorted: a short array was an IndexError, a long edge_bytes was cut to fit."""
    base = _diamond()
    array = getattr(base, short_key)
    resized = array[:-1] if change < 0 else np.append(array, array[-1])
    with pytest.raises(PlacerError, match="diamond'.*edge arrays differ in length"):
        _diamond(**{short_key: resized.copy()})


def test_io__in_bytes_lists_shorter_or_longer_than_in_src_are_one_clear_error(tmp_path):
    """A file whose in_bytes list for an op is one short raised an IndexError traceback."""
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    table = pq.read_table(path)
    index = table.schema.get_field_index("in_bytes")
    for change in (-1, 1):
        in_bytes = table.column("in_bytes").to_pylist()
        in_bytes[3] = in_bytes[3][:-1] if change < 0 else in_bytes[3] + [7]
        edited = table.set_column(index, "in_bytes", pa.array(in_bytes, pa.list_(pa.int64())))
        pq.write_table(edited.replace_schema_metadata(table.schema.metadata), path)
        with pytest.raises(PlacerError, match="g.parquet' \\(damaged, or edited without its content hash\\): op 3's "
                                              "in_src and in_bytes lists differ in length"):
            load_graph_file(path)


@pytest.mark.parametrize("overrides, problem", [
    ({"phases": np.array([256, 0, 0, 1])}, "field 'phases' holds 256, outside int8's -128..127"),  # was phase 0
    ({"allowed_mask": np.array([257, 3, 3, 3])}, "field 'allowed_mask' holds 257, outside uint8's 0..255"),
    ({"allowed_mask": np.array([-255, 3, 3, 3])}, "field 'allowed_mask' holds -255, outside uint8"),  # was 1
    ({"out_bytes": np.array([2**63 + 5, 1, 1, 1], dtype=np.uint64)}, "field 'out_bytes' holds 9223372036854775813"),
    ({"op_names": np.array([None, "b", "c", "d"], dtype=object)}, "op_names[0] is None, not a string"),
    ({"op_kinds": np.array(["Input", 1, "x", "y"], dtype=object)}, "op_kinds[1] is 1, not a string"),
    ({"scopes": np.array(["", "l", None, "h"], dtype=object)}, "scopes[2] is None, not a string"),
    ({"batch_size": -4}, "batch_size must be a whole number >= 0, got -4"),  # saved, then refused on load
    ({"batch_size": 2.5}, "batch_size must be a whole number >= 0, got 2.5"),
    ({"num_params": True}, "num_params must be a whole number >= 0, got True"),
])
def test_opgraph__values_a_narrowing_cast_would_wrap_and_non_strings_are_refused(overrides, problem):
    with pytest.raises(PlacerError, match="diamond") as info:
        _diamond(**overrides)
    assert problem in str(info.value)


def test_opgraph__numpy_integer_counts_become_ints_and_save(tmp_path):
    """np.int64 batch_size broke save_graph (not JSON serializable)."""
    graph = _diamond(batch_size=np.int64(32), num_params=np.int32(7))
    assert type(graph.batch_size) is int and type(graph.num_params) is int
    loaded = load_graph_file(save_graph(graph, tmp_path / "g.parquet"))
    assert (loaded.batch_size, loaded.num_params) == (32, 7)


def test_opgraph__numpy_values_in_meta_become_plain_and_save(tmp_path):
    """np.int64 in meta broke save_graph (not JSON serializable); the round trip keeps every value."""
    meta = {"scale": np.float64(1.5), "steps": np.int64(3), "half": np.float32(0.5), "fused": np.bool_(True),
            "shape": np.array([1, 3, 8]), "nested": {"sizes": (np.int32(2), 4), "kind": np.str_("conv")}}
    graph = _diamond(meta=meta)
    plain = {"scale": 1.5, "steps": 3, "half": 0.5, "fused": True, "shape": [1, 3, 8],
             "nested": {"sizes": [2, 4], "kind": "conv"}}
    assert graph.meta == plain and type(graph.meta["steps"]) is int and type(graph.meta["fused"]) is bool
    loaded = load_graph_file(save_graph(graph, tmp_path / "g.parquet"))
    assert loaded.meta == plain and type(loaded.meta["steps"]) is int
    graph.meta["added"] = np.int64(7)  # meta is a dict: a value added after construction saves too
    assert load_graph_file(save_graph(graph, tmp_path / "g.parquet")).meta["added"] == 7


@pytest.mark.parametrize("meta, problem", [
    ({"notes": {"a", "b"}}, "meta['notes'] is {"),
    ({"shapes": [[1, object()]]}, "meta['shapes'][0][1] is <object"),
    ({"by_id": {1: "x"}}, "meta['by_id'] has the key 1, not a string"),
    ("notes", "meta must be a dict, got str"),
])
def test_opgraph__meta_json_cannot_hold_is_one_clear_error(meta, problem):
    with pytest.raises(PlacerError, match="diamond") as info:
        _diamond(meta=meta)
    assert problem in str(info.value)


def test_io__meta_changed_after_construction_to_what_json_cannot_hold_is_a_clear_error(tmp_path):
    graph = _diamond()
    graph.meta["when"] = object()
    with pytest.raises(PlacerError, match=r"graph 'diamond': meta\['when'\] is <object"):
        save_graph(graph, tmp_path / "g.parquet")
    assert not (tmp_path / "g.parquet").exists()


def test_opgraph__hash_changes_with_content_and_not_with_edge_order():
    base = _diamond()
    reordered = _diamond(edge_src=base.edge_src[::-1].copy(), edge_dst=base.edge_dst[::-1].copy(),
                         edge_bytes=base.edge_bytes[::-1].copy())
    heavier = _diamond(flops=np.array([0.0, 3e9, 1e6, 1e6]))
    assert base.content_hash == reordered.content_hash != heavier.content_hash


def test_io__round_trip_is_exact(tmp_path):
    graph = _diamond(meta={"note": "x"})
    loaded = load_graph_file(save_graph(graph, tmp_path / "g.parquet"))
    assert loaded.content_hash == graph.content_hash
    for key in ("op_names", "op_kinds", "scopes", "flops", "bytes_accessed", "out_bytes", "param_bytes",
                "colocation", "phases", "allowed_mask", "edge_src", "edge_dst", "edge_bytes"):
        assert np.array_equal(getattr(loaded, key), getattr(graph, key)), key
        assert getattr(loaded, key).dtype == getattr(graph, key).dtype, key
    assert (loaded.name, loaded.batch_size, loaded.num_params, loaded.meta) == ("diamond", 8, 128, {"note": "x"})


def test_io__file_is_readable_without_project_code(tmp_path):
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    frame = pq.read_table(path).to_pandas()
    assert frame["name"].tolist() == ["a", "b", "c", "d"]
    assert [list(x) for x in frame["in_src"]] == [[], [0], [0], [1, 2]]


def test_io__a_saved_graph_gets_the_permissions_the_umask_gives(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        graph_file = save_graph(_diamond(), tmp_path / "g.parquet")
    finally:
        os.umask(old)
    assert oct(graph_file.stat().st_mode & 0o777) == "0o644"  # not mkstemp's 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["g.parquet"]  # no temporary left


def test_io__saving_to_a_folder_or_saving_what_is_not_a_graph_is_a_clear_error(tmp_path):
    with pytest.raises(PlacerError, match="is a folder, not a file"):
        save_graph(_diamond(), tmp_path)
    with pytest.raises(PlacerError, match="needs an OpGraph, not dict"):
        save_graph({"ops": []}, tmp_path / "g.parquet")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_io__truncated_file_is_a_clear_error(tmp_path):
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(PlacerError, match="g.parquet.*damaged"):
        load_graph_file(path)


def test_io__wrong_version_and_foreign_parquet_are_clear_errors(tmp_path):
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"placer.opgraph"])
    meta["format_version"] = FORMAT_VERSION + 1
    pq.write_table(table.replace_schema_metadata({b"placer.opgraph": json.dumps(meta).encode()}), path)
    with pytest.raises(PlacerError, match=f"format version {FORMAT_VERSION + 1}"):
        load_graph_file(path)
    pq.write_table(table.replace_schema_metadata({}), path)
    with pytest.raises(PlacerError, match="not a placer graph"):
        load_graph_file(path)
    for junk in (b"{not json", b"[1, 2]"):
        pq.write_table(table.replace_schema_metadata({b"placer.opgraph": junk}), path)
        with pytest.raises(PlacerError, match="g.parquet' is damaged: its metadata is not a JSON object"):
            load_graph_file(path)


def test_io__odd_versions_duplicate_columns_and_a_missing_hash_are_named(tmp_path):
    """``true`` and 1.0 read as version 1; a duplicate column was pyarrow's 18-line schema dump; a missing
    hash was "does not match the recorded None"."""
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"placer.opgraph"])
    for version in (True, 1.0):
        pq.write_table(table.replace_schema_metadata({b"placer.opgraph": json.dumps(
            {**meta, "format_version": version}).encode()}), path)
        with pytest.raises(PlacerError, match=f"format version {json.dumps(version)}; this placer reads version 1"):
            load_graph_file(path)
    pq.write_table(table.replace_schema_metadata({b"placer.opgraph": json.dumps(
        {k: v for k, v in meta.items() if k != "content_hash"}).encode()}), path)
    with pytest.raises(PlacerError, match=f"records no content hash: .*needs content_hash \\({meta['content_hash']} "):
        load_graph_file(path)
    doubled = table.append_column("flops", table.column("flops")).replace_schema_metadata(table.schema.metadata)
    pq.write_table(doubled, path)
    with pytest.raises(PlacerError, match="g.parquet': column 'flops' appears twice$"):
        load_graph_file(path)


def test_io__a_bad_value_under_a_recorded_hash_may_be_damage_and_says_so(tmp_path):
    """Flipped bytes decode as a negative flops or a repeated name: the error blamed the content alone."""
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    table = pq.read_table(path)
    flops = pa.array([-1.0] + table.column("flops").to_pylist()[1:])
    edited = table.set_column(table.schema.get_field_index("flops"), "flops", flops)
    pq.write_table(edited.replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(PlacerError, match="g.parquet' \\(damaged, or edited without its content hash\\): .*negative"):
        load_graph_file(path)


@pytest.mark.parametrize("key, value, expected", [
    ("name", 7, "a string"), ("name", None, "a string"), ("framework", ["tf"], "a string"),
    ("source", 5, "a string"), ("meta", [1], "a JSON object"), ("meta", "x", "a JSON object"),
    ("batch_size", -5, "a whole number >= 0"), ("num_params", 1.5, "a whole number >= 0")])
def test_io__a_metadata_field_of_the_wrong_type_is_one_error(tmp_path, key, value, expected):
    """The metadata is outside the content hash, so a hand edit passes it; ``source`` 5 or ``meta`` [1] used to
    load and then fail ``placer measure`` with an AttributeError."""
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    table = pq.read_table(path)
    meta = {**json.loads(table.schema.metadata[b"placer.opgraph"]), key: value}
    pq.write_table(table.replace_schema_metadata({b"placer.opgraph": json.dumps(meta).encode()}), path)
    with pytest.raises(PlacerError, match=f"g.parquet': its metadata's '{key}' is .*, not {expected}$"):
        load_graph_file(path)


@pytest.mark.parametrize("column, make, expected", [
    ("flops", None, "it has no column 'flops'"),
    ("flops", lambda t: pa.array([str(v) for v in t.to_pylist()]), "its column 'flops' holds string, not numbers"),
    ("flops", lambda t: pa.array([None, *t.to_pylist()[1:]], pa.float64()), "its column 'flops' has 1 null value"),
    ("param_bytes", lambda t: pa.array([v > 0 for v in t.to_pylist()]), "its column 'param_bytes' holds bool, not numbers"),
    ("in_src", lambda t: pa.array([(v or [0])[0] for v in t.to_pylist()]), "its column 'in_src' holds int64, not lists of numbers"),
    ("in_src", lambda t: pa.array([[None] * len(v) for v in t.to_pylist()], pa.list_(pa.int64())),
     "its column 'in_src' has 4 null value"),
    ("name", lambda t: pa.array([v.encode() for v in t.to_pylist()], pa.binary()), "its column 'name' holds binary, not text")])
def test_io__a_hand_made_column_missing_or_of_another_kind_is_named(tmp_path, column, make, expected):
    """Such files were refused with pyarrow's own words ("zero_copy_only was True", "'flops'")."""
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    table = pq.read_table(path)
    index = table.schema.get_field_index(column)
    edited = table.remove_column(index) if make is None else table.set_column(index, column, make(table.column(column)))
    pq.write_table(edited, path)
    with pytest.raises(PlacerError, match=f"g.parquet': {expected}"):
        load_graph_file(path)


def test_io__a_null_input_list_is_an_op_without_inputs_and_string_view_text_loads(tmp_path):
    """pandas writes None for an op's empty input list, and newer pyarrow may read text as string_view: both
    loaded before the column check, which refused them."""
    graph = _diamond()
    path = save_graph(graph, tmp_path / "g.parquet")
    table = pq.read_table(path)
    for column in ("in_src", "in_bytes"):
        lists = table.column(column).to_pylist()
        assert lists[0] == []  # op a has no inputs
        index = table.schema.get_field_index(column)
        table = table.set_column(index, column, pa.array([None, *lists[1:]], table.schema.field(column).type))
    index = table.schema.get_field_index("name")
    table = table.set_column(index, "name", table.column("name").cast(pa.string_view()))
    pq.write_table(table, path)
    assert load_graph_file(path).content_hash == graph.content_hash


def test_io__a_dictionary_encoded_text_column_loads_as_its_values(tmp_path):
    """pandas writes a categorical column dictionary-encoded; the graph is the same."""
    graph = _diamond()
    path = save_graph(graph, tmp_path / "g.parquet")
    table = pq.read_table(path)
    index = table.schema.get_field_index("kind")
    pq.write_table(table.set_column(index, "kind", table.column("kind").dictionary_encode()), path)
    assert pa.types.is_dictionary(pq.read_table(path).schema.field("kind").type)
    assert load_graph_file(path).content_hash == graph.content_hash


def test_validate__byte_totals_past_a_64_bit_count_are_refused():
    """Each op's 2**62 parameter bytes are valid alone; their total wrapped to a negative count and a placement
    that cannot fit simulated as ok."""
    graph = _diamond()
    with pytest.raises(PlacerError, match="param_bytes totals 1.8.e\\+19 bytes, more than a graph counts"):
        replace(graph, param_bytes=np.full(graph.num_ops, 2**62, dtype=np.int64))


def test_io__edited_content_fails_the_hash_and_a_cycle_is_named(tmp_path):
    path = save_graph(_diamond(), tmp_path / "g.parquet")
    table = pq.read_table(path)
    flops = table.column("flops").to_numpy().copy()
    flops[1] = 1.0
    pq.write_table(table.set_column(table.schema.get_field_index("flops"), "flops", [flops]), path)
    with pytest.raises(PlacerError, match="content hash"):
        load_graph_file(path)
    in_src = table.column("in_src").to_pylist()
    in_src[0] = [3]  # a <- d closes a cycle
    in_bytes = table.column("in_bytes").to_pylist()
    in_bytes[0] = [4000]
    cyclic = table.set_column(table.schema.get_field_index("in_src"), "in_src", pa.array(in_src))
    cyclic = cyclic.set_column(table.schema.get_field_index("in_bytes"), "in_bytes", pa.array(in_bytes))
    pq.write_table(cyclic, path)
    with pytest.raises(PlacerError, match="g.parquet.*cycle"):
        load_graph_file(path)


def test_registry__missing_file_and_unknown_name_are_clear_errors(tmp_path):
    with pytest.raises(PlacerError, match="does not exist"):
        load_graph(str(tmp_path / "nope.parquet"))
    with pytest.raises(PlacerError, match="unknown graph 'nmt-3'"):
        load_graph("nmt-3")


def test_topo_position_is_the_inverse_of_topo_order_and_read_only():
    graph = build_graph([(3, 1), (1, 0), (2, 0), (4, 2)], 5)
    position = graph.topo_position
    assert np.array_equal(position[graph.topo_order], np.arange(5))
    assert all(position[u] < position[v] for u, v in zip(graph.edge_src, graph.edge_dst))
    assert not position.flags.writeable


def test_opgraph__summary_counts_the_forward_flops_apart():
    """A training step's FLOPs are forward, backward and update together; the forward alone is what a model's
    own count (2 x in x out x batch per Linear) gives."""
    assert _diamond().summary()["forward_flops"] == 2e9 + 1e6


def test_opgraph__a_graph_of_no_ops_is_refused():
    """A graph file of 0 ops was shown and exported; simulate then said "has no ops", naming no file."""
    empty = {key: np.array([], dtype=dtype) for key, dtype in
             (("op_kinds", object), ("flops", np.float64), ("bytes_accessed", np.float64), ("out_bytes", np.int64),
              ("param_bytes", np.int64), ("colocation", np.int64), ("scopes", object), ("phases", np.int8),
              ("allowed_mask", np.uint8), ("op_names", object), ("edge_src", np.int64), ("edge_dst", np.int64),
              ("edge_bytes", np.int64))}
    with pytest.raises(PlacerError, match="graph 'diamond' has no ops"):
        _diamond(**empty)
