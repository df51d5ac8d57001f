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


def _counted_build(graph, builds: list):
    def build(self):
        builds.append(self.name)
        return graph
    return build


def test_cached_benchmark__one_whose_model_file_was_cleared_away_is_built_again(monkeypatch, tmp_path):
    """An inference benchmark's cached graph was read though the model file it names had been deleted (a user
    clearing the cache's models folder): every real measurer's command failed on it, and it was never rebuilt."""
    import dataclasses

    from graphs import registry
    from graphs.benchmarks import Benchmark
    from graphs.synthetic import synthetic_graph

    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "cache"))
    model_file = tmp_path / "cache" / "models" / "tiny.onnx"
    graph = dataclasses.replace(synthetic_graph(10, 0), name="tiny-infer", meta={"model_file": str(model_file)})
    builds = []
    monkeypatch.setattr(Benchmark, "build", _counted_build(graph, builds))
    monkeypatch.setitem(registry.BENCHMARKS, "tiny-infer", Benchmark("tiny-infer", "x:y", "a test"))
    model_file.parent.mkdir(parents=True)
    model_file.write_bytes(b"model")
    registry.benchmark_graph("tiny-infer")
    registry.benchmark_graph("tiny-infer")
    assert builds == ["tiny-infer"]  # cached
    model_file.unlink()
    registry.benchmark_graph("tiny-infer")
    assert builds == ["tiny-infer"] * 2
    ir = model_file.with_suffix(".xml")  # an OpenVINO IR: its weights beside it are needed too
    ir.write_bytes(b"ir")
    ir.with_suffix(".bin").write_bytes(b"weights")
    monkeypatch.setattr(Benchmark, "build", _counted_build(dataclasses.replace(graph, meta={"model_file": str(ir)}),
                                                           builds))
    registry.benchmark_graph("tiny-infer")  # the entry's model file is gone: built again, naming the IR
    registry.benchmark_graph("tiny-infer")
    assert len(builds) == 3
    ir.with_suffix(".bin").unlink()
    registry.benchmark_graph("tiny-infer")
    assert len(builds) == 4


def test_cached_benchmark__a_damaged_entry_in_a_cache_this_user_cannot_write_is_built_and_noted(monkeypatch, tmp_path,
                                                                                             capsys):
    """Removing the damaged entry failed ("Operation not permitted", exit 2, the entry unnamed), where a missing
    entry in the same cache is built and used with a note."""
    from graphs import registry

    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "cache"))
    registry.benchmark_graph("family:cnn:0")
    entry = registry.cached_graph_path("family:cnn:0")
    entry.write_bytes(entry.read_bytes()[:500])

    def refused(self, missing_ok=False):
        raise PermissionError(1, "Operation not permitted", str(self))

    monkeypatch.setattr(type(entry), "unlink", refused)
    monkeypatch.setattr(registry, "save_graph", lambda graph, path: refused(path))
    graph = registry.benchmark_graph("family:cnn:0")
    assert graph.name == "family:cnn:0"
    assert "placer: note: family:cnn:0 is not cached: cannot write the graph cache" in capsys.readouterr().err
