"""`--grouping fusion`: the fusion rules (graphs.fusion), the fused units and the grouping built on them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs.fusion import fusible_edges
from graphs.grouping import Grouping, fused_unit_ids, group_ops

MM, ADD, MUL, RELU, VAR, INPUT = "aten.mm", "aten.add", "aten.mul", "aten.relu", "Variable", "Input"


def _same(units: np.ndarray, *ops: int) -> bool:
    return len(set(units[list(ops)].tolist())) == 1


def _apart(units: np.ndarray, *ops: int) -> bool:
    return len(set(units[list(ops)].tolist())) == len(ops)


def test_fused_units__elementwise_chain_after_a_matmul_is_one_unit(make_graph):
    # 0 x, 1 W -> 2 mm -> 3 add(+ 4 bias) -> 5 relu -> 6 mul -> 7 mm (with 8 W2)
    kinds = [INPUT, VAR, MM, ADD, VAR, RELU, MUL, MM, VAR]
    graph = make_graph([(0, 2), (1, 2), (2, 3), (4, 3), (3, 5), (5, 6), (6, 7), (8, 7)], kinds=kinds)
    units = fused_unit_ids(graph)
    assert _same(units, 2, 3, 5, 6)
    assert _apart(units, 0, 1, 2, 4, 7, 8)  # constants are kernel inputs; the next matmul is its own kernel
    grouping = group_ops(graph, max_groups=6, method="fusion")
    assert grouping.num_groups == 6 and grouping.method == "fusion"
    assert _same(grouping.op_group, 2, 3, 5, 6)


def test_fused_units__elementwise_ops_reading_two_matmuls_stay_apart(make_graph):
    # 0 x; matmuls 1, 2, 3 of x; 4 = add(1, 2) and 5 = mul(1, 3): each has two non-constant producers, and
    # matmul 1 has two consumers, so nothing fuses but the prologue 5 -> 6 (a reduction, its only consumer)
    kinds = [INPUT, MM, MM, MM, ADD, MUL, "aten.sum"]
    graph = make_graph([(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (1, 5), (3, 5), (5, 6)], kinds=kinds)
    assert fusible_edges(graph).tolist() == [False, False, False, False, False, False, False, True]
    units = fused_unit_ids(graph)
    assert _apart(units, 1, 2, 3, 4, 5)
    assert _same(units, 5, 6)


def test_fused_units__conv_batch_norm_relu_is_one_unit_and_views_are_transparent(make_graph):
    # 0 x -> 1 conv -> 2 batch norm (reads the constants 3, 4) -> 5 relu -> 6 view -> 7 mul (reads only 6)
    kinds = [INPUT, "aten.convolution", "aten.native_batch_norm", VAR, VAR, RELU, "aten.view", MUL]
    graph = make_graph([(0, 1), (1, 2), (3, 2), (4, 2), (2, 5), (5, 6), (6, 7)], kinds=kinds)
    assert _same(fused_unit_ids(graph), 1, 2, 5, 6, 7)


def test_fused_units__elementwise_after_a_view_of_a_softmax_does_not_fuse(make_graph):
    # 0 x -> 1 softmax -> 2 view -> 3 mul: the view aliases the softmax, which takes no epilogue
    graph = make_graph([(0, 1), (1, 2), (2, 3)], kinds=[INPUT, "aten._softmax", "aten.view", MUL])
    units = fused_unit_ids(graph)
    assert _same(units, 1, 2) and not _same(units, 2, 3)


def test_fused_units__never_fuse_across_phases(make_graph):
    # forward 0 mm -> backward 1 relu_backward: fusible by kind, but the phases differ
    graph = make_graph([(0, 1)], kinds=[MM, "aten.threshold_backward"], phases=["forward", "backward"])
    assert not fusible_edges(graph).any()
    assert _apart(fused_unit_ids(graph), 0, 1)


def test_fused_units__never_join_two_units_that_both_hold_a_matmul(make_graph):
    # 0 mm -> 1 relu is fusible, but relu is colocated with the matmul 2: two anchors, two units
    graph = make_graph([(0, 1), (1, 2)], kinds=[MM, RELU, MM], colocation=[0, 1, 1])
    assert fusible_edges(graph)[0]
    assert _apart(fused_unit_ids(graph), 0, 1)


def test_fused_units__never_join_ops_whose_allowed_devices_are_disjoint(make_graph):
    graph = make_graph([(0, 1)], kinds=[MM, RELU], allowed_mask=[1, 2])
    assert _apart(fused_unit_ids(graph), 0, 1)


def _training_like(make_graph, layers: int = 12):
    """``layers`` of mm -> add -> relu forward, then their backward ops in reverse, each colocated with its
    forward op, on random flops."""
    forward = [MM, ADD, RELU] * layers
    n = 2 * len(forward)
    edges = [(i, i + 1) for i in range(n - 1)]
    colocation = np.r_[np.arange(len(forward)), np.arange(len(forward))[::-1]]
    kinds = forward + ["aten.threshold_backward", ADD, MM] * layers
    phases = ["forward"] * len(forward) + ["backward"] * len(forward)
    flops = np.random.default_rng(0).lognormal(14, 2, n)
    return make_graph(edges, n, kinds=kinds, colocation=colocation, phases=phases, flops=flops)


@pytest.mark.parametrize("max_groups", [1, 3, 5, 20])  # below its 36 atoms
def test_group_ops_fusion__never_splits_a_colocation_group_and_respects_max_groups(make_graph, max_groups):
    graph = _training_like(make_graph)
    grouping = group_ops(graph, max_groups=max_groups, method="fusion")
    assert 1 <= grouping.num_groups <= max_groups
    for colocation_id in np.unique(graph.colocation):
        assert len(np.unique(grouping.op_group[graph.colocation == colocation_id])) == 1
    units = fused_unit_ids(graph)
    assert all(len(np.unique(grouping.op_group[units == u])) == 1 for u in np.unique(units))  # units stay whole


def test_group_ops_fusion__same_seed_same_groups(make_graph):
    graph = _training_like(make_graph, layers=40)
    first, second = (group_ops(graph, max_groups=7, method="fusion", seed=3) for _ in range(2))
    assert np.array_equal(first.op_group, second.op_group)


def test_op_classes__costs_reexports_the_one_classifier():
    import graphs.op_classes as op_classes
    import measurers.sim.costs as costs

    assert costs.op_class is op_classes.op_class and costs.op_class_codes is op_classes.op_class_codes
    assert costs.OP_CLASSES is op_classes.OP_CLASSES


def test_group_ops_fusion__rnnlm_fused_units_and_at_most_max_groups():
    from graphs.registry import load_graph

    graph = load_graph("rnnlm")
    units = fused_unit_ids(graph)
    assert np.unique(units).size < graph.num_colocation_groups  # fusion contracts something
    for colocation_id in np.unique(graph.colocation_ids):  # units are unions of colocation groups
        assert np.unique(units[graph.colocation_ids == colocation_id]).size == 1
    grouping = group_ops(graph, max_groups=32, method="fusion")
    assert grouping.num_groups <= 32 and grouping.method == "fusion"
    assert all(np.unique(grouping.op_group[units == u]).size == 1 for u in np.unique(units))


@pytest.mark.slow  # starts Ray
def test_search_cli__grouping_fusion_on_rnnlm_returns_a_result(tmp_path, capsys):
    from cluster.cli import main

    code = main(["search", "--grouping", "fusion", "--graph", "rnnlm", "--budget", "8", "--workers", "1",
                 "--out", str(tmp_path), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["measurements"] == 8 and result["groups"] <= 32
    assert np.isfinite(result["overall_best_runtime_s"])
    with np.load(next(tmp_path.glob("*/grouping.npz"))) as arrays:
        assert Grouping.from_arrays(arrays).method == "fusion"
