"""Seeded families of real training graphs for cross-graph learned placers: ``family:KIND:SEED``.

A learned placer that should generalise to unseen graphs trains on many graphs like the benchmarks but not
the benchmarks themselves. ``family:KIND:SEED`` draws one model configuration with
``numpy.random.default_rng(SEED)`` from the ranges below and traces its training step with the project's
PyTorch importer (graphs.benchmarks.torch_models), so the ops, scopes, FLOPs and bytes are those of a real
model. The same name always gives the same graph; the OpGraph's name is the family name.

Kinds and ranges (inclusive; "step" is the grid a value is drawn on):

- ``rnn``: a GNMT-style LSTM encoder-decoder with attention (``nmt``) or an LSTM language model (``rnnlm``),
  each with probability 1/2.
  nmt: layers 1-4, hidden 256-1024 (step 128), batch 64-512 (step 64), source and target vocabularies
  8,000-32,000 (step 1,000), source and target lengths 10-40 with layers x (source + target) <= 140
  (unrolled steps are what make the op count; 140 keeps it under 10,000 and rules out nmt-2 and nmt-4's
  exact configurations).
  rnnlm: layers 1-2, hidden 256-1024 (step 128), sequence 10-40, batch 64-512 (step 64), vocabulary
  5,000-20,000 (step 1,000).
- ``transformer``: a GPT-style decoder: layers 2-6, d_model 256-768 (step 64), heads a divisor of d_model
  whose head size is 32-128, sequence 128-512 (step 64, context = sequence), batch 8-64 (step 8), vocabulary
  8,000-50,257.
- ``cnn``: the branchy CNN (inception-like blocks): stages 2-4, per stage 1-3 blocks of 2-4 parallel
  branches and a residual add with probability 1/2, base width 16-64 (step 8; stage i is width x 2^i),
  image 32-224 (step 16), batch 32-256 (step 32), classes 10-1,000.

The batch ranges set the scale of a step's memory: one GPU's peak is 2-63% of a K80's 12 GiB across
``families:24`` (the held-out graphs: 27-101%; nmt-2, nmt-4, rnnlm: 38-71%). Until 6 December 2026 they were
4x smaller (peaks of 1-18%), and GDP trained on them put heavy groups of resnet-50 on the CPU
(BENCHMARKS.md, issue 14).

The ranges stay clear of the held-out benchmarks: nmt-8 (8 layers), the GPT-2-small transformer (12 layers,
sequence 1024), inception-v3 and resnet-50 (Keras, far deeper). Every family graph has roughly 300-10,000
ops and traces in a few seconds. graphs.registry serves the names (cached on disk like the benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.benchmarks import Benchmark
from graphs.errors import PlacerError, is_whole_number
from graphs.opgraph import OpGraph

KINDS = ("rnn", "cnn", "transformer")
HELD_OUT = ("nmt-8", "inception-v3", "resnet-50", "transformer")
"""Benchmarks no family range reproduces and no committed checkpoint trains on: the graphs the
graph-neural placers' zero-shot figures are measured on."""
PREFIX = "family:"
MAX_FAMILY_GRAPHS = 10_000  # family_names' count: a trainer traces every graph (each takes seconds)
NMT_MAX_LAYER_STEPS = 140  # layers x (source + target length): bounds an nmt family graph's op count

_USAGE = f"expected family:KIND:SEED with KIND one of {', '.join(KINDS)} and SEED a non-negative integer"


@dataclass(frozen=True)
class FamilyConfig:
    """One drawn family member: the model builder (``nmt``, ``rnnlm``, ``transformer``, ``cnn``) and its
    keyword arguments (plain ints, lists and bools, so they serialise into the cache key)."""

    kind: str
    seed: int
    model: str
    config: dict

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.kind}:{self.seed}"


def is_family_name(name: str) -> bool:
    return name.startswith(PREFIX)


def parse_family_name(name: str) -> tuple[str, int]:
    """``family:KIND:SEED`` -> (KIND, SEED), checked without building anything."""
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != PREFIX[:-1]:
        raise PlacerError(f"bad family graph name {name!r}: {_USAGE}")
    kind, seed_text = parts[1], parts[2]
    if kind not in KINDS:
        raise PlacerError(f"unknown graph family {kind!r} in {name!r}: known kinds {', '.join(KINDS)} "
                          f"({_USAGE})")
    if seed_text.startswith("-") and seed_text[1:].isascii() and seed_text[1:].isdigit():
        raise PlacerError(f"negative seed {seed_text} in {name!r}: {_USAGE}")
    if not (seed_text.isascii() and seed_text.isdigit()) or str(int(seed_text)) != seed_text:
        raise PlacerError(f"bad seed {seed_text!r} in {name!r}: {_USAGE} written without leading zeros")
    return kind, int(seed_text)


