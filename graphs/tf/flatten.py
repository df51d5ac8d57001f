"""Flatten a TensorFlow graph and its function library into one list of real ops.

Function calls (PartitionedCall, StatefulPartitionedCall, a library function used as an op type) are
inlined: the callee's ops become ops named ``<call op name>/<op name>`` whose inputs are the caller's.
Control flow (If/Case/While and their stateless forms) is inlined once per branch or body, and a zero-cost
join op named like the control-flow op collects the branch outputs. Identity-like ops are collapsed into their
input, NoOps into the control edges they stand for, and constants are dropped (they cost nothing and exist on
every device that needs them).

A while loop whose trip count is static (``graphs.tf.loops``: ``maximum_iterations``, autograph's ``for i in
tf.range(N)``, a counter compared with a constant or with shape arithmetic on static dims such as
``tf.shape(x)[0]``, and the gradients of such loops) gives each op of its body
``runs`` = that count (its cond's one more), times the runs of the loops around it; the OpGraph multiplies
their FLOPs and bytes accessed by it, and the join op keeps the count (``trips``). Approximations: an op's
output bytes stay one iteration's (a loop reuses its buffers; a TensorList accumulating every iteration's
value for the gradient grows, and that growth is not counted), and the edges into and out of the body are
crossed once, not once per iteration for the loop-carried values. A loop whose variables change shape (a relaxed
shape invariant, a tensor grown by ``tf.concat``) and whose trip count is static has its body walked at each
iteration's shapes (those the previous iteration's outputs have, until they stop changing; at most
MAX_FOLLOWED_ITERATIONS of them) and folded into one set of ops: FLOPs and bytes accessed are the exact sum over
the iterations, output and edge bytes the largest iteration's; its cond is costed at the shapes the variables
enter with (a counter's comparison). A loop whose trip count is not static (a
condition on the data, which may stop it early) runs its body once here, at the shapes its variables enter
with: ``trips`` None, ``runs`` unchanged. A gradient loop pops what its forward loop pushed; when that changed
shape, the element shape its accumulators record leaves the changing dims unknown, counted as the batch (leading)
or 1, not per iteration.
The static values the walk tracks for trip counts (``walk``'s ``values``) include those of real ops doing shape
arithmetic (a ``Shape`` op stays an op with its cost, and may also have a value); no dims are static inside a
loop whose variables may change shape (a relaxed shape invariant), and an unknown leading dim is the batch
only on an argument whose batch the step's signature left open (a tensor computed from it may have other rows:
a ``tf.boolean_mask``'s, a reshape's).
A function's arguments keep the handle data of resources and of TensorLists (variants), so the ops a gradient
loop pops from its forward loop's accumulators have static shapes. A loop nested in a loop keeps its inner loop's
accumulators in the outer loop's (a list of lists, whose handle data TensorFlow does not record): the walk
carries what it knows of them (``graphs.tf.lists``), so the inner gradient's pops have their shapes and the
inner forward loop's final counter, popped for the inner gradient's trip count, its static value.

Dead ops can be dropped too (``drop_dead=True``): ops from which no data or control path leads to the
step's outputs or control outputs (a tf.function makes every stateful op, so every variable write, a control
output). TensorFlow never runs them: grappler's model pruner keeps exactly the ops these need, and a Session
run on them does too. A training step's typical dead op is the gradient with respect to its input data
(the first convolution's ``Conv2DBackpropInput``), which the tape's gradient function makes and nothing reads.
Calls are inlined before the walk, so a callee's ops stay only where the step needs them, as in TensorFlow
once it has inlined the call; a callee's variable writes stay (they are its control outputs).

TensorFlow is only imported by callers; this module reads ``tf.Graph`` objects through their public
attributes and converts library functions with ``function_def_to_graph``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from graphs.errors import PlacerError
from graphs.tf.costs import FORMULA_ATTRS, op_flops, without_flops
from graphs.tf.lists import LIST_KINDS, facts_of, list_op_facts, loop_entry_facts, loop_exit_facts
from graphs.tf.loops import EVALUATED_KINDS, PASS_THROUGH_KINDS, loop_count, static_constant, static_outputs

COLLAPSED_KINDS = PASS_THROUGH_KINDS  # identity-like ops, which loops.py reads trip counts through too
DROPPED_KINDS = frozenset({"Const", "HostConst"})
CALL_KINDS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
BRANCH_KINDS = {"If": ("then_branch", "else_branch"), "StatelessIf": ("then_branch", "else_branch")}
LOOP_KINDS = frozenset({"While", "StatelessWhile"})
CASE_KINDS = frozenset({"Case", "StatelessCase"})
RESOURCE_EDGE = -1  # edge bytes placeholder for a resource handle, resolved to the variable's bytes later
MAX_FOLLOWED_ITERATIONS = 256  # the most iterations of a loop whose variables change shape walked at their shapes


class LoopShapeError(PlacerError):
    """An op inside a while loop has no static shapes (their rank is known only at run
    time): the Keras importer names the recurrent layers it left rolled, and why (``graphs.tf.recurrent``)."""


@dataclass
class FlatOp:
    name: str  # flattened TF name: caller op names joined with "/" in front of the op's own name
    kind: str  # TF op type
    flops: float
    in_bytes: int  # bytes of the data (non-resource) inputs
    out_bytes: int  # bytes of all outputs
    inputs: list[tuple[int, int]] = field(default_factory=list)  # (producer id, bytes or RESOURCE_EDGE)
    control_inputs: list[int] = field(default_factory=list)  # producer ids
    colocate_with: list[str] = field(default_factory=list)  # flattened names from "_class" = "loc:@..."
    resource_output: bool = False  # the op yields a resource handle (a captured variable)
    is_argument: bool = False  # a placeholder argument of the top-level function
    without_flops: bool = False  # its 0 FLOPs is a type the cost model does not know (graphs.tf.costs)
    runs: int = 1  # times the op runs per step: the product of the trip counts of the loops around it
    trips: int | None = None  # a while loop's join op: its static trip count (None: its body counted once)
    accessed_bytes: float | None = None  # bytes accessed per run where runs differ (the mean over the iterations
    # of a loop whose variables change shape); None: in_bytes + out_bytes
    own_name: str = ""  # its name in its own graph: inside a branch, under the name scopes open where the cond was
    # built ("cond/adam/Sub" for "cond/then/cond/adam/Sub"), which Keras's recorded scopes know

    def data_bytes(self) -> float:
        """Bytes of data one run reads and writes (resource reads aside)."""
        return self.in_bytes + self.out_bytes if self.accessed_bytes is None else self.accessed_bytes


def flatten_graph(graph, batch_size: int, drop_dead: bool = False, stable_names: bool = False) -> list[FlatOp]:
    """All real ops of ``graph`` (a tf.Graph / FuncGraph) with its library functions inlined; with
    ``drop_dead``, only those TensorFlow runs (see the module's docstring). An op inside control flow is named
    ``<control-flow op>/<function>/<op>``: with ``stable_names``, the function by its part, as TensorFlow's
    lowering names it (``then``, ``else``, ``branch<i>``, ``cond``, ``body``; ``call`` for a function used as an
    op type), not by its own name, which carries a counter of the process (``cond_true_238``), so that the same
    step gets the same names whatever the process traced before."""
    open_batch_args = frozenset(id(t) for t in getattr(graph, "inputs", ()) if _leading_dim_unknown(t))
    flattener = _Flattener(batch_size, open_batch_args, stable_names)
    src, done, _, _ = flattener.walk(graph, prefix="", bound=None, entry_ctrl=[])
    if not drop_dead:
        return flattener.ops
    results = [src.get(t.name, []) for t in graph.outputs]
    results += [done.get(op.name, []) for op in getattr(graph, "control_outputs", [])]
    return live_ops(flattener.ops, _union(results))


def live_ops(ops: list[FlatOp], results: list[int]) -> list[FlatOp]:
    """The ``results`` ops, the ops they need through data or control edges, and the step's arguments, in
    their order, renumbered. Arguments stay even when nothing reads them: they are the step's inputs and
    variables, not work."""
    live = [op.is_argument for op in ops]
    for i in results:
        live[i] = True
    stack = [i for i in range(len(ops)) if live[i]]
    while stack:
        op = ops[stack.pop()]
        for pid in [pid for pid, _ in op.inputs] + op.control_inputs:
            if not live[pid]:
                live[pid] = True
                stack.append(pid)
    index = {old: new for new, old in enumerate(i for i in range(len(ops)) if live[i])}
    return [replace(op, inputs=[(index[pid], size) for pid, size in op.inputs],
                    control_inputs=[index[pid] for pid in op.control_inputs])
            for i, op in enumerate(ops) if live[i]]


class _Flattener:
    def __init__(self, batch_size: int, open_batch_args: frozenset[int], stable_names: bool = False):
        self.batch_size = batch_size
        self.stable_names = stable_names  # name a control-flow callee's ops by its part, not its function
        self.open_batch_args = open_batch_args  # id() of the step's arguments whose leading dim (batch) is unknown
        self.ops: list[FlatOp] = []
        self.loop_depth = 0  # while-loop bodies being walked
        self.runs = 1  # times the ops being added run per step (the trip counts of the loops around them)
        self.loose_loops = 0  # loops being walked whose variables may change shape: no dims are static inside

    def static_dims(self, tensor) -> list | None:
        """``tensor``'s dims as shape arithmetic may read them (None for an unknown dim; None for an unknown
        rank or inside a loop whose variables may change shape, as a callee's arguments take the shapes they
        enter with). The unknown leading dim of an argument the step's signature left open is the batch,
        ``batch_size``; any other tensor's is unknown: a ``tf.unique``'s or ``tf.boolean_mask``'s rows are
        data-dependent, a ``tf.reshape(x, [-1])``'s a multiple of the batch."""
        if tensor.shape.rank is None or self.loose_loops:
            return None
        dims = tensor.shape.as_list()
        if dims and dims[0] is None and id(tensor) in self.open_batch_args:
            dims[0] = self.batch_size
        return dims

    def walk(self, graph, prefix: str, bound: list[list[int]] | None, entry_ctrl: list[int], bound_values=(),
             bound_lists=()):
        """Add the ops of ``graph``; ``bound`` maps each function argument to its producer ids, ``bound_values``
        to its static scalar value, ``bound_lists`` to its ListFacts (None where unknown). Returns (producer ids
        per output tensor name, done-ids per op name, static scalar values and ListFacts per tensor name)."""
        src: dict[str, list[int]] = {}  # tensor name -> producer ids
        done: dict[str, list[int]] = {}  # op name -> ids whose completion the op's completion implies
        values: dict[str, int | bool] = {}  # tensor name -> static value, for loop trip counts (graphs.tf.loops)
        lists: dict = {}  # tensor name -> ListFacts of a TensorList (graphs.tf.lists)
        # A function body's argument positions by tensor name, the replaced placeholders' names included: an
        # output passing its argument through (a tape's forward function hands its inputs to the backward) names
        # the placeholder the import replaced, and lost the edge from the argument's producer.
        args = (getattr(graph, "arg_index", None) or {t.name: i for i, t in enumerate(graph.inputs)}
                if bound is not None else {})
        for op in _topological_ops(graph):
            ins = [src.get(t.name, []) for t in op.inputs]
            ctrl = _union(done.get(c.name, []) for c in op.control_inputs)
            if not ins and not ctrl:
                ctrl = list(entry_ctrl)
            if op.type == "Placeholder" and op.outputs[0].name in args:
                src[op.outputs[0].name] = list(bound[args[op.outputs[0].name]])
                done[op.name] = src[op.outputs[0].name]
                _set_value(values, op.outputs[0], bound_values, args[op.outputs[0].name])
                _set_value(lists, op.outputs[0], bound_lists, args[op.outputs[0].name])
            elif op.type == "Placeholder" and bound is not None:  # an argument node replaced on import
                src[op.outputs[0].name], done[op.name] = [], []
            elif op.type in COLLAPSED_KINDS:
                for i, out in enumerate(op.outputs):
                    src[out.name] = ins[i] if i < len(ins) else []
                    _set_value(values, out, [values.get(t.name) for t in op.inputs], i)
                    _set_value(lists, out, [lists.get(t.name) for t in op.inputs], i)
                done[op.name] = _union([*ins, ctrl])
            elif op.type == "NoOp":
                done[op.name] = _union([*ins, ctrl])
            elif op.type in DROPPED_KINDS:
                src[op.outputs[0].name], done[op.name] = [], ctrl
                _set_value(values, op.outputs[0], [static_constant(op)], 0)
            elif self._callee_names(op, graph):
                self._inline(op, graph, prefix, ins, ctrl, (src, done, values, lists))
            else:
                new_id = self._add_real_op(op, prefix, ins, ctrl, is_top=bound is None)
                for out in op.outputs:
                    src[out.name] = [new_id]
                done[op.name] = [new_id]
                if op.type in EVALUATED_KINDS:  # shape arithmetic: a real op that may have a static value
                    known = static_outputs(op, [values.get(t.name) for t in op.inputs], self.static_dims)
                    for i, out in enumerate(op.outputs):
                        _set_value(values, out, known, i)
                if op.type in LIST_KINDS:
                    list_op_facts(op, values, lists)
        return src, done, values, lists

    def _callee_names(self, op, graph) -> list[str]:
        if op.type in CALL_KINDS:
            return [op.get_attr("f").name]
        if op.type in BRANCH_KINDS:
            return [op.get_attr(key).name for key in BRANCH_KINDS[op.type]]
        if op.type in CASE_KINDS:
            return [f.name for f in op.get_attr("branches")]
        if op.type in LOOP_KINDS:
            return [op.get_attr("cond").name, op.get_attr("body").name]
        if _find_function_def(graph, op.type) is not None:
            return [op.type]
        return []

    def _inline(self, op, graph, prefix, ins, ctrl, state) -> None:
        """Inline a call (outputs come from the callee) or control flow (outputs from a join op). A while loop's
        cond and body count their trip count's runs (the cond one more) where it is static (graphs.tf.loops)."""
        src, done, values, lists = state
        arg_ins = ins[1:] if op.type in BRANCH_KINDS or op.type in CASE_KINDS else ins
        arg_tensors = list(op.inputs[1:] if len(arg_ins) < len(ins) else op.inputs)
        arg_values = [values.get(t.name) for t in arg_tensors]
        arg_lists = [facts_of(t, lists) for t in arg_tensors]
        callees = [(fname, self._callee_graph(op, graph, prefix, fname, arg_tensors, arg_lists))
                   for fname in self._callee_names(op, graph)]
        loose = op.type in LOOP_KINDS and not _shapes_kept(op)
        self.loose_loops += loose
        try:
            count = loop_count(callees[0][1], callees[1][1], arg_values, self.static_dims) \
                if op.type in LOOP_KINDS else None
            walk_args = (arg_ins, ctrl, arg_values, arg_lists)
            results = [self._inline_callee(op, prefix, self._part(op, fname, k), body, _callee_runs(count, k), count,
                                           walk_args)
                       for k, (fname, body) in enumerate(callees[:1] if loose and count.trips else callees)]
            if loose and count.trips:  # a static trip count: the body walked at each iteration's shapes
                results.append(self._inline_changing_body(op, graph, prefix, callees[1], count, walk_args))
        finally:
            self.loose_loops -= loose
        if op.type in CALL_KINDS or len(results) == 1 and op.type not in LOOP_KINDS:
            callee = results[0]
            for i, (out, ids) in enumerate(zip(op.outputs, callee.outs)):
                src[out.name] = ids
                _set_value(values, out, callee.out_values, i)
                _set_value(lists, out, callee.out_lists, i)
            done[op.name] = _union([*callee.outs, callee.ends])
            return
        join_inputs = [(pid, _tensor_bytes(t, self.batch_size)) for callee in results
                       for t, ids in zip(callee.graph.outputs, callee.outs) for pid in ids]
        if op.type not in LOOP_KINDS:
            join_inputs += [(pid, _tensor_bytes(op.inputs[0], self.batch_size)) for pid in ins[0]]
        join = FlatOp(name=prefix + op.name, own_name=op.name, kind=op.type, flops=0.0, in_bytes=0,
                      out_bytes=sum(_tensor_bytes(t, self.batch_size) for t in op.outputs),
                      inputs=_dedup(join_inputs), control_inputs=_union(callee.ends for callee in results),
                      runs=self.runs, trips=count.trips if count is not None else None)
        self.ops.append(join)
        exit_lists = [loop_exit_facts(entry, out) for entry, out in zip(arg_lists, results[-1].out_lists)] \
            if op.type in LOOP_KINDS else []
        for i, out in enumerate(op.outputs):
            src[out.name] = [len(self.ops) - 1]
            _set_value(values, out, count.output_values if count is not None else [], i)
            _set_value(lists, out, exit_lists, i)
        done[op.name] = [len(self.ops) - 1]

    def _part(self, op, fname: str, k: int) -> str:
        """The name part of ``op``'s ``k``-th callee ``fname`` in its ops' names (see ``flatten_graph``)."""
        if not self.stable_names:
            return fname
        if op.type in BRANCH_KINDS:
            return ("then", "else")[k]
        if op.type in LOOP_KINDS:
            return ("cond", "body")[k]
        return f"branch{k}" if op.type in CASE_KINDS else "call"

    def _inline_callee(self, op, prefix: str, part: str, body, runs: int, count, args) -> _InlinedCallee:
        """Walk a callee of ``op`` whose ops run ``runs`` times per run of ``op`` (a loop's cond or body sees the
        static values and list facts that hold in every iteration); ``part`` names it in its ops' names."""
        arg_ins, ctrl, arg_values, arg_lists = args
        inner_prefix = prefix + op.name + "/" + (part + "/" if op.type not in CALL_KINDS else "")
        if op.type in LOOP_KINDS:
            arg_lists = [loop_entry_facts(body, i, facts) for i, facts in enumerate(arg_lists)]
        inner_src, inner_done, inner_values, inner_lists = self._walk_callee(
            body, inner_prefix, arg_ins, ctrl, (arg_values if count is None else count.invariant_values, arg_lists),
            runs, op.type in LOOP_KINDS)
        return _InlinedCallee(
            graph=body, outs=[inner_src.get(t.name, []) for t in body.outputs],
            ends=_union(inner_done.get(c.name, []) for c in getattr(body, "control_outputs", [])),
            out_values=[inner_values.get(t.name) for t in body.outputs],
            out_lists=[inner_lists.get(t.name) for t in body.outputs])

    def _inline_changing_body(self, op, graph, prefix: str, callee, count, args) -> _InlinedCallee:
        """Walk the body of a loop of static trip count whose variables change shape (a relaxed shape invariant:
        ``tf.concat`` growing a tensor) once per iteration, at the shapes the iteration before left, until they
        stop changing (then once for the iterations left), and fold the walks into the first one's ops
        (``_fold_iterations``): each op's FLOPs and bytes accessed are the sum over the iterations at their sizes,
        its output bytes the largest (an exact sum, not a bound). More than MAX_FOLLOWED_ITERATIONS changing
        shapes is a PlacerError."""
        fname, body = callee
        bodies = self._iteration_bodies(op, graph, prefix, callee, count.trips, args[3])
        runs = [1] * (len(bodies) - 1) + [count.trips - len(bodies) + 1]  # the last shapes hold to the end
        starts, results = [], []
        for iteration_body, iteration_runs in zip(bodies, runs):
            starts.append(len(self.ops))
            results.append(self._inline_callee(op, prefix, self._part(op, fname, 1), iteration_body, iteration_runs,
                                               count, args))
        _fold_iterations(self.ops, starts, prefix + op.name)
        return results[0]

    def _iteration_bodies(self, op, graph, prefix: str, callee, trips: int, arg_lists) -> list:
        """The body graph given the loop's inputs, then given the shapes of the previous one's outputs, until
        they are its inputs' shapes or ``trips`` graphs are made."""
        fname, body = callee
        fdef = _find_function_def(graph, fname)
        handles = [facts.handle if facts else None for facts in arg_lists]
        bodies = [body]
        while len(bodies) < trips:
            shapes = [t.shape for t in bodies[-1].outputs]
            if [_shape_key(t) for t in bodies[-1].inputs] == [_shape_key(t) for t in bodies[-1].outputs]:
                break
            if len(bodies) == MAX_FOLLOWED_ITERATIONS:
                raise PlacerError(f"while loop {prefix + op.name!r}: its variables change shape in each of its first "
                                  f"{MAX_FOLLOWED_ITERATIONS} iterations (of {trips}), and the importer costs each "
                                  f"iteration at its shapes for at most {MAX_FOLLOWED_ITERATIONS}: give its variables "
                                  "fixed shapes (padded to the largest), or run fewer iterations")
            bodies.append(_function_graph(graph, fdef, list(op.inputs), handles, shapes))
        return bodies

    def _callee_graph(self, op, graph, prefix: str, fname: str, arg_tensors, arg_lists):
        fdef = _find_function_def(graph, fname)
        if fdef is None:
            raise PlacerError(f"op {prefix + op.name!r} calls function {fname!r}, which is not in the library")
        return _function_graph(graph, fdef, arg_tensors, [facts.handle if facts else None for facts in arg_lists])

    def _walk_callee(self, body, prefix: str, arg_ins, ctrl, arg_facts: tuple, runs: int, in_loop: bool):
        """``walk`` a callee whose ops run ``runs`` times each time the caller's do; ``arg_facts``: its arguments'
        static values and ListFacts."""
        outer_runs = self.runs
        self.loop_depth += in_loop
        self.runs *= runs
        try:
            return self.walk(body, prefix, arg_ins, ctrl, *arg_facts)
        finally:
            self.loop_depth -= in_loop
            self.runs = outer_runs

    def _add_real_op(self, op, prefix: str, ins: list[list[int]], ctrl: list[int], is_top: bool) -> int:
        import tensorflow as tf

        in_dims = [_dims(t, self.batch_size) for t in op.inputs]
        out_dims = [_dims(t, self.batch_size) for t in op.outputs]
        attrs = {key: op.get_attr(key) for key in FORMULA_ATTRS if key in op.node_def.attr}
        float_output = any(t.dtype.is_floating or t.dtype.is_complex for t in op.outputs)
        try:
            flops = op_flops(op.type, in_dims, out_dims, attrs, float_output)
        except (IndexError, TypeError) as err:  # a formula met shapes it does not expect
            raise self._flops_error(op, prefix, err) from None
        inputs = []
        for tensor, ids in zip(op.inputs, ins):
            size = RESOURCE_EDGE if tensor.dtype == tf.resource else _tensor_bytes(tensor, self.batch_size)
            inputs += [(pid, size) for pid in ids]
        resource_output = any(t.dtype == tf.resource for t in op.outputs)
        flat = FlatOp(
            name=prefix + op.name, own_name=op.name, kind=op.type, flops=flops,
            in_bytes=sum(_tensor_bytes(t, self.batch_size) for t in op.inputs if t.dtype != tf.resource),
            out_bytes=sum(_tensor_bytes(t, self.batch_size) for t in op.outputs),
            inputs=_dedup(inputs), control_inputs=ctrl, colocate_with=_colocation_names(op, prefix),
            resource_output=resource_output, is_argument=is_top and op.type == "Placeholder",
            without_flops=without_flops(op.type, len(op.outputs)), runs=self.runs,
        )
        self.ops.append(flat)
        return len(self.ops) - 1

    def _flops_error(self, op, prefix: str, err: Exception) -> PlacerError:
        problem = f"cannot count FLOPs of op {prefix + op.name!r} ({op.type}): "
        if self.loop_depth and any(t.shape.rank is None for t in op.inputs):
            return LoopShapeError(problem + "its inputs have no static shape inside a while loop (their rank is "
                                  "known only at run time): unroll the loop (a Keras recurrent "
                                  "layer: unroll=True, on a fixed number of steps), so every step is traced with its "
                                  "shapes")
        return PlacerError(problem + str(err))


