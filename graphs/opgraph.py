"""The op-graph IR: a columnar, validated, hashable description of one training step.

Every array is indexed by op id (0..N-1) or edge id (0..E-1). An edge ``(src, dst, bytes)`` says that
op ``dst`` reads a tensor of ``bytes`` produced by op ``src``. Edges are stored sorted by (src, dst) with
no duplicates and no self-loops, so two graphs with the same content have the same arrays and hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from graphs.errors import PlacerError, is_whole_number

PHASES = ("forward", "backward", "update", "other")
PHASE_CODE = {name: code for code, name in enumerate(PHASES)}
DEVICE_KINDS = ("cpu", "gpu")
ANY_DEVICE = (1 << len(DEVICE_KINDS)) - 1  # allowed_mask value of an op that may run anywhere
MAX_TOTAL_BYTES = 2**62  # out, parameter or edge bytes of a whole graph: sums of two stay within int64
# meta key: the dotted scopes that are layers / modules of the model, where the importer knows them (Keras:
# the scopes a layer call opened, not the optimizer's, the loss's or a bare TF op's); see cluster.placement_summary
LAYER_SCOPES = "layer_scopes"
# meta key: the names of each parameter or buffer a model holds under more than one name (tied weights), its
# Variable op's (``param:NAME``) first: [["emb.weight", "out.weight"]] (torch); see cluster.placement_summary
TIED_PARAMETERS = "tied_parameters"


def kind_bit(device_kind: str) -> int:
    """Bit of ``device_kind`` in an op's ``allowed_mask``."""
    try:
        return 1 << DEVICE_KINDS.index(device_kind)
    except ValueError:
        raise PlacerError(f"unknown device kind {device_kind!r} (known: {', '.join(DEVICE_KINDS)})") from None


