"""``gdp``, ``placeto`` and ``giph`` as registry policies (policies/registry.py): place one problem, from a
pre-trained network or from scratch.

``init``: a checkpoint file from `placer train`, ``"pretrained"`` (the default: the committed checkpoint,
``checkpoint.pretrained_path``) or ``"scratch"`` (fresh weights). The network's size comes from the
checkpoint (or ``GnnConfig``'s defaults from scratch); the search's ``hidden_size`` is not used.

With a budget of 1 the answer is the zero-shot placement: one forward pass (Placeto: ``greedy_passes``
greedy passes over the groups, two in a search), one measurement. A zero-shot placement whose step would
overflow a device's memory (the simulator's memory model, which measures nothing) is repaired first as the
heuristics' placements are (``Slot.fitted``). A larger budget measures that placement first, then fine-tunes
on this graph (``GnnTrainer.iterate``) until the budget is spent; a placement sampled again costs nothing, and
``STALL_ITERATIONS`` updates with nothing new end the run as "converged" (as does a first measurement where
every group has one allowed device: nothing is left to choose). A warm start (op placements,
best first) is measured in the budget: GDP imitates the best that ran, Placeto starts its episodes there.
Fine-tuning Placeto starts every batch of episodes from the best placement measured so far (training
across graphs starts them all from ``Slot.fastest_device_start``), so each pass improves on the last.
GiPH starts at the warm start (else the fastest GPU by the cost model, any device without GPUs, spilled onto the
next fastest where the step overflows its memory: ``Slot.fastest_device_start``), measures it, then its greedy
moves one by one (``episode_steps`` measurements at most), then fine-tunes with episodes of moves from the best
so far.

A second ``place`` on the same instance (a device left the machine: the problem has fewer devices) keeps
the network and its optimizer as the first call left them, not the weights of ``init``, and starts from
``warm_start`` when the caller set it for the new problem (the networks read any number of devices).
``context.checkpoint_dir`` gets ``learner.pt`` (network, optimizer, the memo of measured placements, the
best, counters, the stall count) to resume from: a resumed run measures nothing twice and stops where one
run would.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np
import torch

from graphs.errors import PlacerError
from policies.base import (BudgetedMeasurer, DecisionClock, PolicyResult, RunContext, check_budget, early_stop,
                           search_result, stopped_before_start)
from policies.rl.gnn.checkpoint import check_network, pretrained_path, read_checkpoint
from policies.rl.gnn.config import GnnConfig
from policies.rl.gnn.problems import Slot, resume_learner, resumed_trainer, save_learner

STALL_ITERATIONS = 30
_SEARCH_ONLY = ("hidden_size", "torch_threads", "checkpoint_every")  # search options the network ignores


@dataclass(frozen=True)
class Initial:
    """Where the network's weights come from."""
    source: str  # "scratch", or the checkpoint file
    state: dict | None  # the checked checkpoint; None from scratch


def initial_weights(policy: str, init: str | None, checkpoint_dir=None) -> Initial:
    """The weights a search starts from: a resumed run's own ``learner.pt`` in ``checkpoint_dir`` when it has
    one (its --init file is not read again: it may have moved since), else ``init``'s."""
    resumed = _resumed_weights(policy, checkpoint_dir)
    return resumed if resumed is not None else _init_weights(policy, init)


def _resumed_weights(policy: str, checkpoint_dir) -> Initial | None:
    """A resumed run's own network, checked as a checkpoint's is (``check_network``: it fits its architecture,
    every weight finite) before the search changes its folder."""
    found = resumed_trainer(policy, checkpoint_dir)
    if found is None:
        return None
    path, trainer = found
    config = trainer.get("config")
    if not isinstance(config, dict):
        raise PlacerError(f"{path} is not a {policy} learner's checkpoint (no settings of {policy})")
    architecture = {key: config.get(key) for key in ("kind", "hidden_size", "num_layers")}
    resumed = {"architecture": architecture, "trainer": trainer}
    check_network(path, policy, resumed)
    return Initial(f"{path} (resumed)", resumed)


