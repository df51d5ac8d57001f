"""The hierarchical planner as a registry policy (``hierarchical``; groups_itself, so it gets the problem
at colocation level: its units are the atoms the grouper assigns).

``place(problem, measurer, budget, seed)`` optionally measures warm-start candidates (best-first op
placements, ``warm_start=``) inside the budget and imitates the best, then trains grouper and placer
jointly with REINFORCE until the budget, the time limit or ``should_stop``, or until it samples nothing
new for ``STALL_ITERATIONS`` batches ("converged": a placement sampled again reuses its measurement and
costs no budget, as in every other learner). The result is the best
placement measured over the whole run (a resumed run's included). Options: every ``HierarchicalConfig``
field, ``context`` (policies.base.RunContext) and ``warm_start``; ``seed`` given as an option is
overridden by ``place``'s seed argument.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Sequence

import numpy as np

from policies.base import (BudgetedMeasurer, DecisionClock, LastResults, PolicyResult, RunContext, check_budget,
                           check_option_names, early_stop, search_result, with_run_best)
from policies.rl.hierarchical.config import HierarchicalConfig
from policies.rl.learner_file import CHECKPOINT_FILE


class HierarchicalPolicy:
    name = "hierarchical"

    def __init__(self, context: RunContext | None = None, warm_start: Sequence[np.ndarray] | None = None,
                 **options):
        self.context = context or RunContext()
        self.warm_start = warm_start
        check_option_names(self.name, options, HierarchicalConfig)
        self.config = HierarchicalConfig(**options)  # bad values fail here, before any work

    def place(self, problem, measurer, budget: int, seed: int, on_measurement=None) -> PolicyResult:
        import torch

        from policies.rl.hierarchical.trainer import HierarchicalTrainer
        from policies.rl.loop import STALL_ITERATIONS, deterministic_torch, learner_time_note
        from policies.rl.warm_start import best_candidate, check_warm_start, measure_candidates
        check_budget(budget)
        if self.warm_start:
            check_warm_start(problem, self.warm_start)  # bad candidates fail before the learner is built
        config = replace(self.config, seed=int(seed))
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        started, ctx = time.perf_counter(), self.context
        capture = LastResults(measurer)
        counter = BudgetedMeasurer(capture, budget, problem.capacity_bytes(), DecisionClock(), on_measurement)
        checkpoint = ctx.checkpoint_dir
        with deterministic_torch():
            trainer = HierarchicalTrainer(problem, counter, capture, config)
            if checkpoint is not None and (checkpoint / CHECKPOINT_FILE).is_file():
                trainer.load(checkpoint / CHECKPOINT_FILE)
                counter.budget = max(0, budget - trainer.measurements_used)
            elif self.warm_start:
                measured = measure_candidates(problem, counter, self.warm_start)
                trainer.remember(measured)
                warm = best_candidate(measured)
                trainer.measurements_used = counter.used
                if warm is not None:
                    match = trainer.imitate(warm.unit_placement, warm.runtime_s, warm.op_placement)
                    trainer.warm_start_note = f"{warm.note}, imitated ({match:.0%} of ops on its device greedily); "
                    if checkpoint is not None:  # a resume must not measure and imitate again
                        self._save(trainer)
            stop_reason = "budget"
            while trainer.measurements_used < budget:
                stopped = early_stop(started, ctx.time_limit_s, ctx.should_stop)
                if stopped is not None:
                    stop_reason = stopped
                    break
                if trainer.stalled >= STALL_ITERATIONS:
                    stop_reason = "converged"
                    break
                metrics = trainer.iterate(min(config.batch_size, budget - trainer.measurements_used))
                if ctx.on_iteration is not None:
                    ctx.on_iteration(trainer.iteration - 1, metrics)
                if checkpoint is not None and trainer.iteration % config.checkpoint_every == 0:
                    self._save(trainer)
            if checkpoint is not None:
                self._save(trainer)
        per_update = float(np.mean(trainer.learner_s)) if trainer.learner_s else math.nan  # none this session
        notes = (f"{trainer.warm_start_note}{trainer.iteration} iterations of {min(config.batch_size, budget)}, "
                 f"{trainer.num_groups} groups, {learner_time_note(per_update)}")
        found = replace(search_result(self.name, problem, counter, notes),
                        warm_start_runtime_s=trainer.warm_start_runtime_s)  # a resumed run's from its checkpoint
        return with_run_best(found, problem, trainer.best_op_placement, trainer.best_runtime_s,
                             measurements=trainer.measurements_used, stop_reason=stop_reason,
                             seconds_per_update=per_update)

    def _save(self, trainer) -> None:
        if self.context.before_checkpoint is not None:
            self.context.before_checkpoint()
        trainer.save(self.context.checkpoint_dir / CHECKPOINT_FILE)
