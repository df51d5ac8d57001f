"""A problem as the graph-neural trainer holds it (``Slot``): its inputs as tensors, how its placements are
measured (through a ``BudgetedMeasurer``: budget, timing, ``on_measurement``), a memo so that a placement
sampled again costs nothing (the searches' accounting), and its best so far. No RLlib here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from graphs.errors import PlacerError, first_line
from graphs.features import FEATURE_COLUMNS
from policies.base import FAILED_COST_S, FAILURE_FACTOR, BudgetedMeasurer, RunContext
from policies.problem import PlacementProblem
from policies.rl.gnn.inputs import GraphInputs, graph_inputs

if TYPE_CHECKING:
    from policies.rl.warm_start import WarmStart

RESTORE_ERRORS = (KeyError, TypeError, ValueError, RuntimeError, AttributeError)
"""What restoring a saved state raises where a section is missing or misshapen (a damaged or foreign file)."""


@dataclass
class Slot:
    problem: PlacementProblem
    counter: BudgetedMeasurer
    failure_factor: float = FAILURE_FACTOR
    inputs: GraphInputs = field(init=False)
    tensors: dict[str, torch.Tensor] = field(init=False)
    adjacency: torch.Tensor = field(init=False)  # (G, G) float64 bytes between groups, both directions
    work: torch.Tensor = field(init=False)  # (G, D) float64 compute time of each group on each device
    total_work_s: float = field(init=False)  # every group on its fastest device, summed
    memo: dict[bytes, float] = field(default_factory=dict)  # unit placement bytes -> cost (runtime or failed)
    best_runtime_s: float = math.inf
    best_units: np.ndarray | None = None  # (G,) int64
    worst_ok_s: float = 0.0
    warm_start_runtime_s: float = math.nan  # the best warm-start candidate's step, once measured here
    warm_start_note: str = ""  # "warm start: candidate K at S s", what the run says of it (a resume too)
    _start: np.ndarray | None = field(default=None, init=False, repr=False)  # fastest_device_start's answer

    def __post_init__(self) -> None:
        self.inputs = graph_inputs(self.problem)
        x = self.inputs
        self.tensors = {"node": torch.from_numpy(x.node), "edge_index": torch.from_numpy(x.edge_index),
                        "edge": torch.from_numpy(x.edge), "device": torch.from_numpy(x.device),
                        "pair": torch.from_numpy(x.pair), "allowed": torch.from_numpy(x.allowed)}
        g = x.num_groups
        adjacency = np.zeros((g, g))
        np.add.at(adjacency, (x.edge_index[0], x.edge_index[1]), x.edge_bytes)
        self.adjacency = torch.from_numpy(adjacency)
        self.work = torch.from_numpy(x.work_s)
        self.total_work_s = float(np.where(x.allowed, x.work_s, np.inf).min(axis=1).sum())

    @property
    def num_groups(self) -> int:
        return self.inputs.num_groups

    @property
    def only_placement(self) -> bool:
        """Every group may run on one device alone (a one-device machine): the first placement measured is
        the only one there is, and a search that goes on stalls for nothing."""
        return bool(self.problem.unit_allowed.sum(axis=1).max() <= 1)

    def progress_state(self) -> dict:
        """What a resumed search needs of this slot (tensors, so ``torch.load(weights_only=True)`` reads it):
        measurements used, the best, and the memo of measured placements, so nothing is measured twice."""
        keys = list(self.memo)
        memo_units = np.frombuffer(b"".join(keys), dtype=np.int64).reshape(len(keys), self.num_groups)  # (K, G)
        return {"measurements_used": self.counter.used, "best_runtime_s": self.best_runtime_s,
                "best_units": None if self.best_units is None else torch.from_numpy(self.best_units),
                "num_groups": self.num_groups, "num_devices": self.problem.num_devices,
                "worst_ok_s": self.worst_ok_s, "warm_start_runtime_s": self.warm_start_runtime_s,
                "warm_start_note": self.warm_start_note,
                "memo_units": torch.from_numpy(memo_units.copy()),
                "memo_cost_s": torch.tensor([self.memo[k] for k in keys], dtype=torch.float64)}

    def load_progress(self, state: dict) -> None:
        """Take back what ``progress_state`` saved."""
        self.counter.used = int(state["measurements_used"])
        self.best_runtime_s = float(state["best_runtime_s"])
        self.best_units = None if state["best_units"] is None else state["best_units"].numpy().astype(np.int64)
        for units, cost in zip(state["memo_units"].numpy(), state["memo_cost_s"].tolist()):
            self.memo[np.ascontiguousarray(units, dtype=np.int64).tobytes()] = float(cost)  # not measured again
        self.worst_ok_s = float(state["worst_ok_s"])
        self.warm_start_runtime_s = float(state.get("warm_start_runtime_s", math.nan))  # older files: none kept
        self.warm_start_note = str(state.get("warm_start_note", ""))  # older files: none kept (no note on resume)

    @property
    def position(self) -> np.ndarray:
        """(G,) in [0, 1]: the mean of each group's topological and forward positions."""
        return self.inputs.node[:, list(_NODE_INDEX)].mean(axis=1).astype(np.float64)

    @property
    def work_weight(self) -> np.ndarray:
        """(G,) each group's share of the work, scaled to mean 1, at least 0.1: what imitation weighs a
        group's decision by (where a light group goes hardly changes the step, so a teacher's choice for
        it is noise)."""
        share = np.where(self.inputs.allowed, self.inputs.work_s, np.inf).min(axis=1)
        share = share / max(share.sum(), 1e-12) * self.num_groups
        return np.maximum(share, 0.1)

    def measure(self, units: np.ndarray) -> np.ndarray:
        """(B, G) unit placements -> (B,) costs: the runtime, ``measurement_cost_s`` for a failure (at least
        FAILED_COST_S), inf for rows past the budget. Each placement not measured before is measured once, all
        in one call; repeats are free."""
        units = np.ascontiguousarray(units, dtype=np.int64)
        keys = [row.tobytes() for row in units]
        unseen = list(dict.fromkeys(k for k in keys if k not in self.memo))[: max(self.counter.left, 0)]
        if unseen:
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            rows = units[[first[k] for k in unseen]]
            costs = self.counter.measure(list(self.problem.expand(rows)))
            for row, cost in zip(rows, costs):
                self.record(row, cost)
        return np.array([self.memo.get(k, math.inf) for k in keys])

    def record(self, units: np.ndarray, cost: float) -> None:
        """Remember the cost (``measurement_cost_s``) of the (G,) placement ``units``, measured elsewhere
        (a warm start) or here."""
        units = np.ascontiguousarray(units, dtype=np.int64)
        self.memo[units.tobytes()] = float(cost)
        if cost < FAILED_COST_S:
            self.worst_ok_s = max(self.worst_ok_s, float(cost))
            if cost < self.best_runtime_s:
                self.best_runtime_s, self.best_units = float(cost), units.copy()

    def measure_warm_start(self, placements) -> "WarmStart | None":
        """A warm start's candidates (op placements, best first) measured in the budget
        (``policies.rl.warm_start``), each remembered as measured here (sampled again, it costs nothing), and
        the best that ran ok (None when none did)."""
        from policies.base import measurement_cost_s
        from policies.rl.warm_start import best_candidate, measure_candidates

        measured = measure_candidates(self.problem, self.counter, placements)
        capacity = self.problem.capacity_bytes()
        for candidate in measured:
            self.record(candidate.unit_placement, measurement_cost_s(candidate.measurement, capacity))
        best = best_candidate(measured)
        if best is not None:
            self.warm_start_runtime_s = best.runtime_s
            self.warm_start_note = best.note
        return best

    def scored(self, runtimes: np.ndarray) -> np.ndarray:
        """Runtimes with failures (and unmeasured rows) as ``failure_factor`` times the worst ok runtime."""
        worst = self.worst_ok_s if self.worst_ok_s > 0 else 1.0
        return np.where(runtimes < FAILED_COST_S, runtimes, self.failure_factor * worst)

    def fastest_device_start(self) -> np.ndarray:
        """(G,) where the networks' episodes start without a warm start, found without a measurement:
        everything on the GPU the cost model says is fastest (any device on a machine without GPUs; a CPU
        that would run the step faster is not chosen), repaired to allowed devices. When the
        whole step's peak memory (the simulator's liveness model, ``single_device_peak_bytes``: measured on
        the first GPU, the same on any alike one) overflows that device, groups spill to the next fastest
        device of its kind (``_spilled``), so that the start runs: moves from a start that fails measure
        failures until one of them happens to fit. With no device of its kind to spill to, or too little
        memory on all of them, the start still overflows."""
        from policies.simple import devices_by_speed, single_device_units

        if self._start is None:  # computed once: spilling runs the simulator's memory model per move
            devices = devices_by_speed(self.problem, "gpu" if self.problem.gpu_indices() else None)
            units = single_device_units(self.problem, devices[0])
            if self.problem.single_device_peak_bytes > self.problem.capacity_bytes()[devices[0]]:
                units = self._spilled(units, devices)
            self._start = units
        return self._start.copy()

    def _spilled(self, units: np.ndarray, devices: list[int]) -> np.ndarray:
        """(G,) ``units`` with groups moved off each of ``devices`` whose peak memory (the simulator's liveness
        model, as ``single_device_peak_bytes``) overflows, to the first of ``devices`` after it where the group
        fits: each move takes the group that adds the fewest cut bytes per byte it frees (the heuristics'
        memory model, ``unit_memory_bytes``). ``policies.spill.spill`` with a shortlist of one: the heuristics'
        repair, by the estimate alone, without its region moves and last step (the start stays the one the RL
        figures had)."""
        from policies.problem import unit_memory_bytes
        from policies.spill import spill

        preference = np.full(self.problem.num_devices, np.inf)
        preference[devices] = np.arange(len(devices))  # the next fastest first
        group_bytes, _ = unit_memory_bytes(self.problem, "auto", devices[:1])  # (G,) calibrated to the peak
        edges = (self.inputs.edge_index[0], self.inputs.edge_index[1], self.inputs.edge_bytes)
        result = spill(self.problem, self.problem.expand(units), group_bytes, preference,
                       max_moves=self.num_groups * len(devices), shortlist=1, edges=edges,
                       max_regions=0, max_descent_simulations=0)
        return result.units

    def fitted(self, units: np.ndarray) -> np.ndarray:
        """(G,) ``units`` as they are where the simulator's memory model says its step fits, else repaired as
        the memory-constrained heuristics' placements are (``policies.spill.fit_in_memory``: groups move whole,
        to the GPUs first): a one-shot placement fails for memory only where that repair cannot fit it."""
        from policies.spill import fit_units_in_memory

        return fit_units_in_memory(self.problem, units)[0]


