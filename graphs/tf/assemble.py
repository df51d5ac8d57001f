"""Assemble an OpGraph from the flattened ops of a TensorFlow training step.

The concrete function's graph is flattened (library functions and control flow inlined, identities
collapsed, constants dropped, and for a Keras step the ops TensorFlow never runs; see ``graphs.tf.flatten``)
and every remaining op becomes an OpGraph op:

- kind: the TF op type; FLOPs from ``graphs.tf.costs``; bytes_accessed = input + output bytes. Both are
  multiplied by the op's runs per step, the trip counts of the while loops around it where they are static
  (``graphs.tf.flatten``; in a loop whose variables change shape, the sum over its iterations at their sizes);
  out_bytes are one run's (a loop reuses its buffers each iteration; the largest run's).
- Variables: each captured trainable variable becomes one op of kind "Variable" whose ``param_bytes`` are
  weight + gradient + optimizer slot bytes (Adam: m and v, so 4x the weight bytes). An optimizer slot is
  found structurally: a non-trainable variable written from the model's data (its variable's gradient)
  whose data flows into the update of exactly one trainable variable. Its handle is merged into that
  Variable op. Other variables (BatchNorm moving statistics, the optimizer's step counter and learning
  rate, whatever the number of trainable variables) become ops of kind "VarHandleOp" holding their own bytes.
  Edges out of a variable carry the bytes of the value behind the handle.
- Colocation: a variable with every op that reads or writes it, the update arithmetic that feeds only its
  update, and the graph's own ``_class = loc:@...`` constraints.
- Phases: backward = ops under a ``gradient_tape/`` or ``gradients/`` name scope (where TensorFlow puts
  every op a tape or ``tf.gradients`` adds), ops that wait for a gradient through a data or a control edge and
  feed such an op (a custom gradient's body, ``tf.nn.silu``'s, which TensorFlow names at the graph's root),
  and what feeds only that work; update = ops that write a trainable variable or its slots,
  non-backward ops downstream of a gradient, control-flow joins whose branches end in updates (a
  LossScaleOptimizer's conds), and ops that only feed updates; Variables, state and inputs are "other"; the
  rest is forward.
- Scopes: an op's Keras layer (the layer whose call opened the name scope it is in, ``_layer_scope``), else its
  TF name scope. A gradient op outside the tape's scope (a custom gradient's body at the root; the gradient of a
  function TensorFlow calls, "PartitionedCall/gradients/convolution_grad", as Keras's grouped Conv2D under
  jit_compile is) takes the layer of the forward op it differentiates (``_scope_loose_gradients``).
- allowed_mask: CPU only for op types with no registered GPU kernel.
- meta["ops_without_flops"]: {op type: count} of the ops whose 0 FLOPs is a type ``graphs.tf.costs`` does
  not know (``without_flops``), as the ONNX and OpenVINO importers record theirs.
- meta["loop_trips"]: {loop op name: trip count} of the while loops whose trip count is static (per run of
  the loop, so a nested loop's own count); meta["loops_counted_once"]: how many while loops have none (their
  bodies' FLOPs and bytes are one iteration's, ``graphs.tf.flatten``). Each absent when there are none.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from graphs.inference.flops import sorted_counts
from graphs.opgraph import ANY_DEVICE, PHASE_CODE, OpGraph, colocation_groups, kind_bit, unique_name
from graphs.tf.flatten import BRANCH_KINDS, CASE_KINDS, LOOP_KINDS, RESOURCE_EDGE, FlatOp

GRADIENT_SCOPE = re.compile(r"(gradient_tape|gradients)(_\d+)?")
PARAM, STATE, INPUT, OP = "Variable", "VarHandleOp", "Input", ""
JOIN_KINDS = frozenset(BRANCH_KINDS) | CASE_KINDS | LOOP_KINDS  # what an inlined control-flow op leaves


@dataclass(frozen=True)
class VariableLabel:
    """How a Keras layer's variable is named in the graph. A subclassed model builds its layers inside its
    own first call, so TensorFlow names their variables after the model alone ("net/kernel_1"); Keras's
    path and the layer that owns the variable say which layer's it is."""
    name: str  # the Variable op's name: Keras's path of the variable, e.g. "net/fc1/kernel"
    scope: str | None  # dotted path of the owning layer's first call ("fc1"; "" the model's own); None: not called


