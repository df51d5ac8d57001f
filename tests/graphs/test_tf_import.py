"""The TensorFlow importer on small Keras models and tf.functions traced end to end."""

import os

import numpy as np
import pytest

from graphs.errors import PlacerError
from graphs.opgraph import ANY_DEVICE, PHASE_CODE, kind_bit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 32


def _mlp():
    import keras

    inputs = keras.Input((8,), name="x")
    hidden = keras.layers.Dense(16, activation="relu", name="fc1")(inputs)
    outputs = keras.layers.Dense(4, name="fc2")(hidden)
    return keras.Model(inputs, outputs, name="mlp")


@pytest.fixture(scope="module")
def mlp_graph():
    from graphs.tf.importer import trace_keras_training_step

    model = _mlp()
    graph = trace_keras_training_step(model, np.zeros((BATCH, 8), "float32"), np.zeros((BATCH, 4), "float32"),
                                      loss="mse", optimizer="adam", name="mlp")
    return model, graph


def _ops(graph, kind, scope=None, phase=None):
    return [i for i in range(graph.num_ops) if graph.op_kinds[i] == kind
            and (scope is None or graph.scopes[i] == scope)
            and (phase is None or graph.phases[i] == PHASE_CODE[phase])]


def test_keras_step__dense_flops_exact_by_hand(mlp_graph):
    _, graph = mlp_graph
    (matmul,) = _ops(graph, "MatMul", scope="fc1", phase="forward")
    assert graph.flops[matmul] == 2 * BATCH * 8 * 16  # batch x in x out multiply-adds
    assert graph.out_bytes[matmul] == BATCH * 16 * 4
    (bias,) = _ops(graph, "BiasAdd", scope="fc1", phase="forward")
    assert graph.flops[bias] == BATCH * 16
    assert graph.bytes_accessed[bias] == (BATCH * 16 + 16 + BATCH * 16) * 4  # x, bias in; y out
    backward_matmuls = _ops(graph, "MatMul", scope="fc2", phase="backward")
    assert sorted(graph.flops[backward_matmuls]) == [2 * BATCH * 16 * 4] * 2  # dX and dW of fc2


def test_keras_step__gradient_and_update_ops_have_their_phases(mlp_graph):
    _, graph = mlp_graph
    phase = dict(zip(graph.op_names, graph.phases))
    assert all(phase[n] == PHASE_CODE["backward"] for n in graph.op_names if n.startswith("gradient_tape/"))
    assert _ops(graph, "ReluGrad", phase="backward") and _ops(graph, "BiasAddGrad", phase="backward")
    assert len(_ops(graph, "AssignSubVariableOp", phase="update")) == 4  # one weight update per variable
    assert all(graph.phases[i] == PHASE_CODE["update"] for i in range(graph.num_ops) if graph.scopes[i] == "adam"
               and graph.op_kinds[i] != "VarHandleOp")
    assert all(graph.phases[i] == PHASE_CODE["other"] for i in _ops(graph, "Input") + _ops(graph, "Variable"))
    assert all(graph.phases[i] == PHASE_CODE["forward"] for i in range(graph.num_ops)
               if graph.scopes[i] in ("fc1", "fc2") and graph.op_kinds[i] in ("MatMul", "BiasAdd", "Relu")
               and not graph.op_names[i].startswith("gradient_tape/"))
    assert len(_ops(graph, "Input")) == 2  # inputs and targets


def test_keras_step__variables_hold_adam_state_and_are_colocated_with_updates(mlp_graph):
    model, graph = mlp_graph
    variables = _ops(graph, "Variable")
    assert len(variables) == len(model.trainable_variables) == 4
    assert graph.num_params == model.count_params() == 8 * 16 + 16 + 16 * 4 + 4
    weight_bytes = {v.path: int(np.prod(v.shape)) * 4 for v in model.trainable_variables}
    by_name = {graph.op_names[i]: i for i in variables}
    for path, size in weight_bytes.items():
        assert graph.param_bytes[by_name[path]] == 4 * size  # weight + gradient + Adam m and v
    for v in variables:
        writers = [d for s, d in zip(graph.edge_src, graph.edge_dst)
                   if s == v and graph.op_kinds[d] in ("AssignSubVariableOp", "AssignAddVariableOp")]
        assert len(writers) == 3  # the weight itself and its two slots (merged into the Variable op)
        assert all(graph.colocation[w] == graph.colocation[v] for w in writers)
    assert len({graph.colocation[v] for v in variables}) == 4  # distinct parameters stay apart


def test_keras_step__graph_has_no_calls_identities_or_constants(mlp_graph):
    _, graph = mlp_graph
    kinds = set(graph.op_kinds)
    assert not kinds & {"Identity", "IdentityN", "NoOp", "Const", "Placeholder", "StatefulPartitionedCall"}
    assert graph.framework == "tensorflow" and graph.batch_size == BATCH


