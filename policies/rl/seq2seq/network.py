"""The seq2seq placer's network (Mirhoseini et al., ICML 2017) as a plain ``torch.nn.Module``, no RLlib.

    group features ──Linear──▶ bi-LSTM encoder ──▶ enc (B, G, H) ──┬──▶ attention keys
                                                                     │
    for g in 0..G-1:  decoder LSTM step([embed(previous device), enc[:, g]])
                      context = softmax((W1 enc)·(W2 h) / sqrt(H)) · enc      (content-based attention)
                      logits_g = C · tanh(Linear([h, context]) / T), forbidden devices masked out
                      device_g ~ softmax(logits_g + noise)   (exploration) | argmax (inference)
                                 | the given action           (training: teacher forcing)

``sample`` decodes step by step; ``teacher`` feeds the given devices back and, since attention feeds only
the logits (as in the reference), runs all G decoder steps as one LSTM call and one batched attention. Both
compute the same logits for the same devices (to float rounding, ~1e-6), so the log-probability recorded
at sampling time is the one training recomputes. Rows of a batch may carry different features (the
hierarchical planner's grouper gives each placement its own); see policies/rl/seq2seq/module.py for the
sizes and the departures from the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

MASKED_LOGIT = -1e9  # a forbidden device's logit: probability exactly 0 in float32, finite for KL/entropy


class Seq2SeqNet(nn.Module):
    """LSTM encoder + attention LSTM decoder placing G groups on D devices, one group at a time."""

    def __init__(self, num_features: int, num_devices: int, hidden_size: int, tanh_constant: float = 5.0,
                 temperature: float = 1.0, forget_bias: float = 1.0):
        super().__init__()
        if hidden_size % 2:
            raise ValueError("hidden_size must be even (two encoder directions of hidden_size / 2)")
        self.num_features, self.num_devices, self.hidden_size = num_features, num_devices, hidden_size
        self.tanh_constant = float(tanh_constant)
        self.temperature = float(temperature)  # changed between iterations only (train = sample)
        self.logit_noise_std = 0.0  # set between iterations; perturbs only which device is drawn
        hidden = hidden_size
        self.embed = nn.Linear(num_features, hidden)
        self.encoder = nn.LSTM(hidden, hidden // 2, batch_first=True, bidirectional=True)
        self.device_embedding = nn.Embedding(num_devices + 1, hidden)  # index D: the "go" symbol
        self.decoder = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.attn_keys = nn.Linear(hidden, hidden, bias=False)
        self.attn_query = nn.Linear(hidden, hidden, bias=False)
        self.device_logits = nn.Linear(2 * hidden, num_devices)
        self._init_forget_bias(float(forget_bias))
        with torch.no_grad():  # start near uniform: random logits times tanh_constant would favour a device
            self.device_logits.weight.mul_(0.01)
            self.device_logits.bias.zero_()

    def _init_forget_bias(self, value: float) -> None:
        with torch.no_grad():
            for name, param in list(self.encoder.named_parameters()) + list(self.decoder.named_parameters()):
                if name.startswith("bias_ih"):  # gates ordered (input, forget, cell, output)
                    quarter = param.shape[0] // 4
                    param[quarter:2 * quarter].fill_(value)

    # ---- public API -------------------------------------------------------------------------------

    def sample(self, features: Tensor, allowed: Tensor, *, generator: torch.Generator | None = None,
               greedy: bool = False) -> tuple[Tensor, Tensor]:
        """features (B, G, F), allowed (B, G, D) bool -> devices (B, G) int64, logits (B, G, D).

        The logits are the noise-free policy's; ``logit_noise_std`` only perturbs which device is drawn.
        ``greedy`` takes the most likely device of each group in turn instead of drawing one.
        """
        self._check(features, allowed)
        enc, state = self._encode(features)
        return self._decode_steps(enc, state, allowed, generator=generator, greedy=greedy)

    def teacher(self, features: Tensor, allowed: Tensor, actions: Tensor) -> Tensor:
        """Teacher-forced logits (B, G, D) of the devices ``actions`` (B, G)."""
        return self.teacher_and_embedding(features, allowed, actions)[0]

    def teacher_and_embedding(self, features: Tensor, allowed: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """``teacher``'s logits (B, G, D) and ``embed_groups``' (B, H) from one encoder pass."""
        self._check(features, allowed)
        enc, state = self._encode(features)
        return self._decode_teacher(enc, state, allowed, actions.long()), enc.mean(dim=1)

    def embed_groups(self, features: Tensor) -> Tensor:
        """(B, G, F) -> (B, H): the mean group encoding (input of a value head)."""
        return self._encode(features)[0].mean(dim=1)

    # ---- the network ------------------------------------------------------------------------------

    def _check(self, features: Tensor, allowed: Tensor) -> None:
        if features.dim() != 3 or features.shape[-1] != self.num_features:
            raise ValueError(f"features must be (B, G, {self.num_features}), got {tuple(features.shape)}")
        if allowed.shape != (*features.shape[:2], self.num_devices):
            raise ValueError(f"allowed must be (B, G, {self.num_devices}) like the features, "
                             f"got {tuple(allowed.shape)}")

    def _encode(self, features: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """features (B, G, F) -> encodings (B, G, H), decoder start state ((B, H), (B, H))."""
        enc, (h_n, c_n) = self.encoder(torch.tanh(self.embed(features)))
        state = (torch.cat([h_n[0], h_n[1]], dim=-1), torch.cat([c_n[0], c_n[1]], dim=-1))  # (B, H) each
        return enc, state

    def _decode_teacher(self, enc: Tensor, state: tuple, allowed: Tensor, actions: Tensor) -> Tensor:
        keys = self.attn_keys(enc)  # (B, G, H)
        go = torch.full((enc.shape[0], 1), self.num_devices, dtype=torch.long, device=enc.device)
        previous = torch.cat([go, actions[:, :-1]], dim=1)  # (B, G)
        hidden, _ = self.decoder(torch.cat([self.device_embedding(previous), enc], dim=-1),
                                 (state[0][None], state[1][None]))
        return self._logits(hidden, keys, enc, allowed)

    def _decode_steps(self, enc: Tensor, state: tuple, allowed: Tensor, *, generator: torch.Generator | None,
                      greedy: bool) -> tuple[Tensor, Tensor]:
        keys = self.attn_keys(enc)  # (B, G, H)
        h, c = state[0][None], state[1][None]  # (1, B, H) each
        previous = torch.full((enc.shape[0],), self.num_devices, dtype=torch.long, device=enc.device)
        all_logits, taken = [], []
        for g in range(enc.shape[1]):
            step_in = torch.cat([self.device_embedding(previous), enc[:, g]], dim=-1)[:, None]  # (B, 1, 2H)
            hidden, (h, c) = self.decoder(step_in, (h, c))
            logits = self._logits(hidden, keys, enc, allowed[:, g:g + 1])[:, 0]  # (B, D)
            device = logits.argmax(dim=-1) if greedy else self._draw(logits, allowed[:, g], generator)
            all_logits.append(logits)
            taken.append(device)
            previous = device
        return torch.stack(taken, dim=1), torch.stack(all_logits, dim=1)

    def _logits(self, hidden: Tensor, keys: Tensor, enc: Tensor, allowed: Tensor) -> Tensor:
        """Decoder states (B, T, H) -> device logits (B, T, D), squashed, forbidden devices masked."""
        scores = torch.bmm(self.attn_query(hidden), keys.transpose(1, 2)) * keys.shape[-1] ** -0.5  # (B, T, G)
        context = torch.bmm(torch.softmax(scores, dim=-1), enc)  # (B, T, H)
        raw = self.device_logits(torch.cat([hidden, context], dim=-1))  # (B, T, D)
        logits = self.tanh_constant * torch.tanh(raw / self.temperature)
        return logits.masked_fill(~allowed, MASKED_LOGIT)

    def _draw(self, logits: Tensor, allowed: Tensor, generator: torch.Generator | None) -> Tensor:
        """Draw one device per row from softmax(logits + noise); noise scaled by the logits' RMS."""
        if self.logit_noise_std > 0:
            rms = logits.masked_fill(~allowed, 0.0).pow(2).mean().sqrt()
            noise = torch.randn(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
            logits = torch.where(allowed, logits + self.logit_noise_std * rms * noise, logits)
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def placement_logp(logits: Tensor, actions: Tensor) -> Tensor:
    """logits (B, G, D), actions (B, G) -> (B,): the log-probability of each whole placement."""
    picked = torch.log_softmax(logits, dim=-1).gather(-1, actions.long()[..., None])  # (B, G, 1)
    return picked.squeeze(-1).sum(dim=-1)


def placement_entropy(logits: Tensor) -> Tensor:
    """logits (B, G, D) -> (B,): the entropy of a placement, the sum of its groups' entropies."""
    logp = torch.log_softmax(logits, dim=-1)  # (B, G, D)
    return -(logp.exp() * logp).sum(dim=(-2, -1))
