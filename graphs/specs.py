"""User specs ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION``: import the module, call the function.

Both importers (PyTorch and Keras) and the real measurers that rebuild a step from its spec read specs
the same way; every failure is one PlacerError that names the spec.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager

from graphs.errors import PlacerError, first_line, one_line


def spec_function(spec: str, what: str) -> tuple[Callable, str]:
    """The function a spec names, and its name. ``what`` names the spec's kind in errors ("torch")."""
    target, _, func_name = spec.rpartition(":")
    if not target or not func_name:
        raise PlacerError(f"{what} spec {spec!r}: expected MODULE:FUNCTION or path/to/file.py:FUNCTION")
    func = getattr(import_target(spec, target, what), func_name, None)
    if not callable(func):
        raise PlacerError(f"{what} spec {spec!r}: {target!r} has no function {func_name!r}")
    return func, func_name


def names_a_file(target: str) -> bool:
    """Whether a spec's part before ``:FUNCTION`` is a Python file's path, not a dotted module name."""
    return target.endswith(".py") or "/" in target


def check_spec_file(spec: str, what: str) -> None:
    """A file spec (``path/file.py:FUNCTION``) whose file is not there: one PlacerError naming it."""
    target = spec.rpartition(":")[0]
    if names_a_file(target) and not Path(target).is_file():
        raise PlacerError(f"{what} spec {spec!r}: no file {target!r}")


def absolute_spec(spec: str) -> str:
    """``spec`` with the file it names (``path/file.py:FUNCTION``, or a saved model file) made absolute, as
    graphs record it: a measurer rebuilding the step from another folder finds the file. A module spec
    (``MODULE:FUNCTION``) is kept as it is: it is found where Python finds modules."""
    target, sep, func_name = spec.rpartition(":")
    if not sep:
        return str(Path(spec).resolve()) if Path(spec).is_file() else spec
    if names_a_file(target) and Path(target).is_file():
        return f"{Path(target).resolve()}:{func_name}"
    return spec


def function_label(func: Callable) -> str:
    """``module:qualified name`` of a function passed instead of a spec (a ``functools.partial`` shows the
    function it wraps), for messages."""
    inner = getattr(func, "func", func)
    return f"{getattr(inner, '__module__', '?')}:{getattr(inner, '__qualname__', type(inner).__name__)}"


def call_spec(spec: str, what: str, around_call: Callable[[Callable], ContextManager] | None = None):
    """Call the function a spec names (no arguments); what it raises is reported as bad input.
    ``around_call(function)``: a context the call runs in, made once the function is found (its module
    imported)."""
    func, func_name = spec_function(spec, what)
    try:
        with around_call(func) if around_call else nullcontext():
            return func()
    except (Exception, SystemExit) as error:  # the user's code (sys.exit() in it too)
        raise PlacerError(f"{what} spec {spec!r}: {func_name}() raised {type(error).__name__}: "
                          f"{one_line(error, empty='')}") from error


def import_target(spec: str, target: str, what: str):
    """A module by dotted name, or a Python file by path."""
    check_spec_file(spec, what)
    try:
        if names_a_file(target):
            path = Path(target)
            module_spec = importlib.util.spec_from_file_location(_module_name(path), path)
            if module_spec is None:  # a file Python does not import (not .py): was "'NoneType' object has ..."
                raise PlacerError(f"{what} spec {spec!r}: {target!r} is not a Python file (.py)")
            module = importlib.util.module_from_spec(module_spec)
            _importable_as_a_script(path, module)
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(module.__name__, None)  # as Python's import drops a module that failed
                raise
            return module
        return importlib.import_module(target)
    except PlacerError:
        raise
    except (Exception, SystemExit) as error:  # ImportError, SyntaxError, anything the module raises on import
        raise PlacerError(f"{what} spec {spec!r}: cannot import {target!r}: {type(error).__name__}: "
                          f"{first_line(error)}") from error


def _importable_as_a_script(path: Path, module) -> None:
    """What ``python FILE`` gives the file: its module in ``sys.modules`` (a ``@dataclass`` under ``from
    __future__ import annotations`` looks its module up there: "'NoneType' object has no attribute
    '__dict__'") and its folder on the import path (a model split over files imports its neighbours; at the
    end of the path, so that a user's folder named ``graphs`` cannot shadow placer's own packages)."""
    sys.modules[module.__name__] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)


def _module_name(path: Path) -> str:
    """The name a user's file is imported under: its stem and its resolved path's digest, so that two files
    of one name in two folders (a/model.py, b/model.py) are two modules in ``sys.modules``."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    return f"placer_user_{path.stem}_{digest}"
