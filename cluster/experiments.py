"""The papers' experiments: which graphs on which machines, which methods, and the published figures.

An experiment is a list of cells (graph, machine) and the learned policy the paper proposed
(mirhoseini2017: ``reinforce``, the 2017 seq2seq; hierarchical2018: ``hierarchical``, the grouper + placer).
Each cell is one row of the paper's table. Running a cell is two searches (``cluster.jobs.run_search``),
each its own run folder under ``<out>/<experiment>/<graph>__<machine>/``:

    learned run      the experiment's learned policy, with cpu-only, single-gpu, metis, expert, m-etf, m-sct
                     scored in the same run, through the same pool and measurer (one measurement each)
    annealing run    simulated annealing with the same budget (beyond the paper)

A finished run leaves ``result.json`` (the SearchResult) beside its log. Running the experiment again
skips finished runs and resumes unfinished ones (``SearchConfig.resume``), so an interrupted experiment
continues where it stopped; a finished run is resumed too when ``--budget`` is now larger than its own.
The table is built from the run folders alone (``cluster.analysis``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Sequence

from cluster.analysis import lower_bound_of, policy_bests, proven_bound_of
from cluster.jobs.config import SearchConfig, check_unique
from cluster.runlog import (MANIFEST_FILE, RESULT_FILE, read_manifest, read_result_json, read_run,
                            write_text_atomic)
from graphs.errors import PlacerError, check_seed, is_whole_number
from graphs.files import FolderLock, missing_folders, remove_empty_folders
from graphs.grouping import DEFAULT_MAX_GROUPS, DEFAULT_METHOD
from policies.registry import policy_entry
from policies.rl.config import BATCH_SIZE

EXPERIMENT_FILE = "experiment.json"
PAPER_BASELINES = ("cpu-only", "single-gpu", "metis", "expert")  # what both papers compared RL with
EXTRA_BASELINES = ("m-etf", "m-sct")  # beyond the paper, scored in the learned policy's run
SEARCH_BASELINE = "annealing"  # beyond the paper: a plain search at the learned policy's budget
TIE_BAND = 0.05  # relative differences below 5% count as a tie when checking the paper's conclusions


@dataclass(frozen=True)
class PaperRow:
    """One row of a published table, seconds per training step (None: out of memory; nan: not reported).
    Approximate: recalled from the paper, not checked against the PDF."""
    cpu_s: float | None
    gpu_s: float | None
    scotch_s: float
    mincut_s: float
    expert_s: float
    rl_s: float
    rl_gain: float  # RL's speed-up over the best baseline: best / rl - 1

    @property
    def best_single_s(self) -> float:
        return min((x for x in (self.cpu_s, self.gpu_s) if x is not None and math.isfinite(x)), default=math.inf)


@dataclass(frozen=True)
class Cell:
    graph: str
    machine: str
    gpus: int
    paper: PaperRow | None = None

    @property
    def folder_name(self) -> str:
        return f"{self.graph}__{self.machine}"


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    cells: tuple[Cell, ...]
    claim: str  # the paper's headline, shown where a row has no published figures
    notes: str = ""
    learned: str = "reinforce"  # the registry name of the paper's learned policy, run in every cell

    @property
    def searches(self) -> tuple[str, ...]:
        """The policies run per cell, one run folder each."""
        return (self.learned, SEARCH_BASELINE)

    @property
    def methods(self) -> tuple[str, ...]:
        """Every column of the table, in order."""
        return PAPER_BASELINES + (self.learned,) + EXTRA_BASELINES + (SEARCH_BASELINE,)

    def select(self, rows: Sequence[str] = ()) -> "Experiment":
        """The experiment with only the cells named in ``rows`` ("GRAPH": on every machine, or
        "GRAPH:MACHINE"), in the paper's order; no rows: every cell. A name that matches no cell is an error."""
        if not rows:
            return self
        check_unique(list(rows), "--rows")  # as placer train's --graphs: one row named twice is a slip
        known = [f"{c.graph}:{c.machine}" for c in self.cells]
        unknown = [r for r in rows if not any(r in (c.graph, k) for c, k in zip(self.cells, known))]
        if unknown:
            raise PlacerError(f"--rows: {self.name} has no row {', '.join(map(repr, unknown))} "
                              f"(rows: {', '.join(known)})")
        kept = tuple(c for c, k in zip(self.cells, known) if c.graph in rows or k in rows)
        return replace(self, cells=kept)


