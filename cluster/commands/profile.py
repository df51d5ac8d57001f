"""`placer profile`: time every op on every local device model and write a profile the simulator reads."""

from __future__ import annotations

import sys
from pathlib import Path

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
    parser.add_argument("--machine-out", metavar="FILE", type=output_file,
                        help="also time copies over each link between two torch devices (--measurer torch; a "
                             "link between devices torch runs as one, e.g. two CPUs, keeps its figures) and write "
                             "a machine file with the fitted latency and bandwidth, naming the profile: the "
                             "simulator then models this node as measured (placer simulate --machine FILE)")
    parser.add_argument("--runs", type=int, default=3, metavar="N", help="timed runs per op (median; default 3)")
    parser.add_argument("--warmup", type=int, default=1, metavar="W", help="untimed runs first (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_profile)


def _profile(args) -> int:
    from graphs.tensorflow_quiet import import_tensorflow_quietly
    from cluster.jobs.config import check_measurer_settings
    from graphs.errors import PlacerError, check_seed
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.costs import save_profile
    from measurers.profiler import profile_graph

    check_measurer_settings(args.measurer, args.runs, args.warmup)  # as placer measure's (10**11 runs: 745 GiB)
    check_seed(args.seed, "--seed")  # torch took a negative one; one past 2**63 was a traceback
    if args.machine_out and args.measurer != "torch":
        raise PlacerError(f"--machine-out times copies with PyTorch: it needs --measurer torch, not {args.measurer}")
    if args.machine_out and Path(args.machine_out).resolve() == Path(args.output).resolve():
        raise PlacerError(f"--machine-out and -o are the same file ({args.output}): the machine file names the "
                          "profile, so each needs its own")
    if args.measurer == "tf":
        import_tensorflow_quietly()
    graph = load_graph(args.graph)
    machine = load_machine(args.machine)
    try:
        profile = profile_graph(graph, machine, args.measurer, args.runs, args.warmup, args.seed)
    except PlacerError:
        raise
    except Exception as exc:  # the user's step failed (out of memory on a GPU, an op that raises): say which
        raise PlacerError(f"the step of {graph.name} failed while it was profiled on {machine.name} "
                          f"({type(exc).__name__}: {_failure(exc, args.measurer)}); no profile was written") from None
    save_profile(profile, args.output)
    models = sorted(set(profile.device_models.tolist()))
    print(f"profiled {len(profile.op_names)} (op, device model) times of {graph.name} on {', '.join(models)} "
          f"-> {args.output}")
    if profile.untimed:
        _note_untimed(profile.untimed)
    if args.machine_out:
        try:
            measured = _measured_links(machine)
        except PlacerError as error:  # the profile took minutes: keep it, and say the machine file is missing
            raise PlacerError(f"{error}; the profile was saved to {args.output}, no machine file was written "
                              f"to {args.machine_out}") from error
        _save_machine(*measured, args.machine_out, args.output)
    return 0


def _failure(exc: BaseException, measurer: str) -> str:
    """What went wrong, in a line: OpenVINO's first line is a C++ source location ("Exception from
    src/inference/src/cpp/core.cpp:117:"), its reason on the lines after."""
    from graphs.errors import first_line, one_line

    if measurer == "openvino":
        from measurers.openvino.inputs import ov_message

        return one_line(ov_message(exc))
    return first_line(exc)


def _note_untimed(untimed: tuple[str, ...]) -> None:
    """Say which ops ran but are not in the profile (the simulator's cost model times them instead)."""
    shown = ", ".join(untimed[:5]) + (f", ... ({len(untimed) - 5} more)" if len(untimed) > 5 else "")
    print(f"placer: note: {len(untimed)} ops ran inside function calls TensorFlow did not inline (_noinline, "
          f"jit_compile), or share a name with such an op, and its step stats do not tell them apart: they are "
          f"not in the profile (the cost model times them): {shown}", file=sys.stderr)


def _measured_links(machine):
    """(``machine`` with its timed links fitted, the (src, dst) of each timed link)."""
    from measurers.link_calibration import calibrated_machine, time_torch_copies
    from measurers.torch.measurer import default_torch_devices

    timings = time_torch_copies(machine, default_torch_devices(machine))
    return calibrated_machine(machine, timings), {(t.src, t.dst) for t in timings}


def _save_machine(machine, timed: set, path: str, profile_path: str) -> None:
    """The machine file, naming the profile (by its path relative to the machine file's folder). Its machine
    is named after the one profiled and the file (``local@node`` for node.json): runs on it simulate with
    other op times and links, and `placer analyze` groups runs by machine name."""
    import dataclasses

    from measurers.machine_json import save_machine

    name = f"{machine.name.partition('@')[0]}@{Path(path).stem}"
    save_machine(dataclasses.replace(machine, name=name, profile=profile_path), path)
    print(f"machine with {_links_summary(machine.links, timed)} -> {path}")


def _links_summary(links, timed: set) -> str:
    """What the machine file's links are: the fitted figures of the timed ones, how many kept their own."""
    fitted = [f"{link.src}->{link.dst} {link.bandwidth_Bps / 1e9:.2f} GB/s + {link.latency_s * 1e6:.1f} us"
              for link in links if (link.src, link.dst) in timed]
    kept = len(links) - len(fitted)  # both ends one torch device (a node without GPUs): no copy to time
    if not links:
        return "no link to measure (one device)"
    parts = [f"links measured here ({', '.join(fitted)})"] if fitted else ["no link measured"]
    if kept:
        parts.append(f"{kept} kept as given (both ends one torch device)")
    return "; ".join(parts)