def build_opgraph(flat: list[FlatOp], concrete_function, *, name: str, batch_size: int,
                  scope_map: dict[str, str], source: str, optimizer_variables=(),
                  variable_labels: dict[int, VariableLabel] | None = None) -> OpGraph:
    """The OpGraph of ``flat`` (the flattened graph of ``concrete_function``). Writes to
    ``optimizer_variables`` (e.g. a Keras optimizer's step counter) count as updates. ``variable_labels``
    ({id of a tf.Variable's handle: VariableLabel}) names and scopes those variables' ops; any other
    variable is named by TensorFlow and scoped by its name (``_layer_scope``)."""
    optimizer_handles = {id(v.handle) for v in _tf_variables(optimizer_variables)}
    optimizer_states = {i for i, h in _captured_handles(flat, concrete_function) if h in optimizer_handles}
    roles, value_bytes, numels, labeled = _classify_resources(flat, concrete_function, variable_labels or {})
    owner = _assign_slots(flat, roles)
    return _assemble(flat, roles, owner, value_bytes, name=name, batch_size=batch_size,
                     num_params=sum(numels[i] for i, r in enumerate(roles) if r == PARAM),
                     scope_map=scope_map, source=source, optimizer_states=optimizer_states,
                     variable_scopes={i: label.scope for i, label in labeled.items() if label.scope is not None})


def _tf_variables(variables) -> list:
    """tf.Variables behind Keras 3 variables (their ``.value``) or tf.Variables themselves."""
    out = []
    for v in variables:
        inner = getattr(v, "value", None)
        out.append(inner if hasattr(inner, "handle") else v)
    return [v for v in out if hasattr(v, "handle")]


def _captured_handles(flat: list[FlatOp], concrete_function) -> list[tuple[int, int]]:
    """(flat id, id of the captured handle) for each top-level resource argument."""
    placeholder_to_handle = {internal.op.name: id(external) for external, internal in
                             concrete_function.graph.captures}
    return [(i, placeholder_to_handle[op.name]) for i, op in enumerate(flat)
            if op.is_argument and op.resource_output and op.name in placeholder_to_handle]


def _classify_resources(flat: list[FlatOp], concrete_function, labels: dict[int, VariableLabel]):
    """Role of every flat op (PARAM, STATE, INPUT or OP), bytes and element count behind each handle, and
    the VariableLabel of each variable op ``labels`` names (by its handle's id); renames variable ops."""
    by_handle = {id(v.handle): v for v in concrete_function.graph.variables}
    by_placeholder = {}
    for external, internal in concrete_function.graph.captures:
        if id(external) in by_handle:
            by_placeholder[internal.op.name] = by_handle[id(external)]
    roles, value_bytes, numels = [OP] * len(flat), [0] * len(flat), [0] * len(flat)
    labeled: dict[int, VariableLabel] = {}
    taken = {op.name for op in flat}
    for i, op in enumerate(flat):
        if not op.is_argument:
            continue
        if not op.resource_output:
            roles[i] = INPUT
            continue
        variable = by_placeholder.get(op.name)
        roles[i] = PARAM if variable is not None and variable.trainable else STATE
        if variable is not None:
            label = labels.get(id(variable.handle))
            if label is not None:
                labeled[i] = label
            # a variable's name, e.g. "fc1/kernel"
            op.name = unique_name(label.name if label else variable.name.split(":")[0], taken)
            numels[i] = int(np.prod(variable.shape.as_list(), dtype=np.int64))
            value_bytes[i] = numels[i] * variable.dtype.size
    return roles, value_bytes, numels, labeled


def _assign_slots(flat: list[FlatOp], roles: list[str]) -> list[int]:
    """owner[i]: the op that stands for op i's handle (a slot's trainable variable; else i itself)."""
    consumers: list[list[int]] = [[] for _ in flat]
    for j, op in enumerate(flat):
        for pid, _ in op.inputs:
            consumers[pid].append(j)
    writes: list[set[int]] = [set() for _ in flat]  # trainable variables an op writes or applies to
    for j, op in enumerate(flat):
        if op.kind != "ReadVariableOp":
            writes[j] = {pid for pid, size in op.inputs if size == RESOURCE_EDGE and roles[pid] == PARAM}
    from_data = _from_model_data(roles, consumers)
    owner = list(range(len(flat)))
    for i, role in enumerate(roles):
        if role == STATE and any(from_data[c] for c in consumers[i] if _writes(flat[c], i)):
            targets = _written_downstream(i, consumers, writes)
            if len(targets) == 1:
                owner[i] = next(iter(targets))
    return owner


