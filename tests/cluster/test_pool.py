"""The measurer pool on a fake cluster: a CPU head and two 4-GPU nodes, shared by this module's tests."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from conftest import build_graph, fake_gpu_cluster

from cluster.pool import MeasurerPool, PoolConfig
from cluster.ray_setup import gpu_nodes, init_ray, list_nodes
from cluster.runlog import LoggedPlacement, RunLogWriter, new_manifest, read_run
from graphs.errors import PlacerError
from graphs.synthetic import synthetic_graph
from measurers.base import Measurement
from measurers.catalog import load_machine
from measurers.factory import MeasurerSpec, build_measurer

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # starts Ray
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module


class SleepMeasurer:
    """Sleeps ``placement[0]`` milliseconds (or ``sleep_s``); runtime_s = the placement's sum."""

    def __init__(self, sleep_s: float = 0.0):
        self.sleep_s = sleep_s

    def measure(self, placements):
        out = []
        for p in placements:
            t0 = time.perf_counter()
            time.sleep(self.sleep_s or p[0] / 1000)
            out.append(Measurement(float(np.sum(p)), (float(np.sum(p)),), "ok", (0,) * 5, time.perf_counter() - t0))
        return out


@pytest.fixture(scope="module")
def cluster():
    yield from fake_gpu_cluster(labels={"placer/role": "measurer"})


@pytest.fixture(scope="module")
def cpu_pool(cluster):
    """Two unpinned CPU actors (GPUs off), shared by the tests that need no special settings."""
    with MeasurerPool(SleepMeasurer, PoolConfig(num_cpu_actors=2, use_gpus=False)) as pool:
        yield pool


def _placements(n: int, num_ops: int = 6, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([[i], rng.integers(0, 5, num_ops - 1)]) for i in range(n)]


def test_pool__one_actor_per_gpu_node_sees_its_four_gpus(cluster):
    gpu_node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")}
    with MeasurerPool(SleepMeasurer, PoolConfig(node_labels={"placer/role": "measurer"})) as pool:
        infos = pool.actors
    assert {i.node_id for i in infos} == gpu_node_ids and len(infos) == 2
    assert all(i.gpu_ids == ("0", "1", "2", "3") and i.cuda_visible_devices == "0,1,2,3" for i in infos)
    assert all(i.omp_num_threads == "1" for i in infos)  # the node's CPUs as threads: these fake nodes have 0


def test_pool__a_gpu_nodes_actor_gets_the_nodes_cpus_as_threads(cluster):
    with MeasurerPool(SleepMeasurer, PoolConfig(node_labels={"placer/role": "measurer"})) as pool:
        options = pool._actor_options(dataclasses.replace(pool._slots[0], num_cpus=32))
    assert options["runtime_env"] == {"env_vars": {"OMP_NUM_THREADS": "32"}} and options["num_gpus"] == 4


def test_pool__nodes_with_fewer_gpus_than_it_needs_host_no_measurer(cluster):
    with MeasurerPool(SleepMeasurer, PoolConfig(min_gpus=8, num_cpu_actors=1)) as pool:  # the nodes have 4
        infos = pool.actors
    assert len(infos) == 1 and not infos[0].gpu_ids  # a CPU actor, not one on a node short of GPUs


def test_pool__batch_spread_over_nodes_comes_back_complete_in_order(cluster):
    placements = _placements(40)
    with MeasurerPool(functools.partial(SleepMeasurer, 0.005), PoolConfig(chunk_size=4)) as pool:
        results = pool.measure_results(placements)
    assert [r.ticket for r in results] == list(range(40))
    assert [r.runtime_s for r in results] == [float(p.sum()) for p in placements]
    assert all(np.array_equal(r.placement, p) for r, p in zip(results, placements))
    assert len({r.node_id for r in results}) == 2 and not any(r.cache_hit for r in results)
    assert all(r.submitted_at <= r.started_at <= r.finished_at for r in results)


