"""The baselines job (``placer baselines``): every named non-learned policy scored side by side by one
measurer (the simulator in this process, or the Ray pool for real measurers), optionally logged."""

from __future__ import annotations

import json
import math
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from cluster.jobs.config import (BASELINES_FILE, BASELINES_POLICY, BaselinesConfig, check_bound_time_limit,
                                 check_counts, check_measurer_settings, check_policy_groups, check_unique)
from cluster.runlog import (RunLogWriter, RunManifest, make_run_id, new_manifest, record_proven_bound,
                           write_text_atomic)
from graphs.errors import PlacerError, check_seed
from graphs.files import atomic_folder
from measurers.base import Measurement


@dataclass
class BaselinesOutcome:
    table: object  # policies.table.BaselineTable
    groups: int  # the groups the searches placed (at most config.groups)
    colocation_groups: int  # the graph's: no grouping makes more groups than these
    run_dir: Path | None
    bound: object = None  # policies.exact.bound.BoundReport for the searches' groups (`placer bound`'s)
    proven_bound: tuple[float, str] | None = None  # (seconds, what it holds for): bound's, raised to an exact
    # row's own where that holds for every placement of the same groups (as a search's is: solver_raised_bound)
    grouping: str = ""  # the method that made the groups (scope falls back to metis on a graph without scopes)

    def to_json(self) -> dict:
        data = {**self.table.to_json(), "groups": self.groups, "colocation_groups": self.colocation_groups}
        if self.bound is not None:
            from cluster.jsonout import json_safe

            data["proven_bound_s"], data["proven_bound_holds_for"] = self.proven_bound
            data["proven_bound"] = json_safe(self.bound.to_json())  # `placer bound`'s report, before raising
            for row, result in zip(data["results"], self.table.rows):
                ratio = ratio_to_proven_bound(result, self.proven_bound)
                row["ratio_to_proven_bound"] = ratio if math.isfinite(ratio) else None
        return data


def ratio_to_proven_bound(row, bound: tuple[float, str] | None) -> float:
    """A baseline row's step over the proven bound (seconds, what it holds for); nan unless the row ran ok
    (the bound holds for placements that fit in memory: an out-of-memory row's step is no such placement's)."""
    if bound is None or row.status != "ok" or not (bound[0] > 0 and math.isfinite(bound[0])):
        return math.nan
    return row.runtime_s / bound[0]


def _raised_bound(bound: tuple[float, str], table, problem, measurer: str) -> tuple[float, str]:
    """``bound`` (of ``problem``'s groups) raised as a search's is (solver_raised_bound) by each row whose
    policy placed those very groups (exact: every search does; a heuristic or a learner that groups the graph
    itself places other groups, whose solver bound would not hold for these)."""
    from cluster.jobs.search import SolverFigures, solver_raised_bound
    from policies.registry import policy_entry

    for row in table.rows:
        if row.result is not None and policy_entry(row.policy).places_groups:
            bound = solver_raised_bound(bound, SolverFigures.of(row.result), problem, measurer)
    return bound


def _options(config: BaselinesConfig) -> dict[str, dict]:
    """What a policy of the table is told of the measurer: exact's bounds hold for the noise-free simulator."""
    return {"exact": {"noise_free": config.measurer == "sim"}}  # (baselines' simulator has no noise)


