"""The placement problem as a gymnasium environment, and the reward every learner uses.

One episode is one placement: ``reset`` shows the graph (one row per op group), ``step(action)`` places
every group at once, measures the placement and ends the episode. The sequence model that picks the
groups' devices one after another lives inside the policy, not in the environment.

- observation: ``(G, F + D)`` float32, the group feature matrix (``F`` columns) followed by a 0/1 mask of
  the devices each group may run on (``D`` columns, from the groups' allowed device kinds).
- action: ``MultiDiscrete([D] * G)``, a device index for every group.
- reward: ``-sqrt(runtime_s)``; a failed, out-of-memory, timed-out or crashed placement, or one that puts a
  group on a device of a kind it may not run on, counts as ``penalty_runtime_s`` (the reference
  implementation's 100 s, reward -10), or as ``FAILURE_FACTOR`` (3) times the slowest step measured so far
  where that is more (the graph-neural placers' factor, without their floor): a real step can last longer
  than 100 s (the full RNNLM on this machine's CPU: 114.5 s), and running out of memory must never score
  better than a step that ran.

``PlacementEnv.measure_batch`` scores a whole batch of placements with ONE ``measure`` call; the trainers
use it so a batch is measured in parallel by the pool, never one placement at a time.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import gymnasium as gym
import numpy as np

from graphs.errors import PlacerError
from measurers.base import Measurement
from policies.base import FAILURE_FACTOR
from policies.rl.config import DEFAULT_PENALTY_RUNTIME_S


def scored_runtime_s(measurement: Measurement, penalty_runtime_s: float = DEFAULT_PENALTY_RUNTIME_S) -> float:
    """The runtime a measurement is scored as: its own when ``ok``, else ``penalty_runtime_s``."""
    runtime_s = measurement.runtime_s
    if measurement.status != "ok" or not math.isfinite(runtime_s) or runtime_s < 0:
        return float(penalty_runtime_s)
    return float(runtime_s)


def slowest_ok_runtime_s(measurements: Iterable[Measurement]) -> float:
    """The longest step among the ``ok`` measurements; 0 when there is none."""
    return max((m.runtime_s for m in measurements if m.ok and math.isfinite(m.runtime_s)), default=0.0)


def failure_runtime_s(penalty_runtime_s: float, slowest_ok_s: float) -> float:
    """What a failure scores as: ``penalty_runtime_s``, or ``FAILURE_FACTOR`` times the slowest ok step
    measured so far where that is more (see the module docstring)."""
    return max(float(penalty_runtime_s), FAILURE_FACTOR * float(slowest_ok_s))


def reward_of(measurement: Measurement, penalty_runtime_s: float = DEFAULT_PENALTY_RUNTIME_S) -> float:
    """``-sqrt(runtime_s)`` of an ``ok`` measurement; ``-sqrt(penalty_runtime_s)`` of any failure."""
    return -math.sqrt(scored_runtime_s(measurement, penalty_runtime_s))


def allowed_devices(group_allowed_mask: np.ndarray, machine) -> np.ndarray:
    """(G, D) bool: may group g run on device d (its kind bit is in the group's allowed mask)."""
    group_mask = np.asarray(group_allowed_mask, dtype=np.uint8)  # (G,)
    return (group_mask[:, None] & machine.kind_bits[None, :]) != 0


def observation_matrix(features: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """(G, F + D) float32: features (G, F) next to the allowed-device mask (G, D)."""
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 2 or features.shape[0] != allowed.shape[0]:
        raise PlacerError(f"group features of shape {features.shape} do not match {allowed.shape[0]} groups")
    if not np.isfinite(features).all():
        raise PlacerError("group features contain NaN or infinite values")
    return np.concatenate([features, allowed.astype(np.float32)], axis=1)


def failed_measurement(num_devices: int, error: str) -> Measurement:
    """A placement rejected before measuring (a group on a device kind it may not use)."""
    return Measurement(float("nan"), (), "error", (0,) * num_devices, 0.0, error)


class PlacementEnv(gym.Env):
    """One placement per episode; see the module docstring for spaces and reward.

    ``features`` is the (G, F) group feature matrix (``graphs.features.group_features(graph,
    grouping).as_matrix()`` when not given).
    """

    metadata = {"render_modes": []}

    def __init__(self, graph, machine, grouping, measurer, *, penalty_runtime_s: float = DEFAULT_PENALTY_RUNTIME_S,
                 features: np.ndarray | None = None):
        if not penalty_runtime_s > 0:
            raise PlacerError(f"penalty_runtime_s must be positive, got {penalty_runtime_s}")
        if features is None:
            from graphs.features import group_features
            features = group_features(graph, grouping).as_matrix(normalize=True)
        self.graph, self.machine, self.grouping, self.measurer = graph, machine, grouping, measurer
        self.penalty_runtime_s = float(penalty_runtime_s)
        self.slowest_ok_s = 0.0  # the longest ok step observed (``observe``), which can raise the failure score
        self.allowed = allowed_devices(grouping.group_allowed_mask, machine)  # (G, D) bool
        self.obs = observation_matrix(features, self.allowed)  # (G, F + D) float32
        num_groups, num_devices = self.allowed.shape
        num_features = self.obs.shape[1] - num_devices
        big = np.finfo(np.float32).max  # features are any finite value
        low = np.concatenate([np.full(num_features, -big), np.zeros(num_devices)]).astype(np.float32)
        high = np.concatenate([np.full(num_features, big), np.ones(num_devices)]).astype(np.float32)
        self.observation_space = gym.spaces.Box(np.tile(low, (num_groups, 1)), np.tile(high, (num_groups, 1)),
                                                dtype=np.float32)
        self.action_space = gym.spaces.MultiDiscrete([num_devices] * num_groups)

    @property
    def num_groups(self) -> int:
        return self.allowed.shape[0]

    @property
    def num_devices(self) -> int:
        return self.allowed.shape[1]

    @property
    def failure_runtime_s(self) -> float:
        """What a failure scores as now (``failure_runtime_s``)."""
        return failure_runtime_s(self.penalty_runtime_s, self.slowest_ok_s)

    def observe(self, measurements: Iterable[Measurement]) -> None:
        """Take in measurements made elsewhere (a warm start, a resumed run's memo): their slowest ok step
        counts in the failure score as this environment's own do."""
        self.slowest_ok_s = max(self.slowest_ok_s, slowest_ok_runtime_s(measurements))

    def reward_of(self, measurement: Measurement) -> float:
        """``reward_of`` with this environment's failure score."""
        return reward_of(measurement, self.failure_runtime_s)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self.obs.copy(), {}

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        _, measurements, rewards = self.measure_batch(np.asarray(action)[None, :])
        info = {"runtime_s": scored_runtime_s(measurements[0], self.failure_runtime_s),  # what was rewarded
                "status": measurements[0].status}
        return self.obs.copy(), float(rewards[0]), True, False, info

    def measure_batch(self, group_placements: np.ndarray) -> tuple[np.ndarray, list[Measurement], np.ndarray]:
        """Score B placements with one ``measure`` call.

        group_placements: (B, G) ints. Returns op placements (B, N) int64, one Measurement per placement
        and rewards (B,) float64. Placements that use a forbidden device are not sent to the measurer.
        """
        group_placements = self._checked(group_placements)  # (B, G) int64
        op_placements = np.asarray(self.grouping.expand(group_placements), dtype=np.int64)  # (B, N)
        legal = self.allowed[np.arange(self.num_groups)[None, :], group_placements].all(axis=1)  # (B,)
        measured = self.measurer.measure([op_placements[b] for b in np.flatnonzero(legal)]) if legal.any() else []
        if len(measured) != int(legal.sum()):
            raise PlacerError(f"measurer returned {len(measured)} measurements for {int(legal.sum())} placements")
        measured_iter = iter(measured)
        measurements = [next(measured_iter) if ok else self._forbidden(placement)
                        for ok, placement in zip(legal, group_placements)]
        self.observe(measurements)
        rewards = np.array([self.reward_of(m) for m in measurements], dtype=np.float64)
        return op_placements, measurements, rewards

    def _checked(self, group_placements: Sequence) -> np.ndarray:
        placements = np.asarray(group_placements)
        if placements.ndim != 2 or placements.shape[1] != self.num_groups:
            raise PlacerError(f"group placements must have shape (B, {self.num_groups}), got {placements.shape}")
        if not np.issubdtype(placements.dtype, np.integer):
            raise PlacerError(f"group placements must be integers, got {placements.dtype}")
        if placements.size and (placements.min() < 0 or placements.max() >= self.num_devices):
            raise PlacerError(f"group placement names a device outside 0..{self.num_devices - 1}")
        return placements.astype(np.int64)

    def _forbidden(self, group_placement: np.ndarray) -> Measurement:
        bad = np.flatnonzero(~self.allowed[np.arange(self.num_groups), group_placement])
        g = int(bad[0])
        device = self.machine.devices[int(group_placement[g])].name
        return failed_measurement(self.num_devices, f"group {g} may not run on {device} ({len(bad)} such groups)")
