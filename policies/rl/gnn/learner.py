"""REINFORCE for the graph-neural placers as an RLlib TorchLearner.

    GDP:      loss = -mean_b(A_b * sum_g log pi(d_bg | graph)) / G          - c * H
    Placeto:  loss = -mean_{b,s}(A_bs * log pi(d_bs | graph, state_bs))     - c * H

A_b is the centered rank of the placement's reward in its batch (scale-free across graphs, as the seq2seq
learner's default); Placeto's A_bs is the return-to-go of step s (the improvement of the step time from
that step to the episode's end, relative to the start) minus its mean over the batch's episodes at that
step. H is the mean entropy of the decisions' device distributions.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from policies.rl.gnn.module import ACTIONS, ADVANTAGES, LOGITS, decision_logp, mean_entropy


class GnnLearner(TorchLearner):
    def build(self) -> None:
        super().build()
        self.entropy_coeff = float((self.config.learner_config_dict or {}).get("entropy_coeff", 0.0))

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]):
        logits = fwd_out[LOGITS]
        logp = decision_logp(logits, batch[ACTIONS])  # (B, K)
        advantages = batch[ADVANTAGES].float()
        if advantages.dim() == 1:  # GDP: one advantage per placement, its groups' log-probabilities averaged
            policy_loss = -(advantages * logp.mean(dim=1)).mean()
        else:
            policy_loss = -(advantages * logp).mean()
        entropy = mean_entropy(logits)
        self.metrics.log_dict({POLICY_LOSS_KEY: policy_loss, ENTROPY_KEY: entropy}, key=module_id, window=1)
        return policy_loss - self.entropy_coeff * entropy
