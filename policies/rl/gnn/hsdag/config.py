"""HSDAG's settings (``HsdagConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from graphs.errors import PlacerError
from policies.base import FAILURE_FACTOR

ADVANTAGES = ("rank", "baseline")
INITS = ("scratch", "pretrained")


@dataclass(frozen=True)
class HsdagConfig:
    hidden_size: int = 64
    """Width of every embedding."""
    num_layers: int = 3
    """Message-passing layers of the graph encoder."""
    batch_size: int = 8
    """Placements (parses and their devices) sampled per update, measured in one call (8: twice the
    updates of 16 in a budget; bench_hsdag cold at op level 17.40 / 12.85 / 39.50 ms against 17.56 /
    12.85 / 40.19)."""
    lr: float = 1e-3
    """Adam learning rate."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus (mean Bernoulli entropy of the merges plus mean device entropy)."""
    grad_clip: float = 1.0
    """Global gradient-norm bound."""
    advantage: str = "rank"
    """'rank': centered ranks of -runtime in the batch (as gdp and reinforce); 'baseline': the paper's
    REINFORCE, -runtime (relative to the first batch's mean) minus a moving-average baseline."""
    baseline_decay: float = 0.9
    """'baseline' advantages: weight of the old baseline in each moving-average step."""
    failure_factor: float = FAILURE_FACTOR
    """A failed placement is scored as this many times the worst ok runtime seen on the problem."""
    stall_temperature_growth: float = 1.5
    """A stalled run (policy.STALL_ITERATIONS updates with nothing new) multiplies the sampling
    temperature by this (1: never; the stall then ends the run)."""
    max_temperature: float = 8.0
    """The sampling temperature's cap; a run stops early only when it stalls at the cap."""
    imitation_steps: int = 300
    """Adam steps fitting a warm start (the parse that merges every edge whose ends share a device): 300
    keep the samples closer to it than 100 (bench_hsdag from heft, inception-v3-infer: 15.62 ms over seeds
    0-5 with 8 per batch, annealing 15.68; 16 per batch and 100 steps: 15.84 over seeds 0-2); about 30 s
    on nmt-2's 2392 colocation groups."""
    init: str = "scratch"
    """'scratch' or 'pretrained': encoder, device MLP and pair scorer from gdp's committed checkpoint
    (its hidden size and layer count then replace these)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGES:
            raise PlacerError(f"hsdag: unknown advantage {self.advantage!r} (known: {', '.join(ADVANTAGES)})")
        if self.init not in INITS:
            raise PlacerError(f"hsdag: unknown init {self.init!r} (known: {', '.join(INITS)})")
        if self.batch_size < 2:
            raise PlacerError(f"hsdag: batch_size must be at least 2, got {self.batch_size}")
        if self.hidden_size < 4 or self.num_layers < 1:
            raise PlacerError(f"hsdag: hidden_size must be >= 4 and num_layers >= 1, got {self.hidden_size}, "
                              f"{self.num_layers}")
        if self.entropy_coeff < 0 or not self.lr > 0 or self.failure_factor <= 1.0:
            raise PlacerError(f"hsdag: entropy_coeff >= 0, lr > 0 and failure_factor > 1 needed, got "
                              f"{self.entropy_coeff}, {self.lr}, {self.failure_factor}")
        if self.stall_temperature_growth < 1.0 or self.max_temperature < 1.0:
            raise PlacerError(f"hsdag: stall_temperature_growth and max_temperature must be >= 1, got "
                              f"{self.stall_temperature_growth}, {self.max_temperature}")
        if not 0.0 <= self.baseline_decay < 1.0 or self.imitation_steps < 0:
            raise PlacerError(f"hsdag: baseline_decay in [0, 1) and imitation_steps >= 0 needed, got "
                              f"{self.baseline_decay}, {self.imitation_steps}")
