"""Train the seq2seq placer with REINFORCE or PPO, a whole batch of placements per measurement call.

The loop, one iteration per batch (an RLlib Learner built alone, in this process; no EnvRunners)::

    sample B placements with the module's exploration pass   (autoregressive, seeded torch.Generator)
    measure all B with ONE measurer.measure call             (the pool measures them in parallel)
    rewards = -sqrt(runtime_s), failures as the penalty runtime
    learner.update(batch)                                    (REINFORCE + moving-average baseline, or PPO)

PPO gets its advantages in the batch: a placement is a one-step episode, so GAE reduces to
``reward - V(obs)`` (standardized over the batch, as RLlib's GAE connector does) and the value target is
the reward. Passing a ready batch to ``Learner.update`` skips the learner connector, so nothing recomputes
them. Example::

    result = train_placer(graph, machine, grouping, measurer, budget_measurements=2000,
                          config=RLConfig(trainer="reinforce", batch_size=16, seed=0))
    result.best_runtime_s, result.best_group_placement

Where the RLConfig defaults depart from the paper's recipe (decode order, rank advantages, entropy bonus,
temperature, checkpoint interval) each field says so; the measurements behind them are in BENCHMARKS.md
("Tuning notes").
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from graphs.errors import PlacerError
from measurers.base import Measurement
from policies.rl.env import DEFAULT_PENALTY_RUNTIME_S, PlacementEnv, scored_runtime_s

CHECKPOINT_FILE = "learner.pt"
TRAINERS = ("reinforce", "ppo")
DECODE_ORDERS = ("forward_position", "group")


@dataclass
class RLConfig:
    trainer: str = "reinforce"
    """'reinforce' (the 2017 paper: policy gradient with a moving-average baseline) or 'ppo' (as Spotlight)."""
    batch_size: int = 16
    """B: placements sampled, measured (in one call) and learned from per iteration."""
    hidden_size: int = 256
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
    checkpoint_every: int = 10
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


@dataclass
class IterationMetrics:
    iteration: int  # 0-based index of the batch just learned from
    measurements_used: int  # total so far, this batch included
    batch_size: int
    mean_reward: float
    batch_best_runtime_s: float  # inf when the whole batch failed
    best_runtime_s: float  # best ok runtime so far
    num_failed: int
    loss: float
    entropy: float
    baseline: float  # REINFORCE: moving-average baseline used; PPO: mean value estimate
    lr: float
    logit_noise_std: float
    sample_s: float  # exploration forward pass
    measure_s: float  # the one measure call
    update_s: float  # learner.update


@dataclass
class TrainResult:
    best_group_placement: np.ndarray | None  # (G,) int64; None if no placement succeeded
    best_op_placement: np.ndarray | None  # (N,) int64
    best_runtime_s: float  # inf if no placement succeeded
    measurements_used: int
    iterations: int
    seconds_per_update: float  # mean learner cost per iteration: sampling + update, measurement excluded
    seconds_per_measure_call: float  # mean wall time of the batch measure calls this session
    greedy_group_placement: np.ndarray  # (G,) int64: the trained policy's most likely placement
    stop_reason: str  # "budget" | "time_limit" | "should_stop"
    history: list[IterationMetrics] = field(default_factory=list)


OnBatch = Callable[[int, np.ndarray, np.ndarray, Sequence[Measurement], np.ndarray], None]
OnIteration = Callable[[IterationMetrics], None]


def train_placer(graph, machine, grouping, measurer, *, budget_measurements: int, time_limit_s: float | None = None,
                 config: RLConfig | None = None, on_batch: OnBatch | None = None,
                 on_iteration: OnIteration | None = None, checkpoint_dir: str | os.PathLike | None = None,
                 resume_from: str | os.PathLike | None = None, should_stop: Callable[[], bool] | None = None,
                 features: np.ndarray | None = None) -> TrainResult:
    """Search placements of ``graph``'s groups on ``machine`` until the measurement budget is spent.

    ``budget_measurements`` counts every measurement of the run, those before a resume included; the
    last batch is cut to what is left. ``time_limit_s`` and ``should_stop`` are checked between batches.
    ``on_batch(iteration, group_placements (B, G), op_placements (B, N), measurements, rewards (B,))``
    sees every measured batch; ``on_iteration(IterationMetrics)`` every update. ``features`` overrides
    the (G, F) group feature matrix.
    """
    config = config or RLConfig()
    if budget_measurements < 0:
        raise PlacerError(f"budget_measurements must not be negative, got {budget_measurements}")
    started = time.perf_counter()
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    env = PlacementEnv(graph, machine, grouping, measurer, penalty_runtime_s=config.penalty_runtime_s,
                       features=features)
    with deterministic_torch():
        trainer = _Trainer(env, config)
        if resume_from is not None:
            trainer.load(Path(resume_from) / CHECKPOINT_FILE)
        stop_reason = "budget"
        while trainer.measurements_used < budget_measurements:
            if time_limit_s is not None and time.perf_counter() - started >= time_limit_s:
                stop_reason = "time_limit"
                break
            if should_stop is not None and should_stop():
                stop_reason = "should_stop"
                break
            size = min(config.batch_size, budget_measurements - trainer.measurements_used)
            metrics = trainer.iterate(size, on_batch)
            if on_iteration is not None:
                on_iteration(metrics)
            if checkpoint_dir is not None and trainer.iteration % config.checkpoint_every == 0:
                trainer.save(Path(checkpoint_dir) / CHECKPOINT_FILE)
        if checkpoint_dir is not None:
            trainer.save(Path(checkpoint_dir) / CHECKPOINT_FILE)
        return trainer.result(stop_reason)


@contextmanager
def deterministic_torch() -> Iterator[None]:
    """torch's deterministic kernels wherever it has them (warning, not failing, where it has none),
    restored on exit. Same seed, same machine, same run; across CPU models the float rounding of torch's
    kernels still differs, and so may the placements a learner finds (BENCHMARKS.md)."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