def test_pool__chunks_carry_many_placements_per_call(cluster):
    with MeasurerPool(SleepMeasurer, PoolConfig(chunk_size=64, calls_per_actor=2)) as pool:
        results = pool.measure_results([np.zeros(5, dtype=np.int64) + [0, i, 0, 0, 0] for i in range(64)])
    calls = {(r.actor_id, r.started_at) for r in results}
    assert len(calls) == 4  # 64 placements over 2 actors x 2 calls: 16 per call


def test_pool__cache_hits_are_reported_and_not_measured_again(cpu_pool):
    a, b = np.array([30, 1, 2]), np.array([30, 2, 1])
    first = cpu_pool.measure_results([a, b, a.astype(np.int16)])  # the duplicate waits for the first
    again = cpu_pool.measure_results([b])
    fresh = cpu_pool.measure_results([b], refresh=True)
    assert [r.cache_hit for r in first] == [False, False, True] and again[0].cache_hit
    assert again[0].started_at == again[0].finished_at and again[0].measurement == first[1].measurement
    assert not fresh[0].cache_hit and fresh[0].started_at > first[1].finished_at


def test_pool__stream_yields_results_as_they_finish(cpu_pool):
    slow, fast = np.array([600, 0]), np.array([20, 0])
    tickets = cpu_pool.submit([slow, fast], policy="cem", iteration=4)
    order = [(r.ticket, r.policy, r.iteration) for r in cpu_pool.as_completed(tickets)]
    assert cpu_pool.poll() == [] and cpu_pool.num_pending == 0
    assert order == [(tickets[1], "cem", 4), (tickets[0], "cem", 4)]


def test_pool__in_flight_work_is_bounded(cluster):
    config = PoolConfig(num_cpu_actors=2, use_gpus=False, chunk_size=2, calls_per_actor=1, max_in_flight=3)
    with MeasurerPool(functools.partial(SleepMeasurer, 0.02), config) as pool:
        pool.submit(_placements(12))
        peak = 0
        while pool.num_pending:
            peak = max(peak, sum(len(c.jobs) for s in pool._slots for c in s.calls))
            pool.poll(0.01)
    assert 2 <= peak <= 3


def test_pool__cpu_actors_when_gpus_are_off(cpu_pool):
    ok = cpu_pool.measure(_placements(5, seed=9))
    assert len(cpu_pool.actors) == 2 and all(i.gpu_ids == () for i in cpu_pool.actors)
    assert all(m.ok for m in ok)


def test_ray_setup__lists_gpu_nodes_by_label(cluster):
    assert init_ray() == cluster.address  # already connected: joins nothing new
    assert len(gpu_nodes()) == 2 and gpu_nodes({"placer/role": "measurer"}) == gpu_nodes()
    assert gpu_nodes({"placer/role": "head"}) == [] and len(list_nodes()) == 3


def test_pool__close_leaves_no_actors(cluster):
    pool = MeasurerPool(SleepMeasurer, PoolConfig(num_cpu_actors=2, use_gpus=False))
    ids = {i.actor_id for i in pool.actors}
    pool.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = {a: ray._private.state.actors(a)["State"] for a in ids}
        if set(states.values()) == {"DEAD"}:
            break
        time.sleep(0.1)
    assert set(states.values()) == {"DEAD"}
    with pytest.raises(PlacerError, match="closed"):
        pool.submit(_placements(1))


