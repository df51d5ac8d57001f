"""`placer profile`: time every op on every local device model and write a profile the simulator reads."""

from __future__ import annotations

from cluster.commands.paths import output_file


def register(subparsers) -> None:
    parser = subparsers.add_parser("profile", help="time each op on each device model (for simulate --profile)")
    parser.add_argument("--graph", required=True, metavar="NAME_OR_FILE", help="benchmark or graph file")
    parser.add_argument("--machine", default="local", metavar="NAME_OR_FILE", help="default: this node ('local')")
    parser.add_argument("--measurer", required=True, choices=("torch", "tf", "openvino"),
                        help="openvino: graphs imported from ONNX or OpenVINO IR, timed by OpenVINO's performance "
                             "counters (--machine openvino: the devices OpenVINO sees here)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", type=output_file,
                        help="profile file (.json or .parquet)")
    parser.add_argument("--runs", type=int, default=3, metavar="N", help="timed runs per op (median; default 3)")
    parser.add_argument("--warmup", type=int, default=1, metavar="W", help="untimed runs first (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_profile)


def _profile(args) -> int:
    from cluster.commands.tensorflow_quiet import import_tensorflow_quietly
    from graphs.errors import PlacerError
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.costs import save_profile
    from measurers.profiler import profile_graph
    from policies.base import check_seed

    if args.runs < 1 or args.warmup < 0:
        raise PlacerError("--runs must be at least 1 and --warmup not negative")
    check_seed(args.seed, "--seed")  # torch took a negative one; one past 2**63 was a traceback
    if args.measurer == "tf":
        import_tensorflow_quietly()
    graph = load_graph(args.graph)
    machine = load_machine(args.machine)
    profile = profile_graph(graph, machine, args.measurer, args.runs, args.warmup, args.seed)
    save_profile(profile, args.output)
    models = sorted(set(profile.device_models.tolist()))
    print(f"profiled {len(profile.op_names)} (op, device model) times of {graph.name} on {', '.join(models)} "
          f"-> {args.output}")
    return 0
