"""Grouping: coarsen an op graph into at most G groups that a policy places as units.

Every method starts from the graph's colocation groups ("atoms": a backward op with its forward op, an
optimizer update with its Variable, as ``graph.colocation`` says), never splits one, never merges two whose
allowed device kinds are disjoint, and then coarsens to at most ``max_groups``:

- ``"metis"``: a balanced min-cut partition of the atom graph (pymetis; vertex weight = nominal
  compute cost, edge weight = tensor bytes), so heavy edges stay inside groups and groups carry similar work.
- ``"colocation"``: the papers' co-location heuristics: merge an atom into its single successor /
  predecessor, then merge along the heaviest edges while a group stays under the average cost (tiny groups
  join their heaviest neighbour even past it, in the first pass up to twice the average or 1/16 of the
  graph), doubling the cap until at most G groups are left.
- ``"topo"``: cut the topological order into G runs of equal cost.
- ``"scope"`` (default): the model's own structure: atoms are keyed by their name scope, cut at the deepest level
  that gives at most G keys (``encoder.layer0``, ``attention``, ...); each key gets a share of the G groups
  by cost (at least one), and a key with several groups is split by METIS on its own atoms. Every group
  then lies inside one layer, so placements that follow the model's layers (the expert's, pipelines of
  layers) can be expressed, which METIS groups that straddle layers cannot. A graph without scopes, or with
  more top-level scopes than G (ResNet-50's Keras layer names), is grouped as ``"metis"``.
- ``"fusion"``: Moirai's fusion-aware coarsening: first contract the atoms along the edges a runtime would
  fuse (``graphs.fusion``: element-wise chains into their producer, views, bias/activation/normalization
  after a matmul or conv, element-wise prologues of reductions; never across phases, one forward
  matmul/conv per unit, with the backward kernels colocated with it), so no group boundary cuts a fused
  kernel; then group those fused units as ``"scope"`` groups atoms (``"metis"`` without scopes). With room
  for every atom alone (as for every method), nothing is fused.

Every command groups with "scope" into at most 32 groups unless a flag says otherwise (``DEFAULT_METHOD``,
``DEFAULT_MAX_GROUPS``); BENCHMARKS.md ("Grouping", "Learner") has the measurements behind both choices and
how the methods compare (bytes crossing groups, group costs, speed).

Whatever a method leaves above G is merged by the same heavy-edge passes; parts of the graph that no edge
joins (inception-v3's 23 small shape computations) are then joined in topological order, so they do not push
the edge passes to merge everything else. A group's ops run where all of them may, so a part whose ops' allowed
device kinds differ is split first (a CPU-only op apart from the ops that may run anywhere), and the merges
join groups of one allowed mask before any other (the restricted pieces with each other while they stay
under a group's share of the cost): one CPU-only op of no cost no longer pins its layer to the CPU. Where every
op may run anywhere (every benchmark graph) none of this changes a group. Results depend only on the graph,
G, the method and the seed.

The seed reaches every method that calls METIS: "metis", and "scope" and "fusion" too (a scope key with
several groups, and graphs they fall back to METIS for); "colocation" and "topo" ignore it. METIS seeds
glibc's ``rand`` with it (pymetis calls ``srand``), and glibc treats ``srand(0)`` as ``srand(1)``, so seeds
0 and 1 give the same groups (kept: any mapping that tells them apart moves every seed-0 or every seed-1
figure; the 32 default groups of resnet-50, inception-v3 and transformer depend on the seed, and
tests/bench/bench_giph.py, whose seed-1 and seed-2 figures BENCHMARKS.md records, groups with the run's seed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from graphs.c_stdout import c_stdout_dropped
from graphs.errors import PlacerError, check_seed, is_whole_number
from graphs.fusion import fusible_edges, fusion_anchors
from graphs.opgraph import ANY_DEVICE, DEVICE_KINDS, OpGraph

METHODS = ("metis", "colocation", "topo", "scope", "fusion")
DEFAULT_METHOD = "scope"  # the default of every command (search, baselines, graphs show, reproduce)
DEFAULT_MAX_GROUPS = 32  # why 32: BENCHMARKS.md, "Learner"
# A nominal device for the cost of an op (a roofline with a fixed launch overhead): only relative costs
# matter, and the overhead gives zero-flop ops (views, Variables) a small non-zero weight.
NOMINAL_FLOPS_PER_S = 1e13
NOMINAL_BANDWIDTH_BPS = 1e12
NOMINAL_OP_OVERHEAD_S = 1e-6
METIS_PRECOARSEN_FACTOR = 64  # above this many atoms per part, coarsen before calling METIS
METIS_CLAMP = 8  # METIS sees an atom as at most 1/8 of a part (see _metis)
# A group below the "tiny" cost joins a neighbour even past the cap, but (in _merge_chains and METIS's
# pre-coarsening) only while the sum stays under FACTOR x the cap or 1/16 of the graph, whichever is more
# (_tiny_join_cap_s). Unlimited, a uniform chain of tiny atoms ended in one group with ~99% of the cost. The
# constants are the smallest that leave every built-in benchmark's grouping as it was (issue: figures).
TINY_JOIN_CHAIN_FACTOR = 2.0
TINY_JOIN_PIECE_FACTOR = 8.0  # the pre-coarsening cap is 1/16 of a part: pieces stay under half a part
TINY_JOIN_MIN_SHARE = 1 / 16


def majority_device(op_group: np.ndarray, num_groups: int, op_placement: np.ndarray) -> np.ndarray:
    """(N,) or (B, N) device per op -> (G,) or (B, G): each group's majority device (ties: lowest index).

    The one group-to-op collapse of the project (groupings, placement problems and the expert rules use
    it); the exact inverse of expanding a group placement."""
    placement = np.asarray(op_placement)
    batch = placement.reshape(-1, placement.shape[-1]).astype(np.int64)  # (B, N)
    devices = int(batch.max()) + 1 if batch.size else 1
    rows = np.arange(len(batch), dtype=np.int64)[:, None]
    key = (rows * num_groups + np.asarray(op_group, dtype=np.int64)[None, :]) * devices + batch
    counts = np.bincount(key.ravel(), minlength=len(batch) * num_groups * devices)
    majority = counts.reshape(len(batch), num_groups, devices).argmax(axis=2)  # (B, G)
    return majority[0] if placement.ndim == 1 else majority


@dataclass(frozen=True, eq=False)
class Grouping:
    """A partition of a graph's ops into ``num_groups`` groups, each placed on one device."""

    op_group: np.ndarray  # (N,) int64: dense group id of every op, 0..G-1, every group non-empty
    num_groups: int
    group_allowed_mask: np.ndarray  # (G,) uint8: AND of the allowed_mask of the group's ops
    method: str = ""

    def __post_init__(self) -> None:
        op_group = np.ascontiguousarray(self.op_group, dtype=np.int64)
        mask = np.ascontiguousarray(self.group_allowed_mask, dtype=np.uint8)
        g = int(self.num_groups)
        if op_group.ndim != 1 or mask.shape != (g,):
            raise PlacerError(f"grouping: op_group must be (N,) and group_allowed_mask ({g},)")
        if len(op_group) and (op_group.min() < 0 or op_group.max() >= g):
            raise PlacerError(f"grouping: group ids must lie in 0..{g - 1}")
        if np.any(np.bincount(op_group, minlength=g) == 0):
            raise PlacerError("grouping: every group must hold at least one op")
        if np.any(mask == 0):
            raise PlacerError(f"grouping: group {int(np.argmin(mask))} allows no device kind")
        for key, value in (("op_group", op_group), ("group_allowed_mask", mask)):
            value.setflags(write=False)
            object.__setattr__(self, key, value)
        object.__setattr__(self, "num_groups", g)

    @classmethod
    def from_op_group(cls, op_group: np.ndarray, allowed_mask: np.ndarray, method: str = "") -> Grouping:
        """Build from dense group ids and the ops' allowed masks (the group masks are their AND)."""
        op_group = np.asarray(op_group, dtype=np.int64)
        allowed_mask = np.asarray(allowed_mask)
        if op_group.ndim != 1 or allowed_mask.shape != op_group.shape:
            raise PlacerError(f"a grouping needs one group id and one allowed mask per op, got shapes "
                              f"{op_group.shape} and {allowed_mask.shape}")
        if len(op_group) and op_group.min() < 0:
            raise PlacerError(f"group ids must not be negative, got {int(op_group.min())}")
        g = int(op_group.max()) + 1 if len(op_group) else 0
        return cls(op_group, g, _group_mask_and(op_group, np.asarray(allowed_mask, np.uint8), g), method)

    @property
    def num_ops(self) -> int:
        return len(self.op_group)

    def expand(self, group_placement: np.ndarray) -> np.ndarray:
        """(G,) or (B, G) device per group -> (N,) or (B, N) device per op."""
        placement = np.asarray(group_placement)
        if placement.ndim not in (1, 2) or placement.shape[-1] != self.num_groups:
            raise PlacerError(f"group placement has shape {placement.shape}; expected ({self.num_groups},) "
                              f"or (B, {self.num_groups})")
        if placement.size and not np.issubdtype(placement.dtype, np.integer):
            raise PlacerError(f"group placement must hold integer device indices, got {placement.dtype}")
        return placement.astype(np.int64, copy=False)[..., self.op_group]

    def collapse(self, op_placement: np.ndarray) -> np.ndarray:
        """(N,) or (B, N) device per op -> (G,) or (B, G): each group's majority device (ties: lowest index).
        Exact inverse of ``expand``."""
        placement = np.asarray(op_placement)
        if placement.ndim not in (1, 2) or placement.shape[-1] != self.num_ops:
            raise PlacerError(f"op placement has shape {placement.shape}; expected ({self.num_ops},) "
                              f"or (B, {self.num_ops})")
        if placement.size and (not np.issubdtype(placement.dtype, np.integer) or placement.min() < 0):
            raise PlacerError("op placement must hold non-negative integer device indices")
        return majority_device(self.op_group, self.num_groups, placement)

    def split_by(self, op_placement: np.ndarray, allowed_mask: np.ndarray) -> Grouping:
        """Every group split by the devices ``op_placement`` (N,) gives its ops: one group per (group,
        device) pair that holds ops, numbered by group then device, so the placement is exactly a group
        placement of the result (at most G x D groups). ``allowed_mask``: the ops' own (N,) masks (a part
        may allow more than the whole group did). Keeps colocation when the placement does."""
        placement = np.asarray(op_placement)
        if placement.shape != (self.num_ops,) or not np.issubdtype(placement.dtype, np.integer) or (
                placement.size and placement.min() < 0):
            raise PlacerError(f"op placement to split the groups by must hold ({self.num_ops},) non-negative "
                              f"integer devices, got shape {placement.shape}, {placement.dtype}")
        pairs = self.op_group * (int(placement.max(initial=0)) + 1) + placement.astype(np.int64)
        split = np.unique(pairs, return_inverse=True)[1].astype(np.int64)
        return Grouping.from_op_group(split, allowed_mask, f"{self.method}+split" if self.method else "split")

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Arrays to store with a run (np.savez, Parquet columns); ``from_arrays`` reads them back."""
        return {"op_group": self.op_group, "group_allowed_mask": self.group_allowed_mask,
                "method": np.array(self.method)}

    @classmethod
    def from_arrays(cls, arrays) -> Grouping:
        try:
            mask = np.asarray(arrays["group_allowed_mask"])
            method = str(arrays["method"]) if "method" in arrays else ""
            return cls(np.asarray(arrays["op_group"]), len(mask), mask, method)
        except KeyError as exc:
            raise PlacerError(f"grouping arrays lack {exc}") from None


def op_cost_s(graph: OpGraph) -> np.ndarray:
    """(N,) float64: nominal run time of each op (roofline on a nominal device plus a launch overhead)."""
    return (np.maximum(graph.flops / NOMINAL_FLOPS_PER_S, graph.bytes_accessed / NOMINAL_BANDWIDTH_BPS)
            + NOMINAL_OP_OVERHEAD_S)


def group_edges(graph: OpGraph, op_group: np.ndarray, num_groups: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges between groups: (src, dst, bytes) with internal edges dropped and parallel ones summed,
    sorted by (src, dst). Each (E_g,) int64."""
    return _contract(op_group[graph.edge_src], op_group[graph.edge_dst], graph.edge_bytes, num_groups)