def _init_weights(policy: str, init: str | None) -> Initial:
    if init in (None, "pretrained"):
        path = pretrained_path(policy)
        if not path.is_file():
            raise PlacerError(f"no pre-trained {policy} checkpoint at {path}: train one with placer train, or "
                              "pass --init scratch")
        return Initial(str(path), read_checkpoint(path, policy))
    if init == "scratch":
        return Initial("scratch", None)
    return Initial(str(init), read_checkpoint(init, policy))


class GdpPolicy:
    name = "gdp"
    search_defaults: dict = {}  # GnnConfig fields a search uses unless its options say otherwise

    def __init__(self, context: RunContext | None = None, warm_start: Sequence[np.ndarray] | None = None,
                 init: str | None = None, **options):
        self.context = context or RunContext()
        self.warm_start = None if warm_start is None else list(warm_start)
        self.initial = initial_weights(self.name, init, self.context.checkpoint_dir)
        self.torch_threads = options.get("torch_threads")
        self.checkpoint_every = int(options.get("checkpoint_every") or 10)
        known = {f.name for f in fields(GnnConfig)} - {"kind", "seed"} - set(_SEARCH_ONLY)
        unknown = set(options) - known - set(_SEARCH_ONLY)
        if unknown:
            raise PlacerError(f"{self.name}: unknown options {', '.join(sorted(unknown))}")
        self.options = {**self.search_defaults, **{k: v for k, v in options.items() if k in known}}
        self.trainer = None  # built by the first place(), kept by the next ones (a device removed)

    def config(self, seed: int) -> GnnConfig:
        """The checkpoint's architecture, and unless the options name one, the visiting order it was trained
        with (a Placeto network trained visiting bfs has learned decisions in that order)."""
        state = self.initial.state
        architecture = {} if state is None else {k: v for k, v in state["architecture"].items() if k != "kind"}
        trained = {} if state is None else {"order": state["trainer"]["config"].get("order", GnnConfig.order)}
        return GnnConfig(**{**trained, **self.options, **architecture, "kind": self.name, "seed": seed})

    def place(self, problem, measurer, budget: int, seed: int, on_measurement=None) -> PolicyResult:
        from policies.rl.loop import deterministic_torch

        check_budget(budget)
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        counter = BudgetedMeasurer(measurer, budget, problem.capacity_bytes(), DecisionClock(), on_measurement)
        with deterministic_torch():
            first = self.trainer is None
            trainer = self._trainer(self.config(seed))
            slot = Slot(problem, counter, trainer.config.failure_factor)
            resumed = first and self._resume(trainer, slot)
            start = None
            notes = [f"weights: {self.initial.source}" if first else "weights: kept from the previous place call"]
            began = resumed or not stopped_before_start(self.context)  # else no learner saved: a resume begins
            if not resumed and began:
                warm = slot.measure_warm_start(self.warm_start) if self.warm_start else None
                if warm is not None:  # in the memo: fine-tuning improves on it, and never reports worse
                    start = warm.unit_placement
                    if trainer.config.kind == "gdp":
                        trainer.imitate([slot], [start], trainer.config.imitation_steps)
                if math.isinf(self._zero_shot(trainer, slot, start)):  # past the budget: dropped without a word
                    notes.append("no zero-shot placement measured: the warm start took the whole budget")
            if slot.warm_start_note:  # a resumed run's from its checkpoint: the same words as had it never stopped
                notes.append(slot.warm_start_note)
            stop_reason = self._fine_tune(trainer, slot, start)
            if began:
                self._save(trainer, slot)
        if trainer.learner_s:
            notes.append(f"{trainer.iteration} updates, {np.mean(trainer.learner_s):.3f} s learner time each")
        found = replace(search_result(self.name, problem, counter, "; ".join(notes)),
                        warm_start_runtime_s=slot.warm_start_runtime_s)  # a resumed run's too
        return self._with_slot_best(found, problem, slot, stop_reason, trainer)

    def _trainer(self, config: GnnConfig):
        """The first call's trainer from ``init``; the same one (network and optimizer) on later calls."""
        from policies.rl.gnn.trainer import GnnTrainer

        if self.trainer is None:
            self.trainer = GnnTrainer(config)
            if self.initial.state is not None:
                self.trainer.load_state(self.initial.state["trainer"], weights_only=True)
        else:
            self.trainer.stalled = 0  # another problem: its stalls count from nothing
        return self.trainer

    def _zero_shot(self, trainer, slot: Slot, start: np.ndarray | None) -> float:
        """Measure the policy's zero-shot placement (GiPH: the start, then its greedy moves one by one, when
        the budget holds them all: the walk's end, repaired where it would overflow, is the zero-shot answer,
        which a larger budget must measure too); its cost, inf where the budget was spent before it (a
        placement measured before costs nothing: the memo has it)."""
        if trainer.config.kind != "giph" or slot.counter.left < 1 + trainer.config.episode_steps:
            return float(slot.measure(slot.fitted(trainer.greedy(slot, start))[None])[0])
        start = slot.fastest_device_start() if start is None else start
        slot.measure(start[None])
        end = trainer.giph_rollout(slot, start, measure=True)
        return float(slot.measure(slot.fitted(end)[None])[0])  # free when the end fits: the memo has it

    def _fine_tune(self, trainer, slot: Slot, start: np.ndarray | None) -> str:
        """Update until the budget, the time limit, the stop flag or a stall ends the run; the stop reason.
        The stall count lives on the trainer (``learner.pt`` keeps it): a run cut inside a stall and resumed
        converges at the update one run does."""
        ctx, started = self.context, time.perf_counter()
        while slot.counter.left >= 2:
            stopped = early_stop(started, ctx.time_limit_s, ctx.should_stop)
            if stopped is not None:
                return stopped
            if slot.only_placement:  # measured already: updates would sample it again and again
                return "converged"
            if trainer.stalled >= STALL_ITERATIONS:
                trainer.stalled = 0  # converged, resumed with a larger budget: it samples again
                return "converged"
            used = slot.counter.used
            if trainer.config.kind != "gdp":  # fine-tuning improves the best placement so far, episode after episode
                start = slot.best_units if slot.best_units is not None else slot.fastest_device_start()
            metrics = trainer.iterate(slot, start)
            if metrics is None:
                break
            trainer.stalled = 0 if slot.counter.used > used else trainer.stalled + 1
            if ctx.on_iteration is not None:
                ctx.on_iteration(metrics.iteration, {k: float(v) for k, v in vars(metrics).items()
                                                     if isinstance(v, (int, float)) and k != "iteration"})
            if ctx.checkpoint_dir is not None and trainer.iteration % self.checkpoint_every == 0:
                self._save(trainer, slot)
        return "budget"

    # ---- the run's own checkpoint (resume) ------------------------------------------------------

    def _save(self, trainer, slot: Slot) -> None:
        save_learner(self.context, self.name, trainer, slot)

    def _resume(self, trainer, slot: Slot) -> bool:
        return resume_learner(self.context, self.name, trainer, slot)

    def _with_slot_best(self, found: PolicyResult, problem, slot: Slot, stop_reason: str, trainer) -> PolicyResult:
        from policies.base import with_run_best
        best_op = None if slot.best_units is None else problem.expand(slot.best_units)
        spu = float(np.mean(trainer.learner_s)) if trainer.learner_s else math.nan
        return with_run_best(found, problem, best_op, slot.best_runtime_s, measurements=slot.counter.used,
                             stop_reason=stop_reason, seconds_per_update=spu)


class PlacetoPolicy(GdpPolicy):
    name = "placeto"
    # Two greedy passes in the zero shot: on the validation draws (families:12:24, paper-2gpu and paper-4gpu)
    # they gave 0.977x one pass's geometric mean step, three 0.981x, four 0.985x (BENCHMARKS.md, issue 14).
    search_defaults = {"greedy_passes": 2}


class GiphPolicy(GdpPolicy):
    name = "giph"
    # Short walks from the best placement so far, two per update: on the training machines hetero:2-7, 9, 11
    # (resnet-50, inception-v3, transformer; 200 measurements, seeds 0-1) 3 moves per episode beat annealing
    # from the same start in 30 of 32 runs, 32 moves in 5 (BENCHMARKS.md, issue 15).
    search_defaults = {"batch_size": 2, "episode_steps": 3}
