"""The jobs every command runs; the commands (cluster/commands/) only parse arguments and print.

``run_search`` (``placer search``, and each row of ``placer reproduce``): graph + machine + policy +
measurer + budget -> a run folder and the best placement::

    load graph and machine, group the graph           (graphs/, measurers/)
    start or join Ray, start the measurer pool        (cluster/pool.py)
    score the quick baselines through the pool        (policies/table.py)
    run the policy through policies.registry.place  (learned or not; learned ones get a RunContext)
      every batch goes to the pool in one call, every result into the run log
    final table against the baselines and the lower bound; the run log is compacted on a clean finish

``run_baselines`` (``placer baselines``): every named non-learned policy scored side by side by one
measurer (the simulator in this process, or the pool for real measurers), optionally logged.

The run folder is the run log of cluster/runlog.py plus ``checkpoint/`` (the learner) and
``grouping.npz``. ``resume`` continues a stopped run: the learner's weights and RNG come back from the
checkpoint, and placements already in the log are answered from it instead of being measured again. Its
settings come from its manifest except those given explicitly (``search_config``, ``resume_config``):
a higher budget or a time limit is recorded in the manifest, a change of what it searches is refused.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from cluster.runlog import (RESULT_FILE, RunLogWriter, make_run_id, new_manifest, read_manifest, read_run,
                            record_resume, write_text_atomic)
from graphs.errors import PlacerError
from graphs.grouping import DEFAULT_MAX_GROUPS, DEFAULT_METHOD
from measurers.base import Measurement
from measurers.timing import default_timing

QUICK_BASELINES = ("single-gpu", "expert", "m-etf")
GROUPING_FILE = "grouping.npz"
BASELINES_FILE = "baselines.json"
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_EVERY = 10  # learner iterations between checkpoints (one per iteration cost as much as the update)


@dataclass
class SearchConfig:
    graph: str = "nmt-2"
    """Benchmark name or graph file."""
    machine: str = "paper-2gpu"
    """Catalog machine name or machine file."""
    policy: str = "reinforce"
    """reinforce | ppo | any baseline policy name (policies.registry.POLICIES)."""
    measurer: str = "sim"
    """sim | torch | tf."""
    budget: int = 2048
    """Measurements the policy may spend (baselines are scored on top of it, one each)."""
    time_limit_s: float | None = None
    """Stop the policy after this many seconds (checked between batches)."""
    workers: int = 2
    """Measurer actors when the cluster has no GPU node."""
    batch: int = 16
    """Placements the learner samples and measures per iteration."""
    groups: int = DEFAULT_MAX_GROUPS
    """Groups the graph is coarsened to; searches and learners place groups (graphs.grouping)."""
    grouping: str = DEFAULT_METHOD
    """How ops become groups (graphs.grouping METHODS)."""
    seed: int = 0
    runs: int | None = None
    """Timed runs per placement (median reported); None: measurers.timing.default_timing."""
    warmup: int | None = None
    """Untimed runs before the timed ones; None: measurers.timing.default_timing."""
    noise_std: float = 0.0
    """Simulator only: relative noise of each timed run (0 = exact)."""
    ray_address: str | None = None
    out: str = "runs"
    """Folder the run folder is made in."""
    resume: str | None = None
    """A run folder to continue (its manifest's settings win over the ones here)."""
    baselines: tuple[str, ...] = QUICK_BASELINES
    hidden_size: int = 256
    """Learner width (see policies.rl.loop.RLConfig)."""


@dataclass
class BaselineOutcome:
    policy: str
    runtime_s: float  # nan when it did not apply
    status: str


@dataclass
class SearchResult:
    run_dir: Path
    graph: str
    machine: str
    policy: str
    best_runtime_s: float  # over everything measured in the run (policy and baselines)
    best_source: str  # which policy found it
    policy_best_runtime_s: float  # the searched policy's own best
    measurements: int  # measured by the policy in this run, resumed part included
    lower_bound_s: float
    baselines: list[BaselineOutcome]
    stop_reason: str
    wall_s: float
    seconds_per_update: float = math.nan  # learner only
    groups: int = 0  # groups the policy placed: at most config.groups and the graph's colocation groups
    colocation_groups: int = 0  # the graph's colocation groups (the most groups any grouping makes)

    def to_json(self) -> dict:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        data["baselines"] = {b.policy: (None if math.isnan(b.runtime_s) else b.runtime_s) for b in self.baselines}
        data["baseline_status"] = {b.policy: b.status for b in self.baselines}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}


