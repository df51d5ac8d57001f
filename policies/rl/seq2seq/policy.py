"""The seq2seq placer as a registry policy: ``reinforce`` and ``ppo`` (policies/registry.py).

``place(problem, measurer, budget, seed)`` trains the 2017 seq2seq placer on the problem's groups
(``problem.grouping``, or its units when it has none) with ``RLConfig(trainer=..., seed=seed, **options)``
and returns the best placement measured, like the black-box searches do. A ``RunContext`` (``context=``)
gives it a checkpoint folder to save to and resume from, a time limit, a stop flag and a metrics callback.
``warm_start`` (candidate op placements, best first; policies/rl/warm_start.py) are measured first, in the
budget; the learner imitates the best that ran and starts its best-so-far there (a resumed run skips this:
its checkpoint holds both). A warm-started run uses ``RLConfig.for_warm_start`` (no logit noise, the
``warm_entropy_coeff`` bonus), so its samples stay near the start: local search around it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from policies.base import (BudgetedMeasurer, CounterView, DecisionClock, LastResults, PolicyResult, RunContext,
                           check_budget, check_option_names, search_result, with_run_best)
from policies.rl.config import RLConfig
from policies.rl.loop import CHECKPOINT_FILE, learner_time_note, resumed_warm_started, train_placer
from policies.rl.warm_start import best_candidate, measure_candidates


class ReinforcePolicy:
    name = "reinforce"
    trainer = "reinforce"  # RLConfig.trainer
    defaults: dict = {}  # RLConfig fields this policy sets unless the options do

    def __init__(self, context: RunContext | None = None, warm_start: Sequence[np.ndarray] | None = None,
                 **options):
        self.context = context or RunContext()
        self.warm_start = None if warm_start is None else list(warm_start)
        check_option_names(self.name, options, RLConfig)
        self.options = options  # RLConfig fields other than trainer and seed

    def make_config(self, seed: int, warm_started: bool) -> RLConfig:
        config = RLConfig(**{**self.defaults, **self.options, "trainer": self.trainer, "seed": seed})
        return config.for_warm_start() if warm_started else config

    def place(self, problem, measurer, budget: int, seed: int, on_measurement=None) -> PolicyResult:
        check_budget(budget)
        grouping = problem.unit_grouping
        capture = LastResults(measurer)
        counter = BudgetedMeasurer(capture, budget, problem.capacity_bytes(), DecisionClock(), on_measurement)
        ctx = self.context
        checkpoint = ctx.checkpoint_dir
        resume_from = checkpoint if checkpoint is not None and (checkpoint / CHECKPOINT_FILE).is_file() else None
        measured = measure_candidates(problem, counter, self.warm_start) if resume_from is None else []
        warm = best_candidate(measured)
        if resume_from is None:
            warm_started = warm is not None
        else:  # as the run began: given candidates of which none ran ok, it began with the plain settings
            warm_started = resumed_warm_started(resume_from, given=bool(self.warm_start))
        config = self.make_config(seed, warm_started)
        on_iteration = None
        if ctx.on_iteration is not None:
            on_iteration = lambda m: ctx.on_iteration(m.iteration, _numeric(vars(m)))  # noqa: E731
        result = train_placer(problem.graph, problem.machine, grouping, CounterView(counter, capture),
                              budget_measurements=budget, time_limit_s=ctx.time_limit_s, config=config,
                              checkpoint_dir=checkpoint, resume_from=resume_from, should_stop=ctx.should_stop,
                              on_iteration=on_iteration, before_checkpoint=ctx.before_checkpoint,
                              warm_start=warm, measurements_before=counter.used, warm_started=warm_started,
                              known=[(c.unit_placement, c.measurement) for c in measured])
        batch = min(config.batch_size, budget)  # (a --batch above the budget samples the budget: "1 iterations of 100000")
        notes = f"{result.iterations} iterations of {batch}, {learner_time_note(result.seconds_per_update)}"
        found = replace(search_result(self.name, problem, counter, notes),
                        warm_start_runtime_s=result.warm_start_runtime_s)  # a resumed run's from its checkpoint
        if result.warm_start_note:  # a resumed run's from its checkpoint: the same words as had it never stopped
            found = replace(found, notes=f"{notes}; {result.warm_start_note}")
        return with_run_best(found, problem, result.best_op_placement, result.best_runtime_s,
                             measurements=result.measurements_used, stop_reason=result.stop_reason,
                             seconds_per_update=result.seconds_per_update)


class PPOPolicy(ReinforcePolicy):
    name = "ppo"
    trainer = "ppo"


def _numeric(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and k != "iteration"}
