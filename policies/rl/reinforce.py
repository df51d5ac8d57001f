"""REINFORCE with an exponential-moving-average baseline (Mirhoseini et al. 2017) as an RLlib TorchLearner.

Loss of a batch of B one-step episodes (one placement each)::

    advantage_b = reward_b - baseline
    loss = -mean_b(advantage_b * log pi(placement_b)) - entropy_coeff * mean_b(entropy_b)

then ``baseline <- decay * baseline + (1 - decay) * mean_b(reward_b)``; the first batch sets the baseline
to its own mean before its update (the reference starts it at the failure reward instead, which pushes up
whatever the first batch sampled). The batch needs ``obs``, ``actions`` and ``rewards`` columns. Settings
come from ``config.learner_config_dict``: ``baseline_decay`` (0.9, as the paper), ``entropy_coeff``,
``batch_baseline``, ``normalize_advantages`` and ``rank_advantages``.

Deviation from the paper (the default through ``RLConfig.rank_advantages``): the advantage of a placement
is its centered rank in its batch, in [-0.5, 0.5], instead of ``reward - moving average``. A handful of
placements with CPU-heavy groups or failures dominate raw rewards, so the raw-advantage gradient mostly says
"avoid the CPU" and drives the policy onto the single-GPU placement; ranks (fitness shaping, as in CEM and
evolution strategies) weigh every pair of placements alike. The moving-average baseline is still updated
and logged. ``batch_baseline`` (leave-one-out batch mean) and ``normalize_advantages`` (divide by the
batch's reward std) are the other options tried; neither beat ranks on nmt-2.
"""

from __future__ import annotations

from typing import Any

import torch

from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

BASELINE_KEY = "reward_baseline"
ADVANTAGE_KEY = "mean_advantage"


def centered_ranks(values: torch.Tensor) -> torch.Tensor:
    """(B,) -> (B,) ranks scaled to [-0.5, 0.5] (ties share their mean rank); 0 everywhere when B < 2."""
    if len(values) < 2:
        return torch.zeros_like(values)
    below = (values[None, :] < values[:, None]).float().sum(dim=1)  # (B,)
    ties = (values[None, :] == values[:, None]).float().sum(dim=1)  # (B,) itself included
    return (below + (ties - 1) / 2) / (len(values) - 1) - 0.5


class ReinforceLearner(TorchLearner):
    """Policy gradient with the paper's moving-average reward baseline."""

    def build(self) -> None:
        super().build()
        settings = self.config.learner_config_dict or {}
        self.baseline_decay = float(settings.get("baseline_decay", 0.9))
        self.entropy_coeff = float(settings.get("entropy_coeff", 0.0))
        self.batch_baseline = bool(settings.get("batch_baseline", False))
        self.normalize_advantages = bool(settings.get("normalize_advantages", False))
        self.rank_advantages = bool(settings.get("rank_advantages", False))
        if not 0.0 <= self.baseline_decay < 1.0:
            raise ValueError(f"baseline_decay must lie in [0, 1), got {self.baseline_decay}")
        self.reward_baseline: float | None = None  # None until the first batch
        self._batch_mean_reward: float | None = None

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]) -> torch.Tensor:
        module = self.module[module_id].unwrapped()
        dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        rewards = batch[Columns.REWARDS].float()  # (B,)
        self._batch_mean_reward = float(rewards.mean())
        if self.batch_baseline and len(rewards) > 1:  # leave-one-out mean of the other B - 1 rewards
            baseline_b = (rewards.sum() - rewards) / (len(rewards) - 1)  # (B,)
        else:
            baseline_b = self._batch_mean_reward if self.reward_baseline is None else self.reward_baseline
        advantages = rewards - baseline_b  # (B,)
        if self.rank_advantages:  # centered ranks, ties averaged: only the batch's order counts
            advantages = centered_ranks(rewards)
        elif self.normalize_advantages:
            advantages = advantages / rewards.std().clamp_min(1e-3)
        baseline = float(torch.as_tensor(baseline_b).float().mean())
        logp = dist.logp(batch[Columns.ACTIONS])  # (B,)
        entropy = dist.entropy().mean()
        policy_loss = -(advantages * logp).mean()
        self.metrics.log_dict({POLICY_LOSS_KEY: policy_loss, ENTROPY_KEY: entropy,
                               ADVANTAGE_KEY: advantages.mean(), BASELINE_KEY: baseline},
                              key=module_id, window=1)
        return policy_loss - self.entropy_coeff * entropy

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        if self._batch_mean_reward is None:
            return
        if self.reward_baseline is None:
            self.reward_baseline = self._batch_mean_reward
        else:
            decay = self.baseline_decay
            self.reward_baseline = decay * self.reward_baseline + (1.0 - decay) * self._batch_mean_reward
        self._batch_mean_reward = None