def _writes(op: FlatOp, state: int) -> bool:
    """``op`` writes (or applies an update to) the variable behind ``state``'s handle."""
    return op.kind != "ReadVariableOp" and (state, RESOURCE_EDGE) in op.inputs


def _from_model_data(roles: list[str], consumers: list[list[int]]) -> list[bool]:
    """from_data[j]: op j is a data-descendant of an input or a trainable variable. A slot is written from
    its variable's gradient, so from the model's data; an optimizer-level scalar is not (the step counter
    from itself, the learning rate not at all), so it is never a slot, even of a model's only variable."""
    from_data = [False] * len(roles)
    stack = [i for i, role in enumerate(roles) if role in (INPUT, PARAM)]
    while stack:
        for c in consumers[stack.pop()]:
            if not from_data[c]:
                from_data[c] = True
                stack.append(c)
    return from_data


def _written_downstream(start: int, consumers: list[list[int]], writes: list[set[int]]) -> set[int]:
    """Trainable variables written by data-descendants of ``start`` (stops once two are found)."""
    found: set[int] = set()
    seen, stack = {start}, [start]
    while stack and len(found) < 2:
        for c in consumers[stack.pop()]:
            if c not in seen:
                seen.add(c)
                found |= writes[c]
                stack.append(c)
    return found


def _assemble(flat, roles, owner, value_bytes, *, name, batch_size, num_params, scope_map, source,
              optimizer_states, variable_scopes) -> OpGraph:
    keep = [i for i in range(len(flat)) if owner[i] == i]
    index = {old: new for new, old in enumerate(keep)}
    param_bytes = np.zeros(len(keep), dtype=np.int64)  # (N,)
    for i, role in enumerate(roles):
        if role == PARAM:
            param_bytes[index[i]] += 2 * value_bytes[i]  # weights + gradient
        elif role == STATE:
            param_bytes[index[owner[i]]] += value_bytes[i]  # slot (merged) or standalone state
    edges = _edges(flat, keep, owner, index, value_bytes)
    kinds = [roles[i] if roles[i] != OP else flat[i].kind for i in keep]
    out_bytes = [value_bytes[i] if roles[i] in (PARAM, STATE) else flat[i].out_bytes for i in keep]
    accessed = [0 if roles[i] in (PARAM, STATE) else flat[i].runs * (flat[i].data_bytes()
                + sum(value_bytes[p] for p, s in flat[i].inputs if s == RESOURCE_EDGE)) for i in keep]
    data_edges = [(s, d) for s, d, _, is_data in edges if is_data]
    control_edges = [(s, d) for s, d, _, is_data in edges if not is_data]
    succ, pred = _adjacency(len(keep), data_edges)  # data edges only: what an op reads, and who reads it
    phases, gradient_sums = _phases(flat, keep, roles, owner, index, succ, pred, control_edges, optimizer_states)
    updates = _single_variable_updates(flat, keep, roles, owner, index, phases, succ, pred)
    layers = [variable_scopes[i] if i in variable_scopes else
              _layer_scope(flat[i], scope_map, roles[i] in (PARAM, STATE)) for i in keep]
    scopes = [layer if layer is not None else _name_scope(flat[i]) for i, layer in zip(keep, layers)]
    _scope_gradient_sums(scopes, gradient_sums, updates, data_edges)
    _scope_loose_gradients(flat, keep, scopes, [layer is not None for layer in layers], phases, data_edges, succ,
                           pred)
    return OpGraph(
        name=name, framework="tensorflow",
        op_names=np.array([flat[i].name for i in keep], dtype=object),
        op_kinds=np.array(kinds, dtype=object),
        flops=np.array([flat[i].flops * flat[i].runs for i in keep], dtype=np.float64),
        bytes_accessed=np.array(accessed, dtype=np.float64), out_bytes=np.array(out_bytes, dtype=np.int64),
        param_bytes=param_bytes,
        edge_src=np.array([e[0] for e in edges], dtype=np.int64),
        edge_dst=np.array([e[1] for e in edges], dtype=np.int64),
        edge_bytes=np.array([e[2] for e in edges], dtype=np.int64),
        colocation=_colocation(flat, keep, roles, owner, index, updates),
        scopes=np.array(scopes, dtype=object),
        phases=phases, allowed_mask=np.array([_allowed_mask(k) for k in kinds], dtype=np.uint8),
        batch_size=batch_size, num_params=num_params, source=source,
        meta=_meta(flat, keep),
    )


