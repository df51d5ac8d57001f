"""family:KIND:SEED graphs: real traced models drawn from documented ranges, served and cached by the
registry, checked by name without building."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from graphs import families
from graphs.errors import PlacerError
from graphs.families import KINDS, MAX_FAMILY_GRAPHS, NMT_MAX_LAYER_STEPS, draw_family_config, family_names
from graphs.opgraph import validate
from graphs.registry import benchmark_graph, cached_graph_path, check_graph_name, load_graph

MIN_OPS, MAX_OPS = 300, 10_000
SEEDS = range(50)


@pytest.mark.parametrize("name, model", [("family:rnn:0", "rnnlm"), ("family:rnn:3", "nmt"),
                                         ("family:cnn:1", "cnn"), ("family:transformer:2", "transformer")])
def test_each_kind_builds_a_valid_graph_in_the_size_range(name, model):
    assert draw_family_config(*families.parse_family_name(name)).model == model
    graph = load_graph(name)
    validate(graph)
    assert graph.name == name
    assert MIN_OPS <= graph.num_ops <= MAX_OPS
    assert graph.num_params > 0 and graph.total_flops > 0
    assert cached_graph_path(name) is not None  # the second load reads the cache
    assert load_graph(name).content_hash == graph.content_hash


@pytest.mark.parametrize("layers", [1, 2])
def test_nmt__every_parameter_is_trained_also_with_one_layer(layers):
    """A one-layer NMT's attention context fed no upper layer: the loss never reached the attention's weights
    (no gradient, no optimizer state; family graphs draw such NMTs). Now it joins the layer's output."""
    from graphs.benchmarks.torch_models import build_nmt

    graph = build_nmt(layers=layers, batch_size=2, src_len=3, tgt_len=3, hidden=8, src_vocab=11, tgt_vocab=13)
    params = [i for i, name in enumerate(graph.op_names) if name.startswith("param:")]
    untrained = [graph.op_names[i] for i in params if graph.param_bytes[i] == graph.out_bytes[i]]
    assert untrained == [] and any("attention" in graph.op_names[i] for i in params)


def test_same_name_twice_traces_the_same_graph():
    first = benchmark_graph("family:cnn:4", use_cache=False)
    second = benchmark_graph("family:cnn:4", use_cache=False)
    assert first.content_hash == second.content_hash


def test_different_seeds_give_different_graphs():
    graphs = [benchmark_graph(f"family:transformer:{seed}") for seed in (2, 5, 8)]
    assert len({g.content_hash for g in graphs}) == 3
    assert len({g.total_flops for g in graphs}) == 3  # not only the names differ
    assert cached_graph_path("family:transformer:2") != cached_graph_path("family:transformer:5")


def _in(value: int, low: int, high: int, step: int = 1) -> bool:
    return low <= value <= high and (value - low) % step == 0


def _check_nmt(c: dict) -> None:
    assert _in(c["layers"], 1, 4) and _in(c["hidden"], 256, 1024, 128) and _in(c["batch_size"], 64, 512, 64)
    assert _in(c["src_len"], 10, 40) and _in(c["tgt_len"], 10, 40)
    assert c["layers"] * (c["src_len"] + c["tgt_len"]) <= NMT_MAX_LAYER_STEPS
    assert _in(c["src_vocab"], 8000, 32000, 1000) and _in(c["tgt_vocab"], 8000, 32000, 1000)


def _check_rnnlm(c: dict) -> None:
    assert _in(c["layers"], 1, 2) and _in(c["hidden"], 256, 1024, 128) and _in(c["seq_len"], 10, 40)
    assert _in(c["batch_size"], 64, 512, 64) and _in(c["vocab"], 5000, 20000, 1000)


def _check_transformer(c: dict) -> None:
    assert _in(c["layers"], 2, 6) and _in(c["d_model"], 256, 768, 64)
    assert c["d_model"] % c["heads"] == 0 and 32 <= c["d_model"] // c["heads"] <= 128
    assert _in(c["seq_len"], 128, 512, 64) and c["context"] == c["seq_len"]
    assert _in(c["batch_size"], 8, 64, 8) and _in(c["vocab"], 8000, 50257)


def _check_cnn(c: dict) -> None:
    stages = len(c["blocks"])
    assert 2 <= stages <= 4 and len(c["branches"]) == len(c["residual"]) == stages
    assert all(_in(b, 1, 3) for b in c["blocks"]) and all(_in(b, 2, 4) for b in c["branches"])
    assert all(isinstance(r, bool) for r in c["residual"])
    assert _in(c["width"], 16, 64, 8) and _in(c["image_size"], 32, 224, 16)
    assert _in(c["batch_size"], 32, 256, 32) and _in(c["classes"], 10, 1000)


CHECKS = {"nmt": _check_nmt, "rnnlm": _check_rnnlm, "transformer": _check_transformer, "cnn": _check_cnn}


@pytest.mark.parametrize("kind", KINDS)
def test_config_draws_respect_the_documented_ranges(kind):
    drawn = [draw_family_config(kind, seed) for seed in SEEDS]
    for d in drawn:
        CHECKS[d.model](d.config)
        json.dumps(d.config)  # plain types: the cache key serialises them
    assert len({json.dumps(d.config, sort_keys=True) for d in drawn}) == len(drawn)
    if kind == "rnn":
        assert {d.model for d in drawn} == {"nmt", "rnnlm"}
    assert draw_family_config(kind, 7) == draw_family_config(kind, 7)


