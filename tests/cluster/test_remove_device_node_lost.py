"""A GPU node leaves for good: the pool reports it, and `--remove-device NAME@node-lost` takes the device away
from the search at that point (a fake three-node cluster; each test takes one node away)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from conftest import fake_gpu_cluster  # noqa: E402

from cluster import ray_setup  # noqa: E402
from cluster.runlog import read_best, read_manifest, read_run  # noqa: E402

pytestmark = pytest.mark.slow  # starts a Ray cluster
GRAPH, MACHINE, GPU1 = "synthetic:300:1", "paper-4gpu", 2


@pytest.fixture(scope="module")
def cluster():
    yield from fake_gpu_cluster(num_nodes=3)


def _wait_gone(node_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ray_setup.node_alive(node_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ray_setup.node_alive(node_id)


def test_pool__reports_a_node_that_left_once_even_with_its_actor_idle(cluster):
    from cluster.pool import MeasurerPool, PoolConfig
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.factory import MeasurerSpec

    graph = load_graph(GRAPH)
    spec = MeasurerSpec("sim", graph, load_machine(MACHINE))
    seen = []
    placement = np.zeros(graph.num_ops, dtype=np.int64)
    with MeasurerPool(spec, PoolConfig(node_check_interval_s=0.2), on_node_lost=seen.append) as pool:
        nodes = {a.node_id for a in pool.actors}
        assert len(nodes) == 3 and pool.lost_nodes() == ()
        leaving = next(n for n in cluster.worker_nodes if n.node_id in nodes)
        cluster.remove_node(leaving)
        _wait_gone(leaving.node_id)
        deadline = time.monotonic() + 30
        while not pool.lost_nodes() and time.monotonic() < deadline:  # one placement at a time: the node's
            (m,) = pool.measure([placement])  # actor may never get one; the periodic node check sees it go
            assert m.ok
            time.sleep(0.05)
        assert [lost.node_id for lost in pool.lost_nodes()] == [leaving.node_id]
        assert seen == list(pool.lost_nodes()) and seen[0].num_gpus == 4
        assert pool.measure([placement + 1])[0].ok  # the pool goes on with the nodes left
        assert leaving.node_id not in {a.node_id for a in pool.actors}


def test_search__node_lost_removes_the_device_and_the_search_ends_on_the_devices_left(cluster, tmp_path):
    from cluster.jobs import SearchConfig, run_search

    removed = []

    def progress(measured: int, best_runtime_s: float, lower_bound_s: float | None = None) -> None:
        if measured >= 20 and not removed:  # after cem's first batch of 32
            leaving = next(n for n in cluster.worker_nodes if ray_setup.node_alive(n.node_id))
            cluster.remove_node(leaving)
            _wait_gone(leaving.node_id)
            removed.append(leaving.node_id)

    config = SearchConfig(graph=GRAPH, machine=MACHINE, policy="cem", budget=128, groups=8, bound_time_limit_s=0,
                          remove_devices=("gpu:1@node-lost",), out=str(tmp_path / "runs"))
    result = run_search(config, progress=progress)
    assert removed
    (removal,) = read_manifest(result.run_dir).device_removals
    assert removal["device"] == "gpu:1" and removal["trigger"] == "node-lost"
    assert 32 <= removal["at_measurement"] < 128  # seen with the batch after the node left, in time to go on
    rows = read_run(result.run_dir)
    own = rows[rows["policy"] == "cem"]
    after = own[own["seq"] >= removal["at_seq"]]
    assert len(own) == 128 and len(after) == 128 - removal["at_measurement"]
    assert not any(GPU1 in set(p.tolist()) for p in after["placement"])
    measured_after = after[~after["cache_hit"]]  # a cache hit names the node that measured it first
    assert len(measured_after) and removed[0] not in set(measured_after["node_id"])
    assert result.final_devices == ["cpu:0", "gpu:0", "gpu:2", "gpu:3"]
    assert GPU1 not in result.best_placement and GPU1 not in read_best(result.run_dir).placement
