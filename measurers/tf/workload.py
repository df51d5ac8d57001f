"""The real TensorFlow training step behind an imported Keras graph, as a GraphDef with named nodes.

``TFWorkload.build() -> (model, inputs, targets[, loss])`` as a Keras spec returns it (see
`graphs.tf.importer.import_keras_spec`); ``tf_workload_from_graph`` finds it from ``graph.meta``. A model
compiled with an optimizer trains with it (as the importer does); otherwise with Adam.
``trace_step(workload, seed)`` builds the same training step the importer traces (forward, loss,
GradientTape gradients, ``optimizer.apply_gradients``) as a concrete ``tf.function``, imports it with the
importer's own code, and keeps, for every op of that import, the GraphDef node it came from, so a
placement of the graph can be written onto the nodes. ``trace_model_step`` does the same for a model
already built (`measurers.tf.apply` traces the user's own model and data with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph
from measurers.tf.graph_def import attribute_runs, call_names, flattened_name, lowered_names, step_nodes


@dataclass(frozen=True)
class TFWorkload:
    build: Callable[[], tuple]  # () -> (model, inputs, targets[, loss])
    origin: str = ""


@dataclass
class TracedStep:
    concrete: object  # the concrete tf.function of the step
    graph: OpGraph  # the importer's graph of ``concrete``
    node_of_op: list[str]  # (N,) GraphDef node name of every graph op (flattened names for inlined ops)
    args: list  # numpy values of the step's arguments (inputs, targets), seeded
    variables: dict  # captured placeholder node name -> tf.Variable
    resource_of: dict  # graph op -> the Variable op whose resource it takes as an input
    slot_owner: dict  # captured variable node with no graph op (an optimizer slot) -> its parameter's Variable op
    lowered: dict  # graph_def.lowered_names of the step: how TensorFlow names its control flow's functions
    calls: frozenset[str] = frozenset()  # graph_def.call_names of the step: its function calls' nodes

    def node_of_run(self, run_name: str) -> str:
        """The ``node_of_op`` name of a node TensorFlow ran, by the name its step stats give
        (``cond/then/_0/X`` is ``cond/<then function>/X``: graph_def.flattened_name)."""
        return flattened_name(run_name, self.lowered)

    def nodes_of_runs(self, run_names: Iterable[str]) -> tuple[dict[str, str], frozenset[str]]:
        """(step-stats name -> ``node_of_op`` name, for the names of one step's stats that tell one node;
        the ``node_of_op`` names that no name tells alone: inside calls TensorFlow ran uninlined, or sharing a
        name with one of their ops: graph_def.attribute_runs)."""
        found = attribute_runs(run_names, set(self.node_of_op), self.lowered, self.calls)
        told, prefixes = set(found.attributed.values()), tuple(f"{call}/" for call in found.uninlined)
        inside = {node for node in self.node_of_op if node.startswith(prefixes)}
        return found.attributed, frozenset((inside | found.shared) - told)

    def effective_placement(self, placement):
        """TensorFlow runs an op that takes a resource where the resource lives (its placer overrides the
        device asked for): ``placement`` with those ops moved to their Variable op's device."""
        effective = np.array(placement, dtype=np.int64)  # (N,)
        for op, variable_op in self.resource_of.items():
            effective[op] = effective[variable_op]
        return effective


def tf_workload_from_graph(graph: OpGraph) -> TFWorkload:
    """The step behind ``graph``: a built-in Keras benchmark (``meta["keras_step"]``: its step function and
    settings) or a graph imported from a Keras spec (``meta["keras_spec"]``)."""
    step = graph.meta.get("keras_step")
    if isinstance(step, dict) and step.get("function"):
        if not isinstance(step["function"], str) or not isinstance(step.get("kwargs", {}), dict):
            raise PlacerError(f"graph {graph.name!r}: meta['keras_step'] is {step!r}, not a step function's "
                              "name (a string) with its keyword arguments (an object)")
        from graphs.specs import spec_function

        function, _ = spec_function(step["function"], "keras")
        kwargs = dict(step.get("kwargs", {}))
        return TFWorkload(lambda: function(**kwargs), f"{step['function']} {kwargs}")
    spec = graph.meta.get("keras_spec")
    if spec and not isinstance(spec, str):
        raise PlacerError(f"graph {graph.name!r}: meta['keras_spec'] is {spec!r}, not a spec (FILE.py:FUNCTION)")
    if not spec:
        raise PlacerError(f"graph {graph.name!r} (source {graph.source!r}) cannot be rebuilt as a real TensorFlow "
                          "step: the tf measurer needs a Keras benchmark or a graph imported from a Keras spec")
    from graphs.tf.importer import keras_example

    batch_size = graph.meta.get("keras_batch_size") or graph.batch_size  # a bare model's made-up batch
    return TFWorkload(lambda: keras_example(spec, batch_size), spec)