def visit_order(slot: Slot, order: str, rng: np.random.Generator) -> np.ndarray:
    """(G,) the groups in the order Placeto visits them: topo (by ``Slot.position``, the mean of the first
    op's and the forward ops' topological positions), reverse-topo, bfs from the source groups (by edges),
    or random."""
    topo = np.argsort(slot.position, kind="stable")
    if order == "topo":
        return topo
    if order == "reverse-topo":
        return topo[::-1].copy()
    if order == "random":
        return rng.permutation(slot.num_groups)
    return _bfs(slot, topo)


def _bfs(slot: Slot, topo: np.ndarray) -> np.ndarray:
    g = slot.num_groups
    src, dst = slot.inputs.edge_index[:, slot.inputs.edge[:, 1] > 0.5]  # forward edges only
    indegree = np.bincount(dst, minlength=g)
    frontier = [int(v) for v in topo if indegree[v] == 0]
    seen = np.zeros(g, dtype=bool)
    seen[frontier] = True
    visited: list[int] = []
    while frontier:
        visited += frontier
        leaving = np.isin(src, frontier)
        nxt = sorted({int(d) for d in dst[leaving] if not seen[d]})
        seen[nxt] = True
        frontier = nxt
    rest = [int(v) for v in topo if not seen[v]]
    return np.array(visited + rest, dtype=np.int64)


