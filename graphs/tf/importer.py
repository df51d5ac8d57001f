"""TensorFlow importer: a ``tf.function`` training step or a Keras model into an OpGraph.

- ``import_tf_function(concrete_function)``: any concrete function (its graph is the training step).
- ``trace_keras_training_step(model, inputs, targets)``: builds the step (forward, loss, GradientTape
  gradients, ``optimizer.apply_gradients``) as one tf.function and imports it, with Keras layer names
  as scopes, without the ops TensorFlow never runs (``graphs.tf.flatten``: the input data's gradient).
  Keras's recurrent layers built with ``unroll=False`` are traced unrolled where their time dimension is
  static (``graphs.tf.recurrent``), as the model built with ``unroll=True``: ``meta["unrolled_layers"]``.
- ``import_keras_spec("pkg.mod:fn" | "path/file.py:fn" | "model.keras")``: what the command line uses. The
  function returns a compiled ``keras.Model`` alone (inputs and targets are made up from its input spec,
  output shapes and compiled loss, see ``bare_model_example``) or ``(model, inputs, targets[, loss])``.
  Keras names what it makes unnamed ("adam", "dense_1") as in a fresh process (``fresh_keras_names``,
  past the names of the layers the function reaches before it runs, such as a module spec's module-level
  layer: ``names_past_reachable_layers``), so the same model gives the same graph and hash whatever the
  process built before, and the function is called once. Only a layer made before and reached otherwise
  (a cache in another module) that then shares a model and a name with a new one makes it run again,
  named by the process's counters, as Keras would.

How ops, variables, phases and colocation are derived: see ``graphs.tf.assemble`` and
``graphs.tf.flatten``. TensorFlow and Keras are imported inside the functions only.
"""

from __future__ import annotations

import math
import re
import zipfile
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphs.errors import PlacerError, one_line
from graphs.files import file_problem
from graphs.opgraph import LAYER_SCOPES, OpGraph
from graphs.specs import absolute_spec
from graphs.tf.assemble import VariableLabel, build_opgraph
from graphs.tf.flatten import LoopShapeError
from graphs.tf.recurrent import RecurrentUnrolling, unrolled_recurrent_layers

KERAS_FILE_SUFFIXES = (".keras", ".h5")
DEFAULT_BATCH_SIZE = 32  # examples per step of a bare model (a function returning one, or a saved file)
MAX_MADE_UP_VALUES = 2**31  # one made-up input or target: 8-16 GiB
EXAMPLE_SEED = 0  # made-up inputs and targets of a bare model are the same on every import and rebuild
UIDS_ATTRIBUTE = "object_name_uids"  # Keras's global state: {name prefix: objects named with it so far}
KERAS_NAME_CLASH = "All operation names should be unique"  # Keras's error: two layers of one model named alike
MAX_REACH_DEPTH = 4  # how deep into containers of a function's globals its layers are looked for
OWN_TRAIN_STEP = "own_train_step"  # meta key: the model's own train_step, which the imported step is not
SUMMED_LOSS_SCOPE = "loss"  # the name scope of the weighing and the sum of several outputs' losses

# The targets a compiled loss takes, by the name of its Keras loss function: "class_ids" (int32, the output
# shape without its last (class) axis), "one_hot" (float, the output shape), "binary" (0/1 floats, the
# output shape) or "regression" (floats in [0, 1), the output shape).
TARGET_KIND_OF_LOSS = {
    "sparse_categorical_crossentropy": "class_ids",
    **dict.fromkeys(("categorical_crossentropy", "categorical_focal_crossentropy", "categorical_hinge",
                     "kl_divergence"), "one_hot"),
    **dict.fromkeys(("binary_crossentropy", "binary_focal_crossentropy", "hinge", "squared_hinge", "dice",
                     "tversky"), "binary"),
    **dict.fromkeys(("mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
                     "mean_squared_logarithmic_error", "huber", "log_cosh", "cosine_similarity", "poisson"),
                    "regression"),
}


def import_tf_function(concrete_function, name: str = "tf_function", batch_size: int | None = None, *,
                       scope_map: dict[str, str] | None = None, source: str = "",
                       optimizer_variables=(), drop_dead_ops: bool = False,
                       variable_labels: dict[int, VariableLabel] | None = None) -> OpGraph:
    """OpGraph of a concrete ``tf.function`` (a whole training step: forward, gradients, updates).

    ``batch_size`` fills unknown leading dims (default: the first argument's static batch, else 1).
    ``scope_map`` maps a TF name-scope prefix (e.g. "net_1/fc1_1") to a dotted scope (e.g. "fc1").
    ``optimizer_variables``: the optimizer's variables, so that writes to its step counter count as
    updates even when no update reads it (found structurally otherwise). ``drop_dead_ops``: leave out the
    ops TensorFlow never runs, as nothing the step needs reads them (``graphs.tf.flatten``); Keras steps
    do, a plain function's graph keeps every op unless asked. ``variable_labels``: the name and scope of
    variables a Keras layer owns (``keras_variable_labels``). An op inside control flow is named by the
    branch or loop part it is in (``cond/then/...``), not by TensorFlow's per-process function name
    (``flatten_graph``'s ``stable_names``), so the same step gets the same hash in any process."""
    from graphs.tf.flatten import flatten_graph

    graph = concrete_function.graph
    batch = batch_size or _static_batch(graph) or 1
    flat = flatten_graph(graph, batch, drop_dead=drop_dead_ops, stable_names=True)
    return build_opgraph(flat, concrete_function, name=name, batch_size=batch, scope_map=scope_map or {},
                         source=source or f"tf.function {graph.name}", optimizer_variables=optimizer_variables,
                         variable_labels=variable_labels)