def _meta(flat: list[FlatOp], keep: list[int]) -> dict:
    """What the cost model missed: ``ops_without_flops``, and ``loops_counted_once`` (while loops without a
    static trip count, whose body counts one iteration) when there are any; ``loop_trips`` {loop: trip count}
    for the loops whose body counts that many iterations, when there are any."""
    meta: dict = {"ops_without_flops": _ops_without_flops(flat, keep)}
    loops = [flat[i] for i in keep if flat[i].kind in LOOP_KINDS]  # each inlined loop's join op keeps its kind
    counted_once = sum(1 for loop in loops if loop.trips is None)
    if counted_once:
        meta["loops_counted_once"] = counted_once
    trips = {loop.name: loop.trips for loop in loops if loop.trips is not None}
    if trips:
        meta["loop_trips"] = trips
    return meta


def _ops_without_flops(flat: list[FlatOp], keep: list[int]) -> dict[str, int]:
    """{op type: count} of the kept ops whose FLOPs the cost model does not know, sorted by type."""
    return sorted_counts(Counter(flat[i].kind for i in keep if flat[i].without_flops))


def _edges(flat, keep, owner, index, value_bytes) -> list[tuple[int, int, int, bool]]:
    """(src, dst, bytes, is_data) in new ids; control edges carry 0 bytes."""
    edges = []
    for i in keep:
        dst = index[i]
        for pid, size in flat[i].inputs:
            src = index[owner[pid]]
            if src != dst:
                edges.append((src, dst, value_bytes[pid] if size == RESOURCE_EDGE else size, True))
        for pid in flat[i].control_inputs:
            src = index[owner[pid]]
            if src != dst:
                edges.append((src, dst, 0, False))
    return edges


def _adjacency(n: int, edges) -> tuple[list[list[int]], list[list[int]]]:
    """(successors, predecessors) of each of ``n`` ops along ``edges`` ((src, dst) pairs, in their order)."""
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges:
        succ[s].append(d)
        pred[d].append(s)
    return succ, pred


