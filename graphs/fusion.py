"""Fusion rules: which edges of an op graph a runtime would fuse into one kernel (Moirai's coarsening).

Moirai (Zhang et al. 2023) coarsens a graph by merging what the inference backend fuses anyway, so a
placement never cuts through a fused kernel. Its public code (moirai-placement/moirai) holds only the MILP,
not its rule list, so these are the rules XLA's instruction fusion and TVM's FuseOps apply, on the op
classes of ``graphs.op_classes`` (plus normalization, told apart from the other ``other`` kinds by name):

1. Views are free: a ``meta`` op (view, reshape, split...) joins its producer when that is its only
   producer of non-constant data; an element-wise op reading a view sees the op the view aliases.
2. Epilogue: an element-wise op joins its producer when that producer is its only producer of
   non-constant data and a dense op (matmul, conv: bias add, activation), an element-wise op (chains),
   or a normalization.
3. Normalization after dense: a normalization whose only non-constant producer is a dense op joins it
   (conv + batch norm).
4. Prologue: an element-wise op whose only consumer is an element-wise op or an ``other`` kernel
   (reduction, softmax, normalization, loss...) joins that consumer (XLA's loop and input fusion,
   without duplicating a producer that has several consumers).

"Constant" means a ``meta`` op all of whose producers (if any) are constant: a Variable, an input, a view
of one. Constants are inputs of a kernel, never fused into it: a weight read by the matmul of every time
step would otherwise pull all of them (and, through colocation, their gradients) into one unit. An edge
fuses only between ops of the same phase: a forward op never joins a backward op through these rules
(colocation may still put them together). The fusion rules never join two units that each hold a dense op
(TVM's rule; ``fusion_anchors``, applied where graphs.grouping contracts the edges), so a unit holds one
forward dense op; colocation adds its backward kernels (a matmul's two gradient matmuls: up to 3 dense ops).
"""

from __future__ import annotations

import re

import numpy as np

from graphs.op_classes import OP_CLASSES, op_class_codes
from graphs.opgraph import OpGraph

DENSE, ELEMENTWISE, META, OTHER = (OP_CLASSES.index(c) for c in ("dense", "elementwise", "meta", "other"))
NORM = len(OP_CLASSES)  # a fifth kind here: an ``other`` op that is a normalization
_NORMALIZATION = re.compile(r"(aten[.:]+)?_?(native_|cudnn_|miopen_)?(batch|layer|group|instance)_?norm\w*(\.\w+)?|"
                            r"fusedbatchnorm\w*", re.IGNORECASE)


def fusible_edges(graph: OpGraph) -> np.ndarray:
    """(E,) bool: the edges whose two ops a runtime would fuse (rules in the module docstring)."""
    kind = _fusion_kinds(graph)  # (N,) int8
    src, dst = graph.edge_src, graph.edge_dst
    const = _constants(graph, kind)  # (N,) bool
    live_in = np.bincount(dst[~const[src]], minlength=graph.num_ops)  # (N,) non-constant producers
    out_degree = np.bincount(src, minlength=graph.num_ops)  # (N,)
    alias = _aliased_kinds(graph, kind, const, live_in)  # (N,) kind of the op a view aliases
    sole_live = ~const[src] & (live_in[dst] == 1)  # (E,) src is dst's only non-constant producer
    view = (kind[dst] == META) & ~const[dst] & sole_live
    epilogue = (kind[dst] == ELEMENTWISE) & sole_live & np.isin(alias[src], (DENSE, ELEMENTWISE, NORM))
    norm_after_dense = (kind[dst] == NORM) & sole_live & (alias[src] == DENSE)
    prologue = (kind[src] == ELEMENTWISE) & (out_degree[src] == 1) & np.isin(kind[dst], (ELEMENTWISE, OTHER, NORM))
    same_phase = graph.phases[src] == graph.phases[dst]
    return same_phase & (view | epilogue | norm_after_dense | prologue)


def fusion_anchors(graph: OpGraph) -> np.ndarray:
    """(N,) bool: the dense ops, the anchors of fused kernels (a kernel holds at most one)."""
    return op_class_codes(graph) == DENSE


def _fusion_kinds(graph: OpGraph) -> np.ndarray:
    """(N,) int8: the op class code, with NORM for normalizations."""
    kind = op_class_codes(graph).copy()
    kinds = graph.op_kinds.tolist()
    norm_kinds = {k for k in set(kinds) if _NORMALIZATION.fullmatch(k.strip())}
    if norm_kinds:
        kind[np.isin(graph.op_kinds, list(norm_kinds)) & (kind == OTHER)] = NORM
    return kind


def _constants(graph: OpGraph, kind: np.ndarray) -> np.ndarray:
    """(N,) bool: meta ops that read only constants (sources included), found by shrinking from all meta."""
    const = kind == META
    while True:
        tainted = np.zeros(graph.num_ops, dtype=bool)
        tainted[graph.edge_dst[~const[graph.edge_src]]] = True
        shrunk = const & ~tainted
        if np.array_equal(shrunk, const):
            return const
        const = shrunk


def _aliased_kinds(graph: OpGraph, kind: np.ndarray, const: np.ndarray, live_in: np.ndarray) -> np.ndarray:
    """(N,) int8: for a non-constant view with one non-constant producer, the kind of the op it aliases
    (through chains of views); every other op keeps its own kind."""
    alias = kind.copy()
    view = (kind == META) & ~const & (live_in == 1)  # (N,)
    edge = view[graph.edge_dst] & ~const[graph.edge_src]  # (E,) the one live producer of each such view
    producer = np.full(graph.num_ops, -1, dtype=np.int64)
    producer[graph.edge_dst[edge]] = graph.edge_src[edge]
    ops = np.flatnonzero(view)
    for _ in range(graph.num_ops):  # follow view chains; each pass walks one step up
        step = producer[ops]
        alias[ops] = kind[step]
        ops_next = view[step]
        if not ops_next.any():
            break
        producer[ops[ops_next]] = producer[step[ops_next]]
        ops = ops[ops_next]
    return alias
