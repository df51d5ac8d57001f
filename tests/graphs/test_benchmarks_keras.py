"""Inception-V3 and ResNet-50 benchmarks: parameter counts pinned, FLOPs against the analytic figures.

Parameter counts do not depend on the image size, so they are checked on small builds; FLOPs need the
paper-scale builds (about a minute each on two cores), which are marked slow.
"""

import os

import numpy as np
import pytest

from graphs.opgraph import PHASE_CODE

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

INCEPTION_TRAINABLE_WITH_AUX = 27_143_152  # 23,817,352 (keras.applications) + 3,325,800 (aux head)
INCEPTION_COUNT_PARAMS_NO_AUX = 23_851_784  # keras count_params(), BatchNorm moving statistics included
RESNET50_TRAINABLE = 25_583_592
RESNET50_COUNT_PARAMS = 25_636_712


def _forward_macs_per_image(graph) -> float:
    dense = np.isin(graph.op_kinds, ["Conv2D", "MatMul"]) & (graph.phases == PHASE_CODE["forward"])
    return graph.flops[dense].sum() / 2 / graph.batch_size


def test_registry__keras_benchmarks_are_listed_with_paper_configs():
    from graphs.registry import list_benchmarks

    configs = {b.name: b.config for b in list_benchmarks()}
    assert configs["inception-v3"] == {"batch_size": 32, "image_size": 299}
    assert configs["resnet-50"] == {"batch_size": 64, "image_size": 224}


@pytest.mark.slow
def test_inception_v3__parameters_pinned_with_aux_head_and_blocks_in_scopes():
    from graphs.benchmarks.keras_models import build_inception_v3, inception_v3_model

    model = inception_v3_model(image_size=75)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    non_trainable = sum(int(np.prod(v.shape)) for v in model.non_trainable_variables)
    assert trainable == INCEPTION_TRAINABLE_WITH_AUX
    assert model.count_params() == trainable + non_trainable
    assert inception_v3_model(image_size=75, aux_head=False).count_params() == INCEPTION_COUNT_PARAMS_NO_AUX

    graph = build_inception_v3(batch_size=2, image_size=75)
    assert graph.num_params == INCEPTION_TRAINABLE_WITH_AUX
    assert (graph.op_kinds == "Variable").sum() == len(model.trainable_variables)
    assert graph.total_param_bytes >= 3 * 4 * INCEPTION_TRAINABLE_WITH_AUX  # weights, gradients, momentum
    blocks = {scope.split(".")[0] for scope in graph.scopes}
    assert {f"mixed{k}" for k in range(11)} | {"stem", "aux", "head"} <= blocks
    assert any(s.startswith("mixed5.conv2d_") for s in graph.scopes)
    layers = set(graph.meta["layer_scopes"])  # the module map's keys: prefixed as the scopes are
    assert {s for s in graph.scopes if "." in s} <= layers and not layers & {"sgd", "mul", ""}


@pytest.mark.slow
def test_resnet50__parameters_pinned():
    from graphs.benchmarks.keras_models import build_resnet50, resnet50_model

    model = resnet50_model(image_size=32)
    assert model.count_params() == RESNET50_COUNT_PARAMS
    graph = build_resnet50(batch_size=2, image_size=32)
    assert graph.num_params == RESNET50_TRAINABLE == sum(int(np.prod(v.shape)) for v in model.trainable_variables)


@pytest.mark.slow
def test_inception_v3__paper_scale_step_is_about_1_1_tflop():
    from graphs.benchmarks.keras_models import build_inception_v3

    graph = build_inception_v3()
    assert graph.batch_size == 32
    assert _forward_macs_per_image(graph) == pytest.approx(5.72e9, rel=0.02)  # published 5.72 GMAC
    forward = graph.flops[graph.phases == PHASE_CODE["forward"]].sum()
    assert graph.total_flops == pytest.approx(3 * forward, rel=0.05)  # backward ~ 2x forward
    assert graph.total_flops == pytest.approx(1.1e12, rel=0.05)  # 3 x 2 x 5.72 GMAC x 32 images


@pytest.mark.slow
def test_resnet50__paper_scale_forward_is_about_4_gmac_per_image():
    from graphs.benchmarks.keras_models import build_resnet50

    graph = build_resnet50()
    assert graph.batch_size == 64
    assert _forward_macs_per_image(graph) == pytest.approx(4.1e9, rel=0.08)  # 3.86 GMAC conv+fc here
    forward = graph.flops[graph.phases == PHASE_CODE["forward"]].sum()
    assert graph.total_flops == pytest.approx(3 * forward, rel=0.05)


@pytest.mark.parametrize("build", ["graphs.benchmarks.keras_models:resnet50_step",
                                   "graphs.benchmarks.inference_models:build_resnet50_infer"])
def test_a_keras_benchmarks_first_build_prints_nothing_of_tensorflows_startup(tmp_path, build):
    """A builtin Keras graph is built on a cache miss under any command (search, graphs show, reproduce): the
    process loading TensorFlow there printed its 7 start-up lines (no CUDA driver, CPU features, cuInit)."""
    import subprocess
    import sys
    from pathlib import Path

    module, function = build.split(":")
    code = f"import {module} as m; m.{function}(image_size=32)"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | {"PLACER_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
