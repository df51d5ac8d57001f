"""Alike devices: the canonical form of a placement under the machine's relabelings that change nothing
the simulator sees (measurers/automorphisms.py).

A placement that puts the first layers on gpu:2 and the last on gpu:0 runs exactly as fast as the one
that swaps the two, when swapping them maps every link onto a link of the same bandwidth and latency and
keeps which links share a channel. A network that reads a device's ordinal among its kind can learn
"early groups to the first GPU" only if the placements it imitates agree on such labels, so the teacher's
placements are relabeled to their canonical form first: among the machine's automorphisms, the one that
best lines device indices up with the groups' topological positions (the largest work-weighted sum of
position x device index; ties: the placement read in topological order that is lexicographically smallest).
"""

from __future__ import annotations

import numpy as np


def canonical_placement(units: np.ndarray, position: np.ndarray, weight: np.ndarray,
                        automorphisms: np.ndarray) -> np.ndarray:
    """(G,) the relabeling of ``units`` (G,) under ``automorphisms`` (K, D) that puts the work (``weight``
    (G,)) of late groups (``position`` (G,) in [0, 1]) on high device indices most (see the module
    docstring)."""
    relabeled = automorphisms[:, units]  # (K, G)
    score = np.round((relabeled * (np.asarray(weight) * np.asarray(position))[None, :]).sum(axis=1), 9)  # (K,)
    tied = np.flatnonzero(score == score.max())
    keys = relabeled[tied][:, np.argsort(position, kind="stable")]  # (T, G) read in topological order
    best = tied[np.lexsort(keys.T[::-1])[0]]
    return relabeled[best].copy()
