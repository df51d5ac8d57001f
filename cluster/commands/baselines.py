"""`placer baselines`: every non-learning placer on one graph and machine, scored by the same measurer.

Prints one table (policy, step time, status, ratio to the lower bound and to the best single GPU,
placement time, measurements), or JSON with ``--json``. ``--out DIR`` writes a run log
(``cluster/runlog.py``: every measurement of every policy, tagged with the policy) plus
``baselines.json`` (the table) in the run's folder.
"""

from __future__ import annotations

import argparse
import json
import math

from cluster.commands.notes import note_groups_above_colocation
from cluster.jsonout import emit_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("baselines", help="run the baseline placers and compare them")
    parser.add_argument("--graph", required=True, metavar="NAME_OR_FILE", help="benchmark name or graph file")
    parser.add_argument("--machine", required=True, metavar="NAME_OR_FILE", help="catalog machine or JSON file")
    parser.add_argument("--policies", default=None, metavar="A,B,...",
                        help="policies to run (default: all; device:K is everything on device K)")
    parser.add_argument("--budget", type=int, default=500, metavar="N",
                        help="measurements each search may use (heuristics use one; default 500)")
    parser.add_argument("--groups", type=int, default=256, metavar="G",
                        help="searches place at most G groups (default 256)")
    parser.add_argument("--grouping", default="metis", help="how the searches' groups are made: metis (default), "
                        "scope (as `placer search`), colocation or topo")
    parser.add_argument("--seed", type=int, default=0, metavar="S")
    parser.add_argument("--measurer", default="sim", choices=("sim", "torch", "tf"),
                        help="sim: the simulator in this process (default); torch|tf: real runs through the "
                             "Ray measurer pool, on whatever devices the nodes have")
    parser.add_argument("--runs", type=int, default=5, help="real measurers: timed runs per placement (median)")
    parser.add_argument("--warmup", type=int, default=5, help="real measurers: untimed runs first")
    parser.add_argument("--ray-address", default=None, help="real measurers: join this Ray cluster")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--out", default=None, metavar="DIR", help="write a run log under DIR")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from graphs.errors import PlacerError
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.base import DEFAULT_POLICIES, make_policy, make_problem
    from policies.table import run_baselines

    policies = DEFAULT_POLICIES if args.policies is None else tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if not policies:
        raise PlacerError("--policies names no policy")
    for name in policies:
        make_policy(name)  # unknown names fail before any work
    if args.budget < 1:
        raise PlacerError(f"--budget must be at least 1, got {args.budget}")
    if args.groups < 1:
        raise PlacerError(f"--groups must be at least 1, got {args.groups}")
    graph = load_graph(args.graph)
    machine = load_machine(args.machine)
    problem = make_problem(graph, machine, max_groups=args.groups, grouping_method=args.grouping, seed=args.seed)
    note_groups_above_colocation(args.groups, graph.num_colocation_groups, graph.name)
    pool = None
    if args.measurer == "sim":
        measurer = SimulatorMeasurer(graph, machine, seed=args.seed)
    else:
        pool = measurer = _real_pool(args, graph, machine)
    log = _open_log(args, graph, machine, policies) if args.out else None
    try:
        table = run_baselines(problem, measurer, policies, args.budget, args.seed,
                              on_measurement=None if log is None else _logger(log))
    finally:
        if log is not None:
            log.close()
        if pool is not None:
            from cluster import ray_setup

            pool.close()
            ray_setup.shutdown_ray()
    payload = table_json(table)
    payload["groups"] = problem.num_units  # the groups the searches placed (at most --groups)
    if log is not None:
        (log.folder / "baselines.json").write_text(json.dumps(payload, indent=2))
    if args.json:
        emit_json(payload)
    else:
        print_table(table)
        if log is not None:
            print(f"run log: {log.folder}")
    return 0


def _real_pool(args, graph, machine):
    """A measurer pool running the real PyTorch/TensorFlow measurer on every node (one placement per call,
    so a time limit applies to one placement)."""
    from cluster import ray_setup
    from cluster.pool import MeasurerPool, PoolConfig
    from measurers.factory import MeasurerSpec

    spec = MeasurerSpec(args.measurer, graph, machine, runs=args.runs, warmup=args.warmup, seed=args.seed)
    ray_setup.init_ray(args.ray_address)
    try:
        return MeasurerPool(spec, PoolConfig(chunk_size=1))
    except BaseException:
        ray_setup.shutdown_ray()
        raise


def table_json(table) -> dict:
    def number(x):
        return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x

    return {
        "graph": table.graph,
        "machine": table.machine,
        "lower_bound_s": table.lower_bound_s,
        "single_gpu_s": number(table.single_gpu_s),
        "results": [{
            "policy": row.policy,
            "runtime_s": number(row.runtime_s),
            "status": row.status,
            "ratio_to_lower_bound": number(row.ratio_to_lower_bound),
            "ratio_to_single_gpu": number(row.ratio_to_single_gpu),
            "placement_time_s": row.placement_time_s,
            "measure_time_s": row.measure_time_s,
            "measurements": row.measurements,
            "notes": row.notes,
        } for row in table.rows],
    }


def print_table(table) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(x, spec):
        return "-" if x is None or not math.isfinite(x) else format(x, spec)

    best = table.best()
    out = Table(title=f"{table.graph} on {table.machine}: lower bound {table.lower_bound_s:.4g} s, "
                      f"best single GPU {fmt(table.single_gpu_s, '.4g')} s")
    for column in ("policy", "step time (s)", "status", "x lower bound", "x single GPU", "placement time (s)",
                   "measurements", "notes"):
        out.add_column(column, justify="left" if column in ("policy", "status", "notes") else "right")
    for row in table.rows:
        style = "bold" if best is not None and row is best else None
        out.add_row(row.policy, fmt(row.runtime_s, ".4g"), row.status, fmt(row.ratio_to_lower_bound, ".3f"),
                    fmt(row.ratio_to_single_gpu, ".3f"), fmt(row.placement_time_s, ".3g"), str(row.measurements),
                    row.notes, style=style)
    Console(width=200).print(out)


def _open_log(args, graph, machine, policies):
    from cluster.runlog import RunLogWriter, make_run_id, new_manifest
    from measurers.timing import default_timing

    config = {"policies": list(policies), "budget": args.budget, "groups": args.groups, "grouping": args.grouping,
              "measurer": args.measurer}
    timing = default_timing(args.measurer)  # what --runs / --warmup left unset mean (as MeasurerSpec)
    manifest = new_manifest(make_run_id(graph.name, "baselines", args.seed), graph, machine, seed=args.seed,
                            policy="baselines", config=config,
                            runs=timing.runs if args.runs is None else args.runs,
                            warmup=timing.warmup if args.warmup is None else args.warmup)
    return RunLogWriter.create(args.out, manifest)


def _logger(log):
    """on_measurement for run_baselines: one run-log row per measurement, tagged with the policy."""
    import time

    from cluster.pool import PoolResult
    from cluster.runlog import LoggedPlacement

    counter = iter(range(1 << 62))

    def record(policy, placement, measurement):  # placement: the (N,) op placement measured
        now = time.time()
        log.append(PoolResult(next(counter), placement, measurement, "", "", now, now, now, policy=policy,
                              log_placement=LoggedPlacement(placement, "op")))

    return record
