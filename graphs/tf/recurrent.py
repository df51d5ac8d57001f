"""Keras recurrent layers traced unrolled: every time step's ops in the step's graph, with their shapes.

A Keras RNN built with the default ``unroll=False`` runs its steps in a TF while loop: the importer would
count its body once (``graphs.tf.flatten``: its maximum_iterations is a Max that ``graphs.tf.loops`` does not
fold), and a placement would see one op for all the steps of each. While a training
step is traced inside ``unrolled_recurrent_layers``, each of Keras's own recurrent layers whose input has a
static time dimension is called with ``unroll=True``, which is the layer a user builds with
``unroll=True``: the same layer, weights and names, the loop replaced by one cell call per step. The
model itself is not copied (``keras.models.clone_model`` makes new variables, to be kept in step with
the user's, renames a functional model's input layers, and clones a subclassed model only through its
own ``get_config``), so its compile state (loss, optimizer and its slots, dtype policy) and its variables
are the user's, and a model of any kind (Sequential, functional, subclassed, nested, ``Bidirectional``
wrappers) is handled alike. The flag is set only for the layer's call (``keras.layers.RNN.call``, which
every one of them runs, is wrapped while the step is traced) and put back after.

A layer is left rolled, with the reason recorded, when its input's time dimension is unknown (nothing to
unroll to) or when it is a subclass of Keras's layers (its own code may not honour ``unroll``). The importer
names those reasons if the loop then has no static trip count or cannot be imported.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field

KERAS_RNN_TYPES = ("RNN", "SimpleRNN", "LSTM", "GRU", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D")  # keras.layers


@dataclass
class RecurrentUnrolling:
    """What one traced step did with its recurrent layers, by the dotted scope of each layer (as the
    graph's scopes: "encoder.lstm", a Bidirectional's "bi.forward_lstm"), in call order."""

    unrolled: list[str] = field(default_factory=list)  # built with unroll=False, traced unrolled
    left_rolled: dict[str, str] = field(default_factory=dict)  # layer -> why it kept its while loop

    def rolled_reasons(self) -> str:
        """``'lstm': its input's time dimension is unknown (...); ...``, or "" when none was left."""
        return "; ".join(f"{layer!r}: {reason}" for layer, reason in self.left_rolled.items())


@contextmanager
def unrolled_recurrent_layers(root_name: str, record: RecurrentUnrolling | None = None):
    """Inside, Keras's own recurrent layers called with a static time dimension run unrolled (see the
    module's docstring); yields ``record`` (default a new one), filled as they are called. ``root_name``:
    the stepped model's name, left out of the layers' scopes as the importer leaves it out of the graph's."""
    import keras

    record = RecurrentUnrolling() if record is None else record
    standard = tuple(getattr(keras.layers, name) for name in KERAS_RNN_TYPES if hasattr(keras.layers, name))
    original = keras.layers.RNN.call

    @functools.wraps(original)
    def call(self, sequences, *args, **kwargs):
        if self.unroll:
            return original(self, sequences, *args, **kwargs)
        scope = _layer_scope(self, root_name)
        reason = _why_not_unrolled(self, sequences, standard)
        if reason:
            record.left_rolled.setdefault(scope, reason)
            return original(self, sequences, *args, **kwargs)
        self.unroll = True
        try:
            outputs = original(self, sequences, *args, **kwargs)
        finally:
            self.unroll = False
        if scope not in record.unrolled:  # a layer shared by two inputs is one layer
            record.unrolled.append(scope)
        return outputs

    keras.layers.RNN.call = call
    try:
        yield record
    finally:
        keras.layers.RNN.call = original


def _why_not_unrolled(layer, sequences, standard: tuple) -> str:
    if type(layer) not in standard:
        return (f"{type(layer).__name__} is not one of Keras's own recurrent layers ({', '.join(KERAS_RNN_TYPES)}), "
                "whose unroll flag is known to be honoured: build it with unroll=True")
    steps = sequences.shape[1] if len(sequences.shape) > 1 else None
    if steps is None:
        return (f"its input's time dimension is unknown (shape {tuple(sequences.shape)}): give the model's input "
                "a fixed number of steps")
    return ""


def _layer_scope(layer, root_name: str) -> str:
    """The dotted Keras name scope the layer is called in ("bi.forward_lstm"), without the model's name."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        return layer.name
    path = [scope.name for scope in global_state.get_global_attribute("name_scope_stack", default=[])]
    if path and path[0] == root_name:
        path = path[1:]
    return ".".join(path) or layer.name