def test_pool__logs_every_result_once(cluster, tmp_path):
    graph, machine = build_graph([(0, 1), (1, 2)]), load_machine("paper-4gpu")
    placements = _placements(20, num_ops=3)
    log = RunLogWriter.create(tmp_path, new_manifest("run", graph, machine, seed=0), flush_rows=7)
    as_groups = [LoggedPlacement(p[:2], "group") for p in placements]  # what the caller wants logged
    with MeasurerPool(SleepMeasurer, PoolConfig(num_cpu_actors=2, use_gpus=False), run_log=log) as pool:
        pool.measure_results(placements, policy="random", iteration=1, log_placements=as_groups)
        pool.measure_results(placements[:3])  # cache hits are logged too
    rows = read_run(tmp_path / "run")
    assert rows["seq"].tolist() == list(range(23)) and rows["cache_hit"].sum() == 3
    assert rows["placement_level"].tolist() == ["group"] * 20 + ["op"] * 3  # none given: the op placement
    assert sorted(tuple(p) for p in rows["placement"][:20]) == sorted(tuple(p[:2]) for p in placements)
    assert sorted(rows["runtime_s"][:20]) == sorted(float(p.sum()) for p in placements)
    assert set(rows["node_id"]) <= {n["NodeID"] for n in ray.nodes()} and (rows["policy"][:20] == "random").all()


def test_pool__log_placement_without_a_level_is_an_error(cpu_pool):
    placements = _placements(2, num_ops=3)
    with pytest.raises(PlacerError, match="LoggedPlacement"):
        cpu_pool.submit(placements, log_placements=[p[:2] for p in placements])
    with pytest.raises(PlacerError, match="1 log placements for 2"):
        cpu_pool.submit(placements, log_placements=[LoggedPlacement(placements[0], "op")])
    assert cpu_pool.num_pending == 0