@dataclass(frozen=True, eq=False)
class OpGraph:
    name: str
    framework: str  # "torch" | "tensorflow" | "synthetic" | "manual"
    op_names: np.ndarray  # (N,) object: unique op names
    op_kinds: np.ndarray  # (N,) object: framework op type, e.g. "aten.mm", "MatMul"
    flops: np.ndarray  # (N,) float64: floating-point operations of the op
    bytes_accessed: np.ndarray  # (N,) float64: bytes read + written by the op
    out_bytes: np.ndarray  # (N,) int64: bytes of the op's output(s)
    param_bytes: np.ndarray  # (N,) int64: resident bytes owned by the op (weights + optimizer state)
    edge_src: np.ndarray  # (E,) int64: producer op
    edge_dst: np.ndarray  # (E,) int64: consumer op
    edge_bytes: np.ndarray  # (E,) int64: bytes of the tensor carried
    colocation: np.ndarray | None = None  # (N,) int64: colocation group; default one group per op
    scopes: np.ndarray | None = None  # (N,) object: module/name scope, e.g. "encoder.layer1"
    phases: np.ndarray | None = None  # (N,) int8: index into PHASES
    allowed_mask: np.ndarray | None = None  # (N,) uint8: bitmask over DEVICE_KINDS
    batch_size: int = 0
    num_params: int = 0  # trainable parameters (scalars) of the model
    source: str = ""  # how the graph was made, e.g. "benchmark rnnlm v1" or a file path
    meta: dict = field(default_factory=dict)  # free-form JSON notes, saved with the graph, not hashed

    def __post_init__(self) -> None:
        n = len(self.op_names)
        defaults = {
            "colocation": np.arange(n, dtype=np.int64),
            "scopes": np.full(n, "", dtype=object),
            "phases": np.full(n, PHASE_CODE["other"], dtype=np.int8),
            "allowed_mask": np.full(n, ANY_DEVICE, dtype=np.uint8),
        }
        for key, value in defaults.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        dtypes = {
            "op_names": object, "op_kinds": object, "scopes": object,
            "flops": np.float64, "bytes_accessed": np.float64,
            "out_bytes": np.int64, "param_bytes": np.int64, "colocation": np.int64,
            "phases": np.int8, "allowed_mask": np.uint8,
            "edge_src": np.int64, "edge_dst": np.int64, "edge_bytes": np.int64,
        }
        for key, dtype in dtypes.items():
            array = np.asarray(getattr(self, key))
            if dtype is object:
                array = _checked_strings(self.name, key, array)
            elif array.dtype != dtype:
                array = _checked_cast(self.name, key, array, dtype)
            array.setflags(write=False)
            object.__setattr__(self, key, array)
        self._check_edge_lengths()
        self._canonicalize_edges()
        for key in ("batch_size", "num_params"):  # numpy integers become ints (JSON in the file's metadata)
            object.__setattr__(self, key, _checked_count(self.name, key, getattr(self, key)))
        object.__setattr__(self, "meta", checked_meta(self.name, self.meta))
        validate(self)

    def _check_edge_lengths(self) -> None:
        """Edge arrays of different lengths (checked before sorting them, which would index past the end or
        silently drop the extra entries)."""
        lengths = [len(self.edge_src), len(self.edge_dst), len(self.edge_bytes)]
        if len(set(lengths)) > 1:
            raise PlacerError(f"graph {self.name!r}: edge arrays differ in length (edge_src {lengths[0]}, "
                              f"edge_dst {lengths[1]}, edge_bytes {lengths[2]})")

    def _canonicalize_edges(self) -> None:
        """Sort edges by (src, dst) and merge duplicates (keeping the larger tensor)."""
        src, dst, size = self.edge_src, self.edge_dst, self.edge_bytes
        if len(src) == 0:
            return
        order = np.lexsort((dst, src))
        src, dst, size = src[order], dst[order], size[order]
        new_pair = np.ones(len(src), dtype=bool)
        new_pair[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
        if not new_pair.all():
            starts = np.flatnonzero(new_pair)
            size = np.maximum.reduceat(size, starts)
            src, dst = src[starts], dst[starts]
        for key, array in (("edge_src", src), ("edge_dst", dst), ("edge_bytes", size)):
            array = np.ascontiguousarray(array)
            array.setflags(write=False)
            object.__setattr__(self, key, array)

    @property
    def num_ops(self) -> int:
        return len(self.op_names)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    @cached_property
    def colocation_ids(self) -> np.ndarray:
        """(N,) int64: each op's colocation group as a dense id 0..C-1 (ordered by the stored label).
        The one place colocation groups are numbered: grouping, policies and placement files use it."""
        return dense_ids(self.colocation)

    @property
    def num_colocation_groups(self) -> int:
        return int(self.colocation_ids.max()) + 1 if self.num_ops else 0

    @property
    def total_flops(self) -> float:
        return float(self.flops.sum())

    @property
    def total_param_bytes(self) -> int:
        return int(self.param_bytes.sum())

    @cached_property
    def content_hash(self) -> str:
        """sha256 over every array and the identifying metadata (hex, 16 chars)."""
        digest = hashlib.sha256()
        for text in (self.name, self.framework, str(self.batch_size), str(self.num_params)):
            digest.update(text.encode() + b"\0")
        for key in ("op_names", "op_kinds", "scopes"):
            digest.update(HASH_SEPARATORS[0].join(getattr(self, key)).encode() + HASH_SEPARATORS[1].encode())
        for key in ("flops", "bytes_accessed", "out_bytes", "param_bytes", "colocation", "phases",
                    "allowed_mask", "edge_src", "edge_dst", "edge_bytes"):
            digest.update(np.ascontiguousarray(getattr(self, key)).tobytes())
        return digest.hexdigest()[:16]

    @cached_property
    def topo_order(self) -> np.ndarray:
        """(N,) int64: a deterministic topological order (Kahn's algorithm, smallest op id first)."""
        return _topological_order(self.num_ops, self.edge_src, self.edge_dst, self.name)

    @cached_property
    def topo_position(self) -> np.ndarray:
        """(N,) int64: each op's position in ``topo_order`` (its inverse permutation)."""
        position = np.empty(self.num_ops, dtype=np.int64)
        position[self.topo_order] = np.arange(self.num_ops, dtype=np.int64)
        position.setflags(write=False)
        return position

    @cached_property
    def succ_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(N+1,) offsets and (E,) edge ids sorted by source: successors of op i are
        edge_dst[ids[offsets[i]:offsets[i+1]]]. Edges are already sorted by src, so ids is arange."""
        offsets = np.zeros(self.num_ops + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.edge_src, minlength=self.num_ops), out=offsets[1:])
        return offsets, np.arange(self.num_edges, dtype=np.int64)

    @cached_property
    def pred_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(N+1,) offsets and (E,) edge ids grouped by destination."""
        ids = np.argsort(self.edge_dst, kind="stable").astype(np.int64)
        offsets = np.zeros(self.num_ops + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.edge_dst, minlength=self.num_ops), out=offsets[1:])
        return offsets, ids

    def summary(self) -> dict:
        """The figures `placer graphs show` prints."""
        return {
            "name": self.name,
            "framework": self.framework,
            "batch_size": self.batch_size,
            "ops": self.num_ops,
            "edges": self.num_edges,
            "flops": self.total_flops,
            "forward_flops": float(self.flops[self.phases == PHASE_CODE["forward"]].sum()),
            "params": self.num_params,
            "param_bytes": self.total_param_bytes,
            "groups": self.num_colocation_groups,
            "source": self.source,
            "hash": self.content_hash,
        }


