"""The TensorFlow importer on small Keras models and tf.functions traced end to end."""

import functools
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
    assert graph.meta["ops_without_flops"] == {}  # the cost model knows every op of a Keras MLP step


def keras_layer_paths(layer, prefix: str = "") -> set:
    """The dotted paths of a Keras layer's sublayers, recursively ("block", "block.a"), less input layers."""
    import keras

    paths = set()
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        if not isinstance(sub, keras.layers.InputLayer):
            paths |= {prefix + sub.name} | keras_layer_paths(sub, f"{prefix}{sub.name}.")
    return paths


def test_keras_step__meta_records_the_scopes_of_layers(mlp_graph):
    model, graph = mlp_graph
    assert graph.meta["layer_scopes"] == ["fc1", "fc2"] == sorted(keras_layer_paths(model))
    assert {"adam", "mse"} <= set(graph.scopes)  # the optimizer's and the loss's scopes are no layers


def test_keras_step__a_subclassed_models_nested_layers_are_recorded_not_its_bare_ops_optimizer_or_loss():
    """The map of `placer apply --module-map` keys on this record: a layer user code reaches by its path."""
    import keras

    from graphs.tf.importer import trace_keras_training_step

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.block = keras.Sequential([keras.layers.Dense(8, name="a"), keras.layers.Dense(8, name="b")],
                                          name="block")
            self.head = keras.layers.Dense(2, name="head")

        def call(self, x):
            return self.head(self.block(x) + x)  # a bare TF op between layers

    model = Net()
    graph = trace_keras_training_step(model, np.zeros((4, 8), "float32"), np.zeros((4, 2), "float32"),
                                      loss="mse", optimizer="sgd", name="net")
    assert graph.meta["layer_scopes"] == ["block", "block.a", "block.b", "head"] == sorted(keras_layer_paths(model))
    assert {"block.a", "block.b", "head", "sgd", "mse"} <= set(graph.scopes)


def _variable_ops(graph) -> dict:
    """{name: scope} of the graph's variable ops (weights, and state such as BatchNormalization's statistics)."""
    return {graph.op_names[i]: graph.scopes[i] for i in range(graph.num_ops)
            if graph.op_kinds[i] in ("Variable", "VarHandleOp")}


def test_keras_step__a_subclassed_models_variables_are_named_and_scoped_by_their_layers():
    """Built in its first call, a subclassed model's layers make their variables under the model's TF name scope
    alone ("net/kernel", "net/kernel_1", "net/moving_mean"): their ops had scope "", no layer, so the module map
    put each layer where its FLOPs ran, not where its weights live. Keras's path names them, the layer holds them."""
    import keras

    from graphs.tf.importer import trace_keras_training_step

    class Block(keras.Model):
        def __init__(self):
            super().__init__(name="block")
            self.a = keras.layers.Dense(8, name="a")
            self.norm = keras.layers.BatchNormalization(name="norm")

        def call(self, x):
            return self.norm(self.a(x))

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.fc1 = keras.layers.Dense(8, activation="relu", name="fc1")
            self.block = Block()
            self.head = keras.layers.Dense(2, name="head")

        def call(self, x):
            return self.head(self.block(self.fc1(x)))

    model = Net()  # not called yet: no variables until the importer builds it
    graph = trace_keras_training_step(model, np.zeros((4, 6), "float32"), np.zeros((4, 2), "float32"),
                                      loss="mse", optimizer="adam", name="net")
    variables = _variable_ops(graph)
    layer_of = {"fc1": "fc1", "a": "block.a", "norm": "block.norm", "head": "head"}
    expected = {v.path: layer_of[v.path.split("/")[-2]] for v in model.variables}
    assert {name: variables[name] for name in expected} == expected
    assert len(expected) == 10 and set(expected.values()) <= set(graph.meta["layer_scopes"])
    assert {scope for name, scope in variables.items() if name not in expected} == {"adam"}


def test_keras_step__a_model_nested_in_a_functional_one_scopes_its_layers_weights_by_their_call():
    """A functional model's layers make their variables where the model is built, so "d/kernel" for a layer the
    outer model calls as "inner.d": scope "d" was no layer of the record."""
    import keras

    from graphs.tf.importer import trace_keras_training_step

    inner_x = keras.Input((8,))
    inner = keras.Model(inner_x, keras.layers.Dense(8, name="d")(inner_x), name="inner")
    x = keras.Input((6,))
    model = keras.Model(x, keras.layers.Dense(2, name="head")(inner(keras.layers.Dense(8, name="pre")(x))),
                        name="outer")
    graph = trace_keras_training_step(model, np.zeros((4, 6), "float32"), np.zeros((4, 2), "float32"),
                                      loss="mse", optimizer="adam", name="outer")
    variables = _variable_ops(graph)
    assert {name: variables[name] for name in ("d/kernel", "d/bias", "pre/kernel", "head/bias")} == {
        "d/kernel": "inner.d", "d/bias": "inner.d", "pre/kernel": "pre", "head/bias": "head"}
    assert "inner.d" in graph.meta["layer_scopes"]


def test_keras_step__a_shared_layers_summed_weight_gradients_are_its_backward_work():
    """A layer called twice gets one gradient per call for each weight, which the tape sums in an AddN outside its
    ``gradient_tape/`` scope: that sum was an "update" op of scope "", so the module map and scope grouping put it
    with no layer. It is the layer's backward work, in the scope of the layer that owns the weights."""
    import keras

    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    with fresh_keras_names():
        left, right = keras.Input((8,)), keras.Input((8,))
        shared = keras.layers.Dense(4, name="shared")
        model = keras.Model([left, right], keras.layers.Add(name="sum")([shared(left), shared(right)]), name="twin")
        graph = trace_keras_training_step(model, [np.zeros((4, 8), "float32")] * 2, np.zeros((4, 4), "float32"),
                                          loss="mse", optimizer="adam", name="twin")
    sums = _ops(graph, "AddN")
    assert len(sums) == 2  # the kernel's gradients and the bias's
    assert all(graph.scopes[i] == "shared" and graph.phases[i] == PHASE_CODE["backward"] for i in sums)
    assert _ops(graph, "AddN", scope="shared", phase="backward") == sums


def _dense_step(activation: str):
    import keras

    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    with fresh_keras_names():
        inputs = keras.Input((8,), name="x")
        hidden = keras.layers.Dense(16, activation=activation, name="fc1")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden), name="act")
        return trace_keras_training_step(model, np.zeros((BATCH, 8), "float32"), np.zeros((BATCH, 1), "float32"),
                                         loss="mse", optimizer="adam", name="act")


def test_keras_step__a_custom_gradients_body_is_backward_work_of_its_layer():
    """``tf.nn.silu`` (Keras's swish) has a custom gradient, whose body TensorFlow names at the graph's root ("mul",
    "Sigmoid", ...), outside the tape's scope; its first op waits for the incoming gradient through a control edge
    only. Those ops were forward ops of scope "": the step's forward FLOPs counted the gradient's, in no layer."""
    swish, relu = _dense_step("swish"), _dense_step("relu")
    forward, backward = PHASE_CODE["forward"], PHASE_CODE["backward"]
    assert len(_ops(swish, "Sigmoid", scope="fc1", phase="forward")) == 1  # x * sigmoid(x)
    assert len(_ops(swish, "Sigmoid", scope="fc1", phase="backward")) == 1  # the gradient's sigmoid(x)
    body = [i for i, name in enumerate(swish.op_names) if "/" not in name and swish.op_kinds[i] in ("Mul", "Sigmoid")]
    assert len(body) >= 5 and all(swish.phases[i] == backward and swish.scopes[i] == "fc1" for i in body)
    for graph in (swish, relu):
        assert {graph.scopes[i] for i in range(graph.num_ops) if graph.phases[i] == backward} == {"fc1", "out", "mse"}
    relu_forward = relu.flops[relu.phases == forward].sum() - BATCH * 16  # less the Relu
    assert swish.flops[swish.phases == forward].sum() == relu_forward + 3 * BATCH * 16  # x * sigmoid(1 * x)


def test_keras_step__a_grouped_convolutions_gradient_is_its_layers_backward_work():
    """Keras's grouped Conv2D convolves in a jit_compile function; TensorFlow differentiates it in a function call
    of its own, whose ops it names "PartitionedCall/gradients/convolution_grad/...", "PartitionedCall_1/...": they
    had those numbered scopes, in no layer, so scope grouping put the convolutions' gradients in none."""
    import keras

    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    with fresh_keras_names():
        inputs = keras.Input((8, 8, 4), name="img")
        hidden = keras.layers.Conv2D(8, 3, padding="same", groups=2, activation="relu", name="g1")(inputs)
        hidden = keras.layers.Conv2D(8, 3, padding="same", groups=4, name="g2")(hidden)
        outputs = keras.layers.Dense(3, name="out")(keras.layers.GlobalAveragePooling2D(name="gap")(hidden))
        graph = trace_keras_training_step(keras.Model(inputs, outputs, name="gconv"), np.zeros((4, 8, 8, 4), "float32"),
                                          np.zeros((4, 3), "float32"), loss="mse", optimizer="adam", name="gconv")
    assert sorted(graph.scopes[_ops(graph, "Conv2DBackpropFilter", phase="backward")]) == ["g1", "g2"]
    assert list(graph.scopes[_ops(graph, "Conv2DBackpropInput", phase="backward")]) == ["g2"]  # g1's is dead
    backward = [i for i in range(graph.num_ops) if graph.phases[i] == PHASE_CODE["backward"]]
    assert {graph.scopes[i] for i in backward} == {"g1", "g2", "gap", "out", "mse"}
    assert any("PartitionedCall" in graph.op_names[i] for i in backward)  # the ops TensorFlow names so are there


