"""The graph-neural placers' networks: one encoder shared by both heads (issue 15 reuses it too).

    group features (G, F_NODE) ─Linear─▶ L x [GATv2 over group edges (edge features) + residual, LayerNorm]
                                                                            ──▶ group embeddings (G, H)
    device features (D, F_DEVICE) ─MLP─▶ device embeddings (D, H)
    PairScorer: relu(Wg h_g + Wd e_d + Wp pair_gd + Wc mean_g h_g) ─Linear─▶ logit of (g, d)

- ``GdpNet`` (GDP, one shot): a transformer encoder across the group embeddings (attention between
  every pair of groups, so a group's device depends on the whole graph), then the scorer for every
  (group, device) pair: (G, D) logits, one independent device distribution per group.
- ``PlacetoNet`` (Placeto, iterative): the same encoder and scorer, plus the state of the placement being
  improved, as (group, device) features: is the group on the device now, the share of the group's traffic
  whose other end is on the device, and the device's share of the work. Departure from the paper: the
  placement enters the scorer, not the message passing, so one encoder pass serves a whole episode.
- ``GiphNet`` (GiPH, relocation moves): Placeto's network scoring every (group, device) pair at once given
  the placement (``full_placement_state``); one softmax over all pairs except each group's current device
  (and disallowed pairs) picks the move "group g to device d". Departure from the paper: no gpNet (a graph
  whose nodes are the (task, device) pairs); the pair scorer over the shared group and device embeddings
  with the placement's state plays its part, so the encoder is the one GDP and Placeto use.

Not allowed (group, device) pairs get ``MASKED_LOGIT``. Sizes never depend on G or D.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from policies.rl.gnn.config import GDP_ATTENTION_HEADS
from policies.rl.gnn.inputs import DEVICE_COLUMNS, EDGE_COLUMNS, NODE_COLUMNS, PAIR_COLUMNS

MASKED_LOGIT = -1e9
STATE_COLUMNS = ("on_device", "traffic_share", "device_work_share")  # PlacetoNet's (group, device) state


@contextmanager
def _generated_code_removed() -> Iterator[None]:
    """PyTorch Geometric writes the code it generates for GATv2Conv (its propagate and edge_updater) to two
    files in the temporary folder and imports them, once per process, and never deletes them: every run left
    two files in /tmp. Here they go to a folder of their own, removed once the modules are imported."""
    with tempfile.TemporaryDirectory(prefix="placer-pyg-") as folder:
        before, tempfile.tempdir = tempfile.tempdir, folder
        try:
            yield
        finally:
            tempfile.tempdir = before


class GraphEncoder(nn.Module):
    """Message passing over the group graph with PyTorch Geometric's GATv2 (edge features in the attention)."""

    def __init__(self, hidden_size: int, num_layers: int, heads: int = 2):
        super().__init__()
        from torch_geometric.nn import GATv2Conv

        self.embed = nn.Sequential(nn.Linear(len(NODE_COLUMNS), hidden_size), nn.ReLU(),
                                   nn.Linear(hidden_size, hidden_size))
        with _generated_code_removed():
            self.convs = nn.ModuleList(GATv2Conv(hidden_size, hidden_size, heads=heads, concat=False,
                                                 edge_dim=len(EDGE_COLUMNS)) for _ in range(num_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_size) for _ in range(num_layers))

    def forward(self, node: Tensor, edge_index: Tensor, edge: Tensor) -> Tensor:
        """(G, F_NODE), (2, E), (E, F_EDGE) -> (G, H)."""
        h = self.embed(node)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + torch.relu(conv(h, edge_index, edge)))
        return h


class PairScorer(nn.Module):
    """(group, device) embeddings and pair features -> one logit per pair."""

    def __init__(self, hidden_size: int, num_pair_features: int):
        super().__init__()
        self.group = nn.Linear(hidden_size, hidden_size)
        self.device = nn.Linear(hidden_size, hidden_size, bias=False)
        self.context = nn.Linear(hidden_size, hidden_size, bias=False)
        self.pair = nn.Linear(num_pair_features, hidden_size, bias=False)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(hidden_size, hidden_size), nn.ReLU(),
                                 nn.Linear(hidden_size, 1))

    def forward(self, groups: Tensor, devices: Tensor, pair: Tensor, allowed: Tensor) -> Tensor:
        """groups (..., G, H), devices (D, H), pair (..., G, D, P), allowed (G, D) -> logits (..., G, D)."""
        return self.score(groups, devices, pair, allowed, groups.mean(dim=-2, keepdim=True))

    def score(self, rows: Tensor, devices: Tensor, pair: Tensor, allowed: Tensor, mean_group: Tensor) -> Tensor:
        """The groups ``rows`` (..., H) on every device: devices (D, H), pair (..., D, P), allowed (..., D),
        ``mean_group`` (..., H) the mean embedding of the graph's groups (broadcast) -> logits (..., D)."""
        hidden = (self.group(rows)[..., None, :] + self.device(devices) + self.pair(pair)
                  + self.context(mean_group)[..., None, :])
        return self.out(hidden).squeeze(-1).masked_fill(~allowed, MASKED_LOGIT)


class _Base(nn.Module):
    def __init__(self, hidden_size: int, num_layers: int, num_pair_features: int):
        super().__init__()
        self.encoder = GraphEncoder(hidden_size, num_layers)
        self.devices = nn.Sequential(nn.Linear(len(DEVICE_COLUMNS), hidden_size), nn.ReLU(),
                                     nn.Linear(hidden_size, hidden_size))
        self.scorer = PairScorer(hidden_size, num_pair_features)


