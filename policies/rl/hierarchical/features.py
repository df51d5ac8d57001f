"""What the grouper and the placer see: per-atom features, and per-sample group features and masks.

An atom is a colocation group of the graph (the units of ``problem.at_op_level()``); its ops always share
a device. No RLlib here.

Rules (documented here once, tested in tests/policies/rl/test_hierarchical.py):

- Group mask (what the placer may choose for a group): the devices allowed for atoms holding at least half
  of the group's cost (nominal op time, plus a tiny floor so free atoms count); if no device reaches half,
  the device with the most allowed cost. Empty groups may use every device (nothing runs there).
- Atom device: its group's device when the atom may use it, else the atom's fastest allowed device
  (``problem.unit_time_s``, the rule ``PlacementProblem.repair_allowed`` uses). CPU-only atoms inside a
  GPU group therefore land on the CPU, and every placement handed to the measurer is legal.
- Decode order (``by_position``): by default the group index. Group ids are topological already: the
  grouper's start numbers its groups by mean position (``imitation.start_grouping``; the ``position``
  prior puts atoms in group ``quantile * G``, ``module.topo_prior``) and so do warm-start targets
  (``imitation.target_grouping``), so runs of one device
  along the decoder are pipeline stages, as in the 2017 placer's order. Sorting each sample's groups by
  their members' mean forward position (``by_position=True``, empty groups last) was tried first: moving
  one atom between groups can then reorder many groups, the decoder sees a different sequence, and a
  placer imitating a warm start sampled placements 60-90% like it (1.8-2.9 s against the expert's 0.76 s
  on nmt-4) instead of a group or two away.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from graphs.features import FEATURE_COLUMNS, group_features
from graphs.grouping import Grouping, op_cost_s

COST_FLOOR = 1e-3  # share of the mean atom cost every atom weighs at least (mask majority)
FORWARD_COLUMN = FEATURE_COLUMNS.index("forward_position")
EMPTY_POSITION = 2.0  # decode position of an empty group: after every real one (positions are in [0, 1])


@dataclass(frozen=True, eq=False)
class Atoms:
    """The problem's atoms as the networks see them."""
    features: np.ndarray  # (A, F) float32: graphs.features columns, standardized, plus log cost
    cost_s: np.ndarray  # (A,) float64: nominal op time, floored
    position: np.ndarray  # (A,) float64: mean forward topological position in [0, 1]
    allowed: np.ndarray  # (A, D) bool
    fallback: np.ndarray  # (A,) int64: fastest allowed device
    quantile: np.ndarray  # (A,) float64 in [0, 1): cost share of the atoms before it in position order

    @property
    def count(self) -> int:
        return len(self.cost_s)

    @property
    def num_features(self) -> int:
        return self.features.shape[1]


def atom_features(problem) -> Atoms:
    """Per-atom features of an op-level problem (its units are the colocation groups)."""
    graph = problem.graph
    grouping = Grouping.from_op_group(problem.op_unit, graph.allowed_mask)
    matrix = group_features(graph, grouping).as_matrix(normalize=True)  # (A, 22)
    cost = np.bincount(problem.op_unit, weights=op_cost_s(graph), minlength=problem.num_units)  # (A,)
    cost = np.maximum(cost, COST_FLOOR * max(float(cost.mean()), 1e-12))
    log_cost = np.log(cost)
    log_cost = (log_cost - log_cost.mean()) / max(float(log_cost.std()), 1e-6)
    features = np.concatenate([matrix, log_cost[:, None].astype(np.float32)], axis=1)
    fallback = np.argmin(problem.unit_time_s, axis=1).astype(np.int64)  # inf where not allowed
    position = matrix[:, FORWARD_COLUMN].astype(np.float64)
    order = np.argsort(position, kind="stable")
    quantile = np.empty(len(cost))
    quantile[order] = (np.cumsum(cost[order]) - cost[order]) / cost.sum()
    return Atoms(features.astype(np.float32), cost, position, problem.unit_allowed.copy(), fallback, quantile)


