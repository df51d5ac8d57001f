"""The built-in benchmark graphs: real framework models traced at the papers' scale.

Each entry names its builder lazily, so listing benchmarks imports neither torch nor TensorFlow.
"""

from graphs.registry import Benchmark, register

# Entries are registered by the modules' authors below, e.g.
# register(Benchmark("rnnlm", "graphs.benchmarks.rnn_models:build_rnnlm", "2-layer LSTM LM, batch 64", {...}))
