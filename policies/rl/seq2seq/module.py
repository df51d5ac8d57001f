"""The seq2seq device placer of Mirhoseini et al. (ICML 2017) as an RLlib ``TorchRLModule``.

Input: the environment's observation (B, G, F + D): the group feature matrix followed by the 0/1 mask of
the devices each group may use (``policies.rl.env``). Output: one device per group, chosen in group order.

    group features ──Linear──▶ bi-LSTM encoder ──▶ enc (B, G, H) ──┬──▶ attention keys
                                                                     │
    for g in 0..G-1:  decoder LSTM step([embed(previous device), enc[:, g]])
                      context = softmax((W1 enc)·(W2 h) / sqrt(H)) · enc      (content-based attention)
                      logits_g = C · tanh(Linear([h, context]) / T), forbidden devices masked out
                      device_g ~ softmax(logits_g + noise)   (exploration) | argmax (inference)
                                 | the given action           (training: teacher forcing)

The training pass feeds the taken devices back (teacher forcing) and returns the per-group logits
concatenated, (B, G·D), as ``Columns.ACTION_DIST_INPUTS``; ``TorchMultiCategorical`` with
``input_lens=[D] * G`` then gives the log-probability the exploration pass returned in
``Columns.ACTION_LOGP`` (the same computation; the one-call LSTM and the step-by-step one agree to float
rounding, ~1e-6), so RLlib's PPO ratio, entropy and KL work unchanged. Logit noise only perturbs
which device is drawn: the recorded log-probability is that of the noise-free policy being trained.

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
  within a few Adam steps and their gradient vanishes). ``logit_noise_std`` 0.5 (set per iteration by the trainer, which decays it to 0).
- Attention is multiplicative (Luong's "general" form) where the reference's is additive,
  ``v·tanh(W1 enc + W2 h)``: the additive form keeps a (B, G, H) tensor per decoder step for the backward
  pass, G·B·G·H floats in all (4 GB and a minute per update at G=256, B=64, H=256 on one CPU core).
- The decoder's input also carries the current group's encoding (the reference feeds only the previous
  device and relies on attention to find its place), so each step knows which group it places.
- Attention feeds only the logits, not the next LSTM input (as in the reference), so with teacher forcing
  the training pass runs all G decoder steps as one LSTM call and one batched attention.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchMultiCategorical
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from policies.rl.config import HIDDEN_SIZE

MASKED_LOGIT = -1e9  # a forbidden device's logit: probability exactly 0 in float32, finite for KL/entropy
MODEL_DEFAULTS = {
    "hidden_size": HIDDEN_SIZE,
    "tanh_constant": 5.0,
    "temperature": 1.0,
    "logit_noise_std": 0.5,
    "forget_bias": 1.0,
}


class Seq2SeqPlacer(TorchRLModule, ValueFunctionAPI):
    """LSTM encoder + attention LSTM decoder placing G groups on D devices, one group at a time."""

    def setup(self) -> None:
        cfg = {**MODEL_DEFAULTS, **(self.model_config or {})}
        nvec = np.asarray(self.action_space.nvec)
        self.num_groups, self.num_devices = len(nvec), int(nvec[0])
        if (nvec != self.num_devices).any():
            raise ValueError("Seq2SeqPlacer needs MultiDiscrete([D] * G): the same devices for every group")
        self.num_features = int(self.observation_space.shape[-1]) - self.num_devices
        hidden = int(cfg["hidden_size"])
        if hidden % 2:
            raise ValueError("hidden_size must be even (two encoder directions of hidden_size / 2)")
        self.tanh_constant = float(cfg["tanh_constant"])
        self.temperature = float(cfg["temperature"])  # changed between iterations only (train = sample)
        self.logit_noise_std = float(cfg["logit_noise_std"])

        self.embed = nn.Linear(self.num_features, hidden)
        self.encoder = nn.LSTM(hidden, hidden // 2, batch_first=True, bidirectional=True)
        self.device_embedding = nn.Embedding(self.num_devices + 1, hidden)  # index D: the "go" symbol
        self.decoder = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.attn_keys = nn.Linear(hidden, hidden, bias=False)
        self.attn_query = nn.Linear(hidden, hidden, bias=False)
        self.device_logits = nn.Linear(2 * hidden, self.num_devices)
        self.value_head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self._init_forget_bias(float(cfg["forget_bias"]))
        with torch.no_grad():  # start near uniform: random logits times tanh_constant would favour a device
            self.device_logits.weight.mul_(0.01)
            self.device_logits.bias.zero_()
        self._dist_cls = TorchMultiCategorical.get_partial_dist_cls(input_lens=[self.num_devices] * self.num_groups)

    def _init_forget_bias(self, value: float) -> None:
        with torch.no_grad():
            for name, param in list(self.encoder.named_parameters()) + list(self.decoder.named_parameters()):
                if name.startswith("bias_ih"):  # gates ordered (input, forget, cell, output)
                    quarter = param.shape[0] // 4
                    param[quarter:2 * quarter].fill_(value)

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
            return self._act(batch, mode="sample", generator=generator)

    def _forward_inference(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """The greedy placement: the most likely device for each group in turn."""
        with torch.no_grad():
            return self._act(batch, mode="greedy")

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Teacher-forced pass over ``batch[ACTIONS]``: per-group logits, (B, G·D)."""
        obs = torch.as_tensor(batch[Columns.OBS], dtype=torch.float32)
        enc, state, allowed = self._encode(obs)
        actions = torch.as_tensor(batch[Columns.ACTIONS]).long()
        logits, _ = self._decode(enc, state, allowed, mode="teacher", actions=actions)
        return {Columns.ACTION_DIST_INPUTS: logits.flatten(1), Columns.EMBEDDINGS: enc.mean(dim=1)}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """V(observation), (B,): the expected reward of a placement sampled for this graph."""
        if embeddings is None:
            embeddings = self._encode(torch.as_tensor(batch[Columns.OBS], dtype=torch.float32))[0].mean(dim=1)
        return self.value_head(embeddings).squeeze(-1)

    # ---- the network ------------------------------------------------------------------------------

    def _act(self, batch: dict[str, Any], *, mode: str, generator: torch.Generator | None = None) -> dict:
        obs = torch.as_tensor(batch[Columns.OBS], dtype=torch.float32)
        enc, state, allowed = self._encode(obs)
        logits, actions = self._decode(enc, state, allowed, mode=mode, generator=generator)
        flat = logits.flatten(1)  # (B, G * D)
        logp = self._dist_cls.from_logits(flat).logp(actions)  # (B,)
        return {Columns.ACTIONS: actions, Columns.ACTION_LOGP: logp, Columns.ACTION_DIST_INPUTS: flat}

    def _encode(self, obs: torch.Tensor) -> tuple[torch.Tensor, tuple, torch.Tensor]:
        """obs (B, G, F + D) -> encodings (B, G, H), decoder start state, allowed (B, G, D) bool."""
        if obs.dim() != 3 or obs.shape[1] != self.num_groups:
            raise ValueError(f"observation must be (B, {self.num_groups}, F + D), got {tuple(obs.shape)}")
        features, allowed = obs[..., :self.num_features], obs[..., self.num_features:] > 0.5
        enc, (h_n, c_n) = self.encoder(torch.tanh(self.embed(features)))
        state = (torch.cat([h_n[0], h_n[1]], dim=-1), torch.cat([c_n[0], c_n[1]], dim=-1))  # (B, H) each
        return enc, state, allowed

    def _decode(self, enc: torch.Tensor, state: tuple, allowed: torch.Tensor, *, mode: str,
                actions: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Place the groups in order. Returns logits (B, G, D) and devices (B, G) int64.

        The decoder LSTM reads [embedding of the previous device, the group's encoding]; attention feeds
        only the logits (as in the reference), so with teacher forcing all G steps run as one LSTM call
        and one batched attention, while sampling runs the same weights one step at a time.
        """
        keys = self.attn_keys(enc)  # (B, G, H)
        h, c = state[0][None], state[1][None]  # (1, B, H) each
        go = torch.full((enc.shape[0], 1), self.num_devices, dtype=torch.long, device=enc.device)
        if mode == "teacher":
            previous = torch.cat([go, actions[:, :-1]], dim=1)  # (B, G)
            hidden, _ = self.decoder(torch.cat([self.device_embedding(previous), enc], dim=-1), (h, c))
            return self._logits(hidden, keys, enc, allowed), actions
        previous = go[:, 0]
        all_logits, taken = [], []
        for g in range(self.num_groups):
            step_in = torch.cat([self.device_embedding(previous), enc[:, g]], dim=-1)[:, None]  # (B, 1, 2H)
            hidden, (h, c) = self.decoder(step_in, (h, c))
            logits = self._logits(hidden, keys, enc, allowed[:, g:g + 1])[:, 0]  # (B, D)
            device = logits.argmax(dim=-1) if mode == "greedy" else self._sample(logits, allowed[:, g], generator)
            all_logits.append(logits)
            taken.append(device)
            previous = device
        return torch.stack(all_logits, dim=1), torch.stack(taken, dim=1)

    def _logits(self, hidden: torch.Tensor, keys: torch.Tensor, enc: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """Decoder states (B, T, H) -> device logits (B, T, D), squashed, forbidden devices masked."""
        scores = torch.bmm(self.attn_query(hidden), keys.transpose(1, 2)) * keys.shape[-1] ** -0.5  # (B, T, G)
        context = torch.bmm(torch.softmax(scores, dim=-1), enc)  # (B, T, H)
        raw = self.device_logits(torch.cat([hidden, context], dim=-1))  # (B, T, D)
        logits = self.tanh_constant * torch.tanh(raw / self.temperature)
        return logits.masked_fill(~allowed, MASKED_LOGIT)

    def _sample(self, logits: torch.Tensor, allowed: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Draw one device per row from softmax(logits + noise); noise scaled by the logits' RMS."""
        if self.logit_noise_std > 0:
            rms = logits.masked_fill(~allowed, 0.0).pow(2).mean().sqrt()
            noise = torch.randn(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
            logits = torch.where(allowed, logits + self.logit_noise_std * rms * noise, logits)
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
