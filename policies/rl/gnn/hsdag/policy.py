"""``hsdag`` as a registry policy (policies/registry.py): learn groups and their devices on one problem.

It groups the graph itself (registry ``groups_itself``): ``policies.registry.place`` hands it the colocation
groups (``problem.at_op_level()``), as the paper parses op-level graphs; on the coarse ``scope`` groups the
inference graphs on cpu-igpu left nothing better than all-on-the-iGPU (bench_hsdag). A place called directly
places whatever units its problem has.

The run measures the greedy parse first (every edge with merge probability above 1/2 collapsed, each
group on its most likely device), then trains (``HsdagTrainer.iterate``) until the budget is spent; a
placement sampled again costs nothing. ``STALL_ITERATIONS`` updates in a row with nothing new (free: they
measure nothing) raise the sampling temperature one step (``HsdagTrainer.heat``), so the rest of the
budget goes to placements near the policy's mode; only a stall at the temperature's cap ends the run
early, as "converged" (or, at once, a machine that leaves every group one allowed device: nothing to
choose). A warm start (op placements, best first) is measured in the budget, and the policy imitates
the best that ran (its parse: edges whose ends share a device collapsed) before training; the run never
reports worse than it. The network is kept by the instance: a second ``place`` (say on the machine
with a device removed: the network reads any number of devices) continues from it with a fresh
optimizer, and from ``self.warm_start`` when one is set. Weights start from scratch, or with
``init="pretrained"`` the encoder, device MLP and pair scorer come from gdp's committed checkpoint.
``context.checkpoint_dir`` gets ``learner.pt`` (network, optimizer, the memo of measured placements,
the best, counters, the temperature and the stall count): a resumed run measures nothing twice and stops
where one run would.
"""

from __future__ import annotations

import math
import time
from dataclasses import fields
from functools import lru_cache
from typing import Sequence

import numpy as np
import torch

from graphs.errors import PlacerError
from policies.base import (BudgetedMeasurer, DecisionClock, PolicyResult, RunContext, check_budget, early_stop,
                           search_result, stopped_before_start, with_run_best)
from policies.rl.gnn.checkpoint import check_weights
from policies.rl.gnn.hsdag.config import HsdagConfig
from policies.rl.gnn.hsdag.parser import HsdagNet, ParseEdges
from policies.rl.gnn.hsdag.trainer import HsdagTrainer
from policies.rl.gnn.problems import Slot, resume_learner, resumed_trainer, save_learner

STALL_ITERATIONS = 30
_SEARCH_ONLY = ("torch_threads", "checkpoint_every")
_PRETRAINED_MODULES = ("encoder.", "devices.", "scorer.")  # what HsdagNet shares with GdpNet