class _Trainer:
    """The state of one training run: learner, module, sampling RNG, counters and the best placement."""

    def __init__(self, env: PlacementEnv, config: RLConfig):
        self.env, self.config = env, config
        self.learner = _build_learner(env, config)
        from ray.rllib.core import DEFAULT_MODULE_ID
        self.module = self.learner.module[DEFAULT_MODULE_ID].unwrapped()
        self.generator = torch.Generator().manual_seed(config.seed)
        self.order = _decode_order(env, config.decode_order)  # (G,) group placed at each decoder step
        self.obs = np.ascontiguousarray(env.obs[self.order])  # (G, F + D): the module sees groups in that order
        self.iteration = 0
        self.measurements_used = 0
        self.best_runtime_s = math.inf
        self.best_group_placement: np.ndarray | None = None
        self.best_op_placement: np.ndarray | None = None
        self.history: list[IterationMetrics] = []
        self._learner_s: list[float] = []
        self._measure_s: list[float] = []

    def iterate(self, size: int, on_batch: OnBatch | None) -> IterationMetrics:
        from ray.rllib.core.columns import Columns
        noise = self._noise_std()
        self.module.logit_noise_std = noise
        obs = np.repeat(self.obs[None], size, axis=0)  # (B, G, F + D), decoder order
        t0 = time.perf_counter()
        out = self.module.forward_exploration({Columns.OBS: torch.from_numpy(obs)}, generator=self.generator)
        t1 = time.perf_counter()
        decoded = out[Columns.ACTIONS].numpy().astype(np.int64)  # (B, G), decoder order
        actions = np.empty_like(decoded)  # (B, G), group index order
        actions[:, self.order] = decoded
        op_placements, measurements, rewards = self.env.measure_batch(actions)
        t2 = time.perf_counter()
        if on_batch is not None:
            on_batch(self.iteration, actions, op_placements, measurements, rewards)
        runtimes = np.array([scored_runtime_s(m, self.env.penalty_runtime_s) if m.ok else math.inf
                             for m in measurements])  # (B,)
        self._track_best(runtimes, actions, op_placements)
        batch = self._train_batch(obs, decoded, rewards, out)
        t3 = time.perf_counter()
        results = self._update(batch, size)
        t4 = time.perf_counter()
        self.iteration += 1
        self.measurements_used += size
        self._learner_s.append((t1 - t0) + (t4 - t3))
        self._measure_s.append(t2 - t1)
        metrics = IterationMetrics(
            iteration=self.iteration - 1, measurements_used=self.measurements_used, batch_size=size,
            mean_reward=float(rewards.mean()), batch_best_runtime_s=float(runtimes.min()),
            best_runtime_s=self.best_runtime_s, num_failed=sum(not m.ok for m in measurements),
            loss=results["loss"], entropy=results["entropy"], baseline=results["baseline"],
            lr=results["lr"], logit_noise_std=noise, sample_s=t1 - t0, measure_s=t2 - t1, update_s=t4 - t3)
        self.history.append(metrics)
        return metrics

    def _noise_std(self) -> float:
        stop = self.config.noise_stop_iteration
        if stop <= 0 or self.iteration >= stop:
            return 0.0
        return self.config.logit_noise_std * (1.0 - self.iteration / stop)

    def _track_best(self, runtimes: np.ndarray, actions: np.ndarray, op_placements: np.ndarray) -> None:
        b = int(np.argmin(runtimes))
        if runtimes[b] < self.best_runtime_s:
            self.best_runtime_s = float(runtimes[b])
            self.best_group_placement = actions[b].copy()
            self.best_op_placement = op_placements[b].copy()

    def _train_batch(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, out: dict) -> dict:
        from ray.rllib.core.columns import Columns
        batch = {Columns.OBS: obs, Columns.ACTIONS: actions, Columns.REWARDS: rewards.astype(np.float32)}
        if self.config.trainer == "ppo":
            with torch.no_grad():
                values = self.module.compute_values({Columns.OBS: torch.from_numpy(obs)}).numpy()  # (B,)
            advantages = rewards - values
            advantages = (advantages - advantages.mean()) / max(1e-4, float(advantages.std()))
            batch.update({
                Columns.ACTION_LOGP: out[Columns.ACTION_LOGP].numpy(),
                Columns.ACTION_DIST_INPUTS: out[Columns.ACTION_DIST_INPUTS].numpy(),
                Columns.ADVANTAGES: advantages.astype(np.float32),
                Columns.VALUE_TARGETS: rewards.astype(np.float32),
                Columns.VF_PREDS: values.astype(np.float32),
            })
        return batch

    def _update(self, batch: dict, size: int) -> dict[str, float]:
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
        from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
        train_batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=size)
        kwargs = {}
        if self.config.trainer == "ppo":
            kwargs = {"num_epochs": self.config.ppo_epochs, "minibatch_size": self.config.ppo_minibatch_size,
                      "shuffle_batch_per_epoch": self.config.ppo_minibatch_size is not None}
        lr = float(self._optimizers()[0][1].param_groups[0]["lr"])  # the lr this update uses
        results = self.learner.update(batch=train_batch, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self.iteration + 1},
                                      **kwargs)
        summary = _summarize(results, DEFAULT_MODULE_ID, self.config.trainer, batch)
        summary["lr"] = lr
        return summary

    def result(self, stop_reason: str) -> TrainResult:
        from ray.rllib.core.columns import Columns
        decoded = self.module.forward_inference({Columns.OBS: torch.from_numpy(self.obs[None])})
        greedy = np.empty(self.env.num_groups, dtype=np.int64)
        greedy[self.order] = decoded[Columns.ACTIONS][0].numpy()
        return TrainResult(
            best_group_placement=self.best_group_placement, best_op_placement=self.best_op_placement,
            best_runtime_s=self.best_runtime_s, measurements_used=self.measurements_used,
            iterations=self.iteration,
            seconds_per_update=float(np.mean(self._learner_s)) if self._learner_s else 0.0,
            seconds_per_measure_call=float(np.mean(self._measure_s)) if self._measure_s else 0.0,
            greedy_group_placement=greedy,
            stop_reason=stop_reason, history=self.history)

    # ---- checkpoints ------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Weights, optimizer, baseline, sampling RNG, counters and best placement, written atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        optimizers = {name: opt.state_dict() for name, opt in self._optimizers()}
        state = {
            "config": asdict(self.config), "shape": list(self.env.allowed.shape),
            "module": self.module.state_dict(), "optimizers": optimizers,
            "reward_baseline": getattr(self.learner, "reward_baseline", None),
            "generator": self.generator.get_state(), "iteration": self.iteration,
            "measurements_used": self.measurements_used, "best_runtime_s": self.best_runtime_s,
            "best_group_placement": _tensor_or_none(self.best_group_placement),
            "best_op_placement": _tensor_or_none(self.best_op_placement),
        }
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def _optimizers(self) -> list:
        from ray.rllib.core import DEFAULT_MODULE_ID
        return list(self.learner.get_optimizers_for_module(DEFAULT_MODULE_ID))

    def load(self, path: Path) -> None:
        if not path.is_file():
            raise PlacerError(f"no learner checkpoint at {path}")
        state = torch.load(path, weights_only=True)
        if state["shape"] != list(self.env.allowed.shape):
            raise PlacerError(f"checkpoint {path} places {state['shape'][0]} groups on {state['shape'][1]} devices, "
                              f"this run {self.env.num_groups} on {self.env.num_devices}")
        for key in ("trainer", "hidden_size", "tanh_constant", "decode_order"):
            if state["config"].get(key, "group") != getattr(self.config, key):
                raise PlacerError(f"checkpoint {path} was trained with {key}={state['config'].get(key, 'group')!r}, "
                                  f"this run has {getattr(self.config, key)!r}")
        self.module.load_state_dict(state["module"])
        optimizers = dict(self._optimizers())
        for name, opt_state in state["optimizers"].items():
            optimizers[name].load_state_dict(opt_state)
        if hasattr(self.learner, "reward_baseline"):
            self.learner.reward_baseline = state["reward_baseline"]
        self.generator.set_state(state["generator"])
        self.iteration, self.measurements_used = state["iteration"], state["measurements_used"]
        self.best_runtime_s = state["best_runtime_s"]
        self.best_group_placement = _array_or_none(state["best_group_placement"])
        self.best_op_placement = _array_or_none(state["best_op_placement"])


