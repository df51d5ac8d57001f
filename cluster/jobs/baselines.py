"""The baselines job (``placer baselines``): every named non-learned policy scored side by side by one
measurer (the simulator in this process, or the Ray pool for real measurers), optionally logged."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

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
    """Score every policy of ``config`` side by side through one measurer; log it when ``out`` is set.
    Bad input (a name, a count, a measurer that cannot run the graph, an unreachable cluster) fails before
    the log is written."""
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.factory import MeasurerSpec
    from policies.problem import make_problem
    from policies.registry import baseline_names, policy_entry
    from policies.table import run_baselines as run_table

    policies = baseline_names() if config.policies is None else config.policies
    if not policies:
        raise PlacerError("--policies names no policy")
    for name in policies:
        if policy_entry(name).learned:  # unknown names fail here too, before any work
            raise PlacerError(f"--policies: {name!r} is a learned policy; placer search --policy {name} runs it")
    check_counts(config.budget, config.groups, config.grouping)
    graph, machine = load_graph(config.graph), load_machine(config.machine)
    problem = make_problem(graph, machine, max_groups=config.groups, grouping_method=config.grouping,
                           seed=config.seed)
    spec = MeasurerSpec(config.measurer, graph, machine, runs=config.runs, warmup=config.warmup, seed=config.seed)
    with _measurer(spec, config.ray_address) as measurer:
        log = _open_baselines_log(config, graph, machine, policies, spec, problem) if config.out else None
        finished = False
        try:
            table = run_table(problem, measurer, policies, config.budget, config.seed,
                              on_measurement=None if log is None else _baseline_logger(log))
            finished = True
        finally:
            if log is not None:
                log.close(compact=finished)
    outcome = BaselinesOutcome(table, problem.num_units, graph.num_colocation_groups,
                               None if log is None else log.folder)
    if log is not None:
        write_text_atomic(log.folder / BASELINES_FILE, json.dumps(outcome.to_json(), indent=2))
    return outcome


@contextmanager
def _measurer(spec, ray_address: str | None) -> Iterator:
    """The simulator in this process, or a pool running the real measurer on every node (one placement per
    call, so a time limit applies to one placement); Ray is shut down after only if it was started here."""
    from measurers.factory import build_measurer

    if spec.kind == "sim":
        yield build_measurer(spec)
        return
    import ray

    from cluster import ray_setup
    from cluster.pool import MeasurerPool, PoolConfig

    owns_ray = not ray.is_initialized()
    ray_setup.init_ray(ray_address)
    try:
        with MeasurerPool(spec, PoolConfig(chunk_size=1)) as pool:
            yield pool
    finally:
        if owns_ray:
            ray_setup.shutdown_ray()


def _open_baselines_log(config: BaselinesConfig, graph, machine, policies, spec, problem) -> RunLogWriter:
    manifest = new_manifest(make_run_id(graph.name, "baselines", config.seed), graph, machine, seed=config.seed,
                            policy="baselines", config={**asdict(config), "policies": list(policies)},
                            runs=spec.runs, warmup=spec.warmup, lower_bound_s=problem.lower_bound_s)
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