@dataclass(frozen=True)
class _InlinedCallee:
    """One callee walked: its graph, and per output its producer ids, static value and ListFacts."""
    graph: object
    outs: list[list[int]]
    ends: list[int]  # ids its completion implies (its control outputs')
    out_values: list
    out_lists: list


def _callee_runs(count, k: int) -> int:
    """Runs of callee ``k`` per run of its op: a loop's trip count where static (its cond, ``k`` 0, one more)."""
    return 1 if count is None or count.trips is None else count.trips + (k == 0)


def _fold_iterations(ops: list[FlatOp], starts: list[int], loop: str) -> None:
    """Fold the walks of a loop body at later iterations' shapes (``ops[starts[1]:]``, each as long as the first)
    into the first walk's ops (``ops[starts[0]:starts[1]]``), which then stand for every iteration: runs, FLOPs
    and bytes accessed summed (``flops`` and ``accessed_bytes`` per run: their mean over the runs), output bytes
    and edge bytes the largest. The later walks' ops are removed."""
    if len(starts) < 2:
        return
    size = starts[1] - starts[0]
    walks = [ops[start:start + size] for start in starts]
    if len(ops) != starts[-1] + size or any([o.name for o in w] != [o.name for o in walks[0]] for w in walks):
        raise PlacerError(f"while loop {loop!r}: its body does not make the same ops at every iteration's shapes")
    first_id = {start + j: starts[0] + j for start in starts for j in range(size)}
    for j, same in enumerate(zip(*walks)):
        runs = sum(o.runs for o in same)
        inputs: dict[int, int] = {}
        for o in same:
            for pid, size_bytes in o.inputs:
                pid = first_id.get(pid, pid)
                inputs[pid] = max(inputs.get(pid, size_bytes), size_bytes)
        ops[starts[0] + j] = replace(
            same[0], runs=runs, flops=sum(o.flops * o.runs for o in same) / runs,
            accessed_bytes=sum(o.data_bytes() * o.runs for o in same) / runs,
            in_bytes=max(o.in_bytes for o in same), out_bytes=max(o.out_bytes for o in same),
            inputs=list(inputs.items()))
    del ops[starts[1]:]


