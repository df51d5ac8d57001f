"""The graph-neural placers' checkpoint file: what `placer train` writes and `--init` reads.

One ``torch.save`` dict (tensors and plain values only, read back with ``weights_only=True``)::

    format: "placer-gnn"          version: CHECKPOINT_VERSION
    policy: "gdp" | "placeto" | "giph"   feature_layout: inputs.FEATURE_LAYOUT (column names)
    architecture: {kind, hidden_size, num_layers}
    trainer: GnnTrainer.state()   (network, optimizer, generators, iteration)
    progress: {measurements_used, wall_s, updates, problems: ["graph@machine", ...], budget, ...}

Beside it, ``CHECKPOINT.resume`` (``write_resume_state``): each problem's memo of measured placements, which
only `placer train --resume` reads. A 600,000-measurement run's memo is tens of MB; kept apart, the checkpoint
that `--init` reads (and the committed ones) stays at the network's size.

``read_checkpoint`` refuses, with one PlacerError naming the file and the problem: a missing file, a
damaged or truncated one (checksums included), a file that is not such a checkpoint (another policy's
learner.pt included), a checkpoint of the other policy, one whose feature layout or format version differs
from this code's, one whose architecture is not plain whole numbers or whose visiting order is unknown, and
one whose weights do not fit its architecture (compared on the meta device: nothing is allocated) or are not
finite.
Written to a temporary file and renamed, so an interrupted save never leaves half a checkpoint.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path

import torch

from graphs.errors import PlacerError
from policies.rl.gnn.inputs import FEATURE_LAYOUT
from policies.rl.learner_file import load_torch_file
from policies.rl.loop import save_state

FORMAT = "placer-gnn"
RESUME_FORMAT = "placer-gnn-resume"
CHECKPOINT_VERSION = 1
PRETRAINED_DIR = Path(__file__).parent / "pretrained"


def pretrained_path(policy: str) -> Path:
    """Where the committed checkpoint of ``policy`` lies (it may not exist)."""
    return PRETRAINED_DIR / f"{policy}.pt"


def layout_lists() -> dict[str, list[str]]:
    return {key: list(columns) for key, columns in FEATURE_LAYOUT.items()}


def write_checkpoint(path: str | os.PathLike, policy: str, trainer_state: dict, progress: dict) -> None:
    state = {"format": FORMAT, "version": CHECKPOINT_VERSION, "policy": policy, "feature_layout": layout_lists(),
             "architecture": {k: trainer_state["config"][k] for k in ("kind", "hidden_size", "num_layers")},
             "trainer": trainer_state, "progress": progress}
    save_state(state, path)


def resume_path(checkpoint: str | os.PathLike) -> Path:
    """Where the resume state of ``checkpoint`` lies: beside it, ``CHECKPOINT.resume``."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + ".resume")


def write_resume_state(checkpoint: str | os.PathLike, updates: int, slots: list[dict]) -> None:
    """Each problem's ``Slot.progress_state`` at ``updates`` updates, beside ``checkpoint`` (written first: a
    save cut short between the two files leaves a resume state newer than its checkpoint, which
    ``read_resume_state`` refuses)."""
    save_state({"format": RESUME_FORMAT, "updates": int(updates), "slots": slots}, resume_path(checkpoint))


def read_resume_state(checkpoint: str | os.PathLike, updates: int) -> list[dict] | None:
    """The slots ``write_resume_state`` wrote for ``checkpoint`` at ``updates`` updates; None when there is no
    resume file (a committed checkpoint, or one written before the file existed). A damaged file, another
    kind of file, or one written at another update than the checkpoint: one PlacerError naming it."""
    path = resume_path(checkpoint)
    if not path.exists():
        return None
    if not path.is_file():
        raise PlacerError(f"{path}, the resume state of checkpoint {checkpoint}, is not a file: move it")
    state = load_torch_file(path, "resume state")
    if not isinstance(state, dict) or state.get("format") != RESUME_FORMAT or not isinstance(state.get("slots"), list):
        raise PlacerError(f"{path} is not the resume state of a gdp/placeto/giph checkpoint")
    if state.get("updates") != updates:
        raise PlacerError(f"{path} was written at update {state.get('updates')} and its checkpoint {checkpoint} at "
                          f"update {updates} (a save was cut short): remove {path} to resume without the memo of "
                          f"measured placements")
    return state["slots"]


