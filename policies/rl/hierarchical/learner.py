"""The hierarchical planner's loss as an RLlib TorchLearner: REINFORCE on grouper AND placer.

    logp_b = log p_grouper(assignment_b) + log p_placer(devices_b | groups_b)
    loss   = -mean_b(advantage_b * logp_b) - entropy_coeff * (H_grouper + H_placer)

``advantage_b`` comes in the batch: the centered rank of the reward in its batch (as
``policies.rl.reinforce`` does by default). Imitating a warm start does not go through this loss (the
trainer fits the placer with its own Adam and sets the grouper's logits directly). H_placer is the sum of the groups' entropies
(mean over the batch), as the seq2seq learner's MultiCategorical entropy is; H_grouper is the MEAN of the
atoms' entropies. Tried on nmt-4 / paper-4gpu (2,048 measurements): both as means, the placer collapsed
onto one GPU (1.30 s; single-gpu 1.37 s); both as sums, the grouper's bonus (about 4,400 atoms) kept
every grouping spread across the graph (2.9 s).
"""

from __future__ import annotations

from typing import Any

import torch

from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from policies.rl.hierarchical.module import (ADVANTAGES, ASSIGN, DEVICES, GROUPER_LOGITS,
                                             PLACER_LOGITS, grouping_entropy, grouping_logp)
from policies.rl.seq2seq.network import placement_entropy, placement_logp

GROUPER_LOGP_KEY = "grouper_logp"
PLACER_LOGP_KEY = "placer_logp"


class HierarchicalLearner(TorchLearner):
    def build(self) -> None:
        super().build()
        settings = self.config.learner_config_dict or {}
        self.entropy_coeff = float(settings.get("entropy_coeff", 0.0))

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]) -> torch.Tensor:
        grouper_logits, placer_logits = fwd_out[GROUPER_LOGITS], fwd_out[PLACER_LOGITS]  # (A, G), (B, G, D)
        logp_grouper = grouping_logp(grouper_logits, batch[ASSIGN].long())  # (B,)
        logp_placer = placement_logp(placer_logits, batch[DEVICES])  # (B,)
        advantages = batch[ADVANTAGES].float()  # (B,)
        policy_loss = -(advantages * (logp_grouper + logp_placer)).mean()
        entropy = grouping_entropy(grouper_logits) + placement_entropy(placer_logits).mean()
        loss = policy_loss - self.entropy_coeff * entropy
        self.metrics.log_dict({POLICY_LOSS_KEY: policy_loss, ENTROPY_KEY: entropy,
                               GROUPER_LOGP_KEY: logp_grouper.mean(), PLACER_LOGP_KEY: logp_placer.mean()},
                              key=module_id, window=1)
        return loss
