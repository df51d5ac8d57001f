"""`placer train`: train a graph-neural placer (gdp, placeto, giph) across graphs and machines into one checkpoint.

One problem per (graph, machine), trained round-robin by policies.rl.gnn.family.train_family and measured
by the simulator in this process (no Ray, no pool). Writes the checkpoint (-o, policies/rl/gnn/checkpoint.py)
and, beside it, ``CHECKPOINT.metrics.parquet``: one row per update (policies.rl.gnn.trainer.UpdateMetrics),
rewritten whole at least whenever the checkpoint is; a resumed run appends to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from cluster.commands.console import seconds_text
from cluster.commands.notes import note_groups_above_colocation
from cluster.commands.paths import files_read, output_file
from cluster.jsonout import emit_json
from graphs.errors import PlacerError

FAMILIES_PREFIX = "families:"
"""Benchmarks the committed checkpoints never train on: the project's zero-shot figures hold them out."""
METRICS_EVERY = 50  # updates between rewrites of the metrics file (train_family's checkpoint_every)
CONFIG_FLAGS = {"hidden_size": "--hidden", "num_layers": "--layers", "batch_size": "--batch", "lr": "--lr",
                "entropy_coeff": "--entropy", "episode_steps": "--episode-steps", "discount": "--discount",
                "seed": "--seed"}
"""The flag that sets each GnnConfig field, which names it in the message about a bad value."""