def _topological_ops(graph) -> list:
    """The graph's ops, producers before consumers (data and control edges), creation order on ties."""
    ops = graph.get_operations()
    position = {op.name: i for i, op in enumerate(ops)}
    indegree = [0] * len(ops)
    consumers: list[list[int]] = [[] for _ in ops]
    for i, op in enumerate(ops):
        preds = {position[t.op.name] for t in op.inputs if t.op.name in position}
        preds |= {position[c.name] for c in op.control_inputs if c.name in position}
        indegree[i] = len(preds)
        for p in preds:
            consumers[p].append(i)
    ready = deque(i for i in range(len(ops)) if indegree[i] == 0)
    order = []
    while ready:
        i = ready.popleft()
        order.append(ops[i])
        for c in consumers[i]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    if len(order) != len(ops):
        raise PlacerError(f"TensorFlow graph {getattr(graph, 'name', '')!r} has a cycle")
    return order


def _find_function_def(graph, name: str):
    """The FunctionDef called ``name`` from ``graph``'s library, its outer graphs' or the eager context's."""
    from tensorflow.python.eager import context

    g = graph
    while g is not None:
        function = g._functions.get(name) if hasattr(g, "_functions") else None  # noqa: SLF001
        if function is not None:
            return getattr(function, "cached_definition", None) or function.definition
        g = getattr(g, "outer_graph", None)
    ctx = context.context()
    if ctx.has_function(name):
        return ctx.get_function_def(name)
    return None


