"""Training a graph-neural placer across a family of problems (what `placer train` runs).

First, with a ``teacher_budget``, each problem gets a teacher (policies/rl/gnn/teacher.py: the quick
heuristics, then annealing, ``teacher_budget`` measurements) and the network imitates the teachers'
placements for ``imitation_steps`` Adam steps; then it learns from rewards. The problems (graph, machine, grouping) are visited round-robin in an order reshuffled every round by
the trainer's seeded generator; each visit is one update (GDP: one batch of placements; Placeto: one
batch of episodes). ``budget`` counts measurements over all problems; a placement sampled again on the
same problem costs nothing. The checkpoint (policies/rl/gnn/checkpoint.py) is written every
``checkpoint_every`` updates and at the end, each problem's memo of measured placements beside it
(``OUT.resume``); ``resume=True`` continues from the one at ``out``, which must have been trained on the same
problems with the same network.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from graphs.errors import PlacerError, first_line
from measurers.base import Measurer
from policies.base import BudgetedMeasurer, CountingMeasurer, DecisionClock, early_stop
from policies.problem import PlacementProblem
from policies.rl.gnn.checkpoint import (read_checkpoint, read_resume_state, resume_path, write_checkpoint,
                                       write_resume_state)
from policies.rl.gnn.config import GnnConfig
from policies.rl.gnn.problems import RESTORE_ERRORS, Slot
from policies.rl.gnn.teacher import Teaching, teach
from policies.rl.gnn.trainer import UpdateMetrics

UNLIMITED = 2 ** 62
IDLE_ROUNDS = 3  # rounds over every problem that measure nothing new: the policy has converged
TAUGHT_SETTINGS = ("teacher_budget", "imitation_steps")  # settings of a taught run (`placer train`), kept if taught


@dataclass(frozen=True)
class TrainProblem:
    name: str  # "graph@machine", unique
    problem: PlacementProblem
    measurer: Measurer


@dataclass(frozen=True)
class FamilyResult:
    updates: int
    measurements_used: int
    wall_s: float  # this session's and every session's before a resume
    stop_reason: str  # "budget" | "time_limit" | "should_stop" | "converged" (IDLE_ROUNDS)
    checkpoint: Path


def train_family(problems: Sequence[TrainProblem], config: GnnConfig, budget: int, out: str | Path, *,
                 resume: bool = False, resume_state: dict | None = None, time_limit_s: float | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 on_update: Callable[[UpdateMetrics], None] | None = None,
                 checkpoint_every: int = 50, teacher_budget: int = 0, imitation_steps: int = 0,
                 on_teacher: Callable[[str, Teaching | None], None] | None = None,
                 settings: dict | None = None) -> FamilyResult:
    """Train on ``problems`` (see the module docstring). ``settings`` (plain values: how the problems were
    built, e.g. the grouping) are stored in the checkpoint, and a resumed run must have the same.
    ``resume_state``: what ``check_resume`` returned for this run, when the caller checked it already (the
    checkpoint and its resume file, up to tens of MB, are then not read twice); else ``resume`` reads it."""
    from policies.rl.gnn.trainer import GnnTrainer
    from policies.rl.loop import deterministic_torch

    if not problems:
        raise PlacerError("placer train needs at least one graph and one machine")
    if budget < 1:
        raise PlacerError(f"--budget must be at least 1 measurement, got {budget}")
    started = time.perf_counter()  # the session's wall time counts building the learner and loading a resume
    out, names = Path(out), [p.name for p in problems]
    slots = [Slot(p.problem, BudgetedMeasurer(p.measurer, UNLIMITED, p.problem.capacity_bytes(), DecisionClock()),
                  config.failure_factor) for p in problems]
    with deterministic_torch():
        trainer = GnnTrainer(config)
        digests = problem_digests(problems)
        progress = {"measurements_used": 0, "wall_s": 0.0, "updates": 0, "problems": names, "budget": budget,
                    "config": {k: v for k, v in vars(config).items()}, "settings": dict(settings or {}),
                    "problem_digests": digests}
        if resume:
            if resume_state is None:
                resume_state = check_resume(out, config, names, dict(settings or {}), budget)
            check_same_problems(out, resume_state["progress"], names, digests)
            progress = _restored(out, resume_state, trainer, budget, slots)
        before_s = float(progress["wall_s"])

        def stop_now() -> str | None:
            return early_stop(started, time_limit_s, should_stop)

        def save() -> None:
            progress["wall_s"] = before_s + time.perf_counter() - started
            write_resume_state(out, progress["updates"], [_compact(slot.progress_state()) for slot in slots])
            try:
                write_checkpoint(out, config.kind, trainer.state(), progress)
            except BaseException:  # a first save cut short (a full disk): no resume state without a checkpoint
                if not Path(out).exists():
                    resume_path(out).unlink(missing_ok=True)
                raise

        if teacher_budget > 0 and "teachers" not in progress:
            stopped = _teach_and_imitate(problems, slots, trainer, progress, budget, teacher_budget,
                                         imitation_steps, on_teacher, stop_now)
            if stopped is not None:  # nothing saved: a run started again teaches every problem
                return FamilyResult(0, progress["measurements_used"], time.perf_counter() - started, stopped, out)
            save()
        stop_reason = _round_robin(slots, names, trainer, progress, budget, stop_now, on_update,
                                   lambda: progress["updates"] % checkpoint_every == 0 and save())
        if stop_reason == "time_limit" and progress["updates"] == 0 and not Path(out).exists():
            # its weights untrained, which `search --init` would take: nothing saved, as for a teacher cut short
            return FamilyResult(0, progress["measurements_used"], time.perf_counter() - started, stop_reason, out)
        save()
    return FamilyResult(progress["updates"], progress["measurements_used"], float(progress["wall_s"]),
                        stop_reason, out)


def problem_digests(problems: Sequence[TrainProblem]) -> list[str]:
    """Per problem, a digest of its graph's content and its machine: a graph or machine file edited under
    the same name is another problem."""
    import hashlib
    import json

    from measurers.machine_json import machine_to_json

    return [hashlib.sha256((p.problem.graph.content_hash + json.dumps(machine_to_json(p.problem.machine),
                                                                      sort_keys=True)).encode()).hexdigest()[:16]
            for p in problems]


def check_same_problems(out: str | Path, stored: dict, names: list[str], digests: list[str]) -> None:
    """A resumed run's problems are the checkpoint's, content and all (checkpoints written before 6 December
    2026 keep no digests: names only). A changed one would be trained on with the old one's measured
    placements and best, at their old costs."""
    before = stored.get("problem_digests")
    if before is None:
        return
    changed = [name for name, old, new in zip(names, before, digests) if old != new]
    if changed:
        raise PlacerError(f"checkpoint {out} was trained on other contents of {', '.join(changed)} (a graph or "
                          "machine file changed since): resume with the files it was trained on, or train anew")


def _round_robin(slots: list[Slot], names: list[str], trainer, progress: dict, budget: int, stop_now,
                 on_update, after_update) -> str:
    """Visit the problems in reshuffled rounds, one update each, until the budget, a stop or
    ``IDLE_ROUNDS`` rounds with nothing new measured; returns the stop reason. The round in progress and
    the count of idle visits live in ``progress``, so a resumed run visits what the run would have."""
    order: list[int] = progress.setdefault("round", [])  # the problems left to visit this round
    while budget - progress["measurements_used"] >= 2:  # a batch needs two placements at least
        stopped = stop_now()
        if stopped is not None:
            return stopped
        if progress.get("idle", 0) >= IDLE_ROUNDS * len(slots):
            return "converged"
        if not order:
            order.extend(int(k) for k in trainer.rng.permutation(len(slots)))
        k = order.pop()
        slot = slots[k]
        slot.counter.budget = slot.counter.used + budget - progress["measurements_used"]
        used = slot.counter.used
        metrics = trainer.iterate(slot, name=names[k])
        progress["measurements_used"] += slot.counter.used - used
        progress["idle"] = 0 if slot.counter.used > used else progress.get("idle", 0) + 1
        if metrics is None:
            continue
        progress["updates"] += 1
        metrics.measurements_used = progress["measurements_used"]
        if on_update is not None:
            on_update(metrics)
        after_update()
    return "budget"


def _teach_and_imitate(problems, slots, trainer, progress: dict, budget: int, teacher_budget: int,
                       imitation_steps: int, on_teacher, stop_now) -> str | None:
    """A teacher per problem (while the budget lasts), then imitation of every teacher that found one.
    Returns the stop reason when the time limit or a stop came first (no teachers kept), else None."""
    teachers: dict[str, dict] = {}
    for k, (problem, slot) in enumerate(zip(problems, slots)):
        left = budget - progress["measurements_used"]
        stopped = stop_now()
        if stopped is not None:
            return stopped
        if left < 2:
            break
        counted = CountingMeasurer(problem.measurer)  # what a teacher that found nothing spent counts too
        found = teach(problem.problem, counted, min(teacher_budget, left), trainer.config.seed + k,
                      slot.position, slot.work_weight)
        progress["measurements_used"] += counted.used
        if on_teacher is not None:
            on_teacher(problem.name, found)
        if found is not None:
            teachers[problem.name] = {"units": found.units.tolist(), "runtime_s": found.runtime_s}
            slot.record(found.units, found.runtime_s)  # its best is known: training never measures it again
    stopped = stop_now()
    if stopped is not None:
        return stopped
    progress["teachers"] = teachers
    taught = [k for k, p in enumerate(problems) if p.name in teachers]
    if taught and imitation_steps > 0:
        progress["imitation_loss"] = trainer.imitate(
            [slots[k] for k in taught], [np.array(teachers[problems[k].name]["units"]) for k in taught],
            imitation_steps)
    return None


def check_resume(out: str | Path, config: GnnConfig, names: list[str], settings: dict, budget: int) -> dict:
    """The checkpoint at ``out`` read and checked against the run that would resume it (network, problem
    names, settings, a budget no lower than the measurements it made): one PlacerError naming the file for
    the first difference; then its resume file (``checkpoint.read_resume_state``: damaged, foreign or cut short,
    refused the same way). Returns the checkpoint's state, the resume file's slots in its progress (where
    checkpoints of 3-5 December 2026 kept them)."""
    state = read_checkpoint(out, config.kind)
    _check_resume_sections(out, state)
    if state["architecture"] != config.architecture:
        raise PlacerError(f"checkpoint {out} holds a network {state['architecture']}, not {config.architecture}: "
                          "resume with the same --hidden and --layers")
    progress = state["progress"]
    settings = _as_stored(settings, progress)
    if progress.get("problems") != names:
        raise PlacerError(f"checkpoint {out} was trained on {progress.get('problems')}, not {names}: resume "
                          "with the same --graphs and --machines")
    if any(k >= len(names) for k in progress.get("round", [])):  # whole numbers: read_checkpoint checked them
        raise PlacerError(f"checkpoint {out}: progress.round names a problem past its {len(names)}")
    if progress.get("settings", {}) != settings:
        changed = _changed_settings(progress.get("settings", {}), settings)
        raise PlacerError(f"checkpoint {out} was trained with {', '.join(changed)}: resume with the same settings")
    changed = _changed_training_settings(progress.get("config", {}), config)
    if changed:
        raise PlacerError(f"checkpoint {out} was trained with {', '.join(changed)}: resume with the same training "
                          "settings (a resumed run continues its optimizer as it was)")
    used = int(progress.get("measurements_used", 0))
    if budget < used:
        raise PlacerError(f"--budget {budget}: checkpoint {out} has made {used} measurements already; resume with "
                          f"a budget of at least {used}")
    slots = read_resume_state(out, progress.get("updates"))
    if slots is not None:
        state["progress"] = {**progress, "slots": slots}
    return state


def _as_stored(settings: dict, progress: dict) -> dict:
    """``settings`` as a checkpoint records them: one taught before the teacher's settings were stored (its
    progress has teachers, its settings not TAUGHT_SETTINGS) resumes with the flags it was trained with."""
    stored = progress.get("settings", {})
    if "teachers" in progress and not any(key in stored for key in TAUGHT_SETTINGS):
        return {key: value for key, value in settings.items() if key not in TAUGHT_SETTINGS}
    return settings


RESUME_SECTIONS = ("optimizers", "generator", "rng", "iteration")  # of "trainer", besides the network


def _check_resume_sections(out, state: dict) -> None:
    """What continuing training reads beyond the weights (which a search's --init reads alone)."""
    trainer, progress = state.get("trainer"), state.get("progress")
    missing = [f"trainer.{key}" for key in RESUME_SECTIONS if key not in trainer]
    missing += [] if isinstance(progress, dict) else ["progress"]
    if missing:
        raise PlacerError(f"checkpoint {out} lacks {', '.join(missing)}, which training reads to continue: it "
                          "can start a search (--init) but not be resumed")


TRAIN_FLAGS = {"batch_size": "--batch", "lr": "--lr", "entropy_coeff": "--entropy", "order": "--order",
               "episode_steps": "--episode-steps", "discount": "--discount", "seed": "--seed"}
"""`placer train`'s flag of each GnnConfig field it sets (the network's own are checked as the architecture)."""


def _changed_settings(stored: dict, given: dict) -> list[str]:
    """Each setting (``placer train``'s flag of the same name) that differs, as "--flag STORED (not NEW)"; the
    whole dicts were printed, and a changed --seed was hard to find in them."""
    def shown(value) -> str:
        return "unset" if value is None else " ".join(map(str, value)) if isinstance(value, list) else str(value)

    keys = dict.fromkeys([*stored, *given])
    return [f"--{key.replace('_', '-')} {shown(stored.get(key))} (not {shown(given.get(key))})" for key in keys
            if stored.get(key) != given.get(key)]


def _changed_training_settings(stored: dict, config: GnnConfig) -> list[str]:
    """Each GnnConfig field whose stored value differs from ``config``'s, as "--flag STORED (not NEW)"."""
    given = vars(config)
    return [f"{TRAIN_FLAGS.get(name, name)} {value} (not {given[name]})" for name, value in stored.items()
            if name in given and value != given[name]]


def _compact(slot_state: dict) -> dict:
    """A slot's ``progress_state`` with its memo's placements as int16 (device indices): a quarter of the
    resume state's size (600,000 measurements of 32 groups: 38 MB)."""
    return {**slot_state, "memo_units": slot_state["memo_units"].to(torch.int16)}


def _restored(out: Path, state: dict, trainer, budget: int, slots: list[Slot]) -> dict:
    """The checked checkpoint ``state``'s progress, its trainer state loaded into ``trainer`` and each
    problem's memo of measured placements and best into ``slots`` (a placement measured before the resume
    costs nothing)."""
    progress = dict(state["progress"])
    saved_slots = progress.pop("slots", ())  # none for a committed checkpoint or one older than 3 December 2026
    try:
        trainer.load_state(state["trainer"])
        for slot, slot_state in zip(slots, saved_slots):
            if (slot_state["num_groups"], slot_state["num_devices"]) != (slot.num_groups, slot.problem.num_devices):
                raise ValueError(f"a problem of {slot_state['num_groups']} groups on {slot_state['num_devices']} "
                                 f"devices, not {slot.num_groups} on {slot.problem.num_devices}")
            slot.load_progress(slot_state)
    except RESTORE_ERRORS as exc:  # a section of the wrong shape
        raise PlacerError(f"checkpoint {out}: its trainer state or resume state cannot be restored ({type(exc).__name__}: "
                          f"{first_line(exc)})") from None
    progress["budget"] = budget
    return progress