@dataclass
class PastRows:
    """What the log of a resumed run already holds."""
    known: dict[bytes, Measurement] = field(default_factory=dict)
    """Op placement bytes -> its measurement (rows that were measured, not cache hits)."""
    logged: Counter = field(default_factory=Counter)
    """(policy, iteration, op placement bytes) -> rows: what a replayed iteration must not log again."""


class LoggedPoolMeasurer:
    """The Measurer a policy sees: sends each batch to the pool in one call, tags it with the policy and
    iteration (one per call, from ``first_iteration``: a learner resumed from a checkpoint goes on from
    there), logs group placements, and answers placements already in the log of a resumed run.

    Such a placement is not measured again. If the log holds it under this policy and iteration (the
    learner replays the iterations after its checkpoint) it is not logged again either; otherwise it is
    logged as a cache hit, as the pool logs a placement met twice in one session. So a resumed run's log
    holds the rows a run never stopped would hold, each once."""

    def __init__(self, pool, problem, policy: str, past: PastRows | None = None,
                 on_batch: Callable[[Sequence[Measurement]], None] | None = None, *,
                 log: RunLogWriter | None = None, first_iteration: int = 0):
        self.pool, self.problem, self.policy = pool, problem, policy
        self.past = past or PastRows()
        self.on_batch = on_batch
        self.log = log
        self.iteration = first_iteration

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        batch = [np.ascontiguousarray(p, dtype=np.int64) for p in placements]  # B x (N,)
        out: list[Measurement | None] = [self._from_log(p) for p in batch]
        todo = [i for i, m in enumerate(out) if m is None]
        if todo:
            results = self.pool.measure_results(
                [batch[i] for i in todo], policy=self.policy, iteration=self.iteration,
                log_placements=[log_placement(self.problem, batch[i]) for i in todo])
            for i, result in zip(todo, results):
                out[i] = result.measurement
        self.iteration += 1
        if self.on_batch is not None:
            self.on_batch(out)
        return out

    def _from_log(self, placement: np.ndarray) -> Measurement | None:
        """The logged measurement of ``placement`` (None: not measured yet), logging it as a cache hit
        unless this iteration logged it before the resume."""
        measurement = self.past.known.get(placement.tobytes())
        if measurement is None:
            return None
        slot = (self.policy, self.iteration, placement.tobytes())
        if self.past.logged[slot] > 0:
            self.past.logged[slot] -= 1
        elif self.log is not None:
            self._log_cache_hit(placement, measurement)
        return measurement

    def _log_cache_hit(self, placement: np.ndarray, measurement: Measurement) -> None:
        from cluster.pool import PoolResult

        now = time.time()
        self.log.append(PoolResult(-1, placement, measurement, "", "", now, now, now, cache_hit=True,
                                   policy=self.policy, iteration=self.iteration,
                                   log_placement=log_placement(self.problem, placement)))


def log_placement(problem, op_placement: np.ndarray):
    """What a log row records (a ``cluster.runlog.LoggedPlacement``): the (G,) group placement, level
    "group", when every group sits on one device, else the (N,) op placement, level "op" (a baseline that
    splits groups)."""
    from cluster.runlog import LoggedPlacement

    groups = problem.collapse(op_placement)
    if np.array_equal(problem.expand(groups), op_placement):
        return LoggedPlacement(groups, "group")
    return LoggedPlacement(np.asarray(op_placement, dtype=np.int64), "op")


def expand_logged(problem, logged: np.ndarray, level: str | None = None) -> np.ndarray:
    """Inverse of log_placement: the (N,) op placement of a logged row. ``level`` is the row's
    placement_level; None (a log of format version 1) tells the levels apart by length."""
    from cluster.runlog import placement_level_by_length

    logged = np.asarray(logged, dtype=np.int64)
    num_ops = problem.graph.num_ops
    level = placement_level_by_length(len(logged), num_ops) if level is None else level
    expected = num_ops if level == "op" else problem.num_units
    if len(logged) != expected:
        raise PlacerError(f"a logged {level} placement has {len(logged)} entries; this problem has {expected}")
    return logged if level == "op" else problem.expand(logged)