def _function_graph(graph, fdef, arg_tensors, arg_handles=(), arg_shapes=None):
    """A FuncGraph of ``fdef`` nested in ``graph`` whose arguments have the caller's shapes (else ``arg_shapes``,
    a loop's variables in a later iteration), including the
    variable shapes behind resource handles (so shape inference sees through ReadVariableOp) and the element
    shapes of TensorLists: the caller's tensor's handle data, else ``arg_handles``' (what ``graphs.tf.lists``
    knows of a list popped from a list of lists, whose tensor has none)."""
    import tensorflow as tf
    from tensorflow.python.framework import func_graph as func_graph_module
    from tensorflow.python.framework import importer
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def
    from tensorflow.python.ops import handle_data_util

    if len(arg_tensors) != len(fdef.signature.input_arg):
        raise PlacerError(f"function {fdef.signature.name!r} called with {len(arg_tensors)} arguments, "
                          f"expects {len(fdef.signature.input_arg)}")
    arg_shapes = arg_shapes or [t.shape for t in arg_tensors]
    shapes = [None if t.dtype == tf.resource else shape for t, shape in zip(arg_tensors, arg_shapes)]
    with graph.as_default():
        graph_def, flat_names = function_def_to_graph_def(fdef, shapes)
        body = func_graph_module.FuncGraph(fdef.signature.name)
    with body.as_default():
        args = []
        for tensor, arg in zip(arg_tensors, fdef.signature.input_arg):
            placeholder = tf.compat.v1.placeholder(tensor.dtype, shapes[len(args)] if tensor.dtype != tf.resource
                                                   else [], name=f"placer_arg_{arg.name}")
            if tensor.dtype in (tf.resource, tf.variant):  # a variant: a TensorList, its element shape
                handle_data_util.copy_handle_data(tensor, placeholder)
            handle = arg_handles[len(args)] if len(args) < len(arg_handles) else None
            if tensor.dtype == tf.variant and handle is not None \
                    and not handle_data_util.get_resource_handle_data(placeholder).is_set:
                handle_data_util.set_handle_data(placeholder, handle)
            args.append(placeholder)
        input_map = {flat_names[arg.name]: p for arg, p in zip(fdef.signature.input_arg, args)}
        importer.import_graph_def(graph_def, input_map=input_map, name="")
        body.inputs = args
        body.arg_index = {p.name: i for i, p in enumerate(args)}  # argument position by tensor name, also by the
        # name of the placeholder the import replaced, which an output passing its argument through still names
        body.arg_index.update({flat_names[arg.name]: i for i, arg in enumerate(fdef.signature.input_arg)})
        body.outputs = [body.get_tensor_by_name(flat_names[fdef.ret[arg.name]]) for arg in fdef.signature.output_arg]
        body.control_outputs = [body.get_operation_by_name(fdef.control_ret[name])
                                for name in fdef.signature.control_output]
    return body