def test_keras_step__layers_a_model_calls_in_a_conds_branches_are_scoped_by_those_layers():
    """A cond's branch names its ops "net_1/cond/then/net_1/cond/d1_1/MatMul": the flattened name finds the root
    model's scope ("net_1", mapped to ""), so the layers' forward and gradient ops had scope "", no layer, though
    the record lists them. Their own names ("net_1/cond/d1_1/MatMul") find the layers', the longer match."""
    import keras

    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.d1 = keras.layers.Dense(4, name="d1")
            self.d2 = keras.layers.Dense(4, name="d2")

        def call(self, x):
            return keras.ops.cond(keras.ops.sum(x) > 0, lambda: self.d1(x), lambda: self.d2(x))

    with fresh_keras_names():
        graph = trace_keras_training_step(Net(), np.ones((4, 8), "float32"), np.zeros((4, 4), "float32"),
                                          loss="mse", optimizer="sgd", name="net")
    assert graph.meta["layer_scopes"] == ["d1", "d2"]
    for layer in ("d1", "d2"):
        assert len(_ops(graph, "MatMul", scope=layer, phase="forward")) == 1
        assert len(_ops(graph, "MatMul", scope=layer, phase="backward")) == 2  # the input's and the kernel's
        assert len(_ops(graph, "BiasAddGrad", scope=layer, phase="backward")) == 1
    assert len(_ops(graph, "MatMul")) == 6

def test_keras_step__a_model_built_without_its_layers_gets_both_branches_of_a_cond_trained():
    """``model.build(shape)`` on a subclassed model marks it built, its layers not (Keras warns): the eager call
    that builds them ran one branch of the cond, and the other branch's layer, built inside the traced step,
    had no update and no optimizer state (171 ops instead of 227, exit 0)."""
    import warnings

    import keras

    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.pos = keras.layers.Dense(8, name="pos")
            self.neg = keras.layers.Dense(8, name="neg")

        def call(self, x):
            return keras.ops.cond(keras.ops.mean(x) > 0, lambda: self.pos(x), lambda: self.neg(x))

    graphs = []
    for build in (False, True):
        model = Net()
        if build:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "build() was called on layer 'net', however ..."
                model.build((None, 8))
        with fresh_keras_names():
            graphs.append(trace_keras_training_step(model, np.zeros((4, 8), "float32"), np.zeros((4, 8), "float32"),
                                                    loss="mse", optimizer="adam", name="net"))
    assert graphs[1].num_ops == graphs[0].num_ops and graphs[1].content_hash == graphs[0].content_hash
    assert len(_ops(graphs[1], "AssignSubVariableOp")) == 4  # Adam's update of both layers' kernel and bias


def test_keras_step__a_weight_regularizer_adds_its_loss_as_fit_does():
    """``fit`` adds the layers' losses (regularizers, ``add_loss``) to the compiled loss; the step left them out,
    so a model with ``kernel_regularizer="l2"`` imported to the graph of one without, and ``apply_keras`` trained
    it without weight decay."""
    import keras

    from graphs.tf.importer import trace_keras_training_step

    def step(regularizer):
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, kernel_regularizer=regularizer)])
        return trace_keras_training_step(model, np.zeros((4, 16), "float32"), np.zeros((4, 8), "float32"),
                                         loss="mse", optimizer="sgd", name="reg")

    plain, regularized = step(None), step("l2")
    forward = PHASE_CODE["forward"]
    added = regularized.flops[regularized.phases == forward].sum() - plain.flops[plain.phases == forward].sum()
    assert added >= 16 * 8  # at least one FLOP per kernel weight: its square
    assert regularized.num_ops > plain.num_ops and regularized.content_hash != plain.content_hash


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


def _scalar_weight_layer():
    """A Keras layer whose only weight is a scalar: shaped like the optimizer's step and learning rate."""
    import keras

    class Scale(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(), initializer="ones", name="w")

        def call(self, x):
            return x * self.w

    return Scale(name="scale")


@pytest.mark.parametrize("layer", ["dense_without_bias", "scalar_weight"])
def test_keras_step__a_single_variable_does_not_take_the_optimizer_step_or_learning_rate(layer):
    import keras

    from graphs.tf.importer import trace_keras_training_step

    inputs = keras.Input((8,), name="x")
    only = keras.layers.Dense(4, use_bias=False, name="fc") if layer == "dense_without_bias" else _scalar_weight_layer()
    model = keras.Model(inputs, only(inputs), name="one_variable")
    (variable,) = model.trainable_variables
    graph = trace_keras_training_step(model, np.zeros((BATCH, 8), "float32"),
                                      np.zeros((BATCH, *model.output.shape[1:]), "float32"),
                                      loss="mse", optimizer="adam", batch_size=BATCH)
    weight_bytes = int(np.prod(variable.shape)) * 4
    (op,) = _ops(graph, "Variable")
    assert graph.param_bytes[op] == 4 * weight_bytes  # weight + gradient + Adam m and v, nothing more
    state = {graph.op_names[i].split("/")[-1]: int(graph.param_bytes[i]) for i in _ops(graph, "VarHandleOp")}
    assert state == {"iteration": 8, "learning_rate": 4}  # int64 step, float32 rate: the optimizer's own
    assert graph.total_param_bytes == 4 * weight_bytes + 12


def test_tf_function__a_single_variable_merges_its_momentum_but_not_the_step_counter():
    """Both states flow only into the one variable's update; the momentum is written from the gradient,
    the step counter from itself."""
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    w = tf.Variable(tf.ones((4, 3)), name="w")
    momentum = tf.Variable(tf.zeros((4, 3)), trainable=False, name="momentum")
    step = tf.Variable(0.0, trainable=False, name="step")

    @tf.function
    def train(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w))
        (grad,) = tape.gradient(loss, [w])
        momentum.assign(0.9 * momentum + grad)
        step.assign_add(1.0)
        w.assign_sub(0.1 / tf.sqrt(step) * momentum)
        return loss

    graph = import_tf_function(train.get_concrete_function(tf.TensorSpec((None, 4))), name="t", batch_size=8)
    (variable,) = _ops(graph, "Variable")
    assert graph.param_bytes[variable] == 3 * 12 * 4  # weight, gradient, momentum
    (state,) = _ops(graph, "VarHandleOp")
    assert graph.op_names[state] == "step" and graph.param_bytes[state] == 4


def test_tf_function__conv3d_and_its_gradients_count_the_input_channels_and_einsum_its_contraction():
    """x (2, 5,5,5, 3) * filter (3,3,3, 3 in, 4 out) -> y (2, 3,3,3, 4): 2 x 216 outputs x 81 MACs, and as
    many for each gradient (Conv3D's forgot the 3 input channels, its gradients had no formula);
    einsum bij,bjk->bik over (2,3,4) and (2,4,5): 2 x 2*3*4*5 (it was one FLOP per output element)."""
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    w = tf.Variable(tf.ones((3, 3, 3, 3, 4)), name="w")

    @tf.function
    def step(x, a, b):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.conv3d(x, w, [1] * 5, "VALID")) + tf.reduce_sum(tf.einsum("bij,bjk->bik", a, b))
        return tape.gradient(loss, [x, w])

    specs = [tf.TensorSpec(shape) for shape in ((2, 5, 5, 5, 3), (2, 3, 4), (2, 4, 5))]
    graph = import_tf_function(step.get_concrete_function(*specs), name="c3")
    conv_flops = 2 * 2 * 27 * 4 * 27 * 3
    for kind in ("Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"):
        assert graph.flops[_ops(graph, kind)].tolist() == [conv_flops], kind
    assert graph.flops[_ops(graph, "Einsum")].tolist() == [2 * 2 * 3 * 4 * 5]


@pytest.mark.parametrize("equation, in_dims, flops", [
    (b"...ij,...jk->...ik", [[7, 2, 3, 4], [7, 2, 4, 5]], 2 * 14 * 3 * 4 * 5),  # broadcast dims once
    (b"a...j,jk->a...k", [[2, 7, 3], [3, 5]], 2 * 2 * 7 * 3 * 5),
    (b"ij->ji", [[3, 4]], 0),  # a transpose: it was counted as 2 x 12, where ONNX's Einsum gave 0
    (b"ij,jk,kl->il", [[2, 3], [3, 4], [4, 5]], 2 * 2 * 3 * 4 + 2 * 2 * 4 * 5),  # pairwise, as ONNX's: was 2 x 120
])
def test_tf_costs__einsum_counts_as_the_onnx_importer_does(equation, in_dims, flops):
    from graphs.tf.costs import op_flops

    assert op_flops("Einsum", in_dims, [[1]], {"equation": equation}, True) == flops


def test_tf_costs__a_nearest_resize_gradient_adds_each_incoming_gradient_element_once():
    """ResizeNearestNeighborGrad (grads [2, 8, 12, 3], size -> [2, 4, 6, 3]) scatter-adds every incoming element
    into the input element it copied: 576 FLOPs, where the elementwise fallback counted its 144 outputs."""
    from graphs.tf.costs import op_flops

    assert op_flops("ResizeNearestNeighborGrad", [[2, 8, 12, 3], [2]], [[2, 4, 6, 3]], {}, True) == 2 * 8 * 12 * 3


def test_tf_costs__an_embeddings_sparse_gradient_and_3d_pools_count_their_work():
    """UnsortedSegmentSum (12 looked-up rows of 8 into a 20 x 8 table) was 1 FLOP per table element, 160, where it
    adds 96; 3-D pools had no formula, 1 FLOP per output element whatever their window."""
    from graphs.tf.costs import op_flops

    assert op_flops("UnsortedSegmentSum", [[12, 8], [12], []], [[20, 8]], {}, True) == 12 * 8
    window = {"ksize": [1, 2, 2, 2, 1]}
    assert op_flops("MaxPool3D", [[1, 4, 4, 4, 3]], [[1, 2, 2, 2, 3]], window, True) == 24 * 8
    assert op_flops("AvgPool3D", [[1, 4, 4, 4, 3]], [[1, 2, 2, 2, 3]], window, True) == 24 * 8
    assert op_flops("MaxPool3DGrad", [[1, 4, 4, 4, 3], [1, 2, 2, 2, 3], [1, 2, 2, 2, 3]], [[1, 4, 4, 4, 3]],
                    window, True) == 24 * 8


@pytest.mark.parametrize("kind, num_outputs, missed", [
    ("ResourceScatterAdd", 0, True),  # changes a variable the cost model cannot see
    ("ResourceApplyPowerSign", 0, True),  # an optimizer kernel the apply table lacks
    ("AssignSubVariableOp", 0, False), ("ResourceApplyAdam", 0, False),  # in the apply table
    ("Assert", 0, False), ("AssignVariableOp", 0, False),  # listed: no arithmetic
    ("MatMul", 1, False), ("Reshape", 1, False),  # a formula; listed zero-cost
    ("Erf", 1, False),  # unlisted with an output: the elementwise fallback (or 0 for integer results)
])
def test_tf_costs__zero_flops_is_a_miss_only_for_an_unlisted_op_without_outputs(kind, num_outputs, missed):
    from graphs.tf.costs import without_flops

    assert without_flops(kind, num_outputs) is missed