def _mirhoseini2017() -> Experiment:
    rows = {
        ("rnnlm", 2): PaperRow(6.89, 1.57, 13.43, 11.94, 3.81, 1.57, 0.0),
        ("rnnlm", 4): PaperRow(6.89, 1.57, 11.52, 10.44, 4.46, 1.57, 0.0),
        ("nmt-2", 2): PaperRow(10.72, None, 14.19, 11.54, 4.99, 4.04, 0.235),
        ("nmt-2", 4): PaperRow(10.72, None, 11.23, 11.78, 4.73, 3.92, 0.206),
        ("inception-v3", 2): PaperRow(26.21, 4.60, 25.24, 22.88, 11.22, 4.60, 0.0),
        ("inception-v3", 4): PaperRow(26.21, 4.60, 23.41, 24.52, 10.65, 3.85, 0.19),
    }
    cells = tuple(Cell(graph, f"paper-{gpus}gpu", gpus, paper) for (graph, gpus), paper in rows.items())
    return Experiment("mirhoseini2017", "Device Placement Optimization with RL (ICML 2017), Table 1", cells,
                      "RL wins where one GPU runs out of memory (NMT) or branches overlap (Inception, 4 GPUs); "
                      "else it ties one GPU",
                      "METIS stands in for both Scotch and MinCut; paper figures are approximate (recalled, not "
                      "checked against the PDF)")


def _paper_row(cpu_s, gpu_s, scotch_s, mincut_s, expert_s, rl_s, reduction: float) -> PaperRow:
    """A row whose gain (best baseline's step / the planner's, less 1) comes from the paper's reported runtime
    ``reduction`` over the best baseline: its step times are rounded to two digits, and on Inception-V3
    (0.15 / 0.13 s) that made +15.4% of a 16.3% reduction (+19.5%)."""
    return PaperRow(cpu_s, gpu_s, scotch_s, mincut_s, expert_s, rl_s, round(1 / (1 - reduction) - 1, 3))


def _hierarchical2018() -> Experiment:
    # (graph, GPUs): CPU only, GPU only, Scotch, MinCut, human expert, hierarchical planner (s per step).
    # The last figure: the paper's runtime reduction over the best baseline.
    rows = {
        ("inception-v3", 2): _paper_row(0.61, 0.15, 0.93, 0.82, 0.15, 0.13, 0.163),
        ("resnet-50", 2): _paper_row(math.nan, 1.18, 6.27, 2.92, 1.18, 1.18, 0.0),
        ("rnnlm", 2): _paper_row(6.89, 1.57, 5.62, 5.21, 1.57, 1.57, 0.0),
        ("nmt-2", 2): _paper_row(6.46, None, 3.21, 5.34, 2.13, 0.84, 0.606),
        ("nmt-4", 4): _paper_row(10.68, None, 11.18, 11.63, 3.64, 1.69, 0.537),
        ("nmt-8", 8): _paper_row(11.52, None, 17.85, 19.01, 3.88, 4.07, -0.049),
    }
    cells = tuple(Cell(graph, f"paper-{gpus}gpu", gpus, paper) for (graph, gpus), paper in rows.items())
    return Experiment("hierarchical2018", "A Hierarchical Model for Device Placement (ICLR 2018), Table 1", cells,
                      "the planner beats every baseline, by up to 60.6% shorter steps on 2-layer NMT (a +154% "
                      "speed-up, as the gain column counts); ties one GPU where the model fits on it; 4.9% longer "
                      "steps than the expert on 8-layer NMT",
                      "METIS stands in for both Scotch and MinCut; the planner groups the graph itself "
                      "(policies.rl.hierarchical); paper-8gpu is 1 CPU + 8 K80 (measurers/catalog/paper-8gpu.json); "
                      "paper figures are approximate (recalled, not checked against the PDF)",
                      learned="hierarchical")


EXPERIMENTS: dict[str, Callable[[], Experiment]] = {
    "mirhoseini2017": _mirhoseini2017,
    "hierarchical2018": _hierarchical2018,
}


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise PlacerError(f"unknown experiment {name!r} (known: {', '.join(EXPERIMENTS)})")
    return EXPERIMENTS[name]()