def register(subparsers) -> None:
    from graphs.grouping import DEFAULT_MAX_GROUPS, DEFAULT_METHOD
    from policies.rl.gnn.config import ORDERS, GnnConfig

    d = GnnConfig()
    p = subparsers.add_parser("train", help="train a graph-neural placer (gdp, placeto, giph) on many graphs and "
                                            "machines",
                              description="Trains one network round-robin on every (graph, machine) pair and "
                                          "writes a checkpoint for placer search --init. Training measures with "
                                          "the simulator, in this process (no Ray).")
    p.add_argument("--policy", required=True, help="gdp, placeto or giph")
    p.add_argument("--graphs", required=True, nargs="+", metavar="NAME_OR_FILE",
                   help="graphs to train on: benchmark names, graph files, family:KIND:SEED, or families:N[:START] "
                        "(N family graphs, seeds START, START+1, ...)")
    p.add_argument("--machines", required=True, nargs="+", metavar="NAME_OR_FILE",
                   help="catalog machines, machine files or hetero:SEED (the seeded heterogeneous family; seeds "
                        "from 1000 on are held out)")
    p.add_argument("--budget", required=True, type=int, metavar="N", help="simulator measurements over all problems")
    p.add_argument("-o", "--out", required=True, metavar="CHECKPOINT", type=output_file,
                   help="checkpoint file to write")
    p.add_argument("--groups", type=int, nargs="+", default=None, metavar="G",
                   help=f"groups per graph (default {DEFAULT_MAX_GROUPS}); several values train on each graph "
                        "grouped each way")
    p.add_argument("--teacher-budget", type=int, default=0, metavar="N",
                   help="measurements of a teacher search per problem (quick heuristics, then annealing) whose "
                        "best placement the network imitates before it learns from rewards (default 0: none)")
    p.add_argument("--imitation-steps", type=int, default=2000, metavar="N",
                   help="Adam steps imitating the teachers (default 2000; used with --teacher-budget)")
    p.add_argument("--grouping", default=DEFAULT_METHOD, help=f"how ops become groups (default {DEFAULT_METHOD})")
    p.add_argument("--seed", type=int, default=0, help="network, sampling and grouping seed (default 0)")
    p.add_argument("--batch", type=int, default=d.batch_size,
                   help=f"placements per update (placeto: episodes side by side; default {d.batch_size})")
    p.add_argument("--hidden", type=int, default=d.hidden_size, help=f"embedding width (default {d.hidden_size})")
    p.add_argument("--layers", type=int, default=d.num_layers, help=f"message-passing layers (default {d.num_layers})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr:g})")
    p.add_argument("--entropy", type=float, default=d.entropy_coeff, dest="entropy_coeff",
                   help=f"weight of the entropy bonus (default {d.entropy_coeff:g})")
    p.add_argument("--order", help=f"placeto: the order it visits groups in, {'|'.join(ORDERS)} (default {d.order})")
    p.add_argument("--episode-steps", type=int, default=None, dest="episode_steps",
                   help=f"giph: relocation moves per episode (default {d.episode_steps})")
    p.add_argument("--discount", type=float, default=None,
                   help=f"giph: discount of later moves' rewards (default {d.discount:g})")
    p.add_argument("--time-limit", type=float, dest="time_limit_s", metavar="S", help="seconds (default none)")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint at -o (same graphs, machines, "
                                                         "network and training settings)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with _checkpoint_lock(args.out):
        return _run(args)


@contextmanager
def _checkpoint_lock(out: str) -> Iterator[None]:
    """``-o PATH.lock`` held while this process trains (removed after): two trains (or two --resume) on one -o
    both ran, one result overwriting the other, and a resume reading while the other saved was refused as "a
    save was cut short". Taken before any check reads the checkpoint. A -o in a folder not made yet gets it
    made for the lock (two trains into a new folder both ran), and removed again if nothing was saved there;
    one that cannot take the file is left to those checks."""
    from graphs.files import file_lock, missing_folders, remove_empty_folders

    lock = Path(out + ".lock")
    made = missing_folders(lock.parent)
    with ExitStack() as held:
        for attempt in range(LOCK_ATTEMPTS):
            try:
                lock.parent.mkdir(parents=True, exist_ok=True)
            except OSError:  # under a file, say: the checks say so
                made = None
                break
            if not os.access(lock.parent, os.W_OK):
                break
            try:
                held.enter_context(file_lock(lock, f"checkpoint {out}"))
                break
            except FileNotFoundError:  # another train that saved nothing removed the folder it had made
                if attempt == LOCK_ATTEMPTS - 1:
                    raise
        try:
            yield
        finally:
            held.close()  # the lock file removed first, then the folders made for it if nothing was saved
            remove_empty_folders(made or [])


LOCK_ATTEMPTS = 3  # the folder of -o made again when another train removed it between mkdir and the lock


def _run(args: argparse.Namespace) -> int:
    config, graphs, resumed = check_train_args(args)
    updates_before = 0 if resumed is None else int(resumed["progress"].get("updates", 0))
    from policies.rl.gnn.checkpoint import resume_path

    problems = _problems(graphs, args.machines, args)
    for note in held_out_notes(problems):
        print(f"placer: note: {note}", file=sys.stderr)
    if resumed is not None:  # before the progress bar: a graph or machine file edited since is refused
        from policies.rl.gnn.family import check_same_problems, problem_digests

        check_same_problems(args.out, resumed["progress"], [p.name for p in problems], problem_digests(problems))
    log = MetricsLog(metrics_path(args.out), updates_before)
    result, wall_s = _train(args, config, problems, log, resumed)
    session_updates = result.updates - updates_before
    summary = {"policy": config.kind, "problems": [p.name for p in problems],
               "updates": result.updates, "measurements": result.measurements_used, "budget": args.budget,
               "wall_s": result.wall_s, "session_wall_s": wall_s, "session_updates": session_updates,
               "updates_per_s": session_updates / wall_s if wall_s else 0.0,
               "stop_reason": result.stop_reason,
               "checkpoint": _written(result.checkpoint), "resume": _written(resume_path(result.checkpoint)),
               "metrics": _written(log.path), "metrics_rows": log.rows_written}
    if args.json:
        emit_json(summary)
    else:
        print_summary(summary)
    if result.stop_reason == "interrupted":
        print(f"placer: train interrupted; the checkpoint holds its {result.updates} updates: pass --resume to "
              "continue it" if summary["checkpoint"] else
              "placer: train interrupted while its teachers searched: nothing was written", file=sys.stderr)
        return 130
    if result.stop_reason == "time_limit" and not summary["checkpoint"]:  # it said nothing and exited 0
        while_teaching = " while its teachers searched" if args.teacher_budget else ""
        print(f"placer: error: --time-limit {args.time_limit_s:g} s ended train{while_teaching} before its first "
              f"update: nothing was written ({result.measurements_used} measurements spent); give it more time"
              f"{' or a smaller --teacher-budget' if args.teacher_budget else ''}", file=sys.stderr)
        return 1
    return 0


# ---- checks: every one before anything is built or written ----------------------------------------------


def check_train_args(args: argparse.Namespace):
    """(GnnConfig, graph names with families:N expanded, the checked state of the checkpoint --resume
    continues or None); one PlacerError for the first bad input."""
    from cluster.jobs.config import check_counts, check_unique
    from graphs.files import name_too_long
    from graphs.grouping import DEFAULT_MAX_GROUPS
    from graphs.registry import check_graph_name
    from measurers.catalog import load_machine
    from policies.rl.gnn.checkpoint import resume_path
    from policies.rl.gnn.config import GnnConfig

    args.groups_given = args.groups is not None  # its notes name the default as the default
    args.groups = args.groups if args.groups is not None else [DEFAULT_MAX_GROUPS]
    giph = {key: value for key, value in (("episode_steps", args.episode_steps), ("discount", args.discount))
            if value is not None}  # giph-only flags that were given
    if giph and args.policy != "giph":
        flag = "--" + next(iter(giph)).replace("_", "-")
        raise PlacerError(f"{flag}: only for --policy giph (it walks episodes of moves), not {args.policy!r}")
    if args.order is not None and args.policy != "placeto":  # as placer search refuses it
        raise PlacerError(f"--order: only for --policy placeto (it visits groups in order), not {args.policy!r}")
    config = GnnConfig(kind=args.policy, hidden_size=args.hidden, num_layers=args.layers, batch_size=args.batch,
                       lr=args.lr, entropy_coeff=args.entropy_coeff, order=args.order or GnnConfig.order,
                       seed=args.seed, **giph, names=CONFIG_FLAGS)
    for groups in args.groups:
        check_counts(args.budget, groups, args.grouping)
    least = 2 if config.kind == "gdp" else 3  # placeto and giph measure their start first, then a batch of 2
    if args.budget < least:
        raise PlacerError(f"--budget must be at least {least} measurements for {config.kind} (an update measures two "
                          f"placements or more{'' if least == 2 else ', after the start it moves from'}), "
                          f"got {args.budget}")
    for flag, value in (("--teacher-budget", args.teacher_budget), ("--imitation-steps", args.imitation_steps)):
        if value < 0:
            raise PlacerError(f"{flag} must not be negative, got {value}")
    if config.kind == "giph" and args.teacher_budget > 0:
        raise PlacerError("--teacher-budget: giph learns from rewards only (no imitation of a teacher)")
    if args.time_limit_s is not None and not 0 < args.time_limit_s < math.inf:
        raise PlacerError(f"--time-limit must be a positive, finite number of seconds, got {args.time_limit_s}")
    graphs = expand_graphs(args.graphs)
    if not graphs:
        raise PlacerError(f"--graphs {' '.join(args.graphs)}: no graph to train on")
    for name in graphs:
        check_graph_name(name)
    for name in args.machines:
        load_machine(name)
    check_unique(graphs, "--graphs")
    check_unique(args.machines, "--machines")
    check_unique([str(g) for g in args.groups], "--groups")
    problems = len(graphs) * len(args.machines) * len(args.groups)
    if args.teacher_budget and args.teacher_budget * problems > args.budget - 2:  # an update takes 2 or more
        raise PlacerError(f"--teacher-budget {args.teacher_budget} for each of {problems} "
                          f"problem{'s' * (problems != 1)} spends {args.teacher_budget * problems} of --budget "
                          f"{args.budget}: too little is left to learn from rewards")
    read = files_read(args)  # -o itself is checked as every command's output is (cli: check_outputs_spare_inputs)
    for beside, what in ((metrics_path(args.out), "the metrics"), (resume_path(args.out), "the resume state")):
        if problem := name_too_long(beside.name):  # found when training wrote it, its budget spent
            raise PlacerError(f"-o {args.out}: {beside.name}, where {what} go, cannot be written: {problem}; "
                              "choose a shorter -o")
        if beside.exists() and not beside.is_file():  # found only when training writes it, its budget spent
            raise PlacerError(f"{beside}, where {what} of -o {args.out} go, is not a file: move it or choose "
                              "another -o")
        if read_as := read.get(beside.expanduser().resolve()):  # a graph there was replaced by the metrics, exit 0
            raise PlacerError(f"{beside}, where {what} of -o {args.out} go, is a {read_as} this command reads: "
                              "writing it would replace it; choose another -o")
    if not args.resume:
        if Path(args.out).exists():
            raise PlacerError(f"{args.out} exists: pass --resume to continue it, or choose another path")
        return config, graphs, None
    from policies.rl.gnn.family import check_resume

    names = [name for name, _, _, _ in _problem_specs(graphs, args.machines, args.groups)]
    state = check_resume(args.out, config, names, _settings(args), args.budget)  # missing, damaged, another run's
    return config, graphs, state


def _written(path) -> str | None:
    """``path`` as the summary names it: None when the run wrote no file there."""
    return str(path) if Path(path).is_file() else None


def expand_graphs(entries: list[str]) -> list[str]:
    """``families:N`` / ``families:N:START`` -> graphs.families.family_names(N, START); others as given."""
    from graphs.families import family_names

    graphs = []
    for entry in entries:
        if not entry.startswith(FAMILIES_PREFIX):
            graphs.append(entry)
            continue
        parts = entry[len(FAMILIES_PREFIX):].split(":")
        if len(parts) > 2 or not all(p.isascii() and p.isdigit() for p in parts):
            raise PlacerError(f"bad --graphs entry {entry!r}: expected families:N or families:N:START "
                              "(non-negative integers)")
        try:
            graphs.extend(family_names(int(parts[0]), int(parts[1]) if len(parts) == 2 else 0))
        except PlacerError as exc:  # too many graphs: one line naming the entry
            raise PlacerError(f"--graphs {entry}: {exc}") from None
    return graphs


# ---- training ---------------------------------------------------------------------------------------------


def held_out_notes(problems: list) -> list[str]:
    """What the training set holds that the committed checkpoints' figures hold out: the held-out benchmarks
    (by the graph's own source, so a graph file exported from one counts too), imported graphs, and the
    heterogeneous machines from ``HELD_OUT_SEED`` on. Notes, not refusals: training on them is allowed."""
    from graphs.families import HELD_OUT
    from measurers.machine_families import HELD_OUT_SEED, is_hetero_name, parse_hetero_name

    graphs = {id(p.problem.graph): p.problem.graph for p in problems}.values()
    benchmark_of = {id(g): words[1] if len(words := g.source.split()) > 1 and words[0] == "benchmark" else None
                    for g in graphs}  # "benchmark nmt-8 {...}": the benchmark it was built as
    benchmarks = sorted({benchmark_of[id(g)] for g in graphs if benchmark_of[id(g)] in HELD_OUT})
    imported = sorted({g.name for g in graphs if benchmark_of[id(g)] is None
                       and g.framework not in ("synthetic", "manual")
                       and not g.source.startswith(("family:", "graphs.synthetic"))})
    machines = sorted({p.problem.machine.name for p in problems if is_hetero_name(p.problem.machine.name)
                       and parse_hetero_name(p.problem.machine.name) >= HELD_OUT_SEED})
    notes = []
    if benchmarks:
        notes.append(f"training on held-out benchmark {', '.join(benchmarks)}: the committed checkpoints never "
                     "trained on it (the zero-shot figures hold it out)")
    if imported:
        notes.append(f"training on imported graph {', '.join(imported)}: the committed checkpoints never train on "
                     "imported graphs (the figures on models from outside the project hold them out)")
    if machines:
        notes.append(f"training on held-out machine {', '.join(machines)}: seeds from {HELD_OUT_SEED} on are the "
                     "heterogeneous machines a trained placer is tested on")
    return notes


def _problems(graphs: list[str], machines: list[str], args: argparse.Namespace) -> list:
    from graphs.registry import load_graph
    from measurers.catalog import load_machine, machine_to_json
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.rl.gnn.family import TrainProblem

    loaded = {m: load_machine(m) for m in machines}
    graphs_by_name = {g: load_graph(g) for g in graphs}
    _refuse_one_given_twice("--graphs", {g: graph.content_hash for g, graph in graphs_by_name.items()})
    _refuse_one_given_twice("--machines", {m: json.dumps(machine_to_json(machine), sort_keys=True)
                                           for m, machine in loaded.items()})
    for graph in graphs_by_name.values():  # as search notes it
        for groups in args.groups:
            note_groups_above_colocation(groups, graph.num_colocation_groups, graph.name,
                                         given=getattr(args, "groups_given", True))
    problems = []
    for name, graph_name, machine_name, groups in _problem_specs(graphs, machines, args.groups):
        graph, machine = graphs_by_name[graph_name], loaded[machine_name]
        problem = make_problem(graph, machine, max_groups=groups, grouping_method=args.grouping, seed=args.seed)
        problems.append(TrainProblem(name, problem, SimulatorMeasurer(graph, machine)))
    return problems


def _refuse_one_given_twice(flag: str, content_of: dict[str, str]) -> None:
    """Two spellings of one graph or machine (``synthetic:30`` and ``synthetic:30:0``, a file by two paths):
    trained twice as often as the others, each with a memo of its own."""
    first_of: dict[str, str] = {}
    for given, content in content_of.items():
        if content in first_of:
            raise PlacerError(f"{flag}: {first_of[content]!r} and {given!r} are the same "
                              f"{flag[2:-1]}: give it once")
        first_of[content] = given


def _problem_specs(graphs: list[str], machines: list[str], group_counts: list[int]) -> list[tuple]:
    """(problem name, graph, machine, groups) of every problem, in training order."""
    return [(f"{g}@{m}" + (f"/{groups}" if len(group_counts) > 1 else ""), g, m, groups)
            for g in graphs for m in machines for groups in group_counts]


def _settings(args: argparse.Namespace) -> dict:
    """How the problems are built and taught: stored in the checkpoint, and a resumed run must have the same
    (a new --teacher-budget on a resume would run teachers and imitation mid-training). Without a teacher its
    keys are left out, so checkpoints written before they were stored still resume (family.check_resume
    leaves them out for a taught one of then)."""
    from policies.rl.gnn.family import TAUGHT_SETTINGS

    taught = {key: getattr(args, key) for key in TAUGHT_SETTINGS} if args.teacher_budget else {}
    return {"groups": list(args.groups), "grouping": args.grouping, "seed": args.seed, **taught}


def _train(args: argparse.Namespace, config, problems: list, log: "MetricsLog", resumed: dict | None):
    """train_family with the progress bar and the metrics log, continuing ``resumed`` (the checkpoint state
    check_train_args read and checked) when given: (FamilyResult, session seconds). An interrupt stops it
    between updates, with its checkpoint saved: stop reason "interrupted"."""
    import time
    from dataclasses import replace

    import torch

    from cluster.jobs.interrupts import interrupts_deferred
    from policies.rl.gnn.family import train_family

    torch.set_num_threads(1)  # a small network: one thread is fastest, as the search's learners run
    started = time.perf_counter()
    # Ctrl-C (or SIGTERM) while training: a flag the trainer reads between updates, so it stops after a whole
    # update and saves its checkpoint; a second one interrupts at once. (An interrupt raised inside the
    # simulator's compiled code surfaces as a SystemError, and one mid-update leaves the network half-stepped.)
    with _Progress(args.budget) as progress, \
            interrupts_deferred(signals=(signal.SIGINT, signal.SIGTERM)) as interrupted:
        def on_update(metrics) -> None:
            log.append(metrics)
            progress.update(metrics)

        result = train_family(problems, config, args.budget, args.out, resume=args.resume, resume_state=resumed,
                              time_limit_s=args.time_limit_s, should_stop=lambda: interrupted.pressed,
                              on_update=on_update,
                              checkpoint_every=METRICS_EVERY, teacher_budget=args.teacher_budget,
                              imitation_steps=args.imitation_steps, settings=_settings(args))
    if Path(args.out).is_file():  # else stopped while teaching: nothing is written
        log.flush()
    if result.stop_reason == "should_stop":
        result = replace(result, stop_reason="interrupted")
    return result, time.perf_counter() - started


def metrics_path(checkpoint: str | Path) -> Path:
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + ".metrics.parquet")