def run_baselines(config: BaselinesConfig) -> BaselinesOutcome:
    """Score every policy of ``config`` side by side through one measurer; log it when ``out`` is set.
    Bad input (a name, a count, a measurer that cannot run the graph, an unreachable cluster) fails before
    the log is written; a failure while the policies run leaves no run folder (``atomic_folder``: a baselines
    run cannot be resumed)."""
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.factory import MeasurerSpec, as_factory
    from policies.problem import make_problem
    from policies.registry import baseline_names, check_device_policies, policy_entry
    from policies.table import run_baselines as run_table

    policies = baseline_names() if config.policies is None else config.policies
    if not policies or "" in policies:
        raise PlacerError(f"--policies {','.join(policies)!r}: an empty name (names are separated by single commas)"
                          if policies else "--policies names no policy")
    check_unique(policies, "--policies")
    for name in policies:
        if policy_entry(name).learned:  # unknown names fail here too, before any work
            raise PlacerError(f"--policies: {name!r} is a learned policy; placer search --policy {name} runs it")
    check_counts(config.budget, config.groups, config.grouping)
    for name in policies:
        check_policy_groups(name, config.groups)
    check_bound_time_limit(config.bound_time_limit_s)
    check_measurer_settings(config.measurer, config.runs, config.warmup)
    check_seed(config.seed, "--seed")
    graph, machine = load_graph(config.graph), load_machine(config.machine)
    check_device_policies(policies, machine, "--policies")
    spec = MeasurerSpec(config.measurer, graph, machine, runs=config.runs, warmup=config.warmup, seed=config.seed)
    factory = as_factory(spec)  # a real measurer that cannot run this graph here fails now, before the bound and Ray
    problem = make_problem(graph, machine, max_groups=config.groups, grouping_method=config.grouping,
                           seed=config.seed)
    problem.unit_allowed  # a group no device of the machine may run is one error, as search says (every row skipped)
    from cluster.jobs.bound_solve import proven_bound_once
    from cluster.jobs.search import bound_of_measured_steps
    from policies.exact.bound import grouping_method

    bound = bound_of_measured_steps(proven_bound_once(problem, config.bound_time_limit_s),  # the searches' groups
                                    config.measurer)
    proven = (float(bound.best_s), bound.holds_for)
    with _measurer(spec, factory, config.ray_address) as measurer:
        if not config.out:
            table = run_table(problem, measurer, policies, config.budget, config.seed, options=_options(config))
            raised = _raised_bound(proven, table, problem, config.measurer)
            return BaselinesOutcome(table, problem.num_units, graph.num_colocation_groups, None, bound, raised,
                                    grouping_method(problem))
        from policies.rl.env import reward_of  # -sqrt(runtime), failures at the default penalty

        manifest = _baselines_manifest(config, graph, machine, policies, spec, problem, proven)
        with atomic_folder(Path(config.out), manifest.run_id) as staging:
            log = RunLogWriter.create(staging, manifest, reward_fn=reward_of)  # a search's reward, as its log has
            finished = False
            try:
                table = run_table(problem, measurer, policies, config.budget, config.seed,
                                  on_measurement=_baseline_logger(log, measurer), options=_options(config))
                finished = True
            finally:
                log.close(compact=finished)
            raised = _raised_bound(proven, table, problem, config.measurer)
            if raised is not proven:  # the manifest too, so that analyze reads the same
                record_proven_bound(log.folder, *raised)
            outcome = BaselinesOutcome(table, problem.num_units, graph.num_colocation_groups,
                                       Path(config.out) / manifest.run_id, bound, raised, grouping_method(problem))
            write_text_atomic(log.folder / BASELINES_FILE, json.dumps(outcome.to_json(), indent=2))
    return outcome


@contextmanager
def _measurer(spec, factory, ray_address: str | None) -> Iterator:
    """The simulator in this process, or a pool running the real measurer (``factory``, already checked in
    the driver) on every node (one placement per call, so a time limit applies to one placement); Ray is shut
    down after only if it was started here."""
    from measurers.factory import build_measurer

    if spec.kind == "sim":
        if ray_address:  # unused by the simulator, but a named cluster nothing answers on is still a mistake
            from cluster.ray_setup import check_reachable
            check_reachable(ray_address)
        yield build_measurer(spec)
        return
    import ray

    from cluster import ray_setup
    from cluster.pool import MeasurerPool, pool_config_for

    owns_ray = not ray.is_initialized()
    ray_setup.init_ray(ray_address)
    try:
        with MeasurerPool(factory, pool_config_for(spec)) as pool:  # nodes with the machine's GPUs, or an error
            yield PoolResults(pool)
    finally:
        if owns_ray:
            ray_setup.shutdown_ray()


def _baselines_manifest(config: BaselinesConfig, graph, machine, policies, spec, problem,
                        bound: tuple[float, str]) -> RunManifest:
    manifest = new_manifest(make_run_id(graph.name, BASELINES_POLICY, config.seed, root=config.out), graph,
                            machine, seed=config.seed, policy=BASELINES_POLICY,
                            config={**asdict(config), "policies": list(policies)},
                            runs=spec.runs, warmup=spec.warmup, lower_bound_s=problem.lower_bound_s)
    return replace(manifest, proven_bound_s=float(bound[0]), proven_bound_holds_for=bound[1])


class PoolResults:
    """The pool as a Measurer that keeps the PoolResults of its last call (cache hit, actor, node, times): the
    baselines table reports Measurements alone, and its log needs the rest. The table's ``on_measurement``
    is called for each placement of a call, in order, before the next call."""

    def __init__(self, pool):
        self.pool = pool
        self.last: deque = deque()  # the last call's PoolResults not yet logged

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        self.last = deque(self.pool.measure_results(placements))
        return [result.measurement for result in self.last]


def _baseline_logger(log: RunLogWriter, measurer):
    """on_measurement for the baselines table: one run-log row per measurement, tagged with the policy; the
    pool's own result where ``measurer`` is the pool (PoolResults), else one measured in this process."""
    from cluster.runlog import LoggedPlacement

    def record(policy, placement, measurement):  # placement: the (N,) op placement measured
        if isinstance(measurer, PoolResults):
            result = measurer.last.popleft()
        else:
            result = _measured_here(placement, measurement)
        log.append(replace(result, policy=policy, log_placement=LoggedPlacement(placement, "op")))

    return record


def _measured_here(placement: np.ndarray, measurement: Measurement):
    """The PoolResult of a measurement made in this process as it was asked: submitted and started then."""
    from cluster.pool import PoolResult

    now = time.time()
    began = now - measurement.measure_s
    return PoolResult(-1, placement, measurement, "", "", began, began, now)