def _checked_cast(name: str, key: str, array: np.ndarray, dtype) -> np.ndarray:
    if array.size and not np.issubdtype(array.dtype, np.number) and array.dtype != bool:
        raise PlacerError(f"graph {name!r}: field {key!r} must be numeric, got {array.dtype}")
    if np.issubdtype(dtype, np.integer) and array.size and np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise PlacerError(f"graph {name!r}: field {key!r} must hold whole numbers")
    if np.issubdtype(dtype, np.integer) and array.size and array.dtype != bool:
        _check_fits(name, key, array, np.iinfo(dtype))
    return array.astype(dtype)


def _check_fits(name: str, key: str, array: np.ndarray, limits: np.iinfo) -> None:
    """Values the narrowing cast would wrap (phase 256 to 0, allowed_mask 257 to 1) are an error."""
    low, high = array.min().item(), array.max().item()  # Python int or float: exact comparisons
    # a float at or above max + 1 does not fit (int64's max is not a float: 2**63 - 1 rounds up to 2**63)
    too_high = high >= limits.max + 1 if isinstance(high, float) else high > limits.max
    if low < limits.min or too_high:
        raise PlacerError(f"graph {name!r}: field {key!r} holds {low if low < limits.min else high}, "
                          f"outside {limits.dtype}'s {limits.min}..{limits.max}")


def _checked_strings(name: str, key: str, array: np.ndarray) -> np.ndarray:
    """(N,) object array of str: a numpy string array is converted; anything else but str (None, 1) refused."""
    if array.dtype.kind in "US":
        return np.array([str(x) for x in array], dtype=object)
    if array.size and array.dtype != object:
        raise PlacerError(f"graph {name!r}: field {key!r} must hold strings, got {array.dtype}")
    array = array.astype(object, copy=False)
    types = set(map(type, array.ravel()))  # one pass at C speed: graphs reach millions of ops
    if types <= {str}:
        return array
    if not all(issubclass(t, str) for t in types):
        bad = next(i for i, x in enumerate(array.ravel()) if not isinstance(x, str))
        raise PlacerError(f"graph {name!r}: {key}[{bad}] is {array.ravel()[bad]!r}, not a string")
    return np.array([str(x) for x in array], dtype=object)  # str subclasses (numpy's str_) as plain str


def _checked_count(name: str, key: str, value) -> int:
    """batch_size / num_params: a whole number >= 0 (a numpy integer becomes an int)."""
    if not is_whole_number(value) or value < 0:
        raise PlacerError(f"graph {name!r}: {key} must be a whole number >= 0, got {value!r}")
    return int(value)


