"""Train a placer over fixed groups (the seq2seq module, or Post's factorized one) with REINFORCE or PPO,
a whole batch of placements per measurement call.

A warm-started run first imitates its start (``_Trainer.imitate``: teacher-forced cross-entropy with its own
Adam) and begins with that start as its best. Then one iteration per batch (an RLlib Learner built alone,
in this process; no EnvRunners)::

    sample B placements with the module's exploration pass   (seeded torch.Generator)
    measure all B with ONE measurer.measure call             (the pool measures them in parallel)
    rewards = -sqrt(runtime_s), failures as the penalty runtime
    learner.update(batch)                                    (REINFORCE + moving-average baseline, or PPO)
    Post only (ce_every > 0): fit the policy to the elite placements of the last batches (imitate again)

PPO gets its advantages in the batch: a placement is a one-step episode, so GAE reduces to
``reward - V(obs)`` (standardized over the batch, as RLlib's GAE connector does) and the value target is
the reward. Passing a ready batch to ``Learner.update`` skips the learner connector, so nothing recomputes
them. Example::

    result = train_placer(graph, machine, grouping, measurer, budget_measurements=2000,
                          config=RLConfig(trainer="reinforce", batch_size=16, seed=0))
    result.best_runtime_s, result.best_group_placement

The settings are ``RLConfig`` (policies/rl/config.py); the RLlib Learner is assembled in
policies/rl/assembly.py.
"""

from __future__ import annotations

import io
import math
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from graphs.errors import PlacerError
from graphs.files import atomic_file
from measurers.base import Measurement
from policies.base import early_stop
from policies.rl.assembly import build_learner, summarize_update
from policies.rl.config import RLConfig
from policies.rl.env import PlacementEnv, scored_runtime_s
from policies.rl.learner_file import CHECKPOINT_FILE, check_learner_config, read_learner_state

STALL_ITERATIONS = 50  # iterations in a row that sample only placements measured before: the run has converged
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
    seconds_per_update: float  # mean learner cost per iteration: sampling + update, measurement excluded; nan: none
    seconds_per_measure_call: float  # mean wall time of the batch measure calls this session
    greedy_group_placement: np.ndarray  # (G,) int64: the trained policy's most likely placement
    stop_reason: str  # "budget" | "time_limit" | "should_stop" | "converged" (STALL_ITERATIONS)
    history: list[IterationMetrics] = field(default_factory=list)
    warm_start_runtime_s: float = math.nan  # the warm start's step (a resumed run's from its checkpoint); nan: none
    warm_start_note: str = ""  # what the run says of its warm start (a resumed run's from its checkpoint)


def learner_time_note(seconds_per_update: float) -> str:
    """"0.098 s learner time per iteration", or what a session that ran none says (a resume the time limit
    stopped at once read "0.000 s")."""
    if not math.isfinite(seconds_per_update):
        return "no iteration timed this session"
    return f"{seconds_per_update:.3f} s learner time per iteration"


OnBatch = Callable[[int, np.ndarray, np.ndarray, Sequence[Measurement], np.ndarray], None]
OnIteration = Callable[[IterationMetrics], None]


