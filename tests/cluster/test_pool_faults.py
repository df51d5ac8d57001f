"""Faults on a fake two-GPU-node cluster: dead actors, a node that leaves, hangs, crashing placements.

The stand-in measurer reads its script from the placement: placement[0] is a command, placement[1] a
milliseconds figure. Every placement's runtime_s is the placement's sum, so results are checkable.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
import ray
from conftest import build_graph, fake_gpu_cluster

from cluster.pool import MeasurerPool, PoolConfig
from cluster.runlog import RunLogWriter, new_manifest, read_run
from measurers.base import Measurement
from measurers.catalog import load_machine

pytestmark = pytest.mark.slow  # starts Ray
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module

SLEEP, HANG, EXIT, RAISE = 0, 1, 2, 3


class ScriptedMeasurer:
    def measure(self, placements):
        out = []
        for p in placements:
            if p[0] == HANG:
                time.sleep(3600)
            if p[0] == EXIT:
                os._exit(3)
            if p[0] == RAISE:
                raise ValueError("this measurer breaks the protocol")
            time.sleep(p[1] / 1000)
            out.append(Measurement(float(np.sum(p)), (float(np.sum(p)),), "ok", (0,) * 5, p[1] / 1000))
        return out


class SlowBuildMeasurer(ScriptedMeasurer):
    """A real measurer's shape: its step is built once (``check_ready``, else by the first measurement)."""

    BUILD_S = 1.5

    def __init__(self):
        self.built = False

    def check_ready(self):
        time.sleep(self.BUILD_S)
        self.built = True

    def measure(self, placements):
        if not self.built:
            self.check_ready()
        return super().measure(placements)


def _sleepers(n: int, ms: int, start: int = 0) -> list[np.ndarray]:
    return [np.array([SLEEP, ms, start + i]) for i in range(n)]


@pytest.fixture(scope="module")
def cluster():
    yield from fake_gpu_cluster()


@pytest.fixture
def run_log(tmp_path):
    manifest = new_manifest("faults", build_graph([(0, 1), (1, 2)]), load_machine("paper-4gpu"), seed=0)
    with RunLogWriter.create(tmp_path, manifest, flush_rows=1000) as log:
        yield log


def _check_once(results, placements, run_log) -> None:
    """Every placement came back exactly once, right, and is in the log exactly once."""
    first = min(r.ticket for r in results)
    assert sorted(r.ticket for r in results) == list(range(first, first + len(placements)))
    assert [r.runtime_s for r in sorted(results, key=lambda r: r.ticket)] == [float(p.sum()) for p in placements]
    run_log.flush()
    rows = read_run(run_log.folder)
    logged = sorted(tuple(p) for p in rows["placement"])
    assert logged == sorted(tuple(p) for p in placements)


def test_faults__killed_actor_work_is_measured_and_logged_once(cluster, run_log):
    placements = _sleepers(40, 40)
    with MeasurerPool(ScriptedMeasurer, PoolConfig(chunk_size=5), run_log=run_log) as pool:
        pids = {i.pid for i in pool.actors}
        victim = pool.actors[0]
        results = []
        for result in pool.as_completed(pool.submit(placements)):
            results.append(result)
            if len(results) == 6:
                os.kill(victim.pid, signal.SIGKILL)
        new_pids = {i.pid for i in pool.wait_ready()}  # the replacement may still be starting
        nodes = {i.node_id for i in pool.actors}
    _check_once(results, placements, run_log)
    assert all(r.status == "ok" for r in results)
    assert max(r.attempts for r in results) == 2  # the running chunk went out again
    assert victim.pid not in new_pids and len(new_pids) == 2 and new_pids != pids  # replaced on its node
    assert victim.node_id in nodes


def test_faults__hanging_measurement_times_out_and_pool_goes_on(cluster, run_log):
    placements = _sleepers(6, 10) + [np.array([HANG, 0, 99])] + _sleepers(6, 10, start=6)
    config = PoolConfig(timeout_s=0.5, timeout_slack_s=0.5, chunk_size=4)
    with MeasurerPool(ScriptedMeasurer, config, run_log=run_log) as pool:
        t0 = time.monotonic()
        results = pool.measure_results(placements)
        elapsed_s = time.monotonic() - t0
        after = pool.measure(_sleepers(4, 1, start=50))
    statuses = [r.status for r in results]
    assert statuses == ["ok"] * 6 + ["timeout"] + ["ok"] * 6 and all(m.ok for m in after)
    assert results[6].measurement.measure_s >= 0.5 and elapsed_s < 10
    assert "killed" in results[6].measurement.error
    rows = read_run(run_log.folder)
    assert (rows["status"] == "timeout").sum() == 1 and len(rows) == 17


