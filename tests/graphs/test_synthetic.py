"""Synthetic training-step graphs: exact size, seeded, shaped like a training step."""

import re

import numpy as np
import pytest

from graphs.errors import PlacerError
from graphs.opgraph import PHASE_CODE
from graphs.registry import load_graph
from graphs.synthetic import synthetic_from_spec, synthetic_graph
from measurers.sim.costs import op_class_codes, OP_CLASSES


@pytest.mark.parametrize("num_ops", [1, 2, 5, 47, 48, 1000, 54321])
def test_synthetic_graph__has_exactly_the_ops_asked_for(num_ops):
    graph = synthetic_graph(num_ops, 1)
    assert graph.num_ops == num_ops and graph.framework == "synthetic"
    assert len(graph.topo_order) == num_ops  # validated: acyclic


def test_synthetic_graph__same_seed_same_graph_other_seed_other_graph():
    assert synthetic_graph(5000, 3).content_hash == synthetic_graph(5000, 3).content_hash
    assert synthetic_graph(5000, 3).content_hash != synthetic_graph(5000, 4).content_hash


def test_synthetic_graph__training_step_shape():
    graph = synthetic_graph(12000, 0)
    kinds = graph.op_kinds.astype(str)
    variables = np.flatnonzero(kinds == "Variable")
    updates = np.flatnonzero(kinds == "ApplyAdam")
    assert len(variables) == len(updates) > 900
    assert (graph.param_bytes[variables] > 0).all() and graph.param_bytes[kinds != "Variable"].sum() == 0
    assert (graph.colocation[updates] == variables).all()  # an update stays with its Variable
    assert set(graph.phases[updates]) == {PHASE_CODE["update"]}
    assert {PHASE_CODE["forward"], PHASE_CODE["backward"]} <= set(graph.phases.tolist())
    assert set(op_class_codes(graph).tolist()) == set(range(len(OP_CLASSES)))  # every cost class appears
    consumers = set(graph.edge_dst[np.isin(graph.edge_src, variables)].tolist())
    assert {k for k in kinds[list(consumers)]} == {"MatMul", "Conv2D", "ApplyAdam"}
    sizes = graph.out_bytes[kinds == "MatMul"]
    assert 1e5 < np.median(sizes) < 1e8 and sizes.max() / sizes.min() > 100  # spread like real tensors
    depth = np.zeros(graph.num_ops, dtype=np.int64)
    for v in graph.topo_order:  # long and moderately wide
        preds = graph.edge_src[graph.edge_dst == v]
        depth[v] = depth[preds].max() + 1 if len(preds) else 0
    assert depth.max() > 50


def test_synthetic_from_spec__names_and_registry():
    assert synthetic_from_spec("synthetic:300").name == "synthetic:300:0"
    assert synthetic_from_spec("synthetic:300:7").content_hash == synthetic_graph(300, 7).content_hash
    assert load_graph("synthetic:200:2").num_ops == 200


@pytest.mark.parametrize("spec, message", [
    ("synthetic:", "expected synthetic:N or synthetic:N:SEED"),
    ("synthetic:x", "expected synthetic:N or synthetic:N:SEED"),
    ("synthetic:10:1:2", "expected synthetic:N or synthetic:N:SEED"),
    ("synthetic:0", "have 1..20000000 ops, not 0"),
    ("synthetic:-5", "expected synthetic:N or synthetic:N:SEED"),
    ("synthetic:²", "expected synthetic:N or synthetic:N:SEED"),  # isdigit() says yes, int() no
])
def test_synthetic_from_spec__bad_names_are_one_error(spec, message):
    with pytest.raises(PlacerError, match=re.escape(message)):
        synthetic_from_spec(spec)
