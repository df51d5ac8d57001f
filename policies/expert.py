"""The human experts' placements the papers compare against, one rule per benchmark family.

Sources (Mirhoseini et al., ICML 2017, "Device Placement Optimization with Reinforcement Learning"):
- The introduction: "in a neural translation network, each layer, including all LSTM layers, the attention
  layer, and the softmax layer, is computed by a GPU (Sutskever et al., 2014; Wu et al., 2016)".
- Section 4 (baselines), as recalled -- the full text could not be retrieved through this project's search
  tool, so the wording is not checked: for RNNLM and NMT each LSTM layer goes on its own GPU, the embedding
  with the first layer, attention and softmax on the last GPU; for Inception-V3 at batch 32 no multi-GPU
  practice exists, so the authors split the model into contiguous blocks with about the same number of
  layers, one block per GPU.

Rules (k GPUs, in machine order):
- ``rnnlm``: LSTM layer i (of L) on GPU i*k//L when L >= k, else GPU i; ``embed`` with layer 0;
  ``softmax`` on the last GPU (with 2 layers on 2 GPUs: the second layer's GPU).
- ``nmt-*``: encoder layer i and decoder layer i on the same spread GPU; ``encoder.embed`` with encoder
  layer 0, ``decoder.embed`` with decoder layer 0; ``attention`` and ``softmax`` on the last GPU.
- ``inception-v3``: the forward ops' top-level scopes (Keras layers) in topological order, cut into k
  contiguous blocks of equal layer count.
- Anything else (transformer, resnet-50, synthetic graphs): PlacerError "no expert rule", because no
  source describes a human placement for them; we do not guess.

Ops without a matched scope (inputs, loss, optimizer bookkeeping, backward ops an importer left unscoped)
follow the producer of their largest input, or else the consumer of their largest output; a unit (group)
goes where most of its ops go; ops no GPU may run stay on their fastest allowed device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import PHASE_CODE
from policies.base import DecisionClock, check_budget, finish
from policies.problem import PlacementProblem


@dataclass
class ExpertPolicy:
    name: str = "expert"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        units, rule = expert_units(problem)
        return finish(self.name, problem, units, clock, measurer, on_measurement, notes=f"rule {rule}")


def expert_rule_name(graph_name: str) -> str:
    name = graph_name.lower()
    if name.startswith("rnnlm"):
        return "rnnlm"
    if name.startswith("nmt"):
        return "nmt"
    if name.startswith("inception"):
        return "inception-v3"
    raise PlacerError(f"no expert rule for graph {graph_name!r}: the papers describe human placements only "
                      f"for rnnlm, nmt-* and inception-v3")


def check_expert_rule(graph_name: str, flag: str) -> None:
    """``flag`` (``--policy expert``, ``--warm-start expert``) refused, one error before anything starts, where
    the expert has no rule for the graph: found inside the run, it left a run folder no resume could finish."""
    try:
        expert_rule_name(graph_name)
    except PlacerError as exc:
        raise PlacerError(f"{flag}: {exc}") from None


def expert_units(problem: PlacementProblem) -> tuple[np.ndarray, str]:
    """(U,) device per unit, and the rule applied."""
    rule = expert_rule_name(problem.graph.name)
    gpus = problem.gpu_indices()
    if not gpus:
        raise PlacerError(f"the expert placement needs GPUs; machine {problem.machine.name!r} has none")
    scope_device = {"rnnlm": _rnnlm_scopes, "nmt": _nmt_scopes, "inception-v3": _inception_scopes}[rule]
    op_device = _assign_by_scope(problem.graph.scopes, scope_device(problem, gpus))
    op_device = _propagate(problem, op_device, default=gpus[0])
    return problem.repair_allowed(problem.collapse(op_device)), rule


def _layer_indices(scopes: np.ndarray, prefix: str) -> list[int]:
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)(\.|$)")
    return sorted({int(m.group(1)) for s in set(scopes) if (m := pattern.match(s))})


def _spread(i: int, count: int, gpus: list[int]) -> int:
    return gpus[i * len(gpus) // count] if count >= len(gpus) else gpus[i]


def _rnnlm_scopes(problem: PlacementProblem, gpus: list[int]) -> dict[str, int]:
    layers = _layer_indices(problem.graph.scopes, "lstm.layer")
    if not layers:
        raise PlacerError(f"graph {problem.graph.name!r} has no 'lstm.layer<i>' scopes for the rnnlm rule")
    rule = {f"lstm.layer{i}": _spread(k, len(layers), gpus) for k, i in enumerate(layers)}
    rule["embed"] = rule[f"lstm.layer{layers[0]}"]
    rule["softmax"] = gpus[-1]
    return rule


def _nmt_scopes(problem: PlacementProblem, gpus: list[int]) -> dict[str, int]:
    rule = {}
    for side in ("encoder", "decoder"):
        layers = _layer_indices(problem.graph.scopes, f"{side}.layer")
        if not layers:
            raise PlacerError(f"graph {problem.graph.name!r} has no '{side}.layer<i>' scopes for the nmt rule")
        rule.update({f"{side}.layer{i}": _spread(k, len(layers), gpus) for k, i in enumerate(layers)})
        rule[f"{side}.embed"] = rule[f"{side}.layer{layers[0]}"]
    rule["attention"] = gpus[-1]
    rule["softmax"] = gpus[-1]
    return rule


def _inception_scopes(problem: PlacementProblem, gpus: list[int]) -> dict[str, int]:
    graph = problem.graph
    forward = graph.phases[graph.topo_order] == PHASE_CODE["forward"]
    layers: list[str] = []
    seen: set[str] = set()
    for op in graph.topo_order[forward]:
        top = graph.scopes[op].split(".")[0]
        if top and top not in seen:
            seen.add(top)
            layers.append(top)
    if not layers:
        raise PlacerError(f"graph {graph.name!r} has no scoped forward ops for the inception-v3 rule")
    return {layer: gpus[i * len(gpus) // len(layers)] for i, layer in enumerate(layers)}


def _assign_by_scope(scopes: np.ndarray, rule: dict[str, int]) -> np.ndarray:
    """(N,) device of the longest rule prefix matching each op's scope (on dots), -1 where none."""
    device = np.full(len(scopes), -1, dtype=np.int64)
    for i, scope in enumerate(scopes):
        parts = scope.split(".")
        for cut in range(len(parts), 0, -1):
            hit = rule.get(".".join(parts[:cut]))
            if hit is not None:
                device[i] = hit
                break
    return device


def _propagate(problem: PlacementProblem, device: np.ndarray, default: int) -> np.ndarray:
    """Fill -1 entries from the largest input's producer (topological pass), then from the largest
    output's consumer (reverse pass), then ``default``."""
    graph = problem.graph
    device = device.copy()
    pred_off, pred_ids = graph.pred_csr
    succ_off, _ = graph.succ_csr
    for op in graph.topo_order:
        if device[op] < 0:
            edges = pred_ids[pred_off[op]:pred_off[op + 1]]
            edges = edges[device[graph.edge_src[edges]] >= 0]
            if len(edges):
                device[op] = device[graph.edge_src[edges[np.argmax(graph.edge_bytes[edges])]]]
    for op in graph.topo_order[::-1]:
        if device[op] < 0:
            edges = np.arange(succ_off[op], succ_off[op + 1])
            edges = edges[device[graph.edge_dst[edges]] >= 0]
            if len(edges):
                device[op] = device[graph.edge_dst[edges[np.argmax(graph.edge_bytes[edges])]]]
    device[device < 0] = default
    return device
