"""The seq2seq placer's network (Mirhoseini et al., ICML 2017) as a plain ``torch.nn.Module``, no RLlib.

    group features ──Linear──▶ bi-LSTM encoder ──▶ enc (B, G, H) ──┬──▶ attention keys
                                                                     │
    for g in 0..G-1:  decoder LSTM step([embed(previous device), enc[:, g]])
                      context = softmax((W1 enc)·(W2 h) / sqrt(H)) · enc      (content-based attention)
                      logits_g = C · tanh(Linear([h, context]) / T), forbidden devices masked out
                      device_g ~ softmax(logits_g + noise)   (exploration) | argmax (inference)
                                 | the given action           (training: teacher forcing)

``sample`` decodes step by step; ``teacher`` feeds the given devices back and, since attention feeds only
the logits (as in the reference), runs the decoder's recurrence alone and then one batched attention. Both
compute the same logits for the same devices (to float rounding, ~1e-6), so the log-probability recorded
at sampling time is the one training recomputes. Rows of a batch may carry different features (the
hierarchical planner's grouper gives each placement its own); see policies/rl/seq2seq/module.py for the
sizes and the departures from the reference.

Fast paths (issue 13), the same math as the diagram (tests/policies/rl/test_seq2seq.py compares values
and gradients with the network written plainly):

- Equal rows (the seq2seq trainer repeats one graph B times) are encoded once and broadcast.
- The decoder's input projection is split into a (D + 1, 4H) table for the previous device and one matmul
  of all encodings; attention folds into h·(Wq^T k) and softmax·(enc·Wc^T), so no step forms a context.
- ``LSTMRecurrence``: the decoder's recurrence over precomputed input gates with a hand-written backward
  (one matmul per step each way, the weight gradient as one matmul at the end).
- Sampling with shared rows multiplies each step's h by all its weights at once.
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
        embedding = enc.mean(dim=1).expand(features.shape[0], -1)  # (B, H)
        return self._decode_teacher(enc, state, allowed, actions.long()), embedding

    def embed_groups(self, features: Tensor) -> Tensor:
        """(B, G, F) -> (B, H): the mean group encoding (input of a value head)."""
        return self._encode(features)[0].mean(dim=1).expand(features.shape[0], -1)

    # ---- the network ------------------------------------------------------------------------------

    def _check(self, features: Tensor, allowed: Tensor) -> None:
        if features.dim() != 3 or features.shape[-1] != self.num_features:
            raise ValueError(f"features must be (B, G, {self.num_features}), got {tuple(features.shape)}")
        if allowed.shape != (*features.shape[:2], self.num_devices):
            raise ValueError(f"allowed must be (B, G, {self.num_devices}) like the features, "
                             f"got {tuple(allowed.shape)}")

    def _encode(self, features: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """features (B, G, F) -> encodings (B', G, H), decoder start state ((B', H), (B', H)).

        B' is 1 when every row holds the same features (the seq2seq trainer repeats one graph B times)
        and the features need no gradient: the encoder then runs once and the decoder broadcasts its output
        over the batch (the parameters' gradients are the same). Otherwise B' = B.
        """
        if features.shape[0] > 1 and not features.requires_grad and _rows_equal(features):
            features = features[:1]
        enc, (h_n, c_n) = self.encoder(torch.tanh(self.embed(features)))
        state = (torch.cat([h_n[0], h_n[1]], dim=-1), torch.cat([c_n[0], c_n[1]], dim=-1))  # (B', H) each
        return enc, state

    def _precompute(self, enc: Tensor) -> dict[str, Tensor]:
        """What every decoder step reads, computed once for all G steps from the encodings (B', G, H).

        The decoder's input projection splits into W_prev·embed(previous device), a (D + 1, 4H) table, and
        W_enc·enc[:, g]; attention scores q(h)·k(enc) = h·(Wq^T k) and the context's share of the logits
        (softmax · enc)·Wc^T = softmax · (enc·Wc^T), so no step builds a context vector.
        """
        hidden = self.hidden_size
        w_ih, w_out = self.decoder.weight_ih_l0, self.device_logits.weight  # (4H, 2H), (D, 2H)
        bias = self.decoder.bias_ih_l0 + self.decoder.bias_hh_l0  # (4H,)
        return {
            "enc_gates": torch.matmul(enc, w_ih[:, hidden:].t()) + bias,  # (B', G, 4H)
            "prev_gates": self.device_embedding.weight @ w_ih[:, :hidden].t(),  # (D + 1, 4H)
            "score_keys": torch.matmul(self.attn_keys(enc), self.attn_query.weight) * hidden ** -0.5,  # (B', G, H)
            "enc_out": torch.matmul(enc, w_out[:, hidden:].t()),  # (B', G, D)
            "w_out_h": w_out[:, :hidden],  # (D, H)
        }

    def _decode_teacher(self, enc: Tensor, state: tuple, allowed: Tensor, actions: Tensor) -> Tensor:
        pre = self._precompute(enc)
        batch = actions.shape[0]
        go = torch.full((batch, 1), self.num_devices, dtype=torch.long, device=enc.device)
        previous = torch.cat([go, actions[:, :-1]], dim=1).t()  # (G, B): time-major from here
        one_hot = nn.functional.one_hot(previous, self.num_devices + 1).to(enc.dtype)  # (G, B, D + 1)
        # a one-hot matmul, not an index: its backward is one matmul where index_put's is serial
        gates_in = pre["enc_gates"].transpose(0, 1) + one_hot @ pre["prev_gates"]  # (G, B, 4H)
        h0, c0 = (s.expand(batch, -1) for s in state)  # (B, H) each
        hidden = LSTMRecurrence.apply(gates_in, h0, c0, self.decoder.weight_hh_l0).transpose(0, 1)  # (B, G, H)
        scores = torch.matmul(hidden, pre["score_keys"].transpose(1, 2))  # (B, G, G)
        raw = hidden @ pre["w_out_h"].t() + torch.matmul(torch.softmax(scores, dim=-1), pre["enc_out"])
        return self._squash(raw + self.device_logits.bias, allowed)  # (B, G, D)

    def _decode_steps(self, enc: Tensor, state: tuple, allowed: Tensor, *, generator: torch.Generator | None,
                      greedy: bool) -> tuple[Tensor, Tensor]:
        """The same recurrence as ``_decode_teacher``, one step at a time, each step feeding its draw back.

        With one encoding for all rows (B' = 1), each step's new h meets all its weights in ONE matmul,
        h·[W_hh^T | score keys^T | W_out_h^T]: the next step's recurrent term, this step's attention scores
        and the hidden state's share of this step's logits.
        """
        pre = self._precompute(enc)
        batch, groups, hidden = allowed.shape[0], allowed.shape[1], self.hidden_size
        four_h = 4 * hidden
        h, c = (s.expand(batch, -1).contiguous() for s in state)  # (B, H) each
        enc_gates = pre["enc_gates"].transpose(0, 1)  # (G, B', 4H): one slice per step
        shared = enc.shape[0] == 1
        right = [self.decoder.weight_hh_l0.t()]  # (H, 4H)
        if shared:
            right += [pre["score_keys"][0].t(), pre["w_out_h"].t()]  # (H, G), (H, D)
        weights = torch.cat(right, dim=1)  # (H, 4H [+ G + D])
        enc_out = pre["enc_out"][0] if shared else pre["enc_out"]  # (G, D) | (B, G, D)
        recurrent = h @ weights[:, :four_h]  # (B, 4H)
        previous = torch.full((batch,), self.num_devices, dtype=torch.long, device=enc.device)
        taken = torch.empty(batch, groups, dtype=torch.long, device=enc.device)
        all_logits = torch.empty(batch, groups, self.num_devices, device=enc.device)
        for g in range(groups):
            h, c = _lstm_cell(recurrent + enc_gates[g] + pre["prev_gates"][previous], c, hidden)
            if shared:
                out = h @ weights  # (B, 4H + G + D)
                recurrent, scores, raw_h = out[:, :four_h], out[:, four_h:four_h + groups], out[:, four_h + groups:]
                raw = torch.addmm(raw_h, torch.softmax(scores, dim=-1), enc_out)  # (B, D)
            else:
                recurrent = h @ weights
                scores = torch.bmm(h[:, None], pre["score_keys"].transpose(1, 2))  # (B, 1, G)
                raw = h @ pre["w_out_h"].t() + torch.bmm(torch.softmax(scores, dim=-1), enc_out)[:, 0]
            logits = self._squash(raw + self.device_logits.bias, allowed[:, g])  # (B, D)
            device = logits.argmax(dim=-1) if greedy else _draw(logits, allowed[:, g], self.logit_noise_std, generator)
            all_logits[:, g] = logits
            taken[:, g] = device
            previous = device
        return taken, all_logits

    def _squash(self, raw: Tensor, allowed: Tensor) -> Tensor:
        """Raw device scores (..., D) -> logits within +-tanh_constant, forbidden devices masked."""
        logits = self.tanh_constant * torch.tanh(raw / self.temperature)
        return logits.masked_fill(~allowed, MASKED_LOGIT)


def _rows_equal(features: Tensor) -> bool:
    """Whether every row of (B, G, F) equals the first (a stride-0 expand answers without comparing)."""
    if features.stride(0) == 0:
        return True
    return bool(torch.equal(features, features[:1].expand_as(features)))


def _lstm_cell(gates: Tensor, c: Tensor, hidden: int) -> tuple[Tensor, Tensor]:
    """One LSTM step from its pre-activations (B, 4H), gates ordered (input, forget, cell, output)."""
    act = torch.sigmoid(gates)
    cell = torch.tanh(gates[:, 2 * hidden:3 * hidden])
    c = torch.addcmul(act[:, hidden:2 * hidden] * c, act[:, :hidden], cell)
    return act[:, 3 * hidden:] * torch.tanh(c), c


def _draw(logits: Tensor, allowed: Tensor, noise_std: float, generator: torch.Generator | None) -> Tensor:
    """One device per row of logits (B, D) from softmax(logits + noise); noise scaled by the logits' RMS over
    the batch. Drawn step by step as before the fast paths, so a seed gives the placements it gave then
    (up to float rounding): drawing a whole decode's numbers up front saved no measurable time."""
    if noise_std > 0:
        rms = logits.masked_fill(~allowed, 0.0).pow(2).mean().sqrt()
        noise = torch.randn(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
        logits = torch.where(allowed, logits + noise_std * rms * noise, logits)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)


class LSTMRecurrence(torch.autograd.Function):
    """h_t = LSTM(x_t + h_{t-1}·W_hh^T, c_{t-1}) over T steps, with a hand-written backward pass.

    The input projection and biases are already in ``gates_in`` (T, B, 4H), time-major, so the decoder's
    input projection runs once for all steps (and once for all rows when they share features); autograd
    would otherwise record some ten nodes per step. Returns the hidden states (T, B, H).
    """

    @staticmethod
    def forward(ctx, gates_in: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor) -> Tensor:
        steps, batch, four_h = gates_in.shape
        hidden = four_h // 4
        x = gates_in.contiguous()  # (T, B, 4H)
        acts = torch.empty_like(x)  # sigmoid(i, f, o) and tanh(cell gate) per step
        hs = x.new_empty(steps + 1, batch, hidden)  # h_{-1} .. h_{T-1}
        cs = x.new_empty(steps + 1, batch, hidden)
        hs[0], cs[0] = h0, c0
        w_hh_t = w_hh.t()
        for t in range(steps):
            gates = torch.addmm(x[t], hs[t], w_hh_t)
            torch.sigmoid(gates, out=acts[t])
            torch.tanh(gates[:, 2 * hidden:3 * hidden], out=acts[t, :, 2 * hidden:3 * hidden])
            a = acts[t]
            torch.addcmul(a[:, hidden:2 * hidden] * cs[t], a[:, :hidden], a[:, 2 * hidden:3 * hidden], out=cs[t + 1])
            torch.mul(a[:, 3 * hidden:], torch.tanh(cs[t + 1]), out=hs[t + 1])
        ctx.save_for_backward(acts, hs, cs, w_hh)
        return hs[1:]

    @staticmethod
    def backward(ctx, grad_hs: Tensor):
        acts, hs, cs, w_hh = ctx.saved_tensors
        steps, batch, four_h = acts.shape
        hidden = four_h // 4
        i, f, g, o = acts.split(hidden, dim=-1)  # (T, B, H) each
        tanh_c = torch.tanh(cs[1:])
        # d gates / d (dc, dh), all steps at once: [di, df, dg] = dc * k[:, :, :3H], do = dh * k[:, :, 3H:]
        k = torch.cat([g * i * (1 - i), cs[:-1] * f * (1 - f), i * (1 - g * g), tanh_c * o * (1 - o)], dim=-1)
        dc_from_h = o * (1 - tanh_c * tanh_c)  # (T, B, H)
        grad = grad_hs  # (T, B, H)
        d_gates = torch.empty_like(acts)
        dh = torch.zeros(batch, hidden, dtype=acts.dtype, device=acts.device)
        dc = torch.zeros(batch, hidden, dtype=acts.dtype, device=acts.device)
        for t in range(steps - 1, -1, -1):
            dh = dh + grad[t]
            dc = torch.addcmul(dc, dh, dc_from_h[t])
            torch.mul(torch.cat([dc, dc, dc, dh], dim=-1), k[t], out=d_gates[t])
            dh = d_gates[t] @ w_hh
            dc = dc * f[t]
        d_w_hh = d_gates.reshape(-1, four_h).t() @ hs[:-1].reshape(-1, hidden)  # (4H, H)
        return d_gates, dh, dc, d_w_hh


def placement_logp(logits: Tensor, actions: Tensor) -> Tensor:
    """logits (B, G, D), actions (B, G) -> (B,): the log-probability of each whole placement."""
    picked = torch.log_softmax(logits, dim=-1).gather(-1, actions.long()[..., None])  # (B, G, 1)
    return picked.squeeze(-1).sum(dim=-1)


def placement_entropy(logits: Tensor) -> Tensor:
    """logits (B, G, D) -> (B,): the entropy of a placement, the sum of its groups' entropies."""
    logp = torch.log_softmax(logits, dim=-1)  # (B, G, D)
    return -(logp.exp() * logp).sum(dim=(-2, -1))