def keras_variable_labels(model, layer_calls: dict[int, str]) -> dict[int, VariableLabel]:
    """{id of a tf.Variable's handle: VariableLabel} for every variable a layer of ``model`` (the model
    included) owns itself (its weights, BatchNormalization's statistics; not a Dropout's seed state, a counter
    that should not decide where the layer goes): named by Keras's path of it, scoped by the dotted path of
    the owner's first call (``layer_calls``: {id of the layer: that path}; None where it was not called).
    TensorFlow's names do not say the layer: a subclassed model builds its layers in its own first call, so
    their variables are "net/kernel", "net/kernel_1"; a model nested in a functional one has its layers'
    variables named without it ("dense/kernel" for the layer called as "inner.dense"). A variable two layers
    hold is the first one's, in Keras's layer order."""
    labels: dict[int, VariableLabel] = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        owned = [*getattr(layer, "_trainable_variables", ()), *getattr(layer, "_non_trainable_variables", ())]
        for variable in owned:
            handle = _tf_handle(variable)
            if handle is not None and id(handle) not in labels:
                labels[id(handle)] = VariableLabel(variable.path, layer_calls.get(id(layer)))
    return labels


def _tf_handle(variable):
    """The resource handle of the tf.Variable behind a Keras variable (its ``value``), or None."""
    inner = getattr(variable, "value", None)
    return getattr(inner if hasattr(inner, "handle") else variable, "handle", None)


def trace_keras_training_step(model, example_inputs, example_targets, loss=None, optimizer=None,
                              name: str = "keras", batch_size: int | None = None) -> OpGraph:
    """Trace one training step of a Keras model and import it.

    ``example_inputs``/``example_targets``: arrays, tensors or ``tf.TensorSpec``s (only shape and dtype
    are used; an unknown leading dim becomes ``batch_size``). ``loss``: a callable ``(y_true, y_pred)``,
    a Keras loss or its name; default the model's compiled loss, else mean squared error.
    ``optimizer``: default the model's compiled optimizer, else Adam; one the model was not compiled with
    is wrapped in a LossScaleOptimizer for a "mixed_float16" model, as ``compile`` would.

    ``meta["layer_scopes"]`` (``LAYER_SCOPES``): the dotted scopes a layer's call opened, sorted (not the
    optimizer's, the loss's, or a TF op's outside any layer), so that a module map lists layers only; absent
    where Keras's name scopes could not be recorded.
    ``meta["own_train_step"]`` (``OWN_TRAIN_STEP``): the ``train_step`` the model's class overrides, which the
    step traced here is not (``own_train_step``); absent for Keras's own.
    ``meta["unrolled_layers"]``: the scopes of the recurrent layers built with ``unroll=False`` that were traced
    unrolled (absent when none). A loop the step keeps that cannot be imported or has no static trip count,
    where a layer was left rolled (its time dimension unknown, or not one of Keras's own), is one PlacerError
    naming the layers left rolled and why."""
    import tensorflow as tf

    batch = batch_size or leading_dim(example_inputs) or 1
    specs = [tf.nest.map_structure(lambda x: tensor_spec_of(x, batch), example) for example in
             (example_inputs, example_targets)]
    build_on(model, specs[0])
    unrolling = RecurrentUnrolling()
    train_step, optimizer = keras_train_step(model, loss, optimizer, unrolling=unrolling)
    with _recorded_keras_scopes(model.name) as recorded:
        concrete = tf.function(train_step, autograph=False).get_concrete_function(*specs)
    try:
        graph = import_tf_function(concrete, name=name, batch_size=batch, scope_map=recorded.scope_map,
                                   source=f"keras {model.name} + {type(optimizer).__name__}",
                                   optimizer_variables=optimizer.variables, drop_dead_ops=True,
                                   variable_labels=keras_variable_labels(model, recorded.layer_calls))
    except LoopShapeError as error:
        if not unrolling.left_rolled:
            raise
        raise PlacerError(f"{error}; the importer unrolls Keras's recurrent layers but left these rolled: "
                          f"{unrolling.rolled_reasons()}") from None
    if unrolling.left_rolled and graph.meta.get("loops_counted_once"):
        raise PlacerError(f"{graph.meta['loops_counted_once']} while loop(s) without a static trip count would count "
                          "their body once: the importer unrolls Keras's recurrent layers but left these rolled: "
                          f"{unrolling.rolled_reasons()}")
    if unrolling.unrolled:
        graph.meta["unrolled_layers"] = list(unrolling.unrolled)
    if recorded.layers is not None:
        graph.meta[LAYER_SCOPES] = sorted(recorded.layers)
    if own := own_train_step(model):
        graph.meta[OWN_TRAIN_STEP] = own
    return graph


def own_train_step(model) -> str:
    """The qualified name of the ``train_step`` the model's class defines itself ("GAN.train_step"), or "" for
    Keras's own. The importer does not trace it: its step is forward, the loss, tape gradients and the
    optimizer's update (``keras_train_step``), which the tf measurer and ``apply_keras`` run too."""
    method = getattr(type(model), "train_step", None)
    if method is None or getattr(method, "__module__", "").split(".")[0] == "keras":
        return ""
    return getattr(method, "__qualname__", "train_step")


