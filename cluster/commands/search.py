"""`placer search`: the main job (see cluster/jobs/search.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from cluster import raylet_watch
from cluster.commands.console import PROGRESS_LINE_EVERY_S, seconds_text
from cluster.commands.notes import note_fewer_groups_than_asked, note_groups_above_colocation
from cluster.commands.paths import runs_folder
from cluster.jsonout import emit_json
from graphs.errors import PlacerError

_TIMED_BY = {"sim": "simulated", "torch": "measured PyTorch", "tf": "measured TensorFlow",
             "openvino": "measured OpenVINO inference"}


def register(subparsers) -> None:
    """Every setting's argparse default is None, so ``run`` knows which flags were given: a resumed run
    takes the others from its manifest, a new one from SearchConfig (the defaults the help names)."""
    from cluster.jobs import SearchConfig
    from measurers.factory import MEASURER_KINDS

    d = SearchConfig()
    p = subparsers.add_parser("search", help="search placements with a learner or a baseline, measured through the pool",
                              description="With no flags: the embedded default (local Ray, the simulator, "
                                          "nmt-2 on paper-2gpu, REINFORCE). With --resume: the run's own settings, "
                                          "except a higher --budget, a --time-limit, --workers and --ray-address.")
    p.add_argument("--graph", help=f"benchmark name or graph file (default {d.graph})")
    p.add_argument("--machine", help=f"catalog name or machine file (default {d.machine})")
    p.add_argument("--policy", help="a learned policy (reinforce, ppo, hierarchical, post, gdp, placeto, giph, hsdag) or any "
                   "baseline (default reinforce)")
    p.add_argument("--measurer", choices=MEASURER_KINDS, help=f"default {d.measurer} (openvino: graphs imported "
                   "from ONNX or OpenVINO IR, per-op devices through OpenVINO's HETERO mode)")
    p.add_argument("--budget", type=int, help=f"measurements (default {d.budget})")
    p.add_argument("--time-limit", type=float, dest="time_limit_s",
                   help="seconds from the search's start (Ray, the pool and the baselines count): the policy "
                        "stops at its first batch boundary after it, so the batch in flight and closing come on top "
                        "(default none; exact: its solver's own, whole, default 60)")
    p.add_argument("--workers", type=int, help=f"measurer actors without GPU nodes (default {d.workers})")
    p.add_argument("--batch", type=int, help="placements per learner iteration, learned policies only (default: "
                   "the policy's own, 16 for reinforce, ppo, hierarchical, post, gdp, placeto; giph 2 episodes of 3 "
                   "moves, hsdag 8)")
    p.add_argument("--groups", type=int, help=f"groups to place (default {d.groups}; hierarchical: the groups its "
                   "grouper makes, default 256)")
    p.add_argument("--grouping", help="how ops become groups: scope (default: groups inside "
                   "one layer of the model; METIS for graphs without scopes or with more top-level scopes than "
                   "groups), metis, colocation, topo or fusion "
                   "(hierarchical: the groups its grouper starts from)")
    p.add_argument("--seed", type=int, help=f"default {d.seed}")
    p.add_argument("--runs", type=int, help="timed runs per placement, median reported "
                                           "(default 1 for sim, 5 for torch/tf, 10 for openvino)")
    p.add_argument("--warmup", type=int, help="untimed runs first (default 0 for sim, 5 for torch/tf, "
                                              "3 for openvino)")
    p.add_argument("--noise", type=float, dest="noise_std", help=f"simulator: relative noise per timed run "
                                                                 f"(default {d.noise_std})")
    p.add_argument("--bound-time-limit", type=float, dest="bound_time_limit_s", metavar="S",
                   help=f"seconds for the proven bound on the searched groups, solved while the search runs "
                        f"(placer bound; default {d.bound_time_limit_s:g}, 0: the closed form only)")
    p.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    p.add_argument("--out", type=runs_folder, help=f"folder for run folders (default {d.out})")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run with its own settings")
    p.add_argument("--warm-start", nargs="?", const="auto", metavar="SOURCE",
                   help="learned policies, exact and annealing: start from these placements (learners imitate "
                        "them first, then learn). SOURCE: auto (the default: the best of the baselines "
                        "scored at the start, single-gpu, expert, m-topo, m-etf, m-sct and heft among them), "
                        "heuristic names (m-etf,heft), a .npy file of one op placement, or a run folder (its "
                        "best placement)")
    p.add_argument("--split-groups", metavar="HEURISTIC",
                   help="split every searched group by the devices this heuristic gives its ops (at most groups x "
                        "devices groups), so its placement is one the policy can place exactly; with --warm-start "
                        "of the same heuristic the policy starts from its own step time (e.g. --warm-start heft "
                        "--split-groups heft)")
    p.add_argument("--init", metavar="CHECKPOINT|pretrained|scratch",
                   help="gdp, placeto and giph: the network's weights: a checkpoint from placer train, pretrained "
                        "(the default: the committed checkpoint, policies/rl/gnn/pretrained/) or scratch; hsdag: "
                        "scratch (the default) or pretrained (gdp's encoder)")
    p.add_argument("--order", help="placeto: the order it visits the groups in, topo, reverse-topo, bfs or random "
                                   "(default: the order its checkpoint was trained in; topo from scratch)")
    p.add_argument("--passes", type=int, help="placeto: greedy passes over the groups in its zero-shot decode, each "
                                              "from where the one before ended (default 2)")
    p.add_argument("--remove-device", action="append", dest="remove_devices", metavar="NAME@MEASUREMENTS",
                   help="device NAME leaves after that many of the policy's measurements (e.g. gpu:1@200), or "
                        "NAME@node-lost: when the measurer pool first loses a GPU node; the policy goes on, on the "
                        "devices left (repeatable; not with reinforce, ppo, hierarchical, post; not with --resume)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def _check_hsdag_groups(given: dict) -> None:
    """hsdag groups the colocation groups itself: --groups and --grouping would set only the proven bound's
    groups (which do not bound its placements), and two runs of other counts measured the same placements."""
    flags = [f"--{name}" for name in ("groups", "grouping") if name in given]
    if given.get("policy") == "hsdag" and flags:
        raise PlacerError(f"{' and '.join(flags)}: hsdag groups the graph's colocation groups itself (how many is an "
                          "outcome of each sample, not a setting); leave the flag out")


def run(args) -> int:
    from cluster.jobs import SearchConfig, SearchInterrupted, check_search_config, run_search, search_config

    names = SearchConfig.__dataclass_fields__
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items() if k in names and v is not None}
    if given.get("init") not in (None, "pretrained", "scratch"):  # the manifest's path reads from any folder
        given["init"] = str(Path(given["init"]).resolve())
    for name in ("graph", "machine"):  # files (which win over names) too: a resume from another folder read them
        if Path(given.get(name) or "").is_file():  # relative to its own, and refused the same file's full path
            given[name] = str(Path(given[name]).resolve())
    if given.get("policy") == "hierarchical" and "groups" in given:  # its grouper's G (else the paper's 256)
        given["planner_groups"] = given["groups"]
    _check_hsdag_groups(given)
    checked = check_search_config(search_config(given))  # bad input: one error, before the progress bar
    config = checked.config
    with _Progress(config.budget, enabled=True) as progress:
        try:
            result = run_search(checked, progress=progress.update, on_start=progress.start,  # bad input found on
                                on_policy_start=progress.measured_before)  # the way: no bar before it
        except KeyboardInterrupt as exc:
            run_dir = exc.run_dir if isinstance(exc, SearchInterrupted) else _left_run_dir(progress.run_dir)
            measurers_lost = getattr(exc, "error", None)  # every measurer node gone: stopped, as a lost Ray
            text, lost = _interrupted_text(exc, progress.run_dir, run_dir), raylet_watch.lost_message()
            lost = lost or measurers_lost
            progress.close()  # its last frame drawn before the error line, not after it
            print(f"placer: error: {lost}; {text}" if lost else f"placer: {text}", file=sys.stderr)
            if args.json:  # still one document for a pipe's reader (no run folder yet: nothing to resume)
                resume = None if config.remove_devices or run_dir is None else ["placer", "search", "--resume",
                                                                                 str(run_dir)]
                emit_json(raylet_watch.stop_fields(measurers_lost)
                          | {"run_dir": None if run_dir is None else str(run_dir), "resume": resume})
            return 1 if lost else 130
        progress.finish(result.measurements, result.stop_reason, result.policy_best_runtime_s, result.lower_bound_s)
    if not config.resume and config.policy != "hsdag":  # a resumed run keeps its own grouping; hsdag makes its own
        note_groups_above_colocation(config.groups, result.colocation_groups, result.graph, given="groups" in given)
        if not config.split_groups:  # split groups can outnumber --groups
            note_fewer_groups_than_asked(config.groups, result.groups, result.colocation_groups, result.graph,
                                         result.grouping, given="groups" in given)
    if args.json:
        emit_json(result.to_json())
    else:
        print_result(result)
    return 0


def _left_run_dir(opened: Path | None) -> Path | None:
    """The run folder a search left when Ctrl-C came while it was closing (not as its SearchInterrupted):
    the folder it opened, unless the search had removed it already (a new run with nothing measured)."""
    from cluster.runlog import MANIFEST_FILE

    return opened if opened is not None and (Path(opened) / MANIFEST_FILE).is_file() else None


def _interrupted_text(exc: KeyboardInterrupt, opened: Path | None, left: Path | None) -> str:
    """What an interrupted search says of its run folder: a SearchInterrupted's own words; a Ctrl-C while it
    was closing names the folder it opened as it is now (there, or removed with nothing measured)."""
    from cluster.jobs import SearchInterrupted

    text = str(exc) or "interrupted"
    if isinstance(exc, SearchInterrupted) or opened is None:
        return text
    if left is None:
        return f"{text}; its run folder {opened} was removed: nothing was measured"
    return f"{text}; its run folder is {left}"


class _Progress:
    """A rich progress bar on stderr: measurements, best step time, ratio to the lower bound, rate. It is
    drawn from ``start`` (the run folder is open) or the first update, so an error before is one line. The
    rate is this session's: measurements since ``measured_before`` (a resumed run's earlier ones: the bar
    counts them) over the bar's time."""

    def __init__(self, budget: int, enabled: bool, line_every_s: float = PROGRESS_LINE_EVERY_S):
        self.budget, self.enabled = budget, enabled
        self._line_every_s = line_every_s  # how often the bar is printed as a line where stderr is no terminal
        self._bar = self._lines = None
        self.run_dir = None  # the run folder, once the search has opened it
        self._measured_before = 0  # earlier sessions' measurements: not this session's rate

    def __enter__(self):
        return self

    def start(self, run_dir=None) -> None:
        self.run_dir = run_dir if run_dir is not None else self.run_dir
        if self.enabled and self._bar is None:
            from cluster.commands.console import ProgressLines, text_console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("search"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[best]}"), TextColumn("{task.fields[rate]}"),
                                 TimeElapsedColumn(), console=text_console(stderr=True), transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task("search", total=self.budget, best="best -", rate="")
            self._lines = ProgressLines(self._bar, self._line_every_s)

    def measured_before(self, measured: int) -> None:
        """The policy starts at ``measured`` (a resumed run's earlier sessions' measurements)."""
        self._measured_before = measured

    def update(self, measured: int, best_runtime_s: float, lower_bound_s: float | None = None) -> None:
        self.start()
        if self._bar is None:
            return
        task = self._bar.tasks[0]
        rate = (measured - self._measured_before) / task.elapsed if task.elapsed else 0.0
        self._bar.update(self._task, completed=min(measured, self.budget),
                         best=_best_text(best_runtime_s, lower_bound_s), rate=f"{rate:.1f}/s")
        self._lines.tick()

    def finish(self, measured: int, stop_reason: str, best_runtime_s: float, lower_bound_s: float) -> None:
        """The search ended. Unless a time limit or a stop cut it short, the bar ends full at what the policy
        measured: a heuristic measures one placement of a budget of 2,048, a converged learner fewer than
        its budget, and a resumed run whose every measurement was logged reported none to the bar (nor its
        best: the policy's best is shown here)."""
        if self._bar is None:
            return
        total = self.budget if stop_reason in ("time_limit", "should_stop") else max(measured, 1)
        best = {"best": _best_text(best_runtime_s, lower_bound_s)} if math.isfinite(best_runtime_s) else {}
        self._bar.update(self._task, total=total, completed=min(measured, total), **best)

    def close(self) -> None:
        """Stop the bar (its last frame drawn), so what is printed next comes after it, not above it."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    def __exit__(self, *exc):
        self.close()


def _best_text(best_runtime_s: float, lower_bound_s: float | None) -> str:
    best = "best -" if not math.isfinite(best_runtime_s) else f"best {seconds_text(best_runtime_s)} s"
    if lower_bound_s and math.isfinite(best_runtime_s):
        best += f" ({best_runtime_s / lower_bound_s:.2f}x LB)"
    return best


def print_result(result) -> None:
    from cluster.commands.console import text_console
    from rich.table import Table

    lb, proven = result.lower_bound_s, result.proven_bound_s
    timed_by = _TIMED_BY.get(result.measurer, result.measurer)
    table = Table(title=f"{result.graph} on {result.machine}: best placements ({timed_by} step time)")
    for column in ("placement", "step time (s)", "status", "x lower bound", "x proven bound"):
        table.add_column(column)

    def ratio(runtime_s, bound_s):
        return f"{runtime_s / bound_s:.2f}" if math.isfinite(runtime_s) and bound_s and math.isfinite(bound_s) else "-"

    def row(name, runtime_s, status, bounded: bool = True):
        """``bounded``: a placement of the groups the proven bound holds for (a planner's own groups are not)."""
        ok = math.isfinite(runtime_s)
        table.add_row(name, seconds_text(runtime_s) if ok else "-", status, ratio(runtime_s, lb),
                      ratio(runtime_s, proven) if bounded else "-")

    from policies.registry import policy_entry

    entry = policy_entry(result.policy)
    warm_started = result.warm_start is not None and math.isfinite(result.warm_start_runtime_s)
    own = result.policy
    if entry.learned:
        own += " (learner's own best, warm-started)" if warm_started else " (learner's own best)"
    status = "ok" if math.isfinite(result.policy_best_runtime_s) else "none ok" if result.measurements else \
        "none measured"
    row(own, result.policy_best_runtime_s, status, bounded=not entry.groups_itself)
    if result.solver is not None:  # exact: the solver's own figures next to the measured step
        row(f"{result.policy}: the solver's makespan", result.solver.makespan_s, result.solver.status)
        row(f"{result.policy}: the solver's bound (of its model)", result.solver.bound_s, result.solver.status)
    if result.warm_start is not None:
        gone = " (uses a device that left)" if result.warm_start_on_removed_devices else ""
        row(f"warm start ({result.warm_start}){gone}", result.warm_start_runtime_s,
            "ok" if warm_started else "none ran ok")
        if math.isfinite(result.warm_start_on_groups_s):  # what the learner imitated and (on the devices it
            # had then) never ends worse than
            groups = "its own groups" if entry.groups_itself else "the searched groups"
            row(f"warm start on {groups}{gone}", result.warm_start_on_groups_s, "ok", bounded=not entry.groups_itself)
    row(f"overall best ({result.overall_best_source})", result.overall_best_runtime_s,
        "ok" if math.isfinite(result.overall_best_runtime_s) else "none ok",
        bounded=not (entry.groups_itself and result.overall_best_source == result.policy))
    for b in result.baselines:
        row(b.policy, b.runtime_s, b.status)
    row("lower bound", lb, "-")
    if math.isfinite(proven):
        row("proven bound", proven, "-")
    console = text_console()
    console.print(table)
    if math.isfinite(proven):
        from policies.exact.bound import EVERY_PLACEMENT

        others = f"the heuristics', and {result.policy}'s own groups" if entry.groups_itself else "the heuristics'"
        finer = (f"; placements of other groups ({others}) may go below it"
                 if not result.proven_bound_holds_for.startswith(EVERY_PLACEMENT) else "")
        console.print(f"proven bound (placer bound) {seconds_text(proven)} s holds for "
                      f"{result.proven_bound_holds_for}{finer}")
    if result.policy_notes:
        console.print(f"{result.policy}: {result.policy_notes}")
    for removal in result.device_removals:
        when = (f"left after measurement {removal['at_measurement']}" if removal["removed"]
                else "never left (its trigger did not come)")
        console.print(f"--remove-device {removal['requested']}: {removal['device']} {when}")
    if result.final_devices is not None:
        console.print(f"overall best on the devices left ({', '.join(result.final_devices)})"
                      + (f"; left out, on a removed device: {', '.join(result.baselines_on_removed_devices)}"
                         if result.baselines_on_removed_devices else ""))
    method = "" if result.grouping in ("", "searched") else f"{result.grouping} "  # (scope can fall back to metis)
    searched = (f"{result.policy} placed groups of its own" if entry.groups_itself else
                f"{result.groups} {method}groups searched")
    console.print(f"{searched}, {result.measurements} measurements, stopped by {result.stop_reason}, "
                  f"{result.wall_s:.1f} s; run folder: {result.run_dir}")