def first_topo_position(graph: OpGraph, op_group: np.ndarray) -> np.ndarray:
    """(G,) float64: for dense group ids, the position in [0, 1] of each group's first op in topological
    order (a group of a forward op and its backward op sits where the forward op does)."""
    _, first = np.unique(op_group[graph.topo_order], return_index=True)
    return first / max(graph.num_ops - 1, 1)


def group_ops(graph: OpGraph, max_groups: int = DEFAULT_MAX_GROUPS, method: str = DEFAULT_METHOD,
              seed: int = 0) -> Grouping:
    """Coarsen ``graph`` into at most ``max_groups`` groups (see the module docstring for the methods); never
    more than its colocation groups, and no partitioner is asked for more parts than it has atoms."""
    if method not in METHODS:
        raise PlacerError(f"unknown grouping method {method!r} (known: {', '.join(METHODS)})")
    if not is_whole_number(max_groups) or max_groups < 1:
        raise PlacerError(f"max_groups must be a whole number of at least 1, got {max_groups!r}")
    check_seed(seed, "the grouping seed")  # METIS would take 2**32 + 1 as 1
    atoms = _Atoms.of(graph)
    if atoms.count <= max_groups:  # every method: room for each atom alone
        return _finish(graph, atoms, np.arange(atoms.count, dtype=np.int64), method)
    fused = method == "fusion"  # fused units take the atoms' place, then are grouped as "scope" groups atoms
    if fused:
        atoms = _Atoms.of(graph, _fused_units(graph, atoms))
        if atoms.count <= max_groups:
            return _finish(graph, atoms, np.arange(atoms.count, dtype=np.int64), method)
        method = "scope"
    keys = _atom_scope_keys(graph, atoms, max_groups) if method == "scope" else None
    if method == "scope" and keys is None:
        method = "metis"  # no scopes, or more top-level scopes than groups: nothing to follow
    if method == "metis":
        labels = _split_by_mask(_metis_labels(atoms, max_groups, seed), atoms.mask)
    elif method == "scope":
        labels = _split_by_mask(_scope_labels(keys, atoms, max_groups, seed), atoms.mask)
    elif method == "topo":
        labels = _split_by_mask(_topo_labels(atoms, max_groups), atoms.mask)
    else:
        labels = np.arange(atoms.count, dtype=np.int64)
    forest = _Forest.of(labels, atoms)
    if method == "colocation":
        _merge_chains(forest, atoms, max_groups)
    _merge_to_limit(forest, atoms, max_groups)
    return _finish(graph, atoms, forest.labels(), "fusion" if fused else method)