def family_names(count: int, start_seed: int = 0) -> list[str]:
    """``count`` family names cycling the kinds (rnn, cnn, transformer, rnn, ...) with seeds start_seed,
    start_seed + 1, ...: a trainer's "family of N graphs"."""
    if not (is_whole_number(count) and is_whole_number(start_seed)) or count < 0 or start_seed < 0:
        raise PlacerError(f"family_names needs whole numbers count >= 0 and start_seed >= 0, not {count!r} and "
                          f"{start_seed!r}")
    if count > MAX_FAMILY_GRAPHS:
        raise PlacerError(f"{count} graphs is more than the {MAX_FAMILY_GRAPHS:,} a family holds")
    return [f"{PREFIX}{KINDS[i % len(KINDS)]}:{start_seed + i}" for i in range(count)]


def draw_family_config(kind: str, seed: int) -> FamilyConfig:
    """The model configuration ``family:KIND:SEED`` stands for (the ranges of the module docstring)."""
    if kind not in KINDS:
        raise PlacerError(f"unknown graph family {kind!r}: known kinds {', '.join(KINDS)}")
    if seed < 0:
        raise PlacerError(f"family seeds are non-negative, not {seed}")
    rng = np.random.default_rng(seed)
    model, config = {"rnn": _draw_rnn, "cnn": _draw_cnn, "transformer": _draw_transformer}[kind](rng)
    return FamilyConfig(kind, seed, model, config)


def _grid(rng: np.random.Generator, low: int, high: int, step: int = 1) -> int:
    """A uniform draw from low, low + step, ..., high (inclusive), as a plain int."""
    return low + step * int(rng.integers(0, (high - low) // step + 1))


def _draw_rnn(rng: np.random.Generator) -> tuple[str, dict]:
    if rng.random() < 0.5:
        layers = _grid(rng, 1, 4)
        steps = min(80, NMT_MAX_LAYER_STEPS // layers)  # source + target length
        src_len = _grid(rng, 10, min(40, steps - 10))
        tgt_len = _grid(rng, 10, min(40, steps - src_len))
        return "nmt", {"layers": layers, "hidden": _grid(rng, 256, 1024, 128),
                       "batch_size": _grid(rng, 64, 512, 64), "src_len": src_len, "tgt_len": tgt_len,
                       "src_vocab": _grid(rng, 8000, 32000, 1000), "tgt_vocab": _grid(rng, 8000, 32000, 1000)}
    return "rnnlm", {"layers": _grid(rng, 1, 2), "hidden": _grid(rng, 256, 1024, 128),
                     "seq_len": _grid(rng, 10, 40), "batch_size": _grid(rng, 64, 512, 64),
                     "vocab": _grid(rng, 5000, 20000, 1000)}


def _draw_transformer(rng: np.random.Generator) -> tuple[str, dict]:
    d_model = _grid(rng, 256, 768, 64)
    head_counts = [h for h in range(1, d_model // 32 + 1) if d_model % h == 0 and 32 <= d_model // h <= 128]
    seq_len = _grid(rng, 128, 512, 64)
    return "transformer", {"layers": _grid(rng, 2, 6), "d_model": d_model,
                           "heads": int(rng.choice(head_counts)), "seq_len": seq_len, "context": seq_len,
                           "batch_size": _grid(rng, 8, 64, 8), "vocab": _grid(rng, 8000, 50257)}


def _draw_cnn(rng: np.random.Generator) -> tuple[str, dict]:
    stages = _grid(rng, 2, 4)
    return "cnn", {"blocks": [_grid(rng, 1, 3) for _ in range(stages)],
                   "branches": [_grid(rng, 2, 4) for _ in range(stages)],
                   "residual": [bool(rng.random() < 0.5) for _ in range(stages)],
                   "width": _grid(rng, 16, 64, 8), "image_size": _grid(rng, 32, 224, 16),
                   "batch_size": _grid(rng, 32, 256, 32), "classes": _grid(rng, 10, 1000)}


def family_benchmark(name: str) -> Benchmark:
    """``family:KIND:SEED`` as a Benchmark, so graphs.registry builds and caches it like the others (its
    cache key holds the name and the drawn configuration)."""
    drawn = draw_family_config(*parse_family_name(name))
    return Benchmark(drawn.name, "graphs.families:build_family_graph",
                     f"{drawn.kind} family graph, seed {drawn.seed}: {drawn.model} {drawn.config}",
                     {"name": drawn.name, "model": drawn.model, "model_config": drawn.config})


def build_family_graph(name: str, model: str, model_config: dict) -> OpGraph:
    """Trace one drawn family member (torch is imported only here)."""
    from graphs.benchmarks import torch_models
    from graphs.torch.importer import trace_training_step

    makers = {"nmt": torch_models.nmt_model, "rnnlm": torch_models.rnnlm_model,
              "transformer": torch_models.transformer_model, "cnn": torch_models.branchy_cnn_model}
    if model not in makers:
        raise PlacerError(f"unknown family model {model!r}: known {', '.join(makers)}")
    module, inputs = makers[model](**model_config)
    return trace_training_step(module, inputs, name=name, source=f"{name}: {model} {model_config}")
