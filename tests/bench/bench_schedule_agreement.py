"""Do the list schedulers (m-ETF, m-SCT, HEFT) agree with the simulator? (issue 16)

For every benchmark graph on paper-2gpu and paper-4gpu, and one Keras application CNN imported from
outside the project (``keras.applications.MobileNetV2``, weights=None, through ``graphs.tf.importer``):
each scheduler's own scheduled makespan, the simulated step of its placement (``measurers.sim.reference``
``Simulator``), their ratio, the scheduler's running time, and the ratio of the simulated step to the
expert's (``policies.expert``) where the graph has an expert rule.

The scheduled makespan is each scheduler's own (the replay of its decisions, ``policies.listsched
.replay_finish_s``); ``heft-insertion`` is HEFT with the paper's insertion into idle slots
(``heft_schedule(timeline="insertion")``), not run unless named.

Run:   python tests/bench/bench_schedule_agreement.py run LABEL [GRAPHS [MACHINES [SCHEDULERS]]]
                                                 (comma-separated lists; writes runs/schedule_agreement_LABEL.json)
       python tests/bench/bench_schedule_agreement.py table BEFORE AFTER   (markdown table of the two JSON files)
       python tests/bench/bench_schedule_agreement.py compare LABEL POLICY_A POLICY_B
                                                 (one run's POLICY_A rows as "before", its POLICY_B rows as "after":
                                                  e.g. heft-all heft, HEFT on every device against HEFT's choice)
       python tests/bench/bench_schedule_agreement.py            (measure now, print the table: `make bench`)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

GRAPHS = ("nmt-2", "nmt-4", "nmt-8", "rnnlm", "inception-v3", "resnet-50", "transformer", "keras-mobilenetv2")
MACHINES = ("paper-2gpu", "paper-4gpu")
SCHEDULERS = ("m-etf", "m-sct", "heft")  # and "heft-insertion" when asked for
KERAS_NAME = "keras-mobilenetv2"
RUNS = Path("runs")
AGREEMENT = 0.10  # |scheduled / simulated - 1| that counts as agreement


def mobilenet_v2():
    """A Keras application CNN the project does not ship: what ``placer graphs import --keras`` runs."""
    import keras

    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def load(name: str):
    from graphs.io import load_graph_file, save_graph
    from graphs.registry import load_graph

    if name != KERAS_NAME:
        return load_graph(name)
    path = RUNS / f"{KERAS_NAME}.parquet"
    if path.is_file():
        return load_graph_file(path)
    from graphs.tf.importer import import_keras_spec

    graph = import_keras_spec(f"{__file__}:mobilenet_v2", batch_size=32, name=KERAS_NAME)
    save_graph(graph, path)
    return graph


def schedule(problem, name: str):
    """(device_of (N,), scheduled makespan s) of scheduler ``name`` on an op-level problem."""
    from policies.schedulers import list_schedule

    return list_schedule(problem, name)


def expert_step_s(problem, simulator) -> float | None:
    from graphs.errors import PlacerError
    from policies.expert import expert_units

    try:
        units, _ = expert_units(problem)
    except PlacerError:
        return None
    return simulator.run(problem.expand(units)).runtime_s


def measure(graphs, machines, schedulers=SCHEDULERS) -> list[dict]:
    from measurers.catalog import load_machine
    from measurers.sim.reference import Simulator
    from policies.problem import make_problem

    rows = []
    for graph_name in graphs:
        graph = load(graph_name)
        for machine_name in machines:
            machine = load_machine(machine_name)
            problem = make_problem(graph, machine)  # colocation groups, as `placer baselines` runs them
            simulator = Simulator(graph, machine)
            expert_s = expert_step_s(problem, simulator)
            for name in schedulers:
                start = time.perf_counter()
                device_of, makespan_s = schedule(problem.at_op_level(), name)
                elapsed_s = time.perf_counter() - start
                result = simulator.run(device_of)
                row = dict(graph=graph_name, machine=machine_name, policy=name, ops=graph.num_ops,
                           scheduled_s=makespan_s, simulated_s=result.runtime_s, status=result.status,
                           expert_s=expert_s, schedule_wall_s=elapsed_s)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def _fmt_ratio(row: dict) -> str:
    ratio = row["scheduled_s"] / row["simulated_s"]
    verdict = "yes" if abs(ratio - 1.0) <= AGREEMENT else "no"
    return f"{row['scheduled_s']:.4g} / {row['simulated_s']:.4g} = {ratio:.3f} ({verdict})"


def _expert(row: dict) -> str:
    return "-" if row["expert_s"] is None else f"{row['simulated_s'] / row['expert_s']:.3f}"


def table(before: list[dict], after: list[dict]) -> str:
    key = lambda row: (row["graph"], row["machine"], row["policy"])
    old = {key(row): row for row in before}
    lines = ["| graph | machine | policy | before: scheduled / simulated s (within 10%) | after: scheduled / "
             "simulated s (within 10%) | sim / expert before | sim / expert after | schedule s before | after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in after:
        prev = old.get(key(row))
        cells = [row["graph"], row["machine"].removeprefix("paper-"), row["policy"],
                 _fmt_ratio(prev) if prev else "-", _fmt_ratio(row), _expert(prev) if prev else "-", _expert(row),
                 f"{prev['schedule_wall_s']:.1f}" if prev else "-", f"{row['schedule_wall_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    agree = sum(abs(r["scheduled_s"] / r["simulated_s"] - 1) <= AGREEMENT for r in after)
    agree_before = sum(abs(r["scheduled_s"] / r["simulated_s"] - 1) <= AGREEMENT for r in before)
    lines.append(f"\nWithin 10%: before {agree_before}/{len(before)} rows, after {agree}/{len(after)} rows.")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"] and len(argv) >= 2:
        graphs = argv[2].split(",") if len(argv) > 2 else GRAPHS
        machines = argv[3].split(",") if len(argv) > 3 else MACHINES
        schedulers = argv[4].split(",") if len(argv) > 4 else SCHEDULERS
        RUNS.mkdir(exist_ok=True)
        rows = measure(graphs, machines, schedulers)
        (RUNS / f"schedule_agreement_{argv[1]}.json").write_text(json.dumps(rows, indent=1))
    elif argv[:1] == ["table"] and len(argv) == 3:
        before, after = (json.loads((RUNS / f"schedule_agreement_{label}.json").read_text()) for label in argv[1:])
        print(table(before, after))
    elif argv[:1] == ["compare"] and len(argv) == 4:
        rows = json.loads((RUNS / f"schedule_agreement_{argv[1]}.json").read_text())
        before = [dict(row, policy=argv[3]) for row in rows if row["policy"] == argv[2]]
        print(table(before, [row for row in rows if row["policy"] == argv[3]]))
    elif not argv:  # `make bench`: measure now, print the table without a "before"
        print(table([], measure(GRAPHS, MACHINES, SCHEDULERS)))
    elif argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