def build_on(model, input_specs) -> None:
    """Create the weights of a model not called yet (a subclassed one makes them on its first call): run
    it once, eagerly, on zeros of the inputs' shapes. The training step needs them before it is traced."""
    import tensorflow as tf

    if model.built and model.trainable_variables:
        return
    model(tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), input_specs))
    if any(not layer.built for layer in model._flatten_layers(include_self=False)):
        # The eager call ran one branch of a tf.cond on the data: the other branch's layers make their weights
        # in a traced call, which takes both. Made later, inside the traced step, they were left out of the
        # gradients and the optimizer's update (the import was the step of a model without them).
        tf.function(model).get_concrete_function(input_specs)


def keras_train_step(model, loss=None, optimizer=None, unrolling: RecurrentUnrolling | None = None):
    """``(train_step(inputs, targets) -> loss, optimizer)``: forward, loss (with the losses the layers add:
    ``with_added_losses``), tape gradients and the optimizer's update, as a plain Python function to wrap in
    ``tf.function``. The gradients are of the
    loss the optimizer scales (``scale_loss``), as in ``Model.fit``: a mixed-precision model's
    LossScaleOptimizer multiplies it by its dynamic scale and divides the gradients by it.

    The forward runs Keras's recurrent layers unrolled where their time dimension is static
    (``graphs.tf.recurrent``), so the importer and the TensorFlow measurer, which both trace this step,
    see every time step's ops; ``unrolling``, when given, records which layers were and which were not."""
    import keras
    import tensorflow as tf

    loss_fn = _loss_callable(loss, model)
    compiled = getattr(model, "optimizer", None)
    with fresh_keras_names():  # a new optimizer is "adam", not "adam_3" after three others in this process
        optimizer = keras.optimizers.get(optimizer or compiled or "adam")
        if optimizer is not compiled:
            optimizer = loss_scaled_as_compile_would(model, optimizer)
    variables = model.trainable_variables
    if not variables:
        raise PlacerError(f"Keras model {model.name!r} has no trainable variables: there is no training step "
                          "to trace")
    if not optimizer.built:
        optimizer.build(variables)

    def train_step(inputs, targets):
        with tf.GradientTape() as tape:
            with unrolled_recurrent_layers(model.name, unrolling):
                predictions = model(inputs, training=True)
            value = with_added_losses(_scalar_loss(loss_fn(targets, predictions), model), model)
            scaled = optimizer.scale_loss(value)  # as Keras's own step: a LossScaleOptimizer unscales gradients
        gradients = tape.gradient(scaled, variables)
        optimizer.apply_gradients(zip(gradients, variables))
        return value

    return train_step, optimizer


def _scalar_loss(value, model):
    """The loss, refused unless it is one number: a loss function returned with the model that gives one per
    example was summed by the gradient tape without a word, and the step's loss was not the one meant."""
    shape = getattr(value, "shape", None)
    if shape is not None and shape.rank is not None and shape.rank > 0 and shape.num_elements() != 1:
        raise PlacerError(f"the loss of Keras model {model.name!r} has shape {list(shape)}, not one number: "
                          "return it reduced over the batch (its mean, as compile reduces a loss, or its sum)")
    return value


def with_added_losses(value, model):
    """``value`` plus the losses the model's layers add (weight regularizers such as ``kernel_regularizer="l2"``,
    ``add_loss``), each summed, as ``Model.compute_loss`` adds them in ``fit``; ``value`` itself where there
    are none. Read after the forward call, which is when ``add_loss`` records its losses."""
    import tensorflow as tf

    added = [tf.reduce_sum(tf.cast(loss, value.dtype)) for loss in model.losses]
    return tf.add_n([value, *added]) if added else value


def loss_scaled_as_compile_would(model, optimizer):
    """``optimizer`` wrapped in a LossScaleOptimizer when the model computes in float16 (its policy is
    "mixed_float16"), as ``Model.compile`` wraps it; an optimizer the model was compiled with is taken as
    it is (compiled with ``auto_scale_loss=False``, it is not wrapped)."""
    import keras

    policy = getattr(getattr(model, "dtype_policy", None), "name", None)
    if policy != "mixed_float16" or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(optimizer, name="loss_scale_optimizer")


def import_keras_spec(spec: str, batch_size: int | None = None, name: str | None = None) -> OpGraph:
    """Import "MODULE:FUNCTION", "path/to/file.py:FUNCTION" or a saved ``.keras`` model file.

    The function returns a compiled ``keras.Model`` (stepped on ``batch_size`` made-up examples, default
    32), ``(model, inputs, targets)`` or ``(model, inputs, targets, loss)`` (``batch_size`` then only fills
    unknown leading dims and must not contradict the inputs). See ``keras_example``."""
    try:
        with fresh_keras_names():  # the same model and step names, so the same hash, whatever ran before
            graph = _traced_keras_spec(spec, batch_size, name)
    except PlacerError as error:
        if KERAS_NAME_CLASH not in str(error):
            raise
        # The function is called a second time only here: a layer made before that it reaches other than
        # through its module's globals or closure (a cache in another module) joined its model, and a fresh
        # name given to a new layer was that layer's. Keras refuses the model inside the function (in
        # keras.Model(...)), so there is no model to rename, and which old layer joins it is not known
        # before the function runs. Name from the process's counters instead, as Keras does by itself.
        graph = _traced_keras_spec(spec, batch_size, name)
    # what lets the real TensorFlow measurer rebuild the same step: see measurers.tf.workload
    graph.meta["keras_spec"] = absolute_spec(spec)  # found from any folder
    graph.meta["keras_batch_size"] = int(graph.batch_size)
    return graph