@dataclass(frozen=True)
class Settings:
    measurer: str = "sim"
    budget: int = SearchConfig.budget  # measurements of each search (RL and annealing); as `placer search`
    batch: int = BATCH_SIZE  # RL placements per iteration, as `placer search` gives the seq2seq learners
    groups: int = DEFAULT_MAX_GROUPS  # as every command
    grouping: str = DEFAULT_METHOD
    hidden_size: int = SearchConfig.hidden_size
    seed: int = 0
    quick: bool = False
    bound_time_limit_s: float = SearchConfig.bound_time_limit_s  # the proven bound of each cell's groups


QUICK = Settings(budget=8, batch=4, groups=32, hidden_size=32, quick=True, bound_time_limit_s=2.0)


def settings_for(quick: bool, measurer: str = "sim", budget: int | None = None, groups: int | None = None,
                 seed: int = 0) -> Settings:
    base = QUICK if quick else Settings()
    out = replace(base, measurer=measurer, seed=seed)
    if budget is not None:
        out = replace(out, budget=budget, batch=min(out.batch, max(budget, 2)))
    if groups is not None:
        out = replace(out, groups=groups)
    if out.budget < 1 or out.groups < 1:
        raise PlacerError(f"--budget and --groups must be at least 1 (got {out.budget}, {out.groups})")
    check_seed(out.seed, "--seed")
    return out


# ---- running -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunEvent:
    """Progress of an experiment, one event per search run: what, and what happened."""
    index: int  # 1-based position among all runs of the experiment
    total: int
    cell: Cell
    policy: str
    action: str  # "skipped (finished)" | "started" | "resumed" | "done"
    best_s: float = math.nan
    wall_s: float = 0.0


def run_experiment(experiment: Experiment, out: str | os.PathLike, settings: Settings,
                   on_event: Callable[[RunEvent], None] | None = None, ray_address: str | None = None,
                   on_start: Callable[[], None] | None = None) -> Path:
    """Run (or continue) every search of the experiment's cells (all, or those ``Experiment.select`` kept);
    returns the experiment folder. ``on_start()`` is called once the checks that need Ray have passed,
    before the first search (a banner printed sooner preceded a refused run's error line)."""
    from cluster import ray_setup

    folder = Path(out) / experiment.name
    total = len(experiment.cells) * len(experiment.searches)
    index, held = 0, None
    ray_setup.init_ray(ray_address)  # one Ray for all runs (ray_address, else RAY_ADDRESS, joins a cluster)
    try:
        _check_measurer_nodes(experiment, settings)  # as a search does, but before any row's folder is written
        held = _locked_experiment_folder(folder, experiment, settings)  # after Ray: no cluster, nothing written
        if on_start is not None:
            on_start()
        for cell in experiment.cells:
            for policy in experiment.searches:
                index += 1
                baselines = PAPER_BASELINES + EXTRA_BASELINES if policy == experiment.learned else ()
                _run_cell_search(folder / cell.folder_name, cell, policy, baselines, settings, index, total,
                                 on_event)
    finally:
        if held is not None:
            held.release()
        ray_setup.shutdown_ray()
    return folder


def _locked_experiment_folder(folder: Path, experiment: Experiment, settings: Settings) -> FolderLock:
    """The experiment folder locked for this process, then its settings checked and written: two processes
    on one folder each ran a row's search, and the second failed on the first's live run, its JSON document
    never printed; locked after the settings, a refused second process had written its budget over the
    first's. A folder this call made is removed again when the settings are refused."""
    made = missing_folders(folder)
    folder.mkdir(parents=True, exist_ok=True)
    held = FolderLock.acquire(folder, "experiment folder")
    try:
        _check_or_write_settings(folder, experiment, settings)
    except BaseException:
        held.release()
        if made:
            (folder / FolderLock.FILE).unlink(missing_ok=True)
            remove_empty_folders(made)
        raise
    return held


def _check_measurer_nodes(experiment: Experiment, settings: Settings) -> None:
    """Every row's machine has a node for the measurer (a CUDA one needs the machine's GPUs on one node): the
    first row's search refused it after the experiment folder was written, which then refused another
    measurer."""
    from cluster.pool import CUDA_MEASURERS, measurer_nodes
    from measurers.catalog import load_machine

    if settings.measurer not in CUDA_MEASURERS:  # the others need no node of their own
        return
    for machine in dict.fromkeys(cell.machine for cell in experiment.cells):
        measurer_nodes(settings.measurer, load_machine(machine))


