"""A step's GraphDef node by node under the importer's flattened names, library functions included."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from graphs.tf.flatten import flatten_graph  # noqa: E402
from measurers.tf.graph_def import step_nodes  # noqa: E402


def _twice_called():
    """``outer`` calls ``inner`` twice (one FunctionDef, two calls) and branches on a ``tf.cond``."""
    @tf.function(autograph=False)
    def inner(x):
        return tf.nn.relu(tf.matmul(x, x))

    @tf.function(autograph=False)
    def outer(x):
        y = inner(x) + inner(x * 2.0)
        return tf.cond(tf.reduce_sum(y) > 0, lambda: tf.exp(y), lambda: tf.sin(y))

    return outer.get_concrete_function(tf.TensorSpec((4, 4), tf.float32))


def test_step_nodes__name_every_op_as_the_importer_does_inside_calls_and_branches():
    concrete = _twice_called()
    names = {found.name for found in step_nodes(concrete.graph.as_graph_def())}
    flat = [op.name for op in flatten_graph(concrete.graph, batch_size=4)]
    assert set(flat) <= names
    assert sum("/" in name for name in flat) >= 6  # two calls' MatMul and Relu, both branches' op


def test_step_nodes__a_function_called_twice_gets_a_copy_for_its_second_call():
    graph_def = _twice_called().graph.as_graph_def()
    found = step_nodes(graph_def)
    calls = [f.node for f in found if f.node.op in ("PartitionedCall", "StatefulPartitionedCall")]
    assert len(calls) == 2 and calls[0].attr["f"].func.name != calls[1].attr["f"].func.name
    library = {f.signature.name for f in graph_def.library.function}
    assert {call.attr["f"].func.name for call in calls} <= library
    matmuls = [f for f in found if f.node.op == "MatMul"]
    matmuls[0].node.device, matmuls[1].node.device = "/device:CPU:0", "/device:CPU:1"
    assert matmuls[0].node is not matmuls[1].node  # each call's op can be placed on its own


def test_step_nodes__an_argument_inside_a_function_resolves_to_what_the_caller_passes():
    found = {f.name: f for f in step_nodes(_twice_called().graph.as_graph_def())}
    matmul = next(f for name, f in found.items() if f.node.op == "MatMul" and name.count("/") == 1)
    caller = found[matmul.name.split("/")[0]]
    assert matmul.data_sources == (caller.data_sources[0],) * 2
    with tf.Graph().as_default():  # the copied GraphDef still imports and runs
        graph_def = _twice_called().graph.as_graph_def()
        step_nodes(graph_def)
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as session:
            out = session.run("Identity:0", {"x:0": np.eye(4, dtype=np.float32)})
    assert out.shape == (4, 4)


def test_flattened_name__of_the_nodes_a_lowered_cond_case_and_while_run():
    """TensorFlow's lowering names a branch's node ``cond/then/_0/NAME``, a case's ``case/branch1/_9/NAME``,
    a loop body's ``while/body/_17/NAME``; the importer puts the function's own name in that place."""
    from measurers.tf.graph_def import flattened_name, lowered_names

    @tf.function(autograph=False)
    def step(x):
        y = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.exp(x), lambda: tf.sin(x))
        z = tf.switch_case(tf.constant(1), [lambda: y * 3.0, lambda: tf.tanh(y)])
        return tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.sigmoid(v)), (tf.constant(0), z))[1]

    concrete = step.get_concrete_function(tf.TensorSpec((4, 4), tf.float32))
    lowered = lowered_names(step_nodes(concrete.graph.as_graph_def()))
    flat = {op.name for op in flatten_graph(concrete.graph, batch_size=4)}
    run = {"cond/then/_0/cond/Exp", "switch_case/indexed_case/branch1/_9/switch_case/indexed_case/Tanh",
           "while/body/_17/while/Sigmoid", "while/cond/_16/while/Less"}
    assert {flattened_name(name, lowered) for name in run} <= flat
    assert flattened_name("cond/then", lowered) == "cond/then" and flattened_name("add", lowered) == "add"


def test_step_nodes__a_copied_function_gets_its_own_copies_of_the_functions_it_calls():
    """``step`` calls ``middle`` twice, ``middle`` calls ``inner`` (which branches) twice: the four calls of
    ``inner`` hold four FunctionDefs (the second ``middle`` had shared one with the first), and their ops and
    branches keep the importer's names (a branch was named after its copy)."""
    @tf.function(autograph=False)
    def inner(x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.exp(x), lambda: tf.sin(x))

    @tf.function(autograph=False)
    def middle(x):
        return inner(x) + inner(x * 2.0)

    @tf.function(autograph=False)
    def step(x):
        return middle(x) - middle(x * 3.0)

    concrete = step.get_concrete_function(tf.TensorSpec((4, 4), tf.float32))
    found = step_nodes(concrete.graph.as_graph_def())
    flat = [op.name for op in flatten_graph(concrete.graph, batch_size=4)]
    assert set(flat) <= {f.name for f in found}
    exps = [f.node for f in found if f.node.op == "Exp"]
    assert len(exps) == 4 and len({id(node) for node in exps}) == 4


def test_step_nodes__a_calls_output_is_read_from_the_op_inside_its_callee_that_returns_it():
    """The importer inlines a call and has no op by the call's name: a node reading the call's output reads
    what the callee returns, through the callee's own output identities, at the top level
    (``call:1``) and inside a function (``call:output:2``); a returned argument is what the caller passed."""
    @tf.function(autograph=False)
    def pair(x):
        return tf.nn.relu(x), x, tf.exp(x)

    @tf.function(autograph=False)
    def middle(x):
        relu, _, exp = pair(x)
        return tf.identity(exp), relu

    @tf.function(autograph=False)
    def step(x):
        exp, relu = middle(tf.sin(x))
        return tf.identity(exp), tf.identity(relu), tf.identity(pair(x)[1])

    found = {f.name: f for f in step_nodes(step.get_concrete_function(tf.TensorSpec((4,), tf.float32))
                                            .graph.as_graph_def())}

    def producer(name: str) -> str:  # past identities, to the op that makes the value
        while found[name].node.op in ("Identity", "IdentityN"):
            name = found[name].data_sources[0]
        return name

    outputs = [producer(name) for name in ("Identity", "Identity_1", "Identity_2")]
    assert [found[name].node.op for name in outputs] == ["Exp", "Relu", "Placeholder"]
    assert outputs[0].startswith("PartitionedCall/PartitionedCall/") and outputs[2] == "x"
