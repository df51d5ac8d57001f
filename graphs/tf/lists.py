"""What the flattening walk knows of TensorLists (variant tensors) beyond TensorFlow's static shapes.

A while loop's gradient pops, from TensorLists its forward loop filled (accumulators), the values each
iteration used: their shapes come from the lists' handle data (dtype and shape of the elements). A loop nested
in another loop keeps its inner loop's accumulators, themselves lists, in accumulators of the outer loop: a
list of lists. TensorFlow's handle data describes one level only, and a While op rebuilt from a FunctionDef
has none on its outputs, so the lists the outer gradient pops have no handle data, and nothing the inner
gradient pops from them has a shape. Its trip count is lost too: the inner gradient counts to the inner
forward loop's final counter, which the outer forward loop pushes to an accumulator each iteration.

``ListFacts`` carries what is lost: a list's own handle data where its tensor has none, and what every element
pushed to it is (``Element``: a static value, and an element list's own facts), for ``graphs.tf.flatten`` to
give a popped list its handle data and a popped counter its value. A loop's cond and body see a list variable's
facts only where each iteration leaves them true (``loop_entry_facts``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from graphs.tf.loops import PASS_THROUGH_KINDS

LIST_KINDS = frozenset({"EmptyTensorList", "TensorListPushBack", "TensorListPopBack"})


@dataclass(frozen=True)
class Element:
    """What every element of a list is: its static value (int, bool, tuple of ints; None: unknown) and, for
    an element that is a list, its facts."""

    value: object = None
    facts: ListFacts | None = None


@dataclass(frozen=True)
class ListFacts:
    handle: object = None  # the list's handle data (its elements' dtype and shape), None: unknown
    elements: Element | None = None  # what every element is, None: unknown or mixed
    empty: bool = False  # the list has no element (an EmptyTensorList)


def facts_of(tensor, lists: dict) -> ListFacts | None:
    """The facts of a variant tensor (its own handle data when the walk recorded none), None for any other."""
    if tensor.dtype.name != "variant":
        return None
    facts = lists.get(tensor.name) or ListFacts()
    if facts.handle is None:
        facts = replace(facts, handle=_tensor_handle(tensor))
    return facts


def list_op_facts(op, values: dict, lists: dict) -> None:
    """Record the facts of the outputs of a LIST_KINDS op in ``lists``, and a popped element's static value in
    ``values`` (tensor name -> value, as ``graphs.tf.flatten``'s walk keeps them)."""
    if op.type == "EmptyTensorList":
        lists[op.outputs[0].name] = ListFacts(empty=True)
        return
    facts = facts_of(op.inputs[0], lists)
    if facts is None:
        return
    if op.type == "TensorListPushBack":
        item = op.inputs[1]
        pushed = Element(values.get(item.name), facts_of(item, lists))
        elements = pushed if facts.empty else _merged(facts.elements, pushed)
        lists[op.outputs[0].name] = ListFacts(handle=facts.handle, elements=elements)
        return
    lists[op.outputs[0].name] = ListFacts(handle=facts.handle, elements=facts.elements)  # TensorListPopBack
    element = facts.elements if not facts.empty else None
    if element is not None and element.value is not None:
        values[op.outputs[1].name] = element.value
    if element is not None and element.facts is not None:
        lists[op.outputs[1].name] = element.facts


def loop_entry_facts(graph, i: int, entry: ListFacts | None) -> ListFacts | None:
    """The facts loop variable ``i`` has in every iteration of a loop's cond or body ``graph``, from those it
    enters with: all of them where the graph only pushes to the list (each iteration pushes the same, whatever
    the list held) or only pops from it (what every element is stays true of those left); else its handle
    data alone (a pop after a push may return what an earlier iteration pushed)."""
    if entry is None:
        return None
    uses = _list_uses(graph, graph.inputs[i])
    if uses <= {"pop"} or uses == {"push"}:
        return entry
    return ListFacts(handle=entry.handle)


def loop_exit_facts(entry: ListFacts | None, body_out: ListFacts | None) -> ListFacts | None:
    """The facts of a loop's output list from those it entered with and those the body returns (see
    ``loop_entry_facts``): the list keeps its handle data; an empty list holds what the body pushes."""
    if entry is None:
        return None
    if body_out is None:
        return ListFacts(handle=entry.handle)
    elements = body_out.elements if entry.empty else _merged(entry.elements, body_out.elements)
    return ListFacts(handle=entry.handle or body_out.handle, elements=elements)


def _merged(a: Element | None, b: Element | None) -> Element | None:
    """What the elements of a list holding both kinds are: a value or facts where both agree."""
    if a == b:
        return a
    if a is None or b is None:
        return None
    value = a.value if a.value == b.value else None
    facts = a.facts if a.facts == b.facts else None
    return None if value is None and facts is None else Element(value, facts)


def _list_uses(graph, tensor) -> set[str]:
    """How ``graph`` changes the list ``tensor`` and the lists it makes from it: "push", "pop", and "other"
    for any other op that makes a list from it (a nested loop, which may do both). Reading it (its length,
    pushing it to another list) does not change it."""
    uses: set[str] = set()
    stack, seen = [tensor], set()
    while stack:
        current = stack.pop()
        for op in current.consumers():
            if op.name in seen or not any(t.dtype.name == "variant" for t in op.outputs):
                continue
            seen.add(op.name)
            if op.type in PASS_THROUGH_KINDS:
                stack.extend(op.outputs)
            elif op.type in ("TensorListPushBack", "TensorListPopBack") and op.inputs[0].name == current.name:
                uses.add("push" if op.type == "TensorListPushBack" else "pop")
                stack.append(op.outputs[0])
            elif op.type != "TensorListPushBack":
                uses.add("other")
    return uses


def _tensor_handle(tensor):
    """``tensor``'s handle data as TensorFlow's shape inference left it, None where it has none."""
    from tensorflow.python.ops import handle_data_util

    handle = handle_data_util.get_resource_handle_data(tensor)
    return handle if handle.is_set else None