def read_checkpoint(path: str | os.PathLike, policy: str) -> dict:
    """The checkpoint at ``path`` for ``policy``, checked (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise PlacerError(f"checkpoint {path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    state = load_torch_file(path, "checkpoint")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PlacerError(f"checkpoint {path} is not a gdp/placeto/giph checkpoint (a checkpoint of another "
                          "policy, or another file)")
    if state.get("version") != CHECKPOINT_VERSION:
        raise PlacerError(f"checkpoint {path} has format version {state.get('version')}, this version reads "
                          f"{CHECKPOINT_VERSION}: retrain it with placer train")
    if state.get("policy") != policy:
        raise PlacerError(f"checkpoint {path} is a {state.get('policy')} checkpoint, not {policy}")
    if state.get("feature_layout") != layout_lists():
        raise PlacerError(f"checkpoint {path} was trained on another feature layout than this version's "
                          f"({layout_difference(state.get('feature_layout'))}): retrain it with placer train")
    try:
        state["trainer"]["net"], state["architecture"]["hidden_size"]
    except (KeyError, TypeError):
        raise PlacerError(f"checkpoint {path} lacks its network weights or architecture") from None
    if not isinstance(state["trainer"].get("config"), dict):  # the search reads its trained --order from it
        raise PlacerError(f"checkpoint {path} lacks its trainer settings (trainer.config)")
    _check_progress(path, state.get("progress"))
    check_network(path, policy, state)
    return state


def _check_progress(path: Path, progress) -> None:
    """The counters a resumed training run goes on from are numbers (a text one ended `train --resume` in a
    traceback): measurements, updates, idle visits and the round's problem indices whole and not negative,
    the wall time finite. (An index past the problems is refused by the resume, which knows them.)"""
    if not isinstance(progress, dict):  # a search starts from the weights alone; `train --resume` says it lacks it
        return
    for key in ("measurements_used", "updates", "idle"):
        value = progress.get(key, 0)
        if not _whole(value):
            raise PlacerError(f"checkpoint {path}: progress.{key} is {value!r}, not a whole number of 0 or more")
    visits = progress.get("round", [])  # the problems left to visit in the round under way, by index
    if not isinstance(visits, list) or not all(_whole(k) for k in visits):
        raise PlacerError(f"checkpoint {path}: progress.round is {visits!r}, not a list of problem indices")
    wall_s = progress.get("wall_s", 0.0)
    if isinstance(wall_s, bool) or not isinstance(wall_s, numbers.Real) or not math.isfinite(wall_s) or wall_s < 0:
        raise PlacerError(f"checkpoint {path}: progress.wall_s is {wall_s!r}, not a time in seconds")
    for key in ("settings", "config"):  # the resume compares them key by key
        if not isinstance(progress.get(key, {}), dict):
            raise PlacerError(f"checkpoint {path}: progress.{key} is {progress[key]!r}, not a table of settings")
    for key in ("problems", "problem_digests"):  # names and contents of the problems trained on
        texts = progress.get(key, [])
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise PlacerError(f"checkpoint {path}: progress.{key} is {texts!r}, not a list of strings")


def _whole(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= 0


def check_network(path: Path, policy: str, state: dict) -> None:
    """The architecture is one this version builds (plain ints, a known visiting order), the weights fit it,
    and every weight is finite: else the run would fail (or sample from NaN) after its folder is made.
    Also what a resumed search's own learner.pt is checked with (policy.initial_weights)."""
    from policies.rl.gnn.config import ORDERS, GnnConfig
    from policies.rl.gnn.network import make_net

    architecture = state["architecture"]
    if architecture.get("kind") != policy:
        raise PlacerError(f"checkpoint {path} holds a {architecture.get('kind')!r} network, not {policy}")
    sizes = (architecture.get("hidden_size"), architecture.get("num_layers"))
    if not all(type(size) is int for size in sizes):  # "64" or True would pass int() and fail in the run
        raise PlacerError(f"checkpoint {path}: its architecture {architecture} needs whole numbers for "
                          "hidden_size and num_layers")
    order = state["trainer"]["config"].get("order", GnnConfig.order)
    if order not in ORDERS:
        raise PlacerError(f"checkpoint {path}: trainer.config.order {order!r} is no visiting order "
                          f"(known: {', '.join(ORDERS)})")
    try:
        config = GnnConfig(kind=policy, hidden_size=sizes[0], num_layers=sizes[1])
    except PlacerError as exc:
        raise PlacerError(f"checkpoint {path}: its weights do not fit its architecture {architecture} "
                          f"({exc})") from None
    with torch.device("meta"):  # shapes only: a damaged file claiming a huge network allocates nothing
        net = make_net(policy, config.hidden_size, config.num_layers)
    check_weights(path, net, state["trainer"]["net"], f"its architecture {architecture}")


def check_weights(path: Path, net: torch.nn.Module, weights, network: str) -> None:
    """``weights`` (a state dict read from ``path``) has every entry of ``net``, of its shape, nothing more,
    and only finite values: else loading them fails (or sampling from them does) after the run folder is
    made. ``net`` may live on the meta device; ``network`` names it in the error."""
    problem = _mismatch(net.state_dict(), weights)
    if problem:
        raise PlacerError(f"checkpoint {path}: its weights do not fit {network} ({problem})")
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise PlacerError(f"checkpoint {path}: weight {name} holds NaN or infinite values")


def _mismatch(expected: dict, weights) -> str:
    """How ``weights`` differ from the state dict ``expected`` (names, tensors, shapes); "" when they fit."""
    if not isinstance(weights, dict):
        return f"a {type(weights).__name__}, not a dict of tensors"
    missing, unexpected = [k for k in expected if k not in weights], [k for k in weights if k not in expected]
    if missing or unexpected:
        return f"missing {missing[:3]}, unexpected {unexpected[:3]}"
    for name, tensor in expected.items():
        if not torch.is_tensor(weights[name]):
            return f"{name} is a {type(weights[name]).__name__}, not a tensor"
        if weights[name].layout != torch.strided or weights[name].device.type != "cpu":  # sparse, or meta
            return (f"{name} is not a dense CPU tensor ({str(weights[name].layout).removeprefix('torch.')} on "
                    f"{weights[name].device.type})")
        if weights[name].shape != tensor.shape:
            return f"size mismatch for {name}: {list(weights[name].shape)} in the file, {list(tensor.shape)} here"
        if weights[name].is_floating_point() != tensor.is_floating_point():  # integer weights loaded as zeros
            return f"{name} holds {weights[name].dtype}, not {tensor.dtype}"
    return ""


def layout_difference(stored) -> str:
    if not isinstance(stored, dict):
        return "no layout stored"
    for key, columns in layout_lists().items():
        if stored.get(key) != columns:
            return f"{key} columns {stored.get(key)} instead of {columns}"
    return "different feature groups"
