"""The papers' recurrent benchmarks and a GPT-2-small decoder as real PyTorch modules, traced by the importer.

Models are built on the meta device (no parameter memory) and traced with fake tensors. Recurrent layers are
unrolled with an explicit cell loop, so every time step of every layer is its own ops, as in the papers'
TensorFlow graphs. Every model returns its own loss (softmax + cross-entropy), so the loss ops carry the
``softmax`` / ``head`` scope.

Scope names are a contract with the expert placements (a prefix match selects a layer):
RNNLM ``embed``, ``lstm.layer{i}``, ``softmax``; NMT ``encoder.embed``, ``encoder.layer{i}``,
``decoder.embed``, ``decoder.layer{i}``, ``attention``, ``softmax``; transformer ``embed``, ``blocks.{i}``,
``head``; branchy CNN ``stem``, ``stages.{i}``, ``head``.

Configurations (paper scale, the registered defaults):
- RNNLM: 2 LSTM layers of 2048 units, embedding 2048, vocabulary 10,000 and 35 unrolled steps (Zaremba et
  al. 2014's Penn Treebank setting, the language model the 2017 placement paper cites), batch 64. The width
  2048 follows Jozefowicz et al. 2016's LSTM-2048 (the other model the paper cites) and is what makes the
  model worth splitting across K80s; about 108M parameters.
- NMT (GNMT-style, Wu et al. 2016): hidden 1024 and embedding 1024, shared-size source and target
  vocabularies of 32,000 (GNMT's word-piece vocabulary), 40 source and 40 target steps, batch 64; additive
  attention whose query is the bottom decoder layer's output and whose context feeds every upper decoder
  layer (GNMT's wiring). Simplifications: unidirectional encoder, no residual connections, decoder states
  start from the encoder's final states. 40 steps keep nmt-8 tracing well under a minute.
- transformer: GPT-2 small (12 layers, d_model 768, 12 heads, vocabulary 50,257, context 1024, tied input and
  output embeddings, 124,439,808 parameters), batch 8, sequence 1024; dropout left out (it moves data but
  adds no FLOPs and no parameters).
- branchy CNN (no paper benchmark; the ``cnn`` kind of graphs.families): a small image classifier whose
  stages hold inception-like blocks (2-4 parallel convolution branches of kernels 1, 3, 5, 7, concatenated,
  merged by a 1x1 convolution, optionally added to the block's input), max pooling between stages.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graphs.opgraph import OpGraph
from graphs.torch.importer import trace_training_step


class LSTMCellLayer(nn.Module):
    """One LSTM layer, one time step per call: ``(x, (h, c)) -> (h, c)``; zero state when ``state`` is None.

    Parameters: ``ih`` (input -> 4 gates, with bias) and ``hh`` (hidden -> 4 gates, no bias):
    4H(I + H + 1) scalars. ``ctx`` (optional) is concatenated to the input first (NMT decoder layers).
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.ih = nn.Linear(input_size, 4 * hidden_size)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size, bias=False)

    def forward(self, x, state=None, ctx=None):
        if ctx is not None:
            x = torch.cat([x, ctx], dim=1)
        if state is None:
            zeros = x.new_zeros(x.shape[0], self.hidden_size)
            state = (zeros, zeros)
        h, c = state
        in_gate, forget_gate, cell_gate, out_gate = (self.ih(x) + self.hh(h)).chunk(4, dim=1)
        c = torch.sigmoid(forget_gate) * c + torch.sigmoid(in_gate) * torch.tanh(cell_gate)
        h = torch.sigmoid(out_gate) * torch.tanh(c)
        return h, c


class StepEmbedding(nn.Module):
    """Token ids (B, T) -> T tensors of (B, E), one per time step."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, dim)

    def forward(self, tokens):
        return self.table(tokens).unbind(1)


class StepSoftmax(nn.Module):
    """Per time step: logits over the vocabulary, cross-entropy against the targets; mean over steps."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, hiddens, targets):
        losses = [F.cross_entropy(self.proj(h), targets[:, t]) for t, h in enumerate(hiddens)]
        return torch.stack(losses).mean()


