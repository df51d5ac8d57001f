"""The learners' settings (``RLConfig``): one field per knob, each saying where it departs from the papers.

Where the defaults depart from the paper's recipe (decode order, rank advantages, entropy bonus, temperature,
checkpoint interval) each field says so; the measurements behind them are in BENCHMARKS.md ("Tuning notes").
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Mapping

from graphs.errors import PlacerError, check_seed, is_whole_number

TRAINERS = ("reinforce", "ppo")
DECODE_ORDERS = ("forward_position", "group")
MODULES = ("seq2seq", "factorized")
HIDDEN_SIZE = 256  # learner width: RLConfig's default, and SearchConfig's, placer reproduce's and the module's
BATCH_SIZE = 16  # placements per iteration: RLConfig's default, and SearchConfig's and placer reproduce's
FACTORIZED_LR = 1e-2  # the factorized module's default: its raw logits need steps far larger than an LSTM's
# (tuned with Post on nmt-4 / paper-4gpu: 3e-2 converged early on seed 1)
CHECKPOINT_EVERY = 10  # iterations between checkpoints: RLConfig's default, and every search's
DEFAULT_PENALTY_RUNTIME_S = 100.0  # the runtime an out-of-memory or failed placement scores (policies/rl/env.py)


def check_learner_sizes(batch_size: int, hidden_size: int, penalty_runtime_s: float) -> None:
    """The settings every learner's config shares (RLConfig, the hierarchical planner's), checked alike."""
    if not (is_whole_number(batch_size) and batch_size >= 2):
        raise PlacerError(f"batch_size must be a whole number >= 2, got {batch_size!r}")
    if not (is_whole_number(hidden_size) and hidden_size >= 2 and hidden_size % 2 == 0):
        raise PlacerError(f"hidden_size must be an even number >= 2, got {hidden_size!r}")
    if not _is_real(penalty_runtime_s) or not 0 < penalty_runtime_s < math.inf:
        raise PlacerError(f"penalty_runtime_s must be a finite number above 0, got {penalty_runtime_s!r}")


def check_numbers(config, counts: Mapping[str, int], positive: tuple[str, ...] = (),
                  non_negative: tuple[str, ...] = ()) -> None:
    """``counts``: fields that are whole numbers of at least their value; ``positive`` / ``non_negative``:
    finite numbers above / at least 0. A field typed ``X | None`` may be None. NaN, a fraction where a
    count goes, or a negative learning rate ended in a traceback mid-run, or trained on garbage."""
    optional = {field.name for field in fields(config) if "None" in str(field.type)}
    for name, least in counts.items():
        value = getattr(config, name)
        if not (value is None and name in optional) and not (is_whole_number(value) and value >= least):
            raise PlacerError(f"{name} must be a whole number >= {least}, got {value!r}")
    for names, least, words in ((positive, math.nextafter(0.0, 1.0), "above 0"), (non_negative, 0.0, ">= 0")):
        for name in names:
            value = getattr(config, name)
            if not (value is None and name in optional) and not (_is_real(value) and least <= value < math.inf):
                raise PlacerError(f"{name} must be a finite number {words}, got {value!r}")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass
class RLConfig:
    trainer: str = "reinforce"
    """'reinforce' (the 2017 paper: policy gradient with a moving-average baseline) or 'ppo' (as Spotlight)."""
    batch_size: int = BATCH_SIZE
    """B: placements sampled, measured (in one call) and learned from per iteration."""
    hidden_size: int = HIDDEN_SIZE
    """LSTM/attention width (the paper: 512; smaller is cheaper: the learner dominates a simulated search)."""
    lr: float | None = None
    """Adam learning rate; None: 1e-3 for reinforce, 5e-4 for ppo, FACTORIZED_LR for the factorized module
    (the paper's 0.1, even 0.02, saturates the tanh-squashed logits in one Adam step and the policy collapses onto one placement)."""
    lr_decay: float = 0.95
    """Learning-rate factor per ``lr_decay_every`` iterations once decay starts (the paper: 0.95)."""
    lr_decay_every: int = 50
    """Iterations between decay steps (the paper: 50)."""
    lr_decay_start: int = 100
    """Iteration at which the decay begins (the paper: 400 single-sample steps)."""
    grad_clip: float = 1.0
    """Global gradient-norm bound (the paper: 1.0)."""
    baseline_decay: float = 0.9
    """REINFORCE: moving-average baseline decay (the paper: 0.9)."""
    entropy_coeff: float = 0.03
    """Weight of the policy-entropy bonus in the loss (the paper: none; keeps the tanh-squashed logits from
    saturating onto the single-GPU placement)."""
    batch_baseline: bool = False
    """REINFORCE: baseline each reward by the mean of the other rewards of its batch (leave-one-out)
    instead of the moving average."""
    normalize_advantages: bool = False
    """REINFORCE: divide advantages by the batch's reward standard deviation (scale-free rewards)."""
    rank_advantages: bool = True
    """REINFORCE: use each placement's centered rank in its batch, in [-0.5, 0.5], as its advantage."""
    penalty_runtime_s: float = DEFAULT_PENALTY_RUNTIME_S
    """Runtime a failed/oom/timeout/crash placement is scored as (the reference: 100 s, reward -10)."""
    temperature: float = 2.0
    """Softmax temperature of the device logits, before the tanh squashing (the paper: 1.0, at which the
    squashed logits saturate and the policy freezes)."""
    tanh_constant: float = 5.0
    """Device logits are squashed to +-tanh_constant (see policies/rl/seq2seq/module.py for why not 1.0)."""
    logit_noise_std: float = 0.5
    """Noise on the device logits while sampling, times their RMS, decayed linearly to 0 (the paper: 0.5)."""
    noise_stop_iteration: int = 30
    """Iteration from which sampling is noise-free."""
    ppo_clip: float = 0.2
    """PPO: ratio clip parameter."""
    ppo_epochs: int = 4
    """PPO: passes over each batch."""
    ppo_minibatch_size: int | None = None
    """PPO: minibatch size (None: the whole batch, one gradient step per epoch)."""
    vf_loss_coeff: float = 0.5
    """PPO: weight of the value-function loss."""
    checkpoint_every: int = CHECKPOINT_EVERY
    """Iterations between checkpoints, when a checkpoint folder is given (one is always written at the end;
    one per iteration cost as much as the update itself)."""
    torch_threads: int | None = None
    """If set, torch.set_num_threads(torch_threads) for the whole process (1 is fastest on a busy 2-core box)."""
    decode_order: str = "forward_position"
    """Order the decoder places the groups in: 'forward_position' (by the mean topological position of each
    group's forward ops, so runs of one device are layer-contiguous pipeline stages) or 'group' (index order)."""
    module: str = "seq2seq"
    """The policy network: 'seq2seq' (the 2017 paper's LSTM placer) or 'factorized' (Post's independent
    per-group device distributions, a (G, D) logit table: hidden_size, tanh_constant and temperature unused)."""
    warm_start_steps: int = 300
    """Most Adam steps of the supervised imitation of a warm start (teacher-forced cross-entropy); it stops
    earlier once the greedy placement is the target and ``imitation_target_prob`` is reached."""
    imitation_lr: float = 1e-2
    """Adam learning rate of the imitation and cross-entropy steps (their own optimizer: the RL optimizer's
    moment estimates are left as the policy gradient made them)."""
    imitation_target_prob: float = 0.6
    """Imitation stops once the target's mean per-group probability reaches this (and the greedy placement
    is the target): well below 1 so that samples still move some groups off the target, a local search
    around the warm start (nmt-4 / paper-4gpu, seeds 0/1 from the expert: 0.9 gave 0.559/0.517, 0.6
    0.484/0.517)."""
    warm_entropy_coeff: float | None = 0.01
    """Entropy-bonus weight of a warm-started run (None: ``entropy_coeff``); the full bonus pulls the policy
    back toward uniform, away from the warm start it imitated (nmt-4 / paper-4gpu: 0.01 beat 0.0)."""
    uniform_mix: float = 0.0
    """Factorized module: share of the uniform distribution over allowed devices mixed into sampling."""
    ce_every: int = 0
    """Iterations between cross-entropy minimization steps (Post; 0: none): the policy is fitted to the
    elite placements measured in the last ``ce_window`` iterations, with the imitation routine."""
    ce_steps: int = 5
    """Adam steps per cross-entropy minimization step."""
    elite_fraction: float = 0.1
    """Share of the window's placements (best first) the cross-entropy step fits; the best so far is added."""
    ce_window: int = 4
    """Iterations whose placements the cross-entropy step chooses its elites from."""
    seed: int = 0
    """Seeds the network's initial weights and the sampling; same seed + noiseless measurer = same run."""

    def __post_init__(self) -> None:
        if self.trainer not in TRAINERS:
            raise PlacerError(f"unknown trainer {self.trainer!r} (known: {', '.join(TRAINERS)})")
        check_learner_sizes(self.batch_size, self.hidden_size, self.penalty_runtime_s)
        check_numbers(self, counts={"lr_decay_every": 1, "ppo_epochs": 1, "ppo_minibatch_size": 1,
                                    "checkpoint_every": 1, "ce_window": 1, "torch_threads": 1, "lr_decay_start": 0,
                                    "noise_stop_iteration": 0, "warm_start_steps": 0, "ce_every": 0, "ce_steps": 0},
                      positive=("lr", "grad_clip", "temperature", "tanh_constant", "imitation_lr", "ppo_clip"),
                      non_negative=("entropy_coeff", "warm_entropy_coeff", "logit_noise_std", "vf_loss_coeff"))
        check_seed(self.seed, "seed")
        if not 0.0 < self.lr_decay <= 1.0:
            raise PlacerError(f"lr_decay must lie in (0, 1], got {self.lr_decay}")
        if not 0.0 <= self.baseline_decay < 1.0:
            raise PlacerError(f"baseline_decay must lie in [0, 1), got {self.baseline_decay}")
        if not 0.0 < self.imitation_target_prob <= 1.0:
            raise PlacerError(f"imitation_target_prob must lie in (0, 1], got {self.imitation_target_prob}")
        if self.module not in MODULES:
            raise PlacerError(f"unknown module {self.module!r} (known: {', '.join(MODULES)})")
        if not 0.0 <= self.uniform_mix < 1.0:
            raise PlacerError(f"uniform_mix must lie in [0, 1), got {self.uniform_mix}")
        if self.uniform_mix and self.module != "factorized":
            raise PlacerError(f"uniform_mix applies to the factorized module only, not {self.module!r}")
        if not 0.0 < self.elite_fraction <= 1.0:
            raise PlacerError(f"elite_fraction must lie in (0, 1], got {self.elite_fraction}")
        if self.decode_order not in DECODE_ORDERS:
            raise PlacerError(f"unknown decode_order {self.decode_order!r} (known: {', '.join(DECODE_ORDERS)})")

    def for_warm_start(self) -> "RLConfig":
        """This config for a warm-started run: no logit noise (it would wipe out the imitated start) and the
        ``warm_entropy_coeff`` bonus in place of ``entropy_coeff``, whatever that was (None keeps it). 0.01 is
        below REINFORCE's 0.03, whose pull toward uniform undoes the start, and above Post's 0.0: from the
        expert's start on nmt-4 / paper-4gpu, 0.01 beat 0.0 (the field's docstring; measured with REINFORCE, not
        tuned for Post apart)."""
        entropy = self.entropy_coeff if self.warm_entropy_coeff is None else self.warm_entropy_coeff
        return replace(self, logit_noise_std=0.0, entropy_coeff=entropy)

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        if self.module == "factorized":
            return FACTORIZED_LR
        return 1e-3 if self.trainer == "reinforce" else 5e-4
