"""The search job.

``run_search`` (``placer search``, and each row of ``placer reproduce``): graph + machine + policy +
measurer + budget -> a run folder and the best placement::

    check every setting                               (check_search_config: nothing started yet; once,
                                                       by placer search before its progress bar)
    load graph and machine, group the graph           (graphs/, measurers/)
    read and check a warm start file                  (cluster/jobs/warm_start.py)
    build the measurer once, start or join Ray        (bad input fails here, before any file is written)
    open the run folder, start the measurer pool      (cluster/runlog.py, cluster/pool.py)
    score the quick baselines through the pool        (policies/table.py)
    pick the warm start's candidates                  (--warm-start: the baselines', or the file's)
    run the policy through policies.registry.place  (learned or not; learned ones get a RunContext)
      every batch goes to the pool in one call, every result into the run log
      (--remove-device: the policy is placed phase by phase, devices leaving between: removal.py)
    final table against the baselines and the lower bound; the run log is compacted on a clean finish
    (the proven bound of the searched groups, policies/exact/bound.py, is solved within
    ``bound_time_limit_s`` in a thread while the search runs, cluster/jobs/bound_solve.py, and kept in the
    manifest once solved: a resume reads it from there)

The run folder is the run log of cluster/runlog.py plus ``checkpoint/`` (the learner) and
``grouping.npz``. ``resume`` continues a stopped run: the learner's weights and RNG come back from the
checkpoint, and placements already in the log are answered from it instead of being measured again. Its
settings come from its manifest except those given explicitly (``search_config``, ``resume_config``):
a higher budget or a time limit is recorded in the manifest, a change of what it searches is refused.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import time
import zipfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from cluster.jobs.bound_solve import BoundSolve, bound_solve
from cluster.jobs.config import (CHECKPOINT_DIR, FILE_POLICY, GROUPING_FILE, MAX_WORKERS, SearchConfig,
                                 check_bound_time_limit, check_counts, check_measurer_settings,
                                 check_policy_groups, warm_start_label)
from cluster.jobs.interrupts import interrupts_deferred
from cluster.jobs.logged import LoggedPoolMeasurer, PastRows, log_placement, past_rows
from cluster.jobs.removal import (DeviceRemoval, check_removals, check_removals_for_problem,
                                  place_with_removals)
from cluster.jobs.resume import check_search_run, resume_changes, resume_config
from cluster.jobs.warm_start import (WarmStartChoice, WarmStartSource, check_warm_start_config,
                                     heuristic_choice, load_warm_start_placement, path_choice,
                                     save_warm_start_placement, scored_baselines)
from cluster.jsonout import json_safe
from cluster.runlog import (RESULT_FILE, RunLogWriter, check_run_log, make_run_id, new_manifest, read_manifest,
                            read_run, record_device_removal, record_proven_bound, record_resume,
                            rows_without_devices, write_text_atomic)
from graphs.errors import PlacerError, check_seed, is_whole_number
from graphs.files import FolderLock, atomic_folder, missing_folders, remove_empty_folders
from measurers.base import Measurement
from measurers.timing import check_noise_std
from policies.base import joined_notes
from policies.exact.bound import grouping_method
from policies.rl.config import CHECKPOINT_EVERY


@dataclass
class BaselineOutcome:
    policy: str
    runtime_s: float  # nan when it did not apply
    status: str


@dataclass(frozen=True)
class SolverFigures:
    """What a solver policy (exact) says of its placement, next to the measured step."""
    makespan_s: float  # the solver's model of the placement it returned
    bound_s: float  # the solver's proven bound (for what, its notes say)
    status: str
    notes: str
    bound_every_placement: bool = False  # bound_s holds for every placement of the searched groups, not its
    # model alone (PolicyResult.solver_bound_every_placement): the run's proven bound takes it in

    @classmethod
    def of(cls, result) -> "SolverFigures | None":
        """From a PolicyResult; None for a policy without a solver."""
        if not result.solver_status:
            return None
        return cls(result.solver_makespan_s, result.solver_bound_s, result.solver_status, result.notes,
                   result.solver_bound_every_placement)


@dataclass
class SearchResult:
    run_dir: Path
    graph: str
    machine: str
    policy: str
    overall_best_runtime_s: float  # the run's best over everything it measured ok: the policy's placements, the
    # baselines it scored and its warm start (best_placement.json holds its placement)
    overall_best_source: str  # which of them found it (a policy tag, "warm start (...)"; "none ran ok")
    policy_best_runtime_s: float  # the searched policy's own best (`placer analyze`'s policy_best_runtime_s)
    measurements: int  # measured by the policy in this run, resumed part included
    lower_bound_s: float
    baselines: list[BaselineOutcome]
    stop_reason: str
    wall_s: float
    seconds_per_update: float = math.nan  # learner only
    groups: int = 0  # the searched groups, at most config.groups (times the devices with --split-groups) and
    # the graph's colocation groups: what every policy places but one that groups the graph itself
    # (hierarchical, hsdag: groups of their own, not this count); the proven bound holds for these
    colocation_groups: int = 0  # the graph's colocation groups (the most groups any grouping makes)
    measurer: str = "sim"  # what timed the placements: sim | torch | tf
    warm_start: str | None = None  # the warm start's best candidate: a heuristic's name or the path given
    warm_start_runtime_s: float = math.nan  # its measured step time; nan: none ran ok (or no warm start)
    warm_start_on_groups_s: float = math.nan  # the start the learner imitated, as measured on its own groups
    # (a heuristic's placement collapsed onto the searched groups can run slower than the heuristic's own):
    # the learner's best is never worse than this; a resumed run's from its checkpoint; nan: no warm start
    proven_bound_s: float = math.nan  # best proven bound for the searched groups (policies.exact.bound)
    proven_bound_holds_for: str = ""  # the placements it holds for ("every placement" for the closed form)
    solver: SolverFigures | None = None  # exact: the solver's own makespan, bound and status
    policy_notes: str = ""  # what the policy says of its run: the weights a graph-neural placer started from,
    # its updates, exact's solves (with --remove-device, its last phase's)
    # --remove-device: overall_best_runtime_s, overall_best_source and policy_best_runtime_s are then over
    # placements that use only final_devices (a baseline or an earlier best on a removed device does not count;
    # it stays listed)
    device_removals: list[dict] = field(default_factory=list)  # one record per --remove-device: device, index,
    # trigger, requested, removed (false: never came), at_measurement (the policy's count), machine_after
    final_devices: list[str] | None = None  # the devices left at the end; None without --remove-device
    best_placement: list[int] | None = None  # with --remove-device: the overall best's placement (original
    # device indices, per group or per op as best_placement_level says), using only final_devices
    best_placement_level: str | None = None
    baselines_on_removed_devices: list[str] = field(default_factory=list)  # baselines left out of the best
    warm_start_on_removed_devices: bool = False  # its best candidate uses a device that left: its figures are not
    # a step the final devices can run, nor what the policy's best (on them) is never worse than
    grouping: str = ""  # the method that made the groups (scope falls back to metis on a graph without scopes)

    def to_json(self) -> dict:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        data["baselines"] = {b.policy: b.runtime_s for b in self.baselines}
        data["baseline_status"] = {b.policy: b.status for b in self.baselines}
        return json_safe(data)


@dataclass(frozen=True)
class CheckedSearch:
    """A search's settings that ``check_search_config`` passed, with the warm start's source it found (None:
    none). ``run_search`` given one runs it without checking again: ``placer search`` checks first, so bad
    input is one error before its progress bar, and the settings are checked once per search."""
    config: SearchConfig  # a resumed run's as ``search_config`` resolved them from its manifest
    warm_source: WarmStartSource | None


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM after the run folder was opened: its log is complete up to then, for --resume.
    ``run_dir`` None: a new run stopped before its first measurement, whose folder was removed. ``error``: why
    the search stopped when no one pressed Ctrl-C (every measurer node left the cluster)."""

    def __init__(self, run_dir: Path | None, error: str | None = None):
        how = "stopped" if error else "interrupted"
        super().__init__(f"search {how}; the run log is complete up to now in {run_dir}" if run_dir else
                         f"search {how} before its first measurement; no run folder was kept")
        self.run_dir, self.error = run_dir, error


