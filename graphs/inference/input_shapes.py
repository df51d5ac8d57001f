"""Input shapes of an imported inference model: the sizes a user gives (``--input-shape``), and the rule
for the dims a model leaves without a size.

A model exported with dynamic axes (``torch.onnx.export(..., dynamic_axes=...)``, an IR converted without
``input=``) has input dims without a size. FLOPs and tensor bytes need sizes, so:

- a size given for an axis an ONNX model names (``dim_param``, e.g. "batch") is that axis's size in every
  input that names it: ``--input-shape a=8,64`` sizes b ``["batch", 64]`` at 8 too, as the model says they
  are one size (costing b's branch at batch 1 undercounted it, silently);
- a leading input dim without a size is the batch and counts as 1 (batch-1 inference, as the benchmarks)
  when no sizes are given; when some are, a leading dim neither given nor carried by its name must be given
  too, as a 1 there is likely not the batch meant for the others. An OpenVINO IR names no dims, so each of
  its inputs with a dynamic leading dim is given, or none is;
- any other input dim without a size must be given, ``--input-shape NAME=D0,D1,...``; else the import is
  refused. Counting it as 1 shrinks an image's height and width to 1: a U-Net's FLOPs came out 860x small.

When sizes are given, every input's resulting shape is recorded in the graph's ``meta["input_shapes"]``
(those given, carried and fixed), and the OpenVINO measurer runs the model reshaped to them.
"""

from __future__ import annotations

from typing import Sequence

from graphs.errors import PlacerError

InputShapes = dict[str, tuple[int, ...]]  # input name -> every dim's size
Dims = tuple  # one entry per axis: its size, or None where the model gives none (Dims | None: rank unknown)
DimNames = dict[str, tuple]  # input name -> each axis's symbolic name (ONNX dim_param), or None
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


def sized_inputs(where: str, inputs: dict[str, Dims], given: InputShapes,
                 dim_names: DimNames | None = None) -> InputShapes:
    """Every input's sizes: the model's, with ``given`` applied, carried along the dims ``dim_names`` says
    are one, and a leading dim without a size as 1 (rules above). PlacerError naming ``where`` for a name
    that is no input, a rank or a size that contradicts the model, two sizes for one named dim, or a dim
    left without a size that the rules do not allow."""
    unknown = sorted(set(given) - set(inputs))
    if unknown:
        raise PlacerError(f"{where}: --input-shape names {', '.join(map(repr, unknown))}, but the model's inputs "
                          f"are {', '.join(map(repr, inputs))}")
    names = dim_names or {}
    checked = {name: sizes if inputs[name] is None else _given(where, name, inputs[name], sizes)
               for name, sizes in given.items()}  # an input of unknown rank takes the sizes given as they are
    named_sizes = _named_sizes(where, inputs, checked, names)
    # a size given for an input whose own leading dim is open: the others' open leading dims must be given too
    # (restating a fixed input's shape leaves them at 1, as no sizes at all do)
    batch_given = any(inputs[name] and inputs[name][0] is None for name in checked)
    sized: InputShapes = {}
    unsized = []  # (name, dims, missing axes) of every input with a dim left without a size
    for name, dims in inputs.items():
        if name in checked:
            sized[name] = checked[name]
            continue
        if dims is None:  # not even its rank is known: an import costed it 0 FLOPs and bytes, OpenVINO refuses it
            unsized.append((name, None, None, None))
            continue
        carried = tuple(named_sizes.get(dim_name, size) if size is None else size
                        for size, dim_name in zip(dims, names.get(name) or (None,) * len(dims)))
        missing = [axis for axis, size in enumerate(carried) if size is None and (axis > 0 or batch_given)]
        if missing:
            unsized.append((name, dims, carried, missing))
        sized[name] = tuple(1 if size is None else size for size in carried)
    if unsized:
        raise PlacerError(_unsized_message(where, unsized))
    return sized


def _named_sizes(where: str, inputs: dict[str, Dims], checked: InputShapes, names: DimNames) -> dict[str, int]:
    """{dim name: size} of the named dynamic axes of the inputs given; one name given two sizes is refused,
    since the model says the axes are one."""
    sizes: dict[str, int] = {}
    source: dict[str, str] = {}
    for name, given_sizes in checked.items():
        for axis, (size, dim_name) in enumerate(zip(inputs[name] or (), names.get(name) or ())):
            if size is not None or not dim_name:
                continue
            wanted = given_sizes[axis]
            if sizes.setdefault(dim_name, wanted) != wanted:
                raise PlacerError(f"{where}: --input-shape gives dim {dim_name!r} size {sizes[dim_name]} in "
                                  f"{source[dim_name]!r} and {wanted} in {name!r}, but the model names them one dim")
            source.setdefault(dim_name, name)
    return sizes


def _unsized_message(where: str, unsized: list) -> str:
    """One error for every input left without sizes, so a user gives them all at once."""
    parts, flags = [], []
    for name, dims, carried, missing in unsized:
        if dims is None:
            parts.append(f"input {name!r} has no known rank (nor any size)")
            flags.append(f"--input-shape {name}=D0,D1,...")
            continue
        noun = "axis" if len(missing) == 1 else "axes"
        why = " (sizes are given for other inputs, and no dim name ties its leading dim to theirs)" if 0 in missing \
            else ""
        parts.append(f"input {name!r} has no size for {noun} {', '.join(map(str, missing))} "
                     f"(shape {_shape_text(dims)}){why}")
        example = ",".join("N" if axis in missing else str(size or 1) for axis, size in enumerate(carried))
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