DEFAULT_STEP = "default_step"
"""``meta`` key of a saved model file imported without ``compile()``: the loss and optimizer the step was traced
with, made up (the CLI says so in a note)."""


def _traced_keras_spec(spec: str, batch_size: int | None, name: str | None) -> OpGraph:
    model, inputs, targets, loss = keras_example(spec, batch_size)
    try:
        graph = trace_keras_training_step(model, inputs, targets, loss=loss, name=name or _graph_name(spec, model),
                                          batch_size=batch_size)
        if spec.endswith(KERAS_FILE_SUFFIXES) and not getattr(model, "compiled", False):
            graph.meta[DEFAULT_STEP] = "mean squared error against float targets shaped like its outputs, and Adam"
        return graph
    except PlacerError:
        raise
    except Exception as err:  # noqa: BLE001  (any tracing failure is bad input, reported as one line)
        raise PlacerError(f"tracing the training step of {spec!r} failed: {type(err).__name__}: "
                          f"{one_line(err, empty='')}") from None


KERAS_DEFAULT_NAME = re.compile(r"(functional|sequential|model)(_\d+)?")  # what Keras names an unnamed model


def _graph_name(spec: str, model) -> str:
    """The model's name, unless Keras made it up ("functional", "sequential_2"): then the builder function's
    name, as the torch importer names a graph (every functional model's run folders were "functional__...")."""
    if KERAS_DEFAULT_NAME.fullmatch(model.name) and not spec.endswith(KERAS_FILE_SUFFIXES):
        return spec.rpartition(":")[2]
    return model.name


def keras_example(spec: str, batch_size: int | None = None):
    """``(model, inputs, targets, loss)`` of a Keras spec in any of its forms (see ``import_keras_spec``);
    ``loss`` None means the model's compiled loss. The TensorFlow measurer rebuilds a step with it."""
    if batch_size is not None and batch_size < 1:
        raise PlacerError(f"the batch size must be at least 1, got {batch_size}")
    if spec.endswith(KERAS_FILE_SUFFIXES):
        return _saved_model_example(spec, batch_size or DEFAULT_BATCH_SIZE)
    return call_builder(spec, batch_size)


def call_builder(spec: str, batch_size: int | None = None):
    """Call the function a spec names: ``(model, inputs, targets, loss)`` from what it returns (see
    ``keras_example_from_result``)."""
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise PlacerError(f"bad Keras spec {spec!r}: expected MODULE:FUNCTION, FILE.py:FUNCTION or FILE.keras")
    from graphs.specs import call_spec

    return keras_example_from_result(call_spec(spec, "keras", around_call=names_past_reachable_layers), spec,
                                     batch_size)


def keras_example_from_result(result, spec: str, batch_size: int | None = None):
    """``(model, inputs, targets, loss)`` of what a user's Keras function returned (``spec`` names the
    function in errors): a compiled model alone gets ``batch_size`` made-up examples (default 32, see
    ``bare_model_example``); ``(model, inputs, targets[, loss])`` is taken as it is (``loss`` None: the
    compiled loss), its inputs' batch must not contradict a ``batch_size`` given."""
    import keras

    if isinstance(result, keras.Model):
        return bare_model_example(result, batch_size or DEFAULT_BATCH_SIZE, spec)
    if not isinstance(result, tuple) or len(result) not in (3, 4) or not isinstance(result[0], keras.Model):
        raise PlacerError(f"{spec!r} must return a compiled Keras model, (model, inputs, targets) or "
                          f"(model, inputs, targets, loss); it returned {type(result).__name__}")
    returned_batch = leading_dim(result[1])
    if batch_size and returned_batch and returned_batch != batch_size:
        raise PlacerError(f"batch size {batch_size} was asked for, but {spec!r} returned inputs of batch "
                          f"{returned_batch}: leave the batch size out or return a compiled model alone")
    return (*result, None) if len(result) == 3 else result


def bare_model_example(model, batch_size: int, spec: str):
    """``(model, inputs, targets, None)`` for a compiled Keras model alone: seeded inputs of ``batch_size``
    examples shaped and typed as the model's inputs, and targets of each output in the kind its compiled
    loss takes (``TARGET_KIND_OF_LOSS``), in the structure of the outputs (one array, a list or a dict).

    Float inputs are standard normal; integer and bool inputs are 0 or 1, valid indices for any Embedding
    (the TensorFlow measurer feeds the same range)."""
    import tensorflow as tf

    if not getattr(model, "compiled", False) or getattr(model, "loss", None) is None:
        raise PlacerError(f"{spec!r} returned Keras model {model.name!r}, which is not compiled with a loss: "
                          "compile it (model.compile(optimizer=..., loss=...)) or return (model, inputs, targets)")
    inputs, outputs = (_symbolic_tensors(model, which, spec) for which in ("input", "output"))
    kinds = _target_kinds(model, outputs, spec)
    rng = np.random.default_rng(EXAMPLE_SEED)
    examples = tf.nest.map_structure(lambda tensor: _example_input(tensor, batch_size, rng, spec), inputs)
    targets = [_example_target(tensor, kind, batch_size, rng, spec)
               for tensor, kind in zip(tf.nest.flatten(outputs), kinds)]
    return model, examples, tf.nest.pack_sequence_as(outputs, targets), None