class GdpNet(_Base):
    """GDP's one-shot policy: graph embeddings, attention across groups, a device distribution per group."""

    def __init__(self, hidden_size: int = 64, num_layers: int = 3, attention_layers: int = 1,
                 heads: int = GDP_ATTENTION_HEADS):
        super().__init__(hidden_size, num_layers, len(PAIR_COLUMNS))
        layer = nn.TransformerEncoderLayer(hidden_size, heads, dim_feedforward=2 * hidden_size, dropout=0.0,
                                           batch_first=True)
        self.attention = nn.TransformerEncoder(layer, attention_layers, enable_nested_tensor=False)

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """The tensors of a ``GraphInputs`` -> (G, D) logits."""
        h = self.encoder(inputs["node"], inputs["edge_index"], inputs["edge"])  # (G, H)
        h = self.attention(h[None])[0]  # (G, H)
        return self.scorer(h, self.devices(inputs["device"]), inputs["pair"], inputs["allowed"])


class PlacetoNet(_Base):
    """Placeto's policy: the device of one group given the placement being improved."""

    def __init__(self, hidden_size: int = 64, num_layers: int = 3):
        super().__init__(hidden_size, num_layers, len(PAIR_COLUMNS) + len(STATE_COLUMNS))

    def embed(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Group (G, H) and device (D, H) embeddings: once per episode batch."""
        return (self.encoder(inputs["node"], inputs["edge_index"], inputs["edge"]),
                self.devices(inputs["device"]))

    def step_logits(self, groups: Tensor, devices: Tensor, inputs: dict[str, Tensor], targets: Tensor,
                    state: Tensor) -> Tensor:
        """Logits (..., D) for re-placing group ``targets`` (...) in ``state`` (..., D, S)."""
        pair = torch.cat([inputs["pair"][targets], state], dim=-1)  # (..., D, P + S)
        return self.scorer.score(groups[targets], devices, pair, inputs["allowed"][targets], groups.mean(dim=0))


class GiphNet(PlacetoNet):
    """GiPH's policy: one distribution over every relocation move (group, other device) of a placement."""

    def step_logits(self, groups: Tensor, devices: Tensor, inputs: dict[str, Tensor], targets: Tensor,
                    state: Tensor) -> Tensor:
        """Flat move logits (..., G * D) (move k = group k // D to device k % D) of the groups ``targets``
        (..., G) (every group, in order) in ``state`` (..., G, D, S) from ``full_placement_state``; a
        group's current device (state column 0) and disallowed devices get ``MASKED_LOGIT``."""
        pair = torch.cat([inputs["pair"][targets], state], dim=-1)  # (..., G, D, P + S)
        logits = self.scorer.score(groups[targets], devices, pair, inputs["allowed"][targets],
                                   groups.mean(dim=0))  # (..., G, D)
        logits = logits.masked_fill(state[..., 0] > 0.5, MASKED_LOGIT)
        return logits.flatten(-2)


def make_net(kind: str, hidden_size: int, num_layers: int) -> nn.Module:
    return {"gdp": GdpNet, "giph": GiphNet}.get(kind, PlacetoNet)(hidden_size=hidden_size, num_layers=num_layers)


def full_placement_state(placements: Tensor, adjacency: Tensor, work_s: Tensor, total_work_s: float) -> Tensor:
    """``placement_state`` of every group at once: (..., G) placements -> (..., G, D, S) (GiPH's input)."""
    num_devices = work_s.shape[1]
    onehot = torch.nn.functional.one_hot(placements, num_devices).to(work_s.dtype)  # (..., G, D)
    traffic_share = (adjacency @ onehot) / adjacency.sum(dim=-1)[:, None].clamp_min(1.0)  # (..., G, D)
    finite_work = torch.where(torch.isfinite(work_s), work_s, torch.zeros_like(work_s))
    device_work = (onehot * finite_work).sum(dim=-2) / max(total_work_s, 1e-12)  # (..., D)
    return torch.stack([onehot, traffic_share, device_work[..., None, :].expand_as(onehot)], dim=-1).float()


def placement_state(placements: Tensor, targets: Tensor, adjacency: Tensor, work_s: Tensor,
                    total_work_s: float) -> Tensor:
    """Placeto's state features (..., D, S) of re-placing group ``targets`` (...) in ``placements``
    (..., G): is the target on each device now, the share of its traffic (adjacency (G, G) bytes) whose
    other end is on the device, and each device's share of the work (work_s (G, D))."""
    num_devices = work_s.shape[1]
    onehot = torch.nn.functional.one_hot(placements, num_devices).to(work_s.dtype)  # (..., G, D)
    on_device = onehot.gather(-2, targets[..., None, None].expand(*targets.shape, 1, num_devices)).squeeze(-2)
    traffic = adjacency[targets]  # (..., G)
    traffic_share = (traffic[..., :, None] * onehot).sum(dim=-2) / traffic.sum(dim=-1, keepdim=True).clamp_min(1.0)
    finite_work = torch.where(torch.isfinite(work_s), work_s, torch.zeros_like(work_s))
    device_work = (onehot * finite_work).sum(dim=-2) / max(total_work_s, 1e-12)  # (..., D)
    return torch.stack([on_device, traffic_share, device_work], dim=-1).float()
