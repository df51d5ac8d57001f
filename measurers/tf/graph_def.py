"""A step's GraphDef node by node under the importer's names, the nodes of its library functions included.

The importer inlines function calls and control flow (graphs/tf/flatten.py): an op in the ``then`` branch of
an ``If`` named ``cond`` is ``cond/<then function>/<its name>``, an op of a called function
``<call>/<its name>``. A placement written onto the top-level nodes alone leaves such ops to TensorFlow's
placer, which runs a lowered branch on the device of whatever it was placed beside: a mixed-precision Keras
step's whole optimizer update (in the loss scale's ``cond``) ran on one device whatever the placement said.
``step_nodes`` gives every node, top level and inside functions, its flattened name and its inputs' producers
by flattened names (a function argument resolved to what the caller passes, a call's output to the op inside
the callee that returns it), so a device can be set on each.
A function called from two places is copied for the second (one FunctionDef holds one device per node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from graphs.tf.flatten import BRANCH_KINDS, CALL_KINDS, CASE_KINDS, LOOP_KINDS


@dataclass(frozen=True)
class StepNode:
    name: str  # the importer's flattened name
    node: object  # the NodeDef, in the GraphDef or one of its library functions (set its device there)
    data_sources: tuple[str, ...]  # flattened names of the data inputs' producers (a call's: inside its callee)
    control_sources: tuple[str, ...]  # of the control inputs'
    callees: tuple[str, ...] = ()  # the library functions it calls, by their own names, in the importer's order


def step_nodes(graph_def) -> list[StepNode]:
    """Every node of ``graph_def`` and of the library functions its nodes call, callers before callees. A
    function called a second time is copied for that call (``<name>_placed_<k>``, the call rewritten to it), and
    so are the functions a copy calls: one FunctionDef holds one device per node, and two calls' ops may be
    placed apart."""
    library = {f.signature.name: f for f in graph_def.library.function}
    original: dict[str, str] = {}  # a copy's name -> the function it copies (a copy's calls name copies too)

    def own_copy(name: str) -> tuple[str, str]:
        """(the function's own name, the name of a function this call alone calls)."""
        if name not in called:
            called.add(name)
            return name, name
        copy = graph_def.library.function.add()
        copy.CopyFrom(library[name])
        copy.signature.name = f"{original.get(name, name)}_placed_{len(graph_def.library.function)}"
        library[copy.signature.name], original[copy.signature.name] = copy, original.get(name, name)
        called.add(copy.signature.name)
        return original[copy.signature.name], copy.signature.name

    def visit(nodes, prefix: str, bound: dict[str, _Ref]) -> None:
        for node in nodes:
            data = tuple(_ref(i, prefix, bound) for i in node.input if not i.startswith("^"))
            control = tuple(_ref(i[1:], prefix, bound).node for i in node.input if i.startswith("^"))
            is_call = node.op in CALL_KINDS or node.op in library  # before _calls renames a function op type
            calls = _calls(node, library, own_copy)
            walked.append((prefix + node.name, node, data, control, tuple(name for name, _ in calls)))
            for fname, own in calls:
                function = library[own]
                args = data[1:] if node.op in BRANCH_KINDS or node.op in CASE_KINDS else data
                inner = prefix + node.name + "/" + ("" if node.op in CALL_KINDS else fname + "/")
                arguments = dict(zip((a.name for a in function.signature.input_arg), args))
                visit(function.node_def, inner, arguments)
                if is_call:
                    outputs = function.signature.output_arg
                    returned[prefix + node.name] = (None if node.op in CALL_KINDS else [a.name for a in outputs],
                                                    [_ref(function.ret[a.name], inner, arguments) for a in outputs])

    called: set[str] = set()
    walked: list[tuple] = []
    # a call -> (its callee's output names where a function is the op type, what each output returns)
    returned: dict[str, tuple[list[str] | None, list[_Ref]]] = {}
    visit(graph_def.node, "", {})
    return [StepNode(name, node, tuple(_producer(ref, returned) for ref in data), control, callees)
            for name, node, data, control, callees in walked]


@dataclass(frozen=True)
class RunNames:
    """The node names of one step's stats as the importer's names (`attribute_runs`)."""
    attributed: dict[str, str]  # a stats name -> the one flattened name it fits
    shared: frozenset[str]  # flattened names a stats name fit along with another, and none alone
    uninlined: frozenset[str]  # the calls TensorFlow ran through its function runtime (its stats name them)


def lowered_names(nodes: list[StepNode]) -> dict[tuple[str, str], str]:
    """(a control-flow node's flattened name, the part TensorFlow's lowering names one of its functions by:
    ``then``, ``else``, ``branch<i>``, ``cond``, ``body``) -> that function's own name, for ``flattened_name``."""
    parts = {**{kind: ("then", "else") for kind in BRANCH_KINDS}, **dict.fromkeys(LOOP_KINDS, ("cond", "body"))}
    lowered = {}
    for found in nodes:
        names = parts.get(found.node.op) or (
            tuple(f"branch{i}" for i in range(len(found.callees))) if found.node.op in CASE_KINDS else ())
        lowered.update({(found.name, part): callee for part, callee in zip(names, found.callees)})
    return lowered


def flattened_name(run_name: str, lowered: dict[tuple[str, str], str]) -> str:
    """The importer's name of a node TensorFlow ran (its step stats): a lowered ``cond`` runs its ``then``
    branch's NAME as ``cond/then/_7/NAME``, which the importer names ``cond/<then function>/NAME``."""
    parts, out = run_name.split("/"), []
    i = 0
    while i < len(parts):
        function = lowered.get(("/".join(out), parts[i])) if i + 1 < len(parts) else None
        if function is not None and re.fullmatch(r"_\d+", parts[i + 1]):
            out.append(function)
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return "/".join(out)


def call_names(nodes: list[StepNode]) -> frozenset[str]:
    """Flattened names of the nodes that call a function (``PartitionedCall``, ``StatefulPartitionedCall``, a
    library function as the op type), not control flow: the importer names the callee's ops ``<call>/<op>``."""
    flow = {*BRANCH_KINDS, *CASE_KINDS, *LOOP_KINDS}
    return frozenset(found.name for found in nodes if found.callees and found.node.op not in flow)


def attribute_runs(run_names: Iterable[str], known: set[str], lowered: dict, calls: frozenset[str]) -> RunNames:
    """Which ``known`` flattened name each node name of one step's stats is. TensorFlow inlines a call and
    names its ops as the importer does; a call it runs through its function runtime instead (``_noinline``,
    ``jit_compile``) shows in the stats under its own name, and its ops under their names inside the
    function alone (``Relu``), which two calls of one function, or a node outside, may share: a name that
    fits two nodes tells neither."""
    names = set(run_names)
    ran: set[str] = set()
    while True:  # a call run inside an uninlined call is named inside it too
        more = {fit for name in names for fit in _fits(name, ran, lowered) if fit in calls} - ran
        if not more:
            break
        ran |= more
    attributed, shared = {}, set()
    for name in names:
        fits = _fits(name, ran, lowered) & known
        if len(fits) == 1:
            attributed[name] = fits.pop()
        shared |= fits if len(fits) > 1 else set()
    return RunNames(attributed, frozenset(shared - set(attributed.values())), frozenset(ran))


def _fits(run_name: str, ran_calls: set[str], lowered: dict) -> set[str]:
    """The flattened names ``run_name`` may stand for: itself, or a node inside any call run uninlined."""
    return {flattened_name(run_name, lowered), *(flattened_name(f"{call}/{run_name}", lowered) for call in ran_calls)}


def _calls(node, library: dict, own_copy) -> list[tuple[str, str]]:
    """(the function's name, the name of the copy this call now calls) for each library function ``node``
    calls, in the importer's order (a function used as an op type too)."""
    if node.op in library:
        name, node.op = own_copy(node.op)
        return [(name, node.op)]
    calls = []
    for attr in _callee_attrs(node):
        if attr.name in library:
            name, attr.name = own_copy(attr.name)
            calls.append((name, attr.name))
    return calls


def _callee_attrs(node) -> list:
    """The NameAttrList of each function ``node`` calls (its ``name`` can be rewritten)."""
    if node.op in CALL_KINDS:
        return [node.attr["f"].func]
    if node.op in BRANCH_KINDS:
        return [node.attr[key].func for key in BRANCH_KINDS[node.op]]
    if node.op in CASE_KINDS:
        return list(node.attr["branches"].list.func)
    if node.op in LOOP_KINDS:
        return [node.attr["cond"].func, node.attr["body"].func]
    return []


@dataclass(frozen=True)
class _Ref:
    """A tensor a node reads: its producer's flattened name and which of its outputs."""
    node: str
    output: str  # the output argument's name inside a function ("output" of a call), "" at the top level
    index: int


def _ref(tensor: str, prefix: str, bound: dict[str, _Ref]) -> _Ref:
    """The tensor ``tensor`` names (``node:1`` at the top level, ``node:out:0`` or an argument's name inside a
    function, which is what the caller passes)."""
    parts = tensor.split(":")
    if parts[0] in bound:
        return bound[parts[0]]
    if len(parts) == 3:
        return _Ref(prefix + parts[0], parts[1], int(parts[2]))
    return _Ref(prefix + parts[0], "", int(parts[1]) if len(parts) == 2 else 0)


def _producer(ref: _Ref, returned: dict) -> str:
    """The flattened name of the node producing ``ref``: an output of a call is made inside its callee (the
    importer inlines the call and has no op by its name), by the op the callee returns it from."""
    for _ in range(1000):  # calls nest no deeper in a real step: a loop of names would be a broken GraphDef
        if ref.node not in returned:
            break
        names, refs = returned[ref.node]
        ref = refs[names.index(ref.output) + ref.index if names is not None and ref.output else ref.index]
    return ref.node