def past_rows(run_dir: Path, problem) -> PastRows:
    """What a resumed run's log holds: the placements it measured and its rows per policy and iteration."""
    past = PastRows()
    for row in read_run(run_dir).itertuples():
        key = expand_logged(problem, row.placement, row.placement_level).tobytes()
        past.logged[(row.policy, int(row.iteration), key)] += 1
        if not row.cache_hit:
            past.known[key] = Measurement(
                float(row.runtime_s), tuple(row.samples_s), row.status, tuple(int(b) for b in row.peak_bytes),
                float(row.measure_s), row.error or "")
    return past


def run_search(config: SearchConfig, progress=None, should_stop: Callable[[], bool] | None = None,
               command: Sequence[str] | None = None) -> SearchResult:
    """Run one search to the end (budget, time limit, ``should_stop`` or Ctrl-C) and return its result.
    ``progress(measured, best_runtime_s, lower_bound_s)`` is called after every batch."""
    from cluster import ray_setup
    from cluster.pool import MeasurerPool, PoolConfig
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.factory import MeasurerSpec
    from policies.rl.env import reward_of

    started = time.perf_counter()
    if config.resume:
        config = resume_config(config.resume, asdict(config))
    check_search_config(config)
    graph, machine = load_graph(config.graph), load_machine(config.machine)
    problem = _problem(graph, machine, config)
    writer, past = _open_run(config, graph, machine, problem, command, reward_of)
    run_dir = writer.folder
    import ray

    owns_ray = not ray.is_initialized()  # a caller that runs many searches keeps one Ray for all
    ray_setup.init_ray(config.ray_address)
    real = config.measurer != "sim"
    spec = MeasurerSpec(config.measurer, graph, machine, noise_std=config.noise_std, seed=config.seed,
                        runs=config.runs, warmup=config.warmup)  # None: measurers.timing.default_timing
    pool = None
    stop_reason = "interrupted"
    try:
        pool_config = PoolConfig(num_cpu_actors=config.workers, chunk_size=1 if real else 64)
        pool = MeasurerPool(spec, pool_config, run_log=writer)
        baselines = _score_baselines(problem, pool, config, past, writer)
        outcome = _run_policy(problem, pool, config, past, run_dir, writer, progress, should_stop)
        stop_reason = outcome.stop_reason
    except KeyboardInterrupt:
        outcome, baselines = None, []
    finally:
        if pool is not None:
            pool.close()
        writer.close(compact=stop_reason != "interrupted")  # a stopped run keeps its parts for --resume
        if owns_ray:
            ray_setup.shutdown_ray()
    if outcome is None:
        raise KeyboardInterrupt(f"search interrupted; the run log is complete up to now in {run_dir}")
    result = _result(config, run_dir, problem, baselines, outcome, stop_reason, time.perf_counter() - started)
    _write_result(run_dir, result)
    return result


def _write_result(run_dir: Path, result: SearchResult) -> None:
    """``result.json``: marks the run finished (readers and `placer reproduce` look for it)."""
    write_text_atomic(run_dir / RESULT_FILE, json.dumps(result.to_json(), indent=2))


def check_search_config(config: SearchConfig) -> None:
    """Every setting of a search, checked before anything starts (no Ray, no graph built, nothing
    written): bad input is one PlacerError before ``placer search`` draws its progress bar.
    ``run_search`` calls it too."""
    from graphs.registry import check_graph_name
    from measurers.catalog import load_machine
    from policies.registry import policy_entry

    check_graph_name(config.graph)
    load_machine(config.machine)  # a small JSON file (or this process's devices): cheap to read twice
    policy_entry(config.policy)
    _check_counts(config.budget, config.groups, config.grouping)
    _check_search_numbers(config)
    if config.resume and not (Path(config.resume) / GROUPING_FILE).is_file():
        raise PlacerError(f"run folder {config.resume} has no {GROUPING_FILE}: not a search run")