def _symbolic_tensors(model, which: str, spec: str):
    """The model's symbolic inputs or outputs (``which``: "input" or "output") in the structure its call
    takes or returns: a functional model's own structure, a Sequential model's single tensor."""
    try:
        return getattr(model, which)  # a functional model (a Sequential one raises)
    except (AttributeError, ValueError):
        pass
    try:
        tensors = list(getattr(model, which + "s") or ())  # a Sequential model with a known input shape
    except (AttributeError, ValueError):
        tensors = []
    if not tensors:
        raise PlacerError(f"{spec!r}: Keras model {model.name!r} has no known {which} shape (a subclassed "
                          "model, or a Sequential one without keras.Input or build()): give it one or return "
                          "(model, inputs, targets)")
    return tensors[0] if len(tensors) == 1 else tensors


def _batched_shape(tensor, batch_size: int, spec: str, what: str) -> tuple[int, ...]:
    """The made-up tensor's shape; one that would not fit in memory (``--batch-size`` 10**13: a NumPy
    MemoryError of 291 TiB) is a PlacerError before anything is allocated."""
    dims = list(tensor.shape)
    if None in dims[1:]:
        raise PlacerError(f"{spec!r}: the model's {what} {tensor.name!r} has shape {tuple(dims)}, with an "
                          "unknown dim besides the batch: return (model, inputs, targets) of the shapes to trace")
    shape = (batch_size, *dims[1:])
    if math.prod(shape) > MAX_MADE_UP_VALUES:
        raise PlacerError(f"{spec!r}: {batch_size:,} made-up examples of the model's {what} {tensor.name!r} "
                          f"(shape {shape}) would hold more than {MAX_MADE_UP_VALUES:,} values: use a smaller "
                          "--batch-size")
    return shape


def _example_input(tensor, batch_size: int, rng: np.random.Generator, spec: str) -> np.ndarray:
    import tensorflow as tf

    shape = _batched_shape(tensor, batch_size, spec, "input")
    dtype = tf.as_dtype(tensor.dtype)
    if dtype.is_floating:
        return rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
    if dtype.is_integer or dtype.is_bool:
        return rng.integers(0, 2, shape).astype(dtype.as_numpy_dtype)
    raise PlacerError(f"{spec!r}: cannot make up {dtype.name} values for the model's input {tensor.name!r}: "
                      "return (model, inputs, targets)")


def _example_target(output, kind: str, batch_size: int, rng: np.random.Generator, spec: str) -> np.ndarray:
    shape = _batched_shape(output, batch_size, spec, "output")
    if kind in ("class_ids", "one_hot"):
        if len(shape) < 2:
            raise PlacerError(f"{spec!r}: the model's output {output.name!r} of shape {tuple(output.shape)} "
                              "has no class axis for its categorical loss: return (model, inputs, targets)")
        class_ids = rng.integers(0, shape[-1], shape[:-1])
        if kind == "class_ids":
            return class_ids.astype(np.int32)
        return np.eye(shape[-1], dtype=np.float32)[class_ids]
    if kind == "binary":
        return rng.integers(0, 2, shape).astype(np.float32)
    return rng.random(shape, dtype=np.float32)  # [0, 1): valid for log and ratio losses (msle, poisson, mape)


def _target_kinds(model, outputs, spec: str) -> list[str]:
    """The kind of targets of each output (in ``tf.nest.flatten`` order), from its compiled loss; an
    output that has no loss (a dict loss that leaves it out) gets regression targets it does not use."""
    names = _output_names(model, outputs)
    kinds = []
    for name, loss in zip(names, _output_losses(model.loss, model, outputs)):
        kind = "regression" if loss is None else TARGET_KIND_OF_LOSS.get(_loss_name(loss))
        if kind is None:
            of_output = f" of output {name!r}" if len(names) > 1 else ""
            raise PlacerError(f"{spec!r}: cannot tell what targets the loss {_loss_name(loss)!r}{of_output} "
                              "takes: return (model, inputs, targets) from the function instead")
        kinds.append(kind)
    return kinds


def _output_names(model, outputs) -> list[str]:
    """Names of the outputs in ``tf.nest.flatten`` order (which sorts a dict's keys)."""
    import tensorflow as tf

    if isinstance(outputs, dict):
        return sorted(outputs)
    count = len(tf.nest.flatten(outputs))
    names = list(getattr(model, "output_names", None) or ())
    return names if len(names) == count else [f"output {i}" for i in range(count)]


