"""The hierarchical planner's settings (``HierarchicalConfig``), checked on construction."""

from __future__ import annotations

from dataclasses import dataclass

from graphs.errors import PlacerError, check_seed
from graphs.grouping import METHODS
from policies.rl.config import (BATCH_SIZE, CHECKPOINT_EVERY, DEFAULT_PENALTY_RUNTIME_S, HIDDEN_SIZE,
                                check_learner_sizes, check_numbers)

NUM_GROUPS = 256  # the paper's grouper output size; fewer when the graph has fewer atoms
SOFT_PRIORS = ("position", "uniform")  # priors that are logits, not a grouping to start on
PRIORS = (*METHODS, *SOFT_PRIORS)  # how the grouper starts (HierarchicalConfig.prior)
ENTROPY_PER_32_GROUPS = 0.03  # the default entropy weight at 32 groups or fewer (HierarchicalConfig.entropy_coeff)


@dataclass
class HierarchicalConfig:
    num_groups: int = NUM_GROUPS
    """G: groups the grouper's softmax chooses among (capped at the number of atoms)."""
    batch_size: int = BATCH_SIZE
    """B: placements sampled, measured in one call and learned from per iteration."""
    hidden_size: int = HIDDEN_SIZE
    """Width of the grouper's hidden layers and of the placer's LSTMs."""
    prior: str = "scope"
    """How the grouper starts, before any reward: a grouping method of ``graphs.grouping`` (scope, metis,
    topo, colocation, fusion), whose G groups the atoms start in (each atom leaves its group with
    probability ``move_prob`` per sample); ``position``, the soft topological prior of width
    ``prior_width`` (``module.topo_prior``); or ``uniform``, the paper's start. BENCHMARKS.md ("The
    grouper's start") measured them."""
    prior_width: float = 1.0
    """Width, in groups, of the ``position`` prior."""
    lr: float = 1e-3
    """Adam learning rate of both networks (one optimizer)."""
    grad_clip: float = 1.0
    """Global gradient-norm bound."""
    entropy_coeff: float | None = None
    """Weight of the entropy bonus: mean per-atom grouper entropy plus summed per-group placer entropy
    (policies/rl/hierarchical/learner.py says why). None: ``ENTROPY_PER_32_GROUPS`` (RLConfig's 0.03) at
    32 groups or fewer, scaled by 32 / G above (0.00375 at 256): on nmt-4 / paper-4gpu, 2,048
    measurements, seed 0, 0.03 kept 256 groups near uniform (2.36-2.82 s) where 0.005 gave 1.29-1.30 s,
    and at 32 groups 0.005 was worse than 0.03 on 4 of 5 runs (``effective_entropy_coeff``)."""
    temperature: float = 2.0
    """Placer logit temperature (as RLConfig's)."""
    tanh_constant: float = 5.0
    """Placer logit squashing (as RLConfig's)."""
    penalty_runtime_s: float = DEFAULT_PENALTY_RUNTIME_S
    """Runtime a failed placement is scored as."""
    imitation_steps: int = 200
    """At most this many supervised placer steps towards the warm start's devices (it stops earlier once
    its greedy decode gives them)."""
    imitation_lr: float = 1e-2
    """Adam learning rate of those supervised steps."""
    move_prob: float = 0.002
    """The probability that an atom is sampled outside the group it starts in, the warm start's or the
    ``prior`` grouping's (about 9 of nmt-4's 4,406 atoms per placement): exploration stays local."""
    warm_placement_prob: float = 0.5
    """Imitation continues until the placer samples the target's devices for the target grouping whole
    with at least this probability (so most sampled placements differ from it by a group or two)."""
    warm_entropy_coeff: float = 0.0
    """Entropy weight once warm-started: no push back towards uniform, so exploration stays local."""
    decode_order: str = "group"
    """'group': the placer places groups in index order (topological by construction); 'position': each
    sample's groups sorted by their members' mean position (see policies/rl/hierarchical/features.py)."""
    checkpoint_every: int = CHECKPOINT_EVERY
    """Iterations between checkpoints (one is always written at the end)."""
    torch_threads: int | None = None
    """If set, torch.set_num_threads for the whole process."""
    seed: int = 0
    """Seeds the networks' initial weights and all sampling."""

    def __post_init__(self) -> None:
        check_learner_sizes(self.batch_size, self.hidden_size, self.penalty_runtime_s)
        check_numbers(self, counts={"num_groups": 1, "imitation_steps": 0, "checkpoint_every": 1, "torch_threads": 1},
                      positive=("lr", "grad_clip", "temperature", "tanh_constant", "imitation_lr"),
                      non_negative=("prior_width", "entropy_coeff", "warm_entropy_coeff"))
        check_seed(self.seed, "seed")
        if self.prior not in PRIORS:
            raise PlacerError(f"unknown prior {self.prior!r} (known: {', '.join(PRIORS)})")
        if not 0.0 < self.move_prob < 1.0:
            raise PlacerError(f"move_prob must lie in (0, 1), got {self.move_prob}")
        if not 0.0 < self.warm_placement_prob < 1.0:
            raise PlacerError(f"warm_placement_prob must lie in (0, 1), got {self.warm_placement_prob}")
        if self.decode_order not in ("group", "position"):
            raise PlacerError(f"unknown decode_order {self.decode_order!r} (known: group, position)")

    @property
    def start_method(self) -> str | None:
        """The grouping method whose groups the grouper starts on; None for a soft prior (position, uniform)."""
        return None if self.prior in SOFT_PRIORS else self.prior

    def effective_entropy_coeff(self, num_groups: int) -> float:
        """``entropy_coeff``, or its default for ``num_groups`` groups (see the field)."""
        if self.entropy_coeff is not None:
            return float(self.entropy_coeff)
        return ENTROPY_PER_32_GROUPS * min(1.0, 32.0 / max(int(num_groups), 1))
