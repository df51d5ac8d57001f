"""Issue 15's tables for ``giph``: machines and graphs it never trained on, and a device that leaves.

Sections (the simulator in this process, 32 scope groups, torch on one thread)::

    unseen   each held-out machine x graph x seed, budget --budget: heft (one measurement, colocation
             groups), then from four starts: the fastest single device ("1dev"), HEFT's placement on the
             groups ("heft"), HEFT's own on the groups split by HEFT's devices ("heft-split": `placer
             search --warm-start heft --split-groups heft`), and the best of cpu-only, single-gpu and HEFT's
             on those groups ("both-split": `--warm-start cpu-only,single-gpu,heft --split-groups heft`):
             giph's start and its greedy moves with no update (the starts plus
             episode_steps measurements, "zero-shot"), giph (pre-trained and from scratch), placeto and
             annealing after --budget measurements, and cem (which takes no start) on the same groups
    tune     giph's search settings on machines it trained on (hetero:2-7, 9, 11; seeds 0 1), from the
             best-of-three start on split groups, budget --budget: moves per episode and episodes per
             update against annealing from the same start (the default, 3 moves x 2, was chosen here)
    removal  giph runs --before measurements on each --removal-machines, the GPU holding the most groups of
             its best placement leaves, the same instance continues (warm start: that best with the GPU's
             groups moved as `placer search --remove-device` moves them) against a fresh giph on the smaller
             machine with --budget: measurements to come within 10% of the fresh search's result

Usage::

    python tests/bench/bench_giph.py [unseen|tune|removal] [--seeds 0 1 2] [--budget 200] [--init PATH]
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

MACHINES = ("k80-v100", "a100-h100", "desktop-igpu", "hetero:1000", "hetero:1002")
GRAPHS = ("resnet-50", "inception-v3", "transformer")
STARTS = ("1dev", "heft", "heft-split", "both-split")


def _setup(graph_name: str, machine, seed: int):
    from graphs.grouping import DEFAULT_MAX_GROUPS
    from graphs.registry import load_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem

    graph = load_graph(graph_name)
    machine = load_machine(machine) if isinstance(machine, str) else machine
    return (make_problem(graph, machine, max_groups=DEFAULT_MAX_GROUPS, seed=seed),
            SimulatorMeasurer(graph, machine))


def _runtime(result) -> float:
    return result.best.runtime_s if result.best.ok else math.inf


def _start_runtime(problem, measurer, op_placement: np.ndarray) -> float:
    """The start as the searches measure it: collapsed onto the groups (repaired to allowed devices)."""
    units = problem.repair_allowed(problem.collapse(op_placement))
    [result] = measurer.measure([problem.expand(units[None])[0]])
    return result.runtime_s if result.ok else math.inf


def _starts(problem, measurer, seed: int) -> tuple[dict[str, tuple], float]:
    """Each start's (problem, op placements it picks the fastest of), and HEFT's result. "heft-split"
    places the groups split by HEFT's devices (`placer search --split-groups heft`), where HEFT's placement
    is exact."""
    from policies.registry import place
    from policies.rl.gnn.problems import Slot

    heft = place("heft", problem, measurer, 1, seed)
    single = problem.expand(Slot(problem, None).fastest_device_start())
    split = problem.split_by(heft.op_placement)
    quick = [place(name, problem, measurer, 1, seed).op_placement for name in ("cpu-only", "single-gpu")]
    return {"1dev": (problem, [single]), "heft": (problem, [heft.op_placement]),
            "heft-split": (split, [heft.op_placement]),
            "both-split": (split, [*quick, heft.op_placement])}, _runtime(heft)


def unseen(args) -> None:
    from policies.registry import place

    from policies.rl.gnn.policy import GiphPolicy
    giph_init = {"init": args.init} if args.init else {}
    rows = []
    for machine in args.machines:
        for graph in args.graphs:
            for seed in args.seeds:
                t0 = time.perf_counter()
                problem, measurer = _setup(graph, machine, seed)
                starts, heft_s = _starts(problem, measurer, seed)
                for start_name, (problem, start) in starts.items():
                    row = {"machine": machine, "graph": graph, "seed": seed, "start": start_name, "heft": heft_s}
                    zero = GiphPolicy(warm_start=start, torch_threads=1, **giph_init)
                    row["start_s"] = min(_start_runtime(problem, measurer, p) for p in start)
                    zero_budget = len(start) + zero.options["episode_steps"]
                    row["giph0"] = _runtime(zero.place(problem, measurer, zero_budget, seed))
                    row["giph"] = _runtime(place("giph", problem, measurer, args.budget, seed, warm_start=start,
                                                 torch_threads=1, **giph_init))
                    row["giph_scratch"] = _runtime(place("giph", problem, measurer, args.budget, seed,
                                                         warm_start=start, torch_threads=1, init="scratch"))
                    row["placeto"] = _runtime(place("placeto", problem, measurer, args.budget, seed,
                                                    warm_start=start, torch_threads=1))
                    row["annealing"] = _runtime(place("annealing", problem, measurer, args.budget, seed,
                                                      warm_start=start))
                    row["cem"] = _runtime(place("cem", problem, measurer, args.budget, seed))  # takes no start
                    rows.append(row)
                print(f"<!-- {machine} {graph} seed {seed}: {time.perf_counter() - t0:.1f} s -->", flush=True)
    _print_unseen(rows, args)


def _print_unseen(rows: list[dict], args) -> None:
    print(f"\n### Unseen machines, budget {args.budget} (step time ms, mean over seeds {args.seeds})\n")
    print("| machine | graph | start | heft | start on groups | giph zero-shot | giph | giph scratch | placeto "
          "| annealing | cem | giph <= heft (seeds) | giph <= both searches (seeds) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["machine"], r["graph"], r["start"]) for r in rows}, key=lambda k: (
        args.machines.index(k[0]), args.graphs.index(k[1]), STARTS.index(k[2])))
    met = {start: [0, 0, 0] for start in STARTS}  # runs at or below HEFT, at or below both searches, runs
    for machine, graph, start in keys:
        group = [r for r in rows if (r["machine"], r["graph"], r["start"]) == (machine, graph, start)]
        cells = [_ms(np.mean([r[k] for r in group])) for k in ("heft", "start_s", "giph0", "giph", "giph_scratch",
                                                                "placeto", "annealing", "cem")]
        hits = sum(r["giph"] <= r["heft"] * (1 + 1e-9) for r in group)
        wins = sum(r["giph"] <= min(r["annealing"], r["cem"]) * (1 + 1e-9) for r in group)
        met[start] = [met[start][0] + hits, met[start][1] + wins, met[start][2] + len(group)]
        print(f"| {machine} | {graph} | {start} | " + " | ".join(cells) + f" | {hits}/{len(group)} | "
              f"{wins}/{len(group)} |")
    for start, (hits, wins, total) in met.items():
        print(f"\ngiph from start {start}: at or below HEFT in {hits} of {total} runs, at or below the better of "
              f"annealing and cem in {wins}")
    for key in ("giph0", "giph", "giph_scratch", "placeto", "annealing", "cem"):
        for start in STARTS:
            ratio = [r[key] / r["heft"] for r in rows if r["start"] == start and math.isfinite(r[key])]
            print(f"- {key} from {start}: geometric mean of step time / HEFT's = "
                  f"{math.exp(np.mean(np.log(ratio))):.3f}" if ratio else f"- {key} from {start}: none ran ok")


def _ms(value: float) -> str:
    return f"{value * 1e3:.2f}" if math.isfinite(value) else "failed"


TUNE_SETS = ((("hetero:2", "hetero:3", "hetero:5", "hetero:7"), ("resnet-50", "inception-v3")),
             (("hetero:4", "hetero:6", "hetero:9", "hetero:11"), ("transformer", "resnet-50")))
TUNE_SETTINGS = ((32, 2), (16, 2), (8, 2), (4, 2), (3, 2), (2, 2), (4, 4))  # (episode_steps, batch_size)


def tune(args) -> None:
    from policies.registry import place

    print(f"\n### giph's search settings on training machines (budget {args.budget}, seeds 0 1; giph / annealing "
          f"from the same start, both-split)\n")
    print("| moves per episode x episodes per update | geometric mean of giph / annealing | giph at or below |")
    print("|---|---|---|")
    ratios = {setting: [] for setting in TUNE_SETTINGS}
    for machines, graphs in TUNE_SETS:
        for machine in machines:
            for graph in graphs:
                for seed in (0, 1):
                    problem, measurer = _setup(graph, machine, seed)
                    problem, start = _starts(problem, measurer, seed)[0]["both-split"]
                    annealing = _runtime(place("annealing", problem, measurer, args.budget, seed, warm_start=start))
                    for steps, batch in TUNE_SETTINGS:
                        giph = place("giph", problem, measurer, args.budget, seed, warm_start=start, torch_threads=1,
                                     episode_steps=steps, batch_size=batch)
                        ratios[(steps, batch)].append(_runtime(giph) / annealing)
    for (steps, batch), values in ratios.items():
        wins = sum(value <= 1 + 1e-9 for value in values)
        print(f"| {steps} x {batch} | {math.exp(np.mean(np.log(values))):.4f} | {wins} of {len(values)} |")


class Trace:
    """on_measurement: every runtime in order (inf for failures)."""

    def __init__(self):
        self.runtimes: list[float] = []

    def __call__(self, placement, measurement) -> None:
        self.runtimes.append(measurement.runtime_s if measurement.ok else math.inf)

    def first_within(self, target_s: float) -> int | None:
        """Measurements spent until one came within ``target_s`` (None: never)."""
        for k, runtime in enumerate(self.runtimes):
            if runtime <= target_s:
                return k + 1
        return None

    def best(self) -> float:
        return min(self.runtimes, default=math.inf)


def removal(args) -> None:
    print(f"\n### Removal: giph {args.before} measurements, the GPU holding most groups of its best leaves, the "
          f"same instance continues with budget {args.budget}, against a fresh giph on the smaller machine "
          f"(step time ms; the removed GPU's groups moved as placer search --remove-device moves them)\n")
    print("| machine | graph | seed | removed | before removal | warm start on smaller | continued best | fresh best "
          "| continued: meas. to within 10% of fresh | fresh: meas. to its best | fresh: meas. to within 10% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for machine_name in args.removal_machines:
        for graph in args.graphs:
            for seed in args.seeds:
                summary.append(_removal_row(args, machine_name, graph, seed))
    met = sum(got is not None and got < used for got, _, used in summary)
    met_best = sum(got is not None and got < to_best for got, to_best, _ in summary)
    print(f"\ncontinued within 10% of fresh in fewer measurements than fresh used ({args.budget}): {met} of "
          f"{len(summary)}; fewer than fresh needed to reach its own best: {met_best} of {len(summary)}")


def _removal_row(args, machine_name: str, graph: str, seed: int) -> tuple[int | None, int, int]:
    from policies.rl.gnn.policy import GiphPolicy

    giph_init = {"init": args.init} if args.init else {}
    problem, measurer = _setup(graph, machine_name, seed)
    policy = GiphPolicy(torch_threads=1, **giph_init)
    first = policy.place(problem, measurer, args.before, seed)
    machine = problem.machine
    gpus = [i for i, d in enumerate(machine.devices) if d.kind == "gpu"]
    units = first.group_placement
    gone = max(gpus, key=lambda i: (np.sum(units == i), -i))
    name = machine.devices[gone].name
    kept = machine.kept_device_indices([name])
    small_problem, small_measurer = _setup(graph, machine.without_devices([name]), seed)
    from cluster.jobs.removal import moved_placement  # what placer search --remove-device starts from

    policy.warm_start = [moved_placement(problem, first.op_placement, kept)]
    continued, fresh = Trace(), Trace()
    policy.place(small_problem, small_measurer, args.budget, seed, on_measurement=continued)
    GiphPolicy(torch_threads=1, **giph_init).place(small_problem, small_measurer, args.budget, seed,
                                                  on_measurement=fresh)
    target = fresh.best() * 1.10
    got = continued.first_within(target)
    to_best = fresh.runtimes.index(fresh.best()) + 1
    print(f"| {machine_name} | {graph} | {seed} | {name} | {_ms(_runtime(first))} | {_ms(continued.runtimes[0])} | "
          f"{_ms(continued.best())} | {_ms(fresh.best())} | {got if got else 'never'} | {to_best} | "
          f"{fresh.first_within(target)} |", flush=True)
    return got, to_best, len(fresh.runtimes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", nargs="?", choices=("unseen", "tune", "removal"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--before", type=int, default=100, help="removal: measurements before the GPU leaves")
    parser.add_argument("--machines", nargs="+", default=list(MACHINES))
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS))
    parser.add_argument("--removal-machines", nargs="+", default=["k80-v100", "a100-h100", "hetero:1002"])
    parser.add_argument("--init", help="giph checkpoint (default: the committed one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    if args.section in (None, "unseen"):
        unseen(args)
    if args.section in (None, "tune"):
        tune(args)
    if args.section in (None, "removal"):
        removal(args)
    print(f"\n<!-- {time.perf_counter() - started:.0f} s -->")


if __name__ == "__main__":
    main()
