"""The grouper and the hierarchical planner's RLlib module (grouper + the 2017 seq2seq placer).

    atom features (A, F) ──Linear─ReLU─Linear─ReLU─Linear──▶ group logits (A, G) ──▶ group id per atom
    groups' member features, aggregated per sample (B, G, F + 2) ──▶ Seq2SeqNet ──▶ device per group

The grouper is the paper's feed-forward network: its input is the atom's features (op-class fractions,
the linear-layer equivalent of an op-type embedding averaged over the atom's ops; log FLOPs, bytes,
params, op count and cost; phase fractions; in/out degree and bytes; topological positions). Every atom's
group is drawn independently from its softmax, so a sampled grouping's log-probability is a sum over atoms
of one gather, cheap at tens of thousands of atoms (RLlib's MultiCategorical over A heads is not used).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from policies.rl.seq2seq.network import Seq2SeqNet

ASSIGN = "assign"  # (B, A) int64: sampled group of every atom
GROUP_FEATURES = "group_features"  # (B, G, F + 2) float32, decode order
GROUP_ALLOWED = "group_allowed"  # (B, G, D) bool, decode order
DEVICES = "devices"  # (B, G) int64, decode order
ADVANTAGES = "advantages"  # (B,) float32: weight of each row's log-probability
GROUPER_LOGITS = "grouper_logits"
PLACER_LOGITS = "placer_logits"


class Grouper(nn.Module):
    """Feed-forward atom -> group softmax (the 2018 paper's grouper)."""

    def __init__(self, num_features: int, num_groups: int, hidden_size: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_features, hidden_size), nn.ReLU(),
                                 nn.Linear(hidden_size, hidden_size), nn.ReLU(),
                                 nn.Linear(hidden_size, num_groups))
        with torch.no_grad():  # start near uniform over the groups
            self.net[-1].weight.mul_(0.01)
            self.net[-1].bias.zero_()

    def forward(self, features: Tensor) -> Tensor:
        """(A, F) -> group logits (A, G)."""
        return self.net(features)

    def sample(self, logits: Tensor, batch_size: int, generator: torch.Generator | None) -> Tensor:
        """(A, G) logits -> (B, A) group ids drawn independently per atom and row."""
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, batch_size, replacement=True, generator=generator).T.contiguous()


def grouping_logp(logits: Tensor, assign: Tensor) -> Tensor:
    """(A, G) logits, (B, A) group ids -> (B,) log-probability of each whole grouping."""
    logp = torch.log_softmax(logits, dim=-1)  # (A, G)
    return torch.gather(logp.T, 0, assign).sum(dim=1)  # (B, A) -> (B,)


def grouping_entropy(logits: Tensor) -> Tensor:
    """(A, G) -> scalar: mean per-atom entropy of the grouper."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1).mean()


def topo_prior(quantile: Tensor, num_groups: int, width: float) -> Tensor:
    """(A,) cost quantile of each atom in topological order -> (A, G) initial per-atom logits favouring
    the group ``quantile * G``: -(distance in groups)^2 / (2 width^2); zeros when ``width`` <= 0.

    Two departures from the paper, whose grouper is a feed-forward net alone and starts uniform: (1) a
    uniform grouper mixes atoms from the whole graph into every group, and such placements run 4x slower
    than the expert's on nmt-4 (3.2 s against 0.76 s), far from anything REINFORCE finds within a few
    thousand measurements, so the grouper starts on a structural grouping (``HierarchicalConfig.prior``:
    by default the scope groups, set with ``set_atom_targets``; this function gives the older ``position``
    prior, contiguous stretches of equal cost in topological order, which cuts an unrolled RNN into time
    slices rather than layers); (2) each atom also has its own learned logits (A, G) next to the
    network's, so the grouper can hold any grouping exactly (the prior's or a warm start's) and move single
    atoms between groups, which a net over shared features cannot (atoms of repeated layers look alike).
    """
    if width <= 0:
        return torch.zeros(len(quantile), num_groups)
    centre = quantile[:, None] * num_groups - 0.5  # (A, 1)
    distance = torch.arange(num_groups, dtype=torch.float32)[None, :] - centre  # (A, G)
    return -(distance ** 2) / (2.0 * width ** 2)


class HierarchicalModule(TorchRLModule):
    """Grouper + placer as one RLlib module: one optimizer, one Learner, both trained on the same loss.

    ``model_config``: atom_features ((A, F) list or tensor), atom_quantile (A,), prior_width, num_groups,
    num_devices, hidden_size, tanh_constant, temperature. Sampling is done by the trainer through ``grouper`` and ``placer``; the
    train pass recomputes the logits of what was sampled.
    """

    def setup(self) -> None:
        cfg = self.model_config
        self.register_buffer("atom_inputs", torch.as_tensor(cfg["atom_features"], dtype=torch.float32))  # (A, F)
        num_features = self.atom_inputs.shape[1]
        self.grouper = Grouper(num_features, int(cfg["num_groups"]), int(cfg["hidden_size"]))
        self.atom_logits = nn.Parameter(topo_prior(torch.as_tensor(cfg["atom_quantile"], dtype=torch.float32),
                                                   int(cfg["num_groups"]), float(cfg["prior_width"])))  # (A, G)
        self.placer = Seq2SeqNet(num_features + 2, int(cfg["num_devices"]), int(cfg["hidden_size"]),
                                 tanh_constant=float(cfg["tanh_constant"]), temperature=float(cfg["temperature"]))

    def group_logits(self) -> Tensor:
        """(A, G): the feed-forward grouper's logits plus each atom's own learned logits."""
        return self.grouper(self.atom_inputs) + self.atom_logits

    def set_atom_targets(self, target: Tensor, move_prob: float) -> None:
        """Start the grouper on a grouping (the prior's or a warm start's): each atom's own logits put
        ``1 - move_prob`` on its target group (A,), the rest spread evenly, so sampled groupings differ from
        the target by a few atoms."""
        count = self.atom_logits.shape[1]
        gap = float(np.log((1.0 - move_prob) * max(count - 1, 1) / move_prob)) if count > 1 else 0.0
        with torch.no_grad():
            self.atom_logits.zero_()
            self.atom_logits[torch.arange(len(target)), target] = gap
            last = self.grouper.net[-1]
            last.weight.zero_()
            last.bias.zero_()

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return self._forward_train(batch)

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits = self.placer.teacher(batch[GROUP_FEATURES].float(), batch[GROUP_ALLOWED].bool(),
                                     batch[DEVICES].long())
        return {GROUPER_LOGITS: self.group_logits(), PLACER_LOGITS: logits}
