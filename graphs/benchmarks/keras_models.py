"""Keras-applications benchmarks: Inception-V3 (with its auxiliary head) and ResNet-50 training steps.

Both are built with ``keras.applications`` (``weights=None``) and traced by ``graphs.tf.importer``.
Optimizer: SGD with momentum 0.9 (the usual ImageNet recipe), so each Variable's ``param_bytes`` is
weights + gradient + momentum = 3x the weight bytes; pass ``optimizer="adam"`` for 4x.
Scopes are Keras layer names; Inception-V3's layers are further prefixed by their block
("stem", "mixed0".."mixed10", "aux", "head"), e.g. "mixed5.conv2d_40", so expert placements can find them;
``meta[LAYER_SCOPES]`` (the layers, for ``placer apply --module-map``) is prefixed alike.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from graphs.opgraph import LAYER_SCOPES, OpGraph
from graphs.tensorflow_quiet import import_tensorflow_quietly

AUX_LOSS_WEIGHT = 0.4  # Szegedy et al. 2016 weight of the auxiliary classifier's loss
MIXED_BLOCK = re.compile(r"mixed\d+")


def build_inception_v3(batch_size: int = 32, image_size: int = 299, num_classes: int = 1000,
                       aux_head: bool = True, optimizer: str = "sgd") -> OpGraph:
    """Inception-V3 training step; the auxiliary head sits on ``mixed7`` as published (5x5 average pool,
    stride 3; 1x1 conv 128; 5x5 conv 768; fully connected ``num_classes``), loss = main + 0.4 aux."""
    settings = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes, aux_head=aux_head,
                    optimizer=optimizer)
    model, inputs, targets, loss = inception_v3_step(**settings)
    graph = _trace(model, inputs, targets, loss, "inception-v3", "inception_v3_step", settings)
    blocks = _inception_blocks(model)
    scopes = [_prefixed_scope(s, blocks) for s in graph.scopes]
    graph.meta[LAYER_SCOPES] = sorted(_prefixed_scope(s, blocks) for s in graph.meta[LAYER_SCOPES])  # as scopes
    return dataclasses.replace(graph, scopes=np.array(scopes, dtype=object),
                               source=f"benchmark inception-v3 (keras.applications, batch {batch_size}, "
                                      f"{image_size}x{image_size}, aux head {aux_head}, {optimizer})")


def build_resnet50(batch_size: int = 64, image_size: int = 224, num_classes: int = 1000,
                   optimizer: str = "sgd") -> OpGraph:
    """ResNet-50 (He et al. 2016, keras.applications) training step with sparse cross-entropy."""
    settings = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes, optimizer=optimizer)
    graph = _trace(*resnet50_step(**settings), "resnet-50", "resnet50_step", settings)
    return dataclasses.replace(graph, source=f"benchmark resnet-50 (keras.applications, batch {batch_size}, "
                                             f"{image_size}x{image_size}, {optimizer})")


def inception_v3_step(batch_size: int = 32, image_size: int = 299, num_classes: int = 1000, aux_head: bool = True,
                      optimizer: str = "sgd") -> tuple:
    """``(model compiled with its optimizer, input spec, target spec, loss)``: what the importer traces and
    the TensorFlow measurer rebuilds (``graph.meta["keras_step"]``). TensorFlow is loaded without its
    start-up lines: a benchmark's first build (a cache miss) printed them under whatever command asked."""
    import_tensorflow_quietly()
    import keras

    model = inception_v3_model(image_size, num_classes, aux_head)
    model.compile(optimizer=_optimizer(optimizer))
    loss = _aux_loss if aux_head else keras.losses.SparseCategoricalCrossentropy()
    return (model, *_example_batch(batch_size, image_size), loss)


def resnet50_step(batch_size: int = 64, image_size: int = 224, num_classes: int = 1000,
                  optimizer: str = "sgd") -> tuple:
    """As ``inception_v3_step``, for ResNet-50 with sparse cross-entropy."""
    import_tensorflow_quietly()
    import keras

    model = resnet50_model(image_size, num_classes)
    model.compile(optimizer=_optimizer(optimizer))
    return (model, *_example_batch(batch_size, image_size), keras.losses.SparseCategoricalCrossentropy())