def check_experiment_folder(experiment: Experiment, out: str | os.PathLike, settings: Settings) -> None:
    """The experiment's folder under ``out``, if it exists, holds runs made with these settings: the same
    measurer, groups, grouping and seed, and a budget at least as large (a larger one continues them; a
    smaller one would report runs of the larger budget under its own). One PlacerError otherwise."""
    folder = Path(out) / experiment.name
    if folder.exists() and not folder.is_dir():  # found before Ray starts, not when the folder is made
        raise PlacerError(f"{folder} is a file, not an experiment folder: pick another --out")
    if (folder / EXPERIMENT_FILE).exists() and not (folder / EXPERIMENT_FILE).is_file():
        raise PlacerError(f"{folder / EXPERIMENT_FILE} is not a file, so {folder} holds no experiment this "
                          f"placer can continue: pick another --out")
    for cell in experiment.cells:
        cell_dir = folder / cell.folder_name
        if cell_dir.exists() and not cell_dir.is_dir():  # its row's search failed after experiment.json was written
            raise PlacerError(f"{cell_dir} is a file, not a row's folder: remove it, or pick another --out")
    if not (folder / EXPERIMENT_FILE).is_file():
        return
    old = asdict(read_settings(folder))
    for key in ("measurer", "quick", "groups", "grouping", "seed"):
        if old.get(key) != getattr(settings, key):
            raise PlacerError(f"{folder} holds the {experiment.name} experiment with {key}={old.get(key)!r}, "
                              f"not {getattr(settings, key)!r}: pick another --out")
    if settings.budget < old["budget"]:
        raise PlacerError(f"{folder} holds the {experiment.name} experiment run with --budget {old['budget']}: "
                          f"pick another --out, or a budget of at least {old['budget']} (not {settings.budget})")


def _check_or_write_settings(folder: Path, experiment: Experiment, settings: Settings) -> None:
    """``check_experiment_folder`` and the runs the rows continue (``_check_cell_runs``), then the settings
    written (a larger budget replaces the old one)."""
    check_experiment_folder(experiment, folder.parent, settings)
    _check_cell_runs(folder, experiment, settings)
    path = folder / EXPERIMENT_FILE
    payload = {"experiment": experiment.name, "title": experiment.title, "settings": asdict(settings),
               "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("settings", {}).get("budget") == settings.budget:
            return
        payload["started_at"] = old.get("started_at", payload["started_at"])
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(payload, indent=2))


def _check_cell_runs(folder: Path, experiment: Experiment, settings: Settings) -> None:
    """Every run folder a row would continue or read reads (its manifest and its log): a damaged one was found
    by the row's search, after a larger --budget was written over the folder's, which then refused the budget
    its runs were made with. (A search's run of a smaller budget is neither: the row starts a new one.) A run
    of a larger budget is refused as the folder's settings refuse it: with experiment.json lost, its rows
    were reported under the smaller budget. (A log's placements are not read here, a long run's being most of
    it: a row with none is found by the row's resume.)"""
    from cluster.jobs import GROUPING_FILE
    from cluster.runlog_format import check_run_log

    for cell in experiment.cells:
        for policy in experiment.searches:
            run_dir = find_cell_run(folder / cell.folder_name, policy)
            if run_dir is None:
                continue
            _check_run_settings(run_dir, settings)
            budget = _run_budget(run_dir)
            if budget > settings.budget:  # (experiment.json says so too, unless it was lost)
                raise PlacerError(f"{run_dir} was run with --budget {budget}: pick another --out, or a budget of "
                                  f"at least {budget} (not {settings.budget})")
            if _started_afresh(budget < settings.budget, policy):
                continue
            if (run_dir / GROUPING_FILE).is_file():  # (one without died before it could resume: set aside)
                check_run_log(run_dir)
            elif (run_dir / RESULT_FILE).exists() and read_result_json(run_dir) is None:  # resumed to write it
                raise PlacerError(f"{run_dir} has a damaged {RESULT_FILE} and no {GROUPING_FILE}, so it cannot be "
                                  "resumed to finish it: remove the run folder, or pick another --out")
            elif (run_dir / RESULT_FILE).exists() and budget < settings.budget:  # was set aside and run again
                raise PlacerError(f"{run_dir} is finished but its {GROUPING_FILE} is missing, so it cannot go on to "
                                  f"--budget {settings.budget}: restore the file, or pick another --out")


RUN_SETTINGS = ("measurer", "groups", "grouping", "hidden_size")  # the run manifest's config keys of Settings