_NODE_INDEX = (FEATURE_COLUMNS.index("topo_position"), FEATURE_COLUMNS.index("forward_position"))


def save_learner(context: RunContext, policy: str, trainer, slot: Slot) -> None:
    """Write a search learner's state (``trainer.state()``, its iteration, the slot's progress) to
    ``learner.pt`` in the run's checkpoint folder; nothing without one."""
    from policies.rl.learner_file import CHECKPOINT_FILE  # the file checkpoint_progress reads
    from policies.rl.loop import save_state

    if context.checkpoint_dir is None:
        return
    if context.before_checkpoint is not None:
        context.before_checkpoint()
    from policies.rl.gnn.checkpoint import layout_lists

    save_state({"policy": policy, "trainer": trainer.state(), "iteration": trainer.iteration,
                "feature_layout": layout_lists(), **slot.progress_state()},
               Path(context.checkpoint_dir) / CHECKPOINT_FILE)


def resume_learner(context: RunContext, policy: str, trainer, slot: Slot, network: str | None = None) -> bool:
    """Load what ``save_learner`` wrote into ``trainer`` and ``slot``; False when there is nothing to load.
    A file of another policy, other groups or other devices, or a damaged one: a PlacerError naming it; with
    ``network`` (the network's name in that error), so are weights that do not fit ``trainer.net``."""
    from policies.rl.gnn.checkpoint import check_weights
    from policies.rl.learner_file import read_learner_state

    path = _learner_path(context.checkpoint_dir)
    if path is None:
        return False
    state = read_learner_state(path)
    devices = slot.problem.num_devices
    if (state.get("policy") != policy or state.get("num_groups") != slot.num_groups
            or state.get("num_devices", devices) != devices):
        raise PlacerError(f"{path} is not a {policy} learner of {slot.num_groups} groups on {devices} devices")
    if network is not None:
        saved = state.get("trainer")
        check_weights(path, trainer.net, saved.get("net") if isinstance(saved, dict) else saved, network)
    try:
        trainer.load_state(state["trainer"])
        slot.load_progress(state)
    except RESTORE_ERRORS as exc:
        raise PlacerError(f"{path}: its learner state cannot be restored ({type(exc).__name__}: "
                          f"{first_line(exc)})") from None
    return True


