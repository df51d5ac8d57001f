"""``_inherit_scopes`` (an unscoped atom takes the scope of its heaviest scoped producer, else consumer, in
rounds) against the literal round-by-round algorithm it replaced. The "scope" groups, and every figure
recorded with them, depend on its exact tie-breaking, so the comparison runs on random graphs whose
quantized edge bytes make ties common, and checks that a different tie-breaking would be caught."""

import numpy as np
import pytest

from graphs import grouping
from graphs.grouping import _Atoms, _inherit_scopes, group_ops

SEEDS = range(40)


def _inherit_by_rounds(atom_scope, atoms, order_keys=lambda a: (a.dst, a.src, -a.bytes)):
    """The former implementation, kept as the specification: one pass over every edge per round, each
    unscoped taker with an open edge taking the scope of the first one in ``order_keys`` (lexsort) order."""
    order = np.lexsort(order_keys(atoms))  # (E_a,)
    for giver, taker in ((atoms.src[order], atoms.dst[order]), (atoms.dst[order], atoms.src[order])):
        while True:
            open_edge = (atom_scope[giver] != "") & (atom_scope[taker] == "")
            if not open_edge.any():
                break
            takers, first = np.unique(taker[open_edge], return_index=True)
            atom_scope[takers] = atom_scope[giver[open_edge][first]]


def _random_graph(make_graph, seed: int):
    """A random graph (colocation makes cycles among atoms, like forward/backward pairs) with few or many
    scoped ops, and edge bytes drawn from three values so that heaviest edges often tie."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 300))
    dst = np.repeat(np.arange(1, n), int(rng.integers(1, 4)))
    src = (dst * rng.random(len(dst))).astype(np.int64)  # a DAG of ops, deep when one edge per op
    edges = [(int(s), int(d), int(b)) for s, d, b in zip(src, dst, rng.integers(1, 4, len(dst)) * 1000)]
    colocation = np.arange(n)
    pairs = rng.choice(n, 2 * (n // 10), replace=False)
    colocation[pairs[::2]] = pairs[1::2]
    scopes = np.full(n, "", dtype=object)  # (N,)
    scoped = rng.random(n) < rng.choice([0.01, 0.05, 0.3])
    scoped[rng.integers(n)] = True
    scopes[scoped] = [f"s{rng.integers(4)}.l{rng.integers(3)}" for _ in range(int(scoped.sum()))]
    return make_graph(edges, n, flops=rng.lognormal(14, 2, n), scopes=scopes,
                      colocation=np.unique(colocation, return_inverse=True)[1])


def _random_case(make_graph, seed: int):
    """The atoms of ``_random_graph`` and (A,) scopes of a random few of them."""
    graph = _random_graph(make_graph, seed)
    atoms = _Atoms.of(graph)
    rng = np.random.default_rng(seed + 1000)
    scope = np.full(atoms.count, "", dtype=object)  # (A,)
    scoped = rng.random(atoms.count) < rng.choice([0.01, 0.05, 0.3])
    scoped[rng.integers(atoms.count)] = True
    scope[scoped] = [f"s{rng.integers(4)}.l{rng.integers(3)}" for _ in range(int(scoped.sum()))]
    return scope, atoms


@pytest.mark.parametrize("seed", SEEDS)
def test_inherit_scopes__matches_the_round_by_round_algorithm(make_graph, seed):
    scope, atoms = _random_case(make_graph, seed)
    expected, got = scope.copy(), scope.copy()
    _inherit_by_rounds(expected, atoms)
    _inherit_scopes(got, atoms)
    assert np.array_equal(got, expected)


def test_inherit_scopes__random_cases_exercise_the_tie_breaking(make_graph):
    """Were the larger atom id, or the lighter edge, preferred, some random case must come out different
    (else the comparison above could not catch such a change)."""
    perturbations = {"larger id first": lambda a: (-a.dst, -a.src, -a.bytes),
                     "lighter edge first": lambda a: (a.dst, a.src, a.bytes)}
    for name, keys in perturbations.items():
        caught = 0
        for seed in SEEDS:
            scope, atoms = _random_case(make_graph, seed)
            expected, perturbed = scope.copy(), scope.copy()
            _inherit_by_rounds(expected, atoms)
            _inherit_by_rounds(perturbed, atoms, keys)
            caught += not np.array_equal(perturbed, expected)
        assert caught >= 3, f"only {caught} random cases tell {name!r} from the real tie-breaking"


@pytest.mark.parametrize("seed", range(12))
def test_inherit_scopes__scope_groups_match_the_round_by_round_algorithm(make_graph, monkeypatch, seed):
    """End to end: the "scope" groups of the random graphs, cut at both scope levels."""
    graph = _random_graph(make_graph, seed)
    new = [group_ops(graph, max_groups=g, method="scope").op_group for g in (4, 16)]
    monkeypatch.setattr(grouping, "_inherit_scopes", _inherit_by_rounds)
    old = [group_ops(graph, max_groups=g, method="scope").op_group for g in (4, 16)]
    for a, b in zip(new, old):
        assert np.array_equal(a, b)


def test_inherit_scopes__a_long_chain_scoped_only_at_its_end_takes_that_scope_everywhere():
    """200,000 atoms, 200,000 rounds of the former algorithm (minutes; the BFS takes milliseconds: its speed
    is measured in tests/bench/bench_grouping.py)."""
    n = 200_000
    src = np.arange(n - 1, dtype=np.int64)  # (n-1,)
    atoms = _Atoms(np.arange(n), n, np.ones(n), np.full(n, 3, np.uint8), np.linspace(0, 1, n), src, src + 1,
                   np.full(n - 1, 4, dtype=np.int64))
    scope = np.full(n, "", dtype=object)
    scope[-1] = "head"
    _inherit_scopes(scope, atoms)
    assert np.all(scope == "head")