def _phases(flat, keep, roles, owner, index, succ, pred, control_edges,
            optimizer_states) -> tuple[np.ndarray, list[int]]:
    """Each op's phase (see the module's docstring), and the ops that sum a weight's gradients (``_sums_gradients``).
    ``succ``/``pred``: the data edges' adjacency (``_adjacency``)."""
    n = len(keep)
    phase = np.full(n, PHASE_CODE["forward"], dtype=np.int8)  # (N,)
    after: list[list[int]] = [list(p) for p in pred]  # data and control predecessors: what an op waits for
    later: list[list[int]] = [list(c) for c in succ]
    for s, d in control_edges:
        after[d].append(s)
        later[s].append(d)
    fixed = np.zeros(n, dtype=bool)  # (N,) phase decided by a rule that later rules must not override
    for new, old in enumerate(keep):
        if roles[old] != OP:
            phase[new], fixed[new] = PHASE_CODE["other"], True
        elif any(GRADIENT_SCOPE.fullmatch(part) for part in flat[old].name.split("/")[:-1]):
            phase[new], fixed[new] = PHASE_CODE["backward"], True
        elif any(s == RESOURCE_EDGE and roles[owner[p]] == PARAM for p, s in flat[old].inputs) \
                and flat[old].kind != "ReadVariableOp":
            phase[new], fixed[new] = PHASE_CODE["update"], True
    order = _topo(n, later, after)  # a control predecessor comes first too
    update, backward = PHASE_CODE["update"], PHASE_CODE["backward"]
    feeds_backward = np.zeros(n, dtype=bool)  # (N,) some data-descendant is a gradient-scoped op
    feeds_write = np.zeros(n, dtype=bool)  # (N,) some data-descendant writes a parameter
    for j in reversed(order):
        feeds_backward[j] = any(phase[c] == backward and fixed[c] or feeds_backward[c] for c in succ[j])
        feeds_write[j] = any(phase[c] == update and fixed[c] or feeds_write[c] for c in succ[j])
    # Downstream of a gradient: more gradient work (e.g. the tape's AddN) or the optimizer. A gradient op made of
    # constants alone is no gradient: the TensorList a forward while loop fills for its gradient loop to pop. An op
    # that waits for a gradient through a control edge runs after it too: a custom gradient's body waits for the
    # incoming gradient so ("mul" under ``tf.nn.silu``'s, at the graph's root like all its ops).
    gradient_sums = []
    for j in order:
        if not fixed[j] and any(phase[p] == update or phase[p] == backward and pred[p] for p in after[j]):
            if feeds_backward[j]:
                phase[j] = backward
            elif _sums_gradients(flat[keep[j]], pred[j], phase):
                phase[j], fixed[j] = backward, True
                gradient_sums.append(j)
            elif feeds_write[j]:
                phase[j] = update
    # What feeds only that gradient work is part of it: the rest of a custom gradient's body, which reads the
    # forward values alone ("mul_1", silu's x times beta). A forward value the tape's gradient ops read (what a
    # forward loop pushes for its gradient loop to pop) stays forward: gradient-scoped readers are fixed.
    for j in reversed(order):
        if not fixed[j] and phase[j] == PHASE_CODE["forward"] and succ[j] \
                and all(phase[c] == backward and not fixed[c] for c in succ[j]):
            phase[j] = backward
    for _ in range(2):  # ops that only feed updates (learning-rate schedules, step counter reads)
        _mark_update_joins(flat, keep, owner, index, phase, fixed)
        for j in reversed(order):
            if not fixed[j] and succ[j] and all(phase[c] == update for c in succ[j]):
                phase[j] = update
        _mark_state_writers(flat, keep, roles, owner, index, phase, fixed, succ, optimizer_states)
    return phase, gradient_sums


def _sums_gradients(op: FlatOp, pred: list[int], phase: np.ndarray) -> bool:
    """``op`` is the tape's sum of one weight's gradients, one per call of a layer called more than once (a shared
    layer): an AddN of gradient ops alone. The tape adds it outside its ``gradient_tape/`` scope, in no layer's."""
    return op.kind == "AddN" and bool(pred) and all(phase[p] == PHASE_CODE["backward"] for p in pred)


def _scope_gradient_sums(scopes: list[str], gradient_sums: list[int], updates: list[tuple[int, int]],
                         data_edges: list[tuple[int, int]]) -> None:
    """A weight's summed gradient (``_sums_gradients``) takes the scope of the weight whose update it feeds: the
    layer that owns it, whose backward work it is (a sum feeding several weights' updates keeps its own)."""
    target = dict(updates)  # {update op: the one trainable variable it updates}
    sums = set(gradient_sums)
    weights: dict[int, set[int]] = {j: set() for j in gradient_sums}
    for s, d in data_edges:
        if s in sums and d in target:
            weights[s].add(target[d])
    for j, found in weights.items():
        if len(found) == 1:
            scopes[j] = scopes[next(iter(found))]


def _mark_update_joins(flat, keep, owner, index, phase, fixed) -> None:
    """A control-flow join whose branches end in updates is one: a LossScaleOptimizer's cond that applies
    the step or shrinks the loss scale, and the one that grows it. Its predicate (the gradients' finite
    check) then only feeds updates. Joins come after their branches, so nested ones are seen first."""
    update = PHASE_CODE["update"]
    for j, old in enumerate(keep):
        op = flat[old]
        if fixed[j] or op.kind not in JOIN_KINDS:
            continue
        if any(phase[index[owner[p]]] == update for p in op.control_inputs):
            phase[j] = update