def _shapes_kept(loop) -> bool:
    """Every variable of the while op ``loop`` keeps the shape it enters with (no relaxed shape invariant), so
    the shapes its cond and body see, those it enters with, hold in every iteration."""
    return all(_shape_key(t) == _shape_key(out) for t, out in zip(loop.inputs, loop.outputs))


def _shape_key(tensor) -> tuple | None:
    return None if tensor.shape.rank is None else tuple(tensor.shape.as_list())


def _leading_dim_unknown(tensor) -> bool:
    return bool(tensor.shape.rank) and tensor.shape[0] is None


def _set_value(values: dict, tensor, known: list, i: int) -> None:
    """Record ``known[i]`` as ``tensor``'s static value where there is one."""
    if i < len(known) and known[i] is not None:
        values[tensor.name] = known[i]


def _dims(tensor, batch_size: int) -> list[int]:
    """Static dims with an unknown leading (batch) dim set to ``batch_size`` and other unknowns to 1."""
    shape = tensor.shape
    if shape.rank is None:
        return []
    return [d if d is not None else (batch_size if i == 0 else 1) for i, d in enumerate(shape.as_list())]


def _tensor_bytes(tensor, batch_size: int) -> int:
    try:
        itemsize = tensor.dtype.size
    except (TypeError, ValueError):
        return 0
    if tensor.dtype.name in ("resource", "variant", "string"):
        return 0
    numel = 1
    for d in _dims(tensor, batch_size):
        numel *= d
    return int(numel * itemsize)


def _colocation_names(op, prefix: str) -> list[str]:
    if "_class" not in op.node_def.attr:
        return []
    names = [s.decode() if isinstance(s, bytes) else s for s in op.node_def.attr["_class"].list.s]
    return [prefix + s[len("loc:@"):] for s in names if s.startswith("loc:@")]


def _union(groups) -> list[int]:
    seen: dict[int, None] = {}
    for group in groups:
        for x in group:
            seen[x] = None
    return list(seen)


def _dedup(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    best: dict[int, int] = {}
    for pid, size in pairs:
        best[pid] = max(best.get(pid, size), size)
    return list(best.items())