def fused_unit_ids(graph: OpGraph) -> np.ndarray:
    """(N,) int64: dense id of each op's fused unit: the colocation atoms contracted along the edges
    ``graphs.fusion`` says a runtime would fuse, never joining two units that both hold a dense op (TVM's
    one anchor per fused kernel; without it, colocation chains the kernels of every time step into one
    unit) nor two whose allowed device kinds differ (no kernel fuses an op with one its device cannot run).
    Edges are taken in (src, dst) order."""
    return _fused_units(graph, _Atoms.of(graph))


def _fused_units(graph: OpGraph, atoms: _Atoms) -> np.ndarray:
    fuse = fusible_edges(graph)  # (E,) bool
    anchors = np.bincount(atoms.of_op, weights=fusion_anchors(graph), minlength=atoms.count)  # (A,) dense ops
    forest = _Forest(np.arange(atoms.count, dtype=np.int64), anchors, atoms.mask.copy(), atoms.count)
    # The merge skips a pair when the summed "cost" exceeds the cap while both sides exceed ``tiny``: with
    # cost = dense ops, cap 1 and tiny 0, that is exactly when both sides hold a dense op.
    forest.merge(atoms.of_op[graph.edge_src[fuse]], atoms.of_op[graph.edge_dst[fuse]], 1.0, 0.0, 0,
                 same_mask=True)  # no kernel fuses an op with one its device cannot run
    return forest.labels()[atoms.of_op]


