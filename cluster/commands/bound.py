"""`placer bound`: the best proven lower bound on a graph's step time on a machine (policies/exact/bound.py).

Each bound with what it holds for: the closed form (critical path, work / devices: every placement), the
LP and MIP relaxations of the simulator and, on a few single-op groups, the exact solver's (placements of
the searched groups that fit in memory; a bound for a coarsening is not a bound for finer placements).
"""

from __future__ import annotations

import argparse
import math

from cluster.jsonout import emit_json

DEFAULT_TIME_LIMIT_S = 60.0


def register(subparsers) -> None:
    from graphs.grouping import DEFAULT_MAX_GROUPS, DEFAULT_METHOD

    p = subparsers.add_parser("bound", help="the best proven lower bound on the step time, and what it holds for",
                              description="Closed-form bound (every placement), and the LP and MIP relaxations "
                                          "of the simulator (HiGHS) for the placements of the searched groups.")
    p.add_argument("--graph", required=True, metavar="NAME_OR_FILE", help="benchmark name or graph file")
    p.add_argument("--machine", required=True, metavar="NAME_OR_FILE", help="catalog machine or JSON file")
    p.add_argument("--groups", type=int, default=DEFAULT_MAX_GROUPS, metavar="G",
                   help=f"the grouping the relaxations place (default {DEFAULT_MAX_GROUPS}, as placer search)")
    p.add_argument("--grouping", default=DEFAULT_METHOD,
                   help=f"how ops become groups (default {DEFAULT_METHOD}, as placer search)")
    p.add_argument("--seed", type=int, default=0, help="the grouping's seed, as placer search --seed (default 0)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, dest="time_limit_s", metavar="S",
                   help=f"seconds for the LP, the MIP and (a few single-op groups) CP-SAT together "
                        f"(default {DEFAULT_TIME_LIMIT_S:g}; 0: the closed form only)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cluster.jobs.config import check_bound_time_limit, check_counts
    from cluster.jsonout import json_safe
    from graphs.registry import check_graph_name, load_graph
    from measurers.catalog import load_machine
    from graphs.errors import check_seed
    from policies.exact.bound import proven_bound
    from policies.problem import make_problem

    check_bound_time_limit(args.time_limit_s, flag="--time-limit")
    check_counts(1, args.groups, args.grouping)
    check_seed(args.seed, "--seed")
    check_graph_name(args.graph)
    machine = load_machine(args.machine)
    problem = make_problem(load_graph(args.graph), machine, max_groups=args.groups, grouping_method=args.grouping,
                           seed=args.seed)
    report = proven_bound(problem, args.time_limit_s)
    if args.json:
        emit_json(json_safe({**report.to_json(), "groups": problem.num_units}))
    else:
        print_report(report)
    return 0


def print_report(report) -> None:
    from cluster.commands.console import seconds_text, text_console
    from rich.table import Table

    from policies.exact.bound import EVERY_PLACEMENT, SKIPPED

    def seconds(x):
        return "-" if x is None or not math.isfinite(x) else seconds_text(x)

    within = f"{report.grouping} and fit in memory"
    table = Table(title=f"{report.graph} on {report.machine}: proven lower bounds on the step time "
                        f"(time limit {report.time_limit_s:g} s)")
    for column in ("bound", "step time (s)", "status", "holds for placements that", "wall (s)"):
        table.add_column(column, justify="right" if column in ("step time (s)", "wall (s)") else "left")
    table.add_row("closed form (critical path, work / devices)", seconds(report.closed_form_s), "proven",
                  "any (every placement)", "-")
    table.add_row("LP relaxation", seconds(report.lp_s), report.lp_status, f"keep each of {within}",
                  f"{report.lp_wall_s:.1f}")
    table.add_row("MIP relaxation (HiGHS dual bound)", seconds(report.mip_s), report.mip_status,
                  f"keep each of {within}", f"{report.mip_wall_s:.1f}")
    if report.exact_status != SKIPPED:  # a few single-op groups: the exact solver's model is the simulator
        table.add_row("exact solver (CP-SAT bound)", seconds(report.exact_s), report.exact_status,
                      f"keep each of {within}", f"{report.exact_wall_s:.1f}")
    table.add_row("best", seconds(report.best_s), "", "any (every placement)" if report.holds_for == EVERY_PLACEMENT
                  else f"keep each of {within}", f"{report.wall_s:.1f}", style="bold")
    text_console(width=200).print(table)
