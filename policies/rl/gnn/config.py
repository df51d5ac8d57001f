"""The graph-neural placers' settings (``GnnConfig``), shared by `placer train` and `placer search`."""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass
from typing import Mapping

from graphs.errors import PlacerError, check_seed, is_whole_number
from policies.base import FAILURE_FACTOR

KINDS = ("gdp", "placeto", "giph")
GRAPH_NEURAL = (*KINDS, "hsdag")
"""Every graph-neural placer: they keep their own network sizes and batch in a search."""
ORDERS = ("topo", "reverse-topo", "bfs", "random")
GDP_ATTENTION_HEADS = 4  # GDP's attention across groups splits hidden_size among this many heads
# Changing it needs checkpoint.CHECKPOINT_VERSION raised: no weight's shape shows the head count, so a
# checkpoint trained with another would load and compute something else.
MAX_HIDDEN, MAX_LAYERS = 4096, 64  # far above what trains here; a checkpoint claiming more is damaged
MAX_PASSES = 64  # Placeto's greedy passes (2 by default): 10**8 decoded for minutes, deaf to --time-limit
MAX_LR = 1.0  # Adam's step size: beyond it the weights become NaN within an update
COUNTS = ("hidden_size", "num_layers", "batch_size", "episode_steps", "imitation_steps", "greedy_passes")


@dataclass(frozen=True)
class GnnConfig:
    kind: str = "gdp"
    """'gdp' (one shot: a device distribution per group), 'placeto' (re-place one group per step) or 'giph'
    (relocate any one group to another device per step, chosen among every (group, device) pair)."""
    hidden_size: int = 64
    """Width of every embedding (small: it must generalize from a few dozen graphs)."""
    num_layers: int = 3
    """Message-passing layers of the graph encoder."""
    batch_size: int = 16
    """GDP: placements sampled per update; Placeto, GiPH: episodes run side by side (each step measures them
    together)."""
    lr: float = 1e-3
    """Adam learning rate (also of fine-tuning from a checkpoint)."""
    entropy_coeff: float = 0.01
    """Weight of the mean per-decision entropy bonus."""
    grad_clip: float = 1.0
    """Global gradient-norm bound."""
    order: str = "topo"
    """Placeto: the order it visits the groups in: topo, reverse-topo, bfs (from the sources), random."""
    failure_factor: float = FAILURE_FACTOR
    """A failed (out-of-memory) placement is scored as this many times the worst ok runtime seen on the
    problem (the REINFORCE ranks only need it worst; Placeto's improvement rewards need it finite)."""
    episode_steps: int = 16
    """GiPH: relocation moves per episode (at most the number of groups times the devices minus one)."""
    discount: float = 0.95
    """GiPH: discount of later steps' rewards in a step's return."""
    random_start: float = 0.5
    """GiPH training across a family: the share of episode batches that start from a random placement
    (the rest from the fastest single device, ``Slot.fastest_device_start``), so the policy learns moves
    from varied states."""
    imitation_steps: int = 100
    """Adam steps fitting a warm start (GDP; Placeto starts its episodes at the warm start instead)."""
    greedy_passes: int = 1
    """Placeto: greedy passes over the groups in its zero-shot decode, each from where the one before ended,
    with no measurement in between (training episodes are one pass; ``placer search`` decodes with
    ``PlacetoPolicy.search_defaults``)."""
    seed: int = 0
    names: InitVar[Mapping[str, str] | None] = None
    """Not a setting (neither stored nor in ``fields()``): what the messages about a bad value call each field,
    e.g. placer train's flags (``{"lr": "--lr"}``); a field not in it, or no mapping, by its own name."""

    def __post_init__(self, names: Mapping[str, str] | None) -> None:
        def name(field: str) -> str:
            return (names or {}).get(field, field)

        for field in COUNTS:
            if not is_whole_number(getattr(self, field)):
                raise PlacerError(f"{name(field)} must be a whole number, got {getattr(self, field)!r}")
        if self.kind not in KINDS:
            raise PlacerError(f"unknown graph-neural policy {self.kind!r} (known: {', '.join(KINDS)})")
        if self.order not in ORDERS:
            raise PlacerError(f"unknown --order {self.order!r} (known: {', '.join(ORDERS)})")
        if self.batch_size < 2:
            raise PlacerError(f"{name('batch_size')} must be at least 2, got {self.batch_size}")
        if not 4 <= self.hidden_size <= MAX_HIDDEN:
            raise PlacerError(f"{name('hidden_size')} must be in 4..{MAX_HIDDEN}, got {self.hidden_size}")
        if not 1 <= self.num_layers <= MAX_LAYERS:
            raise PlacerError(f"{name('num_layers')} must be in 1..{MAX_LAYERS}, got {self.num_layers}")
        if self.kind == "gdp" and self.hidden_size % GDP_ATTENTION_HEADS:
            raise PlacerError(f"gdp's {name('hidden_size')} must be a multiple of {GDP_ATTENTION_HEADS} (its "
                              f"attention heads), got {self.hidden_size}")
        if not 0 <= self.entropy_coeff < math.inf:  # NaN too
            raise PlacerError(f"{name('entropy_coeff')} must be a finite number >= 0, got {self.entropy_coeff}")
        if not 0 < self.grad_clip < math.inf:  # NaN too; 0 would zero every update, below it ascend
            raise PlacerError(f"{name('grad_clip')} must be a finite number above 0, got {self.grad_clip}")
        if self.imitation_steps < 0:
            raise PlacerError(f"{name('imitation_steps')} must be at least 0, got {self.imitation_steps}")
        if not 1 <= self.greedy_passes <= MAX_PASSES:
            raise PlacerError(f"{name('greedy_passes')} must be in 1..{MAX_PASSES}, got {self.greedy_passes}")
        if self.episode_steps < 1:
            raise PlacerError(f"{name('episode_steps')} must be at least 1, got {self.episode_steps}")
        if not 0.0 < self.discount <= 1.0:
            raise PlacerError(f"{name('discount')} must be in (0, 1], got {self.discount}")
        if not 0.0 <= self.random_start <= 1.0:
            raise PlacerError(f"random_start must be in [0, 1], got {self.random_start}")
        if not 0 < self.lr <= MAX_LR:
            raise PlacerError(f"{name('lr')} must be in (0, {MAX_LR:g}], got {self.lr}")
        if not self.failure_factor > 1.0:
            raise PlacerError(f"failure_factor must be above 1, got {self.failure_factor}")
        check_seed(self.seed, name("seed"))

    @property
    def architecture(self) -> dict:
        """What a checkpoint's network depends on (the rest may change when fine-tuning)."""
        return {"kind": self.kind, "hidden_size": self.hidden_size, "num_layers": self.num_layers}
