"""The pool's start, without Ray: how long it waits for its actors, and what it raises when none started."""

from __future__ import annotations

import pytest

import cluster.pool as pool_module
from cluster.pool import LostNode, MeasurerPool, MeasurersLost, PoolConfig, _Slot
from graphs.errors import PlacerError
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.factory import MeasurerSpec, as_factory


@pytest.mark.parametrize("kind, waited_s", [("torch", 120.0 + 600.0), ("sim", 120.0)])
def test_pool__a_real_measurers_actors_get_one_placements_limit_more_to_build_their_step(monkeypatch, kind,
                                                                                        waited_s):
    """The jobs hand the pool as_factory(spec), a SpecFactory: it was taken for a factory of no known kind, so a
    torch or tf actor whose step took over 120 s to build counted as never started (each build may take 600 s)."""
    waits = []
    monkeypatch.setattr(pool_module.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(pool_module.ray, "put", lambda value: value)
    monkeypatch.setattr(MeasurerPool, "_gpu_nodes", lambda self: [])
    monkeypatch.setattr(MeasurerPool, "_add_slots", lambda self: None)
    monkeypatch.setattr(MeasurerPool, "wait_ready", lambda self, timeout_s: waits.append(timeout_s))
    spec = MeasurerSpec("sim", synthetic_graph(20, 0), load_machine("paper-2gpu"), timeout_s=600.0)
    factory = as_factory(spec)  # built in the driver for a real kind: the sim spec stands in, its kind swapped
    object.__setattr__(factory.spec, "kind", kind)
    pool = MeasurerPool(factory, PoolConfig())
    assert waits == [waited_s] and pool.timeout_s == 600.0


def _pool_with(slots: list[_Slot], lost: list[LostNode]) -> MeasurerPool:
    pool = object.__new__(MeasurerPool)
    pool._slots, pool._lost, pool._last_error, pool._closed, pool.run_log = slots, lost, "", False, None
    pool.config, pool._gpu_mode = PoolConfig(poll_interval_s=0.01), True
    return pool


def test_pool__every_node_gone_before_its_actor_started_is_measurers_lost_not_bad_input():
    """Nodes removed while the pool started: a plain PlacerError, exit 2 and no JSON document, where the
    same loss a moment later stops the search as "measurers_lost" (exit 1, its document printed)."""
    slots = [_Slot("node:aaaa", "a" * 32, 4, retired=True), _Slot("node:bbbb", "b" * 32, 4, retired=True)]
    pool = _pool_with(slots, [LostNode(s.node_id, s.name, 4, 0.0, "left") for s in slots])
    pool._last_error = "node bbbbbbbb left the cluster"
    with pytest.raises(MeasurersLost, match="no measurer actor started: node bbbbbbbb left the cluster"):
        pool.wait_ready(1.0)
    failed = _pool_with([_Slot("node:aaaa", "a" * 32, 4, retired=True)], [])  # its actor failed to start
    with pytest.raises(PlacerError) as error:
        failed.wait_ready(1.0)
    assert not isinstance(error.value, MeasurersLost)
    with pytest.raises(PlacerError) as error:  # no node to start an actor on at all (each held by another job)
        _pool_with([], []).wait_ready(1.0)
    assert not isinstance(error.value, MeasurersLost)
