"""One hierarchical training run: sample groupings and placements, measure them in one call, update
grouper and placer jointly; warm-start imitation; checkpoints. The RLlib Learner is built alone in this
process, as policies/rl/assembly.py does for the seq2seq placer."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from graphs.errors import PlacerError
from measurers.base import Measurement
from policies.base import CounterView
from policies.rl.env import failure_runtime_s, scored_runtime_s, slowest_ok_runtime_s
from policies.rl.hierarchical.config import HierarchicalConfig
from policies.rl.hierarchical.features import GroupBuilder, atom_features
from policies.rl.hierarchical.imitation import start_grouping, target_grouping
from policies.rl.hierarchical.module import (ADVANTAGES, ASSIGN, DEVICES, GROUP_ALLOWED,
                                             GROUP_FEATURES)
from policies.rl.learner_file import check_learner_config, read_learner_state
from policies.rl.loop import memo_from_state, memo_state, measure_unseen, resumed_stall_count, save_state


def build_learner(atoms, num_groups: int, num_devices: int, config: HierarchicalConfig):
    """An RLlib TorchLearner (in this process, no EnvRunners) over the grouper + placer module."""
    import gymnasium as gym

    from policies.rl.assembly import standalone_learner
    from policies.rl.hierarchical.learner import HierarchicalLearner
    from policies.rl.hierarchical.module import HierarchicalModule
    width = config.prior_width if config.prior == "position" else 0.0  # a grouping prior is set afterwards
    model_config = {"atom_features": atoms.features, "atom_quantile": atoms.quantile,
                    "prior_width": width, "num_groups": num_groups, "num_devices": num_devices,
                    "hidden_size": config.hidden_size, "tanh_constant": config.tanh_constant,
                    "temperature": config.temperature}
    spaces = {"observation_space": gym.spaces.Box(-np.inf, np.inf, atoms.features.shape, np.float32),
              "action_space": gym.spaces.MultiDiscrete([num_groups] * atoms.count)}  # nominal: not sampled by RLlib
    return standalone_learner(HierarchicalLearner, HierarchicalModule, model_config, spaces, lr=config.lr,
                              grad_clip=config.grad_clip, seed=config.seed,
                              learner_config={"entropy_coeff": config.effective_entropy_coeff(num_groups)})


class HierarchicalTrainer:
    """State of a run: learner, sampling RNG, counters and the best placement (op level)."""

    def __init__(self, problem, counter, capture, config: HierarchicalConfig):
        from ray.rllib.core import DEFAULT_MODULE_ID
        self.problem, self.config = problem, config
        self.measurer = CounterView(counter, capture)  # in the budget, logged, returning the Measurements
        self.atoms = atom_features(problem)
        self.num_groups = min(int(config.num_groups), self.atoms.count)
        self.builder = GroupBuilder(self.atoms, self.num_groups, by_position=config.decode_order == "position")
        self.learner = build_learner(self.atoms, self.num_groups, problem.num_devices, config)
        self.module = self.learner.module[DEFAULT_MODULE_ID].unwrapped()
        if config.start_method is not None:
            start = start_grouping(problem, self.atoms.position, self.num_groups, config.start_method)
            self.module.set_atom_targets(torch.from_numpy(start), config.move_prob)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.iteration = 0
        self.measurements_used = 0
        self.warm_started = False
        self.warm_start_runtime_s = math.nan  # its step, kept in the checkpoint: a resumed run reports it too
        self.warm_start_note = ""  # what the run says of its warm start, kept in the checkpoint as well
        self.best_runtime_s = math.inf
        self.best_op_placement: np.ndarray | None = None
        self.memo: dict[bytes, Measurement] = {}  # placement_key(op placement) -> its measurement, this run
        self.stalled = 0  # iterations in a row that sampled nothing new
        self.slowest_ok_s = 0.0  # the longest ok step in the memo: it can raise what a failure scores as
        self.learner_s: list[float] = []

    # ---- one iteration ----------------------------------------------------------------------------

    def sample(self, size: int, greedy: bool = False):
        """(B, A) groupings, their placer inputs, (B, G) devices in decode order, (B, N) op placements."""
        with torch.no_grad():
            logits = self.module.group_logits()  # (A, G)
            assign = (logits.argmax(dim=1)[None].repeat(size, 1) if greedy
                      else self.module.grouper.sample(logits, size, self.generator))  # (B, A)
            inputs = self.builder.inputs(assign)
            decoded, _ = self.module.placer.sample(inputs.features, inputs.allowed, generator=self.generator,
                                                   greedy=greedy)  # (B, G)
            atom_device = self.builder.atom_devices(assign, decoded, inputs.order)  # (B, A)
        return assign, inputs, decoded, self.problem.expand(atom_device.numpy())

    def iterate(self, size: int) -> dict[str, float]:
        from policies.rl.reinforce import centered_ranks
        t0 = time.perf_counter()
        assign, inputs, decoded, op_placements = self.sample(size)
        t1 = time.perf_counter()
        measurements, fresh = self._measure_unseen(op_placements)
        t2 = time.perf_counter()
        self.slowest_ok_s = max(self.slowest_ok_s, slowest_ok_runtime_s(measurements))
        failure_s = failure_runtime_s(self.config.penalty_runtime_s, self.slowest_ok_s)
        runtimes = np.array([scored_runtime_s(m, failure_s) for m in measurements])  # (B,)
        ok = np.array([m.ok for m in measurements])
        ok_runtimes = np.where(ok, runtimes, math.inf)  # (B,) a failure ran no step: inf, not the penalty's
        self._track_best(ok_runtimes, op_placements)
        rewards = torch.from_numpy(-np.sqrt(runtimes)).float()  # (B,)
        advantages = centered_ranks(rewards).numpy()
        summary = self._update(assign, inputs, decoded, advantages)
        t3 = time.perf_counter()
        self.iteration += 1
        self.measurements_used += fresh
        self.stalled = 0 if fresh else self.stalled + 1
        self.learner_s.append((t1 - t0) + (t3 - t2))
        return {**summary, "mean_reward": float(rewards.mean()), "batch_best_runtime_s": float(ok_runtimes.min()),
                "best_runtime_s": self.best_runtime_s, "num_failed": float((~ok).sum()),
                "sample_s": t1 - t0, "measure_s": t2 - t1, "update_s": t3 - t2,
                "measurements_used": float(self.measurements_used)}

    def _measure_unseen(self, op_placements: np.ndarray) -> tuple[list[Measurement], int]:
        """One Measurement per row of ``op_placements`` (B, N), measuring (in one call, in the budget) only
        the placements this run has not measured: a repeat costs nothing, as in every other learner
        (policies/rl/loop.py). Returns them and how many were measured."""
        return measure_unseen(self.memo, [placement_key(row) for row in op_placements],
                              lambda rows: self.measurer.measure(list(op_placements[rows])))

    def remember(self, measured) -> None:
        """Warm-start candidates measured before the run (``MeasuredCandidate``s, ok or not) go into the memo."""
        for candidate in measured:
            self.memo[placement_key(candidate.op_placement)] = candidate.measurement
        self.slowest_ok_s = slowest_ok_runtime_s(self.memo.values())

    def _track_best(self, runtimes: np.ndarray, op_placements: np.ndarray) -> None:
        b = int(np.argmin(runtimes))
        if runtimes[b] < self.best_runtime_s:
            self.best_runtime_s, self.best_op_placement = float(runtimes[b]), op_placements[b].copy()

    def _update(self, assign, inputs, decoded, advantages: np.ndarray) -> dict:
        from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY

        from policies.rl.assembly import update_on_batch
        batch = {ASSIGN: assign.numpy(), GROUP_FEATURES: inputs.features.numpy(),
                 GROUP_ALLOWED: inputs.allowed.numpy(), DEVICES: decoded.numpy(),
                 ADVANTAGES: np.asarray(advantages, np.float32)}
        return update_on_batch(self.learner, batch, self.iteration,
                               {"loss": POLICY_LOSS_KEY, "entropy": ENTROPY_KEY, "grouper_logp": "grouper_logp",
                                "placer_logp": "placer_logp"})

    # ---- warm start -------------------------------------------------------------------------------

    def imitate(self, unit_placement: np.ndarray, runtime_s: float, op_placement: np.ndarray) -> float:
        """Start from the warm start: the grouper's per-atom logits set on the target grouping (see
        ``HierarchicalModule.set_atom_targets``: set, not trained), supervised steps on the placer
        towards the target's devices, then local RL (no entropy push). Returns the share of ops the greedy grouping
        + placement puts on the target's device."""
        target = np.asarray(unit_placement, dtype=np.int64)  # (A,)
        assign = torch.from_numpy(target_grouping(self.problem, self.atoms.position, target, self.num_groups))[None]
        inputs = self.builder.inputs(assign)  # (1, G, ...)
        group_device = torch.zeros(self.num_groups, dtype=torch.int64)
        group_device[assign[0]] = torch.from_numpy(target)  # one device per group (see imitation.py)
        decoded = group_device[inputs.order[0]][None]  # (1, G) decode order
        self.module.set_atom_targets(assign[0], self.config.move_prob)
        self._fit_placer(inputs, decoded)
        self.learner.entropy_coeff = self.config.warm_entropy_coeff
        self.warm_started, self.warm_start_runtime_s = True, float(runtime_s)
        if runtime_s < self.best_runtime_s:
            self.best_runtime_s, self.best_op_placement = float(runtime_s), np.asarray(op_placement).copy()
        greedy = self.sample(1, greedy=True)[3][0]
        return float((greedy == np.asarray(op_placement)).mean())

    def _fit_placer(self, inputs, decoded: torch.Tensor) -> None:
        """Supervised steps (a plain Adam of their own at ``imitation_lr``; the RL optimizer is left
        fresh) until the placer's greedy decode of the target grouping gives the target's devices and it
        samples them whole with probability ``warm_placement_prob``, at most ``imitation_steps``."""
        from policies.rl.seq2seq.network import placement_logp
        placer = self.module.placer
        optimizer = torch.optim.Adam(placer.parameters(), lr=self.config.imitation_lr)
        enough = float(np.log(self.config.warm_placement_prob))
        for step in range(self.config.imitation_steps):
            optimizer.zero_grad()
            logp = placement_logp(placer.teacher(inputs.features, inputs.allowed, decoded), decoded).mean()
            if step % 10 == 0 and float(logp.detach()) >= enough:
                with torch.no_grad():
                    greedy, _ = placer.sample(inputs.features, inputs.allowed, greedy=True)
                if torch.equal(greedy, decoded):
                    break
            loss = -logp
            loss.backward()
            torch.nn.utils.clip_grad_norm_(placer.parameters(), self.config.grad_clip * 10)
            optimizer.step()

    # ---- checkpoints ------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        from ray.rllib.core import DEFAULT_MODULE_ID
        optimizers = {name: opt.state_dict() for name, opt in self.learner.get_optimizers_for_module(DEFAULT_MODULE_ID)}
        state = {"config": asdict(self.config), "shape": [self.atoms.count, self.num_groups, self.problem.num_devices],
                 "module": self.module.state_dict(), "optimizers": optimizers,
                 "generator": self.generator.get_state(), "iteration": self.iteration,
                 "measurements_used": self.measurements_used, "best_runtime_s": self.best_runtime_s,
                 "best_op_placement": (None if self.best_op_placement is None
                                       else torch.from_numpy(self.best_op_placement)),
                 "warm_started": self.warm_started, "warm_start_runtime_s": self.warm_start_runtime_s,
                 "warm_start_note": self.warm_start_note,
                 "entropy_coeff": self.learner.entropy_coeff,
                 "stalled": self.stalled, "memo": memo_state(self.memo, self.problem.num_devices)}
        save_state(state, path)

    def load(self, path: Path) -> None:
        from ray.rllib.core import DEFAULT_MODULE_ID
        if not path.is_file():
            raise PlacerError(f"no learner checkpoint at {path}")
        state = read_learner_state(path)
        shape = [self.atoms.count, self.num_groups, self.problem.num_devices]
        if state.get("shape") != shape:
            raise PlacerError(f"checkpoint {path} is for (atoms, groups, devices) {state.get('shape')}, not {shape}")
        check_learner_config(path, state["config"], self.config,
                             ("hidden_size", "temperature", "tanh_constant", "decode_order", "prior"))
        self.module.load_state_dict(state["module"])
        for name, opt in self.learner.get_optimizers_for_module(DEFAULT_MODULE_ID):
            opt.load_state_dict(state["optimizers"][name])
        self.generator.set_state(state["generator"])
        self.iteration, self.measurements_used = int(state["iteration"]), int(state["measurements_used"])
        self.best_runtime_s = float(state["best_runtime_s"])
        best = state["best_op_placement"]
        self.best_op_placement = None if best is None else best.numpy().astype(np.int64)
        self.warm_started = bool(state["warm_started"])
        self.warm_start_runtime_s = float(state.get("warm_start_runtime_s", math.nan))  # older: not kept
        self.warm_start_note = str(state.get("warm_start_note", ""))  # older: not kept (no note on resume)
        self.learner.entropy_coeff = float(state["entropy_coeff"])
        self.stalled = resumed_stall_count(state)
        self.memo = memo_from_state(state.get("memo"))  # a checkpoint older than the memo: an empty one
        self.slowest_ok_s = slowest_ok_runtime_s(self.memo.values())


def placement_key(op_placement: np.ndarray) -> bytes:
    """A 16-byte digest of an (N,) op placement: the planner's groupings change, so its memo is keyed by
    what was measured, and a digest keeps a checkpoint's memo small on graphs of 30,000 ops."""
    return hashlib.blake2b(np.ascontiguousarray(op_placement, dtype=np.int64).tobytes(), digest_size=16).digest()