class HsdagPolicy:
    name = "hsdag"

    def __init__(self, context: RunContext | None = None, warm_start: Sequence[np.ndarray] | None = None,
                 **options):
        self.context = context or RunContext()
        self.warm_start = None if warm_start is None else list(warm_start)
        self.torch_threads = options.get("torch_threads")
        self.checkpoint_every = int(options.get("checkpoint_every") or 10)
        self.options = _config_options(options)
        self.trainer: HsdagTrainer | None = None  # kept across place calls
        self.config(0)  # bad settings and gdp's checkpoint (init pretrained) fail here; a learner.pt to resume
        # is checked as place loads it (a search checks it first: check_settings)

    def config(self, seed: int) -> HsdagConfig:
        return _config(self.options, seed)

    def place(self, problem, measurer, budget: int, seed: int, on_measurement=None) -> PolicyResult:
        from policies.rl.loop import deterministic_torch

        check_budget(budget)
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        config = self.config(seed)
        counter = BudgetedMeasurer(measurer, budget, problem.capacity_bytes(), DecisionClock(), on_measurement)
        slot = Slot(problem, counter, config.failure_factor)
        edges = ParseEdges.of(slot.tensors)
        kept = " (kept from the last run)" if self.trainer else ""
        notes = [f"weights: {config.init}{kept}"]
        with deterministic_torch():
            first = self.trainer is None
            trainer = self._trainer(config)
            resumed = first and self._resume(trainer, slot)  # a later call is another problem: nothing to resume
            began = resumed or not stopped_before_start(self.context)  # else no learner saved: a resume begins
            if not resumed and began:
                warm = slot.measure_warm_start(self.warm_start) if self.warm_start else None
                if warm is not None:  # in the memo: training never reports worse
                    trainer.imitate(slot, edges, warm.unit_placement, config.imitation_steps)
                slot.measure(trainer.greedy(slot, edges)[None])
            if slot.warm_start_note:  # a resumed run's from its checkpoint: the same words as had it never stopped
                notes.append(slot.warm_start_note)
            stop_reason, groups = self._train(trainer, slot, edges)
            if began:
                self._save(trainer, slot)
        if trainer.learner_s:
            notes.append(f"{trainer.iteration} updates, {np.mean(trainer.learner_s):.3f} s learner time each; "
                         f"groups per sample: {groups[0]:.1f} first batch, {groups[-1]:.1f} last")
        found = search_result(self.name, problem, counter, "; ".join(notes))
        best_op = None if slot.best_units is None else problem.expand(slot.best_units)
        spu = float(np.mean(trainer.learner_s)) if trainer.learner_s else math.nan
        return with_run_best(found, problem, best_op, slot.best_runtime_s, measurements=slot.counter.used,
                             stop_reason=stop_reason, seconds_per_update=spu,
                             warm_start_runtime_s=slot.warm_start_runtime_s)  # a resumed run's too

    def _trainer(self, config: HsdagConfig) -> HsdagTrainer:
        """The kept trainer with a fresh optimizer, or a new one (weights seeded by ``config.seed``)."""
        if self.trainer is not None:
            self.trainer.fresh_optimizer(config.seed)
            return self.trainer
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            net = HsdagNet(config.hidden_size, config.num_layers)
        if config.init == "pretrained":
            shared = {k: v for k, v in _pretrained_state()["trainer"]["net"].items()
                      if k.startswith(_PRETRAINED_MODULES)}
            missing, unexpected = net.load_state_dict(shared, strict=False)
            if unexpected or any(not k.startswith("edge_scorer.") for k in missing):
                raise PlacerError(f"hsdag: gdp's checkpoint does not fit the network (missing {missing}, "
                                  f"unexpected {unexpected})")
        self.trainer = HsdagTrainer(config, net)
        return self.trainer

    def _train(self, trainer: HsdagTrainer, slot: Slot, edges: ParseEdges) -> tuple[str, list[float]]:
        """Iterate until the budget, the time limit or the stop flag ends the run; the stop reason and
        the mean groups per sample of each batch."""
        ctx, started, groups = self.context, time.perf_counter(), []
        while slot.counter.left >= 2:
            stopped = early_stop(started, ctx.time_limit_s, ctx.should_stop)
            if stopped is not None:
                return stopped, groups
            if slot.only_placement:  # measured already: updates would sample it again and again
                return "converged", groups
            if trainer.stalled >= STALL_ITERATIONS:
                trainer.stalled = 0  # converged, resumed with a larger budget: it samples again
                if not trainer.heat():
                    return "converged", groups
            used = slot.counter.used
            metrics = trainer.iterate(slot, edges)
            if metrics is None:
                break
            groups.append(metrics.mean_groups)
            trainer.stalled = 0 if slot.counter.used > used else trainer.stalled + 1
            if ctx.on_iteration is not None:
                ctx.on_iteration(metrics.iteration, {k: float(v) for k, v in vars(metrics).items()
                                                     if isinstance(v, (int, float)) and k != "iteration"})
            if ctx.checkpoint_dir is not None and trainer.iteration % self.checkpoint_every == 0:
                self._save(trainer, slot)
        return "budget", groups

    # ---- the run's own checkpoint (resume) ------------------------------------------------------

    def _save(self, trainer: HsdagTrainer, slot: Slot) -> None:
        save_learner(self.context, self.name, trainer, slot)

    def _resume(self, trainer: HsdagTrainer, slot: Slot) -> bool:
        return resume_learner(self.context, self.name, trainer, slot, _network_name(trainer.config))


def check_settings(checkpoint_dir=None, **options) -> None:
    """What a search checks before it changes its run folder, without making the policy (place makes it):
    the options, gdp's checkpoint (init pretrained) and the network of a learner.pt to resume. Making it
    here as well read and checked that learner.pt once more, and ``place`` made a second policy."""
    _check_resumed(checkpoint_dir, _config(_config_options(options), 0))


def _config_options(options: dict) -> dict:
    """The HsdagConfig fields among ``options`` that are set; any option neither it nor a search takes is
    a PlacerError."""
    known = {f.name for f in fields(HsdagConfig)} - {"seed"}
    unknown = set(options) - known - set(_SEARCH_ONLY)
    if unknown:
        raise PlacerError(f"{HsdagPolicy.name}: unknown options {', '.join(sorted(unknown))}")
    return {k: v for k, v in options.items() if k in known and v is not None}


def _config(options: dict, seed: int) -> HsdagConfig:
    """The run's settings: ``options``, with gdp's architecture under init pretrained."""
    options = dict(options)
    if options.get("init") == "pretrained":
        options.update(_pretrained_state()["architecture"])
        options.pop("kind", None)
    return HsdagConfig(**{**options, "seed": seed})


def _network_name(config: HsdagConfig) -> str:
    return f"hsdag's network of hidden size {config.hidden_size} and {config.num_layers} layers"


def _check_resumed(checkpoint_dir, config: HsdagConfig) -> None:
    """A resumed run's own network (``learner.pt``) has the shapes of the one ``config`` builds and finite
    weights: else loading it fails (or sampling from it does) after the search changed its folder."""
    found = resumed_trainer("hsdag", checkpoint_dir)
    if found is None:
        return
    path, trainer = found
    with torch.device("meta"):  # shapes only, nothing allocated
        net = HsdagNet(config.hidden_size, config.num_layers)
    check_weights(path, net, trainer["net"], _network_name(config))


@lru_cache(maxsize=1)
def _pretrained_state() -> dict:
    """gdp's committed checkpoint, read once per process (the constructor and every place call ask for it)."""
    from policies.rl.gnn.checkpoint import pretrained_path, read_checkpoint

    return read_checkpoint(pretrained_path("gdp"), "gdp")
