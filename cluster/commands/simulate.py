"""`placer simulate`: one placement of one graph on one machine, in the simulator."""

from __future__ import annotations

import sys

import numpy as np

from cluster.commands.console import column_figure
from cluster.commands.paths import output_file
from cluster.jsonout import emit_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="simulate one placement: step time, memory, lower bound")
    parser.add_argument("--graph", required=True, metavar="NAME_OR_FILE", help="benchmark, synthetic:N[:SEED] or file")
    parser.add_argument("--machine", required=True, metavar="NAME_OR_FILE", help="catalog machine or machine file")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--placement", metavar="FILE", help="placement JSON (device name per op or per group), "
                     "or a run folder (its best placement)")
    how.add_argument("--policy", metavar="NAME", help="any heuristic of `placer baselines` "
                     "(single-gpu, cpu-only, round-robin, expert, m-etf, ..., device:K)")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="the seed a --policy places with (as `placer baselines --seed`; metis, random...)")
    parser.add_argument("--engine", choices=("reference", "fast"), default="fast")
    parser.add_argument("--profile", metavar="FILE", help="measured per-op times (JSON or Parquet)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trace", metavar="FILE", type=output_file, help="write the timeline in Chrome trace format")
    parser.set_defaults(func=_simulate)


def _simulate(args) -> int:
    import time

    from graphs.errors import PlacerError, check_seed
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.costs import load_profile
    from cluster.run_best import load_placement
    from measurers.sim.measurer import SimulatorMeasurer
    from measurers.sim.reference import Simulator
    from policies.registry import place_once

    check_seed(args.seed, "--seed")
    if args.placement and args.seed:
        raise PlacerError("--seed: only with --policy (a placement file is placed already)")
    graph = load_graph(args.graph)
    machine = load_machine(args.machine)
    profile = load_profile(args.profile) if args.profile else None
    if profile is not None:
        profile.check_graph(graph, f"--profile {args.profile}")
        _note_profile_that_changes_nothing(profile, graph, machine, args.profile)
    if args.placement:
        placement = load_placement(args.placement, graph, machine)
    else:
        measurer = SimulatorMeasurer(graph, machine, profile=profile, engine=args.engine)
        placement = place_once(args.policy, graph, machine, measurer, args.seed, profile=profile).op_placement
    simulator = Simulator(graph, machine, profile=profile, engine=args.engine)
    if args.engine == "fast":
        from measurers.sim.fast import warm_up

        warm_up()  # loads (or compiles) the compiled engine: not part of simulate_s
    began = time.perf_counter()
    result = simulator.run(placement, timeline=bool(args.trace))
    simulate_s = time.perf_counter() - began
    if args.trace:
        from measurers.sim.trace import write_trace

        write_trace(args.trace, graph, machine, result)
    report = {
        "graph": graph.name, "machine": machine.name, "engine": args.engine,
        "runtime_s": result.runtime_s, "status": result.status, "lower_bound_s": simulator.lower_bound_s,
        "simulate_s": simulate_s,
        "devices": [{"name": d.name, "busy_s": float(result.busy_s[i]), "peak_bytes": int(result.peak_bytes[i]),
                     "capacity_bytes": int(result.capacity_bytes[i])} for i, d in enumerate(machine.devices)],
        "link_bytes": {f"{l.src}->{l.dst}": int(b) for l, b in zip(machine.links, result.link_bytes) if b},
    }
    if args.json:
        emit_json(report)
        return 0
    print(f"{graph.name} on {machine.name}: step {result.runtime_s:.6g} s ({result.status}), "
          f"lower bound {report['lower_bound_s']:.6g} s, simulated in {simulate_s * 1e3:.2f} ms ({args.engine})")
    print(f"{'device':8s} {'busy s':>10s} {'peak GB':>9s} {'capacity GB':>11s}")
    for d in report["devices"]:
        flag = "  OOM" if d["peak_bytes"] > d["capacity_bytes"] else ""
        print(f"{d['name']:8s} {d['busy_s']:10.4g} {column_figure(d['peak_bytes'] / 1e9, 9, 3)} "
              f"{column_figure(d['capacity_bytes'] / 1e9, 11, 1)}{flag}")
    if args.trace:
        print(f"trace: {args.trace} (Chrome trace format: open it in Perfetto or chrome://tracing)")
    return 0


def _note_profile_that_changes_nothing(profile, graph, machine, path: str) -> None:
    """A profile measured on other device models, or of ops the graph lacks (another graph's names, a
    hand-written file's typos), or whose ops of this graph were all measured on models the machine lacks,
    changes no op time: say so rather than print the cost model's figure as if it were the profile's."""
    measured = sorted(set(profile.device_models.tolist()))
    models = sorted({device.model for device in machine.devices})
    profiled_ops = set(profile.op_names.tolist())
    if not set(measured) & set(models):
        print(f"placer: note: --profile {path} has times for {', '.join(measured) or 'no device model'}, none of "
              f"the device models of machine {machine.name!r} ({', '.join(models)}): it changes nothing",
              file=sys.stderr)
    elif not profiled_ops & set(graph.op_names):
        print(f"placer: note: --profile {path} has times for {len(profiled_ops)} ops, none of them an op of graph "
              f"{graph.name!r}: it changes nothing", file=sys.stderr)
    elif profile.apply(graph, machine, np.zeros((graph.num_ops, machine.num_devices))) == 0:
        print(f"placer: note: --profile {path} has no time of an op of graph {graph.name!r} on a device model of "
              f"machine {machine.name!r} (this graph's ops were timed on other models): it changes nothing",
              file=sys.stderr)