def checked_meta(name: str, meta) -> dict:
    """``meta`` as plain JSON values, so that save_graph can write it and load_graph_file gives it back: numpy
    scalars and arrays become Python numbers, bools, strings and lists (np.int64 broke save_graph: not JSON
    serializable), tuples become lists (as JSON reads them back); None is an empty dict. Anything else JSON
    cannot hold (a set, an object, a non-string key) is one PlacerError naming where it is in ``meta``.
    Called at construction and again by save_graph (``meta`` is a dict, so it can change in between)."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise PlacerError(f"graph {name!r}: meta must be a dict, got {type(meta).__name__}")
    return _plain_json(name, "meta", meta)


def _plain_json(name: str, where: str, value):
    """``value`` (found at ``where``, e.g. "meta['shapes'][0]") with numpy and str/int/float subclasses made
    plain, in a new dict or list; PlacerError for what JSON cannot hold."""
    if value is None or type(value) in (str, bool, int, float):
        return value
    if isinstance(value, (np.generic, np.ndarray)):  # .item() / .tolist(): Python numbers, bools and strings
        return _plain_json(name, where, value.tolist())
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):  # JSON would turn 1 into "1": the loaded meta would differ
                raise PlacerError(f"graph {name!r}: {where} has the key {key!r}, not a string")
            plain[str.__str__(key)] = _plain_json(name, f"{where}[{key!r}]", item)
        return plain
    if isinstance(value, (list, tuple)):
        return [_plain_json(name, f"{where}[{i}]", item) for i, item in enumerate(value)]
    for kind in (str, bool, int, float):  # subclasses (an IntEnum, a str subclass) as the plain value
        if isinstance(value, kind):
            return kind(value) if kind is not str else str.__str__(value)
    raise PlacerError(f"graph {name!r}: {where} is {value!r} ({type(value).__name__}), not a JSON value")


def dense_ids(labels: np.ndarray) -> np.ndarray:
    """(N,) int64 ids 0..K-1 for (N,) integer labels, in the labels' sorted order."""
    return np.unique(np.asarray(labels), return_inverse=True)[1].astype(np.int64).reshape(-1)


def colocation_groups(num_ops: int, pairs: list) -> np.ndarray:
    """(N,) int64 dense group ids (numbered by first op) from union-find over ``pairs``."""
    parent = list(range(num_ops))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    roots = np.array([find(i) for i in range(num_ops)], dtype=np.int64)
    return dense_ids(roots)


HASH_SEPARATORS = ("\0", "\1")  # content_hash's between names and after a column: no name may hold them


