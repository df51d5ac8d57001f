"""Inference benchmarks: batch-1 forward graphs read from exported model files, no downloads.

- ``inception-v3-infer`` / ``resnet-50-infer``: the keras.applications models of
  ``graphs.benchmarks.keras_models`` (weights=None; Inception-V3 without its training-only auxiliary head),
  converted to OpenVINO IR with ``openvino.convert_model`` and read by ``graphs.inference.openvino_import``.
- ``bert-base-infer``: a BERT-base encoder (Devlin et al. 2019: 12 post-LN layers, hidden 768, 12 heads,
  FFN 3072, vocabulary 30,522, 512 positions, 2 token types, pooler; 109,482,240 parameters) written in
  PyTorch, exported with the TorchScript ONNX exporter (``dynamo=False``, opset 17, constants folded) and
  read by ``graphs.inference.onnx_import``.

The model files stay under ``graphs.registry.cache_dir() / "models"``: the graph's ``meta["model_file"]``
names them, and the OpenVINO measurer compiles that file. A build rewrites them atomically (temp file,
then rename), so a cached graph and its model file agree in structure.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from graphs.errors import PlacerError
from graphs.files import atomic_file, temp_folder
from graphs.opgraph import OpGraph
from graphs.tensorflow_quiet import import_tensorflow_quietly

ONNX_OPSET = 17  # the first opset with LayerNormalization


def build_resnet50_infer(batch_size: int = 1, image_size: int = 224, num_classes: int = 1000) -> OpGraph:
    """ResNet-50 forward pass at ``batch_size`` from its OpenVINO IR."""
    from graphs.benchmarks.keras_models import resnet50_model

    config = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes)
    return _keras_via_openvino("resnet-50-infer", config, lambda: resnet50_model(image_size, num_classes))


def build_inception_v3_infer(batch_size: int = 1, image_size: int = 299, num_classes: int = 1000) -> OpGraph:
    """Inception-V3 forward pass (main classifier only) at ``batch_size`` from its OpenVINO IR."""
    from graphs.benchmarks.keras_models import inception_v3_model

    config = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes)
    return _keras_via_openvino("inception-v3-infer", config,
                               lambda: inception_v3_model(image_size, num_classes, aux_head=False))


def build_bert_base_infer(batch_size: int = 1, seq_len: int = 128, hidden: int = 768, layers: int = 12,
                          heads: int = 12, ffn: int = 3072, vocab: int = 30522, max_positions: int = 512) -> OpGraph:
    """BERT-base encoder forward pass over ``seq_len`` tokens from its ONNX export."""
    from graphs.inference.onnx_import import import_onnx

    config = dict(batch_size=batch_size, seq_len=seq_len, hidden=hidden, layers=layers, heads=heads, ffn=ffn,
                  vocab=vocab, max_positions=max_positions)
    torch.manual_seed(0)
    model = BertEncoder(vocab, hidden, layers, heads, ffn, max_positions).eval()
    with torch.no_grad():  # BERT's N(0, 0.02) init for every tensor, so no two initializers are equal: the
        for parameter in model.parameters():  # exporter would merge equal ones (all-ones LayerNorm scales)
            parameter.normal_(0.0, 0.02)
    tokens = torch.randint(0, vocab, (batch_size, seq_len), dtype=torch.int64)
    path = model_path("bert-base-infer", config, ".onnx")
    with atomic_file(path) as tmp:
        torch.onnx.export(model, (tokens,), str(tmp), dynamo=False, opset_version=ONNX_OPSET,
                          input_names=["input_ids"], output_names=["hidden_states", "pooled"])
    return import_onnx(str(path), name="bert-base-infer")


def model_path(name: str, config: dict, suffix: str) -> Path:
    """Where benchmark ``name`` at ``config`` keeps its model file: one file per configuration and version of
    the ``graphs`` package, as its cached graph is keyed. Without the version, a checkout with other model
    code sharing the cache rewrote the file under the other's cached graph, which then named a model of
    another structure."""
    from graphs import registry

    key = json.dumps([name, config, registry.graphs_source_digest()], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return _models_folder(name, registry.cache_dir() / "models") / f"{name}-{digest}{suffix}"


def _models_folder(name: str, folder: Path) -> Path:
    """``folder``, made if missing; one PlacerError saying what to do when it cannot be made or written: the
    model file must be on disk (the OpenVINO measurer runs it), unlike the graph, which is used uncached. A
    PLACER_CACHE that names a file was a bare "models: Not a directory"."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        problem = None if os.access(folder, os.W_OK | os.X_OK) else "not writable"
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem is not None:
        raise PlacerError(f"{name} keeps its model file in the graph cache, and {folder} cannot be written "
                          f"({problem}): set PLACER_CACHE to a folder this user can write")
    return folder


def _keras_via_openvino(name: str, config: dict, make_model) -> OpGraph:
    import_tensorflow_quietly()  # OR-Tools first, and no start-up lines on a first build (keras_models)
    import keras
    import openvino as ov

    from graphs.inference.openvino_import import import_openvino_ir, number_counter_named_nodes

    keras.utils.set_random_seed(0)  # the same weights every build
    model = make_model()
    size = config["image_size"]
    with warnings.catch_warnings():  # Keras notes the converter's tuple of inputs; the model has one input
        warnings.filterwarnings("ignore", message="The structure of `inputs` doesn't match")
        ov_model = ov.convert_model(model, input=[config["batch_size"], size, size, 3])
    number_counter_named_nodes(ov_model)
    xml_path = model_path(name, config, ".xml")
    _save_ir(ov_model, xml_path)
    return import_openvino_ir(str(xml_path), name=name)


def _save_ir(ov_model, xml_path: Path) -> None:
    """Write the IR beside a temp name, then rename the .bin and the .xml into place (weights first)."""
    import openvino as ov

    xml_path.parent.mkdir(parents=True, exist_ok=True)
    with temp_folder(xml_path.parent, "ir") as tmp:  # a killed build's is removed by the next
        tmp_xml = tmp / "model.xml"
        ov.save_model(ov_model, str(tmp_xml), compress_to_fp16=False)  # fp32 weights: a Convert-free graph
        os.replace(tmp_xml.with_suffix(".bin"), xml_path.with_suffix(".bin"))
        os.replace(tmp_xml, xml_path)


class BertSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention with BERT's post-LN residual."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.output = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)

    def _split(self, t):
        batch, steps, _ = t.shape
        return t.view(batch, steps, self.heads, self.head_dim).transpose(1, 2)  # (B, heads, T, D)

    def forward(self, x):
        batch, steps, hidden = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)  # (B, h, T, T)
        context = (weights @ v).transpose(1, 2).reshape(batch, steps, hidden)  # (B, T, h*D)
        return self.norm(x + self.output(context))


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.intermediate = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU())
        self.output = nn.Linear(ffn, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        x = self.attention(x)
        return self.norm(x + self.output(self.intermediate(x)))


class BertEncoder(nn.Module):
    """Token ids (B, T) -> (hidden states (B, T, H), pooled first token (B, H)); token type 0 throughout."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, max_positions: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)  # (1, T)
        x = self.word(tokens) + self.position(positions) + self.token_type(torch.zeros_like(tokens))
        x = self.norm(x)
        for layer in self.layers:
            x = layer(x)
        return x, torch.tanh(self.pooler(x[:, 0]))