class MetricsLog:
    """One row per update (every UpdateMetrics field), rewritten atomically from all rows every METRICS_EVERY
    updates (just before train_family writes its checkpoint) and at the end. A resumed run starts from the
    rows of the ``updates_before`` updates its checkpoint holds (rows past them, written by a run stopped
    before its checkpoint was, are updates the resumed run does again)."""

    def __init__(self, path: Path, updates_before: int):
        import pyarrow.parquet as pq

        self.path, self.rows, self.rows_written = path, [], 0
        if not updates_before:
            return
        if not path.is_file():
            print(f"placer: note: {path} is missing: it will hold the rows of this run's updates only",
                  file=sys.stderr)
            return
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise PlacerError(f"{path} is damaged ({exc}): remove it to resume without the earlier rows") from None
        if not table.schema.equals(_schema()):  # another Parquet file: its rows would be nulls in ours
            raise PlacerError(f"{path} is not a training metrics file (columns {', '.join(table.schema.names)}): "
                              "remove it to resume without the earlier rows")
        self.rows = [row for row in table.to_pylist() if row["iteration"] < updates_before]  # by update, not place
        if len(self.rows) < updates_before:  # a run killed between its checkpoint and this file's rewrite
            print(f"placer: note: {path} holds the rows of {len(self.rows)} of the checkpoint's {updates_before} "
                  "updates (the run stopped between its checkpoint and this file): the others' rows are missing",
                  file=sys.stderr)

    def append(self, metrics) -> None:
        from dataclasses import asdict

        self.rows.append(asdict(metrics))
        if (metrics.iteration + 1) % METRICS_EVERY == 0:  # as train_family saves its checkpoint: by updates
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        from cluster.runlog import write_parquet_atomic

        write_parquet_atomic(self.path, pa.Table.from_pylist(self.rows, schema=_schema()))
        self.rows_written = len(self.rows)