def _check_run_settings(run_dir: Path, settings: Settings) -> None:
    """A row's run made with the experiment's settings: with experiment.json lost, the runs of seed 0 and 4
    groups were reported (and the folder written) as those of the seed and groups asked for."""
    manifest = read_manifest(run_dir)
    ran = {key: manifest.config.get(key) for key in RUN_SETTINGS} | {"seed": manifest.seed}
    for key, value in ran.items():
        if value is not None and value != getattr(settings, key):  # (None: an older run's manifest lacks it)
            flag = {"hidden_size": "--quick", "grouping": None}.get(key, f"--{key}")  # (reproduce has no --grouping)
            raise PlacerError(f"{run_dir} was run with {key} {value!r}, not {getattr(settings, key)!r}: pick "
                              f"another --out" + (f", or give the {flag} it was run with" if flag else ""))


def _run_budget(run_dir: Path) -> int:
    budget = read_manifest(run_dir).config.get("budget", 0)
    if not is_whole_number(budget):  # int("four") and int(None) were tracebacks
        raise PlacerError(f"{run_dir / MANIFEST_FILE} is damaged: config.budget is {json.dumps(budget)}, not a "
                          "whole number")
    return int(budget)


def _smaller_budget(run_dir: Path, settings: Settings) -> bool:
    return _run_budget(run_dir) < settings.budget


def _started_afresh(smaller_budget: bool, policy: str) -> bool:
    """A search (not a learner) whose run was made with a smaller budget runs again in a new folder."""
    return smaller_budget and not policy_entry(policy).learned


def read_settings(folder: Path) -> Settings:
    path = Path(folder) / EXPERIMENT_FILE
    if not path.is_file():
        raise PlacerError(f"{folder} is not an experiment folder (no {EXPERIMENT_FILE})")
    try:
        saved = {"grouping": "metis", **json.loads(path.read_text()).get("settings", {})}  # older folders: METIS
        settings = Settings(**{k: v for k, v in saved.items() if k in Settings.__dataclass_fields__})
    except (ValueError, AttributeError, TypeError) as exc:
        raise PlacerError(f"{path} is damaged: {exc}") from None
    for field in fields(Settings):  # compared with the command's (a hand edit made "12" of 12)
        value, kind = getattr(settings, field.name), type(field.default)
        if type(value) is not kind and not (kind is float and type(value) is int):
            raise PlacerError(f"{path} is damaged: settings.{field.name} is {json.dumps(value)}, not a {kind.__name__}")
    return settings


def find_cell_run(cell_dir: Path, policy: str) -> Path | None:
    """The run folder of ``policy`` in a cell folder (the newest when there are several), or None."""
    if not cell_dir.is_dir():
        return None
    found = []
    for child in sorted(cell_dir.iterdir()):
        if child.name.startswith(".") or not (child / MANIFEST_FILE).is_file():
            continue
        if read_manifest(child).policy == policy:
            found.append(child)
    return found[-1] if found else None


def _run_cell_search(cell_dir: Path, cell: Cell, policy: str, baselines: tuple[str, ...], settings: Settings,
                     index: int, total: int, on_event) -> None:
    from cluster.jobs import GROUPING_FILE, run_search

    emit = on_event or (lambda event: None)
    run_dir = find_cell_run(cell_dir, policy)
    smaller = run_dir is not None and _smaller_budget(run_dir, settings)
    if _started_afresh(smaller, policy):
        run_dir = None  # a search's placements depend on its budget: a new run (the newest is the cell's)
    if run_dir is not None and read_result_json(run_dir) is not None and not smaller:
        emit(RunEvent(index, total, cell, policy, "skipped (finished)"))
        return  # (with a larger budget, the finished learner goes on from its checkpoint; a damaged result
        # file, as analyze reads it, is a run not finished: resumed, it writes the file again)
    if run_dir is not None and not (run_dir / GROUPING_FILE).is_file() and not (run_dir / RESULT_FILE).exists():
        run_dir.rename(run_dir.with_name(f".broken-{time.time_ns()}-{run_dir.name}"))  # died before it could resume
        run_dir = None
    cell_dir.mkdir(parents=True, exist_ok=True)
    # A resumed run keeps its own batch (the quick settings take it from the budget: min(4, budget)) and its
    # bound's time limit (and its bound, in its manifest). A batch is the learners' alone.
    learned = policy_entry(policy).learned
    batch, bound_time_limit_s = settings.batch if learned else None, settings.bound_time_limit_s
    if run_dir is not None:
        saved = read_manifest(run_dir).config
        batch = saved.get("batch", batch) if learned else None
        bound_time_limit_s = saved.get("bound_time_limit_s", SearchConfig.bound_time_limit_s)
    config = SearchConfig(graph=cell.graph, machine=cell.machine, policy=policy, measurer=settings.measurer,
                          budget=settings.budget, batch=batch, groups=settings.groups,
                          grouping=settings.grouping, seed=settings.seed, out=str(cell_dir),
                          hidden_size=settings.hidden_size, bound_time_limit_s=bound_time_limit_s,
                          baselines=baselines,
                          resume=None if run_dir is None else str(run_dir))
    emit(RunEvent(index, total, cell, policy, "started" if run_dir is None else "resumed"))
    started = time.perf_counter()
    result = run_search(config)  # writes RESULT_FILE; its manifest records the reproduce command line
    emit(RunEvent(index, total, cell, policy, "done", result.policy_best_runtime_s, time.perf_counter() - started))


