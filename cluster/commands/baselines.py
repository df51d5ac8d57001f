"""`placer baselines`: every non-learning placer on one graph and machine, scored by the same measurer.

Prints one table (policy, step time, status, ratio to the lower bound and to the best single GPU,
placement time, measurements), or JSON with ``--json``. ``--out DIR`` writes a run log
(``cluster/runlog.py``: every measurement of every policy, tagged with the policy) plus
``baselines.json`` (the table) in the run's folder.
"""

from __future__ import annotations

import argparse
import math

from cluster.commands.notes import note_fewer_groups_than_asked, note_groups_above_colocation
from cluster.commands.paths import runs_folder
from cluster.jsonout import emit_json


def register(subparsers) -> None:
    from cluster.jobs import BaselinesConfig

    d = BaselinesConfig  # its fields' defaults are the flags' defaults (graph and machine have none)
    parser = subparsers.add_parser("baselines", help="run the baseline placers and compare them")
    parser.add_argument("--graph", required=True, metavar="NAME_OR_FILE", help="benchmark name or graph file")
    parser.add_argument("--machine", required=True, metavar="NAME_OR_FILE", help="catalog machine or JSON file")
    parser.add_argument("--policies", default=None, metavar="A,B,...",
                        help="policies to run (default: every heuristic and search but exact, which runs only "
                             "when named; device:K is everything on device K)")
    parser.add_argument("--budget", type=int, default=d.budget, metavar="N",
                        help=f"measurements each search may use (heuristics use one; default {d.budget})")
    parser.add_argument("--groups", type=int, default=None, metavar="G",  # None: not given, d.groups
                        help=f"searches place at most G groups (default {d.groups}, as placer search)")
    parser.add_argument("--grouping", default=d.grouping,
                        help=f"how the searches' groups are made (default {d.grouping}, as placer search)")
    parser.add_argument("--seed", type=int, default=d.seed, metavar="S")
    parser.add_argument("--measurer", default=d.measurer, choices=("sim", "torch", "tf", "openvino"),
                        help=f"sim: the simulator in this process; torch|tf|openvino: real runs through the "
                             f"Ray measurer pool, on whatever devices the nodes have (default {d.measurer})")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per placement, median reported "
                        "(default: measurers.timing.default_timing, 1 for sim, 5 for torch/tf, 10 for openvino)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed runs first (default 0 for sim, 5 for torch/tf, 3 for openvino)")
    parser.add_argument("--ray-address", default=None, help="real measurers: join this Ray cluster")
    parser.add_argument("--bound-time-limit", type=float, default=d.bound_time_limit_s, dest="bound_time_limit_s",
                        metavar="S", help=f"seconds for the proven bound on the searches' groups (placer bound; "
                                          f"default {d.bound_time_limit_s:g}, 0: the closed form only)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--out", default=None, metavar="DIR", type=runs_folder, help="write a run log under DIR")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from cluster.jobs import BaselinesConfig, run_baselines

    policies = None if args.policies is None else tuple(p.strip() for p in args.policies.split(","))
    names = BaselinesConfig.__dataclass_fields__
    given = args.groups is not None
    groups = args.groups if given else BaselinesConfig.groups
    config = BaselinesConfig(**{**{k: v for k, v in vars(args).items() if k in names}, "policies": policies,
                                "groups": groups})
    outcome = run_baselines(config)
    note_groups_above_colocation(groups, outcome.colocation_groups, outcome.table.graph, given=given)
    note_fewer_groups_than_asked(groups, outcome.groups, outcome.colocation_groups, outcome.table.graph,
                                 outcome.grouping, given=given)
    if args.json:  # the run folder (--out), as `placer search --json` names its own; baselines.json has no need
        emit_json({**outcome.to_json(), "run_dir": None if outcome.run_dir is None else str(outcome.run_dir)})
    else:
        print_table(outcome.table, outcome.proven_bound)
        if outcome.run_dir is not None:
            print(f"run log: {outcome.run_dir}")
    return 0


def print_table(table, bound: tuple[float, str] | None = None) -> None:
    """``bound``: the proven bound of the searches' groups (seconds, what it holds for), or None."""
    from cluster.commands.console import text_console
    from cluster.jobs.baselines import ratio_to_proven_bound
    from rich.table import Table

    def fmt(x, spec):
        return "-" if x is None or not math.isfinite(x) else format(x, spec)

    best = table.best()
    title = (f"{table.graph} on {table.machine}: lower bound {table.lower_bound_s:.4g} s, "
             f"best single GPU {fmt(table.single_gpu_s, '.4g')} s")
    if bound is not None:  # heuristics place colocation groups: a bound for coarser groups need not hold for them
        title += f"; proven bound {bound[0]:.4g} s for {bound[1]}"
    out = Table(title=title)
    for column in ("policy", "step time (s)", "status", "x lower bound", "x proven bound", "x single GPU",
                   "placement time (s)", "measurements", "notes"):
        out.add_column(column, justify="left" if column in ("policy", "status", "notes") else "right")
    for row in table.rows:
        style = "bold" if best is not None and row is best else None
        out.add_row(row.policy, fmt(row.runtime_s, ".4g"), row.status, fmt(row.ratio_to_lower_bound, ".3f"),
                    fmt(ratio_to_proven_bound(row, bound), ".3f"), fmt(row.ratio_to_single_gpu, ".3f"),
                    fmt(row.placement_time_s, ".3g"),
                    str(row.measurements), row.notes, style=style)
    text_console(width=200).print(out)