def _schema():
    import pyarrow as pa

    from policies.rl.gnn.trainer import UpdateMetrics

    types = {"iteration": pa.int64(), "problem": pa.string(), "measurements_used": pa.int64()}
    return pa.schema([(name, types.get(name, pa.float64())) for name in UpdateMetrics.__dataclass_fields__])


# ---- output -----------------------------------------------------------------------------------------------


class _Progress:
    """A rich progress bar on stderr: measurements of the budget, updates per second, the last problem's
    batch best."""

    def __init__(self, budget: int):
        self.budget, self._bar, self._updates = budget, None, 0

    def __enter__(self):
        from cluster.commands.console import ProgressLines, text_console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                             TextColumn("{task.fields[best]}"), TimeElapsedColumn(),
                             console=text_console(stderr=True), transient=False)
        self._bar.__enter__()
        self._task = self._bar.add_task("train", total=self.budget, rate="", best="")
        self._lines = ProgressLines(self._bar)  # where stderr is a log (a Ray job's): a line now and then
        return self

    def update(self, metrics) -> None:
        self._updates += 1
        task = self._bar.tasks[0]
        rate = self._updates / task.elapsed if task.elapsed else 0.0
        from rich.markup import escape  # a graph file's path, or synthetic:100:3, is no markup

        best = (f"{escape(metrics.problem)}: batch best {seconds_text(metrics.batch_best_runtime_s)} s"
                if math.isfinite(metrics.batch_best_runtime_s) else f"{escape(metrics.problem)}: none ran ok")
        self._bar.update(self._task, completed=min(metrics.measurements_used, self.budget),
                         rate=f"{rate:.1f} updates/s", best=best)
        self._lines.tick()

    def __exit__(self, *exc):
        self._bar.__exit__(*exc)


def print_summary(summary: dict) -> None:
    from cluster.commands.console import text_console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"placer train: {summary['policy']}", show_header=False)
    table.add_column("")
    table.add_column("")
    problems = summary["problems"]
    shown = ", ".join(problems[:4]) + (f", ... ({len(problems)} in all)" if len(problems) > 4 else "")
    for label, value in (("policy", summary["policy"]), ("problems", shown), ("updates", str(summary["updates"])),
                         ("measurements", f"{summary['measurements']} of {summary['budget']}"),
                         ("wall time", f"{summary['wall_s']:.1f} s (this session {summary['session_wall_s']:.1f} s)"),
                         ("updates/s", f"{summary['updates_per_s']:.2f} ({summary['session_updates']} updates this "
                                       "session)"),
                         ("stopped by", summary["stop_reason"]),
                         ("checkpoint", summary["checkpoint"] or "not written"),
                         ("resume file", summary["resume"] or "not written"),
                         ("metrics", summary["metrics"] or "not written")):
        table.add_row(label, Text(value))  # plain text: a path's brackets are no markup
    text_console().print(table)
