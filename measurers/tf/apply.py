"""A user's own Keras training step with a placement applied: every node of the step on its device.

``trace_user_keras_step(build_fn, name)`` starts a fresh Keras session (layer names, and so op names, are
numbered per session, as in the process that imported the graph), sets the seed, calls the function the
user wrote (the kind `placer graphs import --keras` takes: a compiled model alone, or ``(model, inputs,
targets[, loss])``) and traces its step twice: as the importer does (the graph, whose content hash the
caller compares with the placement's) and as the TensorFlow measurer does (`measurers.tf.workload`: the
concrete function whose GraphDef nodes get the devices). ``place_user_keras_step`` gives a
`PlacedKerasStep`: the measurer's `PlacedSession` with the user's data. Each call trains once (forward,
loss, gradients, the optimizer's update, its step count in the graph); variables live on their devices
in the session between calls, and ``copy_to_model()`` writes them back into the Keras model. Example::

    user = trace_user_keras_step(my_model, "my_model")    # my_model() -> compiled keras.Model
    with place_user_keras_step(user, placement, machine) as step:
        for x, y in batches:
            loss = step(x, y)                              # same shapes as the traced step's
        step.copy_to_model()
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph
from graphs.specs import function_label
from measurers.machine import Machine
from measurers.placement import check_placement, framework_devices
from measurers.tf.measurer import PlacedSession, local_tf_device, tf_device_names
from measurers.tf.workload import TracedStep, trace_model_step


@dataclass
class UserKerasStep:
    graph: OpGraph  # the importer's graph of the step
    traced: TracedStep  # the same step as the measurer runs it, fed the user's data
    model: object  # the user's keras.Model
    origin: str  # the function, for messages: "module:function"
    structure: object = None  # (inputs, targets) as build_fn gave them, each array None: a dict's keys, an order


def trace_user_keras_step(build_fn: Callable, graph_name: str, batch_size: int | None = None,
                          seed: int = 0) -> UserKerasStep:
    """Call ``build_fn`` in a fresh Keras session seeded with ``seed`` and trace its step into a graph named
    ``graph_name``. ``batch_size``: examples made up for a bare model (default the importer's, 32); a
    returned ``(model, inputs, targets[, loss])`` must have inputs of that batch (the importer's rules:
    ``graphs.tf.importer.keras_example_from_result``)."""
    import keras
    import tensorflow as tf

    from graphs.tf.importer import keras_example_from_result, names_past_reachable_layers, trace_keras_training_step

    origin = function_label(build_fn)
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    try:
        with names_past_reachable_layers(build_fn):  # a module-level layer keeps its name past clear_session
            result = build_fn()
    except Exception as error:  # the user's code
        raise PlacerError(f"keras function {origin!r} raised {type(error).__name__}: {error}") from error
    model, inputs, targets, loss = keras_example_from_result(result, origin, batch_size)
    try:
        graph = trace_keras_training_step(model, inputs, targets, loss=loss, name=graph_name, batch_size=batch_size)
        args = [np.asarray(x) for x in tf.nest.flatten((inputs, targets))]
        traced = trace_model_step(model, inputs, targets, loss, seed, args=args)
    except PlacerError:
        raise
    except Exception as error:  # noqa: BLE001  any tracing failure is bad input
        raise PlacerError(f"keras function {origin!r}: tracing the training step failed: "
                          f"{type(error).__name__}: {error}") from error
    if traced.graph.op_kinds.tolist() != graph.op_kinds.tolist():
        raise PlacerError(f"keras function {origin!r}: the step traced for running differs from the imported "
                          f"one ({traced.graph.num_ops} and {graph.num_ops} ops)")
    return UserKerasStep(graph, traced, model, origin, tf.nest.map_structure(lambda _: None, (inputs, targets)))


def _keras_paths(model) -> dict[int, str]:
    """id(the TensorFlow variable behind it) -> Keras path, for the model's and its optimizer's variables."""
    optimizer = getattr(model, "optimizer", None)
    variables = [*model.variables, *(getattr(optimizer, "variables", None) or [])]
    return {id(getattr(v, "value", v)): getattr(v, "path", v.name) for v in variables}


@dataclass
class PlacedKerasStep:
    """The user's Keras step, placed. ``step(inputs, targets)`` trains once and returns the loss; without
    them it reuses the last ones (first, the traced example's). Close it (or use ``with``) when done."""

    session: PlacedSession
    user: UserKerasStep
    machine: Machine
    placement: np.ndarray  # (N,) int64: where each op runs (resource readers moved to their variable)
    _closed: bool = field(default=False, init=False)

    def __call__(self, inputs=None, targets=None) -> float:
        self._check_open()
        if inputs is not None or targets is not None:
            self._feed(inputs, targets)
        return float(np.sum(self.session.step()))

    def variables(self) -> dict[str, np.ndarray]:
        """Current value of every variable the step uses (model weights, optimizer state), by its Keras path
        ("head/kernel", "adam/head_kernel_momentum"); a path several variables share (layers named alike in
        two nested models) is followed by the step's node that holds each: "dense/kernel (ktwo_1/b1_1/...)".
        By name alone such variables kept one entry between them."""
        self._check_open()
        paths = _keras_paths(self.user.model)
        values = self.session.read_variables()
        names = {node: paths.get(id(self.user.traced.variables[node]), self.user.traced.variables[node].name)
                 for node in values}
        shared = {name for name, count in Counter(names.values()).items() if count > 1}
        return {(f"{names[node]} ({node})" if names[node] in shared else names[node]): value
                for node, value in values.items()}

    @property
    def model(self):
        """The keras.Model build_fn made (``copy_to_model`` writes the trained weights into it)."""
        return self.user.model

    def copy_to_model(self) -> None:
        """Write the session's variables back into the Keras model's (and its optimizer's) variables."""
        self._check_open()
        for node, value in self.session.read_variables().items():
            self.user.traced.variables[node].assign(value)

    def _feed(self, inputs, targets) -> None:
        import tensorflow as tf

        if inputs is None or targets is None:
            raise PlacerError("pass both inputs and targets (or neither, to reuse the last ones)")
        self._check_structure(inputs, targets)
        values = [np.asarray(x) for x in tf.nest.flatten((inputs, targets))]
        examples = self.user.traced.args
        if len(values) != len(examples):
            raise PlacerError(f"the step takes {len(examples)} arrays (inputs, then targets), got {len(values)}")
        for index, (value, example) in enumerate(zip(values, examples)):
            if value.shape != example.shape:
                raise PlacerError(f"array {index} of the step must have shape {example.shape} (the traced "
                                  f"step's), got {value.shape}")
            if not np.can_cast(value.dtype, example.dtype, casting="same_kind"):  # 0.7 was truncated to an int
                raise PlacerError(f"array {index} of the step holds {value.dtype}, which {example.dtype} (the "
                                  f"traced step's) cannot hold without changing its values")
        self.session.feed([v.astype(e.dtype, copy=False) for v, e in zip(values, examples)])

    def _check_structure(self, inputs, targets) -> None:
        """(inputs, targets) nested as build_fn's were: a dict of targets with a misspelt key trained on, and
        a list in the model's output order was fed in the sorted order of the dict's keys."""
        import tensorflow as tf

        if self.user.structure is None:
            return
        try:
            tf.nest.assert_same_structure(self.user.structure, (inputs, targets), check_types=False)
        except (ValueError, TypeError):  # (its words print the arrays given: a 4.5 kB error of 135 lines)
            try:
                given = _shape_of(tf.nest.map_structure(lambda _: None, (inputs, targets)))
            except (ValueError, TypeError):  # a nesting tf.nest cannot read (a dict of int and str keys)
                given = f"a {type(inputs).__name__} and a {type(targets).__name__}"
            raise PlacerError(f"inputs and targets must be nested as the step of {self.user.origin!r} was traced "
                              f"({_shape_of(self.user.structure)}), not as given ({given})") from None

    def close(self) -> None:
        self.session.__exit__(None, None, None)
        self._closed = True

    def _check_open(self) -> None:
        """A closed step's Session is gone with its variables: TensorFlow's RuntimeError said only "Attempted
        to use a closed Session"."""
        if self._closed:
            raise PlacerError("the placed Keras step was closed (its session and the trained variables with it): "
                              "call copy_to_model() before close(), or place the step again")

    def __enter__(self) -> PlacedKerasStep:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shape_of(structure) -> str:
    """``(None, {'flag': None, 'kind': None})`` as ``(array, {'flag': array, 'kind': array})``."""
    return repr(structure).replace("None", "array")


def place_user_keras_step(user: UserKerasStep, placement, machine: Machine,
                          tf_devices: Callable[[Machine], list[str]] = tf_device_names) -> PlacedKerasStep:
    """The user's step placed by ``placement`` ((N,) device of every op of ``user.graph``) on ``machine``.
    ``tf_devices``: the TensorFlow device of each machine device (the measurer's mapping by default: the
    k-th CPU to /device:CPU:k, the k-th GPU to /device:GPU:k); CPU indices past 0 are logical CPUs of the
    step's Session, so every device may map to a CPU on a machine without GPUs."""
    placement = check_placement(user.graph, machine, placement)
    devices = [local_tf_device(name) for name in framework_devices(tf_devices, machine, "tf_devices")]
    effective = user.traced.effective_placement(placement)
    session = PlacedSession(user.traced, [devices[d] for d in effective.tolist()], devices)
    return PlacedKerasStep(session, user, machine, effective)