@dataclass(frozen=True)
class _Atoms:
    """The colocation groups of a graph, contracted: the units grouping never splits."""

    of_op: np.ndarray  # (N,) int64: atom of each op
    count: int
    cost: np.ndarray  # (A,) float64: summed nominal op cost
    mask: np.ndarray  # (A,) uint8: AND of the ops' allowed masks
    topo: np.ndarray  # (A,) float64: topological position of the atom's first op, in [0, 1]
    src: np.ndarray  # (E_a,) int64: contracted edges, internal ones dropped, parallel ones summed
    dst: np.ndarray  # (E_a,) int64
    bytes: np.ndarray  # (E_a,) int64

    @classmethod
    def of(cls, graph: OpGraph, of_op: np.ndarray | None = None) -> _Atoms:
        """The colocation groups, or the units of dense ids ``of_op`` (N,) that must be unions of them."""
        of_op = graph.colocation_ids if of_op is None else of_op
        count = int(of_op.max()) + 1 if len(of_op) else 0
        mask = _group_mask_and(of_op, graph.allowed_mask, count)  # never 0: the graph checks its colocation
        topo = first_topo_position(graph, of_op)
        cost = np.bincount(of_op, weights=op_cost_s(graph), minlength=count)
        src, dst, size = group_edges(graph, of_op, count)
        return cls(of_op, count, cost, mask, topo, src, dst, size)


def _group_mask_and(op_group: np.ndarray, allowed_mask: np.ndarray, num_groups: int) -> np.ndarray:
    """(G,) uint8: per group, the device-kind bits every one of its ops allows."""
    sizes = np.bincount(op_group, minlength=num_groups)
    mask = np.zeros(num_groups, dtype=np.uint8)
    for bit in range(len(DEVICE_KINDS)):
        has = np.bincount(op_group, weights=(allowed_mask >> bit) & 1, minlength=num_groups)
        mask |= ((has == sizes) << bit).astype(np.uint8)
    return mask


def _group_mask_or(op_group: np.ndarray, allowed_mask: np.ndarray, num_groups: int) -> np.ndarray:
    """(G,) uint8: per group, the device-kind bits any of its ops allows."""
    mask = np.zeros(num_groups, dtype=np.uint8)
    np.bitwise_or.at(mask, op_group, allowed_mask.astype(np.uint8))
    return mask


def _contract(src: np.ndarray, dst: np.ndarray, size: np.ndarray, count: int):
    keep = src != dst
    key = src[keep] * np.int64(count) + dst[keep]
    unique, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse.ravel(), weights=size[keep], minlength=len(unique)).astype(np.int64)
    return unique // count, unique % count, summed


def _split_by_mask(labels: np.ndarray, atom_mask: np.ndarray) -> np.ndarray:
    """Split every group whose atoms' masks differ into one group per restricted mask (unrestricted atoms
    stay together); the merge passes join pieces of one mask first (``_merge_to_limit``). A group kept whole
    ran where its most restricted op may: one CPU-only op of no cost pinned a scope of 68% of a model's
    FLOPs to the CPU (a BERT with its Gather ops CPU-only, 3x the single-GPU step)."""
    count = int(labels.max()) + 1
    mixed = _group_mask_and(labels, atom_mask, count) != _group_mask_or(labels, atom_mask, count)
    if not mixed.any():
        return labels
    restricted = np.where(mixed[labels] & (atom_mask != ANY_DEVICE), atom_mask, 0).astype(np.int64)
    return np.unique(labels * 256 + restricted, return_inverse=True)[1].astype(np.int64).ravel()