def run_search(search: SearchConfig | CheckedSearch, progress=None, should_stop: Callable[[], bool] | None = None,
               on_start: Callable[[Path], None] | None = None,
               on_policy_start: Callable[[int], None] | None = None) -> SearchResult:
    """``_run_search`` with SIGTERM (`ray job stop`) stopping it as Ctrl-C does from start to end, the wait for
    the proven bound after Ray is shut down and the closing (where it is held, as Ctrl-C is) included."""
    from cluster import ray_setup

    with ray_setup.sigterm_as_ctrl_c(), ExitStack() as held_to_the_end:
        return _run_search(search, progress, should_stop, on_start, on_policy_start, held_to_the_end)


def _run_search(search: SearchConfig | CheckedSearch, progress, should_stop: Callable[[], bool] | None,
                on_start: Callable[[Path], None] | None, on_policy_start: Callable[[int], None] | None,
                held_to_the_end: ExitStack) -> SearchResult:
    """Run one search to the end (budget, time limit, ``should_stop`` or Ctrl-C) and return its result.
    ``search``: settings, checked here (a resumed run's taken from its manifest first), or a CheckedSearch,
    checked already. ``progress(measured, best_runtime_s, lower_bound_s)`` is called after every batch
    (``measured``: the policy's measurements in the run, a resumed learner's earlier sessions' included);
    ``on_policy_start(measured)`` once before the policy's first batch, with the count it starts from (a
    resumed learner's, else 0: what is measured in this session is ``measured`` less that);
    ``on_start(run_dir)`` once every check has passed and the run folder is open (bad input is raised before
    it). A new run that stops before its first measurement (no measurer actor started, any error, Ctrl-C)
    removes its folder again: ``SearchInterrupted.run_dir`` is None then; a resumed run keeps its folder.
    The run folder is locked from here until the caller closes ``held_to_the_end``: a second process resuming
    it (the same ``--resume`` started twice, or while the run still goes) is refused before it changes
    anything, instead of logging its rows into the same parts."""
    import ray

    from cluster import ray_setup
    from cluster.pool import MeasurerPool, MeasurersLost, pool_config_for
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.factory import MeasurerSpec, as_factory
    from policies.expert import check_expert_rule

    started = _clock()
    if not isinstance(search, CheckedSearch):
        search = check_search_config(resume_config(search.resume, asdict(search)) if search.resume else search)
    config, warm_source = search.config, search.warm_source
    if config.resume:  # refused before Ray starts or anything changes (_open_run locks a new run's folder)
        held_to_the_end.callback(FolderLock.acquire(Path(config.resume), "run folder").release)
    graph, machine = load_graph(config.graph), load_machine(config.machine)
    if config.policy == "expert":
        check_expert_rule(graph.name, "--policy expert")
    problem, computed = _problem(graph, machine, config)
    removals = check_removals(config, machine)
    check_removals_for_problem(problem, removals)  # the graph's ops keep a device of their kinds
    warm_file = load_warm_start_placement(warm_source, problem)  # a bad placement fails before any file
    bound = _search_bound(problem, config)  # (seconds, what it holds for), or solving in a thread
    owns_ray = not ray.is_initialized()  # a caller that runs many searches keeps one Ray for all
    try:
        spec = MeasurerSpec(config.measurer, graph, machine, noise_std=config.noise_std, seed=config.seed,
                            runs=config.runs, warmup=config.warmup)  # None: measurers.timing.default_timing
        factory = as_factory(spec)  # a measurer that cannot run this graph fails here, before anything is written
        ray_setup.init_ray(config.ray_address)  # likewise an unreachable cluster
        pool_config = pool_config_for(spec, config.workers)  # a real measurer with no node for its GPUs: refused
        out_made = [] if config.resume else missing_folders(Path(config.out))  # removed with a run discarded
        writer, past = _open_run(config, spec, problem, bound if isinstance(bound, tuple) else None, held_to_the_end)
    except BaseException:
        _stop_solving(bound)
        if owns_ray:
            ray_setup.shutdown_ray()
        raise
    run_dir = writer.folder
    pool = outcome = lost = None
    stop_reason, kept = "interrupted", True
    try:
        save_warm_start_placement(run_dir, warm_file)
        if on_start is not None:
            on_start(run_dir)
        pool = MeasurerPool(factory, pool_config, run_log=writer)
        baselines, placements = _score_baselines(problem, pool, config, past, writer, computed)
        warm = _warm_start(warm_source, warm_file, baselines, placements, problem, pool, past, writer)
        outcome = _run_policy(problem, pool, config, past, run_dir, writer, progress, should_stop, warm, removals,
                              on_policy_start, _time_left_s(config.time_limit_s, started))
        stop_reason = outcome.stop_reason
    except (KeyboardInterrupt, MeasurersLost) as exc:  # stopped: the log kept for --resume
        outcome, baselines, placements = None, [], {}
        lost = str(exc) if isinstance(exc, MeasurersLost) else None
    finally:
        with interrupts_deferred("closing the run log", signals=(signal.SIGINT, signal.SIGTERM)) as held:
            if pool is not None:
                pool.close()
            # a stopped run keeps its parts for --resume (Ctrl-C while closing stops a run that ended too; one
            # during the compaction leaves it compacted, which a resume reads as well); a second Ctrl-C raises here
            # and skips the rest (the bound's daemon thread dies with the process; an empty new folder stays)
            writer.close(compact=stop_reason != "interrupted" and not held.pressed)
            if owns_ray:
                ray_setup.shutdown_ray()
            if outcome is None or held.pressed:  # its bound recorded if proven, else stopped (a resume solves it)
                _settle_bound(run_dir, bound, config, problem)
            kept = outcome is not None or bool(config.resume) or writer.rows_logged > 0
            if not kept:
                _discard_unmeasured_run(run_dir, out_made)
    if outcome is None or held.pressed:
        raise SearchInterrupted(run_dir if kept else None, lost)
    try:
        bound_s, bound_holds_for = _solved_bound(run_dir, bound, config, problem)
    except KeyboardInterrupt:
        raise SearchInterrupted(run_dir) from None
    result = _result(config, run_dir, problem, baselines, outcome, stop_reason, _clock() - started,
                     warm)
    if removals:
        result = _on_final_devices(result, problem, outcome, placements, warm)
    if not removals:  # with removals the solver's last bound is the reduced machine's
        bound_s, bound_holds_for = _with_solver_bound(run_dir, (bound_s, bound_holds_for), outcome.solver, problem,
                                                      config)
    result = replace(result, proven_bound_s=bound_s, proven_bound_holds_for=bound_holds_for)
    _write_result(run_dir, result)
    return result