def checkpoint_progress(checkpoint_dir: str | os.PathLike) -> tuple[int, int]:
    """(iterations, measurements) a run resumed from ``checkpoint_dir`` starts at; (0, 0) without a
    checkpoint. The search job numbers a resumed run's log rows and its progress from it."""
    path = Path(checkpoint_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return 0, 0
    state = torch.load(path, weights_only=True)
    return int(state["iteration"]), int(state["measurements_used"])


def _decode_order(env: PlacementEnv, order: str) -> np.ndarray:
    """(G,) int64: the group the decoder places at each step."""
    if order == "group" or env.graph is None or not hasattr(env.grouping, "op_group"):
        return np.arange(env.num_groups, dtype=np.int64)
    from graphs.features import forward_position
    position = forward_position(env.graph, np.asarray(env.grouping.op_group), env.num_groups)  # (G,)
    return np.argsort(position, kind="stable").astype(np.int64)


def _build_learner(env: PlacementEnv, config: RLConfig):
    """An RLlib Learner (in this process) for the seq2seq module with the chosen loss."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from policies.rl.seq2seq.module import Seq2SeqPlacer
    if config.trainer == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig
        algo_config = PPOConfig().training(clip_param=config.ppo_clip, vf_loss_coeff=config.vf_loss_coeff,
                                           entropy_coeff=config.entropy_coeff, use_kl_loss=False,
                                           vf_clip_param=config.penalty_runtime_s)
    else:
        from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

        from policies.rl.reinforce import ReinforceLearner
        algo_config = AlgorithmConfig().learners(
            learner_class=ReinforceLearner,
            learner_config_dict={"baseline_decay": config.baseline_decay, "entropy_coeff": config.entropy_coeff,
                                 "batch_baseline": config.batch_baseline,
                                 "normalize_advantages": config.normalize_advantages,
                                 "rank_advantages": config.rank_advantages})
    model_config = {"hidden_size": config.hidden_size, "tanh_constant": config.tanh_constant,
                    "temperature": config.temperature, "logit_noise_std": config.logit_noise_std}
    algo_config = (algo_config.framework("torch")
                   .training(lr=_lr_schedule(config), grad_clip=config.grad_clip, grad_clip_by="global_norm")
                   .learners(num_learners=0)
                   .debugging(seed=config.seed))
    # What AlgorithmConfig.build_learner does, with the module spec given whole (the base config, used for
    # REINFORCE, has no default module spec to merge it into).
    module_spec = MultiRLModuleSpec(rl_module_specs={DEFAULT_MODULE_ID: RLModuleSpec(
        module_class=Seq2SeqPlacer, observation_space=env.observation_space, action_space=env.action_space,
        model_config=model_config)})
    learner = algo_config.learner_class(config=algo_config, module_spec=module_spec)
    learner.build()
    return learner


def _lr_schedule(config: RLConfig) -> list[list[float]] | float:
    """The paper's staircase decay as RLlib [[iteration, lr], ...] points (linear between them)."""
    lr = config.learning_rate
    if config.lr_decay >= 1.0:
        return lr
    points = [[0, lr], [config.lr_decay_start, lr]]
    for k in range(1, 60):
        points.append([config.lr_decay_start + k * config.lr_decay_every, lr * config.lr_decay ** k])
    return points


def _summarize(results: dict, module_id: str, trainer: str, batch: dict) -> dict[str, float]:
    """Plain floats out of the Learner's reduced metrics."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY
    stats = results.get(module_id, {})

    def value(key: str, default: float = math.nan) -> float:
        item = stats.get(key)
        if item is None:
            return default
        item = item.peek() if hasattr(item, "peek") else item
        return float(np.asarray(item, dtype=np.float64).mean())

    baseline = (value("reward_baseline") if trainer == "reinforce"
                else float(np.mean(batch[Columns.VF_PREDS])))
    return {"loss": value("total_loss"), "policy_loss": value(POLICY_LOSS_KEY), "entropy": value(ENTROPY_KEY),
            "baseline": baseline}


def _tensor_or_none(array: np.ndarray | None) -> torch.Tensor | None:
    return None if array is None else torch.from_numpy(np.ascontiguousarray(array))


def _array_or_none(tensor: torch.Tensor | None) -> np.ndarray | None:
    return None if tensor is None else tensor.numpy().astype(np.int64)