def _mark_state_writers(flat, keep, roles, owner, index, phase, fixed, succ, optimizer_states) -> None:
    """A write to optimizer state (known optimizer variables, or state an update reads) is an update."""
    optimizer_ids = {index[owner[i]] for i in optimizer_states}
    update = PHASE_CODE["update"]
    for j in range(len(keep)):
        op = flat[keep[j]]
        if fixed[j] or op.kind == "ReadVariableOp":
            continue
        states = [index[owner[p]] for p, s in op.inputs if s == RESOURCE_EDGE and roles[owner[p]] == STATE]
        if any(s in optimizer_ids or any(phase[c] == update for c in succ[s]) for s in states):
            phase[j] = update


def _topo(n: int, succ: list[list[int]], pred: list[list[int]]) -> list[int]:
    indegree = [len(p) for p in pred]
    ready = [j for j in range(n) if indegree[j] == 0]
    order = []
    while ready:
        j = ready.pop()
        order.append(j)
        for c in succ[j]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    return order


def _colocation(flat, keep, roles, owner, index, single_variable_updates) -> np.ndarray:
    pairs: list[tuple[int, int]] = []
    by_name = {flat[old].name: new for new, old in enumerate(keep)}
    for new, old in enumerate(keep):
        for p, size in flat[old].inputs:  # reads and writes of a parameter; writes of other state
            is_read = flat[old].kind == "ReadVariableOp"
            if size == RESOURCE_EDGE and (roles[owner[p]] == PARAM or roles[owner[p]] == STATE and not is_read):
                pairs.append((new, index[owner[p]]))
        for target in flat[old].colocate_with:
            if target in by_name:
                pairs.append((new, by_name[target]))
    pairs += single_variable_updates
    return colocation_groups(len(keep), pairs)  # (N,)


def _single_variable_updates(flat, keep, roles, owner, index, phases, succ, pred):
    """(op, variable) for update ops whose outputs flow only into the update of one trainable variable."""
    n, update = len(keep), PHASE_CODE["update"]
    none, many = -1, -2
    target = [none] * n
    for j in reversed(_topo(n, succ, pred)):
        if phases[j] != update:
            continue
        op = flat[keep[j]]
        mine = {index[owner[p]] for p, s in op.inputs if s == RESOURCE_EDGE and roles[owner[p]] == PARAM}
        mine |= {target[c] for c in succ[j] if phases[c] == update and target[c] != none}
        target[j] = many if len(mine) > 1 or many in mine else (next(iter(mine)) if mine else none)
    return [(j, target[j]) for j in range(n) if target[j] >= 0]


def _name_scope(op: FlatOp) -> str:
    """The dotted TF name scope of an op that maps to no Keras layer (less the gradient scopes in front)."""
    return ".".join(_scope_parts(op.name))


def _layer_scope(op: FlatOp, scope_map: dict[str, str], variable: bool = False) -> str | None:
    """Dotted path of the op's mapped Keras layer ("" the model's own), or None if it maps to none. An op inside control
    flow is looked up by its own name too: a cond's branch opens its scopes under the cond's ("cond/adam", the
    optimizer a LossScaleOptimizer applies in its cond; "net_1/cond/d1_1", a layer a model calls in a branch), not
    under the flattened "cond/then/" it is named by, so the flattened name finds at most the scope around the cond
    (the model's root, ""). The longer match wins. Only there: a variable renamed by its Keras path keeps the scope
    of that path, not that of the layer that read it (the name it had, "res/drop/ReadVariableOp")."""
    mapped = _mapped_prefix(_scope_parts(op.name), scope_map, variable)
    in_a_function = op.own_name and op.own_name != op.name and op.name.endswith("/" + op.own_name)
    if in_a_function:
        own = _mapped_prefix(_forward_parts(op.own_name), scope_map, variable)
        if own is not None and (mapped is None or own.depth > mapped.depth):
            mapped = own
    return mapped.scope if mapped is not None else None