_clock = time.perf_counter  # the session's clock, for its time limit (a test's fake moves it on)


def _time_left_s(time_limit_s: float | None, started_s: float) -> float | None:
    """What ``--time-limit`` leaves the policy: the limit counts from the session's start (loading the graph,
    Ray, the pool's actors and the baselines took some of it); 0 once spent, None without a limit."""
    return None if time_limit_s is None else max(0.0, time_limit_s - (_clock() - started_s))


def _discard_unmeasured_run(run_dir: Path, out_made: list[Path]) -> None:
    """A new run that stopped before its first measurement (no measurer actor started, any error, Ctrl-C): a
    manifest with nothing measured is no run to read or resume (`placer analyze` listed it as running or
    stopped), so its folder goes, and the folders of ``--out`` this run made, while they are empty."""
    shutil.rmtree(run_dir, ignore_errors=True)
    remove_empty_folders(out_made)


def _write_result(run_dir: Path, result: SearchResult) -> None:
    """``result.json``: marks the run finished (readers and `placer reproduce` look for it)."""
    write_text_atomic(run_dir / RESULT_FILE, json.dumps(result.to_json(), indent=2))


def _check_groups_file(run_dir: Path, op_group: np.ndarray) -> None:
    """A resumed run's groups.parquet (the group-to-op map ``apply`` and ``analyze`` read) agrees with the
    grouping it searches: a damaged one resumed, finished, and left the run unreadable to them."""
    from cluster.runlog_format import GROUPS_FILE, read_groups

    logged = read_groups(run_dir)  # a PlacerError naming the file when damaged
    if logged is not None and not np.array_equal(logged, op_group):
        raise PlacerError(f"{run_dir / GROUPS_FILE} is damaged: it maps ops to groups otherwise than "
                          f"{run_dir / GROUPING_FILE}")


