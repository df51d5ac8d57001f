"""The graph-neural placers' checkpoint file: what `placer train` writes and `--init` reads.

One ``torch.save`` dict (tensors and plain values only, read back with ``weights_only=True``)::

    format: "placer-gnn"          version: CHECKPOINT_VERSION
    policy: "gdp" | "placeto" | "giph"   feature_layout: inputs.FEATURE_LAYOUT (column names)
    architecture: {kind, hidden_size, num_layers}
    trainer: GnnTrainer.state()   (network, optimizer, generators, iteration)
    progress: {measurements_used, wall_s, updates, problems: ["graph@machine", ...], budget, ...}

``read_checkpoint`` refuses, with one PlacerError naming the file and the problem: a missing file, a
damaged or truncated one (checksums included), a file that is not such a checkpoint (another policy's
learner.pt included), a checkpoint of the other policy, one whose feature layout or format version differs
from this code's, and one whose weights do not fit its architecture or are not finite.
Written to a temporary file and renamed, so an interrupted save never leaves half a checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from graphs.errors import PlacerError
from policies.rl.gnn.inputs import FEATURE_LAYOUT
from policies.rl.learner_file import load_torch_file
from policies.rl.loop import save_state

FORMAT = "placer-gnn"
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
                          f"({_layout_difference(state.get('feature_layout'))}): retrain it with placer train")
    try:
        state["trainer"]["net"], state["architecture"]["hidden_size"]
    except (KeyError, TypeError):
        raise PlacerError(f"checkpoint {path} lacks its network weights or architecture") from None
    if not isinstance(state["trainer"].get("config"), dict):  # the search reads its trained --order from it
        raise PlacerError(f"checkpoint {path} lacks its trainer settings (trainer.config)")
    _check_network(path, policy, state)
    return state


def _check_network(path: Path, policy: str, state: dict) -> None:
    """The architecture is one this version builds, the weights fit it, and every weight is finite: else
    the run would fail (or sample from NaN) after its folder is made."""
    from policies.rl.gnn.config import GnnConfig
    from policies.rl.gnn.network import make_net

    architecture = state["architecture"]
    if architecture.get("kind") != policy:
        raise PlacerError(f"checkpoint {path} holds a {architecture.get('kind')!r} network, not {policy}")
    try:
        config = GnnConfig(kind=policy, hidden_size=int(architecture["hidden_size"]),
                           num_layers=int(architecture["num_layers"]))
        make_net(policy, config.hidden_size, config.num_layers).load_state_dict(state["trainer"]["net"])
    except (PlacerError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise PlacerError(f"checkpoint {path}: its weights do not fit its architecture {architecture} "
                          f"({str(exc).splitlines()[0]})") from None
    for name, tensor in state["trainer"]["net"].items():
        if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise PlacerError(f"checkpoint {path}: weight {name} holds NaN or infinite values")


def _layout_difference(stored) -> str:
    if not isinstance(stored, dict):
        return "no layout stored"
    for key, columns in layout_lists().items():
        if stored.get(key) != columns:
            return f"{key} columns {stored.get(key)} instead of {columns}"
    return "different feature groups"
