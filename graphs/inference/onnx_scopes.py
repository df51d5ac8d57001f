"""An ONNX node's module path from the metadata torch's current exporter writes.

torch's legacy (TorchScript) exporter names a node after its module path, ``/encoder/layers.0/self_attn/MatMul``,
which graphs.inference.assemble.scope_of reads. Its current one (``torch.onnx.export``'s default since torch
2.9, ``dynamo=True``) names nodes after their FX node, ``node_linear``, and records the path in the node's
``metadata_props``: ``pkg.torch.onnx.name_scopes`` is the repr of a list of the qualified names of the modules
the op was called in, outermost first, then the FX node's name (``['', 'encoder', 'encoder.layers.0',
'encoder.layers.0.self_attn', 'linear_2']``); ``namespace`` is the same walk as ``name: class`` pairs joined by
``/`` (``: __main__.M/att: torch.nn.modules.activation.MultiheadAttention/linear: aten.linear.default``). The
innermost module's qualified name is the scope the legacy name gives (``encoder.layers.0.self_attn``, ``""`` at
the top), so one model imported from either export groups the same.
"""

from __future__ import annotations

import ast

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
NAMESPACE = "namespace"


def recorded_scope(node) -> str | None:
    """The dotted path of the innermost module ``node``'s op was called in, as torch's exporter records it in
    the node's metadata; None when it records none that reads as torch's (the scope is then its name's)."""
    props = {prop.key: prop.value for prop in node.metadata_props}
    scopes = _name_scopes(props.get(NAME_SCOPES, ""))
    if scopes is None:
        scopes = _namespace_scopes(props.get(NAMESPACE, ""))
    if scopes is None:
        return None
    return scopes[-2] if len(scopes) > 1 else ""  # the last is the FX node's own name


def _name_scopes(text: str) -> list[str] | None:
    """``"['', 'att', 'linear']"`` -> its list of strings; None unless it is one (absent or malformed)."""
    try:
        value = ast.literal_eval(text) if text else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value
    return None


def _namespace_scopes(text: str) -> list[str] | None:
    """``": __main__.M/att: torch...MultiheadAttention/linear: aten.linear.default"`` -> ``['', 'att',
    'linear']``; None unless every ``/``-part is a ``name: class`` pair (another tool's ``namespace``)."""
    parts = text.split("/") if text else []
    if not parts or not all(": " in part for part in parts):
        return None
    return [part.partition(": ")[0] for part in parts]