def test_tf_function__ops_without_flops_lists_the_side_effect_ops_the_cost_model_missed():
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    w = tf.Variable(tf.ones((4, 3)), name="w")
    rows_seen = tf.Variable(tf.zeros(4), trainable=False, name="rows_seen")

    @tf.function
    def step(x, ids):
        tf.debugging.assert_non_negative(ids)  # an Assert: listed, no arithmetic
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.math.erf(tf.matmul(x, w)))  # Erf: unlisted, the elementwise fallback
        (grad,) = tape.gradient(loss, [w])
        rows = tf.math.floormod(ids + 1, 4)  # integer results: bookkeeping, 0 by rule
        w.scatter_sub(tf.IndexedSlices(0.1 * tf.gather(grad, rows), rows))
        rows_seen.scatter_add(tf.IndexedSlices(tf.ones_like(rows, tf.float32), rows))
        return loss

    specs = (tf.TensorSpec((None, 4)), tf.TensorSpec((None,), tf.int32))
    graph = import_tf_function(step.get_concrete_function(*specs), name="t", batch_size=8)
    assert {"Assert", "Erf", "FloorMod", "ResourceScatterSub", "ResourceScatterAdd"} <= set(graph.op_kinds)
    assert graph.meta["ops_without_flops"] == {"ResourceScatterAdd": 1, "ResourceScatterSub": 1}


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
    # a Sequential model's variables are named tiny/out/kernel: their scope is their layer's, as in a file
    assert {graph.scopes[i] for i in np.flatnonzero(graph.op_kinds == "Variable")} == {"out"}


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


@pytest.mark.parametrize("outputs", ["list", "dict", "list of one", "dict of one"])
def test_import_keras_spec__a_saved_model_of_several_outputs_uncompiled_is_stepped_as_compile_mse(tmp_path, outputs):
    """Saved without compile(), a model of two outputs (shapes 2 and 3, or a dict) failed to import: the one mean
    squared error took both outputs at once ("Dimension 1 in both shapes must be equal"). Now each output's, summed,
    as compile("mse") with Adam steps it: the same ops."""
    import keras

    from graphs.tf.importer import import_keras_spec

    def build():
        x = keras.Input((5,), name="x")
        hidden = keras.layers.Dense(4, name="hidden")(x)
        heads = [keras.layers.Dense(2, name="a")(hidden), keras.layers.Dense(3, name="b")(hidden)]
        heads = heads[:1] if outputs.endswith("of one") else heads
        named = dict(zip("ab", heads))
        return keras.Model(x, heads if outputs.startswith("list") else named, name="two_heads")

    build().save(tmp_path / "plain.keras")
    compiled = build()
    compiled.compile(optimizer="adam", loss="mse")
    compiled.save(tmp_path / "compiled.keras")
    plain = import_keras_spec(str(tmp_path / "plain.keras"), batch_size=4)
    reference = import_keras_spec(str(tmp_path / "compiled.keras"), batch_size=4)
    if outputs == "list of one":  # compile's loss takes the list of one target as it is (Keras stacks it: Pack,
        # Reshape, Sum), the made-up one the tensor in it
        assert plain.num_ops + 3 == reference.num_ops and "Pack" not in set(plain.op_kinds.tolist())
        return
    assert plain.num_ops == reference.num_ops and plain.flops.sum() == reference.flops.sum()  # names: adam, adam_1


def test_trace_keras_step__a_compiled_loss_takes_a_list_of_one_target_as_it_did():
    """The list of one (a tensor output, its target given in a list) is unwrapped for the made-up loss of an
    uncompiled model only: a compiled one took it as it is (Keras stacks it: Pack, Reshape, Sum), and its graph
    must not change under a re-import."""
    import keras

    from graphs.tf.importer import trace_keras_training_step

    x = keras.Input((5,), name="x")
    model = keras.Model(x, keras.layers.Dense(2, name="a")(keras.layers.Dense(4, name="h")(x)))
    inputs, target = np.zeros((3, 5), np.float32), np.zeros((3, 2), np.float32)
    plain = trace_keras_training_step(model, inputs, [target], name="t")  # (it failed: MeanSquaredError refused it)
    model.compile(optimizer="adam", loss="mse")
    compiled = trace_keras_training_step(model, inputs, [target], name="t")
    bare = trace_keras_training_step(model, inputs, target, name="t")
    assert compiled.num_ops == bare.num_ops + 3 and "Pack" in set(compiled.op_kinds.tolist())
    assert plain.num_ops == bare.num_ops and "Pack" not in set(plain.op_kinds.tolist())


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
    (tmp_path / "folder.keras").mkdir()
    with pytest.raises(PlacerError, match="folder.keras' is a folder, not a file"):
        import_keras_spec(str(tmp_path / "folder.keras"))


def test_graphs_import_keras__a_folder_or_a_file_of_garbage_is_named_before_tensorflow_loads(tmp_path, capsys):
    from cluster.cli import main

    (tmp_path / "folder.keras").mkdir()
    (tmp_path / "garbage.keras").write_bytes(b"not a model at all")
    for name, problem in (("folder", "is a folder, not a file"), ("garbage", "is not a .keras archive")):
        out = tmp_path / "g.parquet"
        assert main(["graphs", "import", "--keras", str(tmp_path / f"{name}.keras"), "-o", str(out)]) == 2
        assert f"{name}.keras' {problem}" in _cli_error(capsys)  # not Keras's "File not found"
    assert not (tmp_path / "g.parquet").exists()


def test_import_keras_spec__a_model_without_trainable_variables_is_refused_clearly(tmp_path):
    from graphs.tf.importer import import_keras_spec

    source = tmp_path / "no_weights.py"
    source.write_text(
        "import keras\n"
        "def build():\n"
        "    m = keras.Sequential([keras.Input((4,)), keras.layers.ReLU()], name='bare')\n"
        "    m.compile(optimizer='adam', loss='mse')\n"
        "    return m\n")
    with pytest.raises(PlacerError, match="Keras model 'bare' has no trainable variables: there is no training step"):
        import_keras_spec(f"{source}:build")


FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "tiny_models.py")


def _import_cli(tmp_path, function, *options):
    """Run `placer graphs import --keras tests/fixtures/tiny_models.py:FUNCTION` in-process: (exit code, file)."""
    from cluster.cli import main

    out = tmp_path / f"{function}{'_'.join(options)}.parquet"
    return main(["graphs", "import", "--keras", f"{FIXTURES}:{function}", "-o", str(out), *options]), out


def test_graphs_import_keras__bare_compiled_model_is_a_training_step_at_the_batch_size(tmp_path, capsys):
    from graphs.io import load_graph_file

    flops_by_batch = {}
    for batch in (8, 16):
        code, out = _import_cli(tmp_path, "tiny_keras_classifier", "--batch-size", str(batch))
        assert code == 0, capsys.readouterr().err
        graph = load_graph_file(out)
        assert graph.batch_size == batch and graph.meta["keras_batch_size"] == batch
        assert {PHASE_CODE[p] for p in ("forward", "backward", "update")} <= set(graph.phases.tolist())
        (loss,) = _ops(graph, "SparseSoftmaxCrossEntropyWithLogits")  # the compiled loss, integer class ids
        assert graph.phases[loss] == PHASE_CODE["forward"]
        assert len(_ops(graph, "AssignSubVariableOp", phase="update")) == 4  # Adam updates every weight
        (fc1,) = _ops(graph, "MatMul", scope="fc1", phase="forward")
        assert graph.out_bytes[fc1] == batch * 16 * 4
        flops_by_batch[batch] = graph.flops[fc1]
    assert flops_by_batch == {8: 2 * 8 * 8 * 16, 16: 2 * 16 * 8 * 16}


def test_graphs_import_keras__ops_without_flops_are_named_on_stderr_and_kept_in_the_file(tmp_path, capsys):
    from graphs.io import load_graph_file

    code, out = _import_cli(tmp_path, "tiny_keras_row_counter", "--batch-size", "4")
    assert code == 0
    err = capsys.readouterr().err
    assert "placer: warning: 1 op type has no FLOP formula, imported with bytes only: ResourceScatterAdd (1)" in err
    assert load_graph_file(out).meta["ops_without_flops"] == {"ResourceScatterAdd": 1}


def test_graphs_import_keras__a_loop_counted_once_is_said_on_stderr_and_kept_in_the_file(tmp_path, capsys):
    from graphs.io import load_graph_file

    code, out = _import_cli(tmp_path, "tiny_keras_input_settler", "--batch-size", "4")
    assert code == 0
    err = capsys.readouterr().err
    assert "placer: warning: 1 while loop(s) without a static trip count imported with their body counted once" in err
    graph = load_graph_file(out)
    assert graph.meta["loops_counted_once"] == 1 and "loop_trips" not in graph.meta


def test_graphs_import_keras__a_loop_of_static_trip_count_is_costed_silently_and_kept_in_the_file(tmp_path, capsys):
    from graphs.io import load_graph_file

    code, out = _import_cli(tmp_path, "tiny_keras_input_smoother", "--batch-size", "4")
    err = capsys.readouterr().err
    assert code == 0 and "while loop" not in err, err
    graph = load_graph_file(out)
    assert graph.meta["loop_trips"] == {"tiny_keras_input_smoother_1/smooth_1/while": 3}
    assert "loops_counted_once" not in graph.meta
    (tanh,) = _ops(graph, "Tanh")
    assert graph.flops[tanh] == 3 * 4 * 8 and graph.out_bytes[tanh] == 4 * 8 * 4  # 3 runs; one run's buffer


def test_keras_example__int_token_inputs_are_valid_ids_and_class_ids_drop_the_class_axis():
    from graphs.tf.importer import keras_example

    spec = f"{FIXTURES}:tiny_keras_token_tagger"
    _, tokens, tags, loss = keras_example(spec, batch_size=4)
    assert tokens.dtype == np.int32 and tokens.shape == (4, 6) and set(np.unique(tokens)) <= {0, 1}
    assert tags.dtype == np.int32 and tags.shape == (4, 6)  # output (4, 6, 5) less its class axis
    assert tags.min() >= 0 and tags.max() < 5 and len(np.unique(tags)) > 1
    assert loss is None  # the step uses the compiled loss
    _, again, tags_again, _ = keras_example(spec, batch_size=4)
    assert np.array_equal(tokens, again) and np.array_equal(tags, tags_again)  # seeded