def train_placer(graph, machine, grouping, measurer, *, budget_measurements: int, time_limit_s: float | None = None,
                 config: RLConfig | None = None, on_batch: OnBatch | None = None,
                 on_iteration: OnIteration | None = None, checkpoint_dir: str | os.PathLike | None = None,
                 resume_from: str | os.PathLike | None = None, should_stop: Callable[[], bool] | None = None,
                 features: np.ndarray | None = None,
                 before_checkpoint: Callable[[], None] | None = None, warm_start=None,
                 measurements_before: int = 0, known: Sequence[tuple[np.ndarray, Measurement]] = (),
                 warm_started: bool = False) -> TrainResult:
    """Search placements of ``graph``'s groups on ``machine`` until the measurement budget is spent.

    ``budget_measurements`` counts every measurement of the run, those before a resume included; the
    last batch is cut to what is left. A placement sampled again in this session is not measured again
    and costs nothing (the searches' accounting); after ``STALL_ITERATIONS`` batches with nothing new the
    run stops as "converged". ``time_limit_s`` and ``should_stop`` are checked between batches;
    ``before_checkpoint()`` is called before every checkpoint is saved.
    ``on_batch(iteration, group_placements (B, G), op_placements (B, N), measurements, rewards (B,))``
    sees every sampled batch (a repeat with its earlier measurement); ``on_iteration(IterationMetrics)``
    every update. ``features`` overrides
    the (G, F) group feature matrix.

    ``warm_start`` (a ``policies.rl.warm_start.WarmStart``, its ``unit_placement`` in ``grouping``'s group
    order) was measured before the call, as were ``measurements_before`` placements in all: a fresh run
    counts them in its budget, starts its best-so-far at the warm start and imitates it
    (``config.warm_start_steps``) before the first batch; a resumed run does neither (its checkpoint has them).
    ``known`` ((G,) group placement, Measurement) pairs measured before the call (the warm-start candidates,
    ok or not) go into a fresh run's memo. ``warm_started``: a resumed run's config is
    ``RLConfig.for_warm_start`` (what its checkpoint records, where one older than that record does not).
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
            trainer.warm_started = warm_started
            trainer.load(Path(resume_from) / CHECKPOINT_FILE)
        else:
            trainer.measurements_used = int(measurements_before)
            trainer.remember(known)
            if warm_start is not None:
                trainer.start_from(warm_start)
                if checkpoint_dir is not None:  # a resumed run does not imitate again
                    _save(trainer, checkpoint_dir, before_checkpoint)
        stop_reason = "budget"
        while trainer.measurements_used < budget_measurements:
            stopped = early_stop(started, time_limit_s, should_stop)
            if stopped is not None:
                stop_reason = stopped
                break
            if trainer.stalled >= STALL_ITERATIONS:
                stop_reason = "converged"
                break
            size = min(config.batch_size, budget_measurements - trainer.measurements_used)
            metrics = trainer.iterate(size, on_batch)
            if on_iteration is not None:
                on_iteration(metrics)
            if checkpoint_dir is not None and trainer.iteration % config.checkpoint_every == 0:
                _save(trainer, checkpoint_dir, before_checkpoint)
        if checkpoint_dir is not None:
            _save(trainer, checkpoint_dir, before_checkpoint)
        return trainer.result(stop_reason)


def _save(trainer: "_Trainer", checkpoint_dir, before_checkpoint: Callable[[], None] | None) -> None:
    if before_checkpoint is not None:
        before_checkpoint()  # e.g. the run log flushed: a checkpoint never counts rows that are not on disk
    trainer.save(Path(checkpoint_dir) / CHECKPOINT_FILE)


def save_state(state: dict, path: str | os.PathLike) -> None:
    """``torch.save`` of a learner's state to ``path``, through a temporary file renamed over it: an
    interrupted save never leaves half a checkpoint (its folder is made if missing). Serialized in memory
    first and written by Python: torch's own writer turned a full disk into a RuntimeError ("unexpected pos
    293760 vs 293648"), a traceback; now it is the OSError naming ``path`` that every writer gives."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with atomic_file(Path(path)) as tmp:
        try:
            tmp.write_bytes(buffer.getbuffer())
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(path)) from error


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
        self.learner = build_learner(env, config)
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
        self.window: list[tuple[np.ndarray, np.ndarray]] = []  # last ce_window batches: runtimes (B,), actions (B, G)
        self.imitation_steps = 0  # Adam steps of imitation and cross-entropy minimization so far
        self.memo: dict[bytes, Measurement] = {}  # group placement bytes -> its measurement, this session
        self.stalled = 0  # iterations in a row that sampled nothing new
        self.warm_started = False  # imitated a warm start (its config is RLConfig.for_warm_start)
        self.warm_start_runtime_s = math.nan  # its step, kept in the checkpoint: a resumed run reports it too
        self.warm_start_note = ""  # "warm start: candidate K at S s", kept in the checkpoint as well
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
        op_placements, measurements, rewards, fresh = self._measure_unseen(actions)
        t2 = time.perf_counter()
        if on_batch is not None:
            on_batch(self.iteration, actions, op_placements, measurements, rewards)
        runtimes = np.array([scored_runtime_s(m, self.env.failure_runtime_s) if m.ok else math.inf
                             for m in measurements])  # (B,)
        self._track_best(runtimes, actions, op_placements)
        batch = self._train_batch(obs, decoded, rewards, out)
        t3 = time.perf_counter()
        results = self._update(batch, size)
        self._cross_entropy_step(self._elite_costs(measurements), actions)
        t4 = time.perf_counter()
        self.iteration += 1
        self.measurements_used += fresh
        self.stalled = 0 if fresh else self.stalled + 1
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

    def _measure_unseen(self, actions: np.ndarray) -> tuple[np.ndarray, list[Measurement], np.ndarray, int]:
        """Measure the placements (B, G) this run has not measured (``measure_unseen``). Returns op placements
        (B, N), one Measurement per row, rewards (B,) and how many placements were measured."""
        measurements, fresh = measure_unseen(self.memo, [row.tobytes() for row in actions],
                                             lambda rows: self.env.measure_batch(actions[rows])[1])
        op_placements = np.asarray(self.env.grouping.expand(actions), dtype=np.int64)  # (B, N)
        rewards = np.array([self.env.reward_of(m) for m in measurements], dtype=np.float64)
        return op_placements, measurements, rewards, fresh

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

    # ---- warm start and cross-entropy minimization ----------------------------------------------------

    def remember(self, known: Sequence[tuple[np.ndarray, Measurement]]) -> None:
        """((G,) group placement, Measurement) pairs measured before the run: sampled again, they cost nothing."""
        for placement, measurement in known:
            self.memo[np.ascontiguousarray(placement, dtype=np.int64).tobytes()] = measurement
        self.env.observe(measurement for _, measurement in known)

    def start_from(self, warm) -> None:
        """Best-so-far = the warm start's measurement (a warm-started run never reports worse), then imitate it."""
        self.warm_started = True
        self.warm_start_runtime_s = float(warm.runtime_s)
        self.warm_start_note = warm.note
        if warm.runtime_s < self.best_runtime_s:
            self.best_runtime_s = float(warm.runtime_s)
            self.best_group_placement = np.asarray(warm.unit_placement, dtype=np.int64).copy()
            self.best_op_placement = np.asarray(warm.op_placement, dtype=np.int64).copy()
        self.imitate(np.asarray(warm.unit_placement, dtype=np.int64)[None], self.config.warm_start_steps,
                     stop_prob=self.config.imitation_target_prob)

    def imitate(self, unit_placements: np.ndarray, steps: int, stop_prob: float | None = None) -> int:
        """Fit the policy to ``unit_placements`` (K, G) (group index order): Adam steps on the
        teacher-forced cross-entropy -mean log pi(target) / G. With ``stop_prob``, stop once the greedy
        placement is the first target and its mean per-group probability reaches ``stop_prob``.

        Its own Adam optimizer, fresh per call, at ``config.imitation_lr``: the learner's optimizer keeps
        the moment estimates the policy gradient made (imitation gradients are far larger and would
        scale its steps down for many iterations), and a fresh optimizer leaves nothing to checkpoint.
        Returns the steps taken.
        """
        from ray.rllib.core.columns import Columns
        targets = np.asarray(unit_placements, dtype=np.int64)[:, self.order]  # (K, G) decoder order
        obs = torch.from_numpy(np.repeat(self.obs[None], len(targets), axis=0))  # (K, G, F + D)
        actions = torch.from_numpy(targets)
        params = [p for p in self.module.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=self.config.imitation_lr)
        dist_cls = self.module.get_train_action_dist_cls()
        for step in range(steps):
            flat = self.module.forward_train({Columns.OBS: obs, Columns.ACTIONS: actions})[Columns.ACTION_DIST_INPUTS]
            if stop_prob is not None and self._imitated(flat, targets, stop_prob):
                return step
            loss = -dist_cls.from_logits(flat).logp(actions).mean() / self.env.num_groups
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            self.imitation_steps += 1
        return steps

    def _imitated(self, flat: torch.Tensor, targets: np.ndarray, stop_prob: float) -> bool:
        """Is the first target's mean per-group probability >= stop_prob and the greedy placement it?"""
        from ray.rllib.core.columns import Columns
        with torch.no_grad():
            probs = torch.softmax(flat[0].view(self.env.num_groups, -1), dim=-1)  # (G, D)
            mean_prob = float(probs[torch.arange(len(targets[0])), torch.from_numpy(targets[0])].mean())
            if mean_prob < stop_prob:
                return False
            greedy = self.module.forward_inference({Columns.OBS: torch.from_numpy(self.obs[None])})[Columns.ACTIONS]
        return bool(np.array_equal(greedy[0].numpy(), targets[0]))

    def _elite_costs(self, measurements: Sequence[Measurement]) -> np.ndarray:
        """(B,) what the cross-entropy step ranks by: ``policies.base.measurement_cost_s`` (the runtime when
        ok; a failure by how far it overflows memory, so elites walk out of out-of-memory regions as the
        searches do); inf for a placement rejected before measuring."""
        from policies.base import measurement_cost_s
        capacity = np.array([d.memory_bytes for d in self.env.machine.devices], dtype=np.float64)  # (D,)
        return np.array([measurement_cost_s(m, capacity) if m.ok or len(m.peak_bytes) == len(capacity)
                         and any(m.peak_bytes) else math.inf for m in measurements])

    def _cross_entropy_step(self, runtimes: np.ndarray, actions: np.ndarray) -> None:
        """Post's step: every ``ce_every`` iterations fit the policy to the elites of the last ``ce_window``
        batches (their best ``elite_fraction`` by cost, see ``_elite_costs``) and the best placement so far."""
        every = self.config.ce_every
        if every <= 0:
            return
        self.window = (self.window + [(runtimes.copy(), actions.copy())])[-self.config.ce_window:]
        if (self.iteration + 1) % every:
            return
        window_runtimes = np.concatenate([r for r, _ in self.window])  # (W,)
        window_actions = np.concatenate([a for _, a in self.window])  # (W, G)
        ok = np.flatnonzero(np.isfinite(window_runtimes))
        count = int(np.ceil(self.config.elite_fraction * len(window_runtimes)))
        elite = ok[np.argsort(window_runtimes[ok], kind="stable")][:count]
        targets = [window_actions[i] for i in elite]
        if self.best_group_placement is not None:
            targets.insert(0, self.best_group_placement)
        if targets:
            self.imitate(np.stack(targets), self.config.ce_steps)

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
        with warnings.catch_warnings():  # a batch of one (a budget's last placement): RLlib's explained variance
            warnings.filterwarnings("ignore", message=r"var\(\): degrees of freedom is <= 0")  # takes var() of it
            results = self.learner.update(batch=train_batch,
                                          timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self.iteration + 1}, **kwargs)
        summary = summarize_update(results, DEFAULT_MODULE_ID, self.config.trainer, batch)
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
            seconds_per_update=float(np.mean(self._learner_s)) if self._learner_s else math.nan,  # none timed
            seconds_per_measure_call=float(np.mean(self._measure_s)) if self._measure_s else 0.0,
            greedy_group_placement=greedy,
            stop_reason=stop_reason, history=self.history, warm_start_runtime_s=self.warm_start_runtime_s,
            warm_start_note=self.warm_start_note)

    # ---- checkpoints ------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Weights, optimizer, baseline, sampling RNG, counters and best placement, written atomically."""
        optimizers = {name: opt.state_dict() for name, opt in self._optimizers()}
        state = {
            "config": asdict(self.config), "shape": list(self.env.allowed.shape),
            "module": self.module.state_dict(), "optimizers": optimizers,
            "reward_baseline": getattr(self.learner, "reward_baseline", None),
            "generator": self.generator.get_state(), "iteration": self.iteration,
            "measurements_used": self.measurements_used, "best_runtime_s": self.best_runtime_s,
            "best_group_placement": _tensor_or_none(self.best_group_placement),
            "best_op_placement": _tensor_or_none(self.best_op_placement),
            "window": [(torch.from_numpy(r), torch.from_numpy(a)) for r, a in self.window],
            "imitation_steps": self.imitation_steps, "stalled": self.stalled, "warm_started": self.warm_started,
            "warm_start_runtime_s": self.warm_start_runtime_s, "warm_start_note": self.warm_start_note,
            "memo": memo_state(self.memo, self.env.num_devices),
        }
        save_state(state, path)

    def _optimizers(self) -> list:
        from ray.rllib.core import DEFAULT_MODULE_ID
        return list(self.learner.get_optimizers_for_module(DEFAULT_MODULE_ID))

    def load(self, path: Path) -> None:
        if not path.is_file():
            raise PlacerError(f"no learner checkpoint at {path}")
        state = read_learner_state(path)
        if state.get("shape") != list(self.env.allowed.shape):
            raise PlacerError(f"checkpoint {path} is not for this run's {self.env.num_groups} groups on "
                              f"{self.env.num_devices} devices (its shape: {state.get('shape')})")
        check_learner_config(path, state["config"], self.config,
                             ("trainer", "hidden_size", "temperature", "tanh_constant", "decode_order", "module"),
                             defaults={"decode_order": "group", "module": "seq2seq"})  # older checkpoints'
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
        self.memo = memo_from_state(state.get("memo"))  # a resumed run does not measure its repeats either
        self.env.observe(self.memo.values())
        self.window = [(r.numpy().copy(), a.numpy().astype(np.int64)) for r, a in state.get("window", [])]
        self.imitation_steps = int(state.get("imitation_steps", 0))
        self.stalled = resumed_stall_count(state)
        self.warm_started = bool(state.get("warm_started", self.warm_started))  # older: as the caller says
        self.warm_start_runtime_s = float(state.get("warm_start_runtime_s", math.nan))  # older: not kept
        self.warm_start_note = str(state.get("warm_start_note", ""))  # older: not kept (no note on resume)


