"""`placer measure`: time one placement of one graph with a real framework (PyTorch, TensorFlow, or OpenVINO
for imported inference graphs)."""

from __future__ import annotations

from cluster.jsonout import emit_json
from measurers.timing import INFERENCE_TIMING, REAL_TIMING


def register(subparsers) -> None:
    parser = subparsers.add_parser("measure", help="run one placement for real and time it (median of N)")
    parser.add_argument("--graph", required=True, metavar="NAME_OR_FILE", help="benchmark or graph file")
    parser.add_argument("--machine", default="local", metavar="NAME_OR_FILE",
                        help="'local' (this node's devices, the default), 'openvino' (the devices OpenVINO sees "
                             "here) or a machine whose devices it has")
    parser.add_argument("--measurer", required=True, choices=("torch", "tf", "openvino"),
                        help="openvino: graphs imported from ONNX or OpenVINO IR (placer graphs import), "
                             "per-op devices through OpenVINO's HETERO mode")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--placement", metavar="FILE", help="placement JSON (device name per op or per group), "
                     "or a run folder (its best placement)")
    how.add_argument("--policy", metavar="NAME", help="any heuristic of `placer baselines` "
                     "(single-gpu, cpu-only, round-robin, expert, m-etf, ..., device:K)")
    parser.add_argument("--runs", type=int, metavar="N",
                        help=f"timed runs (default {REAL_TIMING.runs}; openvino {INFERENCE_TIMING.runs})")
    parser.add_argument("--warmup", type=int, metavar="W",
                        help=f"untimed runs first (default {REAL_TIMING.warmup}; openvino {INFERENCE_TIMING.warmup})")
    parser.add_argument("--timeout", type=float, default=REAL_TIMING.timeout_s, metavar="S",
                        help=f"limit for the measurement in seconds (default {REAL_TIMING.timeout_s:g})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the parameters and inputs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_measure)


def _check_args(args) -> None:
    """The numbers, named by their flags, before anything is loaded (MeasurerSpec named its fields)."""
    from cluster.jobs.config import check_measurer_settings
    from graphs.errors import PlacerError, check_seed

    check_measurer_settings(args.measurer, args.runs, args.warmup)
    if not args.timeout > 0:  # NaN too
        raise PlacerError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    check_seed(args.seed, "--seed")


def _measure(args) -> int:
    from graphs.tensorflow_quiet import import_tensorflow_quietly
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.factory import MeasurerSpec, build_measurer
    from cluster.run_best import load_placement
    from measurers.timing import default_timing
    from policies.registry import place_once

    _check_args(args)
    timing = default_timing(args.measurer)
    args.runs = timing.runs if args.runs is None else args.runs
    args.warmup = timing.warmup if args.warmup is None else args.warmup

    if args.measurer == "tf":
        import_tensorflow_quietly()
    graph = load_graph(args.graph)
    machine = load_machine(args.machine)
    if args.placement:
        placement = load_placement(args.placement, graph, machine)
    else:  # placed (and scored) in the simulator first: a heuristic this machine cannot run, or an unknown
        # name, fails in seconds, not after the real step is built and captured (minutes for an RNNLM)
        simulator = build_measurer(MeasurerSpec("sim", graph, machine))
        placement = place_once(args.policy, graph, machine, simulator, args.seed).op_placement
    spec = MeasurerSpec(args.measurer, graph, machine, runs=args.runs, warmup=args.warmup, seed=args.seed,
                        timeout_s=args.timeout)
    measurer = build_measurer(spec)
    if hasattr(measurer, "check_ready"):  # it measures in this process: devices it lacks are bad input,
        measurer.check_ready()  # and so is a step it cannot rebuild
    measurement = measurer.measure([placement])[0]
    report = {
        "graph": graph.name, "machine": machine.name, "measurer": args.measurer, "runs": args.runs,
        "warmup": args.warmup, "runtime_s": measurement.runtime_s, "samples_s": list(measurement.samples_s),
        "status": measurement.status, "error": measurement.error, "measure_s": measurement.measure_s,
        "devices": [{"name": d.name, "model": d.model, "peak_bytes": int(b) if d.kind == "gpu" else None}
                    for d, b in zip(machine.devices, measurement.peak_bytes)],  # only GPU memory is measured
    }
    if args.json:
        emit_json(report)
    else:
        step = (f"step {measurement.runtime_s:.6g} s ({measurement.status}), median of "
                f"{len(measurement.samples_s)} after {args.warmup} warm-up runs" if measurement.ok else
                f"no step time ({measurement.status}, {len(measurement.samples_s)} timed runs)")
        print(f"{graph.name} on {machine.name} ({args.measurer}): {step}")
        if measurement.error:
            print(f"  {measurement.error}")
        for d, device in zip(report["devices"], machine.devices):  # only GPU memory is measured
            peak = f"peak {d['peak_bytes'] / 1e9:.3f} GB" if device.kind == "gpu" else "peak not measured"
            print(f"  {d['name']:8s} {d['model']:30s} {peak}")
    return 0 if measurement.ok else 1