def _metis_labels(atoms: _Atoms, parts: int, seed: int) -> np.ndarray:
    """Balanced min-cut partition of the atoms into ``parts`` parts. Large graphs are first coarsened along
    their heaviest edges into pieces of at most 1/16 of a part's cost, which makes METIS several times
    faster on a million ops at the same cut."""
    pieces = np.arange(atoms.count, dtype=np.int64)
    if atoms.count > METIS_PRECOARSEN_FACTOR * parts:
        forest = _Forest.of(pieces, atoms)
        order = np.lexsort((atoms.dst, atoms.src, -atoms.bytes))
        total = atoms.cost.sum()
        cap = total / parts / 16
        forest.merge(atoms.src[order], atoms.dst[order], cap, cap / 64, METIS_PRECOARSEN_FACTOR // 2 * parts,
                     _tiny_join_cap_s(cap, TINY_JOIN_PIECE_FACTOR, total))
        pieces = forest.labels()
    count = int(pieces.max()) + 1
    cost = np.bincount(pieces, weights=atoms.cost, minlength=count)
    src, dst, size = _contract(pieces[atoms.src], pieces[atoms.dst], atoms.bytes, count)
    return _metis(count, cost, src, dst, size, parts, seed)[pieces]


def _metis(count: int, cost: np.ndarray, src: np.ndarray, dst: np.ndarray, size: np.ndarray, parts: int,
           seed: int) -> np.ndarray:
    """(count,) dense part ids from pymetis on the undirected graph of (src, dst, size) edges, in at most
    ``count`` parts: asked for more parts than vertices, METIS prints warnings on stdout and fails."""
    import pymetis

    parts = min(parts, count)
    src, dst, size = _contract(np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([size, size]),
                               count)
    starts = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=count), out=starts[1:])
    # A piece heavier than a part is alone anyway. Unclamped, such heavy-tailed weights make METIS's
    # initial bisections fail ("Cannot bisect a graph with 0 vertices", printed on stdout) and leave parts
    # empty; at 1/8 of a part it uses (nearly) every part and keeps the cut. One clamp left an atom of 99.99%
    # of the cost most of what METIS saw, and 1 group of the 32 asked for came back: see _clamped.
    cost = _clamped(cost, parts)
    vweights = np.maximum(1, np.round(cost / cost.sum() * 1e8)).astype(np.int64)
    eweights = 1 + np.round(size / max(int(size.max(initial=0)), 1) * 1e3).astype(np.int64)  # coarse: faster
    with c_stdout_dropped():  # METIS prints its warnings ("***Cannot bisect a graph with 0 vertices!") there
        result = pymetis.part_graph(parts, pymetis.CSRAdjacency(starts, dst), vweights=vweights,
                                    eweights=eweights, options=pymetis.Options(seed=int(seed)))
    return np.unique(np.asarray(result.vertex_part), return_inverse=True)[1].astype(np.int64).ravel()


def _clamped(cost: np.ndarray, parts: int) -> np.ndarray:
    """``cost`` with every entry at most 1/METIS_CLAMP of a part of the total before the clamp. Where entries
    above a whole part of what METIS then sees still hold most of it (one or two atoms of 99.9% and more of
    the cost), clamped again against the clamped total until they do not. Only there: clamping again
    everywhere moved nearly every benchmark's grouping, and with it every recorded figure."""
    cost = np.minimum(cost, cost.sum() / parts / METIS_CLAMP)
    for _ in range(64):
        total = cost.sum()
        if cost[cost > total / parts].sum() <= total / 2:
            break
        cost = np.minimum(cost, total / parts / METIS_CLAMP)
    return cost


def _topo_labels(atoms: _Atoms, parts: int) -> np.ndarray:
    """Cut the atoms, in topological order, into ``parts`` consecutive runs of equal cost."""
    order = np.lexsort((np.arange(atoms.count), atoms.topo))
    cost = atoms.cost[order]
    center = np.cumsum(cost) - cost / 2
    run = np.minimum((center / cost.sum() * parts).astype(np.int64), parts - 1)
    labels = np.empty(atoms.count, dtype=np.int64)
    labels[order] = run
    return np.unique(labels, return_inverse=True)[1].astype(np.int64).ravel()


def _scope_labels(keys: np.ndarray, atoms: _Atoms, parts: int, seed: int) -> np.ndarray:
    """Atoms grouped by scope key ((A,) dense ids); a key given several groups is split by METIS on its own
    atoms."""
    count = int(keys.max()) + 1
    shares = _share_parts(np.bincount(keys, weights=atoms.cost, minlength=count), parts)  # (K,) groups per key
    labels = np.empty(atoms.count, dtype=np.int64)
    first_label = np.concatenate([[0], np.cumsum(shares)[:-1]])  # (K,)
    for key in range(count):
        members = np.flatnonzero(keys == key)
        share = int(shares[key])
        if share == 1:
            labels[members] = first_label[key]
        elif len(members) <= share:
            labels[members] = first_label[key] + np.arange(len(members))
        else:
            labels[members] = first_label[key] + _metis_on(members, atoms, share, seed)
    return np.unique(labels, return_inverse=True)[1].astype(np.int64).ravel()


