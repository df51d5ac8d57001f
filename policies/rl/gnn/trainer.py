"""Training the graph-neural placers: on one problem (`placer search --policy gdp|placeto`) or round-robin
over a family of problems (`placer train`); one RLlib Learner (in this process, no EnvRunners) either way.

GDP, one update per batch::

    logits (G, D) = net(graph); B placements drawn, each group independently; measured in ONE call
    advantages = centered ranks of -sqrt(runtime) in the batch; learner.update

Placeto, one update per batch of B episodes run side by side from the same start::

    for each group t in the visiting order: draw its device in every episode given the placement so
    far; measure the B placements (one call; an unchanged placement is not measured again)
    reward of a step = (step time before - step time after) / step time at the start
    advantages = return-to-go minus its mean over the episodes; learner.update

GiPH (policies/rl/gnn/giph.py), one update per batch of B episodes of relocation moves from the same start
(training: a random placement or the fastest single device, ``Slot.fastest_device_start``), discounted
improvement rewards.

``greedy`` placements (the most likely device per group; Placeto: ``greedy_passes`` greedy passes, no
measurement in between; GiPH: the most likely move ``episode_steps`` times) are the zero-shot answer: one
forward pass, one measurement.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from graphs.errors import PlacerError
from policies.base import FAILED_COST_S
from policies.rl.gnn.config import GnnConfig
from policies.rl.gnn.module import ACTIONS, ADVANTAGES, GRAPH_KEYS, STATE, TARGETS
from policies.rl.gnn.network import placement_state
from policies.rl.gnn.problems import Slot, step_improvements, visit_order


@dataclass
class UpdateMetrics:
    iteration: int
    problem: str  # graph on machine
    measurements_used: int  # total over every problem so far
    batch_best_runtime_s: float  # inf when nothing ran ok
    mean_scored_runtime_s: float
    loss: float
    entropy: float
    sample_s: float
    measure_s: float
    update_s: float


def build_learner(config: GnnConfig):
    import gymnasium as gym

    from policies.rl.assembly import standalone_learner
    from policies.rl.gnn.learner import GnnLearner
    from policies.rl.gnn.module import GnnModule
    spaces = {"observation_space": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
              "action_space": gym.spaces.Discrete(2)}  # nominal: the module reads its own batch keys
    return standalone_learner(GnnLearner, GnnModule, config.architecture, spaces, lr=config.lr,
                              grad_clip=config.grad_clip, seed=config.seed,
                              learner_config={"entropy_coeff": config.entropy_coeff})


class GnnTrainer:
    """Learner, sampling generator and counters of a run over one or more problems."""

    def __init__(self, config: GnnConfig):
        from ray.rllib.core import DEFAULT_MODULE_ID
        self.config = config
        self.learner = build_learner(config)
        self.net = self.learner.module[DEFAULT_MODULE_ID].unwrapped().net
        self.generator = torch.Generator().manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        self.iteration = 0
        self.learner_s: list[float] = []
        self.stalled = 0  # updates in a row that measured nothing new (counted by the search's fine-tuning loop)

    # ---- zero shot ------------------------------------------------------------------------------

    def greedy(self, slot: Slot, start: np.ndarray | None = None) -> np.ndarray:
        """(G,) the policy's most likely placement (Placeto: ``greedy_passes`` greedy passes from ``start``)."""
        with torch.no_grad():
            if self.config.kind == "gdp":
                return self.net(slot.tensors).argmax(dim=1).numpy().astype(np.int64)
            placement = slot.fastest_device_start() if start is None else start
            if self.config.kind == "giph":
                return self.giph_rollout(slot, placement, measure=False)
            for _ in range(self.config.greedy_passes):
                placement = self._episode(slot, placement, 1, greedy=True)[0][0]
            return placement

    # ---- one update -----------------------------------------------------------------------------

    def iterate(self, slot: Slot, start: np.ndarray | None = None, name: str = "") -> UpdateMetrics | None:
        """One batch on ``slot`` and one update; None when its budget left nothing to learn from."""
        t0 = time.perf_counter()
        if self.config.kind == "gdp":
            batch, runtimes, measure_s = self._gdp_batch(slot)
        elif self.config.kind == "giph":
            from policies.rl.gnn.giph import giph_batch, random_placement
            if start is None:
                start = (random_placement(slot, self.rng) if self.rng.random() < self.config.random_start
                         else slot.fastest_device_start())
            batch, runtimes, measure_s = giph_batch(self.net, slot, start, self.config.batch_size,
                                                    self.config.episode_steps, self.config.discount, self.generator)
        else:
            start = slot.fastest_device_start() if start is None else start
            batch, runtimes, measure_s = self._placeto_batch(slot, start)
        if batch is None:
            return None
        t1 = time.perf_counter()
        summary = self._update(slot, batch)
        t2 = time.perf_counter()
        self.iteration += 1
        self.learner_s.append(t2 - t0 - measure_s)
        ok = runtimes[np.isfinite(runtimes) & (runtimes < FAILED_COST_S)]
        return UpdateMetrics(self.iteration - 1, name, slot.counter.used, float(ok.min()) if len(ok) else np.inf,
                             float(slot.scored(runtimes).mean()), summary["loss"], summary["entropy"],
                             t1 - t0 - measure_s, measure_s, t2 - t1)

    def giph_rollout(self, slot: Slot, start: np.ndarray, measure: bool = True) -> np.ndarray:
        """(G,) GiPH's placement after ``episode_steps`` greedy moves from ``start``; ``measure``: each
        placement on the way is measured (in the budget; the slot keeps the best)."""
        from policies.rl.gnn.giph import run_episodes
        return run_episodes(self.net, slot, start, 1, self.config.episode_steps, self.generator, greedy=True,
                            measure=measure).final[0]

    def _gdp_batch(self, slot: Slot):
        size = min(self.config.batch_size, max(slot.counter.left, 0))
        if size < 2:
            return None, None, 0.0
        with torch.no_grad():
            probs = torch.softmax(self.net(slot.tensors), dim=-1)  # (G, D)
        actions = torch.multinomial(probs, size, replacement=True, generator=self.generator).T.numpy()  # (B, G)
        t = time.perf_counter()
        runtimes = slot.measure(actions)  # (B,)
        measure_s = time.perf_counter() - t
        from policies.rl.reinforce import centered_ranks
        advantages = centered_ranks(torch.from_numpy(-np.sqrt(slot.scored(runtimes)))).numpy()
        return {ACTIONS: actions, ADVANTAGES: advantages.astype(np.float32)}, runtimes, measure_s

    def _placeto_batch(self, slot: Slot, start: np.ndarray):
        size = min(self.config.batch_size, max(slot.counter.left, 0))
        if size < 2:
            return None, None, 0.0
        t = time.perf_counter()
        start_runtime = slot.measure(start[None])  # (1,) once per problem: the memo has it after
        start_measure_s = time.perf_counter() - t
        _, targets, actions, states, runtimes, measure_s = self._episode(slot, start, size)
        if targets.shape[1] == 0:
            return None, None, 0.0
        start_s = slot.scored(start_runtime)[0]  # scored after the episode: the failure score may have grown
        scored = slot.scored(runtimes)  # (B, S)
        rewards = step_improvements(start_s, scored)  # (B, S)
        returns = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
        advantages = returns - returns.mean(axis=0, keepdims=True)
        batch = {TARGETS: targets, ACTIONS: actions, STATE: states, ADVANTAGES: advantages.astype(np.float32)}
        return batch, runtimes[:, -1], measure_s + start_measure_s

    def _episode(self, slot: Slot, start: np.ndarray, size: int, greedy: bool = False):
        """Run ``size`` episodes from ``start``: (B, G) final placements, (B, S) targets, actions, (B, S, D, F)
        states, (B, S) runtimes after each step (none measured when greedy) and the seconds spent measuring.
        Stops early, before a step whose ``size`` placements the budget left cannot all measure."""
        order = visit_order(slot, self.config.order, self.rng)
        placements = torch.from_numpy(np.repeat(start[None], size, axis=0))  # (B, G)
        targets, actions, states, runtimes, measure_s = [], [], [], [], 0.0
        with torch.no_grad():
            groups, devices = self.net.embed(slot.tensors)
            for target in order:
                if not greedy and slot.counter.left < size:
                    break
                target_b = torch.full((size,), int(target), dtype=torch.int64)
                state = placement_state(placements, target_b, slot.adjacency, slot.work, slot.total_work_s)  # (B, D, F)
                logits = self.net.step_logits(groups, devices, slot.tensors, target_b, state)  # (B, D)
                choice = (logits.argmax(dim=1) if greedy else
                          torch.multinomial(torch.softmax(logits, dim=1), 1, generator=self.generator)[:, 0])
                placements[:, target] = choice
                targets.append(target_b)
                actions.append(choice)
                states.append(state)
                if not greedy:
                    t = time.perf_counter()
                    runtimes.append(slot.measure(placements.numpy()))
                    measure_s += time.perf_counter() - t
        final = placements.numpy().astype(np.int64)
        if not targets:
            empty = np.zeros((size, 0), dtype=np.int64)
            return final, empty, empty, np.zeros((size, 0, slot.problem.num_devices, 3)), np.zeros((size, 0)), measure_s
        return (final, torch.stack(targets, 1).numpy(), torch.stack(actions, 1).numpy(),
                torch.stack(states, 1).numpy(), np.stack(runtimes, 1) if runtimes else np.zeros((size, 0)),
                measure_s)

    def _update(self, slot: Slot, batch: dict[str, np.ndarray]) -> dict[str, float]:
        from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY

        from policies.rl.assembly import update_on_batch
        size = len(batch[ADVANTAGES])
        graph = {key: np.repeat(slot.tensors[key].numpy()[None], size, axis=0) for key in GRAPH_KEYS}
        return update_on_batch(self.learner, {**graph, **batch}, self.iteration,
                               {"loss": POLICY_LOSS_KEY, "entropy": ENTROPY_KEY})

    # ---- warm start -----------------------------------------------------------------------------

    def imitate(self, slots: list[Slot], targets: list[np.ndarray], steps: int) -> float:
        """Fit the policy to the placements ``targets`` (one (G,) per slot) with ``steps`` Adam steps of
        their own (the RL optimizer's moments are left alone), visiting the slots in reshuffled rounds;
        returns the mean cross-entropy of the last round (partial when ``steps`` is no multiple of the slots).
        GiPH learns from rewards only."""
        if self.config.kind == "giph":
            raise PlacerError("giph learns from rewards only: it has no imitation of a teacher (--teacher-budget) "
                              "and starts its episodes at a warm start instead")
        optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config.lr * 3)
        order: list[int] = []
        losses: list[float] = []
        for _ in range(steps):
            if not order:
                order, losses = list(self.rng.permutation(len(slots))), []
            k = int(order.pop())
            optimizer.zero_grad()
            loss = self._imitation_loss(slots[k], np.asarray(targets[k], dtype=np.int64))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.config.grad_clip * 10)
            optimizer.step()
            losses.append(float(loss.detach()))
        return float(np.mean(losses)) if losses else float("nan")

    def _imitation_loss(self, slot: Slot, target: np.ndarray) -> torch.Tensor:
        """GDP: cross-entropy of each group's distribution against its target device. Placeto: of each
        step of a teacher-forced episode (from ``Slot.fastest_device_start``, groups set to their targets in
        the visiting order) against the step's target device. Both weighted by ``Slot.work_weight``."""
        wanted = torch.from_numpy(target)
        weight = torch.from_numpy(slot.work_weight).float()  # (G,)
        if self.config.kind == "gdp":
            loss = torch.nn.functional.cross_entropy(self.net(slot.tensors), wanted, reduction="none")
            return (loss * weight).sum() / weight.sum()
        order = visit_order(slot, self.config.order, self.rng)  # (S,) = (G,)
        before = np.repeat(slot.fastest_device_start()[None], len(order), axis=0)  # (S, G) placement before step s
        done = np.tril(np.ones((len(order), len(order)), dtype=bool), -1)  # step s has placed order[:s]
        rows, cols = np.nonzero(done)
        before[rows, order[cols]] = target[order[cols]]
        steps = torch.from_numpy(order)
        groups, devices = self.net.embed(slot.tensors)
        state = placement_state(torch.from_numpy(before), steps, slot.adjacency, slot.work, slot.total_work_s)
        logits = self.net.step_logits(groups, devices, slot.tensors, steps, state)  # (S, D)
        loss = torch.nn.functional.cross_entropy(logits, wanted[steps], reduction="none")
        return (loss * weight[steps]).sum() / weight.sum()

    # ---- state ----------------------------------------------------------------------------------

    def state(self) -> dict:
        from ray.rllib.core import DEFAULT_MODULE_ID
        optimizers = {name: opt.state_dict() for name, opt in self.learner.get_optimizers_for_module(DEFAULT_MODULE_ID)}
        return {"config": asdict(self.config), "net": self.net.state_dict(), "optimizers": optimizers,
                "generator": self.generator.get_state(), "rng": self.rng.bit_generator.state,
                "iteration": self.iteration, "stalled": self.stalled}

    def load_state(self, state: dict, weights_only: bool = False) -> None:
        """Restore a run (or, ``weights_only``, just the network: fine-tuning starts a fresh optimizer)."""
        self.net.load_state_dict(state["net"])
        if weights_only:
            return
        from ray.rllib.core import DEFAULT_MODULE_ID
        for name, opt in self.learner.get_optimizers_for_module(DEFAULT_MODULE_ID):
            opt.load_state_dict(state["optimizers"][name])
        self.generator.set_state(state["generator"])
        self.rng.bit_generator.state = state["rng"]
        self.iteration = int(state["iteration"])
        self.stalled = int(state.get("stalled", 0))  # older learner.pt: 0, as every resume counted before