def test_keras_example_from_result__tuple_or_bare_model_and_one_error_for_anything_else():
    """What `placer graphs import` and cluster.apply.apply_keras both read from a user's function."""
    from graphs.tf.importer import keras_example_from_result

    model = _mlp()
    model.compile(optimizer="adam", loss="mse")
    inputs, targets = np.zeros((4, 8), "float32"), np.zeros((4, 4), "float32")
    assert keras_example_from_result((model, inputs, targets), "fn")[3] is None  # the compiled loss
    assert keras_example_from_result((model, inputs, targets, "mae"), "fn", batch_size=4)[3] == "mae"
    _, made_up, _, _ = keras_example_from_result(model, "fn", batch_size=3)
    assert made_up.shape == (3, 8)
    with pytest.raises(PlacerError, match="batch size 8 was asked for, but 'fn' returned inputs of batch 4"):
        keras_example_from_result((model, inputs, targets), "fn", batch_size=8)
    for wrong in ((inputs, inputs, targets), (model, inputs), [model, inputs, targets], 42):
        with pytest.raises(PlacerError, match="'fn' must return a compiled Keras model"):
            keras_example_from_result(wrong, "fn")


def test_graphs_import_keras__embedding_model_on_token_ids(tmp_path, capsys):
    from graphs.io import load_graph_file

    code, out = _import_cli(tmp_path, "tiny_keras_token_tagger", "--batch-size", "4")
    assert code == 0, capsys.readouterr().err
    graph = load_graph_file(out)
    (gather,) = _ops(graph, "GatherV2", phase="forward")  # the Embedding lookup of the int32 token ids
    assert graph.out_bytes[gather] == 4 * 6 * 4 * 4  # batch x tokens x embedding dim x float32
    assert len(_ops(graph, "SparseSoftmaxCrossEntropyWithLogits")) == 1
    assert len(_ops(graph, "Input")) == 2 and graph.batch_size == 4


def test_import_keras_spec__regression_model_gets_float_targets_and_default_batch_32():
    from graphs.tf.importer import DEFAULT_BATCH_SIZE, import_keras_spec, keras_example

    spec = f"{FIXTURES}:tiny_keras_regressor"
    _, inputs, targets, _ = keras_example(spec)
    assert inputs.shape == (32, 4) and targets.shape == (32, 3) and targets.dtype == np.float32
    assert DEFAULT_BATCH_SIZE == 32 and 0 <= targets.min() and targets.max() < 1
    graph = import_keras_spec(spec)
    (matmul,) = _ops(graph, "MatMul", scope="out", phase="forward")
    assert graph.flops[matmul] == 2 * 32 * 4 * 3 and graph.batch_size == 32
    (square,) = _ops(graph, "Square", phase="forward")  # mean squared error: (targets - outputs) ** 2
    assert graph.out_bytes[square] == 32 * 3 * 4  # float targets of the output shape
    assert _ops(graph, "MatMul", scope="out", phase="backward") and _ops(graph, "AssignSubVariableOp", phase="update")


def test_import_keras_spec__two_output_model_gets_targets_per_output_name():
    from graphs.tf.importer import import_keras_spec, keras_example

    spec = f"{FIXTURES}:tiny_keras_two_heads"
    _, _, targets, _ = keras_example(spec, batch_size=5)
    assert set(targets) == {"kind", "flag"}
    assert targets["kind"].shape == (5, 4) and np.array_equal(targets["kind"].sum(axis=1), np.ones(5))  # one-hot
    assert targets["flag"].shape == (5, 1) and set(np.unique(targets["flag"])) <= {0.0, 1.0}
    graph = import_keras_spec(spec, batch_size=5)
    assert len(_ops(graph, "SoftmaxCrossEntropyWithLogits")) == 1  # categorical cross-entropy of "kind"
    assert all(_ops(graph, "MatMul", scope=head, phase="backward") for head in ("flag", "kind"))


def test_import_keras_spec__saved_classifier_file_gets_class_id_targets(tmp_path):
    import importlib.util

    from graphs.tf.importer import import_keras_spec

    module_spec = importlib.util.spec_from_file_location("tiny_models_for_saving", FIXTURES)
    tiny_models = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(tiny_models)
    path = tmp_path / "classifier.keras"
    tiny_models.tiny_keras_classifier().save(path)
    graph = import_keras_spec(str(path), batch_size=3)  # targets shaped like the output failed to trace
    assert len(_ops(graph, "SparseSoftmaxCrossEntropyWithLogits")) == 1 and graph.meta["keras_batch_size"] == 3


def _cli_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("placer: error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("function, options, phrases", [
    ("tiny_keras_uncompiled", (), ("'tiny_keras_uncompiled'", "not compiled with a loss", "model.compile(",
                                   "return (model, inputs, targets)")),
    ("tiny_keras_custom_loss", (), ("'distance_to_nearest_prototype'", "cannot tell what targets",
                                    "return (model, inputs, targets)")),
    ("tiny_keras_mlp", ("--batch-size", "8"), ("batch size 8", "inputs of batch 4")),
    ("tiny_keras_classifier", ("--batch-size", "0"), ("at least 1, got 0",)),
])
def test_graphs_import_keras__bare_model_it_cannot_step_is_one_error_line_and_no_file(
        tmp_path, capsys, function, options, phrases):
    code, out = _import_cli(tmp_path, function, *options)
    assert code == 2
    err = _cli_error(capsys)
    assert all(phrase in err for phrase in phrases), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_tf_measurer__measures_a_bare_model_graph_rebuilt_at_its_batch_on_the_local_machine(tmp_path, capsys):
    from graphs.io import load_graph_file
    from measurers.catalog import load_machine
    from measurers.tf.measurer import TFMeasurer

    code, out = _import_cli(tmp_path, "tiny_keras_classifier", "--batch-size", "8")
    assert code == 0, capsys.readouterr().err
    graph = load_graph_file(out)
    measurer = TFMeasurer(graph, load_machine("local"), runs=2, warmup=1)
    result = measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])[0]
    assert result.status == "ok" and len(result.samples_s) == 2 and result.runtime_s > 0, result.error
    assert np.array_equal(measurer.traced().graph.flops, graph.flops)  # the same step at batch 8, not 32


def _recurrent_model(kind: str, unroll: bool):
    """A model of 5 steps of 8 features through a recurrent layer of kind ``kind``, then Dense(2), every
    layer named, built from fresh name counters and seeded weights so that two builds are alike."""
    import keras

    from graphs.tf.importer import fresh_keras_names

    def rnn(name="lstm", cls=keras.layers.LSTM, **kwargs):
        return cls(16, name=name, unroll=unroll, **kwargs)

    with fresh_keras_names():
        keras.utils.set_random_seed(0)
        if kind == "subclassed":
            class Tagger(keras.Model):
                def __init__(self):
                    super().__init__(name="tagger")
                    self.encoder, self.head = rnn(return_sequences=True), keras.layers.Dense(2, name="head")

                def call(self, x):
                    return self.head(self.encoder(x))

            return Tagger()
        layer = {"lstm": rnn, "gru": lambda: rnn("gru", keras.layers.GRU),
                 "simple_rnn": lambda: rnn("simple_rnn", keras.layers.SimpleRNN),
                 "bidirectional": lambda: keras.layers.Bidirectional(rnn(), name="bi"),
                 "nested": lambda: keras.Sequential([keras.Input((5, 8)), rnn()], name="encoder")}[kind]()
        inputs = keras.Input((5, 8), name="x")
        return keras.Model(inputs, keras.layers.Dense(2, name="head")(layer(inputs)), name="net")


def _trace_recurrent(model, time_steps=5):
    import tensorflow as tf

    from graphs.tf.importer import trace_keras_training_step

    targets = np.zeros((4, 5, 2) if model.name == "tagger" else (4, 2), "float32")
    return trace_keras_training_step(model, tf.TensorSpec((4, time_steps, 8)), targets, loss="mse",
                                     optimizer="adam", name="rnn")


@pytest.mark.parametrize("kind, unrolled", [
    ("lstm", ["lstm"]), ("gru", ["gru"]), ("simple_rnn", ["simple_rnn"]),
    ("bidirectional", ["bi.forward_lstm", "bi.backward_lstm"]), ("nested", ["encoder.lstm"]),
    ("subclassed", ["lstm"]),
])
def test_keras_step__a_recurrent_layer_built_rolled_imports_as_if_built_with_unroll_true(kind, unrolled):
    """A Keras RNN built with the default unroll=False runs its steps in a while loop (counted once, its
    gradient without static shapes): the importer traces it unrolled, the very graph of the model built with
    unroll=True (same ops, names, costs, hash), and records which layers it unrolled."""
    model = _recurrent_model(kind, unroll=False)
    rolled, built_unrolled = _trace_recurrent(model), _trace_recurrent(_recurrent_model(kind, unroll=True))
    assert rolled.content_hash == built_unrolled.content_hash
    assert list(rolled.op_names) == list(built_unrolled.op_names)
    assert "While" not in set(rolled.op_kinds) and "loops_counted_once" not in rolled.meta
    assert rolled.meta["unrolled_layers"] == unrolled and "unrolled_layers" not in built_unrolled.meta
    assert not any(getattr(layer, "unroll", False) for layer in model._flatten_layers())  # the user's flags again


def test_keras_step__a_recurrent_layer_of_unknown_time_dimension_is_refused_naming_it_and_why():
    """Nothing to unroll to: the loop has no static trip count, and the error says which layer was left rolled
    and why, besides the loops."""
    import keras

    model = keras.Sequential([keras.Input((None, 8)), keras.layers.LSTM(16, name="lstm"), keras.layers.Dense(2)])
    with pytest.raises(PlacerError) as caught:
        _trace_recurrent(model, time_steps=None)
    message = str(caught.value)
    assert "while loop(s) without a static trip count would count their body once" in message
    assert "left these rolled: 'lstm': its input's time dimension is unknown (shape (4, None, 8))" in message


