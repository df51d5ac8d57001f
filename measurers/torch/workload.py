"""The real training step behind a traced PyTorch graph: model, inputs and loss, rebuilt with real data.

`graphs.torch.importer` traces a step with fake tensors; a real measurer needs the same step with real
tensors. ``workload_from_graph(graph)`` finds where the graph came from:

- a benchmark (``graph.source == "benchmark NAME {config}"``): the registered builder
  ``module:build_X`` has a model function ``module:X_model(**config) -> (model, inputs)``;
- an import spec (``graph.source == "torch:MODULE:FUNCTION"``): the function returns
  ``(model, inputs)`` or ``(model, inputs, loss_fn)``.

``TorchWorkload.materialize(seed)`` then gives the model with seeded parameters on the CPU, the builder's
own example inputs where they hold data (the builder runs after ``torch.manual_seed(seed)``, so what it draws
is seeded), seeded inputs of the traced shapes where they are on the meta device (integer inputs drawn below
the smallest embedding table, so they are valid token ids), plus the optimizer class the trace used (Adam
unless recorded). A real input is kept, not drawn again: only the builder knows its valid values (class
targets below the number of classes, not below the vocabulary of the model's embedding).
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph


@dataclass(frozen=True)
class TorchWorkload:
    """How to build the step: ``build() -> (model, inputs[, loss_fn])`` and the optimizer's name."""

    build: Callable[[], tuple]
    optimizer: str = "Adam"
    origin: str = ""  # where it came from, for error messages

    def materialize(self, seed: int = 0) -> "MaterializedStep":
        torch.manual_seed(seed)  # a builder that draws its own weights or inputs draws the same ones
        result = self.build()
        if not isinstance(result, tuple) or len(result) not in (2, 3):
            raise PlacerError(f"torch workload {self.origin!r}: expected (model, inputs[, loss_fn])")
        model, inputs, loss_fn = (*result, None) if len(result) == 2 else result
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        generator = torch.Generator().manual_seed(seed)
        model = _materialize_model(model, seed)
        bound = _token_bound(model)
        real_inputs = tuple(_real_input(x, generator, bound) if isinstance(x, torch.Tensor) else x for x in inputs)
        optimizer_cls = getattr(torch.optim, self.optimizer, None)
        if optimizer_cls is None:
            raise PlacerError(f"torch workload {self.origin!r}: unknown optimizer {self.optimizer!r}")
        return MaterializedStep(model, real_inputs, loss_fn, optimizer_cls)


