"""Per-group features for placement policies: what each group computes, stores and exchanges.

``group_features(graph, grouping)`` summarizes every group of a Grouping; ``GroupFeatures.as_matrix()``
turns the summary into a (G, F) float32 matrix whose columns are listed in ``FEATURE_COLUMNS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.errors import PlacerError
from graphs.grouping import Grouping, first_topo_position, group_edges
from graphs.opgraph import PHASES, OpGraph

OP_CLASSES = ("matmul", "conv", "elementwise", "reduction", "memory", "variable", "input", "other")

# Exact op types (lower case, "aten." and the overload suffix removed) of both frameworks.
_EXACT = {
    "variable": "variable", "variablev2": "variable", "varhandleop": "variable",
    # TensorFlow reads and writes a resource variable with ops of their own, where a traced torch step uses the
    # parameter directly and updates it in place (aten.add_, addcdiv_...): a read is classed as an identity,
    # a write as the elementwise update it is, so a Keras step's histogram is a torch step's
    "readvariableop": "memory", "assignvariableop": "elementwise", "assignaddvariableop": "elementwise",
    "assignsubvariableop": "elementwise",
    "input": "input", "placeholder": "input", "iteratorgetnext": "input", "const": "input",
    "mm": "matmul", "addmm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "matmul": "matmul",
    "linear": "matmul", "einsum": "matmul", "dot": "matmul", "mv": "matmul", "addmv": "matmul",
    "batchmatmul": "matmul", "batchmatmulv2": "matmul", "batchmatmulv3": "matmul",
    "sum": "reduction", "mean": "reduction", "amax": "reduction", "amin": "reduction", "max": "reduction",
    "min": "reduction", "prod": "reduction", "var": "reduction", "var_mean": "reduction", "std": "reduction",
    "argmax": "reduction", "argmin": "reduction", "logsumexp": "reduction", "all": "reduction", "any": "reduction",
    "embedding": "memory", "embedding_dense_backward": "memory", "biasaddgrad": "reduction",
    "t": "memory", "_unsafe_view": "memory",
    # ONNX / OpenVINO types
    "gemm": "matmul", "convert": "memory", "convertlike": "memory", "flatten": "memory", "mvn": "reduction",
    **{cmp: "elementwise" for cmp in ("eq", "ne", "gt", "lt", "ge", "le", "equal", "notequal", "greater",
                                      "less", "greaterequal", "lessequal", "select", "selectv2")},
}
# Substring rules, tried in order when no exact entry matches.
_CONTAINS = (
    ("variable", "variable"),
    ("conv", "conv"),
    ("matmul", "matmul"),
    # fused kernels whose work is matrix products (graphs.op_classes calls them dense too): attention, RNN cells
    ("attention", "matmul"), ("lstm", "matmul"), ("gru", "matmul"), ("cudnn_rnn", "matmul"), ("rnn_tanh", "matmul"),
    ("rnn_relu", "matmul"),
    ("softmax", "reduction"), ("norm", "reduction"), ("nll_loss", "reduction"), ("crossentropy", "reduction"),
    ("reduce", "reduction"), ("l2loss", "reduction"), ("pool", "reduction"),
    ("view", "memory"), ("reshape", "memory"), ("permute", "memory"), ("transpose", "memory"),
    ("expand", "memory"), ("squeeze", "memory"), ("slice", "memory"), ("select", "memory"),
    ("cat", "memory"), ("concat", "memory"), ("stack", "memory"), ("pack", "memory"), ("split", "memory"),
    ("gather", "memory"), ("scatter", "memory"), ("index", "memory"), ("copy", "memory"), ("clone", "memory"),
    ("identity", "memory"), ("detach", "memory"), ("as_strided", "memory"), ("empty", "memory"),
    ("zeros", "memory"), ("ones", "memory"), ("full", "memory"), ("fill", "memory"), ("pad", "memory"),
    ("tile", "memory"), ("repeat", "memory"), ("shape", "memory"), ("cast", "memory"), ("_to_copy", "memory"),
    ("alias", "memory"), ("unbind", "memory"), ("unstack", "memory"),
    ("apply", "elementwise"), ("add", "elementwise"), ("sub", "elementwise"), ("mul", "elementwise"),
    ("div", "elementwise"), ("relu", "elementwise"), ("gelu", "elementwise"), ("sigmoid", "elementwise"),
    ("tanh", "elementwise"), ("exp", "elementwise"), ("log", "elementwise"), ("sqrt", "elementwise"),
    ("pow", "elementwise"), ("neg", "elementwise"), ("threshold", "elementwise"), ("where", "elementwise"),
    ("dropout", "elementwise"), ("lerp", "elementwise"), ("maximum", "elementwise"), ("minimum", "elementwise"),
    ("square", "elementwise"), ("rsqrt", "elementwise"), ("silu", "elementwise"), ("abs", "elementwise"),
    ("clamp", "elementwise"), ("erf", "elementwise"), ("sin", "elementwise"), ("cos", "elementwise"),
    ("bias", "elementwise"), ("softplus", "elementwise"), ("logical", "elementwise"),
    ("elu", "elementwise"), ("mask", "elementwise"), ("rand", "elementwise"), ("bernoulli", "elementwise"),
)
FEATURE_COLUMNS = (
    *(f"kind_fraction.{c}" for c in OP_CLASSES),  # fraction of the group's ops in each op class
    "log_flops", "log_out_bytes", "log_param_bytes", "log_num_ops",  # log1p, standardized
    *(f"phase_fraction.{p}" for p in PHASES),  # fraction of the group's ops in each phase
    "log_in_bytes", "log_out_edge_bytes", "log_in_degree", "log_out_degree",  # log1p, standardized
    "topo_position",  # topological position of the group's first op, in [0, 1]
    "forward_position",  # mean topological position of the group's forward ops (all ops if none), in [0, 1]
)
_STANDARDIZED = tuple(i for i, name in enumerate(FEATURE_COLUMNS) if name.startswith("log_"))


def op_class(kind: str) -> str:
    """The OP_CLASSES entry of a torch ("aten.mm.default"), TensorFlow ("MatMul"), ONNX or OpenVINO op type."""
    name = kind.lower()
    if name.startswith("aten."):
        name = name[5:].split(".")[0]
        if name in ("select", "select_backward"):  # torch's select indexes; TF's Select is a where
            return "memory"
    name = name.rstrip("_")
    base = name[: -len("_backward")] if name.endswith("_backward") else name
    for key in (name, base):
        if key in _EXACT:
            return _EXACT[key]
    for needle, cls in _CONTAINS:
        if needle in base:
            return cls
    return "other"


def op_class_codes(op_kinds: np.ndarray) -> np.ndarray:
    """(N,) int64: index into OP_CLASSES of every op (one classification per distinct kind)."""
    import pandas as pd

    codes, uniques = pd.factorize(pd.Series(op_kinds, dtype=object), sort=False)
    table = np.array([OP_CLASSES.index(op_class(str(kind))) for kind in uniques], dtype=np.int64)
    return table[codes] if len(codes) else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class GroupFeatures:
    kind_histogram: np.ndarray  # (G, K) int64: ops of each OP_CLASSES class
    flops: np.ndarray  # (G,) float64
    out_bytes: np.ndarray  # (G,) int64: bytes of all outputs of the group's ops
    param_bytes: np.ndarray  # (G,) int64: resident parameter bytes (weights + optimizer state)
    num_ops: np.ndarray  # (G,) int64
    phase_fractions: np.ndarray  # (G, 4) float64: fraction of ops per PHASES entry
    edge_src: np.ndarray  # (E_g,) int64: group-level edges, internal dropped, parallel ones summed
    edge_dst: np.ndarray  # (E_g,) int64
    edge_bytes: np.ndarray  # (E_g,) int64
    in_bytes: np.ndarray  # (G,) int64: bytes the group receives from other groups
    out_edge_bytes: np.ndarray  # (G,) int64: bytes the group sends to other groups
    in_degree: np.ndarray  # (G,) int64: number of predecessor groups
    out_degree: np.ndarray  # (G,) int64: number of successor groups
    topo_position: np.ndarray  # (G,) float64: topological position of the group's first op, in [0, 1]
    forward_position: np.ndarray  # (G,) float64: mean topological position of its forward ops, in [0, 1]

    @property
    def num_groups(self) -> int:
        return len(self.num_ops)

    def as_matrix(self, normalize: bool = True) -> np.ndarray:
        """(G, F) float32 with the FEATURE_COLUMNS columns. ``normalize=False`` gives raw values (counts,
        not fractions; no log); ``normalize=True`` log-scales magnitudes and standardizes them."""
        num_ops = np.maximum(self.num_ops, 1)[:, None]
        magnitudes = [self.flops, self.out_bytes, self.param_bytes, self.num_ops]
        neighbours = [self.in_bytes, self.out_edge_bytes, self.in_degree, self.out_degree]
        kinds = self.kind_histogram / num_ops if normalize else self.kind_histogram
        phases = self.phase_fractions if normalize else self.phase_fractions * num_ops
        columns = [kinds, np.stack(magnitudes, 1), phases, np.stack(neighbours, 1), self.topo_position[:, None],
                   self.forward_position[:, None]]
        matrix = np.concatenate([np.asarray(c, dtype=np.float64) for c in columns], axis=1)
        if normalize:
            logged = np.log1p(matrix[:, _STANDARDIZED])
            std = logged.std(axis=0)
            matrix[:, _STANDARDIZED] = (logged - logged.mean(axis=0)) / np.where(std > 0, std, 1.0)
        return matrix.astype(np.float32)


def group_features(graph: OpGraph, grouping: Grouping) -> GroupFeatures:
    g, op_group = grouping.num_groups, grouping.op_group
    if grouping.num_ops != graph.num_ops:
        raise PlacerError(f"grouping covers {grouping.num_ops} ops; graph {graph.name!r} has {graph.num_ops}")
    classes = op_class_codes(graph.op_kinds)
    kind_histogram = np.bincount(op_group * len(OP_CLASSES) + classes,
                                 minlength=g * len(OP_CLASSES)).reshape(g, len(OP_CLASSES))
    num_ops = np.bincount(op_group, minlength=g)
    phase_counts = np.bincount(op_group * len(PHASES) + graph.phases.astype(np.int64),
                               minlength=g * len(PHASES)).reshape(g, len(PHASES))
    src, dst, size = group_edges(graph, op_group, g)
    return GroupFeatures(
        kind_histogram=kind_histogram.astype(np.int64),
        flops=np.bincount(op_group, weights=graph.flops, minlength=g),
        out_bytes=_sum_int(op_group, graph.out_bytes, g),
        param_bytes=_sum_int(op_group, graph.param_bytes, g),
        num_ops=num_ops.astype(np.int64),
        phase_fractions=phase_counts / np.maximum(num_ops, 1)[:, None],
        edge_src=src, edge_dst=dst, edge_bytes=size,
        in_bytes=_sum_int(dst, size, g),
        out_edge_bytes=_sum_int(src, size, g),
        in_degree=np.bincount(dst, minlength=g).astype(np.int64),
        out_degree=np.bincount(src, minlength=g).astype(np.int64),
        topo_position=first_topo_position(graph, op_group),
        forward_position=forward_position(graph, op_group, g),
    )


def forward_position(graph: OpGraph, op_group: np.ndarray, num_groups: int) -> np.ndarray:
    """(G,) float64 in [0, 1]: mean topological position of each group's forward ops (of all its ops when
    it has none). A layer-ish cue: a group's first op is often a Variable at position 0, while its forward
    ops sit where its layer does."""
    rank = np.empty(graph.num_ops, dtype=np.float64)  # (N,)
    rank[graph.topo_order] = np.arange(graph.num_ops) / max(graph.num_ops - 1, 1)
    forward = graph.phases == PHASES.index("forward")  # (N,)
    position = np.zeros(num_groups, dtype=np.float64)
    for ops in (np.ones(graph.num_ops, dtype=bool), forward):  # forward ops win where a group has some
        count = np.bincount(op_group[ops], minlength=num_groups)
        total = np.bincount(op_group[ops], weights=rank[ops], minlength=num_groups)
        position = np.where(count > 0, total / np.maximum(count, 1), position)
    return position


def _sum_int(index: np.ndarray, values: np.ndarray, count: int) -> np.ndarray:
    """Exact int64 per-group sums (bincount's float64 weights lose precision above 2**53)."""
    out = np.zeros(count, dtype=np.int64)
    np.add.at(out, index, values)
    return out