def measure_unseen(memo: dict[bytes, Measurement], keys: Sequence[bytes],
                   measure: Callable[[list[int]], Sequence[Measurement]]) -> tuple[list[Measurement], int]:
    """One Measurement per key (one per sampled placement), measuring only the placements ``memo`` does not
    hold: ``measure(rows)`` gets the batch rows of the unseen keys (each key's first row, batch order) and
    measures them in one call; their results go into ``memo``. A repeat reuses its measurement and spends no
    budget, as the searches' ``MemoMeasurer`` does (the same budget accounting for every method; a
    converged policy samples its favourite placement again and again). Returns them and how many were
    measured."""
    unseen = list(dict.fromkeys(key for key in keys if key not in memo))
    if unseen:
        first_row = {key: row for row, key in reversed(list(enumerate(keys)))}
        memo.update(zip(unseen, measure([first_row[key] for key in unseen])))
    return [memo[key] for key in keys], len(unseen)


def resumed_stall_count(state: dict) -> int:
    """The stall count a resumed run goes on from: where it stopped (a run stopped mid-stall converges where
    one run would), but 0 for a run that had converged: resumed with a larger budget, it samples again."""
    stalled = int(state.get("stalled", 0))
    return 0 if stalled >= STALL_ITERATIONS else stalled


