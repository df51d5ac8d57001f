"""TensorFlow importer: a ``tf.function`` training step or a Keras model into an OpGraph.

- ``import_tf_function(concrete_function)``: any concrete function (its graph is the training step).
- ``trace_keras_training_step(model, inputs, targets)``: builds the step (forward, loss, GradientTape
  gradients, ``optimizer.apply_gradients``) as one tf.function and imports it, with Keras layer names
  as scopes.
- ``import_keras_spec("pkg.mod:fn" | "path/file.py:fn" | "model.keras")``: what the command line uses.

How ops, variables, phases and colocation are derived: see ``graphs.tf.assemble`` and
``graphs.tf.flatten``. TensorFlow and Keras are imported inside the functions only.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph

KERAS_FILE_SUFFIXES = (".keras", ".h5")


def import_tf_function(concrete_function, name: str = "tf_function", batch_size: int | None = None, *,
                       scope_map: dict[str, str] | None = None, source: str = "",
                       optimizer_variables=()) -> OpGraph:
    """OpGraph of a concrete ``tf.function`` (a whole training step: forward, gradients, updates).

    ``batch_size`` fills unknown leading dims (default: the first argument's static batch, else 1).
    ``scope_map`` maps a TF name-scope prefix (e.g. "net_1/fc1_1") to a dotted scope (e.g. "fc1").
    ``optimizer_variables``: the optimizer's variables, so that writes to its step counter count as
    updates even when no update reads it (found structurally otherwise)."""
    from graphs.tf.assemble import build_opgraph
    from graphs.tf.flatten import flatten_graph

    graph = concrete_function.graph
    batch = batch_size or _static_batch(graph) or 1
    flat = flatten_graph(graph, batch)
    return build_opgraph(flat, concrete_function, name=name, batch_size=batch, scope_map=scope_map or {},
                         source=source or f"tf.function {graph.name}", optimizer_variables=optimizer_variables)


def trace_keras_training_step(model, example_inputs, example_targets, loss=None, optimizer=None,
                              name: str = "keras", batch_size: int | None = None) -> OpGraph:
    """Trace one training step of a Keras model and import it.

    ``example_inputs``/``example_targets``: arrays, tensors or ``tf.TensorSpec``s (only shape and dtype
    are used; an unknown leading dim becomes ``batch_size``). ``loss``: a callable ``(y_true, y_pred)``,
    a Keras loss or its name; default the model's compiled loss, else mean squared error.
    ``optimizer``: default the model's compiled optimizer, else Adam."""
    import tensorflow as tf

    batch = batch_size or leading_dim(example_inputs) or 1
    train_step, optimizer = keras_train_step(model, loss, optimizer)
    specs = [tf.nest.map_structure(lambda x: tensor_spec_of(x, batch), example) for example in
             (example_inputs, example_targets)]
    with _recorded_keras_scopes(model.name) as scope_map:
        concrete = tf.function(train_step, autograph=False).get_concrete_function(*specs)
    return import_tf_function(concrete, name=name, batch_size=batch, scope_map=scope_map,
                              source=f"keras {model.name} + {type(optimizer).__name__}",
                              optimizer_variables=optimizer.variables)


def keras_train_step(model, loss=None, optimizer=None):
    """``(train_step(inputs, targets) -> loss, optimizer)``: forward, loss, tape gradients and the
    optimizer's update, as a plain Python function to wrap in ``tf.function``."""
    import keras
    import tensorflow as tf

    loss_fn = _loss_callable(loss, model)
    optimizer = keras.optimizers.get(optimizer or getattr(model, "optimizer", None) or "adam")
    variables = model.trainable_variables
    if not optimizer.built:
        optimizer.build(variables)

    def train_step(inputs, targets):
        with tf.GradientTape() as tape:
            predictions = model(inputs, training=True)
            value = loss_fn(targets, predictions)
        gradients = tape.gradient(value, variables)
        optimizer.apply_gradients(zip(gradients, variables))
        return value

    return train_step, optimizer


def import_keras_spec(spec: str, batch_size: int | None = None, name: str | None = None) -> OpGraph:
    """Import "MODULE:FUNCTION", "path/to/file.py:FUNCTION" (the function returns ``(model, inputs,
    targets)`` or ``(model, inputs, targets, loss)``) or a saved ``.keras`` model file."""
    if spec.endswith(KERAS_FILE_SUFFIXES):
        model, inputs, targets, loss = _load_saved_model(spec, batch_size or 1)
    else:
        model, inputs, targets, loss = call_builder(spec)
    try:
        graph = trace_keras_training_step(model, inputs, targets, loss=loss, name=name or model.name,
                                          batch_size=batch_size)
        graph.meta["keras_spec"] = spec  # lets the real TensorFlow measurer rebuild the step
        return graph
    except PlacerError:
        raise
    except Exception as err:  # noqa: BLE001  (any tracing failure is bad input, reported as one line)
        raise PlacerError(f"tracing the training step of {spec!r} failed: {type(err).__name__}: {err}") from None


def call_builder(spec: str):
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise PlacerError(f"bad Keras spec {spec!r}: expected MODULE:FUNCTION, FILE.py:FUNCTION or FILE.keras")
    from graphs.specs import call_spec

    result = call_spec(spec, "keras")
    if not isinstance(result, tuple) or len(result) not in (3, 4):
        raise PlacerError(f"{spec!r} must return (model, inputs, targets) or (model, inputs, targets, loss)")
    return (*result, None) if len(result) == 3 else result


def _load_saved_model(path: str, batch_size: int):
    import keras
    import tensorflow as tf

    if not Path(path).is_file():
        raise PlacerError(f"Keras model file {path!r} does not exist")
    try:
        model = keras.models.load_model(path, compile=True)
    except Exception as err:  # noqa: BLE001
        raise PlacerError(f"cannot load Keras model {path!r}: {type(err).__name__}: {err}") from None

    def specs(tensors):
        return [tf.TensorSpec([batch_size, *t.shape[1:]], t.dtype) for t in tensors]

    inputs, targets = specs(model.inputs), specs(model.outputs)
    unwrap = (lambda xs: xs[0] if len(xs) == 1 else xs)
    return model, unwrap(inputs), unwrap(targets), getattr(model, "loss", None)


def _loss_callable(loss, model):
    import keras

    loss = loss if loss is not None else getattr(model, "loss", None)
    if loss is None:
        return keras.losses.MeanSquaredError()
    if isinstance(loss, str):
        try:
            return keras.losses.get(loss)
        except ValueError as err:
            raise PlacerError(f"unknown Keras loss {loss!r}: {err}") from None
    if not callable(loss):
        raise PlacerError(f"loss must be callable or a Keras loss name, got {type(loss).__name__}")
    return loss


def tensor_spec_of(example, batch_size: int):
    import tensorflow as tf

    shape = list(example.shape)
    if shape and shape[0] is None:
        shape[0] = batch_size
    return tf.TensorSpec(shape, tf.as_dtype(example.dtype))


def leading_dim(example) -> int:
    import tensorflow as tf

    first = tf.nest.flatten(example)[0]
    return int(first.shape[0]) if len(first.shape) and first.shape[0] is not None else 0


def _static_batch(graph) -> int:
    for t in graph.inputs:
        if t.dtype.name != "resource" and t.shape.rank and t.shape[0] is not None:
            return int(t.shape[0])
    return 0


@contextmanager
def _recorded_keras_scopes(root_name: str):
    """Record which TF name scope each Keras layer call opened, as {"net_1/fc1_1": "fc1"}.

    TensorFlow makes scope names unique ("fc1" becomes "fc1_1" on a layer's second scope, and a layer
    named "fc1_1" then gets "fc1_1_1"), so layer names cannot be recovered from op names alone. Keras's
    TF-backend ``name_scope`` is wrapped while tracing; without it, scopes fall back to raw TF names."""
    import tensorflow as tf

    scope_map: dict[str, str] = {}
    try:
        from keras.src.backend.common import global_state
        from keras.src.backend.tensorflow import core
    except ImportError:
        yield scope_map
        return
    original = core.name_scope.__enter__

    def enter(self):
        result = original(self)
        if getattr(self, "_pop_on_exit", False):
            path = [s.name for s in global_state.get_global_attribute("name_scope_stack", default=[])]
            if path and path[0] == root_name:
                path = path[1:]
            scope_map[tf.compat.v1.get_default_graph().get_name_scope()] = ".".join(path)
        return result

    core.name_scope.__enter__ = enter
    try:
        yield scope_map
    finally:
        core.name_scope.__enter__ = original
