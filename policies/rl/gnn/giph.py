"""GiPH's episodes (Hu et al., MLSys 2023): a placement improved by relocation moves, one group to another
device per step, each move drawn by ``GiphNet`` from one softmax over every (group, other allowed device)
pair given the placement so far. B episodes run side by side from the same start::

    for each of T steps: state (B, G, D, S) of every group; draw one move per episode; apply it;
    measure the B placements (one call; a placement seen before is free, the memo has it)
    reward of a step = (step time before - step time after) / step time at the start   (as Placeto's)
    return of step t = sum_k discount^k reward_{t+k}; advantage = return minus its mean over the episodes

What the paper has and this does not: gpNet (the graph of (task, device) nodes) is replaced by the shared
encoder plus the pair scorer (policies/rl/gnn/network.py); its episodes start from random placements,
these start from a random one or the fastest single device (``Slot.fastest_device_start``) in training and
from the best placement so far
when fine-tuning. The answer of a search is the best placement measured on the way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from policies.rl.gnn.module import ACTIONS, ADVANTAGES, STATE, TARGETS
from policies.rl.gnn.network import MASKED_LOGIT, full_placement_state
from policies.rl.gnn.problems import Slot, step_improvements


@dataclass
class Episodes:
    """B episodes of at most T steps (S <= T steps taken)."""
    final: np.ndarray  # (B, G) int64 placements at the end
    targets: np.ndarray  # (B, S, G) int64: every group, each step (what GiphNet scores)
    actions: np.ndarray  # (B, S) int64 flat moves: group = move // D, device = move % D
    states: np.ndarray  # (B, S, G, D, len(STATE_COLUMNS)) float32: the placement before each move
    runtimes: np.ndarray  # (B, S) runtimes after each move (inf where not measured)
    measure_s: float

    @property
    def steps(self) -> int:
        return self.actions.shape[1]


def random_placement(slot: Slot, rng: np.random.Generator) -> np.ndarray:
    """(G,) each group on a device drawn uniformly among its allowed ones."""
    allowed = slot.inputs.allowed  # (G, D)
    draws = rng.random(allowed.shape) * allowed  # (G, D): zero where not allowed
    return draws.argmax(axis=1).astype(np.int64)


def run_episodes(net, slot: Slot, start: np.ndarray, size: int, steps: int, generator: torch.Generator,
                 greedy: bool = False, measure: bool = True) -> Episodes:
    """``size`` episodes of up to ``steps`` moves from ``start`` (greedy: the most likely move each step
    that does not return to a placement the episode has visited: a deterministic policy would otherwise
    go back and forth between two). Stops before a step whose ``size`` placements the budget left cannot
    all measure (when measuring), and when no group has another allowed device."""
    num_groups, num_devices = slot.num_groups, slot.problem.num_devices
    placements = torch.from_numpy(np.repeat(np.asarray(start, dtype=np.int64)[None], size, axis=0))  # (B, G)
    every = torch.arange(num_groups).expand(size, num_groups)  # (B, G)
    actions, states, runtimes, measure_s = [], [], [], 0.0
    visited = [placements.clone()]  # greedy: placements each episode has been in, (B, G) each
    with torch.no_grad():
        groups, devices = net.embed(slot.tensors)
        for _ in range(steps):
            if measure and slot.counter.left < size:
                break
            state = full_placement_state(placements, slot.adjacency, slot.work, slot.total_work_s)  # (B, G, D, S)
            logits = net.step_logits(groups, devices, slot.tensors, every, state)  # (B, G * D)
            if greedy:
                logits = _without_revisits(logits, placements, visited, num_devices)
            if bool((logits.max(dim=1).values <= MASKED_LOGIT / 2).any()):
                break  # nowhere to move
            move = (logits.argmax(dim=1) if greedy else
                    torch.multinomial(torch.softmax(logits, dim=1), 1, generator=generator)[:, 0])  # (B,)
            placements[torch.arange(size), move // num_devices] = move % num_devices
            visited.append(placements.clone())
            actions.append(move)
            states.append(state)
            if measure:
                t = time.perf_counter()
                runtimes.append(slot.measure(placements.numpy()))
                measure_s += time.perf_counter() - t
    taken = len(actions)
    shape = (size, taken, num_groups, num_devices, 3)
    return Episodes(final=placements.numpy().astype(np.int64),
                    targets=np.broadcast_to(np.arange(num_groups), (size, taken, num_groups)).copy(),
                    actions=torch.stack(actions, 1).numpy() if taken else np.zeros((size, 0), dtype=np.int64),
                    states=torch.stack(states, 1).numpy() if taken else np.zeros(shape, dtype=np.float32),
                    runtimes=(np.stack(runtimes, 1) if runtimes else np.full((size, taken), np.inf)),
                    measure_s=measure_s)


def _without_revisits(logits: Tensor, placements: Tensor, visited: list[Tensor], num_devices: int) -> Tensor:
    """Mask the moves (B, G * D) that lead back to a visited placement: one group away from it, that
    group's device there."""
    logits = logits.clone()
    rows = torch.arange(len(placements))
    for before in visited:
        differ = placements != before  # (B, G)
        one_away = differ.sum(dim=1) == 1  # (B,)
        if bool(one_away.any()):
            group = differ.int().argmax(dim=1)  # (B,)
            back = group * num_devices + before[rows, group]  # (B,)
            logits[rows[one_away], back[one_away]] = MASKED_LOGIT
    return logits


def discounted_returns(rewards: np.ndarray, discount: float) -> np.ndarray:
    """(B, S) rewards -> (B, S) returns: R_t = r_t + discount * R_{t+1}."""
    returns = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + discount * running
        returns[:, t] = running
    return returns


def giph_batch(net, slot: Slot, start: np.ndarray, size: int, steps: int, discount: float,
               generator: torch.Generator):
    """One batch of episodes from ``start`` as the learner reads it: (batch or None, (B,) each episode's best
    runtime, seconds spent measuring). None when the budget left cannot pay for two episodes' first step."""
    size = min(size, max(slot.counter.left, 0))
    if size < 2:
        return None, None, 0.0
    t = time.perf_counter()
    start_runtime = slot.measure(np.asarray(start, dtype=np.int64)[None])  # (1,) free once in the memo
    start_measure_s = time.perf_counter() - t
    size = min(size, max(slot.counter.left, 0))  # the start, if new, took one: B episodes' first steps need B
    if size < 2:
        return None, None, 0.0
    episodes = run_episodes(net, slot, start, size, steps, generator)
    if episodes.steps == 0:
        return None, None, 0.0
    start_s = slot.scored(start_runtime)[0]  # scored after the episodes: the failure score may have grown
    scored = slot.scored(episodes.runtimes)  # (B, S)
    returns = discounted_returns(step_improvements(start_s, scored), discount)  # (B, S)
    advantages = returns - returns.mean(axis=0, keepdims=True)
    batch = {TARGETS: episodes.targets, ACTIONS: episodes.actions, STATE: episodes.states,
             ADVANTAGES: advantages.astype(np.float32)}
    return batch, episodes.runtimes.min(axis=1), episodes.measure_s + start_measure_s
