"""FLOPs of an einsum, one formula for every importer (TensorFlow's ``Einsum``, ONNX's and OpenVINO's),
contracted as a runtime does: an operand first sums the indices that neither a later operand nor the output
has (1 FLOP per element it reads), then the operands are multiplied left to right, 2 FLOPs per point of each
pair's index space (a matmul's multiply-add), the product keeping the indices still needed. A lone operand
that only permutes (a transpose) costs 0, as a data-movement op does.
"""

from __future__ import annotations

import math


def einsum_flops(equation: str | bytes, shapes: list[tuple[int, ...] | None]) -> float:
    """FLOPs of ``equation`` (``"bij,bjk->bik"``; an implicit output and ``...`` too) over operands of
    ``shapes`` (tuples of ints, None for an unknown rank). An equation or a shape it cannot read gives 0."""
    equation = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    operands = _einsum_operands(equation, shapes)
    if operands is None:
        return 0.0
    lhs, arrow, output = equation.partition("->")
    if not arrow:  # implicit output: the indices used once, and any ellipsis
        output = "..." + "".join(sorted(c for c in lhs if c.isalpha() and lhs.count(c) == 1))
    sizes: dict[str, int] = {}
    for letters, shape in operands:
        for letter, size in zip(letters, shape):
            sizes[letter] = max(sizes.get(letter, 1), size)
    wanted = set(output.replace("...", ""))
    if "..." in output:
        wanted |= {c for letters, _ in operands for c in letters if c.isdigit()}
    flops, current = 0.0, None
    for index, (letters, _) in enumerate(operands):
        later = wanted.union(*(set(other) for other, _ in operands[index + 1:]))
        own = set(letters)
        solo = own - later - (current or set())
        if solo:
            flops += math.prod(sizes[c] for c in own)
            own -= solo
        if current is None:
            current = own
        else:
            space = current | own
            flops += 2.0 * math.prod(sizes[c] for c in space)
            current = space & later
    return flops


def _einsum_operands(equation: str, ins: list) -> list[tuple[str, tuple[int, ...]]] | None:
    """[(index letters, shape)] per operand; an ellipsis's dims become digit indices, aligned from the right
    (broadcast alike in every operand)."""
    terms = equation.partition("->")[0].split(",")
    if not equation or len(terms) != len(ins) or any(shape is None for shape in ins):
        return None
    operands = []
    for term, shape in zip(terms, ins):
        named = term.replace("...", "")
        hidden = len(shape) - len(named)
        if (named and not named.isalpha()) or hidden < 0 or hidden > 10 or (hidden and "..." not in term):
            return None
        head, _, tail = term.partition("...")
        operands.append((head + "".join(str(9 - i) for i in reversed(range(hidden))) + tail, tuple(shape)))
    return operands