@dataclass
class MaterializedStep:
    model: nn.Module  # real parameters on the CPU
    inputs: tuple  # real tensors on the CPU
    loss_fn: Callable | None
    optimizer_cls: type

    def make_optimizer(self, **options) -> torch.optim.Optimizer:
        """The optimizer as the importer builds it (one update op per parameter), after one zero-gradient
        warm-up step so its state exists (the traced step is a steady-state step). ``options``: the
        optimizer's own (``lr=...``)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = self.optimizer_cls(params, foreach=False, **options)
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return optimizer

    def loss(self) -> torch.Tensor:
        """Forward pass and loss, as the importer traces it."""
        output = self.model(*self.inputs)
        loss = self.loss_fn(output) if self.loss_fn is not None else output
        return loss if loss.dim() == 0 else loss.sum()


_MEASURABLE_BY = {"tensorflow": "measure it with --measurer tf", "onnx": "measure it with --measurer openvino",
                  "openvino": "measure it with --measurer openvino"}  # else (synthetic, hand-made): --measurer sim


def workload_from_graph(graph: OpGraph) -> TorchWorkload:
    """The workload that produced ``graph``; PlacerError when its origin is not rebuildable."""
    optimizer = str(graph.meta.get("optimizer", "Adam"))
    source = graph.source
    if graph.framework != "torch":
        raise PlacerError(f"graph {graph.name!r} is a {graph.framework} graph and cannot be rebuilt as a real "
                          f"PyTorch step: {_MEASURABLE_BY.get(graph.framework, 'only the simulator times it')}")
    if source.startswith("benchmark "):
        name, _, config_text = source[len("benchmark "):].partition(" ")
        return TorchWorkload(_benchmark_builder(name, config_text), optimizer, source)
    if source.startswith("torch:"):
        spec = source[len("torch:"):]
        return TorchWorkload(lambda: _call_spec(spec), optimizer, source)
    raise PlacerError(f"graph {graph.name!r} (source {source!r}) cannot be rebuilt as a real PyTorch step: "
                      "the torch measurer needs a torch benchmark or a graph imported from a torch spec")


def _benchmark_builder(name: str, config_text: str) -> Callable[[], tuple]:
    from graphs.registry import BENCHMARKS, load_builtin_benchmarks

    load_builtin_benchmarks()
    benchmark = BENCHMARKS.get(name)
    if benchmark is None:
        raise PlacerError(f"graph comes from benchmark {name!r}, which is not registered")
    try:
        config = ast.literal_eval(config_text) if config_text.strip() else dict(benchmark.config)
    except (ValueError, SyntaxError):
        raise PlacerError(f"benchmark {name!r}: cannot read its configuration {config_text!r}") from None
    module_name, func_name = benchmark.builder.split(":")
    if not func_name.startswith("build_"):
        raise PlacerError(f"benchmark {name!r}: builder {benchmark.builder!r} has no model function")
    model_fn = getattr(importlib.import_module(module_name), func_name[len("build_"):] + "_model", None)
    if model_fn is None:
        raise PlacerError(f"benchmark {name!r} is not a PyTorch model (no {func_name[6:]}_model in {module_name})")
    return lambda: model_fn(**config)


def _call_spec(spec: str) -> tuple:
    from graphs.specs import call_spec
    from graphs.torch.importer import check_spec_result

    return check_spec_result(spec, call_spec(spec, "torch"))


def _materialize_model(model: nn.Module, seed: int) -> nn.Module:
    """Real CPU parameters. A model built on the meta device gets storage, then every module re-initializes
    under ``seed`` (``reset_parameters``; parameters of modules without one: normal(0, 0.02)). Either keeps
    the mode its builder returned it in: the importer traced it in that mode (one returned in eval mode,
    Dropout off, was switched to train mode here, and every measurement failed with "the real step does not
    match graph")."""
    tensors = [*model.parameters(), *model.buffers()]
    if not any(t.is_meta for t in tensors):
        return model.to("cpu")
    shared = _shared_tensors(model)
    model = model.to_empty(device="cpu")
    for places in shared:  # to_empty gave each module its own copy of a tied weight: tied again
        first_module, first_name, kind = places[0]
        tensor = getattr(first_module, kind)[first_name]
        for module, name, _ in places[1:]:
            getattr(module, kind)[name] = tensor
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
            else:
                for p in module.parameters(recurse=False):
                    p.normal_(0.0, 0.02)
                for b in module.buffers(recurse=False):
                    b.zero_()
    return model


def _shared_tensors(model: nn.Module) -> list[list[tuple[nn.Module, str, str]]]:
    """Each parameter or buffer that several modules hold (a tied embedding and output layer), as the
    (module, name, "_parameters" or "_buffers") places that hold it: ``to_empty`` unties them (the step then
    had two weights and two Adam updates where the graph has one, and never matched it)."""
    places: dict[int, list] = {}
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, kind).items():
                if tensor is not None:
                    places.setdefault(id(tensor), []).append((module, name, kind))
    return [held for held in places.values() if len(held) > 1]


def _token_bound(model: nn.Module) -> int:
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    return min(sizes) if sizes else 2


def _real_input(x: torch.Tensor, generator: torch.Generator, bound: int) -> torch.Tensor:
    """The builder's input on the CPU, or one drawn for it where it is on the meta device (no data)."""
    return _seeded_like(x, generator, bound) if x.is_meta else x.detach().to("cpu", copy=True)


def _seeded_like(x: torch.Tensor, generator: torch.Generator, bound: int) -> torch.Tensor:
    if x.dtype == torch.bool:
        return torch.zeros(x.shape, dtype=torch.bool)
    if x.dtype.is_floating_point or x.dtype.is_complex:  # randint refuses complex dtypes
        return torch.randn(x.shape, dtype=x.dtype, generator=generator)
    return torch.randint(0, bound, x.shape, dtype=x.dtype, generator=generator)