def validate(graph: OpGraph) -> None:
    """Raise PlacerError naming the first problem: lengths, ranges, signs, uniqueness, cycles."""
    n, where = graph.num_ops, f"graph {graph.name!r}"
    for key in ("op_kinds", "flops", "bytes_accessed", "out_bytes", "param_bytes", "colocation", "scopes",
                "phases", "allowed_mask"):
        if len(getattr(graph, key)) != n:
            raise PlacerError(f"{where}: {key} has {len(getattr(graph, key))} entries for {n} ops")
    e = len(graph.edge_src)
    if len(graph.edge_dst) != e or len(graph.edge_bytes) != e:
        raise PlacerError(f"{where}: edge arrays differ in length")
    if n == 0:  # every command needs an op to place (simulate said "has no ops", naming no file)
        raise PlacerError(f"{where} has no ops")
    for key in ("flops", "bytes_accessed"):
        values = getattr(graph, key)
        if not np.all(np.isfinite(values)):
            raise PlacerError(f"{where}: {key} holds a non-finite value")
        with np.errstate(over="ignore"):  # each finite, the total not: shown as inf, or null
            total = values.sum(dtype=np.float64)
        if not np.isfinite(total):
            raise PlacerError(f"{where}: {key} totals more than a float holds")
    for key in ("flops", "bytes_accessed", "out_bytes", "param_bytes", "edge_bytes"):
        values = getattr(graph, key)
        if values.size and values.min() < 0:
            bad = int(np.argmin(values))
            raise PlacerError(f"{where}: {key}[{bad}] is negative ({values[bad]})")
    for key in ("out_bytes", "param_bytes", "edge_bytes"):  # int64 totals that wrap would turn negative
        total = float(getattr(graph, key).sum(dtype=np.float64))
        if total >= MAX_TOTAL_BYTES:
            raise PlacerError(f"{where}: {key} totals {total:.3g} bytes, more than a graph counts (2**62)")
    if e and (graph.edge_src.min() < 0 or graph.edge_dst.min() < 0
              or graph.edge_src.max() >= n or graph.edge_dst.max() >= n):
        raise PlacerError(f"{where}: an edge names an op outside 0..{n - 1}")
    if e and np.any(graph.edge_src == graph.edge_dst):
        bad = int(np.flatnonzero(graph.edge_src == graph.edge_dst)[0])
        raise PlacerError(f"{where}: op {graph.op_names[graph.edge_src[bad]]!r} feeds itself (cycle)")
    for key in ("op_names", "op_kinds", "scopes"):  # content_hash joins them with these: moved, they hashed alike
        if any(c in "".join(getattr(graph, key)) for c in HASH_SEPARATORS):
            bad = next(x for x in getattr(graph, key) if any(c in x for c in HASH_SEPARATORS))
            raise PlacerError(f"{where}: {key} entry {bad!r} holds a control character (NUL or \\x01)")
    if len(set(graph.op_names)) != n:
        seen: set = set()
        dup = next(x for x in graph.op_names if x in seen or seen.add(x))
        raise PlacerError(f"{where}: op name {dup!r} is not unique")
    if n and (graph.colocation.min() < 0 or graph.colocation.max() >= n):
        raise PlacerError(f"{where}: colocation ids must lie in 0..{n - 1}")
    if n and (graph.phases.min() < 0 or graph.phases.max() >= len(PHASES)):
        raise PlacerError(f"{where}: phase codes must lie in 0..{len(PHASES) - 1}")
    if n and (np.any(graph.allowed_mask == 0) or graph.allowed_mask.max() > ANY_DEVICE):
        raise PlacerError(f"{where}: allowed_mask must be a non-empty subset of {DEVICE_KINDS}")
    _check_colocated_masks(graph, where)
    graph.topo_order  # raises on a cycle


def _check_colocated_masks(graph: OpGraph, where: str) -> None:
    """Ops that must share a device (a colocation group) have a device kind they may all run on: found only
    when the graph was grouped, the error named no file."""
    common = np.full(graph.num_ops, ANY_DEVICE, dtype=np.uint8)  # (N,) by colocation id
    np.bitwise_and.at(common, graph.colocation, graph.allowed_mask.astype(np.uint8))
    if np.any(common[graph.colocation] == 0):
        bad = graph.colocation[int(np.flatnonzero(common[graph.colocation] == 0)[0])]
        names = ", ".join(repr(x) for x in graph.op_names[graph.colocation == bad][:4])
        raise PlacerError(f"{where}: colocation group of ops {names} has no device kind allowed for all of its ops")


def _topological_order(n: int, src: np.ndarray, dst: np.ndarray, name: str) -> np.ndarray:
    import heapq

    if np.all(src < dst):  # every edge points to a larger id: smallest-id-first Kahn visits 0, 1, 2, ...
        return np.arange(n, dtype=np.int64)

    indegree = np.bincount(dst, minlength=n).astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=offsets[1:])
    # edges are sorted by src, so dst[offsets[i]:offsets[i+1]] are op i's successors
    dst_list = dst.tolist()
    off = offsets.tolist()
    deg = indegree.tolist()
    heap = [i for i in range(n) if deg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        op = heapq.heappop(heap)
        order.append(op)
        for k in range(off[op], off[op + 1]):
            succ = dst_list[k]
            deg[succ] -= 1
            if deg[succ] == 0:
                heapq.heappush(heap, succ)
    if len(order) != n:
        stuck = next(i for i in range(n) if deg[i] > 0)
        raise PlacerError(f"graph {name!r} has a cycle (through op {stuck})")
    return np.asarray(order, dtype=np.int64)


def unique_name(wanted: str, taken: set[str]) -> str:
    """``wanted``, or ``wanted_1``, ``wanted_2``, ... : the first not in ``taken``; added to ``taken``."""
    name, k = wanted, 0
    while name in taken:
        k += 1
        name = f"{wanted}_{k}"
    taken.add(name)
    return name
