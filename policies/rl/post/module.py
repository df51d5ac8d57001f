"""Post's policy: independent per-group device distributions, as an RLlib ``TorchRLModule``.

Post (Gao, Chen, Li, NeurIPS 2018) places each group from its own categorical distribution over the
devices; the distributions are one (G, D) table of logits, shared by every observation of the one graph
being placed. Forbidden devices (the observation's mask columns) are masked out. The value function is a
learned scalar (every observation is the same graph, so a network would learn a constant anyway).

    logits (G, D) ──mask──▶ ACTION_DIST_INPUTS (B, G·D)   PlacementDistribution (policies/rl/seq2seq/module.py)
    exploration: device_g ~ softmax(logits_g + noise)    inference: argmax    training: the same logits

``logit_noise_std`` (set per iteration by the trainer) perturbs which device is drawn, times the logits'
RMS, as in the seq2seq module; ``uniform_mix`` mixes that share of the uniform distribution over the
allowed devices into the sampling distribution (as the cross-entropy method does, so a converged policy
still proposes new placements). The recorded log-probability is that of the unmixed, noise-free policy
(PPO's clipped ratio absorbs the difference). ``hidden_size``,
``tanh_constant`` and ``temperature`` in ``model_config`` are accepted and unused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from policies.rl.seq2seq.module import MASKED_LOGIT, PlacementDistribution


class FactorizedPlacer(TorchRLModule, ValueFunctionAPI):
    """A (G, D) table of device logits, one independent categorical per group; uniform at first."""

    def setup(self) -> None:
        nvec = np.asarray(self.action_space.nvec)
        self.num_groups, self.num_devices = len(nvec), int(nvec[0])
        if (nvec != self.num_devices).any():
            raise ValueError("FactorizedPlacer needs MultiDiscrete([D] * G): the same devices for every group")
        self.num_features = int(self.observation_space.shape[-1]) - self.num_devices
        self.logit_noise_std = float((self.model_config or {}).get("logit_noise_std", 0.0))
        self.uniform_mix = float((self.model_config or {}).get("uniform_mix", 0.0))
        self.logits = nn.Parameter(torch.zeros(self.num_groups, self.num_devices))  # (G, D)
        self.value = nn.Parameter(torch.zeros(()))
        self._dist_cls = PlacementDistribution.get_partial_dist_cls(num_devices=self.num_devices)

    def get_inference_action_dist_cls(self):
        return self._dist_cls

    def get_exploration_action_dist_cls(self):
        return self._dist_cls

    def get_train_action_dist_cls(self):
        return self._dist_cls

    def _masked(self, obs: torch.Tensor) -> torch.Tensor:
        """obs (B, G, F + D) -> masked logits (B, G, D)."""
        if obs.dim() != 3 or obs.shape[1] != self.num_groups:
            raise ValueError(f"observation must be (B, {self.num_groups}, F + D), got {tuple(obs.shape)}")
        allowed = obs[..., self.num_features:] > 0.5  # (B, G, D)
        return self.logits[None].expand_as(allowed.float()).masked_fill(~allowed, MASKED_LOGIT)

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        obs = torch.as_tensor(batch[Columns.OBS], dtype=torch.float32)
        return {Columns.ACTION_DIST_INPUTS: self._masked(obs).flatten(1)}

    def _forward_exploration(self, batch: dict[str, Any], generator: torch.Generator | None = None,
                             **kwargs) -> dict[str, Any]:
        """Sample one device per group (with logit noise); ``generator`` makes it repeatable."""
        with torch.no_grad():
            logits = self._masked(torch.as_tensor(batch[Columns.OBS], dtype=torch.float32))  # (B, G, D)
            drawn = logits
            if self.logit_noise_std > 0:
                allowed = logits > MASKED_LOGIT / 2
                rms = logits.masked_fill(~allowed, 0.0).pow(2).mean().sqrt()
                noise = torch.randn(logits.shape, generator=generator)
                drawn = torch.where(allowed, logits + self.logit_noise_std * rms * noise, logits)
            probs = torch.softmax(drawn, dim=-1)  # (B, G, D)
            if self.uniform_mix > 0:  # as the cross-entropy method: a little uniform exploration keeps searching
                allowed = (logits > MASKED_LOGIT / 2).float()
                uniform = allowed / allowed.sum(dim=-1, keepdim=True)
                probs = (1 - self.uniform_mix) * probs + self.uniform_mix * uniform
            probs = probs.flatten(0, 1)  # (B * G, D)
            actions = torch.multinomial(probs, 1, generator=generator).view(logits.shape[:2])  # (B, G)
            return self._out(logits, actions)

    def _forward_inference(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """The greedy placement: each group's most likely device."""
        with torch.no_grad():
            logits = self._masked(torch.as_tensor(batch[Columns.OBS], dtype=torch.float32))
            return self._out(logits, logits.argmax(dim=-1))

    def _out(self, logits: torch.Tensor, actions: torch.Tensor) -> dict[str, Any]:
        flat = logits.flatten(1)  # (B, G * D)
        return {Columns.ACTIONS: actions, Columns.ACTION_LOGP: self._dist_cls.from_logits(flat).logp(actions),
                Columns.ACTION_DIST_INPUTS: flat}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """V(observation), (B,): one learned scalar, the expected reward of a sampled placement."""
        return self.value.expand(len(batch[Columns.OBS]))