def check_search_config(config: SearchConfig) -> CheckedSearch:
    """Every setting of a search, checked before anything starts (no Ray, no graph built, nothing
    written): bad input is one PlacerError before ``placer search`` draws its progress bar. ``run_search``
    calls it unless it is given the answer. A warm start file's placement is checked against the graph by
    ``run_search``, still before anything is written."""
    from graphs.registry import check_graph_name
    from measurers.catalog import load_machine
    from policies.registry import check_device_policies, policy_entry

    check_graph_name(config.graph)
    machine = load_machine(config.machine)  # a small JSON file (or this process's devices)
    entry = policy_entry(config.policy)
    check_counts(config.budget, config.groups, config.grouping)
    check_policy_groups(config.policy, config.groups)
    check_bound_time_limit(config.bound_time_limit_s)
    _check_search_numbers(config)
    if config.split_groups is not None:
        _check_split_groups(config.split_groups, entry)
    if config.planner_groups is not None and config.policy != "hierarchical":
        raise PlacerError(f"planner_groups: only for the hierarchical planner, not {config.policy!r}")
    if config.planner_groups is not None and config.planner_groups < 1:
        raise PlacerError(f"--groups must be at least 1, got {config.planner_groups}")
    check_removals(config, machine)
    _check_gnn_settings(config)
    if config.resume:
        check_search_run(config.resume)
        check_run_log(config.resume)
        _checkpoint_progress(Path(config.resume))  # a damaged learner checkpoint: one error, nothing changed
    source = check_warm_start_config(config)
    if config.batch is not None and not entry.learned:  # else recorded, unused, and a resume's another refused
        raise PlacerError(f"--batch: only for a learned --policy (placements per learner iteration), "
                          f"not {config.policy!r}")
    check_device_policies([config.policy], machine, "--policy")
    check_device_policies(config.baselines, machine, "baselines")
    check_device_policies([config.split_groups] if config.split_groups else (), machine, "--split-groups")
    check_device_policies(source.names if source is not None else (), machine, "--warm-start")
    return CheckedSearch(config, source)


def _check_split_groups(heuristic: str, entry) -> None:
    from policies.registry import heuristic_choices, is_heuristic

    if not is_heuristic(heuristic):
        raise PlacerError(f"--split-groups: {heuristic!r} is not a heuristic ({heuristic_choices()})")
    if not entry.places_groups:
        raise PlacerError(f"--split-groups: policy {entry.name!r} does not place the searched groups "
                          f"(it places colocation groups{', grouping them itself' if entry.groups_itself else ''})")


def _check_search_numbers(config: SearchConfig) -> None:
    from policies.registry import heuristic_choices, is_heuristic

    check_measurer_settings(config.measurer, config.runs, config.warmup)
    if config.batch is not None and config.batch < 2:
        raise PlacerError(f"--batch must be at least 2, got {config.batch}")
    if config.time_limit_s is not None and not 0 < config.time_limit_s < math.inf:
        raise PlacerError(f"--time-limit must be a positive, finite number of seconds, got {config.time_limit_s}")
    if not 1 <= config.workers <= MAX_WORKERS:
        raise PlacerError(f"--workers must be from 1 to {MAX_WORKERS}, got {config.workers}")
    check_noise_std(config.noise_std, "--noise")
    if config.noise_std and config.measurer != "sim":  # ignored, yet recorded in the manifest as the run's
        raise PlacerError(f"--noise applies to the simulator only, not to the {config.measurer} measurer's real steps")
    check_seed(config.seed, "--seed")
    if isinstance(config.baselines, str):
        raise PlacerError(f"baselines must be a sequence of heuristic names, not the string {config.baselines!r}")
    for name in config.baselines:
        if not is_heuristic(name):
            raise PlacerError(f"baselines: {name!r} is not a heuristic (known: {heuristic_choices()})")


def _check_gnn_settings(config: SearchConfig) -> None:
    """--init, --order and --passes belong to the graph-neural policies; their weights are read and checked here
    (a missing pre-trained checkpoint, a damaged file, the other policy's: one error naming the file)."""
    from policies.rl.gnn.config import GRAPH_NEURAL, KINDS, MAX_PASSES, ORDERS

    if config.init is not None and config.policy not in GRAPH_NEURAL:
        raise PlacerError(f"--init: only for --policy {' or '.join(GRAPH_NEURAL)}, not {config.policy!r}")
    if config.order is not None and config.policy != "placeto":
        raise PlacerError(f"--order: only for --policy placeto (it visits groups in order), not {config.policy!r}")
    if config.passes is not None and config.policy != "placeto":
        raise PlacerError(f"--passes: only for --policy placeto (its zero-shot decode), not {config.policy!r}")
    if config.passes is not None and not (is_whole_number(config.passes) and 1 <= config.passes <= MAX_PASSES):
        raise PlacerError(f"--passes must be a whole number from 1 to {MAX_PASSES}, got {config.passes!r}")
    if config.policy == "hsdag" and config.init not in (None, "pretrained", "scratch"):
        raise PlacerError(f"--init: hsdag starts from scratch or pretrained (the encoder of gdp's committed "
                          f"checkpoint), not {config.init!r}")
    checkpoint_dir = None if config.resume is None else Path(config.resume) / CHECKPOINT_DIR
    if config.policy == "hsdag":  # reads gdp's checkpoint (init pretrained) and checks a learner.pt to resume
        from policies.rl.gnn.hsdag.policy import check_settings

        check_settings(checkpoint_dir, **_gnn_options(config))
    if config.policy not in KINDS:
        return
    if config.order is not None and config.order not in ORDERS:
        raise PlacerError(f"--order: unknown order {config.order!r} (known: {', '.join(ORDERS)})")
    from policies.rl.gnn.policy import initial_weights

    initial_weights(config.policy, config.init, checkpoint_dir)


def _gnn_options(config: SearchConfig) -> dict:
    """The options only the graph-neural policies take (check_search_config: the others have none)."""
    from policies.rl.gnn.config import KINDS

    if config.policy == "hsdag":
        return {} if config.init is None else {"init": config.init}
    if config.policy not in KINDS:
        return {}
    return {"init": config.init, **({} if config.order is None else {"order": config.order}),
            **({} if config.passes is None else {"greedy_passes": config.passes})}


