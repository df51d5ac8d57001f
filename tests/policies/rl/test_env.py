"""PlacementEnv and the reward: gymnasium's checker, rewards, penalties, one measure call per batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from graphs.errors import PlacerError
from graphs.grouping import Grouping  # noqa: E402
from measurers.base import Measurement
from measurers.machine import Device, Link, Machine
from policies.rl.env import PlacementEnv, allowed_devices, reward_of, scored_runtime_s


def _machine() -> Machine:
    devices = (Device("cpu:0", "cpu", "X", 1e11, 1e10, 2**34, 1e-6),
               Device("gpu:0", "gpu", "Y", 1e13, 1e11, 2**34, 1e-6),
               Device("gpu:1", "gpu", "Y", 1e13, 1e11, 2**34, 1e-6))
    names = [d.name for d in devices]
    links = tuple(Link(a, b, 1e10, 1e-5, "bus") for a in names for b in names if a != b)
    return Machine("toy3", devices, links)


class _CountingMeasurer:
    """runtime_s = 1 + number of ops on the CPU; placements with every op on gpu:1 run out of memory."""

    def __init__(self):
        self.calls: list[int] = []

    def measure(self, placements):
        self.calls.append(len(placements))
        out = []
        for p in placements:
            if (p == 2).all():
                out.append(Measurement(0.5, (0.5,), "oom", (0, 0, 0), 0.0, "out of memory"))
            else:
                runtime_s = 1.0 + float((p == 0).sum())
                out.append(Measurement(runtime_s, (runtime_s,), "ok", (0, 0, 0), 0.0))
        return out


def _env(penalty_runtime_s: float = 100.0, measurer=None, allowed=(3, 2, 3, 1)) -> PlacementEnv:
    """4 groups over 6 ops; by default group 1 is gpu-only and group 3 cpu-only (kind bits cpu=1, gpu=2)."""
    grouping = Grouping(np.array([0, 0, 1, 2, 2, 3]), 4, np.array(allowed, dtype=np.uint8))
    features = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    return PlacementEnv(None, _machine(), grouping, measurer or _CountingMeasurer(),
                        penalty_runtime_s=penalty_runtime_s, features=features)


def _measurement(status: str, runtime_s: float = 4.0) -> Measurement:
    return Measurement(runtime_s, (runtime_s,), status, (0,), 0.0)


def test_reward_of__ok_is_negative_sqrt_runtime():
    assert reward_of(_measurement("ok", 4.0)) == -2.0
    assert reward_of(_measurement("ok", 0.25), penalty_runtime_s=9.0) == -0.5


@pytest.mark.parametrize("status", ["oom", "error", "timeout", "crash"])
def test_reward_of__failures_score_the_penalty_runtime(status):
    assert reward_of(_measurement(status, 0.01)) == -10.0
    assert reward_of(_measurement(status, 0.01), penalty_runtime_s=25.0) == -5.0
    assert scored_runtime_s(_measurement(status, 0.01), 25.0) == 25.0


def test_reward_of__nan_runtime_counts_as_failure():
    assert reward_of(_measurement("ok", float("nan")), penalty_runtime_s=16.0) == -4.0


def test_placement_env__passes_gymnasium_env_checker():
    check_env(_env(), skip_render_check=True)


def test_placement_env__observation_is_features_then_allowed_mask():
    env = _env()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 3 + 3) and obs.dtype == np.float32
    np.testing.assert_allclose(obs[:, :3], np.arange(12).reshape(4, 3) / 10, rtol=1e-6)
    np.testing.assert_array_equal(obs[:, 3:], [[1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 0, 0]])
    assert env.observation_space.contains(obs)
    assert list(env.action_space.nvec) == [3, 3, 3, 3]


def test_placement_env__step_measures_one_placement_and_ends_the_episode():
    env = _env()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(np.array([0, 1, 2, 0]))
    # ops 0,1 (group 0) and 4,5 (groups 2, 3) -> cpu ops: 0, 1, 5 -> runtime 4 s
    assert (terminated, truncated) == (True, False)
    assert reward == -2.0 and info == {"runtime_s": 4.0, "status": "ok"}


def test_measure_batch__sends_the_whole_batch_in_one_measure_call():
    measurer = _CountingMeasurer()
    env = _env(measurer=measurer)
    placements = np.array([[1, 1, 1, 0], [2, 2, 2, 0], [0, 1, 1, 0], [1, 2, 1, 0], [2, 1, 2, 0]])
    ops, measurements, rewards = env.measure_batch(placements)
    assert measurer.calls == [5]
    assert ops.shape == (5, 6) and ops.dtype == np.int64
    np.testing.assert_array_equal(ops[2], [0, 0, 1, 1, 1, 0])
    np.testing.assert_allclose(rewards, [-math.sqrt(2), -math.sqrt(2), -math.sqrt(4), -math.sqrt(2), -math.sqrt(2)])
    assert [m.status for m in measurements] == ["ok"] * 5


def test_measure_batch__oom_is_scored_as_the_penalty():
    env = _env(penalty_runtime_s=49.0, allowed=(3, 3, 3, 3))
    _, measurements, rewards = env.measure_batch(np.array([[2, 2, 2, 2]]))
    assert measurements[0].status == "oom" and rewards[0] == -7.0


def test_measure_batch__forbidden_device_is_penalized_without_measuring():
    measurer = _CountingMeasurer()
    env = _env(penalty_runtime_s=36.0, measurer=measurer)
    _, measurements, rewards = env.measure_batch(np.array([[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 1, 2]]))
    assert measurer.calls == [1]  # only the legal first placement was measured
    assert [m.status for m in measurements] == ["ok", "error", "error"]
    assert "group 1 may not run on cpu:0" in measurements[1].error
    assert "group 3 may not run on gpu:1" in measurements[2].error
    np.testing.assert_allclose(rewards[1:], [-6.0, -6.0])


def test_measure_batch__rejects_placements_of_the_wrong_shape_or_range():
    env = _env()
    with pytest.raises(PlacerError, match="shape"):
        env.measure_batch(np.zeros((2, 5), dtype=np.int64))
    with pytest.raises(PlacerError, match="outside"):
        env.measure_batch(np.array([[0, 1, 3, 0]]))


def test_placement_env__rejects_a_non_positive_penalty():
    with pytest.raises(PlacerError, match="penalty"):
        _env(penalty_runtime_s=0.0)


def test_allowed_devices__matches_kind_bits():
    allowed = allowed_devices(np.array([1, 2, 3], dtype=np.uint8), _machine())
    np.testing.assert_array_equal(allowed, [[1, 0, 0], [0, 1, 1], [1, 1, 1]])


def test_measure_batch__a_failure_never_scores_better_than_a_step_that_ran():
    """Above penalty / 3, a failure scores 3x the slowest ok step seen: here 21 s, not the 4 s penalty."""
    env = _env(penalty_runtime_s=4.0, allowed=(3, 3, 3, 3))
    _, measurements, rewards = env.measure_batch(np.array([[0, 0, 0, 0], [2, 2, 2, 2]]))  # all six ops on the cpu
    assert [m.status for m in measurements] == ["ok", "oom"]
    np.testing.assert_allclose(rewards, [-math.sqrt(7.0), -math.sqrt(21.0)])
    env.observe([_measurement("ok", 10.0), _measurement("timeout", 500.0)])  # measured elsewhere: a warm start
    assert env.failure_runtime_s == 30.0 and env.reward_of(_measurement("crash")) == -math.sqrt(30.0)
