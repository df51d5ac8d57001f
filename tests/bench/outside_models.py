"""Models from outside the project, for checking placers on graphs nobody tuned them on. Each function is
what ``placer graphs import`` takes (``--keras tests/bench/outside_models.py:densenet121`` or ``--torch
tests/bench/outside_models.py:torch_transformer``); ``import_all`` writes them to ``runs/outside/*.parquet``,
and the fourth, bench_schedule_agreement.py's MobileNetV2, to ``runs/keras-mobilenetv2.parquet``. Usage::

    python tests/bench/outside_models.py        # imports the ones not imported yet
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path("runs/outside")


def densenet121():
    """``keras.applications.DenseNet121`` (weights=None, 224x224, 1000 classes), trained with SGD."""
    import keras

    model = keras.applications.DenseNet121(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def torch_transformer():
    """``torch.nn.Transformer`` as its docs build it (d_model 512, 8 heads, 6 + 6 layers, feed-forward
    2,048), sequences of 64 tokens, batch 32; with no loss given, the importer trains on the sum of the output,
    with Adam."""
    import torch
    from torch import nn

    model = nn.Transformer(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                           dim_feedforward=2048, batch_first=True)
    src, tgt = torch.randn(32, 64, 512), torch.randn(32, 64, 512)
    return model, (src, tgt)


def torch_mlp():
    """A feed-forward network: 8 hidden layers of 4,096 with ReLU, 1,024 inputs, 1,000 outputs, batch 256
    (trained with Adam on the sum of the outputs, the importer's loss when none is given)."""
    import torch
    from torch import nn

    layers, width = [], 1024
    for _ in range(8):
        layers += [nn.Linear(width, 4096), nn.ReLU()]
        width = 4096
    model = nn.Sequential(*layers, nn.Linear(width, 1000))
    return model, (torch.randn(256, 1024),)


SPECS = {"keras-densenet121": ("keras", "densenet121"), "torch-transformer": ("torch", "torch_transformer"),
         "torch-mlp": ("torch", "torch_mlp")}


def import_all() -> None:
    from bench_schedule_agreement import KERAS_NAME, load
    from graphs.io import save_graph

    load(KERAS_NAME)  # imports and saves it when runs/ does not hold it yet
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (framework, function) in SPECS.items():
        path = OUT / f"{name}.parquet"
        if path.is_file():
            continue
        spec = f"{__file__}:{function}"
        if framework == "keras":
            from graphs.tf.importer import import_keras_spec
            graph = import_keras_spec(spec, batch_size=32, name=name)
        else:
            from graphs.torch.importer import import_torch_spec
            graph = import_torch_spec(spec)
        save_graph(graph, path)
        print(f"{path}: {graph.num_ops} ops", file=sys.stderr, flush=True)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help, and no stray argument
    import_all()