def resumed_warm_started(checkpoint_dir: str | os.PathLike, given: bool) -> bool:
    """Did the run that wrote ``checkpoint_dir`` imitate a warm start? A checkpoint older than that record
    answers ``given`` (whether the run was given warm-start candidates)."""
    return bool(read_learner_state(Path(checkpoint_dir) / CHECKPOINT_FILE).get("warm_started", given))


def _decode_order(env: PlacementEnv, order: str) -> np.ndarray:
    """(G,) int64: the group the decoder places at each step."""
    if order == "group" or env.graph is None or not hasattr(env.grouping, "op_group"):
        return np.arange(env.num_groups, dtype=np.int64)
    from graphs.features import forward_position
    position = forward_position(env.graph, np.asarray(env.grouping.op_group), env.num_groups)  # (G,)
    return np.argsort(position, kind="stable").astype(np.int64)


def memo_state(memo: dict[bytes, Measurement], num_devices: int) -> dict:
    """A learner's memo (keys of one length, a multiple of 8 bytes: (G,) int64 group placements here) as
    tensors, so a checkpoint loads with weights_only: keys (K, W) int64, runtimes (K,), statuses, peak
    bytes (K, D). Samples, timings and error texts are not kept. A measurement without peaks (a pool's
    timeout, crash or error) keeps a row of -1."""
    keys = list(memo)
    values = [memo[key] for key in keys]
    width = len(keys[0]) // 8 if keys else 0
    placements = np.frombuffer(b"".join(keys), dtype=np.int64).reshape(len(keys), width)
    return {"placements": torch.from_numpy(placements.copy()),
            "runtime_s": torch.tensor([m.runtime_s for m in values], dtype=torch.float64),
            "status": [m.status for m in values],
            "peak_bytes": torch.tensor([list(m.peak_bytes) or [-1] * num_devices for m in values],
                                       dtype=torch.int64).reshape(len(values), num_devices)}


def memo_from_state(state: dict | None) -> dict[bytes, Measurement]:
    if state is None:  # a checkpoint older than the memo
        return {}
    memo = {}
    for placement, runtime_s, status, peak in zip(state["placements"].numpy(), state["runtime_s"].tolist(),
                                                  state["status"], state["peak_bytes"].tolist()):
        memo[np.ascontiguousarray(placement, dtype=np.int64).tobytes()] = Measurement(
            runtime_s, (runtime_s,), status, () if peak and min(peak) < 0 else tuple(peak), 0.0)
    return memo


def _tensor_or_none(array: np.ndarray | None) -> torch.Tensor | None:
    return None if array is None else torch.from_numpy(np.ascontiguousarray(array))


def _array_or_none(tensor: torch.Tensor | None) -> np.ndarray | None:
    return None if tensor is None else tensor.numpy().astype(np.int64)