# ---- the table -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodResult:
    runtime_s: float  # nan when not ok or not run
    status: str  # ok | oom | error | ... | skipped | not run


@dataclass(frozen=True)
class Claim:
    """One conclusion of the paper, checked on our numbers."""
    what: str
    paper: str
    here: str
    holds: bool | None  # None: cannot tell (a figure is missing)


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    learned: str  # the experiment's learned policy (a key of methods)
    methods: dict[str, MethodResult]
    lower_bound_s: float
    rl_gain: float  # the learned policy's speed-up over the best of PAPER_BASELINES: best / learned - 1
    best_baseline: str  # that baseline
    winner: str  # fastest method here, all methods
    claims: tuple[Claim, ...]
    runs: tuple[str, ...]
    measurements: int
    wall_s: float
    finished: bool
    proven_bound_s: float = math.nan  # best proven bound of the cell's searched groups (from its run folders)
    proven_bound_holds_for: str = ""
    rl_batch: int | None = None  # the batch its learned run searched with (its manifest's); None: not run
    grouping: str = ""  # the method that made its runs' groups (result.json's: scope falls back to metis)
    groups: int | None = None  # how many groups its runs searched (result.json's: scope can give fewer)

    @property
    def ratio_to_proven_bound(self) -> float:
        """The fastest method's step time over the proven bound (nan when either is unknown, or when the
        fastest placed groups of its own, for which the bound does not hold)."""
        from policies.registry import groups_itself

        best_s = self.methods[self.winner].runtime_s if self.winner and not groups_itself(self.winner) else math.nan
        return best_s / self.proven_bound_s if self.proven_bound_s > 0 else math.nan

    def to_json(self) -> dict:
        from cluster.jsonout import json_safe

        data = asdict(self)
        data["cell"] = {"graph": self.cell.graph, "machine": self.cell.machine, "gpus": self.cell.gpus,
                        "paper_approx": None if self.cell.paper is None else asdict(self.cell.paper)}
        data["ratio_to_proven_bound"] = self.ratio_to_proven_bound
        return json_safe(data)


def cell_results(experiment: Experiment, folder: str | os.PathLike) -> list[CellResult]:
    return [_cell_result(experiment, cell, Path(folder) / cell.folder_name) for cell in experiment.cells]


def _cell_result(experiment: Experiment, cell: Cell, cell_dir: Path) -> CellResult:
    from cluster.analysis import wall_s_of

    methods = {m: MethodResult(math.nan, "not run") for m in experiment.methods}
    lower, runs, measured, wall, finished = math.nan, [], 0, 0.0, True
    proven, proven_for, rl_batch, grouping, groups = math.nan, "", None, "", None
    for policy in experiment.searches:
        run_dir = find_cell_run(cell_dir, policy)
        if run_dir is None:
            finished = False
            continue
        manifest, rows = read_manifest(run_dir), read_run(run_dir)
        if policy == experiment.learned:
            rl_batch = _batch_of(manifest.config)
        for tag, best in policy_bests(rows).items():
            if tag in methods:
                methods[tag] = MethodResult(best.runtime_s, best.status)
        if math.isnan(lower):
            lower = lower_bound_of(run_dir, manifest)
        run_proven, run_proven_for = proven_bound_of(run_dir, manifest)
        if math.isnan(proven) or run_proven > proven:  # the cell's runs search the same groups: the best holds
            proven, proven_for = run_proven, run_proven_for  # (an exact run proves more than --bound-time-limit)
        runs.append(str(run_dir))
        measured += int((~rows["cache_hit"].astype(bool)).sum())
        wall += wall_s_of(rows, manifest)
        result = read_result_json(run_dir)
        finished &= result is not None
        grouping = grouping or (result or {}).get("grouping", "")
        groups = groups or _whole_or_none((result or {}).get("groups"))
    baseline = _best_of(methods, PAPER_BASELINES)
    rl = methods[experiment.learned].runtime_s
    gain = methods[baseline].runtime_s / rl - 1 if baseline and rl > 0 else math.nan
    winner = _best_of(methods, experiment.methods)
    claims = _claims(experiment, cell, methods, gain, baseline)
    return CellResult(cell, experiment.learned, methods, lower, gain, baseline, winner, claims, tuple(runs),
                      measured, wall, finished, proven, proven_for, rl_batch, grouping, groups)