def _problem(graph, machine, config: SearchConfig):
    """(the searched problem, {heuristic: (N,) op placement} of the --split-groups heuristic when it ran here,
    else {}): the baselines reuse that placement rather than compute it again."""
    from graphs.grouping import Grouping
    from policies.problem import make_problem

    if not config.resume:
        problem = make_problem(graph, machine, max_groups=config.groups, grouping_method=config.grouping,
                               seed=config.seed)
        if not config.split_groups:
            return problem, {}
        split, placement = _split_groups(problem, config)
        return split, {config.split_groups: placement}
    path = Path(config.resume) / GROUPING_FILE  # check_search_config: it is there
    try:
        with np.load(path, allow_pickle=False) as arrays:
            grouping = Grouping.from_arrays(dict(arrays))
    except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # EOFError: an empty file
        raise PlacerError(f"{path} is damaged: {exc}") from None
    if len(grouping.op_group) != graph.num_ops:
        raise PlacerError(f"run folder {config.resume} grouped {len(grouping.op_group)} ops; "
                          f"graph {graph.name!r} has {graph.num_ops}")
    _check_groups_file(Path(config.resume), grouping.op_group)
    problem = make_problem(graph, machine)  # colocation units, replaced by the run's own grouping
    return replace(problem, op_unit=grouping.op_group, grouping=grouping), {}


def _split_groups(problem, config: SearchConfig) -> tuple:
    """``--split-groups HEURISTIC``: (the groups split by the heuristic's devices, its (N,) op placement); one
    error before anything is written when the policy cannot place that many."""
    from policies.registry import heuristic_op_placement, policy_entry

    try:
        placement = heuristic_op_placement(config.split_groups, problem, config.seed)
    except PlacerError as exc:  # device:K out of range, expert without a rule for the graph, ...
        raise PlacerError(f"--split-groups {config.split_groups}: {exc}") from None
    split = problem.split_by(placement)
    most = policy_entry(config.policy).max_groups
    if most is not None and split.num_units > most:
        raise PlacerError(f"--split-groups {config.split_groups}: {split.num_units} groups after the split; policy "
                          f"{config.policy!r} places at most {most} (use fewer --groups)")
    return split, placement


def _open_run(config: SearchConfig, spec, problem, bound: tuple[float, str] | None, held: ExitStack):
    """The run folder (new, or the one resumed, which ``_run_search`` locked); a new one is locked until
    ``held`` closes. ``spec`` is the measurer's, whose timing the manifest records, ``bound`` the proven
    bound (seconds, what it holds for) a new run's manifest records (None: not solved yet, recorded when it
    is: ``_solved_bound``)."""
    from measurers.catalog import machine_to_json
    from policies.rl.env import reward_of  # -sqrt(runtime), failures at the default penalty

    graph, machine = spec.graph, spec.machine
    if config.resume:
        run_dir = Path(config.resume)
        manifest = read_manifest(run_dir)
        if manifest.graph_hash != graph.content_hash:
            raise PlacerError(f"run folder {run_dir} was made for graph hash {manifest.graph_hash}, "
                              f"but {config.graph!r} now has hash {graph.content_hash}")
        if manifest.machine != machine_to_json(machine):
            raise PlacerError(f"run folder {run_dir} was made for machine {manifest.machine.get('name')!r} as it "
                              f"was then; {config.machine!r} now describes other devices or links")
        past = past_rows(run_dir, problem)
        writer = RunLogWriter.resume(run_dir, reward_fn=reward_of)  # reads (or refuses) the log before any change
        writer.manifest = record_resume(run_dir, resume_changes(manifest, config))  # every check passed: note it
        (run_dir / RESULT_FILE).unlink(missing_ok=True)  # running again: not finished until it ends
        return writer, past
    run_id = make_run_id(graph.name, config.policy, config.seed, root=config.out)
    manifest = new_manifest(run_id, graph, machine, seed=config.seed, policy=config.policy,
                            runs=spec.runs, warmup=spec.warmup,
                            config={**asdict(config), "groups_used": problem.num_units},
                            lower_bound_s=problem.lower_bound_s)
    if bound is not None:
        manifest = replace(manifest, proven_bound_s=float(bound[0]), proven_bound_holds_for=bound[1])
    with atomic_folder(Path(config.out), run_id) as staging:  # whole or none: without its grouping it cannot resume
        staged = RunLogWriter.create(staging, manifest)
        held.callback(FolderLock.acquire(staged.folder, "run folder").release)  # the lock moves with the folder
        staged.write_groups(problem.op_unit, graph.op_names)
        np.savez(staged.folder / GROUPING_FILE, **problem.grouping.to_arrays())
        staged.close()
    return RunLogWriter(Path(config.out) / run_id, manifest, reward_fn=reward_of), PastRows()


def bound_of_measured_steps(report, measurer: str, noise_std: float = 0.0):
    """The proven bound is the noise-free simulator's: with a real measurer, or the simulator with noise, it
    bounds the simulated step, not the measured one (a measurement can come out below it), and its
    ``holds_for`` says so."""
    return replace(report, holds_for=holds_for_measured_steps(report.holds_for, measurer, noise_std))


def holds_for_measured_steps(holds_for: str, measurer: str, noise_std: float = 0.0) -> str:
    """``holds_for`` of a bound of the noise-free simulator, with what it means for ``measurer``'s steps."""
    if measurer != "sim":
        return f"{holds_for}, in the simulator (not a {measurer} measurement)"
    if noise_std > 0:
        return (f"{holds_for}, in the noise-free simulator (a step measured with --noise {noise_std:g} can come "
                f"out below it)")
    return holds_for


def _with_solver_bound(run_dir: Path, bound: tuple[float, str], solver: SolverFigures | None, problem,
                       config: SearchConfig) -> tuple[float, str]:
    """The run's proven bound raised by ``solver_raised_bound``: the manifest is updated too, so that analyze
    and reproduce read the same."""
    raised = solver_raised_bound(bound, solver, problem, config.measurer, config.noise_std)
    if raised is not bound:
        record_proven_bound(run_dir, *raised)
    return raised


RAISE_REL = 1e-9  # an exact run's bound raises the run's only by more than this (relative): the same solve's
# bound one ulp higher was a "raise" that set proven_bound_s apart from its own report's best_s