def test_keras_step__a_subclass_of_a_keras_recurrent_layer_is_left_rolled_and_named():
    """A user's subclass of LSTM may not honour unroll: it keeps its loop, and the error says so."""
    import keras

    class PeepholeishLSTM(keras.layers.LSTM):
        pass

    model = keras.Sequential([keras.Input((5, 8)), PeepholeishLSTM(16, name="mine"), keras.layers.Dense(2)])
    with pytest.raises(PlacerError) as caught:
        _trace_recurrent(model)
    assert "'mine': PeepholeishLSTM is not one of Keras's own recurrent layers" in str(caught.value)
    assert "build it with unroll=True" in str(caught.value)


def test_graphs_import_keras__a_rolled_lstm_is_imported_unrolled_with_one_note(tmp_path, capsys):
    from graphs.io import load_graph_file

    code, out = _import_cli(tmp_path, "tiny_keras_lstm_classifier", "--batch-size", "4")
    err = capsys.readouterr().err
    assert code == 0, err
    assert err == ("placer: note: 1 Keras recurrent layer(s) built with unroll=False traced unrolled, so every "
                   "time step's ops are in the graph: lstm\n")
    graph = load_graph_file(out)
    assert graph.meta["unrolled_layers"] == ["lstm"]
    recurrent = _ops(graph, "MatMul", scope="lstm.lstm_cell", phase="forward")
    assert len(recurrent) == 2 * 4  # the input and the recurrent kernel's matmuls, at each of the 4 steps


def test_import_keras_spec__a_saved_model_with_a_rolled_gru_is_imported_unrolled(tmp_path):
    """A .keras file keeps the layer's unroll=False: loaded, the layer is unrolled as a model built in code is."""
    import keras

    from graphs.tf.importer import import_keras_spec

    model = keras.Sequential([keras.Input((3, 4)), keras.layers.GRU(5, name="gru"), keras.layers.Dense(1, name="out")],
                             name="saved_gru")
    model.compile(optimizer="sgd", loss="mse")
    model.save(tmp_path / "gru.keras")
    graph = import_keras_spec(str(tmp_path / "gru.keras"), batch_size=2)
    assert graph.meta["unrolled_layers"] == ["gru"] and "While" not in set(graph.op_kinds)


def _loop_graph(step, batch=2):
    """``step`` (a tf.function of one (batch, 4) float input) imported, and its MatMuls by name."""
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    graph = import_tf_function(step.get_concrete_function(tf.TensorSpec((batch, 4))), name="loop", batch_size=batch)
    return graph, {graph.op_names[i]: i for i in _ops(graph, "MatMul")}


MATMUL_FLOPS = 2 * 2 * 4 * 4  # a (2, 4) @ (4, 4) MatMul, once
MATMUL_BYTES = (2 * 4 + 4 * 4 + 2 * 4) * 4  # its input, weight (read from the variable) and output


def test_tf_function__a_while_loop_with_maximum_iterations_costs_its_body_that_many_times():
    """while_v2 ANDs ``loop counter < maximum_iterations`` with the user's condition (a constant true here)."""
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        return tf.while_loop(lambda h: True, lambda h: (tf.matmul(h, w),), (x,), maximum_iterations=5)

    graph, matmuls = _loop_graph(step)
    (matmul,) = matmuls.values()
    assert graph.flops[matmul] == 5 * MATMUL_FLOPS
    assert graph.bytes_accessed[matmul] == 5 * MATMUL_BYTES
    assert graph.out_bytes[matmul] == 2 * 4 * 4  # one iteration's buffer
    assert graph.meta["loop_trips"] == {"while": 5} and "loops_counted_once" not in graph.meta


def test_tf_function__autograph_for_over_tf_range_costs_its_body_per_iteration_and_nested_loops_multiply():
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        for _ in tf.range(4):
            x = tf.matmul(x, w)
        for _ in tf.range(10, 0, -4):  # 10, 6, 2
            for _ in tf.range(2, 9, 3):  # 2, 5, 8
                x = tf.matmul(x, w)
        return x

    graph, matmuls = _loop_graph(step)
    assert sorted(graph.flops[list(matmuls.values())]) == [4 * MATMUL_FLOPS, 3 * 3 * MATMUL_FLOPS]
    assert sorted(graph.meta["loop_trips"].values()) == [3, 3, 4]  # each loop's own count, per run of it


@pytest.mark.parametrize("cond, start, step, trips", [
    (lambda i, h: i < 10, 0, 1, 10), (lambda i, h: i <= 10, 1, 2, 5), (lambda i, h: 7 > i, 0, 3, 3),
    (lambda i, h: i > 0, 9, -2, 5), (lambda i, h: i >= -3, 0, -1, 4), (lambda i, h: i < 3, 5, 1, 0),
], ids=["i<10", "i<=10_by_2", "7>i_by_3", "i>0_down_by_2", "i>=-3_down", "never"])
def test_tf_function__a_counter_compared_with_a_constant_gives_the_trip_count(cond, start, step, trips):
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def loop(x):
        return tf.while_loop(cond, lambda i, h: (i + step, tf.matmul(h, w)), (start, x))[1]

    graph, matmuls = _loop_graph(loop)
    (matmul,) = matmuls.values()
    assert graph.flops[matmul] == trips * MATMUL_FLOPS and graph.meta["loop_trips"] == {"while": trips}


@pytest.mark.parametrize("loop", ["data", "counter_doubled", "bound_from_data", "maximum_and_data"])
def test_tf_function__a_loop_without_a_static_trip_count_is_counted_once_and_recorded(loop):
    """A condition on the data (even under a maximum_iterations, which only bounds it), a counter the body
    changes otherwise than by a constant step, a bound computed at run time: the body counts once."""
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")
    conds = {"data": lambda i, h: tf.reduce_sum(h) < 100.0, "counter_doubled": lambda i, h: i < 10,
             "bound_from_data": lambda i, h: i < tf.cast(tf.reduce_sum(h), tf.int32),
             "maximum_and_data": lambda i, h: tf.reduce_sum(h) < 100.0}

    @tf.function
    def step(x):
        body = (lambda i, h: (i * 2, tf.matmul(h, w))) if loop == "counter_doubled" else \
            (lambda i, h: (i + 1, tf.matmul(h, w)))
        return tf.while_loop(conds[loop], body, (1, x), maximum_iterations=4 if loop == "maximum_and_data" else None)

    graph, matmuls = _loop_graph(step)
    (matmul,) = matmuls.values()
    assert graph.flops[matmul] == MATMUL_FLOPS
    assert graph.meta["loops_counted_once"] == 1 and "loop_trips" not in graph.meta


def test_tf_function__a_for_loop_over_tf_range_with_a_break_is_counted_once():
    """autograph ANDs the range's comparison with a flag the break sets: the loop may stop at any iteration."""
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        for _ in tf.range(10):
            x = tf.matmul(x, w)
            if tf.reduce_sum(x) > 100.0:
                break
        return x

    graph, matmuls = _loop_graph(step)
    assert list(graph.flops[list(matmuls.values())]) == [MATMUL_FLOPS]
    assert graph.meta["loops_counted_once"] == 1 and "loop_trips" not in graph.meta


def test_tf_function__no_loop_no_loop_records():
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def no_loop(x):
        return tf.reduce_sum(tf.matmul(x, w))

    plain, _ = _loop_graph(no_loop)
    assert "loops_counted_once" not in plain.meta and "loop_trips" not in plain.meta


SHAPE_BOUNDS = {  # a loop bound written in shape arithmetic on a (3, 4) x, and the trip count it is
    "shape_0": (lambda tf, x: tf.shape(x)[0], 3),
    "shape_1_minus_1": (lambda tf, x: tf.shape(x)[1] - 1, 3),
    "size_floordiv_rank": (lambda tf, x: tf.size(x) // tf.rank(x), 6),
    "gather_min_plus_1": (lambda tf, x: tf.minimum(tf.gather(tf.shape(x), 1), 2) + 1, 3),
    "int64_last_cast": (lambda tf, x: tf.cast(tf.shape(x, out_type=tf.int64)[-1], tf.int32), 4),
}


@pytest.mark.parametrize("bound", SHAPE_BOUNDS, ids=list(SHAPE_BOUNDS))
def test_tf_function__a_for_loop_over_a_range_of_shape_arithmetic_costs_its_body_per_iteration(bound):
    """``for i in tf.range(tf.shape(x)[0])``: the bound is a Shape op's static value sliced (and combined)."""
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")
    limit, trips = SHAPE_BOUNDS[bound]

    @tf.function
    def step(x):
        for _ in tf.range(limit(tf, x)):
            x = tf.matmul(x, w)
        return x

    graph, matmuls = _loop_graph(step, batch=3)
    (matmul,) = matmuls.values()
    assert graph.flops[matmul] == trips * 2 * 3 * 4 * 4
    assert graph.meta["loop_trips"] == {"while": trips} and "loops_counted_once" not in graph.meta


def test_tf_function__a_while_loop_whose_condition_reads_a_loop_variables_shape_gets_the_trip_count():
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        return tf.while_loop(lambda i, h: i < tf.shape(h)[1], lambda i, h: (i + 1, tf.matmul(h, w)), (0, x))[1]

    graph, matmuls = _loop_graph(step)
    (matmul,) = matmuls.values()
    assert graph.flops[matmul] == 4 * MATMUL_FLOPS and graph.meta["loop_trips"] == {"while": 4}


def test_tf_function__a_batch_left_open_in_the_signature_bounds_a_loop_by_the_imported_batch_size():
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        for _ in tf.range(tf.shape(x)[0]):
            x = tf.matmul(x, w)
        return x

    graph = import_tf_function(step.get_concrete_function(tf.TensorSpec((None, 4))), name="loop", batch_size=5)
    (matmul,) = _ops(graph, "MatMul")
    assert graph.flops[matmul] == 5 * 2 * 5 * 4 * 4 and graph.meta["loop_trips"] == {"while": 5}


@pytest.mark.parametrize("rows", ["boolean_mask", "unique", "flattened"])
def test_tf_function__with_the_batch_left_open_only_the_arguments_rows_are_the_batch(rows):
    """The signature leaves x's batch open (imported at 5): the rows of a tf.boolean_mask or tf.unique of x
    are data-dependent and those of x reshaped to [-1] 4 times the batch, though TensorFlow's shape gives each
    an unknown leading dim as x's: a loop over them was counted 5 times, as over x's own rows."""
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    w = tf.Variable(tf.ones((4, 4)), name="w")
    derived = {"boolean_mask": lambda x: tf.boolean_mask(x, x[:, 0] > 0),
               "unique": lambda x: tf.unique(tf.reshape(tf.cast(x, tf.int32), [-1]))[0],
               "flattened": lambda x: tf.reshape(x, [-1])}

    @tf.function
    def step(x):
        for _ in tf.range(tf.shape(x)[0]):
            x = tf.matmul(x, w)
        for _ in tf.range(tf.shape(derived[rows](x))[0]):
            x = tf.matmul(x, w)
        return x

    graph = import_tf_function(step.get_concrete_function(tf.TensorSpec((None, 4))), name="loop", batch_size=5)
    assert list(graph.meta["loop_trips"].values()) == [5] and graph.meta["loops_counted_once"] == 1


@pytest.mark.parametrize("unknown", ["dim_left_open", "data_dependent_rows", "loop_variable_shrinking"])
def test_tf_function__a_bound_on_a_shape_not_known_statically_counts_its_loop_once(unknown):
    """Next to a loop on a static dim (counted): a dim the signature leaves open past the batch, the rows of a
    tf.unique (data-dependent, though the batch is static), the rows of a loop variable a shape invariant lets
    shrink (the body sees the rows it enters with, 4, but it runs twice): each counted once, and recorded."""
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    w = tf.Variable(tf.ones((4, 4)), name="w")
    bounds = {"dim_left_open": lambda x, y: tf.shape(y)[1],
              "data_dependent_rows": lambda x, y: tf.shape(tf.unique(y[0])[0])[0]}

    @tf.function
    def step(x, y):
        for _ in tf.range(tf.shape(x)[0]):
            x = tf.matmul(x, w)
        if unknown == "loop_variable_shrinking":
            return tf.while_loop(lambda i, h: i < tf.shape(h)[0], lambda i, h: (i + 1, h[1:]), (0, x),
                                 shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, 4])))[1]
        for _ in tf.range(bounds[unknown](x, y)):
            x = tf.matmul(x, w)
        return x

    concrete = step.get_concrete_function(tf.TensorSpec((4, 4)), tf.TensorSpec((4, None), tf.int32))
    graph = import_tf_function(concrete, name="loop", batch_size=4)
    assert list(graph.meta["loop_trips"].values()) == [4]
    assert graph.meta["loops_counted_once"] == 1