def resumed_trainer(policy: str, checkpoint_dir) -> tuple[Path, dict] | None:
    """(path, trainer state) of the ``learner.pt`` a resumed run of ``policy`` finds in ``checkpoint_dir``;
    None when there is none. Read before the run starts (its folder unchanged): a damaged file, or one
    without a network of ``policy``, is a PlacerError naming it. Its weights are the caller's to check."""
    from policies.rl.learner_file import read_learner_state

    path = _learner_path(checkpoint_dir)
    if path is None:
        return None
    state = read_learner_state(path)
    trainer = state.get("trainer")
    if state.get("policy") != policy or not isinstance(trainer, dict) or "net" not in trainer:
        raise PlacerError(f"{path} is not a {policy} learner's checkpoint (no network of {policy})")
    _check_layout(path, state)
    return path, trainer


def _check_layout(path: Path, state: dict) -> None:
    """A resumed learner's network reads the features it was trained on, as an ``--init`` checkpoint's must
    (``checkpoint.read_checkpoint``); a file written before the layout was recorded in it is taken as this
    version's."""
    from policies.rl.gnn.checkpoint import layout_difference, layout_lists

    if "feature_layout" in state and state["feature_layout"] != layout_lists():
        raise PlacerError(f"{path} was trained on another feature layout than this version's "
                          f"({layout_difference(state['feature_layout'])}): start a new run")


def _learner_path(checkpoint_dir) -> Path | None:
    """The run's ``learner.pt`` in ``checkpoint_dir`` when it is there, else None."""
    from policies.rl.learner_file import CHECKPOINT_FILE

    path = None if checkpoint_dir is None else Path(checkpoint_dir) / CHECKPOINT_FILE
    return path if path is not None and path.is_file() else None


def step_improvements(start_s: float, scored: np.ndarray) -> np.ndarray:
    """(B, S) how much each of an episode's moves cut the scored step time (``scored``, (B, S), after each move)
    below the one before (the first: below the start's ``start_s``), relative to the start. A start of 0 s (a
    graph whose step costs nothing) is scaled by the largest time seen instead, or 1: dividing by it made every
    reward NaN, the loss NaN in the metrics, and RLlib zero the gradients."""
    before = np.concatenate([np.full((scored.shape[0], 1), start_s), scored[:, :-1]], axis=1)
    largest_s = float(scored.max(initial=0.0))
    scale = start_s if start_s > 0 else largest_s if largest_s > 0 else 1.0
    return (before - scored) / scale

