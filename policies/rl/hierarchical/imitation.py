"""Where the grouper starts: a structural grouping of the atoms (``start_grouping``, the ``prior``), or
the warm start's targets: a grouping of the atoms that keeps each group on one device of a target
placement, and that group's device. No RLlib here.

Groups follow ``graphs.grouping``'s default method with ``max_groups=G``, split where a group straddles
devices of the target; if the split makes more than G groups, each device's pieces (sorted by mean forward
position) are dealt into contiguous runs, the G groups shared among the devices by piece count (at least
one each). Groups are numbered by their members' mean position (the placer's decode order). Only when
the target uses more devices than G does a group straddle devices (its atoms then follow the group's
device, as ``features`` says), so imitation is exact whenever G >= the number of devices used.
"""

from __future__ import annotations

import numpy as np

from graphs.grouping import DEFAULT_METHOD, group_ops


def start_grouping(problem, position: np.ndarray, num_groups: int, method: str = DEFAULT_METHOD) -> np.ndarray:
    """(A,) int64: the atoms' groups under ``graphs.grouping``'s ``method`` with at most G groups, numbered
    by their members' mean position (the placer's decode order)."""
    return _by_position(_atom_groups(problem, num_groups, method), position)


def target_grouping(problem, position: np.ndarray, device: np.ndarray, num_groups: int) -> np.ndarray:
    """(A,) int64 group id in 0..G-1 of every atom; ``device`` (A,) the target device of each atom."""
    atom_group = _atom_groups(problem, num_groups, DEFAULT_METHOD)
    keys, piece = np.unique(atom_group * problem.num_devices + device, return_inverse=True)
    if len(keys) <= num_groups:
        return _by_position(piece.astype(np.int64), position)
    piece_device = keys % problem.num_devices  # (P,)
    piece_position = np.bincount(piece, weights=position) / np.bincount(piece)  # (P,)
    quota = _quotas(np.bincount(piece_device, minlength=problem.num_devices), num_groups)
    label = np.zeros(len(keys), dtype=np.int64)
    start = 0
    for d in range(problem.num_devices):
        members = np.flatnonzero(piece_device == d)
        if not len(members):
            continue
        ordered = members[np.argsort(piece_position[members], kind="stable")]
        label[ordered] = start + (np.arange(len(ordered)) * quota[d]) // len(ordered)
        start += quota[d]
    label = np.minimum(label, num_groups - 1)
    return _by_position(label[piece], position)


def _atom_groups(problem, num_groups: int, method: str) -> np.ndarray:
    """(A,) int64: each atom's group under ``method`` with at most ``num_groups`` groups, as numbered there."""
    coarse = group_ops(problem.graph, max_groups=num_groups, method=method, seed=0).op_group  # (N,)
    atom_group = np.zeros(problem.num_units, dtype=np.int64)
    atom_group[problem.op_unit] = coarse  # atoms are never split by grouping
    return atom_group


def _by_position(groups: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The same groups renumbered 0.. in order of their members' mean position (the decode order)."""
    _, dense = np.unique(groups, return_inverse=True)
    mean = np.bincount(dense, weights=position) / np.bincount(dense)
    rank = np.empty(len(mean), dtype=np.int64)
    rank[np.argsort(mean, kind="stable")] = np.arange(len(mean))
    return rank[dense]


def _quotas(pieces: np.ndarray, total: int) -> np.ndarray:
    """Groups per device, proportional to its pieces, at least one per used device, summing to <= total."""
    used = pieces > 0
    quota = np.where(used, np.maximum(1, (total * pieces) // max(int(pieces.sum()), 1)), 0)
    while quota.sum() > total and (quota > 1).any():
        quota[np.argmax(quota)] -= 1
    while quota.sum() < total and (quota < pieces).any():
        quota[np.argmax(np.where(quota < pieces, pieces - quota, -1))] += 1
    return quota
