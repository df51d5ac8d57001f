"""HSDAG's network and its graph parsing: which unit edges to collapse (the groups), then a device per group.

A sample of B placements of one problem::

    units (G, H), devices (D, H) = encoder(problem)           once
    merge logit of each forward unit edge (M,) = MLP(h_src, h_dst, edge features)
    merged (B, M) ~ Bernoulli(sigmoid(logits))                  one decision per edge and sample
    groups = connected components of the merged edges            K_b of them in sample b; R = sum_b K_b rows
    group rows (R, H) = mean of the members' embeddings; pair features (R, D, P) = the members' mean;
        allowed (R, D) = devices every member may use (any member's when they share none: the members
        then go through ``PlacementProblem.repair_allowed``)
    device logits (R, D) = PairScorer(group rows, devices, pairs, context = the sample's mean group row)
    log pi(sample) = sum of the M merge decisions' log-probs + sum of the K_b devices' log-probs

``temperature`` T divides every logit (merges and devices) when sampling and scoring: T > 1 flattens a
policy that has settled, so a stalled run still draws placements it has not measured (near its mode).

The encoder, device MLP and pair scorer are the gnn package's (``GraphEncoder``, ``PairScorer``), with
the same module names as ``GdpNet``'s so gdp's checkpoint can initialize them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from torch import Tensor, nn

from policies.rl.gnn.inputs import DEVICE_COLUMNS, EDGE_COLUMNS, PAIR_COLUMNS
from policies.rl.gnn.network import GraphEncoder, PairScorer

_ALLOWED_COLUMN = PAIR_COLUMNS.index("allowed")
_FORWARD_COLUMN = EDGE_COLUMNS.index("forward_edge")


class HsdagNet(nn.Module):
    """Encoder, device MLP and pair scorer (as ``GdpNet`` names them) plus the edge scorer of the parser."""

    def __init__(self, hidden_size: int = 64, num_layers: int = 3):
        super().__init__()
        self.encoder = GraphEncoder(hidden_size, num_layers)
        self.devices = nn.Sequential(nn.Linear(len(DEVICE_COLUMNS), hidden_size), nn.ReLU(),
                                     nn.Linear(hidden_size, hidden_size))
        self.scorer = PairScorer(hidden_size, len(PAIR_COLUMNS))
        self.edge_scorer = nn.Sequential(nn.Linear(2 * hidden_size + len(EDGE_COLUMNS), hidden_size), nn.ReLU(),
                                         nn.Linear(hidden_size, 1))

    def embed(self, tensors: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Unit (G, H) and device (D, H) embeddings."""
        return (self.encoder(tensors["node"], tensors["edge_index"], tensors["edge"]),
                self.devices(tensors["device"]))

    def merge_logits(self, units: Tensor, edges: "ParseEdges") -> Tensor:
        """(M,) logit of collapsing each forward unit edge."""
        ends = torch.cat([units[edges.src], units[edges.dst], edges.features], dim=1)  # (M, 2H + F_EDGE)
        return self.edge_scorer(ends).squeeze(-1)

    def device_logits(self, units: Tensor, devices: Tensor, tensors: dict[str, Tensor], rows: Tensor,
                      num_rows: int) -> Tensor:
        """(R, D) logits of each group's device; ``rows`` (B, G) is each unit's group row in 0..R-1."""
        size, g = rows.shape
        flat = rows.reshape(-1)  # (B * G,)
        members = torch.bincount(flat, minlength=num_rows).to(units.dtype)  # (R,)
        group = units.new_zeros(num_rows, units.shape[1]).index_add(0, flat, units.repeat(size, 1))
        group = group / members[:, None]  # (R, H)
        pair = tensors["pair"]
        pair = pair.new_zeros(num_rows, *pair.shape[1:]).index_add(0, flat, pair.repeat(size, 1, 1))
        pair = pair / members[:, None, None]  # (R, D, P)
        allowed_count = units.new_zeros(num_rows, devices.shape[0]).index_add(
            0, flat, tensors["allowed"].to(units.dtype).repeat(size, 1))  # (R, D)
        common = allowed_count == members[:, None]
        allowed = torch.where(common.any(dim=1, keepdim=True), common, allowed_count > 0)  # (R, D)
        pair = torch.cat([pair[..., :_ALLOWED_COLUMN], allowed[..., None].to(pair.dtype),
                          pair[..., _ALLOWED_COLUMN + 1:]], dim=-1)
        sample_of_row = _sample_of_row(rows, num_rows)  # (R,)
        groups_per_sample = torch.bincount(sample_of_row, minlength=size).to(units.dtype)  # (B,)
        context = units.new_zeros(size, units.shape[1]).index_add(0, sample_of_row, group)
        context = (context / groups_per_sample[:, None])[sample_of_row]  # (R, H)
        return self.scorer.score(group, devices, pair, allowed, context)


@dataclass(frozen=True)
class ParseEdges:
    """The unit edges the parser decides on: every forward unit edge once (M of them)."""
    src: Tensor  # (M,) int64
    dst: Tensor  # (M,) int64
    features: Tensor  # (M, F_EDGE)
    num_units: int

    @classmethod
    def of(cls, tensors: dict[str, Tensor]) -> "ParseEdges":
        forward = tensors["edge"][:, _FORWARD_COLUMN] > 0.5
        src, dst = tensors["edge_index"][:, forward]
        return cls(src, dst, tensors["edge"][forward], int(tensors["node"].shape[0]))

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])