def test_draws_cover_the_ranges_and_avoid_the_held_out_benchmarks():
    nmt = [d.config for d in (draw_family_config("rnn", s) for s in range(200)) if d.model == "nmt"]
    gpt = [draw_family_config("transformer", s).config for s in range(200)]
    assert {c["layers"] for c in nmt} == {1, 2, 3, 4}  # never nmt-8's 8
    assert {c["layers"] for c in gpt} == set(range(2, 7))
    assert max(c["d_model"] for c in gpt) == 768 and max(c["seq_len"] for c in gpt) == 512
    assert min(c["d_model"] for c in gpt) == 256 and min(c["seq_len"] for c in gpt) == 128


@pytest.mark.parametrize("name, message", [
    ("family:foo:1", r"unknown graph family 'foo'.*known kinds rnn, cnn, transformer"),
    ("family:rnn:x", r"bad seed 'x' in 'family:rnn:x'.*non-negative integer"),
    ("family:rnn", r"bad family graph name 'family:rnn'.*family:KIND:SEED with KIND one of rnn, cnn"),
    ("family:rnn:1:2", r"bad family graph name"),
    ("family:rnn:-1", r"negative seed -1 in 'family:rnn:-1'"),
    ("family:rnn:01", r"bad seed '01'.*without leading zeros"),
    ("family:cnn:", r"bad seed ''"),
])
def test_bad_names_raise_placer_error_naming_the_problem(name, message):
    with pytest.raises(PlacerError, match=message):
        check_graph_name(name)
    with pytest.raises(PlacerError, match=message):
        load_graph(name)


def test_unknown_graph_message_mentions_families():
    with pytest.raises(PlacerError, match=r"family:KIND:SEED with KIND one of rnn, cnn, transformer"):
        load_graph("no-such-graph")


@pytest.mark.parametrize("count, start_seed, message", [
    (2.5, 0, "whole numbers count >= 0 and start_seed >= 0, not 2.5 and 0"),  # was a TypeError from range
    (2, 1.0, "not 2 and 1.0"), (True, 0, "not True and 0"),
    (MAX_FAMILY_GRAPHS + 1, 0, f"{MAX_FAMILY_GRAPHS + 1} graphs is more than the 10,000 a family holds")])
def test_family_names__a_count_not_a_whole_number_or_too_large_is_one_error(count, start_seed, message):
    with pytest.raises(PlacerError, match=re.escape(message)):
        family_names(count, start_seed)
    assert len(family_names(MAX_FAMILY_GRAPHS)) == MAX_FAMILY_GRAPHS


def test_family_names_cycle_the_kinds_with_consecutive_seeds():
    assert family_names(5, start_seed=7) == ["family:rnn:7", "family:cnn:8", "family:transformer:9",
                                             "family:rnn:10", "family:cnn:11"]
    assert family_names(0) == []
    assert family_names(2) == ["family:rnn:0", "family:cnn:1"]
    for name in family_names(30):
        check_graph_name(name)
    with pytest.raises(PlacerError, match="count >= 0"):
        family_names(-1)
    with pytest.raises(PlacerError, match="start_seed >= 0"):
        family_names(3, start_seed=-2)


def test_check_graph_name_accepts_family_names_without_building(monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("a check must not build a family graph")

    monkeypatch.setattr(families, "build_family_graph", no_build)
    for name in ("family:rnn:123457", "family:cnn:0", "family:transformer:99999999999"):
        check_graph_name(name)
    with pytest.raises(AssertionError, match="must not build"):  # the patch does reach the builder
        benchmark_graph("family:cnn:123457", use_cache=False)


def _nmt_extremes() -> list[dict]:
    """The fewest and the most unrolled steps the nmt ranges allow, per layer count (target steps cost
    more ops than source steps, so the most ops come with the longest target)."""
    configs = [dict(layers=1, src_len=10, tgt_len=10)]
    for layers in range(1, 5):
        steps = min(80, NMT_MAX_LAYER_STEPS // layers)
        tgt_len = min(40, steps - 10)
        configs.append(dict(layers=layers, src_len=min(40, steps - tgt_len), tgt_len=tgt_len))
    small = dict(hidden=256, batch_size=16, src_vocab=8000, tgt_vocab=8000)
    return [{**small, **c} for c in configs]


def _cnn_extremes() -> list[dict]:
    small = dict(width=16, image_size=32, batch_size=8, classes=10)
    return [{**small, "blocks": [1, 1], "branches": [2, 2], "residual": [False, False]},
            {**small, "blocks": [3] * 4, "branches": [4] * 4, "residual": [True] * 4}]


@pytest.mark.slow
@pytest.mark.parametrize("model, config", [
    *[("nmt", c) for c in _nmt_extremes()],
    ("rnnlm", dict(layers=1, seq_len=10, hidden=256, batch_size=16, vocab=5000)),
    ("rnnlm", dict(layers=2, seq_len=40, hidden=256, batch_size=16, vocab=5000)),
    ("transformer", dict(layers=2, d_model=256, heads=4, seq_len=128, context=128, batch_size=2, vocab=8000)),
    ("transformer", dict(layers=6, d_model=256, heads=4, seq_len=128, context=128, batch_size=2, vocab=8000)),
    *[("cnn", c) for c in _cnn_extremes()],
])
def test_the_structural_extremes_of_the_ranges_stay_in_the_size_range(model, config):
    """Op counts depend on the structure (layers, steps, blocks), not on widths or batch sizes, so the
    structural extremes bound every family graph."""
    graph = families.build_family_graph(f"extreme-{model}", model, config)
    assert MIN_OPS <= graph.num_ops <= MAX_OPS, (model, config, graph.num_ops)
    assert np.all(graph.flops >= 0)