def test_ray_setup__local_ray_keeps_token_authentication(tmp_path):
    """A local Ray started by init_ray() with RAY_AUTH_MODE unset turns token authentication on."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    code = ("import os; from cluster.ray_setup import init_ray, list_nodes, shutdown_ray; init_ray(num_cpus=1); "
            "print(os.environ.get('RAY_AUTH_MODE'), len(list_nodes())); shutdown_ray()")
    done = subprocess.run([sys.executable, "-c", code], env=env | {"HOME": str(tmp_path)}, cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["token", "1"]  # its own one-node Ray, not the module's cluster
    assert (tmp_path / ".ray" / "auth_token").stat().st_size > 0


def test_pool__simulator_spec_measures_as_in_process(cluster):
    """The spec (graph and machine inside) travels through the object store; results equal in-process ones."""
    spec = MeasurerSpec("sim", synthetic_graph(80, seed=1), load_machine("paper-4gpu"), runs=3)
    placements = list(np.random.default_rng(0).integers(0, 5, size=(24, 80)))
    placements.append(np.zeros(79, dtype=np.int64))  # wrong length: an error status, not an exception
    with MeasurerPool(spec, PoolConfig(num_cpu_actors=2, use_gpus=False)) as pool:
        pooled = pool.measure(placements)
    local = build_measurer(spec).measure(placements)
    assert [(m.runtime_s, m.status, m.peak_bytes) for m in pooled] == [(m.runtime_s, m.status, m.peak_bytes)
                                                                       for m in local]
    assert pooled[-1].status == "error" and sum(m.status == "ok" for m in pooled) >= 1


def test_pool__bad_measurer_spec_is_a_clear_error(cluster):
    graph, machine = build_graph([(0, 1)]), load_machine("paper-2gpu")
    with pytest.raises(PlacerError, match="cannot be rebuilt as a real PyTorch step"):
        MeasurerPool(MeasurerSpec("torch", graph, machine))  # a hand-built graph has no model behind it
    with pytest.raises(PlacerError, match="unknown measurer kind"):
        MeasurerSpec("jax", graph, machine)
    with pytest.raises(PlacerError, match="cannot be rebuilt as a real TensorFlow step"):
        build_measurer(MeasurerSpec("tf", graph, machine))


def test_pool__factory_that_fails_to_build_is_a_clear_error(cluster):
    with pytest.raises(PlacerError, match="(?s)failed to start.*no such device"):
        MeasurerPool(functools.partial(_broken_factory), PoolConfig(num_cpu_actors=1, use_gpus=False))


def _broken_factory():
    raise PlacerError("no such device")


def test_pool_config_for__a_real_measurer_without_gpus_times_alone_with_every_core(cluster, tmp_path):
    """Two CPU actors of one thread each (Ray's default for an actor reserving no CPU) timed placements at
    once on the same cores: a torch step measured 3-8x faster in `placer measure` than in a search."""
    from cluster.cli import main
    from cluster.pool import pool_config_for
    from graphs.registry import load_graph

    graph_file = tmp_path / "mlp.parquet"
    assert main(["graphs", "import", "--torch", f"{REPO}/tests/fixtures/tiny_models.py:tiny_torch_mlp",
                 "-o", str(graph_file)]) == 0
    spec = MeasurerSpec("torch", load_graph(str(graph_file)), load_machine("local"), runs=1, warmup=0)
    config = pool_config_for(spec)
    assert (config.num_cpu_actors, config.cpu_actor_threads, config.use_gpus) == (1, os.cpu_count(), False)
    assert pool_config_for(dataclasses.replace(spec, kind="sim"), workers=3).num_cpu_actors == 3
    with MeasurerPool(SleepMeasurer, config) as pool:
        (info,) = pool.actors
    assert info.omp_num_threads == str(os.cpu_count())


def test_pool_config_for__openvino_times_alone_with_every_core_and_needs_no_ray_gpus(cluster):
    """OpenVINO times for real too, on the CPU and an Intel GPU that Ray does not count: it had two actors
    timing at once (and would have waited for a node with the machine's GPUs as Ray's)."""
    from cluster.pool import pool_config_for

    spec = MeasurerSpec("openvino", synthetic_graph(20, seed=1), load_machine("cpu-igpu"), runs=1, warmup=0)
    config = pool_config_for(spec, workers=3)
    assert (config.num_cpu_actors, config.cpu_actor_threads, config.use_gpus, config.chunk_size) == (
        1, os.cpu_count(), False, 1)


def test_pool_config_for__simulating_pools_share_the_gpu_nodes_real_ones_hold_their_gpus(cluster):
    """A simulator's actors held every GPU of their nodes, so a second search that simulates waited for the
    first's nodes (and gave up after 120 s) although neither used a GPU."""
    from cluster.pool import pool_config_for

    spec = MeasurerSpec("sim", synthetic_graph(20, seed=1), load_machine("paper-4gpu"))
    config = pool_config_for(spec)
    assert config.node_labels == {"placer/role": "measurer"} and not config.hold_gpus
    assert pool_config_for(dataclasses.replace(spec, kind="torch")).hold_gpus  # its steps run on the GPUs
    gpu_node_ids = {n.node_id for n in gpu_nodes()}
    with MeasurerPool(spec, config, start_timeout_s=20) as first, \
            MeasurerPool(spec, config, start_timeout_s=20) as second:
        for pool in (first, second):  # both at once: each node of 4 GPUs hosts an actor of each pool
            assert {i.node_id for i in pool.actors} == gpu_node_ids and all(not i.gpu_ids for i in pool.actors)
            assert [m.status for m in pool.measure([np.zeros(20, dtype=np.int64)])] == ["ok"]


def test_pool__a_collected_or_repeated_ticket_is_refused_not_waited_for(cpu_pool):
    """as_completed of a ticket that gather had collected waited forever; gather([t, t]) was a bare KeyError."""
    (ticket,) = cpu_pool.submit(_placements(1))
    with pytest.raises(PlacerError, match=rf"tickets given more than once: \[{ticket}\]"):
        cpu_pool.gather([ticket, ticket])
    assert cpu_pool.gather([ticket])[0].ticket == ticket
    with pytest.raises(PlacerError, match=rf"unknown or already collected tickets: \[{ticket}\]"):
        next(cpu_pool.as_completed([ticket]))