def _check_search_numbers(config: SearchConfig) -> None:
    from measurers.factory import MEASURER_KINDS

    if config.measurer not in MEASURER_KINDS:
        raise PlacerError(f"--measurer: unknown measurer {config.measurer!r} (known: {', '.join(MEASURER_KINDS)})")
    if config.batch < 2:
        raise PlacerError(f"--batch must be at least 2, got {config.batch}")
    if config.time_limit_s is not None and not config.time_limit_s > 0:
        raise PlacerError(f"--time-limit must be positive, got {config.time_limit_s}")
    if config.workers < 1:
        raise PlacerError(f"--workers must be at least 1, got {config.workers}")
    if config.runs is not None and config.runs < 1:
        raise PlacerError(f"--runs must be at least 1, got {config.runs}")
    if config.warmup is not None and config.warmup < 0:
        raise PlacerError(f"--warmup must not be negative, got {config.warmup}")
    if not config.noise_std >= 0:
        raise PlacerError(f"--noise must not be negative, got {config.noise_std}")


def _problem(graph, machine, config: SearchConfig):
    from graphs.grouping import Grouping
    from policies.problem import make_problem

    problem = make_problem(graph, machine, max_groups=config.groups, grouping_method=config.grouping,
                           seed=config.seed)
    if config.resume:
        path = Path(config.resume) / GROUPING_FILE
        if not path.is_file():
            raise PlacerError(f"run folder {config.resume} has no {GROUPING_FILE}: not a search run")
        with np.load(path) as arrays:
            grouping = Grouping.from_arrays(dict(arrays))
        if len(grouping.op_group) != graph.num_ops:
            raise PlacerError(f"run folder {config.resume} grouped {len(grouping.op_group)} ops; "
                              f"graph {graph.name!r} has {graph.num_ops}")
        problem = replace(problem, op_unit=grouping.op_group, grouping=grouping)
    return problem


def _open_run(config: SearchConfig, graph, machine, problem, command, reward_of):
    from policies.rl.env import DEFAULT_PENALTY_RUNTIME_S

    def reward_fn(measurement):
        return reward_of(measurement, DEFAULT_PENALTY_RUNTIME_S)

    if config.resume:
        run_dir = Path(config.resume)
        manifest = read_manifest(run_dir)
        if manifest.graph_hash != graph.content_hash:
            raise PlacerError(f"run folder {run_dir} was made for graph hash {manifest.graph_hash}, "
                              f"but {config.graph!r} now has hash {graph.content_hash}")
        past = past_rows(run_dir, problem)
        record_resume(run_dir, _resume_changes(manifest, config), command)  # every check passed: note it
        (run_dir / RESULT_FILE).unlink(missing_ok=True)  # running again: not finished until it ends
        return RunLogWriter.resume(run_dir, reward_fn=reward_fn), past
    run_id = make_run_id(graph.name, config.policy, config.seed)
    timing = default_timing(config.measurer)
    manifest = new_manifest(run_id, graph, machine, seed=config.seed, policy=config.policy,
                            runs=timing.runs if config.runs is None else config.runs,
                            warmup=timing.warmup if config.warmup is None else config.warmup,
                            config={**asdict(config), "groups_used": problem.num_units}, command=command,
                            lower_bound_s=problem.lower_bound_s)
    writer = RunLogWriter.create(config.out, manifest, reward_fn=reward_fn)
    writer.write_groups(problem.op_unit, graph.op_names)
    np.savez(writer.folder / GROUPING_FILE, **problem.grouping.to_arrays())
    return writer, PastRows()


SESSION_SETTINGS = ("workers", "ray_address", "out")
"""Settings a resume may give for its own session only: how it measures, not what (a resumed run stays
in its folder, so ``out`` does nothing)."""
GROWABLE_SETTINGS = ("budget", "time_limit_s")
"""Settings a resume may change for the rest of the run (recorded in the manifest): the budget only
upwards; the time limit bounds each session from its start."""
FLAG_NAMES = {"time_limit_s": "--time-limit", "noise_std": "--noise"}


