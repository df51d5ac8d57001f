"""The learners' settings (``RLConfig``): one field per knob, each saying where it departs from the papers.

Where the defaults depart from the paper's recipe (decode order, rank advantages, entropy bonus, temperature,
checkpoint interval) each field says so; the measurements behind them are in BENCHMARKS.md ("Tuning notes").
"""

from __future__ import annotations

from dataclasses import dataclass

from graphs.errors import PlacerError
from policies.rl.env import DEFAULT_PENALTY_RUNTIME_S

TRAINERS = ("reinforce", "ppo")
DECODE_ORDERS = ("forward_position", "group")
HIDDEN_SIZE = 256  # learner width: RLConfig's default, and SearchConfig's, placer reproduce's and the module's
BATCH_SIZE = 16  # placements per iteration: RLConfig's default, and SearchConfig's and placer reproduce's
CHECKPOINT_EVERY = 10  # iterations between checkpoints: RLConfig's default, and every search's


@dataclass
class RLConfig:
    trainer: str = "reinforce"
    """'reinforce' (the 2017 paper: policy gradient with a moving-average baseline) or 'ppo' (as Spotlight)."""
    batch_size: int = BATCH_SIZE
    """B: placements sampled, measured (in one call) and learned from per iteration."""
    hidden_size: int = HIDDEN_SIZE
    """LSTM/attention width (the paper: 512; smaller is cheaper: the learner dominates a simulated search)."""
    lr: float | None = None
    """Adam learning rate; None: 1e-3 for reinforce, 5e-4 for ppo (the paper's 0.1, even 0.02, saturates the
    tanh-squashed logits in one Adam step and the policy collapses onto one placement)."""
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
    seed: int = 0
    """Seeds the network's initial weights and the sampling; same seed + noiseless measurer = same run."""

    def __post_init__(self) -> None:
        if self.trainer not in TRAINERS:
            raise PlacerError(f"unknown trainer {self.trainer!r} (known: {', '.join(TRAINERS)})")
        if self.batch_size < 2:
            raise PlacerError(f"batch_size must be at least 2, got {self.batch_size}")
        if self.hidden_size < 2 or self.hidden_size % 2:
            raise PlacerError(f"hidden_size must be an even number >= 2, got {self.hidden_size}")
        if not self.penalty_runtime_s > 0:
            raise PlacerError(f"penalty_runtime_s must be positive, got {self.penalty_runtime_s}")
        if self.decode_order not in DECODE_ORDERS:
            raise PlacerError(f"unknown decode_order {self.decode_order!r} (known: {', '.join(DECODE_ORDERS)})")

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return 1e-3 if self.trainer == "reinforce" else 5e-4
