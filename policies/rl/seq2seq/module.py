"""The seq2seq device placer of Mirhoseini et al. (ICML 2017) as an RLlib ``TorchRLModule``.

Input: the environment's observation (B, G, F + D): the group feature matrix followed by the 0/1 mask of
the devices each group may use (``policies.rl.env``). Output: one device per group, chosen in group order.
The network itself is ``Seq2SeqNet`` (policies/rl/seq2seq/network.py, plain torch, with its diagram); this
module adds the RLlib API and a value head on the mean group encoding.

The training pass feeds the taken devices back (teacher forcing) and returns the per-group logits
concatenated, (B, G·D), as ``Columns.ACTION_DIST_INPUTS``; ``PlacementDistribution`` (what RLlib's
``TorchMultiCategorical`` with ``input_lens=[D] * G`` computes, vectorized) then gives the log-probability
the exploration pass returned in ``Columns.ACTION_LOGP`` (the same computation; the teacher-forced pass and
the step-by-step one agree to float rounding, ~1e-6), so RLlib's PPO ratio, entropy and KL work unchanged.
Logit noise only perturbs which device is drawn: the recorded log-probability is that of the noise-free
policy being trained.

Sizes and defaults (``model_config`` keys), against the reference implementation (TensorFlow's
hierarchical placer: hidden 512, bi-LSTM encoder, forget-gate bias 1.0, temperature 1.0, tanh constant
1.0, logit noise 0.5 of the logits' RMS until step 750, Adam at lr 0.1 decayed by 0.95 every 50 steps):

- ``hidden_size`` 256 (the paper's 512): on CPU the learner, not the simulator, is the cost of a search
  (BENCHMARKS.md, "Tuning notes"); 512 would roughly quadruple the LSTM work. Not tuned for quality.
- The output layer starts near zero, so the first placements are sampled almost uniformly (random
  logits times ``tanh_constant`` would start the search biased toward one device).
- ``tanh_constant`` 5.0 (reference 1.0): with 1.0 a group's device probability cannot exceed 0.88 on two
  devices, so a 256-group placement with every group on one GPU (the best one for RNNLM) would almost never
  be sampled; 5.0 allows 0.99995 per group.
- ``temperature`` 1.0 here; the trainer's ``RLConfig`` passes 2.0 (at 1.0 the squashed logits saturate
  within a few Adam steps and their gradient vanishes). ``logit_noise_std`` 0.5 (set per iteration by the
  trainer, which decays it to 0).
- Attention is multiplicative (Luong's "general" form) where the reference's is additive,
  ``v·tanh(W1 enc + W2 h)``: the additive form keeps a (B, G, H) tensor per decoder step for the backward
  pass, G·B·G·H floats in all (4 GB and a minute per update at G=256, B=64, H=256 on one CPU core).
- The decoder's input also carries the current group's encoding (the reference feeds only the previous
  device and relies on attention to find its place), so each step knows which group it places.
- Attention feeds only the logits, not the next LSTM input (as in the reference), so with teacher forcing
  the training pass runs the decoder's recurrence alone and then one batched attention.

Speed (issue 13; network.py has the details): the encoder runs once when all B rows hold the same graph
(the trainer's case), the decoder's input projection and the attention keys are computed once for all
steps, the decoder's recurrence has a hand-written backward pass, and ``PlacementDistribution`` computes
the per-group categoricals as one tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchDeterministic, TorchDistribution
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from policies.rl.config import HIDDEN_SIZE
from policies.rl.seq2seq.network import MASKED_LOGIT, Seq2SeqNet, placement_entropy, placement_logp

__all__ = ["MASKED_LOGIT", "MODEL_DEFAULTS", "PlacementDistribution", "Seq2SeqPlacer"]

MODEL_DEFAULTS = {
    "hidden_size": HIDDEN_SIZE,
    "tanh_constant": 5.0,
    "temperature": 1.0,
    "logit_noise_std": 0.5,
    "forget_bias": 1.0,
}


class Seq2SeqPlacer(TorchRLModule, ValueFunctionAPI):
    """``Seq2SeqNet`` placing G groups on D devices, with RLlib's forward passes and a value head."""

    def setup(self) -> None:
        cfg = {**MODEL_DEFAULTS, **(self.model_config or {})}
        nvec = np.asarray(self.action_space.nvec)
        self.num_groups, self.num_devices = len(nvec), int(nvec[0])
        if (nvec != self.num_devices).any():
            raise ValueError("Seq2SeqPlacer needs MultiDiscrete([D] * G): the same devices for every group")
        self.num_features = int(self.observation_space.shape[-1]) - self.num_devices
        hidden = int(cfg["hidden_size"])
        self.net = Seq2SeqNet(self.num_features, self.num_devices, hidden, tanh_constant=float(cfg["tanh_constant"]),
                              temperature=float(cfg["temperature"]), forget_bias=float(cfg["forget_bias"]))
        self.net.logit_noise_std = float(cfg["logit_noise_std"])
        self.value_head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self._dist_cls = PlacementDistribution.get_partial_dist_cls(num_devices=self.num_devices)

    @property
    def logit_noise_std(self) -> float:
        """The net's exploration noise (the trainer sets it between iterations)."""
        return self.net.logit_noise_std

    @logit_noise_std.setter
    def logit_noise_std(self, value: float) -> None:
        self.net.logit_noise_std = float(value)

    # ---- RLlib API -------------------------------------------------------------------------------

    def get_inference_action_dist_cls(self):
        return self._dist_cls

    def get_exploration_action_dist_cls(self):
        return self._dist_cls

    def get_train_action_dist_cls(self):
        return self._dist_cls

    def _forward_exploration(self, batch: dict[str, Any], generator: torch.Generator | None = None,
                             **kwargs) -> dict[str, Any]:
        """Sample placements autoregressively (with logit noise); ``generator`` makes it repeatable."""
        with torch.no_grad():
            return self._act(batch, greedy=False, generator=generator)

    def _forward_inference(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """The greedy placement: the most likely device for each group in turn."""
        with torch.no_grad():
            return self._act(batch, greedy=True)

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Teacher-forced pass over ``batch[ACTIONS]``: per-group logits, (B, G·D)."""
        features, allowed = self._split(batch[Columns.OBS])
        actions = torch.as_tensor(batch[Columns.ACTIONS]).long()
        logits, embeddings = self.net.teacher_and_embedding(features, allowed, actions)
        return {Columns.ACTION_DIST_INPUTS: logits.flatten(1), Columns.EMBEDDINGS: embeddings}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """V(observation), (B,): the expected reward of a placement sampled for this graph."""
        if embeddings is None:
            embeddings = self.net.embed_groups(self._split(batch[Columns.OBS])[0])
        return self.value_head(embeddings).squeeze(-1)

    # ---- helpers ----------------------------------------------------------------------------------

    def _act(self, batch: dict[str, Any], *, greedy: bool, generator: torch.Generator | None = None) -> dict:
        features, allowed = self._split(batch[Columns.OBS])
        actions, logits = self.net.sample(features, allowed, generator=generator, greedy=greedy)
        flat = logits.flatten(1)  # (B, G * D)
        logp = placement_logp(logits, actions)  # (B,)
        return {Columns.ACTIONS: actions, Columns.ACTION_LOGP: logp, Columns.ACTION_DIST_INPUTS: flat}

    def _split(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (B, G, F + D) -> features (B, G, F) float32, allowed (B, G, D) bool."""
        obs = torch.as_tensor(obs, dtype=torch.float32)
        if obs.dim() != 3 or obs.shape[1] != self.num_groups:
            raise ValueError(f"observation must be (B, {self.num_groups}, F + D), got {tuple(obs.shape)}")
        return obs[..., :self.num_features], obs[..., self.num_features:] > 0.5


class PlacementDistribution(TorchDistribution):
    """G independent categoricals over D devices from flat logits (B, G·D), computed as one (B, G, D) tensor.

    What ``TorchMultiCategorical`` with ``input_lens=[D] * G`` computes (per-row sums over groups of
    log-probability, entropy and KL), without G Python ``Categorical`` objects per call.
    """

    def __init__(self, logits: torch.Tensor, num_devices: int):
        self.num_devices = num_devices
        self.logits = logits.reshape(*logits.shape[:-1], -1, num_devices)  # (B, G, D)
        super().__init__(self.logits)

    def _get_torch_distribution(self, logits: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=logits, validate_args=False)  # batch (B, G)

    def logp(self, value: torch.Tensor, **kwargs) -> torch.Tensor:
        """(B, G) devices -> (B,)."""
        return placement_logp(self.logits, value)

    def entropy(self) -> torch.Tensor:
        """(B,): the sum of the groups' entropies."""
        return placement_entropy(self.logits)

    def kl(self, other: "PlacementDistribution") -> torch.Tensor:
        """(B,): KL(self || other) summed over groups."""
        logp, other_logp = torch.log_softmax(self.logits, -1), torch.log_softmax(other.logits, -1)  # (B, G, D)
        return (logp.exp() * (logp - other_logp)).sum(dim=(-2, -1))

    def sample(self, *, sample_shape=None) -> torch.Tensor:
        return self._dist.sample(sample_shape if sample_shape is not None else torch.Size())

    def rsample(self, *, sample_shape=None):
        raise NotImplementedError("device choices are discrete: no reparameterized sample")

    @staticmethod
    def required_input_dim(space, num_devices: int | None = None, **kwargs) -> int:
        return int(np.sum(space.nvec))

    def to_deterministic(self) -> TorchDeterministic:
        return TorchDeterministic(loc=self.logits.argmax(dim=-1))