def _scope_loose_gradients(flat, keep, scopes: list[str], layered: list[bool], phases: np.ndarray,
                           data_edges: list[tuple[int, int]], succ, pred) -> None:
    """A loose gradient op (backward, in no layer's scope: not ``layered``) takes the layer of the forward op it
    differentiates. TensorFlow names such ops outside the tape's scope: a custom gradient's body at the graph's root
    (``tf.nn.silu``'s "mul", "Sigmoid", ...), the gradient of a function it calls in a function of its own
    ("PartitionedCall/gradients/convolution_grad/Conv2DBackpropFilter": Keras's grouped Conv2D under jit_compile).
    The ops of one such gradient are those joined by data edges within one name scope; they read the values the
    forward op read (its inputs: silu's x; the convolution's input and filter). The forward op is the one that reads
    them all, and its layer (``layered``) is theirs when all such readers are in one: silu's mul and Sigmoid in the
    Dense layer that applies it, the convolution in its Conv2D. Otherwise the ops keep their name scope. The tape's
    sums of gradients (``_sums_gradients``: a weight's, or those of a value several ops read) are no such op.
    ``succ``/``pred``: the data edges' adjacency (``_adjacency``)."""
    n, forward = len(scopes), PHASE_CODE["forward"]
    loose = [not layered[j] and phases[j] == PHASE_CODE["backward"] and not _sums_gradients(flat[i], pred[j], phases)
             for j, i in enumerate(keep)]
    gradient = colocation_groups(n, [(s, d) for s, d in data_edges  # (N,) one gradient's ops: one id
                                     if loose[s] and loose[d] and scopes[s] == scopes[d]])
    reads: dict[int, set[int]] = {}  # {a gradient's id: the forward ops it reads}
    for s, d in data_edges:
        if loose[d] and phases[s] == forward:
            reads.setdefault(int(gradient[d]), set()).add(s)
    layer_of: dict[int, str] = {}
    for gradient_id, values in reads.items():
        readers = set.intersection(*({c for c in succ[v] if phases[c] == forward and layered[c]} for v in values))
        found = {scopes[c] for c in readers}
        if len(found) == 1:
            layer_of[gradient_id] = found.pop()
    for j in range(n):
        if loose[j] and int(gradient[j]) in layer_of:
            scopes[j] = layer_of[int(gradient[j])]


@dataclass(frozen=True)
class _Mapped:
    """A recorded scope an op's name starts with: its dotted Keras path, and how many name parts it matched."""
    scope: str
    depth: int


def _mapped_prefix(parts: list[str], scope_map: dict[str, str], variable: bool) -> _Mapped | None:
    """The mapped Keras layer path of the longest recorded prefix of the op's scope ``parts``, or None. A variable
    is named by its Keras path ("model/fc1/kernel" in a Sequential model), not by a scope a layer call opened:
    under the root model's scope (mapped to "") the rest of its path is its layer."""
    for k in range(len(parts), 0, -1):
        mapped = scope_map.get("/".join(parts[:k]))
        if mapped is not None:
            rest = variable and mapped == "" and k < len(parts)
            return _Mapped(".".join(parts[k:]) if rest else mapped, len(parts) if rest else k)
    return None


def _forward_parts(own_name: str) -> list[str]:
    """The scope of a branch op by its own name, from its last gradient scope on: a cond's gradient branch names
    its ops by their forward ops' ("gradient_tape/net_1/cond/gradients/net_1/cond/d1_1/MatMul_grad/MatMul")."""
    parts = own_name.split("/")[:-1]
    last = max((i for i, part in enumerate(parts) if GRADIENT_SCOPE.fullmatch(part)), default=-1)
    return parts[last + 1:]


def _scope_parts(op_name: str) -> list[str]:
    """The op's TF name scope, less the gradient scopes in front (a gradient op is its forward op's scope's)."""
    parts = op_name.split("/")[:-1]
    while parts and GRADIENT_SCOPE.fullmatch(parts[0]):
        parts = parts[1:]
    return parts


@lru_cache(maxsize=None)
def _allowed_mask(kind: str) -> int:
    """CPU only when TensorFlow registers kernels for ``kind`` but none for GPU; any device otherwise."""
    from tensorflow.python.framework import kernels

    try:
        devices = {k.device_type for k in kernels.get_registered_kernels_for_op(kind).kernel}
    except Exception:  # noqa: BLE001  (an op type TF does not know: no constraint to honor)
        return ANY_DEVICE
    if devices and not devices & {"GPU", "DEFAULT"}:  # DEFAULT kernels run on every device type
        return kind_bit("cpu")
    return ANY_DEVICE
