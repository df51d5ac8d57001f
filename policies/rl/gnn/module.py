"""The graph-neural placers as one RLlib module (``GnnModule``): ``GdpNet`` or ``PlacetoNet`` by
``model_config["kind"]``. A batch holds one problem: its graph tensors repeated on every row (RLlib's
batches are row-aligned; rows are GDP's sampled placements or Placeto's episodes), the decisions and their
advantages. Sampling is done by the trainer through ``net``; the train pass recomputes the logits of
what was sampled."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from policies.rl.gnn.network import make_net

GRAPH_KEYS = ("node", "edge_index", "edge", "device", "pair", "allowed")
ACTIONS = "gnn_actions"  # GDP (B, G) devices; Placeto (B, S) devices chosen at each step; GiPH (B, S) moves
TARGETS = "gnn_targets"  # Placeto (B, S) group re-placed at each step; GiPH (B, S, G) every group
STATE = "gnn_state"  # Placeto (B, S, D, len(STATE_COLUMNS)); GiPH (B, S, G, D, len(STATE_COLUMNS))
ADVANTAGES = "gnn_advantages"  # GDP (B,), Placeto (B, S)
LOGITS = "gnn_logits"  # GDP (G, D), Placeto (B, S, D), GiPH (B, S, G * D)


def graph_tensors(batch: dict[str, Any]) -> dict[str, Tensor]:
    """The problem's tensors from row 0 of a batch."""
    return {key: batch[key][0] for key in GRAPH_KEYS}


class GnnModule(TorchRLModule):
    """``model_config``: kind, hidden_size, num_layers."""

    def setup(self) -> None:
        cfg = self.model_config
        self.kind = cfg["kind"]
        self.net = make_net(self.kind, int(cfg["hidden_size"]), int(cfg["num_layers"]))

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return self._forward_train(batch)

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        inputs = graph_tensors(batch)
        inputs["allowed"] = inputs["allowed"].bool()
        inputs["edge_index"] = inputs["edge_index"].long()
        if self.kind == "gdp":
            return {LOGITS: self.net(inputs)}
        groups, devices = self.net.embed(inputs)
        return {LOGITS: self.net.step_logits(groups, devices, inputs, batch[TARGETS].long(), batch[STATE].float())}


def decision_logp(logits: Tensor, actions: Tensor) -> Tensor:
    """logits (..., K, D) with actions (B, K) -> (B, K) log-probabilities (GDP's (G, D) logits broadcast)."""
    logp = torch.log_softmax(logits, dim=-1).expand(*actions.shape, logits.shape[-1])
    return logp.gather(-1, actions.long()[..., None]).squeeze(-1)


def mean_entropy(logits: Tensor) -> Tensor:
    """Mean entropy of the decisions' device distributions (masked devices contribute nothing)."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1).mean()