def test_tf_function__a_loop_growing_a_tensor_costs_each_iteration_at_its_size():
    """A relaxed shape invariant lets h grow, 2, 4, then 8 rows (the slice keeps at most 8), over 5 iterations:
    each iteration's MatMul counts its own rows, not the 2 that h enters with, in one op for all of them; its
    output bytes are the largest iteration's."""
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        return tf.while_loop(lambda i, h: i < 5, lambda i, h: (i + 1, tf.concat([h, tf.matmul(h, w)], 0)[:8]), (0, x),
                             shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, 4])))[1]

    graph, matmuls = _loop_graph(step)
    (matmul,) = matmuls.values()
    rows = [2, 4, 8, 8, 8]
    assert graph.flops[matmul] == sum(2 * r * 4 * 4 for r in rows)
    assert graph.bytes_accessed[matmul] == sum((r * 4 + 4 * 4 + r * 4) * 4 for r in rows)
    assert graph.out_bytes[matmul] == 8 * 4 * 4
    assert graph.meta["loop_trips"] == {"while": 5} and "loops_counted_once" not in graph.meta


def test_tf_function__a_loop_whose_shapes_change_in_more_iterations_than_followed_is_refused_naming_it(monkeypatch):
    import tensorflow as tf

    from graphs.tf import flatten

    monkeypatch.setattr(flatten, "MAX_FOLLOWED_ITERATIONS", 3)
    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        return tf.while_loop(lambda i, h: i < 4, lambda i, h: (i + 1, tf.concat([h, tf.matmul(h[:1], w)], 0)), (0, x),
                             shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, 4])))[1]

    with pytest.raises(PlacerError, match="while loop 'while': its variables change shape in each of its first 3 "
                                          r"iterations \(of 4\).*give its variables fixed shapes"):
        _loop_graph(step)


def test_keras_step__a_custom_loop_layer_costs_its_forward_and_gradient_loops_per_iteration():
    """The gradient of a while loop is another loop, bounded by the forward loop's final counter: both run
    three times, so the forward MatMul and the gradient's two (dX, dW) count three iterations each."""
    import keras
    import tensorflow as tf

    from graphs.tf.importer import trace_keras_training_step

    class Repeat(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1], input_shape[-1]), name="w")

        def call(self, x):
            return tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, self.w))), (0, x))[1]

    model = keras.Sequential([keras.Input((8,)), Repeat(name="rep"), keras.layers.Dense(2, name="out")], name="net")
    graph = trace_keras_training_step(model, tf.TensorSpec((4, 8)), np.zeros((4, 2), "float32"), loss="mse",
                                      optimizer="adam", name="net")
    assert sorted(graph.meta["loop_trips"].items()) == [
        ("gradient_tape/net_1/rep_1/while/net_1/rep_1/while_grad", 3), ("net_1/rep_1/while", 3)]
    assert "loops_counted_once" not in graph.meta
    (forward,) = _ops(graph, "MatMul", scope="rep", phase="forward")
    backward = _ops(graph, "MatMul", scope="rep", phase="backward")
    assert graph.flops[forward] == 3 * 2 * 4 * 8 * 8 and list(graph.flops[backward]) == [3 * 2 * 4 * 8 * 8] * 2
    # The forward loop fills TensorLists (made under the tape's scope) for its gradient: still forward, and so
    # is what follows it.
    assert graph.phases[list(graph.op_names).index("net_1/rep_1/while")] == PHASE_CODE["forward"]
    (dense,) = _ops(graph, "MatMul", scope="out", phase="forward")
    assert graph.flops[dense] == 2 * 4 * 8 * 2  # outside the loop: once


def test_keras_step__a_loop_nested_in_a_loop_costs_its_gradient_by_both_trip_counts():
    """The outer loop keeps the inner loop's accumulators (lists) in its own, so the lists the outer gradient
    pops had no element shapes and the inner gradient's MatMuls no static shapes (a LoopShapeError); the inner
    gradient's trip count is the inner forward loop's final counter, popped from an accumulator too."""
    import keras
    import tensorflow as tf

    from graphs.tf.importer import trace_keras_training_step

    class Nested(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1], input_shape[-1]), name="w")

        def call(self, x):
            def inner(h):
                return tf.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, self.w))),
                                     (0, h))[1]

            return tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, inner(h)), (0, x))[1]

    model = keras.Sequential([keras.Input((8,)), Nested(name="nest"), keras.layers.Dense(2, name="out")], name="net")
    graph = trace_keras_training_step(model, tf.TensorSpec((4, 8)), np.zeros((4, 2), "float32"), loss="mse",
                                      optimizer="adam", name="net")
    assert sorted(graph.meta["loop_trips"].values()) == [2, 2, 3, 3] and "loops_counted_once" not in graph.meta
    (forward,) = _ops(graph, "MatMul", scope="nest", phase="forward")
    backward = _ops(graph, "MatMul", scope="nest", phase="backward")
    assert graph.flops[forward] == 3 * 2 * 2 * 4 * 8 * 8 and list(graph.flops[backward]) == [3 * 2 * 2 * 4 * 8 * 8] * 2


def test_tf_function__three_nested_for_loops_over_tf_range_cost_their_gradient_by_all_three_counts():
    import tensorflow as tf

    w = tf.Variable(tf.ones((4, 4)), name="w")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            for _ in tf.range(3):
                for _ in tf.range(2):
                    for _ in tf.range(5):
                        x = tf.tanh(tf.matmul(x, w))
            loss = tf.reduce_sum(x)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    graph, matmuls = _loop_graph(step)
    assert sorted(graph.meta["loop_trips"].values()) == [2, 2, 3, 3, 5, 5] and "loops_counted_once" not in graph.meta
    assert sorted(graph.phases[list(matmuls.values())]) == [PHASE_CODE["forward"]] + [PHASE_CODE["backward"]] * 2
    assert list(graph.flops[list(matmuls.values())]) == [3 * 2 * 5 * MATMUL_FLOPS] * 3


def _two_conv_net():
    import keras

    inputs = keras.Input((12, 12, 3), name="x")
    hidden = keras.layers.Conv2D(4, 3, name="conv1")(inputs)  # 10x10x4
    hidden = keras.layers.Conv2D(4, 3, name="conv2")(hidden)  # 8x8x4
    outputs = keras.layers.Dense(2, name="fc")(keras.layers.Flatten(name="flat")(hidden))
    return keras.Model(inputs, outputs, name="convnet")


def _writes(graph) -> set[str]:
    return {str(n) for n, k in zip(graph.op_names, graph.op_kinds) if k.startswith("Assign")}


def test_keras_step__the_input_gradient_nothing_reads_is_dropped_with_its_flops_and_updates_stay():
    """TensorFlow never runs the first conv's gradient with respect to the (not trainable) input data."""
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function, keras_train_step, trace_keras_training_step

    model, x, y = _two_conv_net(), np.zeros((BATCH, 12, 12, 3), "float32"), np.zeros((BATCH, 2), "float32")
    graph = trace_keras_training_step(model, x, y, loss="mse", optimizer="adam", name="convnet")
    step, _ = keras_train_step(model, "mse", "adam")
    specs = [tf.TensorSpec(x.shape), tf.TensorSpec(y.shape)]
    everything = import_tf_function(tf.function(step, autograph=False).get_concrete_function(*specs))
    (dead,) = [i for i in _ops(everything, "Conv2DBackpropInput") if everything.out_bytes[i] == x.nbytes]
    assert everything.flops[dead] == 2 * BATCH * 10 * 10 * 4 * 3 * 3 * 3  # dX of conv1: out pixels x kernel
    (kept,) = _ops(graph, "Conv2DBackpropInput")  # conv2's dX: conv1's weight gradient reads it
    assert graph.scopes[kept] == "conv2"
    rest = [i for i, name in enumerate(everything.op_names) if i != dead and name not in set(graph.op_names)]
    assert {str(everything.op_names[i]).rsplit("/", 1)[0] for i in rest} <= {"gradient_tape/mse",
                                                                            "gradient_tape/mse/div_no_nan"}
    assert everything.flops[rest].max() <= 1  # the rest: the loss's batch mean's gradient by its batch size
    assert everything.total_flops - graph.total_flops == everything.flops[dead] + everything.flops[rest].sum()
    assert len(_writes(graph)) == len(_writes(everything)) == 3 * 6 + 1  # weight, m, v of 6 variables; step
    assert len(_ops(graph, "Variable")) == 6 and graph.num_params == everything.num_params