def _trace(model, inputs, targets, loss, name: str, step_function: str, settings: dict) -> OpGraph:
    from graphs.tf.importer import trace_keras_training_step

    graph = trace_keras_training_step(model, inputs, targets, loss=loss, name=name,
                                      batch_size=settings["batch_size"])
    graph.meta["keras_step"] = {"function": f"{__name__}:{step_function}", "kwargs": settings}
    return graph


def inception_v3_model(image_size: int = 299, num_classes: int = 1000, aux_head: bool = True):
    """keras.applications.InceptionV3 (weights=None), with the auxiliary classifier as a second output."""
    import keras

    keras.backend.clear_session()  # restart Keras's layer-name counters so names are the same every build
    base = keras.applications.InceptionV3(weights=None, input_shape=(image_size, image_size, 3),
                                          classes=num_classes)
    if not aux_head:
        return keras.Model(base.input, base.output, name="inception_v3")
    aux = _aux_head(base.get_layer("mixed7").output, num_classes)
    return keras.Model(base.input, [base.output, aux], name="inception_v3")


def resnet50_model(image_size: int = 224, num_classes: int = 1000):
    """keras.applications.ResNet50 (weights=None)."""
    import keras

    keras.backend.clear_session()
    return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                       classes=num_classes)


def _aux_head(features, num_classes: int):
    from keras import layers

    pool = min(5, features.shape[1])  # 5 at 299x299 (17x17 -> 5x5); smaller test inputs stay valid
    x = layers.AveragePooling2D(pool, strides=3, name="aux_pool")(features)
    padding = "valid" if x.shape[1] >= 5 else "same"  # same weights either way
    for filters, kernel, tag in ((128, 1, "aux_conv1"), (768, 5, "aux_conv2")):
        x = layers.Conv2D(filters, kernel, use_bias=False, padding=padding, name=tag)(x)
        x = layers.BatchNormalization(epsilon=1e-3, scale=False, name=f"{tag}_bn")(x)
        x = layers.Activation("relu", name=f"{tag}_relu")(x)
    x = layers.GlobalAveragePooling2D(name="aux_flatten")(x)  # 1x1 at 299x299; keeps small inputs valid
    return layers.Dense(num_classes, activation="softmax", name="aux_predictions")(x)


def _aux_loss(targets, predictions):
    import keras

    ce = keras.losses.SparseCategoricalCrossentropy()
    return ce(targets, predictions[0]) + AUX_LOSS_WEIGHT * ce(targets, predictions[1])


def _optimizer(name: str):
    import keras

    from graphs.errors import PlacerError

    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=0.045, momentum=0.9)
    if name == "adam":
        return keras.optimizers.Adam()
    raise PlacerError(f"unknown optimizer {name!r} (known: sgd, adam)")


def _example_batch(batch_size: int, image_size: int):
    import graphs.native_order  # noqa: F401  (OR-Tools before TensorFlow)
    import tensorflow as tf

    return (tf.TensorSpec((batch_size, image_size, image_size, 3), tf.float32),
            tf.TensorSpec((batch_size,), tf.int32))


def _inception_blocks(model) -> dict[str, str]:
    """Layer name -> block: "stem" up to the first branch point, then the mixedN concat each layer
    feeds ("mixed9_0" and the like stay inside their block), "aux" for the auxiliary head, "head" after."""
    blocks, pending = {}, []
    for layer in model.layers:
        if layer.name.startswith("aux_"):
            blocks[layer.name] = "aux"
            continue
        if "stem" not in blocks.values() and len(getattr(layer, "_outbound_nodes", [])) > 1:
            blocks.update({name: "stem" for name in _stem_names(model, layer)})
            pending = []
            continue
        if layer.name not in blocks:
            pending.append(layer.name)
        if MIXED_BLOCK.fullmatch(layer.name):
            blocks.update({name: layer.name for name in pending})
            pending = []
    blocks.update({name: "head" for name in pending})
    return blocks


def _stem_names(model, branch_point) -> list[str]:
    names = [layer.name for layer in model.layers]
    return names[: names.index(branch_point.name) + 1]


def _prefixed_scope(scope: str, blocks: dict[str, str]) -> str:
    head = scope.split(".", 1)[0]
    return f"{blocks[head]}.{scope}" if head in blocks else scope