def _metis_on(members: np.ndarray, atoms: _Atoms, parts: int, seed: int) -> np.ndarray:
    """(len(members),) METIS part ids of the subgraph the ``members`` atoms induce."""
    local = np.full(atoms.count, -1, dtype=np.int64)
    local[members] = np.arange(len(members))
    inside = (local[atoms.src] >= 0) & (local[atoms.dst] >= 0)
    return _metis(len(members), atoms.cost[members], local[atoms.src[inside]], local[atoms.dst[inside]],
                  atoms.bytes[inside], parts, seed)


def _atom_scope_keys(graph: OpGraph, atoms: _Atoms, parts: int) -> np.ndarray | None:
    """(A,) dense ids of each atom's scope, cut at the deepest dot level with at most ``parts`` distinct keys;
    None when the graph has no scopes or even the top level has more. An atom's scope is that of its
    costliest scoped op (an unscoped atom inherits one, see ``_inherit_scopes``)."""
    scoped = np.flatnonzero(graph.scopes != "")
    if not len(scoped):
        return None
    cost = op_cost_s(graph)
    order = scoped[np.lexsort((-cost[scoped], atoms.of_op[scoped]))]  # by atom, costliest op first
    atom_scope = np.full(atoms.count, "", dtype=object)
    atom_of = atoms.of_op[order]
    first = np.flatnonzero(np.r_[True, atom_of[1:] != atom_of[:-1]]) if len(order) else order
    atom_scope[atom_of[first]] = graph.scopes[order[first]]
    _inherit_scopes(atom_scope, atoms)
    split = [str(s).split(".") for s in atom_scope]
    depth = max((len(p) for p in split), default=1)
    while depth > 0 and len({tuple(p[:depth]) for p in split}) > parts:
        depth -= 1
    if depth == 0:
        return None
    return np.unique(np.array([".".join(p[:depth]) for p in split], dtype=object),
                     return_inverse=True)[1].astype(np.int64).ravel()


def _inherit_scopes(atom_scope: np.ndarray, atoms: _Atoms) -> None:
    """Give an unscoped atom the scope of its heaviest scoped producer (else consumer), repeatedly, so a
    loss or bookkeeping op joins the layer it feeds on instead of taking a group of its own.

    "Repeatedly" means in rounds: in each round every still-unscoped atom with a producer scoped before the
    round takes the scope of the first such edge in (-bytes, src, dst) order; then the same with consumers.
    Run literally (one pass over all edges per round), that is quadratic on a deep graph with few scoped
    atoms (30-50 s at 32,000 ops); ``_inheritance_sources`` gets the same answer from one BFS per direction."""
    order = np.lexsort((atoms.dst, atoms.src, -atoms.bytes))  # (E_a,) the edges, heaviest first
    for giver, taker in ((atoms.src[order], atoms.dst[order]), (atoms.dst[order], atoms.src[order])):
        source = _inheritance_sources(atom_scope != "", giver, taker)  # (A,) atom whose scope each takes
        taking = source >= 0
        atom_scope[taking] = atom_scope[source[taking]]


@njit(cache=True)
def _inheritance_sources(scoped, giver, taker):
    """(A,) int64: the originally scoped atom whose scope each unscoped atom inherits along giver -> taker
    edges (listed in priority order), -1 for scoped atoms and those no scoped atom reaches.

    The round in which an atom takes a scope is its BFS distance from the scoped atoms, and all the
    producers scoped before that round lie one round earlier (a nearer one would have given it a scope a
    round before). So its giver is the first listed edge from an atom at distance one less: one BFS and one
    pass over the edges replace a pass over all edges per round, with the same tie-breaking."""
    count = len(scoped)
    starts = np.zeros(count + 1, dtype=np.int64)  # (A+1,) CSR of the edges by giver
    for k in range(len(giver)):
        starts[giver[k] + 1] += 1
    for a in range(count):
        starts[a + 1] += starts[a]
    fill = starts[:-1].copy()
    takers = np.empty(len(giver), dtype=np.int64)
    for k in range(len(giver)):
        takers[fill[giver[k]]] = taker[k]
        fill[giver[k]] += 1
    level = np.full(count, -1, dtype=np.int64)  # (A,) BFS distance from the scoped atoms
    queue = np.empty(count, dtype=np.int64)  # (A,) atoms in BFS order
    end = 0
    for a in range(count):
        if scoped[a]:
            level[a] = 0
            queue[end] = a
            end += 1
    head = 0
    while head < end:
        a = queue[head]
        head += 1
        for k in range(starts[a], starts[a + 1]):
            b = takers[k]
            if level[b] < 0:
                level[b] = level[a] + 1
                queue[end] = b
                end += 1
    parent = np.full(count, -1, dtype=np.int64)  # (A,) the atom each inherits from directly
    for k in range(len(giver)):
        g, t = giver[k], taker[k]
        if level[t] > 0 and parent[t] < 0 and level[g] == level[t] - 1:
            parent[t] = g
    source = np.full(count, -1, dtype=np.int64)
    for i in range(end):  # BFS order: a parent's source is known before its children's
        a = queue[i]
        if level[a] > 0:
            p = parent[a]
            source[a] = p if level[p] == 0 else source[p]
    return source


