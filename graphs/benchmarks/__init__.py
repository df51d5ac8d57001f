"""The built-in benchmark graphs: real framework models traced at the papers' scale, and batch-1 inference
graphs read from exported ONNX / OpenVINO IR files (graphs.benchmarks.inference_models).

Each entry names its builder lazily, so listing benchmarks imports neither torch nor TensorFlow.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Benchmark:
    name: str
    builder: str  # "module:function", imported only when the graph is built
    description: str
    config: dict = field(default_factory=dict)

    def build(self):
        """The OpGraph (the builder traces the model)."""
        module_name, func_name = self.builder.split(":")
        return getattr(importlib.import_module(module_name), func_name)(**self.config)


BUILTIN: list[Benchmark] = []  # graphs.registry serves these by name
register = BUILTIN.append
register(Benchmark("rnnlm", "graphs.benchmarks.torch_models:build_rnnlm",
                   "2-layer LSTM language model (2048 units, vocab 10k, 35 steps unrolled), batch 64",
                   {"batch_size": 64, "seq_len": 35, "hidden": 2048, "vocab": 10000, "layers": 2}))
for _layers in (2, 4, 8):
    register(Benchmark(f"nmt-{_layers}", "graphs.benchmarks.torch_models:build_nmt",
                       f"GNMT-style LSTM encoder-decoder with attention, {_layers}+{_layers} layers of 1024, "
                       "vocab 32k, 40+40 steps unrolled, batch 64",
                       {"layers": _layers, "batch_size": 64, "src_len": 40, "tgt_len": 40, "hidden": 1024,
                        "src_vocab": 32000, "tgt_vocab": 32000}))
register(Benchmark("transformer", "graphs.benchmarks.torch_models:build_transformer",
                   "GPT-2-small decoder (12 layers, d_model 768, 12 heads, vocab 50257), batch 8, sequence 1024",
                   {"batch_size": 8, "seq_len": 1024, "d_model": 768, "layers": 12, "heads": 12, "vocab": 50257,
                    "context": 1024}))
register(Benchmark("inception-v3", "graphs.benchmarks.keras_models:build_inception_v3",
                   "Inception-V3 + aux head (keras.applications), batch 32, 299x299, SGD momentum",
                   {"batch_size": 32, "image_size": 299}))
register(Benchmark("resnet-50", "graphs.benchmarks.keras_models:build_resnet50",
                   "ResNet-50 (keras.applications), batch 64, 224x224, SGD momentum",
                   {"batch_size": 64, "image_size": 224}))
register(Benchmark("inception-v3-infer", "graphs.benchmarks.inference_models:build_inception_v3_infer",
                   "Inception-V3 inference (keras.applications -> OpenVINO IR, no aux head), batch 1, 299x299",
                   {"batch_size": 1, "image_size": 299}))
register(Benchmark("resnet-50-infer", "graphs.benchmarks.inference_models:build_resnet50_infer",
                   "ResNet-50 inference (keras.applications -> OpenVINO IR), batch 1, 224x224",
                   {"batch_size": 1, "image_size": 224}))
register(Benchmark("bert-base-infer", "graphs.benchmarks.inference_models:build_bert_base_infer",
                   "BERT-base encoder inference (PyTorch -> ONNX; 12 layers, hidden 768, 12 heads, vocab 30522), "
                   "batch 1, sequence 128",
                   {"batch_size": 1, "seq_len": 128, "hidden": 768, "layers": 12, "heads": 12, "ffn": 3072,
                    "vocab": 30522, "max_positions": 512}))