def solver_raised_bound(bound: tuple[float, str], solver: SolverFigures | None, problem, measurer: str,
                        noise_std: float = 0.0) -> tuple[float, str]:
    """A proven bound (seconds, what it holds for) of ``problem``'s groups, raised to an exact run's own where
    that holds for every placement of those groups (HiGHS's relaxation, not CP-SAT's model of whole groups)
    and is higher; ``bound`` itself otherwise. ``solver`` must come from a run that placed ``problem``'s
    groups (the bound's), else its bound holds for other placements."""
    from policies.exact.bound import grouping_name

    if solver is None or not solver.bound_every_placement or not solver.bound_s > bound[0] * (1 + RAISE_REL) \
            or not math.isfinite(solver.bound_s):
        return bound
    holds_for = holds_for_measured_steps(f"placements of {grouping_name(problem)}", measurer, noise_std)
    return float(solver.bound_s), holds_for


def _search_bound(problem, config: SearchConfig) -> tuple[float, str] | BoundSolve:
    """A resumed run's proven bound from its manifest (seconds, what it holds for), else its solve for the
    searched groups, started (cluster/jobs/bound_solve.py). ``exact`` waits for it before it starts: its own
    HiGHS solves would share the process's one HiGHS scheduler with the bound's, side by side."""
    if config.resume:
        manifest = read_manifest(config.resume)
        if manifest.proven_bound_s is not None:
            return float(manifest.proven_bound_s), manifest.proven_bound_holds_for or ""
    solve = bound_solve(problem, config.bound_time_limit_s)
    if config.policy == "exact":
        solve.report()
    return solve


def _stop_solving(bound: tuple[float, str] | BoundSolve) -> None:
    if isinstance(bound, BoundSolve):
        bound.stop()


def _settle_bound(run_dir: Path, bound: tuple[float, str] | BoundSolve, config: SearchConfig, problem) -> None:
    """A run that stopped early: its bound recorded where the solve has finished, else the solve stopped."""
    if isinstance(bound, BoundSolve) and bound.finished:
        _solved_bound(run_dir, bound, config, problem)
    else:
        _stop_solving(bound)


def _solved_bound(run_dir: Path, bound: tuple[float, str] | BoundSolve, config: SearchConfig,
                  problem) -> tuple[float, str]:
    """The run's proven bound (seconds, what it holds for), waited for where it is solving, and recorded in
    its manifest then. A solve that failed (the search is done: its result must not be lost) leaves the
    closed form, which holds for every placement, and says why."""
    if isinstance(bound, tuple):
        return bound
    try:
        report = bound_of_measured_steps(bound.report(), config.measurer, config.noise_std)
        solved = report.best_s, report.holds_for
    except Exception as exc:  # noqa: BLE001 - HiGHS, or the model's build: the search's result still stands
        from policies.exact.bound import EVERY_PLACEMENT

        solved = float(problem.lower_bound_s), f"{EVERY_PLACEMENT} (the closed form: the solve failed: {exc})"
    record_proven_bound(run_dir, *solved)
    return solved


def _score_baselines(problem, pool, config: SearchConfig, past: PastRows, writer,
                     computed: dict[str, np.ndarray]) -> tuple[list[BaselineOutcome], dict[str, np.ndarray]]:
    """Score each quick baseline (and each warm-start heuristic) with one measurement through the same
    pool, logged under its name: the outcomes, and the (N,) op placement of each that placed the graph.
    ``computed``: op placements already made this run (the --split-groups heuristic's), measured as they are:
    a heuristic decides from the cost model alone, so placing again would give the same placement."""
    from policies.registry import place

    measurer = LoggedPoolMeasurer(pool, problem, "", past, log=writer)
    outcomes, placements, errors = [], {}, []
    for name in scored_baselines(config):
        measurer.policy = name
        measurer.start_iteration(past.first_iteration(name))  # its own batch count, from 0 in a new log
        if name in computed:
            placement = computed[name]
            (best,) = measurer.measure([placement])
        else:
            try:
                result = place(name, problem, measurer, 1, config.seed)
            except PlacerError as exc:  # e.g. no expert rule for this graph
                outcomes.append(BaselineOutcome(name, math.nan, f"skipped: {exc}"))
                continue
            placement, best = result.op_placement, result.best
        placements[name] = np.asarray(placement, dtype=np.int64)
        if name == config.policy:  # the policy places it again: its measurement is this row, not a second one
            _log_as_the_policys(past, name, placements[name], best)
        outcomes.append(BaselineOutcome(name, best.runtime_s if best.ok else math.nan, best.status))
        errors.append(best.error or "no detail" if best.status == "error" else "")
    if errors and all(errors):  # the measurer runs nothing (a step it cannot rebuild): the budget would go too
        raise PlacerError(f"every quick baseline failed to measure ({_last_line(errors[0])}); nothing was "
                          f"searched, the measurements are in {writer.folder}")
    return outcomes, placements


def _last_line(error: str) -> str:
    """An error's last line that says something: an actor's traceback ends in the exception and its words
    (the whole of it made a one-line error twenty)."""
    return next((line.strip() for line in reversed(error.splitlines()) if line.strip()), error)


def _log_as_the_policys(past: PastRows, name: str, placement: np.ndarray, measurement: Measurement) -> None:
    """The search's policy is the heuristic ``name`` it also scored as a baseline: when it places the same
    placement in its first call, that is answered by the baseline's row, as a resumed run's replay is, and
    not logged again (the log held the row twice, and `placer analyze` counted two of the policy's own
    measurements where the search counted one)."""
    key = np.ascontiguousarray(placement, dtype=np.int64).tobytes()
    past.known[key] = measurement
    past.logged[(name, 0, key)] += 1  # the policy's first call: iteration 0


def _warm_start(source: WarmStartSource | None, file_placement, baselines: list[BaselineOutcome],
                placements: dict[str, np.ndarray], problem, pool, past: PastRows,
                writer) -> WarmStartChoice | None:
    """The candidates the learner starts from: scored heuristics best-first, or a path's placement scored
    once here (outside the budget, logged as FILE_POLICY)."""
    if source is None:
        return None
    if file_placement is None:
        return heuristic_choice(source, {b.policy: b.runtime_s for b in baselines}, placements)
    measurer = LoggedPoolMeasurer(pool, problem, FILE_POLICY, past, log=writer)
    return path_choice(source, file_placement, measurer)


