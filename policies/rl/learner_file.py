"""A search learner's checkpoint file (``learner.pt`` in a run's checkpoint folder), read and checked without
RLlib, so a resumed search can refuse a damaged one before it starts anything. Every learner writes it:
seq2seq / post / ppo (policies/rl/loop.py), the hierarchical planner and the graph-neural placers; each
holds at least its ``iteration`` and ``measurements_used``."""

from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path

import torch

from graphs.errors import PlacerError, first_line

CHECKPOINT_FILE = "learner.pt"


def load_torch_file(path: str | os.PathLike, what: str):
    """``torch.load(path, weights_only=True)`` of a checkpoint, checked: a damaged or truncated file (its zip
    archive's checksums included: torch.load does not check them, so flipped bytes in a tensor would load as
    other weights) is one PlacerError naming ``what`` and the file."""
    try:  # a flipped byte in the zip's own records raises what zipfile meets: UnicodeDecodeError, BadZipFile...
        bad = _failing_member(path)
    except Exception as exc:  # noqa: BLE001
        raise _damaged(what, path, exc) from None
    if bad is not None:
        raise PlacerError(f"{what} {path} is damaged: {bad} fails its checksum")
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol note: the error below says it all
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001  torch raises RuntimeError, EOFError, UnpicklingError...
        if str(exc).startswith("Weights only load failed"):  # torch's advice to load it unsafely is not ours
            reason = str(exc).partition("WeightsUnpickler error:")[2].strip().split("\n")[0] or "unreadable"
            raise PlacerError(f"{what} {path} is damaged or not a checkpoint placer wrote: torch's safe loader "
                              f"refuses it ({reason})") from None
        raise _damaged(what, path, exc) from None


def _damaged(what: str, path, exc: Exception) -> PlacerError:
    """The error for a file that could not be read: the exception's type and first line."""
    return PlacerError(f"{what} {path} is damaged or truncated ({type(exc).__name__}: {first_line(exc, 'unreadable')})")


def _failing_member(path: str | os.PathLike) -> str | None:
    """The first member of a zip checkpoint whose checksum fails (torch.save's format), None when all pass or
    the file is no zip (an older format, left to torch.load)."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        return archive.testzip()


def read_learner_state(path: str | os.PathLike) -> dict:
    """A run's learner checkpoint (``learner.pt``, every learner's) as the dict it saved; a damaged,
    truncated or foreign file is one PlacerError naming it."""
    state = load_torch_file(path, "learner checkpoint")
    if not isinstance(state, dict) or not all(isinstance(state.get(key), int)
                                              for key in ("iteration", "measurements_used")):
        raise PlacerError(f"learner checkpoint {path} is not a learner's checkpoint (no iteration and "
                          f"measurement counts)")
    return state


def check_learner_config(path: str | os.PathLike, saved: dict, config, keys: tuple[str, ...],
                         defaults: dict | None = None) -> None:
    """Refuse a learner checkpoint whose ``saved`` config differs from this run's ``config`` on one of ``keys``:
    settings that change what the network's weights mean (its shape, how its logits are scaled, the order it
    decodes in). ``defaults``: the value of a key that checkpoints older than it do not hold; such a key
    without a default is not checked."""
    defaults = defaults or {}
    for key in keys:
        if key not in saved and key not in defaults:
            continue
        theirs = saved.get(key, defaults.get(key))
        if theirs != getattr(config, key):
            raise PlacerError(f"checkpoint {path} was trained with {key}={theirs!r}, this run has "
                              f"{getattr(config, key)!r}")


def checkpoint_progress(checkpoint_dir: str | os.PathLike) -> tuple[int, int]:
    """(iterations, measurements) a run resumed from ``checkpoint_dir`` starts at; (0, 0) without a
    checkpoint. The search job numbers a resumed run's log rows and its progress from it, and checks with
    it that a run to resume has a readable checkpoint before it changes the run folder."""
    path = Path(checkpoint_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return 0, 0
    state = read_learner_state(path)
    return state["iteration"], state["measurements_used"]