@dataclass(frozen=True)
class Sample:
    """B parses and their devices. Group rows are sample-major: sample b's groups are rows
    offsets[b] .. offsets[b] + num_groups[b] - 1, numbered in the order of their first unit."""
    merged: np.ndarray  # (B, M) bool: the edge was collapsed
    rows: np.ndarray  # (B, G) int64: each unit's group row in 0..R-1
    group_device: np.ndarray  # (R,) int64: each group's device (before repair_allowed)

    @property
    def num_groups(self) -> np.ndarray:
        """(B,) groups of each sample: what the parser chose, not a setting."""
        return np.array([len(np.unique(row)) for row in self.rows], dtype=np.int64)

    @property
    def unit_device(self) -> np.ndarray:
        """(B, G) each unit's device: its group's."""
        return self.group_device[self.rows]


def components(edges: ParseEdges, merged: np.ndarray) -> np.ndarray:
    """(B, M) merge decisions -> (B, G) group rows: the connected components of each sample's merged
    edges, numbered sample-major in the order of their first unit."""
    size, g = merged.shape[0], edges.num_units
    sample, edge = np.nonzero(merged)
    src = edges.src.numpy()[edge] + sample * g
    dst = edges.dst.numpy()[edge] + sample * g
    adjacency = coo_matrix((np.ones(len(src)), (src, dst)), shape=(size * g, size * g))
    _, labels = connected_components(adjacency, directed=False)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.empty(len(first), dtype=np.int64)
    order[np.argsort(first, kind="stable")] = np.arange(len(first))
    return order[inverse].reshape(size, g)


def draw(net: HsdagNet, tensors: dict[str, Tensor], edges: ParseEdges, size: int,
         generator: torch.Generator | None, greedy: bool = False, temperature: float = 1.0) -> Sample:
    """``size`` samples at ``temperature`` (greedy: one, every edge with merge probability above 1/2
    collapsed and each group on its most likely device)."""
    with torch.no_grad():
        units, devices = net.embed(tensors)
        merge_p = torch.sigmoid(net.merge_logits(units, edges) / temperature)  # (M,)
        if greedy:
            merged = (merge_p > 0.5)[None].numpy()
        else:
            merged = (torch.rand((size, edges.num_edges), generator=generator) < merge_p).numpy()  # (B, M)
        rows = components(edges, merged)
        num_rows = int(rows.max()) + 1
        logits = net.device_logits(units, devices, tensors, torch.from_numpy(rows), num_rows) / temperature  # (R, D)
        if greedy:
            chosen = logits.argmax(dim=1)
        else:
            chosen = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=generator)[:, 0]
    return Sample(merged, rows, chosen.numpy().astype(np.int64))


def log_prob(net: HsdagNet, tensors: dict[str, Tensor], edges: ParseEdges, sample: Sample,
             temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """(B,) log-probability of each sample under ``net`` at ``temperature`` (with gradients) and the mean
    entropy of its decisions: merge Bernoullis (mean over edges) plus group devices (mean over groups)."""
    units, devices = net.embed(tensors)
    merge_logits = net.merge_logits(units, edges) / temperature  # (M,)
    merged = torch.from_numpy(sample.merged).to(units.dtype)  # (B, M)
    log_merge, log_keep = torch.nn.functional.logsigmoid(merge_logits), torch.nn.functional.logsigmoid(-merge_logits)
    edge_logp = (merged * log_merge + (1.0 - merged) * log_keep).sum(dim=1)  # (B,)
    rows = torch.from_numpy(sample.rows)
    num_rows = len(sample.group_device)
    log_p = torch.log_softmax(net.device_logits(units, devices, tensors, rows, num_rows) / temperature, dim=1)  # (R, D)
    chosen = log_p.gather(1, torch.from_numpy(sample.group_device)[:, None])[:, 0]  # (R,)
    device_logp = units.new_zeros(rows.shape[0]).index_add(0, _sample_of_row(rows, num_rows), chosen)
    merge_entropy = -(torch.sigmoid(merge_logits) * log_merge + torch.sigmoid(-merge_logits) * log_keep)
    entropy = -(log_p.exp() * log_p).sum(dim=1).mean()
    if edges.num_edges:
        entropy = entropy + merge_entropy.mean()
    return edge_logp + device_logp, entropy


def parse_of(edges: ParseEdges, units: np.ndarray) -> Sample:
    """The parse of the (G,) placement ``units`` (B = 1): every edge whose ends share a device collapsed,
    each group on its members' device. What imitating a warm start fits."""
    units = np.asarray(units, dtype=np.int64)
    merged = (units[edges.src.numpy()] == units[edges.dst.numpy()])[None]  # (1, M)
    rows = components(edges, merged)
    group_device = np.zeros(int(rows.max()) + 1, dtype=np.int64)
    group_device[rows[0]] = units
    return Sample(merged, rows, group_device)


def _sample_of_row(rows: Tensor, num_rows: int) -> Tensor:
    """(R,) the sample each group row belongs to (rows (B, G) are sample-major)."""
    owner = torch.zeros(num_rows, dtype=torch.int64)
    owner[rows.reshape(-1)] = torch.arange(rows.shape[0]).repeat_interleave(rows.shape[1])
    return owner
