"""The baselines job (``placer baselines``): every named non-learned policy scored side by side by one
measurer (the simulator in this process, or the Ray pool for real measurers), optionally logged."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster.jobs.config import BASELINES_FILE, BaselinesConfig, check_counts
from cluster.runlog import RunLogWriter, make_run_id, new_manifest, write_text_atomic
from graphs.errors import PlacerError


@dataclass
class BaselinesOutcome:
    table: object  # policies.table.BaselineTable
    groups: int  # the groups the searches placed (at most config.groups)
    colocation_groups: int  # the graph's: no grouping makes more groups than these
    run_dir: Path | None

    def to_json(self) -> dict:
        return {**self.table.to_json(), "groups": self.groups, "colocation_groups": self.colocation_groups}



def run_baselines(config: BaselinesConfig) -> BaselinesOutcome:
    """Score every policy of ``config`` side by side through one measurer; log it when ``out`` is set."""
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.factory import MeasurerSpec, build_measurer
    from policies.problem import make_problem
    from policies.registry import BASELINES, policy_entry
    from policies.table import run_baselines as run_table

    policies = BASELINES if config.policies is None else config.policies
    if not policies:
        raise PlacerError("--policies names no policy")
    for name in policies:
        policy_entry(name)  # unknown names fail before any work
    check_counts(config.budget, config.groups, config.grouping)
    graph, machine = load_graph(config.graph), load_machine(config.machine)
    problem = make_problem(graph, machine, max_groups=config.groups, grouping_method=config.grouping,
                           seed=config.seed)
    spec = MeasurerSpec(config.measurer, graph, machine, runs=config.runs, warmup=config.warmup, seed=config.seed)
    log = _open_baselines_log(config, graph, machine, policies, spec) if config.out else None
    pool, finished = None, False
    try:
        measurer = build_measurer(spec) if config.measurer == "sim" else _real_pool(spec, config.ray_address)
        pool = None if config.measurer == "sim" else measurer
        table = run_table(problem, measurer, policies, config.budget, config.seed,
                          on_measurement=None if log is None else _baseline_logger(log))
        finished = True
    finally:
        if log is not None:
            log.close(compact=finished)
        if pool is not None:
            from cluster import ray_setup

            pool.close()
            ray_setup.shutdown_ray()
    outcome = BaselinesOutcome(table, problem.num_units, graph.num_colocation_groups,
                               None if log is None else log.folder)
    if log is not None:
        write_text_atomic(log.folder / BASELINES_FILE, json.dumps(outcome.to_json(), indent=2))
    return outcome



def _real_pool(spec, ray_address: str | None):
    """A measurer pool running the real PyTorch/TensorFlow measurer on every node (one placement per call,
    so a time limit applies to one placement)."""
    from cluster import ray_setup
    from cluster.pool import MeasurerPool, PoolConfig

    ray_setup.init_ray(ray_address)
    try:
        return MeasurerPool(spec, PoolConfig(chunk_size=1))
    except BaseException:
        ray_setup.shutdown_ray()
        raise



def _open_baselines_log(config: BaselinesConfig, graph, machine, policies, spec) -> RunLogWriter:
    manifest = new_manifest(make_run_id(graph.name, "baselines", config.seed), graph, machine, seed=config.seed,
                            policy="baselines", config={**asdict(config), "policies": list(policies)},
                            runs=spec.runs, warmup=spec.warmup)
    return RunLogWriter.create(config.out, manifest)



def _baseline_logger(log: RunLogWriter):
    """on_measurement for the baselines table: one run-log row per measurement, tagged with the policy."""
    from cluster.pool import PoolResult
    from cluster.runlog import LoggedPlacement

    counter = iter(range(1 << 62))

    def record(policy, placement, measurement):  # placement: the (N,) op placement measured
        now = time.time()
        log.append(PoolResult(next(counter), placement, measurement, "", "", now, now, now, policy=policy,
                              log_placement=LoggedPlacement(placement, "op")))

    return record