def test_keras_step__the_ops_dropped_are_those_tensorflows_pruner_drops():
    import keras
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    from graphs.tf.flatten import flatten_graph
    from graphs.tf.importer import keras_train_step

    inputs = keras.Input((8, 8, 3))
    hidden = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3)(inputs))
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(keras.layers.Dropout(0.5)(hidden)))
    step, _ = keras_train_step(keras.Model(inputs, outputs), "mse", "sgd")
    graph = tf.function(step, autograph=False).get_concrete_function(tf.TensorSpec((4, 8, 8, 3)),
                                                                     tf.TensorSpec((4, 2))).graph
    meta_graph = tf.compat.v1.train.export_meta_graph(graph_def=graph.as_graph_def(), graph=graph)
    fetches = [t.op.name for t in graph.outputs] + [op.name for op in graph.control_outputs]
    meta_graph.collection_def["train_op"].node_list.value.extend(fetches)
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.optimizers[:] = ["pruning"]  # grappler's model pruner alone
    config.graph_options.rewrite_options.min_graph_nodes = -1
    run_by_tensorflow = {node.name for node in tf_optimizer.OptimizeGraph(config, meta_graph).node}
    every_op = {op.name for op in flatten_graph(graph, 4)}
    live = {op.name for op in flatten_graph(graph, 4, drop_dead=True)}
    assert every_op - live == every_op - run_by_tensorflow
    assert any(name.endswith("Conv2DBackpropInput") for name in every_op - live)


def test_tf_function__dead_ops_stay_unless_asked_and_go_when_tensorflow_would_not_run_them():
    import tensorflow as tf

    from graphs.tf.flatten import flatten_graph
    from graphs.tf.importer import import_tf_function

    w, count = tf.Variable(tf.ones((4, 3)), name="w"), tf.Variable(0, name="count")

    @tf.function
    def bump():
        count.assign_add(1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w))
        tf.exp(x)  # nothing reads it
        bump()  # nothing reads it either, but a tf.function runs every variable write (a control output)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    concrete = step.get_concrete_function(tf.TensorSpec((8, 4)))
    kept = import_tf_function(concrete, name="t")  # a plain function's graph: every op, as before
    live = import_tf_function(concrete, name="t", drop_dead_ops=True)
    assert _ops(kept, "Exp") and not _ops(live, "Exp") and live.num_ops == kept.num_ops - 1
    assert _ops(live, "AssignAddVariableOp") and _ops(live, "AssignSubVariableOp")  # in the callee, too

    def v1_step(x):
        count.assign_add(1)  # a v1 graph adds no control output: TensorFlow does not run it
        return tf.reduce_sum(x)

    wrapped = tf.compat.v1.wrap_function(v1_step, [tf.TensorSpec((2, 2))])
    wrapped(tf.ones((2, 2)))
    assert int(count.numpy()) == 0
    assert [op.kind for op in flatten_graph(wrapped.graph, 2, drop_dead=True) if not op.is_argument] == ["Sum"]


def test_import_keras_spec__the_same_model_gets_the_same_names_whatever_the_process_built_before():
    import keras

    from graphs.tf.importer import import_keras_spec

    spec = "tests/fixtures/tiny_models.py:tiny_keras_mlp"  # compiled with "adam", its Dense layers unnamed
    keras.optimizers.Adam(), keras.layers.Dense(2)
    first = import_keras_spec(spec)
    keras.optimizers.Adam(), keras.optimizers.SGD(), keras.layers.Dense(2)
    second = import_keras_spec(spec)
    assert list(first.op_names) == list(second.op_names) and list(first.scopes) == list(second.scopes)
    assert first.content_hash == second.content_hash
    assert "adam/iteration" in set(first.op_names) and {"dense", "dense_1"} <= set(first.scopes)


def test_fresh_keras_names__count_from_zero_inside_and_stay_unique_after():
    import keras

    from graphs.tf.importer import fresh_keras_names

    before = keras.optimizers.Adam().name
    with fresh_keras_names():
        inside = keras.optimizers.Adam().name
    after = keras.optimizers.Adam().name
    assert inside == "adam" and after not in (before, inside)


def test_import_keras_spec__a_module_level_layer_keeps_its_name_and_the_function_runs_once():
    """A module spec is imported once per process: its module-level layer was named "dense" from fresh
    counters, and the next import's fresh counters named the function's own Dense "dense" too, which Keras
    refuses in one model ("All operation names should be unique"): the function ran a second time, named
    by the process's counters (another hash). Fresh counters now skip the names of the layers the function
    reaches, as in a fresh process, which names the module's layers on import, then calls the function."""
    from fixtures import keras_shared_layer
    from graphs.tf.importer import import_keras_spec

    graphs, calls = [], []
    for _ in range(2):
        before = len(keras_shared_layer.CALLS)
        graphs.append(import_keras_spec("fixtures.keras_shared_layer:build", batch_size=2))
        calls.append(len(keras_shared_layer.CALLS) - before)
    assert calls == [1, 1]
    assert graphs[0].content_hash == graphs[1].content_hash
    assert keras_shared_layer.SHARED.name == "dense" and {"dense", "dense_1", "adam"} <= set(graphs[1].scopes)


def test_import_keras_spec__a_layer_cached_elsewhere_that_clashes_runs_the_function_again(tmp_path, monkeypatch):
    """A layer kept where the function's globals do not show it (a cache in another module) is not skipped:
    its model is refused inside the function, which then runs again with the process's counters."""
    from graphs.tf.importer import import_keras_spec

    (tmp_path / "placer_layer_cache.py").write_text(
        "import functools\n"
        "import keras\n"
        "@functools.lru_cache\n"
        "def shared():\n"
        "    return keras.layers.Dense(4)\n")
    (tmp_path / "placer_cached_layer_spec.py").write_text(
        "import keras\n"
        "import placer_layer_cache\n"
        "CALLS = []\n"
        "def build():\n"
        "    CALLS.append(1)\n"
        "    shared = placer_layer_cache.shared()  # 'dense', from the first import's fresh counters\n"
        "    inputs = keras.Input((8,))\n"
        "    model = keras.Model(inputs, shared(keras.layers.Dense(4)(inputs)))\n"
        "    model.compile(optimizer='adam', loss='mse')\n"
        "    return model\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = import_keras_spec("placer_cached_layer_spec:build", batch_size=2)
    second = import_keras_spec("placer_cached_layer_spec:build", batch_size=2)
    import placer_cached_layer_spec

    assert len(placer_cached_layer_spec.CALLS) == 3
    assert first.num_ops == second.num_ops and first.total_flops == second.total_flops


def test_reachable_keras_names__globals_closure_and_containers_with_sublayers():
    import keras

    from graphs.tf.importer import fresh_keras_names, keras_names_past, reachable_keras_names

    inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="deep")], name="inner")
    held = {"models": [inner]}
    closed = keras.layers.Dense(2, name="closed")

    def build(default=keras.layers.Dense(2, name="default")):
        return held, closed

    assert {"inner", "deep", "closed", "default"} <= reachable_keras_names(build)
    assert "closed" in reachable_keras_names(functools.partial(build))
    with fresh_keras_names(), keras_names_past(frozenset({"dense", "dense_2"})):
        names = [keras.layers.Dense(2).name for _ in range(3)]
    assert names == ["dense_1", "dense_3", "dense_4"]


def test_keras_step__resizes_count_their_interpolation_as_the_onnx_importer_does():
    """ResizeBilinear and ResizeBicubic fell back to 1 FLOP an output element, and ResizeNearestNeighbor too,
    where the ONNX importer's Resize counts taps^k multiply-adds an output element (k the dims resized: 2^k
    for bilinear, 4^k for bicubic) and nearest 0, a gather. conv (2, 4, 6, 3) -> (2, 8, 12, 3) three ways,
    and -> (2, 4, 12, 3) bilinear (one dim resized); a gradient does its forward's multiply-adds, nearest's
    one add per incoming gradient element."""
    import keras

    from graphs.tf.importer import trace_keras_training_step

    inputs = keras.Input((4, 6, 3), name="x")
    conv = keras.layers.Conv2D(3, 1, name="conv")(inputs)
    resized = [keras.layers.Resizing(height, 12, interpolation=mode, name=name)(conv)
                for name, mode, height in (("bilinear", "bilinear", 8), ("bicubic", "bicubic", 8),
                                           ("nearest", "nearest", 8), ("wide", "bilinear", 4))]
    outputs = keras.layers.Concatenate(axis=1)(resized)
    model = keras.Model(inputs, outputs, name="resizes")
    graph = trace_keras_training_step(model, np.zeros((2, 4, 6, 3), "float32"),
                                      np.zeros((2, 28, 12, 3), "float32"), loss="mse", optimizer="sgd", name="resizes")
    both, wide = 2 * 8 * 12 * 3, 2 * 4 * 12 * 3
    forward = {graph.scopes[i]: graph.flops[i] for i in range(graph.num_ops)
               if graph.op_kinds[i].startswith("Resize") and graph.phases[i] == PHASE_CODE["forward"]}
    assert forward == {"bilinear": 2 * 4 * both, "bicubic": 2 * 16 * both, "nearest": 0, "wide": 2 * 2 * wide}
    grads = {graph.scopes[i]: graph.flops[i]
             for i in _ops(graph, "ResizeBilinearGrad") + _ops(graph, "ResizeBicubicGrad")}
    assert grads == {"bilinear": 2 * 4 * both, "bicubic": 2 * 16 * both, "wide": 2 * 2 * wide}
    nearest_grads = graph.flops[_ops(graph, "ResizeNearestNeighborGrad")].tolist()
    assert nearest_grads == [both]  # a scatter-add: one add per incoming gradient element


@pytest.mark.parametrize("loss, loss_weights", [(["mse", "mae"], [0.3, 2.0]),
                                                 ({"b": "mae", "a": "mse"}, {"b": 2.0, "a": 0.5}), ("mse", 0.5)])
