"""The TensorFlow importer on a Keras model trained with mixed precision ("mixed_float16": float16 compute,
float32 master weights, the optimizer wrapped in a LossScaleOptimizer with a dynamic loss scale)."""

import os

import numpy as np
import pytest

from graphs.opgraph import PHASE_CODE

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "tiny_models.py")
BATCH = 4
LOSS_SCALE_STATE = {"dynamic_scale": 4, "step_counter": 8}  # float32 scale, int64 counter: bytes


@pytest.fixture(autouse=True)
def global_policy_restored():
    """The mixed-precision policy is process-global: every test leaves it as it found it."""
    import keras

    before = keras.mixed_precision.dtype_policy().name
    yield
    assert keras.mixed_precision.dtype_policy().name == before
    keras.mixed_precision.set_global_policy(before)


@pytest.fixture(scope="module")
def mixed_graph():
    from graphs.tf.importer import import_keras_spec

    return import_keras_spec(f"{FIXTURES}:tiny_keras_mixed_precision_classifier", batch_size=BATCH)


def _named(graph, last: str) -> list[int]:
    return [i for i in range(graph.num_ops) if graph.op_names[i].split("/")[-1] == last]


def _consumers(graph, op: int) -> list[int]:
    return [int(d) for s, d in zip(graph.edge_src, graph.edge_dst) if s == op]


def test_keras_mixed_precision__loss_scale_is_optimizer_state_and_float16_counts_two_bytes(mixed_graph):
    graph = mixed_graph
    assert graph.source.endswith("LossScaleOptimizer")
    state = {graph.op_names[i]: int(graph.param_bytes[i]) for i in range(graph.num_ops)
             if graph.op_kinds[i] == "VarHandleOp" and graph.scopes[i] == "loss_scale_optimizer"}
    assert state == {f"loss_scale_optimizer/{name}": size for name, size in LOSS_SCALE_STATE.items()}
    variables = {graph.op_names[i]: int(graph.param_bytes[i]) for i in range(graph.num_ops)
                 if graph.op_kinds[i] == "Variable"}
    numels = {"fc1/kernel": 8 * 16, "fc1/bias": 16, "logits/kernel": 16 * 5, "logits/bias": 5}
    # float32 master weight + float32 gradient + Adam's m and v; the loss scale is no weight's slot
    assert variables == {f"tiny_keras_mixed_precision_classifier/{name}": 4 * 4 * numel
                         for name, numel in numels.items()}
    assert graph.num_params == sum(numels.values())
    (matmul,) = [i for i in range(graph.num_ops) if graph.op_kinds[i] == "MatMul" and graph.scopes[i] == "fc1"
                 and graph.phases[i] == PHASE_CODE["forward"]]
    assert graph.out_bytes[matmul] == BATCH * 16 * 2  # a float16 activation
    casts = sorted(int(graph.out_bytes[i]) for i in range(graph.num_ops)
                   if graph.op_kinds[i] == "Cast" and graph.scopes[i] == "fc1")
    assert casts == sorted([16 * 2, 8 * 16 * 2, 16 * 4, 8 * 16 * 4])  # weights to float16, gradients back


def test_keras_mixed_precision__the_loss_is_multiplied_by_the_dynamic_scale_before_the_gradient(mixed_graph):
    """As Keras's own train step (``optimizer.scale_loss``): the optimizer divides the gradients by the
    scale, so a step that did not multiply the loss by it would shrink every float16 gradient."""
    graph = mixed_graph
    (scale,) = _named(graph, "dynamic_scale")
    reads = [c for c in _consumers(graph, scale) if graph.op_kinds[c] == "ReadVariableOp"]
    read_by = {graph.phases[d] for read in reads for d in _consumers(graph, read)}
    assert PHASE_CODE["backward"] in read_by


def test_keras_mixed_precision__the_finite_check_and_the_scale_update_are_the_optimizers(mixed_graph):
    """The gradients' IsFinite check and the conds that apply the step or shrink the scale, and grow it
    every ``dynamic_growth_steps``, are update work: no op downstream of a gradient is forward."""
    graph = mixed_graph
    control = [i for i in range(graph.num_ops) if graph.op_kinds[i] in ("IsFinite", "All", "Equal", "If")]
    assert {graph.op_kinds[i] for i in control} == {"IsFinite", "All", "Equal", "If"}
    assert all(graph.phases[i] == PHASE_CODE["update"] for i in control)
    later = (PHASE_CODE["backward"], PHASE_CODE["update"])
    assert not [(graph.op_names[s], graph.op_names[d]) for s, d in zip(graph.edge_src, graph.edge_dst)
                if graph.phases[s] in later and graph.phases[d] == PHASE_CODE["forward"]]


@pytest.mark.parametrize("optimizer", [None, "sgd"])
def test_keras_mixed_precision__an_optimizer_it_was_not_compiled_with_is_loss_scaled_as_compile_would(optimizer):
    import keras

    from graphs.tf.importer import trace_keras_training_step

    before = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="fc"),
                                  keras.layers.Activation("linear", dtype="float32", name="out")], name="uncompiled")
    finally:
        keras.mixed_precision.set_global_policy(before)
    graph = trace_keras_training_step(model, np.zeros((BATCH, 8), "float32"), np.zeros((BATCH, 4), "float32"),
                                      loss="mse", optimizer=optimizer)
    assert graph.source == "keras uncompiled + LossScaleOptimizer"
    state = {graph.op_names[i].split("/")[-1]: int(graph.param_bytes[i]) for i in range(graph.num_ops)
             if graph.op_kinds[i] == "VarHandleOp" and graph.scopes[i] == "loss_scale_optimizer"}
    assert state == LOSS_SCALE_STATE


def test_keras_mixed_precision__the_same_model_imports_to_the_same_names_and_hash_after_other_conds(mixed_graph):
    """The loss scale's conds call branch functions TensorFlow numbers per process (``cond_true_238``), and their
    ops were named after them: after any other cond was traced, the same model had another hash, and
    ``apply_keras`` refused its own run. Their ops are named by the branch: ``cond/then/...``, ``cond/else/...``."""
    import tensorflow as tf

    from graphs.tf.importer import import_keras_spec

    tf.function(lambda x: tf.cond(x > 0, lambda: x, lambda: -x)).get_concrete_function(tf.TensorSpec(()))
    again = import_keras_spec(f"{FIXTURES}:tiny_keras_mixed_precision_classifier", batch_size=BATCH)
    assert again.content_hash == mixed_graph.content_hash
    assert list(again.op_names) == list(mixed_graph.op_names)
    branches = {name.split("/")[1] for name in mixed_graph.op_names if name.startswith("cond/")}
    assert branches == {"then", "else"}


def test_keras_mixed_precision__the_inner_optimizers_ops_are_in_its_scope_as_in_a_float32_model(mixed_graph):
    """The LossScaleOptimizer applies its Adam inside a cond, whose branch opens Adam's name scope under the cond's
    ("cond/adam"): those ops were scoped "cond.then.cond.adam", beside the "adam" of the optimizer's own variables,
    where a float32 model has all of them in "adam"."""
    graph = mixed_graph
    in_cond = [i for i in range(graph.num_ops) if graph.op_names[i].startswith("cond/then/cond/adam/")]
    writes = [i for i in in_cond if graph.op_kinds[i] == "AssignSubVariableOp"]
    assert len(writes) == 4  # the update of each of the four weights
    assert {graph.scopes[i] for i in in_cond} == {"adam"}
    assert {scope for scope in graph.scopes if "adam" in scope} == {"adam"}