def test_tf_function__nested_function_and_cond_are_inlined():
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    w = tf.Variable(tf.ones((4, 3)), name="w")

    @tf.function
    def layer(x):
        return tf.nn.relu(tf.matmul(x, w))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = layer(x)
            h = tf.cond(tf.reduce_sum(h) > 0, lambda: h * 2.0, lambda: h - 1.0)
            loss = tf.reduce_sum(h)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.1 * grad)
        return loss

    graph = import_tf_function(step.get_concrete_function(tf.TensorSpec((None, 4))), name="t", batch_size=8)
    names = list(graph.op_names)
    assert not set(graph.op_kinds) & {"PartitionedCall", "StatefulPartitionedCall"}
    forward = [i for i in _ops(graph, "MatMul") if graph.phases[i] == PHASE_CODE["forward"]]
    assert len(forward) == 1 and graph.flops[forward[0]] == 2 * 8 * 4 * 3
    assert len([i for i in _ops(graph, "MatMul") if graph.phases[i] == PHASE_CODE["backward"]]) == 2
    assert any(n.startswith("cond/") and graph.op_kinds[names.index(n)] == "Mul" for n in names)
    assert graph.op_kinds[names.index("cond")] in ("If", "StatelessIf")  # the join of both branches
    (update,) = _ops(graph, "AssignSubVariableOp")
    assert graph.phases[update] == PHASE_CODE["update"]
    (variable,) = _ops(graph, "Variable")
    assert graph.op_names[variable] == "w" and graph.param_bytes[variable] == 2 * 12 * 4  # no optimizer slots
    assert graph.colocation[update] == graph.colocation[variable]


def test_tf_function__cpu_only_op_type_gets_cpu_mask():
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    @tf.function
    def step(x):
        y = tf.matmul(x, x, transpose_b=True)
        return y, tf.strings.as_string(y)  # AsString has CPU kernels only

    graph = import_tf_function(step.get_concrete_function(tf.TensorSpec((2, 3))), name="cpu")
    (as_string,) = _ops(graph, "AsString")
    (matmul,) = _ops(graph, "MatMul")
    assert graph.allowed_mask[as_string] == kind_bit("cpu")
    assert graph.allowed_mask[matmul] == ANY_DEVICE
    assert graph.flops[matmul] == 2 * 2 * 2 * 3


def test_tf_function__colocation_constraints_are_honored():
    import tensorflow as tf
    from tensorflow.python.framework import ops

    from graphs.tf.importer import import_tf_function

    @tf.function
    def step(x):
        a = tf.exp(x, name="anchor")
        with ops.colocate_with(a.op):
            b = tf.sin(x, name="pinned")
        return a + b, tf.cos(x, name="free")

    graph = import_tf_function(step.get_concrete_function(tf.TensorSpec((2, 3))), name="coloc")
    group = dict(zip(graph.op_names, graph.colocation))
    assert group["pinned"] == group["anchor"] != group["free"]


def test_import_keras_spec__module_file_function(tmp_path):
    from graphs.tf.importer import import_keras_spec

    source = tmp_path / "tiny_model.py"
    source.write_text(
        "import numpy as np, keras\n"
        "def build():\n"
        "    m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, name='out')], name='tiny')\n"
        "    return m, np.zeros((4, 5), 'float32'), np.zeros((4, 3), 'float32'), 'mse'\n")
    graph = import_keras_spec(f"{source}:build")
    (matmul,) = _ops(graph, "MatMul", scope="out", phase="forward")
    assert graph.flops[matmul] == 2 * 4 * 5 * 3 and graph.num_params == 18 and graph.batch_size == 4


def test_import_keras_spec__saved_keras_file_uses_model_shapes(tmp_path):
    import keras

    from graphs.tf.importer import import_keras_spec

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2, name="head")], name="saved")
    model.compile(optimizer="sgd", loss="mse")
    path = tmp_path / "m.keras"
    model.save(path)
    graph = import_keras_spec(str(path), batch_size=10)
    (matmul,) = _ops(graph, "MatMul", scope="head", phase="forward")
    assert graph.flops[matmul] == 2 * 10 * 6 * 2 and graph.num_params == 14


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:build", "no_such_module_xyz"),
    ("graphs.opgraph:no_such_function", "no_such_function"),
    ("missing/file.py:build", "missing/file.py"),
    ("nocolon", "nocolon"),
])
def test_import_keras_spec__bad_spec_raises_one_error_naming_it(spec, message):
    from graphs.tf.importer import import_keras_spec

    with pytest.raises(PlacerError, match=message):
        import_keras_spec(spec)


def test_import_keras_spec__module_that_fails_to_import_is_named(tmp_path):
    from graphs.tf.importer import import_keras_spec

    broken = tmp_path / "broken_mod.py"
    broken.write_text("def build(:\n")
    with pytest.raises(PlacerError, match="broken_mod.py.*SyntaxError"):
        import_keras_spec(f"{broken}:build")


def test_import_keras_spec__damaged_keras_file_is_named(tmp_path):
    from graphs.tf.importer import import_keras_spec

    damaged = tmp_path / "damaged.keras"
    damaged.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(PlacerError, match="damaged.keras"):
        import_keras_spec(str(damaged))
    with pytest.raises(PlacerError, match="absent.keras"):
        import_keras_spec(str(tmp_path / "absent.keras"))