def test_keras_step__compiled_loss_weights_weigh_the_step_as_fit_does(loss, loss_weights):
    """``compile(..., loss_weights=...)``: the step summed the outputs' losses unweighted, so a model applied
    with apply_keras trained another objective than fit's."""
    import keras
    import tensorflow as tf

    from graphs.tf.importer import keras_train_step

    def compiled():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(4, name="fc")(inputs)
        outputs = [keras.layers.Dense(3, name="a")(hidden), keras.layers.Dense(2, name="b")(hidden)]
        model = keras.Model(inputs, outputs if not isinstance(loss, str) else outputs[0])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, loss_weights=loss_weights)
        return model

    x = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    a, b = np.ones((8, 3), "float32"), np.full((8, 2), -1.0, "float32")
    y = a if isinstance(loss, str) else {"a": a, "b": b} if isinstance(loss, dict) else [a, b]
    stepped, fitted = compiled(), compiled()
    step_loss = float(tf.function(keras_train_step(stepped)[0], autograph=False)(x, y))
    fit_loss = float(np.ravel(fitted.train_on_batch(x, y))[0])  # several outputs: the total first
    assert step_loss == pytest.approx(fit_loss, rel=1e-5)
    for got, want in zip(stepped.weights, fitted.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def _two_output_model(kind: str, loss):
    """Outputs "a" (3 wide) and "b" (2 wide) of one hidden layer: a functional model returning a dict, or a
    subclassed one (no symbolic outputs) returning a tuple or a dict, compiled with ``loss``."""
    import keras

    keras.utils.set_random_seed(0)
    if kind == "functional dict":
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(4, name="fc")(inputs)
        model = keras.Model(inputs, {"a": keras.layers.Dense(3, name="a")(hidden),
                                     "b": keras.layers.Dense(2, name="b")(hidden)})
    else:
        class TwoHeads(keras.Model):
            def __init__(self):
                super().__init__()
                self.fc, self.a, self.b = (keras.layers.Dense(4), keras.layers.Dense(3), keras.layers.Dense(2))

            def call(self, x):
                hidden = self.fc(x)
                return {"a": self.a(hidden), "b": self.b(hidden)} if kind == "subclassed dict" else \
                    (self.a(hidden), self.b(hidden))

        model = TwoHeads()
        model(np.zeros((1, 6), "float32"))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    return model


@pytest.mark.parametrize("kind, loss", [("functional dict", "mse"), ("subclassed tuple", ["mse", "mae"]),
                                        ("subclassed tuple", "mae"), ("subclassed dict", {"a": "mse", "b": "mae"})])
def test_keras_step__several_outputs_of_any_model_compiled_with_one_loss_or_a_loss_each_step_as_fit_does(kind, loss):
    """One loss compiled for several outputs is each output's, as fit applies it (a dict of outputs compiled
    with "mse" failed to import: the loss got the whole dict); a subclassed model, which has no symbolic
    outputs, compiled with a loss per output was refused as having "no known output shape"."""
    import tensorflow as tf

    from graphs.tf.importer import keras_train_step

    x = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    a, b = np.ones((8, 3), "float32"), np.full((8, 2), -1.0, "float32")
    y = (a, b) if kind == "subclassed tuple" else {"a": a, "b": b}
    stepped, fitted = _two_output_model(kind, loss), _two_output_model(kind, loss)
    step_loss = float(tf.function(keras_train_step(stepped)[0], autograph=False)(x, y))
    fit_loss = float(np.ravel(fitted.train_on_batch(x, y))[0])
    assert step_loss == pytest.approx(fit_loss, rel=1e-5)
    for got, want in zip(stepped.weights, fitted.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_keras_step__a_masked_two_output_models_loss_is_fits():
    """Several outputs' losses were each a plain function's mean: an Embedding's mask (``mask_zero``) was
    ignored, so the step's loss was not fit's (1.411 against 1.436 here). Each is now a Keras Loss, masked."""
    import keras
    import tensorflow as tf

    from graphs.tf.importer import keras_train_step

    def compiled():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5,), dtype="int32")
        hidden = keras.layers.Embedding(10, 4, mask_zero=True, name="emb")(inputs)
        model = keras.Model(inputs, [keras.layers.Dense(3, name="a")(hidden), keras.layers.Dense(2, name="b")(hidden)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=["mse", "mae"])
        return model

    x = np.array([[1, 2, 0, 0, 0], [3, 4, 5, 0, 0], [1, 1, 1, 1, 1], [2, 0, 0, 0, 0]], "int32")
    rng = np.random.default_rng(1)
    y = [rng.standard_normal((4, 5, 3)).astype("float32"), rng.standard_normal((4, 5, 2)).astype("float32")]
    stepped, fitted = compiled(), compiled()
    step_loss = float(tf.function(keras_train_step(stepped)[0], autograph=False)(x, y))
    fit_loss = float(np.ravel(fitted.train_on_batch(x, y))[0])
    assert step_loss == pytest.approx(fit_loss, rel=1e-5)


@pytest.mark.parametrize("loss_weights", [None, [0.5, 2.0]])
def test_keras_step__a_two_output_models_loss_ops_are_scoped_by_their_losses_as_a_single_outputs(loss_weights):
    """A single output's loss ops are in its scope ("mse"); those of a model compiled with a loss per output were
    bare TF ops of scope "", in no group of their own, beside the optimizer's bare step counter."""
    import keras

    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    with fresh_keras_names():
        inputs = keras.Input((6,))
        model = keras.Model(inputs, [keras.layers.Dense(3, name="a")(inputs), keras.layers.Dense(2, name="b")(inputs)],
                            name="two")
        model.compile(optimizer="sgd", loss=["mse", "mae"], loss_weights=loss_weights)
        graph = trace_keras_training_step(model, np.zeros((4, 6), "float32"),
                                          [np.ones((4, 3), "float32"), np.ones((4, 2), "float32")], name="two")
    work = [i for i in range(graph.num_ops) if graph.phases[i] in (PHASE_CODE["forward"], PHASE_CODE["backward"])]
    assert {graph.scopes[i] for i in work} == {"a", "b", "mse", "mae", "loss"}
    (total,) = _ops(graph, "AddN", phase="forward")
    assert graph.scopes[total] == "loss"
    assert not _ops(graph, "Mul", scope="", phase="forward")  # the weights' products are the loss's too


@pytest.mark.parametrize("loss_weights", [1.0, [1.0, 1.0]])
def test_keras_step__loss_weights_of_one_import_as_none(loss_weights):
    """Weights of 1 change nothing fit computes: the step (and its hash) is the unweighted model's."""
    import keras

    from graphs.tf.importer import fresh_keras_names, trace_keras_training_step

    def traced(weights):
        with fresh_keras_names():
            inputs = keras.Input((6,))
            outputs = [keras.layers.Dense(3, name="a")(inputs), keras.layers.Dense(3, name="b")(inputs)]
            model = keras.Model(inputs, outputs if isinstance(loss_weights, list) else outputs[0], name="m")
            losses = ["mse", "mse"] if isinstance(loss_weights, list) else keras.losses.MeanSquaredError()
            model.compile(optimizer="sgd", loss=losses, loss_weights=weights)
            targets = [np.ones((4, 3), "float32")] * 2 if isinstance(loss_weights, list) else np.ones((4, 3), "float32")
            return trace_keras_training_step(model, np.zeros((4, 6), "float32"), targets, name="m")

    assert traced(loss_weights).content_hash == traced(None).content_hash


@pytest.mark.parametrize("loss", ["mse", "sparse_categorical_crossentropy", "compiled function"])
def test_keras_step__a_loss_compiled_by_name_or_as_a_function_steps_as_fit_does(loss):
    """``compile(loss="mse")`` (or a plain function) gives per-example losses that Keras averages over the
    batch; the traced step took the gradient of their sum, 8x fit's here, which SGD applies as it is."""
    import keras
    import tensorflow as tf

    from graphs.tf.importer import keras_train_step

    def compiled():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, name="fc")])
        by_name = keras.losses.mean_squared_error if loss == "compiled function" else loss
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=by_name)
        return model

    x = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    y = (np.arange(8) % 3).astype("int32") if loss.startswith("sparse") else np.ones((8, 3), "float32")
    stepped, fitted = compiled(), compiled()
    step_loss = float(tf.function(keras_train_step(stepped)[0], autograph=False)(x, y))
    fit_loss = float(fitted.train_on_batch(x, y))
    assert step_loss == pytest.approx(fit_loss, rel=1e-5)
    for got, want in zip(stepped.weights, fitted.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_import_keras_spec__an_unnamed_model_takes_its_builder_functions_name(tmp_path):
    """Keras names every unnamed functional model "functional": their run folders could not be told apart."""
    module = tmp_path / "unnamed.py"
    module.write_text(
        "import keras\n"
        "def two_layers():\n"
        "    inputs = keras.Input((4,))\n"
        "    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(3)(inputs)))\n"
        "    model.compile(optimizer='sgd', loss='mse')\n"
        "    return model\n")
    from graphs.tf.importer import import_keras_spec

    assert import_keras_spec(f"{module}:two_layers").name == "two_layers"
    assert import_keras_spec(f"{module}:two_layers", name="given").name == "given"


def test_import_tf_function__a_tapes_backward_reads_the_forward_functions_input_through_an_edge():
    """A nested tf.function under a GradientTape runs as a forward function that hands its input straight
    back for the backward (as Keras's grouped Conv2D does): that output named the placeholder the import
    replaced, so the weight gradient read x with no edge from x (no transfer, x freed after the forward)."""
    import tensorflow as tf

    from graphs.tf.importer import import_tf_function

    weight = tf.Variable(tf.ones((3, 3)))

    @tf.function
    def inner(x):
        return tf.matmul(x, weight)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(inner(x))
        weight.assign_sub(0.1 * tape.gradient(loss, weight))

    graph = import_tf_function(step.get_concrete_function(tf.TensorSpec((4, 3))), name="pass-through",
                               batch_size=4, drop_dead_ops=True)
    names = list(graph.op_names)
    x, gradient = names.index("x"), names.index("PartitionedCall/gradients/MatMul_grad/MatMul_1")
    edges = {(int(s), int(d)): int(b) for s, d, b in zip(graph.edge_src, graph.edge_dst, graph.edge_bytes)}
    assert edges.get((x, gradient)) == 4 * 3 * 4