def trace_step(workload: TFWorkload, seed: int = 0) -> TracedStep:
    """A fresh Keras session, the seed set, the workload built, its step traced (``trace_model_step``), on
    the CPU: the eager model and optimizer variables live as long as the measurer's traced step (they hold
    its initial values), and with no device scope they sat on GPU:0 and counted in every placement's peak."""
    import keras
    import tensorflow as tf

    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    with tf.device(TRACE_DEVICE):
        result = workload.build()
        model, inputs, targets, loss = (*result, None) if len(result) == 3 else result
        return trace_model_step(model, inputs, targets, loss, seed)


TRACE_DEVICE = "/device:CPU:0"  # where trace_step's eager variables live (a placement sets every node's own)


def trace_model_step(model, inputs, targets, loss=None, seed: int = 0, args: list | None = None) -> TracedStep:
    """The training step of ``model`` (its compiled optimizer, else Adam) as a TracedStep. ``args``: the
    numpy values the step is fed (inputs, then targets, flattened); default seeded values of their shapes."""
    import tensorflow as tf

    from graphs.tf.assemble import build_opgraph
    from graphs.tf.flatten import flatten_graph
    from graphs.tf.importer import build_on, keras_train_step, leading_dim, tensor_spec_of

    batch = leading_dim(inputs) or 1
    specs = [tf.nest.map_structure(lambda x: tensor_spec_of(x, batch), example) for example in (inputs, targets)]
    build_on(model, specs[0])
    train_step, optimizer = keras_train_step(model, loss)
    concrete = tf.function(train_step, autograph=False).get_concrete_function(*specs)
    flat = flatten_graph(concrete.graph, batch, drop_dead=True)  # as the importer's Keras steps
    original = [op.name for op in flat]
    graph = build_opgraph(flat, concrete, name="tf-step", batch_size=batch, scope_map={}, source="",
                          optimizer_variables=optimizer.variables)
    renamed = {op.name: name for op, name in zip(flat, original)}
    if args is None:
        rng = np.random.default_rng(seed)
        args = [_seeded(rng, t) for t in concrete.graph.inputs[: len(tf.nest.flatten(specs))]]
    handles = {id(v.handle): v for v in concrete.graph.variables}
    captured = {internal.op.name: handles[id(external)] for external, internal in concrete.graph.captures
                if id(external) in handles}
    node_of_op = [renamed[name] for name in graph.op_names]
    nodes = step_nodes(concrete.graph.as_graph_def())
    slots = slot_owners(nodes, node_of_op, captured, graph)
    return TracedStep(concrete, graph, node_of_op, args, captured,
                      _resource_consumers(nodes, node_of_op, captured, slots), slots, lowered_names(nodes),
                      call_names(nodes))


def slot_owners(nodes: list, node_of_op: list[str], captured: dict, graph: OpGraph) -> dict[str, int]:
    """Captured variable node with no graph op -> the Variable op the importer merged it into. An optimizer's
    slot (Adam's momentum, velocity) has no op of its own: the ops that take its resource are colocated with
    its parameter's Variable op, the one Variable op of their colocation group. Left without a device, the
    slot sat beside its first reader and TensorFlow ran its writers there, not where the placement said."""
    op_of_node = {node: i for i, node in enumerate(node_of_op)}
    variables_of_group: dict[int, list[int]] = {}
    for op in np.flatnonzero(graph.op_kinds == "Variable").tolist():
        variables_of_group.setdefault(int(graph.colocation[op]), []).append(op)
    candidates: dict[str, set[int]] = {}  # slot -> the Variable ops colocated with every op taking it
    for found in nodes:
        op = op_of_node.get(found.name)
        group = set(variables_of_group.get(int(graph.colocation[op]), ())) if op is not None else set()
        for source in found.data_sources:
            if group and source in captured and source not in op_of_node:
                candidates[source] = candidates.get(source, group) & group
    return {slot: owners.pop() for slot, owners in candidates.items() if len(owners) == 1}


def _resource_consumers(nodes: list, node_of_op: list[str], captured: dict, slots: dict[str, int]) -> dict[int, int]:
    """Graph op -> the Variable op whose resource is its first resource input (inside a function: the
    argument the caller passes it; a slot's: its parameter's, ``slot_owners``), for the ops that take one;
    ``nodes``: the step's ``step_nodes``."""
    op_of_node = {node: i for i, node in enumerate(node_of_op)}
    variable_op = {**slots, **{node: op for node, op in op_of_node.items() if node in captured}}
    owners = {}
    for found in nodes:
        op = op_of_node.get(found.name)
        sources = [s for s in found.data_sources if s in variable_op]
        if op is not None and sources:
            owners[op] = variable_op[sources[0]]
    return owners


def _seeded(rng: np.random.Generator, placeholder) -> np.ndarray:
    shape, dtype = placeholder.shape.as_list(), placeholder.dtype.as_numpy_dtype
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)