def search_config(given: Mapping[str, object]) -> SearchConfig:
    """The search the user asked for: ``given`` holds only the settings given explicitly (a command's
    flags that were on its command line). A new run takes SearchConfig's defaults for the rest; a resumed
    one (``resume`` given) takes them from its manifest (see ``resume_config``)."""
    if given.get("resume"):
        return resume_config(str(given["resume"]), given)
    return SearchConfig(**given)


def resume_config(run_dir: str | Path, given: Mapping[str, object]) -> SearchConfig:
    """A stopped run's settings from its manifest, with the settings in ``given`` applied: session
    settings (SESSION_SETTINGS) for this session, a higher budget or a time limit for the rest of the run;
    a value that would change what the run searches (graph, machine, policy, seed, measurer, batch,
    groups, ...) is one PlacerError. A given value equal to the manifest's is no change."""
    saved = _saved_config(read_manifest(run_dir))
    changes = {}
    for name, value in given.items():
        if name == "resume":
            continue
        value = tuple(value) if name == "baselines" else value
        if value == getattr(saved, name) or name in SESSION_SETTINGS:
            changes[name] = value
        elif name in GROWABLE_SETTINGS:
            changes[name] = _grown(name, value, saved, run_dir)
        else:
            raise PlacerError(f"{_flag(name)} {value!r}: run {run_dir} searches with {getattr(saved, name)!r}, "
                              f"and a resumed run keeps it (start a new run to change it)")
    return replace(saved, resume=str(run_dir), **changes)


def _saved_config(manifest) -> SearchConfig:
    saved = dict(manifest.config)
    saved["baselines"] = tuple(saved.get("baselines", QUICK_BASELINES))
    names = SearchConfig.__dataclass_fields__
    return SearchConfig(**{k: v for k, v in saved.items() if k in names})


def _grown(name: str, value, saved: SearchConfig, run_dir) -> object:
    if name == "budget" and value < saved.budget:
        raise PlacerError(f"--budget {value}: run {run_dir} has a budget of {saved.budget}; a resumed run can "
                          f"only raise it")
    return value


def _flag(name: str) -> str:
    return FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def _resume_changes(manifest, config: SearchConfig) -> dict[str, tuple]:
    """The growable settings this resume changes: name -> (value in the manifest, new value)."""
    saved = _saved_config(manifest)
    return {name: (getattr(saved, name), getattr(config, name)) for name in GROWABLE_SETTINGS
            if getattr(saved, name) != getattr(config, name)}


def _score_baselines(problem, pool, config: SearchConfig, past: PastRows, writer) -> list[BaselineOutcome]:
    """Score each quick baseline with one measurement through the same pool (logged under its name)."""
    from policies.registry import place

    measurer = LoggedPoolMeasurer(pool, problem, "", past, log=writer)
    outcomes = []
    for name in config.baselines:
        measurer.policy = name
        try:
            best = place(name, problem, measurer, 1, config.seed).best
        except PlacerError as exc:  # e.g. no expert rule for this graph
            outcomes.append(BaselineOutcome(name, math.nan, f"skipped: {exc}"))
            continue
        outcomes.append(BaselineOutcome(name, best.runtime_s if best.ok else math.nan, best.status))
    return outcomes


@dataclass
class _PolicyOutcome:
    best_runtime_s: float
    best_group_placement: np.ndarray | None
    measurements: int
    stop_reason: str
    seconds_per_update: float = math.nan


def _run_policy(problem, pool, config, past, run_dir, writer, progress, should_stop) -> _PolicyOutcome:
    """Any registry policy through one ``place`` call; learned ones also get the run's checkpoint folder,
    time limit, stop flag and metrics log (policies.base.RunContext). A resumed learner goes on from its
    checkpoint: its log rows and the progress count go on from there too."""
    from policies.base import RunContext
    from policies.registry import place, policy_entry

    learned = policy_entry(config.policy).learned
    first_iteration, measured = _checkpoint_progress(run_dir) if learned else (0, 0)
    tracker = _BestTracker(progress, problem.lower_bound_s, measured=measured)
    measurer = LoggedPoolMeasurer(pool, problem, config.policy, past, on_batch=tracker.update, log=writer,
                                  first_iteration=first_iteration)
    options = {}
    if learned:
        context = RunContext(checkpoint_dir=run_dir / CHECKPOINT_DIR, time_limit_s=config.time_limit_s,
                             should_stop=should_stop, on_iteration=_metrics_logger(writer))
        options = {"batch_size": config.batch, "hidden_size": config.hidden_size, "torch_threads": 1,
                   "checkpoint_every": CHECKPOINT_EVERY, "context": context}
    result = place(config.policy, problem, measurer, config.budget, config.seed, **options)
    runtime = result.best.runtime_s if result.best is not None and result.best.ok else math.inf
    return _PolicyOutcome(runtime, result.group_placement, result.measurements, result.stop_reason,
                          result.seconds_per_update)


