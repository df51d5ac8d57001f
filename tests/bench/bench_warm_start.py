"""A warm-started search never reports a learned best worse than its warm start: every benchmark graph.

Runs ``placer search --warm-start`` (the job, ``cluster.jobs.run_search``, through a local Ray pool and the
simulator) for each built-in benchmark graph with a learned policy and a small budget, and prints, per
graph: the warm start's source and its own step time, the start as the learner measured it on its groups,
the learner's best, and whether the learner's best is at or below its start. Usage::

    python tests/bench/bench_warm_start.py [--machine paper-4gpu] [--policies reinforce post hierarchical]
        [--budget 128] [--graphs rnnlm nmt-2 ...] [--out runs/bench-warm-start]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def main() -> None:
    from graphs.benchmarks import BUILTIN
    import graphs.registry  # noqa: F401  (fills BUILTIN)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default="paper-4gpu")
    parser.add_argument("--policies", nargs="+", default=["reinforce", "post", "hierarchical"])
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--graphs", nargs="+", default=[b.name for b in BUILTIN])
    parser.add_argument("--out", default=None, help="folder for the run folders (default: a temporary one)")
    args = parser.parse_args()

    from cluster import ray_setup
    from cluster.jobs import SearchConfig, run_search

    out = args.out or tempfile.mkdtemp(prefix="bench-warm-start-")
    print(f"machine {args.machine}, budget {args.budget}, warm start auto; run folders in {out}\n")
    print("| graph | policy | warm start | its own step (s) | start on the searched groups (s) | learner's best (s) "
          "| best <= start |")
    print("|---|---|---|---|---|---|---|", flush=True)
    ray_setup.init_ray()
    try:
        for graph in args.graphs:
            for policy in args.policies:
                config = SearchConfig(graph=graph, machine=args.machine, policy=policy, budget=args.budget,
                                      warm_start="auto", out=out, workers=1)
                result = run_search(config)
                start, best = result.warm_start_on_groups_s, result.policy_best_runtime_s
                holds = "-" if not math.isfinite(start) else ("yes" if best <= start else "NO")
                print(f"| {graph} | {policy} | {result.warm_start} | {result.warm_start_runtime_s:.4f} | "
                      f"{start:.4f} | {best:.4f} | {holds} |", flush=True)
    finally:
        ray_setup.shutdown_ray()


if __name__ == "__main__":
    main()