def _share_parts(cost: np.ndarray, parts: int) -> np.ndarray:
    """(K,) int64: ``parts`` split over K keys in proportion to ``cost``, at least one each, the rest by
    largest remainder. (Giving the spare groups to the keys with the heaviest groups evens group costs,
    but the learner found slower nmt-2 placements with it: 0.62-0.69 s against 0.47-0.57 s, three seeds.)"""
    exact = cost / cost.sum() * parts if cost.sum() > 0 else np.zeros(len(cost))
    share = np.maximum(np.floor(exact), 1).astype(np.int64)
    while share.sum() > parts and share.max() > 1:  # the ones given to small keys can overshoot
        share[np.argmax(share)] -= 1
    left = parts - int(share.sum())
    if left > 0:
        share[np.argsort(-(exact - share), kind="stable")[:left]] += 1
    return share


class _Forest:
    """Union-find over atoms; roots carry their group's cost and mask."""

    def __init__(self, parent: np.ndarray, cost: np.ndarray, mask: np.ndarray, count: int):
        self.parent, self.cost, self.mask, self.count = parent, cost, mask, count

    @classmethod
    def of(cls, labels: np.ndarray, atoms: _Atoms) -> _Forest:
        count = int(labels.max()) + 1
        _, first = np.unique(labels, return_index=True)  # the smallest atom of a group is its root
        parent = first[labels].astype(np.int64)
        cost = np.zeros(atoms.count)
        cost[first] = np.bincount(labels, weights=atoms.cost, minlength=count)
        mask = np.zeros(atoms.count, dtype=np.uint8)
        mask[first] = _group_mask_and(labels, atoms.mask, count)
        return cls(parent, cost, mask, count)

    def roots(self) -> np.ndarray:
        return _find_all(self.parent)

    def labels(self) -> np.ndarray:
        return np.unique(self.roots(), return_inverse=True)[1].astype(np.int64).ravel()

    def merge(self, u: np.ndarray, v: np.ndarray, cap: float, tiny: float, target: int,
              tiny_cap: float = np.inf, same_mask: bool = False) -> None:
        """Union the pairs (u[k], v[k]) in order while compatible (``same_mask``: of one allowed mask) and
        under ``cap`` (or one side is below ``tiny`` and the sum under ``tiny_cap``), until ``target`` groups
        are left."""
        self.count = _merge_pairs(self.parent, self.cost, self.mask, u.astype(np.int64), v.astype(np.int64),
                                  cap, tiny, tiny_cap, self.count, target, same_mask)


def _merge_chains(forest: _Forest, atoms: _Atoms, target: int) -> None:
    """Co-location heuristic: an atom with a single successor (or a single predecessor) joins it."""
    out_degree = np.bincount(atoms.src, minlength=atoms.count)
    in_degree = np.bincount(atoms.dst, minlength=atoms.count)
    chain = (out_degree[atoms.src] == 1) | (in_degree[atoms.dst] == 1)
    order = np.lexsort((atoms.dst[chain], atoms.src[chain], -atoms.bytes[chain]))
    total = atoms.cost.sum()
    cap = total / target
    forest.merge(atoms.src[chain][order], atoms.dst[chain][order], cap, cap / 64, target,
                 _tiny_join_cap_s(cap, TINY_JOIN_CHAIN_FACTOR, total), same_mask=True)


def _tiny_join_cap_s(cap_s: float, factor: float, total_s: float) -> float:
    """The most a merge that passes only because one side is tiny may sum to (see TINY_JOIN_MIN_SHARE)."""
    return max(factor * cap_s, total_s * TINY_JOIN_MIN_SHARE)


def _merge_to_limit(forest: _Forest, atoms: _Atoms, target: int) -> None:
    """Merge along the heaviest group-level edges under a cost cap that doubles each pass; then join
    groups adjacent in topological order; then groups of equal masks; all of it first among groups of one
    allowed mask, then (if still above ``target``) among any compatible groups. Raises if masks forbid
    ``target``.
    Tiny groups join here without a limit on the sum (the doubling cap reaches the whole graph anyway)."""
    if forest.count <= target:
        return
    # Groups of one allowed mask join first: a restricted op's group joined with an unrestricted one makes
    # all its ops restricted. Where every op may run anywhere (every benchmark graph), one round does it all.
    _join_small_restricted(forest, atoms, target)
    _merge_passes(forest, atoms, target, same_mask=True)
    total = atoms.cost.sum()
    cap = total / target
    while forest.count > target and cap <= 2 * total:  # what is left differs in allowed masks: join equal masks
        roots, topo = _group_topo(forest, atoms)
        roots = roots[np.lexsort((topo, forest.mask[roots]))]
        forest.merge(roots[:-1], roots[1:], cap, cap / 64, target, same_mask=True)
        cap *= 2
    if forest.count > target:
        _merge_passes(forest, atoms, target, same_mask=False)
    if forest.count > target:
        raise PlacerError(f"cannot group into {target} groups: {forest.count} groups have pairwise disjoint "
                          f"allowed device kinds")