def _output_losses(losses, model, outputs, what: str = "losses") -> list:
    """One loss (or loss weight: ``what``) per output (``tf.nest.flatten`` order) from a loss as ``compile``
    takes it: one for all, a list in output order, or a dict by output name (an output it leaves out gets None)."""
    names = _output_names(model, outputs)
    if isinstance(losses, dict):
        unknown = sorted(set(losses) - set(names))
        if unknown:
            raise PlacerError(f"Keras model {model.name!r} has no outputs {unknown} that its {what} name "
                              f"(its outputs: {names})")
        return [losses.get(name) for name in names]
    if isinstance(losses, (list, tuple)):
        if len(losses) != len(names):
            raise PlacerError(f"Keras model {model.name!r} has {len(names)} outputs but {len(losses)} {what}")
        return list(losses)
    return [losses] * len(names)


def _loss_name(loss) -> str:
    """The Keras loss function's name: "mse" and keras.losses.MeanSquaredError() both give
    "mean_squared_error"; a custom loss gives its own name."""
    import keras

    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return loss
    loss = getattr(loss, "fn", loss)  # a built-in Loss object wraps its loss function
    return getattr(loss, "__name__", type(loss).__name__)


def _saved_model_example(path: str, batch_size: int):
    """A saved model compiled with losses whose targets are known is a bare model (``bare_model_example``);
    any other (uncompiled, or a custom loss) gets float targets shaped like its outputs, trained with its
    own loss or else mean squared error (see ``_loss_callable``)."""
    import tensorflow as tf

    model = _load_saved_model(path)
    if _compiled_with_known_losses(model, path):
        return bare_model_example(model, batch_size, path)

    def batched(tensor):
        return tf.TensorSpec(_batched_shape(tensor, batch_size, path, "tensor"), tensor.dtype)

    inputs, outputs = (_symbolic_tensors(model, which, path) for which in ("input", "output"))
    return model, tf.nest.map_structure(batched, inputs), tf.nest.map_structure(batched, outputs), None


def _compiled_with_known_losses(model, spec: str) -> bool:
    loss = getattr(model, "loss", None)
    if not getattr(model, "compiled", False) or loss is None:
        return False
    losses = _output_losses(loss, model, _symbolic_tensors(model, "output", spec))
    return all(one is None or _loss_name(one) in TARGET_KIND_OF_LOSS for one in losses)


def saved_model_problem(path: str) -> str:
    """Why a saved model's path is no Keras file ("does not exist", "is not a .keras archive", ...), or "".
    Keras says "File not found" of a .keras file that is there but not the zip archive it should be."""
    if problem := file_problem(Path(path)):
        return problem
    if path.endswith(".keras") and not zipfile.is_zipfile(path):
        return "is not a .keras archive (not a zip file)"
    return ""


def _load_saved_model(path: str):
    import keras

    if problem := saved_model_problem(path):
        raise PlacerError(f"Keras model file {path!r} {problem}")
    try:
        return keras.models.load_model(path, compile=True)
    except Exception as err:  # noqa: BLE001
        raise PlacerError(f"cannot load Keras model {path!r}: {_load_problem(err)}") from None


_UNKNOWN_OBJECT = re.compile(r"Could not locate (class|function) '([^']+)'")
_OBJECT_MODULE = re.compile(r"Full object config: \{'module': '([^']+)'")


def _load_problem(err: Exception) -> str:
    """Why Keras could not load a saved model, in one line: a class or function it could not find is named
    (Keras's message held the whole model's config, thousands of characters, around it)."""
    unknown = _UNKNOWN_OBJECT.search(str(err))
    if unknown is None:
        return one_line(f"{type(err).__name__}: {err}")
    kind, name = unknown.groups()
    module = _OBJECT_MODULE.search(str(err), unknown.end())
    where = f" of module {module.group(1)!r}" if module else ""
    return (f"its {kind} {name!r}{where} is not registered with Keras: decorate it with "
            "@keras.saving.register_keras_serializable(), or import with --keras FILE.py:FUNCTION, a function "
            f"that returns keras.models.load_model(PATH, custom_objects={{{name!r}: {name}}})")


def _loss_callable(loss, model):
    """The step's loss: ``loss``, else the model's compiled loss, else mean squared error. A loss by name, or a
    plain function the model was compiled with, is reduced as ``compile`` reduces it (``_batch_mean``)."""
    import keras

    compiled = loss is None
    loss = loss if loss is not None else getattr(model, "loss", None)
    if loss is None:  # as compile("mse") would apply it: to each output of several, summed (the one loss
        # taken on all outputs stacked them, and failed on outputs of other shapes or a dict of them)
        return _each_output_when_several(keras.losses.MeanSquaredError(), _summed_output_losses("mse", model),
                                         unwrap_targets=True)
    weights = _compiled_loss_weights(model) if compiled else None
    if not isinstance(loss, (dict, list, tuple)) and isinstance(weights, (list, tuple)) and len(weights) > 1:
        # Keras's fit refuses it ("loss_weights must match the number of losses, got 1 losses and 2 weights")
        raise PlacerError(f"Keras model {model.name!r} is compiled with one loss and {len(weights)} loss_weights, "
                          "which Keras refuses to train: compile it with one loss per output (a list or a dict) "
                          "to weigh them")
    if isinstance(loss, (dict, list, tuple)) or _weighs_any(weights):
        return _summed_output_losses(loss, model, weights)
    function = _one_loss_callable(loss)
    if not (compiled or isinstance(loss, str)):
        return function  # the caller's own callable takes the outputs' structure as it is (inception-v3's aux loss)
    if not isinstance(function, keras.losses.Loss):
        function = _batch_mean(function, loss if isinstance(loss, str) else getattr(function, "__name__", "loss"))
    return _each_output_when_several(function, _summed_output_losses(loss, model))