def _layers(sizes: list[tuple[int, int]]) -> nn.ModuleDict:
    """``layer0``, ``layer1``, ... so module paths read ``lstm.layer0``."""
    return nn.ModuleDict({f"layer{i}": LSTMCellLayer(i_size, h_size) for i, (i_size, h_size) in enumerate(sizes)})


class RNNLM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = StepEmbedding(vocab, hidden)
        self.lstm = _layers([(hidden, hidden)] * layers)
        self.softmax = StepSoftmax(hidden, vocab)

    def forward(self, tokens, targets):
        steps = self.embed(tokens)
        for layer in self.lstm.values():
            state, outputs = None, []
            for x in steps:
                state = layer(x, state)
                outputs.append(state[0])
            steps = outputs
        return self.softmax(steps, targets)


class AdditiveAttention(nn.Module):
    """Bahdanau attention: score(q, k_s) = v . tanh(W_q q + W_k k_s); keys projected once per sequence."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(hidden, hidden, bias=False)
        self.query_proj = nn.Linear(hidden, hidden, bias=False)
        self.score = nn.Linear(hidden, 1, bias=False)

    def forward(self, query, memory, keys=None):
        """``keys=None``: project ``memory`` (B, S, H) into keys and return them; else the (B, H) context."""
        if keys is None:
            return self.key_proj(memory)
        energy = torch.tanh(keys + self.query_proj(query).unsqueeze(1))  # (B, S, H)
        weights = torch.softmax(self.score(energy).squeeze(2), dim=1)  # (B, S)
        return torch.bmm(weights.unsqueeze(1), memory).squeeze(1)  # (B, H)


class Encoder(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = StepEmbedding(vocab, hidden)
        self.layers = layers
        for i in range(layers):
            self.add_module(f"layer{i}", LSTMCellLayer(hidden, hidden))

    def forward(self, tokens):
        """Returns the top layer's outputs (B, S, H) and each layer's final state."""
        steps, finals = self.embed(tokens), []
        for i in range(self.layers):
            layer, state, outputs = getattr(self, f"layer{i}"), None, []
            for x in steps:
                state = layer(x, state)
                outputs.append(state[0])
            steps = outputs
            finals.append(state)
        return torch.stack(steps, dim=1), finals


class Decoder(nn.Module):
    """Bottom layer reads the target embedding; its output queries the attention; the context joins the
    input of every upper layer (GNMT's wiring)."""

    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = StepEmbedding(vocab, hidden)
        self.layers = layers
        for i in range(layers):
            self.add_module(f"layer{i}", LSTMCellLayer(hidden if i == 0 else 2 * hidden, hidden))

    def forward(self, tokens, memory, keys, states, attention):
        tops = []
        for x in self.embed(tokens):
            states = list(states)
            states[0] = self.layer0(x, states[0])
            ctx = attention(states[0][0], memory, keys)
            for i in range(1, self.layers):
                states[i] = getattr(self, f"layer{i}")(states[i - 1][0], states[i], ctx)
            # one layer: no upper layer reads the context, which then joins the output (else the attention
            # would be dead weight, trained by nothing: family graphs draw one-layer NMTs)
            tops.append(states[-1][0] if self.layers > 1 else states[0][0] + ctx)
        return tops


class NMT(nn.Module):
    def __init__(self, src_vocab: int, tgt_vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.encoder = Encoder(src_vocab, hidden, layers)
        self.decoder = Decoder(tgt_vocab, hidden, layers)
        self.attention = AdditiveAttention(hidden)
        self.softmax = StepSoftmax(hidden, tgt_vocab)

    def forward(self, source, target_in, target_out):
        memory, finals = self.encoder(source)
        keys = self.attention(None, memory)
        tops = self.decoder(target_in, memory, keys, finals, self.attention)
        return self.softmax(tops, target_out)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch, seq, d_model = x.shape
        q, k, v = (t.view(batch, seq, self.heads, d_model // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(d_model, dim=2))  # (B, heads, T, head_dim)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d_model // self.heads))  # (B, heads, T, T)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(batch, seq, d_model)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPTEmbedding(nn.Module):
    def __init__(self, vocab: int, context: int, d_model: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(context, d_model)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.token(tokens) + self.position(positions)


class GPTHead(nn.Module):
    """Final layer norm, logits with the tied token embedding, cross-entropy."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)

    def forward(self, x, token_weight, targets):
        logits = F.linear(self.ln(x), token_weight)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = GPTEmbedding(vocab, context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.head = GPTHead(d_model)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x, self.embed.token.weight, targets)


def _tokens(batch: int, steps: int) -> torch.Tensor:
    return torch.empty(batch, steps, dtype=torch.long, device="meta")


def rnnlm_model(batch_size: int = 64, seq_len: int = 35, hidden: int = 2048, vocab: int = 10000,
                layers: int = 2) -> tuple[nn.Module, tuple]:
    """The RNNLM and its example inputs (tokens, next tokens), on the meta device."""
    with torch.device("meta"):
        model = RNNLM(vocab, hidden, layers)
    return model, (_tokens(batch_size, seq_len), _tokens(batch_size, seq_len))


def nmt_model(layers: int = 2, batch_size: int = 64, src_len: int = 40, tgt_len: int = 40, hidden: int = 1024,
              src_vocab: int = 32000, tgt_vocab: int = 32000) -> tuple[nn.Module, tuple]:
    with torch.device("meta"):
        model = NMT(src_vocab, tgt_vocab, hidden, layers)
    return model, (_tokens(batch_size, src_len), _tokens(batch_size, tgt_len), _tokens(batch_size, tgt_len))


def transformer_model(batch_size: int = 8, seq_len: int = 1024, d_model: int = 768, layers: int = 12,
                      heads: int = 12, vocab: int = 50257, context: int = 1024) -> tuple[nn.Module, tuple]:
    with torch.device("meta"):
        model = GPT(vocab, context, d_model, layers, heads)
    return model, (_tokens(batch_size, seq_len), _tokens(batch_size, seq_len))


def build_rnnlm(**config) -> OpGraph:
    model, inputs = rnnlm_model(**config)
    return trace_training_step(model, inputs, name="rnnlm", source=f"benchmark rnnlm {config}")


def build_nmt(**config) -> OpGraph:
    model, inputs = nmt_model(**config)
    name = f"nmt-{config.get('layers', 2)}"
    return trace_training_step(model, inputs, name=name, source=f"benchmark {name} {config}")


def build_transformer(**config) -> OpGraph:
    model, inputs = transformer_model(**config)
    return trace_training_step(model, inputs, name="transformer", source=f"benchmark transformer {config}")


def rnnlm_spec() -> tuple[nn.Module, tuple]:
    """A tiny RNNLM for ``placer graphs import --torch graphs.benchmarks.torch_models:rnnlm_spec``."""
    return rnnlm_model(batch_size=4, seq_len=3, hidden=16, vocab=50)


class ConvBNReLU(nn.Module):
    """``kernel`` x ``kernel`` convolution (same padding, no bias), batch norm, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Branch(nn.Module):
    """One branch of an inception-like block: a 1x1 convolution, then a ``kernel`` x ``kernel`` one (none
    when ``kernel`` is 1)."""

    def __init__(self, channels: int, branch_channels: int, kernel: int) -> None:
        super().__init__()
        self.reduce = ConvBNReLU(channels, branch_channels, 1)
        self.conv = ConvBNReLU(branch_channels, branch_channels, kernel) if kernel > 1 else None

    def forward(self, x):
        x = self.reduce(x)
        return self.conv(x) if self.conv is not None else x


class BranchBlock(nn.Module):
    """Parallel branches of kernels 1, 3, 5, 7 (the first ``branches``), concatenated along channels and
    merged back to ``channels`` by a 1x1 convolution; with ``residual`` the block's input is added."""

    KERNELS = (1, 3, 5, 7)

    def __init__(self, channels: int, branches: int, residual: bool) -> None:
        super().__init__()
        branch_channels = max(channels // branches, 8)
        self.branches = nn.ModuleList(Branch(channels, branch_channels, k) for k in self.KERNELS[:branches])
        self.merge = ConvBNReLU(branch_channels * branches, channels, 1)
        self.residual = residual

    def forward(self, x):
        y = self.merge(torch.cat([branch(x) for branch in self.branches], dim=1))
        return x + y if self.residual else y


class CNNStage(nn.Module):
    """Max pooling (stride 2) and a 1x1 widening convolution (none for the first stage), then the blocks."""

    def __init__(self, in_channels: int, channels: int, blocks: int, branches: int, residual: bool,
                 downsample: bool) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(2) if downsample else None
        self.transition = ConvBNReLU(in_channels, channels, 1) if in_channels != channels else None
        self.blocks = nn.ModuleList(BranchBlock(channels, branches, residual) for _ in range(blocks))

    def forward(self, x):
        if self.pool is not None:
            x = self.pool(x)
        if self.transition is not None:
            x = self.transition(x)
        for block in self.blocks:
            x = block(x)
        return x


class ClassifierHead(nn.Module):
    """Global average pooling, a linear classifier, cross-entropy."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x, targets):
        return F.cross_entropy(self.fc(x.mean(dim=(2, 3))), targets)


class BranchyCNN(nn.Module):
    """Stem (3x3, stride 2), stages of inception-like blocks with pooling between them, classifier head.
    Stage ``i`` is ``width * 2**i`` channels wide."""

    def __init__(self, width: int, blocks: list[int], branches: list[int], residual: list[bool],
                 classes: int) -> None:
        super().__init__()
        self.stem = ConvBNReLU(3, width, 3, stride=2)
        stages, channels = [], width
        for i, (n_blocks, n_branches, res) in enumerate(zip(blocks, branches, residual)):
            stages.append(CNNStage(channels, width * 2 ** i, n_blocks, n_branches, res, downsample=i > 0))
            channels = width * 2 ** i
        self.stages = nn.ModuleList(stages)
        self.head = ClassifierHead(channels, classes)

    def forward(self, images, targets):
        x = self.stem(images)
        for stage in self.stages:
            x = stage(x)
        return self.head(x, targets)


def branchy_cnn_model(batch_size: int = 32, image_size: int = 64, width: int = 32,
                      blocks: tuple[int, ...] = (2, 2, 2), branches: tuple[int, ...] = (3, 3, 3),
                      residual: tuple[bool, ...] = (True, True, True), classes: int = 100
                      ) -> tuple[nn.Module, tuple]:
    """A small CNN with branching blocks and its inputs (images (B, 3, S, S), labels (B,)), on the meta
    device. ``blocks``, ``branches`` and ``residual`` hold one entry per stage."""
    if not len(blocks) == len(branches) == len(residual):
        raise ValueError(f"one entry per stage: blocks {blocks}, branches {branches}, residual {residual}")
    with torch.device("meta"):
        model = BranchyCNN(width, list(blocks), list(branches), list(residual), classes)
    images = torch.empty(batch_size, 3, image_size, image_size, device="meta")
    return model, (images, torch.empty(batch_size, dtype=torch.long, device="meta"))


def build_branchy_cnn(**config) -> OpGraph:
    model, inputs = branchy_cnn_model(**config)
    return trace_training_step(model, inputs, name="branchy-cnn", source=f"benchmark branchy-cnn {config}")