def test_faults__a_step_that_builds_longer_than_a_placements_limit_is_built_before_the_first(cluster):
    """The build happened in the first measurement, inside its limit: every placement timed out, each on a
    fresh actor that began the build again."""
    config = PoolConfig(num_cpu_actors=1, use_gpus=False, timeout_s=0.5, timeout_slack_s=0.5, chunk_size=1)
    with MeasurerPool(SlowBuildMeasurer, config) as pool:
        results = pool.measure_results(_sleepers(3, 10))
    assert [r.status for r in results] == ["ok"] * 3 and len({r.actor_id for r in results}) == 1


def test_faults__placement_that_kills_its_actor_becomes_crash_after_k_tries(cluster, run_log):
    crasher = np.array([EXIT, 0, 7])
    placements = _sleepers(5, 5) + [crasher] + _sleepers(5, 5, start=5)
    with MeasurerPool(ScriptedMeasurer, PoolConfig(chunk_size=8, max_crashes=2), run_log=run_log) as pool:
        results = pool.measure_results(placements)
        pids = {i.pid for i in pool.actors}
        again = pool.measure_results([crasher], refresh=True)  # never retried: no actor dies for it
        assert {i.pid for i in pool.actors} == pids
    assert [r.status for r in results] == ["ok"] * 5 + ["crash"] + ["ok"] * 5
    assert results[5].attempts == 3  # once in its chunk, then alone twice
    assert "killed 2 actors" in results[5].measurement.error
    assert again[0].cache_hit and again[0].status == "crash"
    assert len(read_run(run_log.folder)) == 12


def test_faults__measurer_that_raises_fails_only_its_placement(cluster):
    placements = _sleepers(3, 1) + [np.array([RAISE, 0, 0])] + _sleepers(3, 1, start=3)
    with MeasurerPool(ScriptedMeasurer, PoolConfig(num_cpu_actors=1, use_gpus=False)) as pool:
        results = pool.measure_results(placements)
    assert [r.status for r in results] == ["ok"] * 3 + ["error"] + ["ok"] * 3
    assert "breaks the protocol" in results[3].measurement.error


def test_faults__node_that_leaves_does_not_stop_the_run(cluster, run_log):
    """Last in this module: it takes one of the two GPU nodes away for good."""
    placements = _sleepers(40, 40)
    with MeasurerPool(ScriptedMeasurer, PoolConfig(chunk_size=4), run_log=run_log) as pool:
        by_node = {i.node_id: i for i in pool.actors}
        leaving = next(n for n in cluster.worker_nodes if n.node_id in by_node)
        results = []
        for result in pool.as_completed(pool.submit(placements)):
            results.append(result)
            if len(results) == 8:
                cluster.remove_node(leaving)
        survivors = pool.actors
    _check_once(results, placements, run_log)
    assert all(r.status == "ok" for r in results)
    assert [i.node_id for i in survivors] == [n for n in by_node if n != leaving.node_id]
    assert results[-1].node_id != leaving.node_id


def test_faults__a_slow_placement_inside_a_chunk_is_a_timeout_too(cluster, run_log):
    """A chunk's deadline is timeout_s times its placements: a placement taking 10x its limit among fast
    ones came back ok (a review; the command line sends real measurers one placement per call)."""
    placements = _sleepers(3, 10) + [np.array([SLEEP, 1000, 99])]
    config = PoolConfig(timeout_s=0.5, timeout_slack_s=5.0, chunk_size=4, num_cpu_actors=1)
    with MeasurerPool(ScriptedMeasurer, config, run_log=run_log) as pool:
        results = pool.measure_results(placements)
    assert [r.status for r in results] == ["ok"] * 3 + ["timeout"]
    assert "past the 0.5 s limit for one placement" in results[3].measurement.error