def _batch_of(config: dict) -> int | None:
    return _whole_or_none(config.get("batch"))


def _whole_or_none(value) -> int | None:
    return int(value) if is_whole_number(value) else None


def batch_used(results: Sequence[CellResult], planned: int) -> int | None:
    """The RL batch the rows' learned runs searched with: ``planned`` when none ran, None when they differ (a
    run resumed at a larger --budget keeps the batch it started with; see ``CellResult.rl_batch``)."""
    used = {r.rl_batch for r in results if r.rl_batch is not None}
    if not used:
        return planned
    return used.pop() if len(used) == 1 else None


def _best_of(methods: dict[str, MethodResult], names) -> str:
    ok = [(methods[n].runtime_s, n) for n in names if math.isfinite(methods[n].runtime_s)]
    return min(ok)[1] if ok else ""


def _category(gain: float) -> str:
    if gain >= TIE_BAND:
        return "RL wins"
    if gain <= -TIE_BAND:
        return "RL loses"
    return "tie"


def _claims(experiment: Experiment, cell: Cell, methods, gain: float, baseline: str) -> tuple[Claim, ...]:
    here_gain = (f"no {experiment.learned} result" if math.isnan(gain)
                 else f"{gain:+.1%} vs {baseline} ({_category(gain)})")
    paper = cell.paper
    if paper is None:
        holds = None if math.isnan(gain) else gain >= TIE_BAND
        return (Claim("RL vs best baseline", experiment.claim, here_gain, holds),)
    claims = [Claim("RL vs best baseline", f"{paper.rl_gain:+.1%} ({_category(paper.rl_gain)})", here_gain,
                    None if math.isnan(gain) else _category(gain) == _category(paper.rl_gain))]
    single = min((methods[m].runtime_s for m in ("cpu-only", "single-gpu") if math.isfinite(methods[m].runtime_s)),
                 default=math.nan)
    for label, ours, theirs in (("METIS (Scotch/MinCut) vs best single device", methods["metis"],
                                 min(paper.scotch_s, paper.mincut_s)),
                                ("expert vs best single device", methods["expert"], paper.expert_s)):
        claims.append(_slower_claim(label, theirs / paper.best_single_s, ours, single))
    return tuple(claims)


def _slower_claim(label: str, paper_ratio: float, ours: MethodResult, single_s: float) -> Claim:
    """Slower or faster than the best single device, as in the paper; where the paper's figure equals the
    single device's (the 2018 expert on the models that fit one GPU), within TIE_BAND counts as the same."""
    same = abs(paper_ratio - 1) < 0.01
    paper_text = f"{paper_ratio:.2f}x ({'same' if same else 'slower' if paper_ratio > 1 else 'faster'})"
    if not math.isfinite(single_s):
        return Claim(label, paper_text, "no single device ran", None)
    if ours.status == "not run":
        return Claim(label, paper_text, "no placement here (not run)", None)
    if not ours.status == "ok":
        return Claim(label, paper_text, f"{ours.status} (a failed split is no faster)", paper_ratio > 1)
    ratio = ours.runtime_s / single_s
    if same:
        within = abs(ratio - 1) < TIE_BAND
        return Claim(label, paper_text, f"{ratio:.2f}x ({'same' if within else 'slower' if ratio > 1 else 'faster'})",
                     within)
    return Claim(label, paper_text, f"{ratio:.2f}x ({'slower' if ratio > 1 else 'faster'})",
                 (ratio > 1) == (paper_ratio > 1))