@dataclass
class _PolicyOutcome:
    best_runtime_s: float
    best_group_placement: np.ndarray | None
    measurements: int
    stop_reason: str
    seconds_per_update: float = math.nan
    warm_start_on_groups_s: float = math.nan
    solver: SolverFigures | None = None
    notes: str = ""  # PolicyResult.notes
    best_op_placement: np.ndarray | None = None  # (N,) with --remove-device: the policy's best on the final devices
    removals: list[dict] | None = None  # with --remove-device: PhasedOutcome.removals
    final_devices: np.ndarray | None = None  # (D',) indices of the devices left


def _run_policy(problem, pool, config, past, run_dir, writer, progress, should_stop,
                warm: WarmStartChoice | None = None, removals: Sequence[DeviceRemoval] = (),
                on_policy_start: Callable[[int], None] | None = None,
                time_left_s: float | None = None) -> _PolicyOutcome:
    """Any registry policy through one ``place`` call; learned ones also get the run's checkpoint folder,
    the time its limit leaves (``time_left_s``), stop flag and metrics log (policies.base.RunContext), the
    searches that take one the time left and stop flag (exact: the whole limit, for its solver), and each
    policy that takes one ``warm_start`` when the search has one. A resumed learner goes on from its
    checkpoint: its log rows and the progress count go on from there too (and it does not imitate its warm
    start again)."""
    from policies.base import RunContext
    from policies.registry import place, policy_entry
    from policies.rl.gnn.config import GRAPH_NEURAL

    entry = policy_entry(config.policy)
    learned = entry.learned
    first_iteration, measured = _checkpoint_progress(run_dir) if learned else (0, 0)
    tracker = _BestTracker(progress, problem.lower_bound_s, measured=measured,
                           best_runtime_s=past.best_s.get(config.policy, math.inf) if measured else math.inf)
    if on_policy_start is not None:
        on_policy_start(measured)
    measurer = LoggedPoolMeasurer(pool, problem, config.policy, past, on_batch=tracker.update, log=writer,
                                  first_iteration=first_iteration, count_calls=not learned or bool(removals))
    time_left_s, should_stop, timed_out = _after_the_replay(config, past, measurer, first_iteration, time_left_s,
                                                            should_stop)
    options = {}
    if learned:
        checkpoint_dir = None if removals else run_dir / CHECKPOINT_DIR  # a run with removals is not resumed

        def on_iteration(iteration: int, metrics) -> None:  # the learner's iteration ``iteration`` ended
            writer.append_metrics(iteration, metrics)
            if not measurer.count_calls:  # (with removals each phase's learner counts from 0: calls count)
                measurer.start_iteration(iteration + 1)

        context = RunContext(checkpoint_dir=checkpoint_dir, time_limit_s=time_left_s,
                             should_stop=should_stop, on_iteration=on_iteration,
                             before_checkpoint=writer.flush)  # a checkpoint never ahead of the log on disk
        options = {"torch_threads": 1, "checkpoint_every": CHECKPOINT_EVERY, "context": context,
                   **_gnn_options(config)}
        if config.policy not in GRAPH_NEURAL:  # the graph-neural placers have their own network sizes
            options["hidden_size"] = config.hidden_size
        if config.batch is not None:  # else the policy's own batch (the graph-neural placers' differ)
            options["batch_size"] = config.batch
        if config.planner_groups is not None:
            options["num_groups"] = config.planner_groups
        if config.policy == "hierarchical":  # its grouper starts on groups of the searched method
            options["prior"] = config.grouping
    elif entry.takes_context:  # a search stops between batches as a learner does
        options["context"] = RunContext(time_limit_s=time_left_s, should_stop=should_stop)
    if warm is not None and warm.usable:  # check_search_config: only a policy that takes one has a warm start
        options["warm_start"] = warm.candidates  # (N,) op placements, best-first
    if entry.takes_time_limit and config.time_limit_s is not None:
        options["time_limit_s"] = config.time_limit_s  # exact: its solver's wall time
    if config.policy == "exact":  # its bounds hold for the noise-free simulator: no proof of the best otherwise
        options["noise_free"] = config.measurer == "sim" and not config.noise_std
    if removals:
        return _run_with_removals(problem, pool, config, writer, measurer, options, removals, tracker)
    result = place(config.policy, problem, measurer, config.budget, config.seed, **options)
    runtime = result.best.runtime_s if result.best is not None and result.best.ok else math.inf
    stop_reason = "time_limit" if timed_out and result.stop_reason == "should_stop" else result.stop_reason
    notes = result.notes
    if time_left_s == 0 and result.measurements == 0:  # said, else "0 distinct placements" was all a user read
        notes = joined_notes(notes, f"--time-limit {config.time_limit_s:g} s was spent before the policy began "
                                    "(loading the graph, Ray, the baselines)")
    return _PolicyOutcome(runtime, result.group_placement, result.measurements, stop_reason,
                          result.seconds_per_update, result.warm_start_runtime_s,
                          SolverFigures.of(result), notes)


def _after_the_replay(config, past, measurer, first_iteration: int, time_left_s: float | None, should_stop):
    """(time limit, stop flag, a list that is non-empty once the limit stopped it) for the policy's context.
    A resumed run's policy first replays what its log holds, answered from the log; a limit that ran out
    inside the replay ended the session with the replayed part alone as its result (result.json's best and
    count short of the log's, the run marked finished). On a resume the limit stops the policy only once the
    replay is over, or once it has measured something new."""
    to_replay = past.rows_to_replay(config.policy, first_iteration) if config.resume else 0
    if time_left_s is None or to_replay == 0:
        return time_left_s, should_stop, []
    deadline_s, timed_out = _clock() + time_left_s, []

    def stop() -> bool:
        if should_stop is not None and should_stop():
            return True
        if (measurer.replayed >= to_replay or measurer.sent > 0) and _clock() >= deadline_s:
            timed_out.append(True)
        return bool(timed_out)

    return None, stop, timed_out


