"""Which nodes of an ONNX graph run: those a graph output depends on.

OpenVINO's ONNX reader builds its model back from the graph's outputs, so a node that no output depends on (an
exporter's leftover: a branch nothing reads) leaves no node, and no runtime spends time on it. The ONNX importer
leaves such nodes out too (graphs.inference.onnx_constants.op_nodes): costing them would make the simulator
price work nothing does, and the OpenVINO measurer would find a graph op without a node in the model it runs.

A node is needed when any of its outputs is (one nothing reads does not make it dead: it is a side output of
the work that makes the others), and then so is everything it reads: its inputs, and a subgraph op's what its
bodies' needed nodes read from the graph around them. A body's outputs are what it hands back to its op (a
Loop's condition and carried values among them), so its nodes are needed by the same rule, inside it.
"""

from __future__ import annotations

from graphs.inference.shape_folding import bodies


def live_indices(graph) -> list[int]:
    """The indices in ``graph.node`` of the nodes a graph output depends on, in order. ONNX keeps nodes in
    topological order (the checker requires it), so one walk from the last node back finds them."""
    needed = {value.name for value in graph.output}
    live: list[int] = []
    for i in reversed(range(len(graph.node))):
        node = graph.node[i]
        if any(tensor in needed for tensor in node.output if tensor):
            live.append(i)
            needed.update(reads(node))
    return live[::-1]


def live_nodes(graph) -> list:
    """The nodes of ``graph`` a graph output depends on, in order."""
    return [graph.node[i] for i in live_indices(graph)]


def reads(node) -> list[str]:
    """The tensors a node reads, each once: its inputs, then what its bodies read from the graph around it."""
    return list(dict.fromkeys([t for t in node.input if t] + _outer_reads(node, set(node.input))))


def _outer_reads(node, listed: set[str]) -> list[str]:
    """Tensors a subgraph op's bodies read from the enclosing graph (implicit inputs), in first-read order."""
    found: list[str] = []
    for body in bodies(node):
        found += [t for t in _free_names(body) if t not in listed and t not in found]
    return found


def _free_names(body) -> list[str]:
    """Names a (nested) graph's needed nodes read, or it hands back as outputs, but it neither defines nor
    receives as inputs."""
    defined = {v.name for v in body.input} | {init.name for init in body.initializer}
    free: list[str] = []
    for node in live_nodes(body):
        free += [tensor for tensor in reads(node) if tensor not in defined and tensor not in free]
        defined.update(node.output)
    return free + [v.name for v in body.output if v.name not in defined and v.name not in free]
