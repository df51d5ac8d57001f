"""Input shapes of an imported inference model: the sizes a user gives (``--input-shape``), and the rule
for the dims a model leaves without a size.

A model exported with dynamic axes (``torch.onnx.export(..., dynamic_axes=...)``, an IR converted without
``input=``) has input dims without a size. FLOPs and tensor bytes need sizes, so:

- a leading input dim without a size is the batch and counts as 1 (batch-1 inference, as the benchmarks);
- any other input dim without a size must be given, ``--input-shape NAME=D0,D1,...``; else the import is
  refused. Counting it as 1 shrinks an image's height and width to 1: a U-Net's FLOPs came out 860x small.

The shapes given are recorded in the graph's ``meta["input_shapes"]``, and the OpenVINO measurer runs the
model reshaped to them.
"""

from __future__ import annotations

from typing import Sequence

from graphs.errors import PlacerError

InputShapes = dict[str, tuple[int, ...]]  # input name -> every dim's size
Dims = tuple  # one entry per axis: its size, or None where the model gives none
MAX_SIZE = 2**31 - 1  # one axis; the tensors' byte totals are checked when the graph is assembled


def parse_input_shapes(texts: Sequence[str] | None) -> InputShapes:
    """``["x=1,3,64,64", ...]`` -> ``{"x": (1, 3, 64, 64)}``; a malformed entry or a name given twice is one
    PlacerError."""
    shapes: InputShapes = {}
    for text in texts or ():
        name, equals, dims_text = text.rpartition("=")
        try:
            dims = tuple(int(d) for d in dims_text.split(","))
        except ValueError:
            dims = ()
        if not equals or not name or not dims or min(dims) < 1 or max(dims) > MAX_SIZE:
            raise PlacerError(f"--input-shape {text!r}: expected NAME=D0,D1,... with every size a whole number "
                              f"from 1 to {MAX_SIZE} (e.g. x=1,3,224,224)")
        if name in shapes:
            raise PlacerError(f"--input-shape: input {name!r} is given twice")
        shapes[name] = dims
    return shapes


def sized_inputs(where: str, inputs: dict[str, Dims], given: InputShapes) -> InputShapes:
    """Every input's sizes: the model's, with ``given`` applied and a leading dim without a size as 1.
    PlacerError naming ``where`` for a name that is no input, a rank or a size that contradicts the model,
    or a dim past the leading one left without a size."""
    unknown = sorted(set(given) - set(inputs))
    if unknown:
        raise PlacerError(f"{where}: --input-shape names {', '.join(map(repr, unknown))}, but the model's inputs "
                          f"are {', '.join(map(repr, inputs))}")
    sized: InputShapes = {}
    unsized = []  # (name, dims, missing axes) of every input with a dim past the leading one without a size
    for name, dims in inputs.items():
        if name in given:
            sized[name] = _given(where, name, dims, given[name])
            continue
        missing = [axis for axis, size in enumerate(dims) if size is None and axis > 0]
        if missing:
            unsized.append((name, dims, missing))
        sized[name] = tuple(1 if size is None else size for size in dims)
    if unsized:
        raise PlacerError(_unsized_message(where, unsized))
    return sized


def _unsized_message(where: str, unsized: list) -> str:
    """One error for every input left without sizes, so a user gives them all at once."""
    parts, flags = [], []
    for name, dims, missing in unsized:
        noun = "axis" if len(missing) == 1 else "axes"
        parts.append(f"input {name!r} has no size for {noun} {', '.join(map(str, missing))} "
                     f"(shape {_shape_text(dims)})")
        example = ",".join(str(size) if size else "1" if axis == 0 else "N" for axis, size in enumerate(dims))
        flags.append(f"--input-shape {name}={example}")
    pronoun = "it" if len(unsized) == 1 else "them"
    return f"{where}: {'; '.join(parts)}; give {pronoun} with {' '.join(flags)}"


def _given(where: str, name: str, dims: Dims, sizes: tuple[int, ...]) -> tuple[int, ...]:
    if len(sizes) != len(dims):
        raise PlacerError(f"{where}: --input-shape {name} has {len(sizes)} dims, but the input has {len(dims)} "
                          f"(shape {_shape_text(dims)})")
    for axis, (size, wanted) in enumerate(zip(dims, sizes)):
        if size is not None and size != wanted:
            raise PlacerError(f"{where}: --input-shape {name} gives axis {axis} size {wanted}, but the model "
                              f"fixes it at {size} (shape {_shape_text(dims)})")
    return sizes


def _shape_text(dims: Dims) -> str:
    return "[" + ", ".join("?" if size is None else str(size) for size in dims) + "]"
