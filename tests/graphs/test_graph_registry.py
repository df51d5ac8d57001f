"""Graph names: check_graph_name refuses what load_graph refuses, without building a benchmark."""

from __future__ import annotations

import pytest

from graphs.errors import PlacerError
from graphs.registry import check_graph_name, load_graph


@pytest.mark.parametrize("name, message", [
    ("nmt-3", "unknown graph 'nmt-3'"),
    ("synthetic:abc", "bad synthetic graph name"),
    ("synthetic:0", "synthetic graphs have 1..20000000 ops, not 0"),
    ("no/such/file.parquet", "does not exist"),
])
def test_check_graph_name__refuses_what_load_graph_refuses(name, message):
    with pytest.raises(PlacerError, match=message):
        check_graph_name(name)
    with pytest.raises(PlacerError, match=message):
        load_graph(name)


def test_check_graph_name__accepts_benchmarks_without_building_them(monkeypatch):
    from graphs import registry

    def no_build(*args, **kwargs):
        raise AssertionError("a check must not build or read a benchmark")

    monkeypatch.setattr(registry, "benchmark_graph", no_build)
    monkeypatch.setattr("graphs.synthetic.synthetic_graph", no_build)
    for name in ("nmt-2", "rnnlm", "inception-v3", "synthetic:300", "synthetic:300:7"):
        check_graph_name(name)


def test_check_graph_name__reads_a_graph_file(tmp_path):
    from graphs.io import save_graph
    from graphs.synthetic import synthetic_graph

    path = tmp_path / "g.parquet"
    save_graph(synthetic_graph(50, 1), path)
    check_graph_name(str(path))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(PlacerError, match="damaged or not a graph file"):
        check_graph_name(str(path))


def test_check_graph_name__a_model_file_given_as_a_graph_file_names_the_import_that_reads_it(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07not parquet")
    with pytest.raises(PlacerError, match=r"not a graph file.*placer graphs import --onnx"):
        check_graph_name(str(path))


def test_cached_benchmark__another_source_of_the_graphs_package_is_another_cache_entry(monkeypatch, tmp_path):
    """A benchmark cached by other code is rebuilt, not served (no version bump needed)."""
    from graphs import registry

    monkeypatch.setenv("PLACER_CACHE", str(tmp_path))
    monkeypatch.setattr(registry, "graphs_source_digest", lambda: "a" * 16)
    registry.benchmark_graph("rnnlm")
    assert registry.cached_graph_path("rnnlm") is not None
    monkeypatch.setattr(registry, "graphs_source_digest", lambda: "b" * 16)
    assert registry.cached_graph_path("rnnlm") is None


def test_cached_benchmark__a_long_family_seed_is_cached_and_read_back(monkeypatch, tmp_path):
    """Its cache file's name held the whole graph name: built once, then "File name too long" once the cache
    folder existed."""
    from graphs import registry

    monkeypatch.setenv("PLACER_CACHE", str(tmp_path))
    name = "family:rnn:" + "1" * 240
    first = load_graph(name)
    assert registry.cached_graph_path(name) is not None
    assert load_graph(name).content_hash == first.content_hash
    with pytest.raises(PlacerError, match="unknown graph 'x{300}': not a file"):
        load_graph("x" * 300)


def test_cache_dir__an_empty_placer_cache_is_the_default_not_the_current_folder(monkeypatch, tmp_path):
    """PLACER_CACHE= put the cache in the current folder (the graphs package, run from the repository)."""
    from pathlib import Path

    from graphs.registry import cache_dir

    monkeypatch.setenv("PLACER_CACHE", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == Path(tmp_path) / ".cache" / "placer"
