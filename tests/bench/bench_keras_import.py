"""Trace time and size of the Keras benchmarks (paper scale). Run: python tests/bench/bench_keras_import.py"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


NAMES = ("inception-v3", "resnet-50")


def main(names: list[str]) -> None:
    from graphs.benchmarks import keras_models

    builders = dict(zip(NAMES, (keras_models.build_inception_v3, keras_models.build_resnet50)))
    print("| benchmark | trace s | ops | edges | TFLOP/step | params | param GB | groups |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names or list(builders):
        start = time.perf_counter()
        graph = builders[name]()
        elapsed_s = time.perf_counter() - start
        print(f"| {name} | {elapsed_s:.1f} | {graph.num_ops} | {graph.num_edges} | {graph.total_flops / 1e12:.3f} "
              f"| {graph.num_params:,} | {graph.total_param_bytes / 1e9:.3f} | {graph.num_colocation_groups} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)} (default: both)")
    names = parser.parse_args().names
    if set(names) - set(NAMES):
        parser.error(f"unknown benchmark {sorted(set(names) - set(NAMES))[0]!r}: choose from {', '.join(NAMES)}")
    main(names)