def _each_output_when_several(single, per_output, unwrap_targets: bool = False):
    """One loss (compiled, or by name) as ``compile`` applies it: to each output of a model with several, summed
    (a model of dict outputs compiled with "mse" failed to import: the loss got the whole dict); to the one
    output of a dict of one, and with ``unwrap_targets`` (the made-up loss of an uncompiled model, a Keras Loss
    that refuses it) of a list of one, whose targets are a list where the prediction is a tensor."""
    import tensorflow as tf

    def loss(targets, predictions):
        if len(tf.nest.flatten(predictions)) > 1:
            return per_output(targets, predictions)
        if tf.is_tensor(predictions) and (tf.is_tensor(targets) or not unwrap_targets):  # (one output: taken as it
            return single(targets, predictions)  # is, its graph as before; a compiled loss takes a list of one)
        return single(tf.nest.flatten(targets)[0], tf.nest.flatten(predictions)[0])  # a list or dict of one

    return loss


def _batch_mean(function, name: str):
    """``function`` (per-example losses, as ``keras.losses.get("mse")`` gives) as a Keras Loss, the way
    ``compile`` wraps it: the mean over the batch (and any other axes it leaves). Taken as it was, the step
    returned the per-example losses and its gradients were those of their sum, batch-size times fit's."""
    import keras

    class BatchMean(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return function(y_true, y_pred)

    return BatchMean(name=name)


def _one_loss_callable(loss):
    import keras

    if isinstance(loss, str):
        try:
            return keras.losses.get(loss)
        except ValueError as err:
            raise PlacerError(f"unknown Keras loss {loss!r}: {err}") from None
    if not callable(loss):
        raise PlacerError(f"loss must be callable or a Keras loss name, got {type(loss).__name__}")
    return loss


def _summed_output_losses(losses, model, weights=None):
    """A loss per output (a list, or a dict by output name, as ``compile`` takes it) as one callable on
    the targets and predictions structures: the sum of each output's mean loss, times its weight where
    ``weights`` (the compiled ``loss_weights``, in the same forms) gives one other than 1, as ``fit`` weighs it.
    Each output's loss runs in its own name scope, as a single output's does ("mse": ``_scoped_loss``), and the
    weighing and the sum in ``SUMMED_LOSS_SCOPE``, so that no loss op is left in the scope of no layer."""
    import keras
    import tensorflow as tf

    def summed(targets, predictions):  # the outputs read from the predictions: a subclassed model has no others
        functions = [None if one is None else _scoped_loss(one)
                     for one in _output_losses(losses, model, predictions)]
        scales = [1.0 if w is None else float(w)
                  for w in _output_losses(weights, model, predictions, "loss weights")]
        values = [(_mean(function(target, prediction)), scale) for function, scale, target, prediction
                  in zip(functions, scales, tf.nest.flatten(targets), tf.nest.flatten(predictions))
                  if function is not None]
        with keras.name_scope(SUMMED_LOSS_SCOPE):
            return tf.add_n([_weighted(value, scale) for value, scale in values])

    return summed


def _scoped_loss(loss):
    """One output's loss as a Keras Loss, which opens a name scope of its name when called: a loss by name or a
    plain function reduced to its batch mean (``_batch_mean``, as ``_loss_callable`` makes a single output's)."""
    import keras

    function = _one_loss_callable(loss)
    if isinstance(function, keras.losses.Loss):
        return function
    return _batch_mean(function, loss if isinstance(loss, str) else getattr(function, "__name__", "loss"))


def _mean(value):
    """The mean of a loss's values; a Loss's scalar as it is (no op)."""
    import tensorflow as tf

    return value if value.shape.rank == 0 else tf.reduce_mean(value)


def _weighted(term, scale: float):
    return term if scale == 1.0 else term * scale  # no multiply op for the weight 1 (an unweighted graph as before)


def _weighs_any(weights) -> bool:
    """Whether compiled ``loss_weights`` (None, a number, a list or a dict) give some output a weight other than 1."""
    values = weights.values() if isinstance(weights, dict) else weights if isinstance(weights, (list, tuple)) \
        else [] if weights is None else [weights]
    return any(w is not None and float(w) != 1.0 for w in values)


def _compiled_loss_weights(model):
    """The ``loss_weights`` the model was compiled with (a number, a list or a dict by output name), else None."""
    config = model.get_compile_config() if getattr(model, "compiled", False) else None
    return (config or {}).get("loss_weights")


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
def fresh_keras_names():
    """Keras names what is made without a name ("adam", "dense_1", "seed_generator_2") from counters kept
    for the whole process: a model built a second time, or after other optimizers, got "adam_2", so other op
    names and another graph hash. Inside, the counters start from zero; after, the process's counters go
    on past both, so names made later stay unique."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        yield
        return
    before = global_state.get_global_attribute(UIDS_ATTRIBUTE) or {}
    global_state.set_global_attribute(UIDS_ATTRIBUTE, defaultdict(int))
    try:
        yield
    finally:
        merged = defaultdict(int, before)
        for prefix, count in (global_state.get_global_attribute(UIDS_ATTRIBUTE) or {}).items():
            merged[prefix] = max(merged[prefix], count)
        global_state.set_global_attribute(UIDS_ATTRIBUTE, merged)


def reachable_keras_names(function) -> frozenset[str]:
    """Names of the Keras layers (with their sublayers) and other operations that ``function`` reaches
    before it runs: in its module's globals (a module-level layer), its closure and its defaults, and in
    lists, tuples, sets and dicts of them. Modules and other objects are not searched."""
    import keras

    function = getattr(function, "func", function)  # a functools.partial: the function it wraps
    cells = getattr(function, "__closure__", None) or ()
    roots = [*getattr(function, "__globals__", {}).values(), *(getattr(function, "__defaults__", None) or ()),
             *(cell.cell_contents for cell in cells if _cell_is_set(cell))]
    names, seen = set(), set()
    stack = [(root, 0) for root in roots]
    while stack:
        value, depth = stack.pop()
        if id(value) in seen or depth > MAX_REACH_DEPTH:
            continue
        seen.add(id(value))
        if isinstance(value, keras.layers.Layer) and hasattr(value, "_flatten_layers"):  # itself and sublayers
            names.update(layer.name for layer in value._flatten_layers(include_self=True, recursive=True))
        elif isinstance(value, keras.Operation):
            names.add(value.name)
        elif isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((item, depth + 1) for item in value)
    return frozenset(names)


def _cell_is_set(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return False
    return True


class _CountsPast(defaultdict):
    """Keras's name counters ({prefix: objects named with it so far}) that never hand out a name in
    ``taken``: Keras's ``uniquify`` names the next object ``prefix`` or ``f"{prefix}_{counts[prefix]}"``,
    so a count whose name is taken is moved on past it when it is read."""

    def __init__(self, taken: frozenset[str], counts: dict):
        super().__init__(int, counts)
        self.taken = taken

    def __contains__(self, prefix) -> bool:
        return super().__contains__(prefix) or prefix in self.taken

    def __getitem__(self, prefix) -> int:
        count = super().get(prefix, 0)
        while (f"{prefix}_{count}" if count else prefix) in self.taken:
            count += 1
        self[prefix] = count
        return count


@contextmanager
def keras_names_past(taken: frozenset[str]):
    """Inside, Keras names nothing it makes without a name with a name in ``taken`` (it goes on to the
    next number: "dense_1" when "dense" is taken); otherwise it counts as before. After, the counters go
    on from where they stand."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        global_state = None
    if global_state is None or not taken:
        yield
        return
    counts = _CountsPast(taken, global_state.get_global_attribute(UIDS_ATTRIBUTE) or {})
    global_state.set_global_attribute(UIDS_ATTRIBUTE, counts)
    try:
        yield
    finally:
        if global_state.get_global_attribute(UIDS_ATTRIBUTE) is counts:  # not reset inside (clear_session)
            global_state.set_global_attribute(UIDS_ATTRIBUTE, defaultdict(int, counts))


def names_past_reachable_layers(function):
    """The context a user's Keras function is called in: names it gives are none of the layers' it
    reaches before it runs (``reachable_keras_names``), as when a fresh process imports its module, which
    names the module-level layers, then calls it. Without it, a module-level layer that outlived an earlier
    import (or a ``clear_session``, which restarts the counters) and a new layer of its model could both be
    "dense", which Keras refuses ("All operation names should be unique")."""
    return keras_names_past(reachable_keras_names(function))


@dataclass
class RecordedKerasScopes:
    scope_map: dict[str, str] = field(default_factory=dict)  # TF name scope -> dotted Keras path, e.g. "fc1"
    layers: set[str] | None = None  # the dotted paths a layer's call opened (not the root's); None: not known
    layer_calls: dict[int, str] = field(default_factory=dict)  # id of a layer -> dotted path of its first call


@contextmanager
def _recorded_keras_scopes(root_name: str):
    """Record which TF name scope each Keras name scope opened, as {"net_1/fc1_1": "fc1"}, and which of those
    a layer's call opened (the optimizer and the loss open theirs too: "adam", "mse").

    TensorFlow makes scope names unique ("fc1" becomes "fc1_1" on a layer's second scope, and a layer
    named "fc1_1" then gets "fc1_1_1"), so layer names cannot be recovered from op names alone. Keras's
    TF-backend ``name_scope`` is wrapped while tracing; without it, scopes fall back to raw TF names."""
    import tensorflow as tf

    recorded = RecordedKerasScopes()
    try:
        from keras.src.backend.common import global_state
        from keras.src.backend.tensorflow import core
        from keras.src.layers.layer import Layer
    except ImportError:
        yield recorded
        return
    original = core.name_scope.__enter__
    recorded.layers = set()

    def enter(self):
        result = original(self)
        if getattr(self, "_pop_on_exit", False):
            path = [s.name for s in global_state.get_global_attribute("name_scope_stack", default=[])]
            if path and path[0] == root_name:
                path = path[1:]
            dotted = ".".join(path)
            recorded.scope_map[tf.compat.v1.get_default_graph().get_name_scope()] = dotted
            caller = getattr(self, "caller", None)
            if isinstance(caller, Layer):  # Layer.__call__ passes itself
                recorded.layer_calls.setdefault(id(caller), dotted)
                if dotted:
                    recorded.layers.add(dotted)
        return result

    core.name_scope.__enter__ = enter
    try:
        yield recorded
    finally:
        core.name_scope.__enter__ = original
