"""Alike devices: relabelings of a machine's devices that change nothing the simulator sees, and the
canonical form of a placement under them.

A placement that puts the first layers on gpu:2 and the last on gpu:0 runs as fast as the one that swaps
the two, when swapping them maps every link onto a link of the same bandwidth and latency and keeps which
links share a channel, up to one thing: a channel serves copies requested at the same instant in order of
their destination device's index, so a relabeling can reorder them. A review measured how much, swapping
alike GPUs of random placements: up to 0.3% of the step on paper-4gpu (33 of 40 placements moved), up to
19.5% on h200x8 (a synthetic graph), none on paper-2gpu; peaks move with the order. The teacher measures the
relabeled placement again for that reason (teacher.py). A network that reads a device's ordinal among its
kind can learn "early groups to the first GPU" only if the placements it imitates agree on such labels, so
the teacher's placements are relabeled to their canonical form first: among the machine's automorphisms, the one that
best lines device indices up with the groups' topological positions (the largest work-weighted sum of
position x device index; ties: the placement read in topological order that is lexicographically smallest).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from measurers.machine import Machine
from measurers.sim.links import link_table

MAX_PERMUTED = 8  # at most 8! = 40,320 relabelings are tried (over every class of alike devices together)


def device_automorphisms(machine: Machine) -> np.ndarray:
    """(K, D) int64: every permutation p of the devices (p[d] = new label of d) that keeps each device's
    figures (every field but its name: a machine file may give one of two GPUs of a model its own
    peak_flops) and every link's bandwidth, latency and channel sharing; the identity first."""
    d = machine.num_devices
    models = [dataclasses.astuple(dev)[1:] for dev in machine.devices]  # Device.name comes first
    table = link_table(machine)
    link = np.maximum(table.link_of, 0)
    has = table.link_of >= 0
    bandwidth = np.where(has, table.bandwidth_Bps[link] if len(table.bandwidth_Bps) else 0.0, 0.0)  # (D, D)
    latency = np.where(has, table.latency_s[link] if len(table.latency_s) else 0.0, 0.0)
    channel = table.channel_of  # (D, D)
    same_channel = (channel.reshape(-1)[:, None] == channel.reshape(-1)[None, :]) & (channel.reshape(-1) >= 0)[:, None]
    classes: dict[tuple, list[int]] = {}
    for i, key in enumerate(models):
        classes.setdefault(key, []).append(i)
    candidates = int(np.prod([math.factorial(len(members)) for members in classes.values()]))
    if candidates > math.factorial(MAX_PERMUTED):  # too many to try: no relabeling
        return np.arange(d, dtype=np.int64)[None]
    found = []
    for choice in itertools.product(*(itertools.permutations(m) for m in classes.values())):
        p = np.arange(d)
        for members, image in zip(classes.values(), choice):
            p[list(members)] = image
        if not (np.array_equal(bandwidth[np.ix_(p, p)], bandwidth) and np.array_equal(latency[np.ix_(p, p)], latency)):
            continue
        # p maps device i to p[i]: the link (i, j) becomes (p[i], p[j]); inv reads the relabeled matrices back
        inv = np.argsort(p)
        moved = channel[np.ix_(inv, inv)].reshape(-1)
        moved_same = (moved[:, None] == moved[None, :]) & (moved >= 0)[:, None]
        if np.array_equal(moved_same, same_channel):
            found.append(p)
    found.sort(key=lambda p: (not np.array_equal(p, np.arange(d)), tuple(p)))
    return np.array(found, dtype=np.int64)


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