def _checkpoint_progress(run_dir: Path) -> tuple[int, int]:
    """(iterations, measurements) the learner's checkpoint in ``run_dir`` holds; (0, 0) without one."""
    from policies.rl.loop import checkpoint_progress

    return checkpoint_progress(run_dir / CHECKPOINT_DIR)


def _metrics_logger(writer: RunLogWriter) -> Callable[[int, dict], None]:
    """The learner's ``on_iteration``: its metrics into the run log, and the log flushed just before each
    checkpoint (the learner saves one after the iteration whose number + 1 is a multiple of
    CHECKPOINT_EVERY), so a killed run's checkpoint is never ahead of its log: the measurements it
    counts are all on disk."""
    def on_iteration(iteration: int, metrics: dict) -> None:
        writer.append_metrics(iteration, metrics)
        if (iteration + 1) % CHECKPOINT_EVERY == 0:
            writer.flush()

    return on_iteration


@dataclass
class _BestTracker:
    progress: Callable[[int, float, float], None] | None
    lower_bound_s: float
    measured: int = 0
    best_runtime_s: float = math.inf

    def update(self, measurements: Sequence[Measurement]) -> None:
        self.measured += len(measurements)
        for m in measurements:
            if m.ok and m.runtime_s < self.best_runtime_s:
                self.best_runtime_s = m.runtime_s
        if self.progress is not None:
            self.progress(self.measured, self.best_runtime_s, self.lower_bound_s)


def _result(config, run_dir, problem, baselines, outcome, stop_reason, wall_s) -> SearchResult:
    candidates = [(outcome.best_runtime_s, config.policy)]
    candidates += [(b.runtime_s, b.policy) for b in baselines if not math.isnan(b.runtime_s)]
    best_runtime_s, best_source = min(candidates)
    return SearchResult(run_dir, problem.graph.name, problem.machine.name, config.policy, best_runtime_s,
                        best_source, outcome.best_runtime_s, outcome.measurements, problem.lower_bound_s,
                        baselines, stop_reason, wall_s, outcome.seconds_per_update, problem.num_units,
                        problem.graph.num_colocation_groups)


@dataclass
class BaselinesConfig:
    """``placer baselines``: every named non-learned policy on one graph and machine, one measurer."""
    graph: str
    machine: str
    policies: tuple[str, ...] | None = None
    """Registry names (None: every non-learned policy, policies.registry.BASELINES)."""
    budget: int = 500
    """Measurements each search may spend (heuristics spend one)."""
    groups: int = DEFAULT_MAX_GROUPS
    grouping: str = DEFAULT_METHOD
    seed: int = 0
    measurer: str = "sim"
    """sim: the simulator in this process; torch | tf: real runs through the Ray measurer pool."""
    runs: int | None = None
    warmup: int | None = None
    ray_address: str | None = None
    out: str | None = None
    """Write a run log (and baselines.json) under this folder."""


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
    _check_counts(config.budget, config.groups, config.grouping)
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


def _check_counts(budget: int, groups: int, grouping: str) -> None:
    from graphs.grouping import METHODS

    if budget < 1:
        raise PlacerError(f"--budget must be at least 1 measurement, got {budget}")
    if groups < 1:
        raise PlacerError(f"--groups must be at least 1, got {groups}")
    if grouping not in METHODS:
        raise PlacerError(f"--grouping: unknown grouping method {grouping!r} (known: {', '.join(METHODS)})")


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