def _run_with_removals(problem, pool, config, writer, measurer, options: dict,
                       removals: Sequence[DeviceRemoval], tracker: "_BestTracker") -> _PolicyOutcome:
    """The policy placed phase by phase while devices leave (cluster/jobs/removal.py); each removal is noted
    in the manifest (``device_removals``) and the run log's best, and the progress bar's, stop counting
    the device."""
    gone: set[int] = set()

    def on_removal(records: list[dict], devices: list[int]) -> None:
        for record in records:
            record["at_seq"] = writer.rows_logged  # rows from this one on never use the device
            record_device_removal(writer.folder, record)
        writer.forbid_devices(devices)
        gone.update(devices)
        writer.flush()  # every row on disk, to find the policy's best without the devices
        rows = rows_without_devices(read_run(writer.folder), gone)
        ok = rows[(rows["policy"] == config.policy) & (rows["status"] == "ok")]
        tracker.best_runtime_s = float(ok["runtime_s"].min()) if len(ok) else math.inf

    phased = place_with_removals(config.policy, problem, measurer, config.budget, config.seed, options, removals,
                                 node_lost=lambda: bool(pool.lost_nodes()), on_removal=on_removal)
    first, last = phased.first, phased.last
    groups = None if phased.best_op_placement is None else problem.collapse(phased.best_op_placement)
    return _PolicyOutcome(phased.best_runtime_s, groups, phased.measurements, phased.stop_reason,
                          last.seconds_per_update if last is not None else math.nan,
                          first.warm_start_runtime_s if first is not None else math.nan,
                          SolverFigures.of(last) if last is not None else None,
                          last.notes if last is not None else "", phased.best_op_placement, phased.removals, phased.kept)


def _on_final_devices(result: SearchResult, problem, outcome: _PolicyOutcome, placements: dict[str, np.ndarray],
                      warm: WarmStartChoice | None) -> SearchResult:
    """With --remove-device: the overall best among placements that use only the devices left (the policy's,
    the baselines', a warm start file's), its placement, and what was left out."""
    kept = set(outcome.final_devices.tolist())

    def fits(placement) -> bool:
        return placement is not None and set(np.unique(placement).tolist()) <= kept

    candidates = []  # in the order logged, as in _result
    left_out = []
    for b in result.baselines:
        if math.isnan(b.runtime_s) or b.policy not in placements:
            continue
        if fits(placements[b.policy]):
            candidates.append((b.runtime_s, b.policy, placements[b.policy]))
        else:
            left_out.append(b.policy)
    named = {b.policy for b in result.baselines}
    if warm is not None and warm.source not in named and math.isfinite(warm.runtime_s) and fits(warm.candidates[0]):
        candidates.append((warm.runtime_s, warm_start_label(warm.source), warm.candidates[0]))
    if fits(outcome.best_op_placement):
        candidates.append((outcome.best_runtime_s, result.policy, outcome.best_op_placement))
    devices = [problem.machine.devices[i].name for i in outcome.final_devices]
    warm_gone = warm is not None and warm.usable and not fits(warm.candidates[0])
    if not candidates:
        return replace(result, overall_best_runtime_s=math.inf, overall_best_source="none on the final devices",
                       device_removals=outcome.removals, final_devices=devices, baselines_on_removed_devices=left_out,
                       warm_start_on_removed_devices=warm_gone)
    runtime_s, source, placement = min(candidates, key=lambda c: c[0])
    logged = log_placement(problem, placement)
    return replace(result, overall_best_runtime_s=runtime_s, overall_best_source=source,
                   device_removals=outcome.removals,
                   final_devices=devices, best_placement=[int(d) for d in logged.devices],
                   best_placement_level=logged.level, baselines_on_removed_devices=left_out,
                   warm_start_on_removed_devices=warm_gone)


def _checkpoint_progress(run_dir: Path) -> tuple[int, int]:
    """(iterations, measurements) the learner's checkpoint in ``run_dir`` holds; (0, 0) without one."""
    from policies.rl.learner_file import checkpoint_progress

    return checkpoint_progress(run_dir / CHECKPOINT_DIR)


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


def _result(config, run_dir, problem, baselines, outcome, stop_reason, wall_s,
            warm: WarmStartChoice | None = None) -> SearchResult:
    # In the order they were logged, so that a tie goes to the first row, as best_placement.json and
    # `placer analyze` have it (by name, "annealing" took a tie from the expert row it had only re-measured).
    candidates = [(b.runtime_s, b.policy) for b in baselines if not math.isnan(b.runtime_s)]
    if warm is not None and warm.source not in {b.policy for b in baselines} and math.isfinite(warm.runtime_s):
        candidates.append((warm.runtime_s, warm_start_label(warm.source)))  # a file's, scored on its own
    candidates.append((outcome.best_runtime_s, config.policy))
    best_runtime_s, best_source = min(candidates, key=lambda c: c[0])
    if not math.isfinite(best_runtime_s):
        best_source = "none ran ok"  # every candidate failed: no policy found it
    return SearchResult(run_dir, problem.graph.name, problem.machine.name, config.policy, best_runtime_s,
                        best_source, outcome.best_runtime_s, outcome.measurements, problem.lower_bound_s,
                        baselines, stop_reason, wall_s, outcome.seconds_per_update, problem.num_units,
                        problem.graph.num_colocation_groups, config.measurer,
                        warm.source if warm is not None else None,
                        warm.runtime_s if warm is not None else math.nan, outcome.warm_start_on_groups_s,
                        solver=outcome.solver, policy_notes=outcome.notes, grouping=grouping_method(problem))
