"""Training HSDAG on one problem: one update per batch of B samples, all measured in one call::

    B parses and devices drawn (parser.draw); unit placements repaired to allowed devices
    runtimes = Slot.measure(placements)        a placement measured before costs nothing (the memo)
    advantages: centered ranks of -runtime in the batch ('rank'), or -runtime / the first batch's mean
        runtime minus a moving-average baseline ('baseline', the paper's REINFORCE)
    loss = -mean_b(advantage_b * log pi_T(sample_b)) - entropy_coeff * entropy;  Adam, gradient clipping

Sampling and scoring run at a temperature T (parser): 1 at first; ``heat`` multiplies it by
``stall_temperature_growth`` (capped at ``max_temperature``) when the run has stalled, so a policy that
settled keeps spending the budget on placements near its mode instead of redrawing it.

Plain torch (no RLlib): a sample's action is a parse with a varying number of groups, which none of the
RLlib modules here describe.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from policies.base import FAILED_COST_S
from policies.rl.gnn.hsdag.config import HsdagConfig
from policies.rl.gnn.hsdag.parser import HsdagNet, ParseEdges, Sample, draw, log_prob, parse_of
from policies.rl.gnn.problems import Slot
from policies.rl.reinforce import centered_ranks


@dataclass
class HsdagMetrics:
    iteration: int
    measurements_used: int
    batch_best_runtime_s: float  # inf when nothing ran ok
    mean_scored_runtime_s: float
    mean_groups: float  # groups per sample in the batch: what the parser chose
    new_placements: int  # placements of the batch not measured before
    temperature: float  # the temperature the batch was drawn at
    loss: float
    entropy: float
    sample_s: float
    measure_s: float
    update_s: float


class HsdagTrainer:
    """Network, optimizer, sampling generator and the REINFORCE baseline of a run."""

    def __init__(self, config: HsdagConfig, net: HsdagNet | None = None):
        self.config = config
        self.net = net if net is not None else HsdagNet(config.hidden_size, config.num_layers)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=config.lr)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.iteration = 0
        self.baseline: float | None = None  # 'baseline' advantages: moving average of the rewards
        self.reward_scale_s: float | None = None  # the first batch's mean scored runtime
        self.learner_s: list[float] = []
        self.temperature = 1.0  # sampling temperature: raised by heat when the run stalls
        self.stalled = 0  # updates in a row that measured nothing new (counted by the policy's loop)

    def heat(self) -> bool:
        """Raise the sampling temperature one step; False when it cannot rise (at its cap, or growth 1)."""
        raised = min(self.temperature * self.config.stall_temperature_growth, self.config.max_temperature)
        if raised <= self.temperature:
            return False
        self.temperature = raised
        return True

    def greedy(self, slot: Slot, edges: ParseEdges) -> np.ndarray:
        """(G,) the most likely parse's placement, repaired to allowed devices."""
        sample = draw(self.net, slot.tensors, edges, 1, None, greedy=True)
        return slot.problem.repair_allowed(sample.unit_device[0])

    def iterate(self, slot: Slot, edges: ParseEdges) -> HsdagMetrics | None:
        """One batch and one update; None when the budget left is under two placements."""
        size = min(self.config.batch_size, max(slot.counter.left, 0))
        if size < 2:
            return None
        t0, temperature, used = time.perf_counter(), self.temperature, slot.counter.used
        sample = draw(self.net, slot.tensors, edges, size, self.generator, temperature=temperature)
        placements = np.stack([slot.problem.repair_allowed(row) for row in sample.unit_device])  # (B, G)
        t1 = time.perf_counter()
        runtimes = slot.measure(placements)  # (B,)
        t2 = time.perf_counter()
        scored = slot.scored(runtimes)  # (B,)
        loss, entropy = self._update(slot, edges, sample, self._advantages(scored), temperature)
        t3 = time.perf_counter()
        new = slot.counter.used - used
        self.iteration += 1
        self.learner_s.append((t1 - t0) + (t3 - t2))
        ok = runtimes[runtimes < FAILED_COST_S]
        return HsdagMetrics(self.iteration - 1, slot.counter.used, float(ok.min()) if len(ok) else np.inf,
                            float(scored.mean()), float(sample.num_groups.mean()), new, temperature, loss,
                            entropy, t1 - t0, t2 - t1, t3 - t2)

    def _advantages(self, scored: np.ndarray) -> torch.Tensor:
        """(B,) advantages of the batch's scored runtimes (see the module docstring)."""
        if self.config.advantage == "rank":
            return centered_ranks(torch.from_numpy(-scored)).float()
        if self.reward_scale_s is None:
            self.reward_scale_s = float(scored.mean())
        rewards = -scored / self.reward_scale_s  # (B,)
        baseline = float(rewards.mean()) if self.baseline is None else self.baseline
        decay = self.config.baseline_decay
        self.baseline = float(rewards.mean()) if self.baseline is None else (
            decay * self.baseline + (1.0 - decay) * float(rewards.mean()))
        return torch.from_numpy(rewards - baseline).float()

    def _update(self, slot: Slot, edges: ParseEdges, sample: Sample, advantages: torch.Tensor,
                temperature: float) -> tuple[float, float]:
        logp, entropy = log_prob(self.net, slot.tensors, edges, sample, temperature)  # (B,), ()
        loss = -(advantages * logp).mean() - self.config.entropy_coeff * entropy
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return float(loss.detach()), float(entropy.detach())

    def imitate(self, slot: Slot, edges: ParseEdges, target: np.ndarray, steps: int) -> float:
        """Fit the policy to the (G,) placement ``target`` (its parse: ``parser.parse_of``) with ``steps``
        Adam steps of their own; returns the last step's negative log-likelihood per decision."""
        sample = parse_of(edges, target)
        decisions = edges.num_edges + len(sample.group_device)
        optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config.lr * 3)
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            optimizer.zero_grad()
            loss = -log_prob(self.net, slot.tensors, edges, sample)[0].sum() / decisions
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.config.grad_clip * 10)
            optimizer.step()
        return float(loss.detach())

    def fresh_optimizer(self, seed: int) -> None:
        """Another problem (a device removed): the network stays, the optimizer, generator and baseline
        start over; the iteration count goes on (a run's metrics log numbers every update once)."""
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config.lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.baseline, self.reward_scale_s, self.learner_s = None, None, []
        self.temperature, self.stalled = 1.0, 0

    def state(self) -> dict:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "iteration": self.iteration,
                "baseline": np.nan if self.baseline is None else self.baseline,
                "reward_scale_s": np.nan if self.reward_scale_s is None else self.reward_scale_s,
                "temperature": self.temperature, "stalled": self.stalled}

    def load_state(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.iteration = int(state["iteration"])
        baseline, scale = float(state["baseline"]), float(state["reward_scale_s"])
        self.baseline = None if np.isnan(baseline) else baseline
        self.reward_scale_s = None if np.isnan(scale) else scale
        self.temperature = float(state.get("temperature", 1.0))
        self.stalled = int(state.get("stalled", 0))  # older learner.pt: 0, as every resume counted before