@dataclass(frozen=True, eq=False)
class GroupInputs:
    """The placer's input for B sampled groupings, groups in decode order."""
    features: torch.Tensor  # (B, G, F + 2) float32
    allowed: torch.Tensor  # (B, G, D) bool
    order: torch.Tensor  # (B, G) int64: group index placed at each decoder step


class GroupBuilder:
    """Turns sampled groupings (B, A) into placer inputs and placements; holds the atoms as tensors."""

    def __init__(self, atoms: Atoms, num_groups: int, by_position: bool = False):
        self.atoms, self.num_groups, self.by_position = atoms, int(num_groups), by_position
        self.features = torch.from_numpy(atoms.features)  # (A, F)
        self.cost = torch.from_numpy(atoms.cost_s)  # (A,) float64
        self.position = torch.from_numpy(atoms.position)  # (A,)
        self.allowed = torch.from_numpy(atoms.allowed)  # (A, D)
        self.fallback = torch.from_numpy(atoms.fallback)  # (A,)
        self.total_cost = float(atoms.cost_s.sum())

    def inputs(self, assign: torch.Tensor) -> GroupInputs:
        """assign (B, A) int64 group ids -> features, masks and decode order of the G groups per row."""
        b, g = assign.shape[0], self.num_groups
        flat = (assign + g * torch.arange(b)[:, None]).reshape(-1)  # (B*A,) row-major slot ids
        count = torch.bincount(flat, minlength=b * g).double()  # (B*G,)
        cost = torch.bincount(flat, weights=self.cost.repeat(b), minlength=b * g)  # (B*G,)
        sums = torch.zeros(b * g, self.features.shape[1]).index_add_(0, flat, self.features.repeat(b, 1))
        mean = sums / count.clamp_min(1.0)[:, None].float()  # (B*G, F), zeros where empty
        scale = np.log1p(self.atoms.count)
        extra = torch.stack([torch.log1p(cost * self.atoms.count / self.total_cost) / scale,
                             torch.log1p(count) / scale], dim=1).float()  # (B*G, 2)
        feats = torch.cat([mean, extra], dim=1).reshape(b, g, -1)  # (B, G, F + 2)
        allowed = self._mask(flat, cost, b).reshape(b, g, -1)
        if not self.by_position:
            return GroupInputs(feats, allowed, torch.arange(g).repeat(b, 1))
        position = torch.bincount(flat, weights=self.position.repeat(b), minlength=b * g)
        position = torch.where(count > 0, position / count.clamp_min(1.0), torch.full_like(position, EMPTY_POSITION))
        order = torch.argsort(position.reshape(b, g), dim=1, stable=True)  # (B, G)
        feats = torch.gather(feats, 1, order[..., None].expand_as(feats))
        allowed = torch.gather(allowed, 1, order[..., None].expand_as(allowed))
        return GroupInputs(feats, allowed, order)

    def _mask(self, flat: torch.Tensor, cost: torch.Tensor, b: int) -> torch.Tensor:
        """(B*G, D) bool: devices allowed for at least half the group's cost (see the module docstring)."""
        d = self.allowed.shape[1]
        weighted = (self.cost[:, None] * self.allowed.double()).repeat(b, 1)  # (B*A, D)
        allowed_cost = torch.zeros(len(cost), d, dtype=torch.float64).index_add_(0, flat, weighted)
        mask = allowed_cost >= 0.5 * cost[:, None] * (1 - 1e-9)
        best = torch.nn.functional.one_hot(allowed_cost.argmax(dim=1), d).bool()
        mask = torch.where(mask.any(dim=1, keepdim=True), mask, best)
        return torch.where((cost > 0)[:, None], mask, torch.ones_like(mask))

    def atom_devices(self, assign: torch.Tensor, decoded: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Devices (B, A) of the atoms: ``decoded`` (B, G) are in decode order ``order`` (B, G)."""
        group_device = torch.empty_like(decoded).scatter_(1, order, decoded)  # (B, G) by group index
        device = torch.gather(group_device, 1, assign)  # (B, A)
        ok = self.allowed[torch.arange(assign.shape[1])[None, :], device]  # (B, A)
        return torch.where(ok, device, self.fallback[None, :].expand_as(device))
