"""Black-box searches over unit (group) placements, scored by the measurer in batches.

- ``random``: every batch drawn uniformly over each unit's allowed devices.
- ``cem``: the cross-entropy method (the core of Post, Gao et al. 2018). A categorical distribution per
  unit over its allowed devices, uniform at first; each round samples a batch (from the distribution
  mixed with a little uniform exploration), keeps the elite fraction (plus the best placement so far),
  and moves the distribution toward the elites' device frequencies.
- ``annealing``: simulated annealing / Metropolis MCMC as in FlexFlow's search (Jia et al. 2019). A batch of
  chains starts from the best of the best single GPU, m-TOPO's fill and any warm start; each step moves one
  random unit to another allowed device and accepts with probability min(1, exp(-(log c' - log c) / T)), T
  falling geometrically over a schedule of budget / chains steps, at each quarter of which the chains restart
  from the best placement found (a placement already measured costs nothing, so the schedule can end before
  the budget does: T then stays at its end). Once ``KICK_ROUNDS`` steps in a row propose nothing new (every
  move around the best was measured), the chains are kicked: each restarts ``KICK_MOVES`` random moves away
  from the best (an iterated local search), again after every further step while nothing new turns up. It
  used to stop after ``STALL_ROUNDS`` such steps and call that converged, with up to 39% of the budget
  unspent (BENCHMARKS.md, "Annealing spends its whole budget"); now it stops only when ``STALL_ROUNDS``
  steps and kicks in a row have found nothing new (a space it has measured whole).

All three measure whole batches through ``measurer.measure`` (so a pool can serve them in parallel), never
spend more than ``budget`` measurements, take a seed, and call ``on_measurement(placement, measurement)``
for every measurement. Given a ``context`` (policies.base.RunContext), they stop between batches when its
time limit passes or its ``should_stop`` says so, as the learners do. A placement already measured is not
measured again (its cost is remembered), so a converged search may stop before the budget is spent (random
and cem after ``STALL_ROUNDS`` batches with nothing new; annealing only when its kicks find nothing new either). Failed
placements cost ``FAILED_COST_S`` plus their memory overflow, so the searches walk out of out-of-memory
regions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError, is_whole_number
from policies.base import (FAILED_COST_S, BudgetedMeasurer, DecisionClock, RunContext, check_budget, early_stop,
                           search_result)
from policies.problem import PlacementProblem
from policies.simple import best_single_device, single_device_units

STALL_ROUNDS = 50  # rounds in a row that find no new placement before a search gives up early (annealing: kicks)
KICK_MOVES = 4  # random moves of a kicked annealing chain away from the best placement
KICK_ROUNDS = 10  # stalled steps before a kick (at 50, where it used to stop: lower on fewer rows; BENCHMARKS.md)


class MemoMeasurer:
    """Costs of unit placements, measuring only those not seen before (and each only once)."""

    def __init__(self, problem: PlacementProblem, counter: BudgetedMeasurer, context: RunContext | None = None):
        self.problem, self.counter = problem, counter
        self.context = context or RunContext()
        self.costs: dict[bytes, float] = {}
        self.stalled = 0
        self.stopped: str | None = None  # "time_limit" | "should_stop": the context stopped the search

    @property
    def done(self) -> bool:
        """Asked between batches: the budget is spent, the context says stop (checked as the learners check
        it), or the search stopped finding new placements."""
        if self.counter.left <= 0:
            return True
        self.stopped = self.stopped or early_stop(self.counter.clock.started, self.context.time_limit_s,
                                                  self.context.should_stop)
        return self.stopped is not None or self.stalled >= STALL_ROUNDS

    @property
    def stop_reason(self) -> str:
        """The context's reason when it stopped the search; "converged" when the search stopped finding new
        placements with budget left; else "budget"."""
        if self.stopped is not None:
            return self.stopped
        return "converged" if self.stalled >= STALL_ROUNDS and self.counter.left > 0 else "budget"

    def evaluate(self, unit_placements: np.ndarray) -> np.ndarray:
        """(B, U) -> (B,) costs; unseen placements beyond the budget get cost inf."""
        keys = [row.tobytes() for row in unit_placements]
        new_rows, seen = [], set()
        for i, key in enumerate(keys):
            if key not in self.costs and key not in seen:
                seen.add(key)
                new_rows.append(i)
        new_rows = new_rows[: self.counter.left]
        if new_rows:
            costs = self.counter.measure(self.problem.expand(unit_placements[new_rows]))
            for i, cost in zip(new_rows, costs):
                self.costs[keys[i]] = cost
        self.stalled = 0 if new_rows else self.stalled + 1
        return np.array([self.costs.get(key, np.inf) for key in keys])


def sample_units(probs: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """(count, U) int64 draws from per-unit categorical distributions ``probs`` (U, D)."""
    cumulative = np.cumsum(probs, axis=1)  # (U, D)
    draws = rng.random((count, probs.shape[0], 1)) * cumulative[None, :, -1:]
    choice = (draws >= cumulative[None, :, :]).sum(axis=2)
    return np.minimum(choice, probs.shape[1] - 1).astype(np.int64)


def uniform_probs(problem: PlacementProblem) -> np.ndarray:
    allowed = problem.unit_allowed.astype(np.float64)  # (U, D)
    return allowed / allowed.sum(axis=1, keepdims=True)


def _start(problem, measurer, budget, on_measurement, context) -> tuple[BudgetedMeasurer, MemoMeasurer]:
    check_budget(budget)
    counter = BudgetedMeasurer(measurer, int(budget), problem.capacity_bytes(), DecisionClock(), on_measurement)
    return counter, MemoMeasurer(problem, counter, context)


def _check_options(policy, counts: Sequence[str] = (), fractions: Sequence[str] = (),
                   positives: Sequence[str] = (), non_negatives: Sequence[str] = ()) -> None:
    """Each named field of ``policy``: ``counts`` whole numbers >= 1, ``fractions`` in (0, 1], ``positives``
    finite and > 0, ``non_negatives`` finite and >= 0; else one PlacerError naming the field."""
    for name in counts:
        value = getattr(policy, name)
        if not is_whole_number(value) or value < 1:
            raise PlacerError(f"{policy.name}: {name} must be a whole number >= 1, got {value!r}")
    checks = [(fractions, lambda v: 0 < v <= 1, "in (0, 1]"), (positives, lambda v: 0 < v < math.inf, "> 0"),
              (non_negatives, lambda v: 0 <= v < math.inf, ">= 0")]
    for names, ok, what in checks:
        for name in names:
            value = getattr(policy, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not ok(value):
                raise PlacerError(f"{policy.name}: {name} must be a finite number {what}, got {value!r}")


@dataclass
class RandomSearchPolicy:
    name: str = "random"
    batch_size: int = 32
    context: RunContext | None = None  # its time limit and stop flag, checked between batches

    def __post_init__(self) -> None:
        _check_options(self, counts=("batch_size",))

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        counter, memo = _start(problem, measurer, budget, on_measurement, self.context)
        rng = np.random.default_rng(seed)
        probs = uniform_probs(problem)
        while not memo.done:
            memo.evaluate(sample_units(probs, min(self.batch_size, counter.left), rng))
        return search_result(self.name, problem, counter, stop_reason=memo.stop_reason)


@dataclass
class CrossEntropyPolicy:
    name: str = "cem"
    batch_size: int = 32
    elite_fraction: float = 0.1  # share of each batch that forms the elite
    smoothing: float = 0.3  # weight of the elite frequencies in the new distribution
    exploration_units: float = 2.0  # units per sample drawn uniformly (at most 15% of them): keeps exploring
    context: RunContext | None = None  # its time limit and stop flag, checked between batches

    def __post_init__(self) -> None:
        _check_options(self, counts=("batch_size",), fractions=("elite_fraction", "smoothing"),
                       non_negatives=("exploration_units",))

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        counter, memo = _start(problem, measurer, budget, on_measurement, self.context)
        rng = np.random.default_rng(seed)
        uniform = uniform_probs(problem)  # (U, D)
        probs = uniform.copy()
        explore = min(0.15, self.exploration_units / max(1, problem.num_units))
        best_units, best_cost = None, np.inf
        while not memo.done:
            batch = sample_units((1 - explore) * probs + explore * uniform, self.batch_size, rng)  # (B, U)
            costs = memo.evaluate(batch)
            order = np.argsort(costs, kind="stable")
            if best_units is None or costs[order[0]] < best_cost:
                best_units, best_cost = batch[order[0]], costs[order[0]]
            n_elite = max(1, int(np.ceil(self.elite_fraction * len(batch))))
            elite = np.vstack([batch[order[:n_elite]], best_units[None, :]])  # (K, U)
            freq = np.zeros_like(probs)
            np.add.at(freq, (np.broadcast_to(np.arange(probs.shape[0]), elite.shape), elite), 1.0)
            probs = (1 - self.smoothing) * probs + self.smoothing * freq / len(elite)
        return search_result(self.name, problem, counter, notes=f"{len(memo.costs)} distinct placements",
                             stop_reason=memo.stop_reason)


@dataclass
class AnnealingPolicy:
    name: str = "annealing"
    chains: int = 8  # placements proposed per batch, one per chain
    start_temperature: float = 0.05  # in log-runtime units: a 5% worse move is accepted with p = 1/e
    end_temperature: float = 0.001
    warm_start: list | None = None  # op placements (N,) to start from too, as the learners' warm start
    context: RunContext | None = None  # its time limit and stop flag, checked between batches

    def __post_init__(self) -> None:
        _check_options(self, counts=("chains",), positives=("start_temperature", "end_temperature"))

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        counter, memo = _start(problem, measurer, budget, on_measurement, self.context)
        if memo.done:  # stopped before its first batch (no time left): its starts are not measured either
            return search_result(self.name, problem, counter, stop_reason=memo.stop_reason)
        rng = np.random.default_rng(seed)
        start, start_cost, warm_start_s = self._start(problem, memo, budget, self.warm_start)
        chains = np.repeat(start[None, :], min(self.chains, max(1, int(budget) - 2)), axis=0)  # (C, U)
        movable = np.flatnonzero(problem.unit_allowed.sum(axis=1) >= 2)
        steps = max(1, (int(budget) - 1) // len(chains))
        step = 0
        # A step of 0 s (a graph of ops that take no time) has energy -inf, and a move between two such is
        # nan, which no comparison accepts: that is right, and numpy need not warn of it on the user's terminal.
        with np.errstate(divide="ignore", invalid="ignore"):
            energy = np.log(np.full(len(chains), start_cost))  # (C,)
            while not memo.done and len(movable):
                cooled = min(1.0, step / steps)
                temperature = self.start_temperature * (self.end_temperature / self.start_temperature) ** cooled
                proposals = self._propose(problem, chains, movable, rng)
                new_energy = np.log(memo.evaluate(proposals))
                accept = rng.random(len(chains)) < np.exp(np.minimum(0.0, -(new_energy - energy) / temperature))
                chains[accept], energy[accept] = proposals[accept], new_energy[accept]
                step += 1
                if step % max(1, steps // 4) == 0 and counter.best_placement is not None:
                    chains[:] = problem.collapse(counter.best_placement)
                    energy[:] = np.log(counter.best_cost_s)
                if memo.stalled >= KICK_ROUNDS and counter.left > 0 and counter.best_placement is not None:
                    chains[:] = self._kicked(problem, counter.best_placement, len(chains), movable, rng)
                    energy[:] = np.log(memo.evaluate(chains))  # nothing new even here: the memo stops the search
        # with no unit to move, the start is every placement there is: nothing new to find
        stop_reason = memo.stop_reason if len(movable) or counter.left <= 0 else "converged"
        return replace(search_result(self.name, problem, counter, notes=f"{step} annealing steps",
                                     stop_reason=stop_reason), warm_start_runtime_s=warm_start_s)

    @staticmethod
    def _start(problem, memo, budget, warm_start=None) -> tuple[np.ndarray, float, float]:
        """The best of the ``warm_start`` op placements collapsed onto the units (checked, repaired and
        deduplicated as the learners' are: policies.rl.warm_start), the best single GPU and Baechi's m-TOPO
        fill repaired to fit as the m-topo policy's is (it fits in memory where the single GPU does not:
        chains that start out of memory rarely find a fitting placement in time), measured in that order
        while the budget lasts: (its units (U,), its cost, the best warm start's step on the units, nan where
        none was given or ran ok: the search job's "warm start on the searched groups")."""
        from policies.baechi import fitted_m_topo
        from policies.rl.warm_start import check_warm_start, distinct_unit_placements

        single = single_device_units(problem, best_single_device(problem, "gpu" if problem.gpu_indices() else None))
        given = warm_start is not None and len(warm_start) > 0  # a (B, N) array as well as a list
        warm = distinct_unit_placements(problem, check_warm_start(problem, warm_start))[0] if given else []
        starts = np.stack([*warm, single, fitted_m_topo(problem)[0]])  # (S, U): the caller's first, as budgets cut
        starts = starts[: max(1, min(len(starts), int(budget)))]
        costs = np.asarray(memo.evaluate(starts))
        best = int(np.argmin(costs))
        warm_cost_s = float(costs[: len(warm)].min()) if len(warm) else math.inf
        return starts[best].copy(), float(costs[best]), warm_cost_s if warm_cost_s < FAILED_COST_S else math.nan

    @classmethod
    def _kicked(cls, problem, best_placement, count: int, movable, rng) -> np.ndarray:
        """(count, U) chains, each ``KICK_MOVES`` random moves away from the best (N,) op placement."""
        chains = np.repeat(problem.collapse(best_placement)[None, :], count, axis=0)
        for _ in range(KICK_MOVES):
            chains = cls._propose(problem, chains, movable, rng)
        return chains

    @staticmethod
    def _propose(problem, chains, movable, rng) -> np.ndarray:
        """Each chain moves one random movable unit to a different allowed device."""
        proposals = chains.copy()
        units = movable[rng.integers(len(movable), size=len(chains))]
        for c, unit in enumerate(units):
            options = np.flatnonzero(problem.unit_allowed[unit])
            options = options[options != chains[c, unit]]
            proposals[c, unit] = options[rng.integers(len(options))]
        return proposals