def _join_small_restricted(forest: _Forest, atoms: _Atoms, target: int) -> None:
    """Groups that may run on some device kinds only (the CPU-only ops of a TensorFlow import, split out of
    their scopes) join others of their mask in topological order while the sum stays under a group's share
    of the cost: their neighbours may run anywhere, so no other pass joins them, and each of a BERT's 16
    CPU-only Erf ops (0.02 groups' worth of cost each) held a group of its own."""
    roots, topo = _group_topo(forest, atoms)
    share = atoms.cost.sum() / target
    keep = (forest.mask[roots] != ANY_DEVICE) & (forest.cost[roots] <= share)
    roots, topo = roots[keep], topo[keep]
    roots = roots[np.lexsort((topo, forest.mask[roots]))]  # by mask, then in topological order
    forest.merge(roots[:-1], roots[1:], share, share / 64, target, tiny_cap=share, same_mask=True)


def _merge_passes(forest: _Forest, atoms: _Atoms, target: int, same_mask: bool) -> None:
    """Merge along the heaviest group-level edges under a cost cap that doubles each pass, then join groups
    adjacent in topological order."""
    total = atoms.cost.sum()
    base = cap = total / target
    # No edge joins two components: the edge passes stop one group above ``target`` per component past the
    # first, and the topological pass joins those. Counted in, 23 small components of inception-v3 made the
    # edge passes merge all the rest into one group at G=16 (99.98% of the cost, 15 groups of two ops beside).
    edge_target = target + _component_count(forest, atoms) - 1
    while forest.count > edge_target and cap <= 2 * total:
        roots = forest.roots()
        u, v, size = _contract(roots[atoms.src], roots[atoms.dst], atoms.bytes, atoms.count)
        order = np.lexsort((v, u, -size))
        forest.merge(u[order], v[order], cap, base / 64, edge_target, same_mask=same_mask)
        cap *= 2
    cap = base
    while forest.count > target and cap <= 2 * total:  # groups with no edge between them
        roots, topo = _group_topo(forest, atoms)
        roots = roots[np.argsort(topo, kind="stable")]
        forest.merge(roots[:-1], roots[1:], cap, base / 64, target, same_mask=same_mask)
        cap *= 2


def _component_count(forest: _Forest, atoms: _Atoms) -> int:
    """How many weakly connected components the current groups form (edges in either direction)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    roots = forest.roots()
    adjacency = coo_matrix((np.ones(len(atoms.src)), (roots[atoms.src], roots[atoms.dst])),
                           shape=(atoms.count, atoms.count))
    _, labels = connected_components(adjacency, directed=False)
    return len(np.unique(labels[np.unique(roots)]))


def _group_topo(forest: _Forest, atoms: _Atoms) -> tuple[np.ndarray, np.ndarray]:
    """The (G,) root atoms and (G,) topological position of the current groups' first ops."""
    roots, inverse = np.unique(forest.roots(), return_inverse=True)
    topo = np.full(len(roots), np.inf)
    np.minimum.at(topo, inverse.ravel(), atoms.topo)
    return roots, topo


def _finish(graph: OpGraph, atoms: _Atoms, atom_labels: np.ndarray, method: str) -> Grouping:
    """Dense group ids numbered by each group's first op in topological order."""
    op_labels = atom_labels[atoms.of_op]
    _, first = np.unique(op_labels[graph.topo_order], return_index=True)
    rename = np.empty(len(first), dtype=np.int64)
    rename[np.argsort(first, kind="stable")] = np.arange(len(first))
    return Grouping.from_op_group(rename[op_labels], graph.allowed_mask, method)


@njit(cache=True)
def _find(parent, a):
    while parent[a] != a:
        parent[a] = parent[parent[a]]
        a = parent[a]
    return a


@njit(cache=True)
def _find_all(parent):
    roots = np.empty_like(parent)
    for a in range(len(parent)):
        roots[a] = _find(parent, a)
    return roots


@njit(cache=True)
def _merge_pairs(parent, cost, mask, u, v, cap, tiny, tiny_cap, count, target, same_mask):
    for k in range(len(u)):
        if count <= target:
            break
        a = _find(parent, u[k])
        b = _find(parent, v[k])
        if a == b or (mask[a] & mask[b]) == 0 or (same_mask and mask[a] != mask[b]):
            continue
        merged = cost[a] + cost[b]
        if merged > cap and (min(cost[a], cost[b]) > tiny or merged > tiny_cap):
            continue
        if b < a:
            a, b = b, a
        parent[b] = a
        cost[a] += cost[b]
        mask[a] &= mask[b]
        count -= 1
    return count
