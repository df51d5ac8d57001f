"""Where a search's warm start comes from (``SearchConfig.warm_start``, ``placer search --warm-start``).

A learned policy takes ``warm_start``: candidate op placements, best-first (policies/rl/warm_start.py). The
search job finds them in one of three sources::

    auto              the baselines it scores at its start (WARM_START_BASELINES added), those that ran ok
    m-etf,heft        these heuristics (scored with the baselines, outside the budget)
    PATH              a .npy file of one (N,) int op placement, or a run folder (its best placement); it is
                      checked against the graph before the run folder is made, copied into the run folder
                      (WARM_START_FILE: a resume starts from the copy) and scored once, logged as "warm-start"

Candidates are ordered best-first by their measured step time; the result names the best
(``WarmStartChoice.source``: a heuristic's name, or the path as given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from cluster.jobs.config import WARM_START_AUTO, WARM_START_BASELINES, WARM_START_FILE, SearchConfig, check_unique
from graphs.errors import PlacerError
from graphs.files import atomic_file
from measurers.base import Measurer

@dataclass(frozen=True)
class WarmStartSource:
    """``SearchConfig.warm_start`` parsed: heuristic names (``auto``: every scored baseline), or a path."""
    text: str  # as the user gave it
    names: tuple[str, ...] = ()  # heuristics; empty for auto and for a path
    path: Path | None = None  # a .npy file or a run folder

    @property
    def auto(self) -> bool:
        return self.text == WARM_START_AUTO


@dataclass
class WarmStartChoice:
    """What the learner is given, and what the result reports."""
    source: str  # the best candidate's heuristic name, or the path as given
    runtime_s: float  # the best candidate's measured step time; nan when none ran ok
    candidates: list[np.ndarray] = field(default_factory=list)  # (N,) int64 op placements, best-first

    @property
    def usable(self) -> bool:
        return bool(self.candidates)


def check_warm_start_config(config: SearchConfig) -> WarmStartSource | None:
    """The warm start's source, checked without the graph (check_search_config): a learned policy, names
    that are heuristics, or a path that exists (a resumed run starts from its own copy)."""
    from policies.registry import policy_entry, warm_start_names

    if config.warm_start is None:
        return None
    entry = policy_entry(config.policy)
    if not entry.takes_warm_start:
        raise PlacerError(f"--warm-start needs a --policy that takes one ({', '.join(warm_start_names())}); "
                          f"{config.policy!r} is a {entry.kind} policy")
    return parse_warm_start(config.warm_start, config.resume)


def parse_warm_start(text: str, resume: str | None = None) -> WarmStartSource:
    """``auto``, heuristic names separated by commas, or an existing .npy file or run folder (a resumed run:
    the copy in its folder). PlacerError for anything else."""
    from policies.registry import heuristic_choices, is_heuristic

    saved = Path(resume) / WARM_START_FILE if resume else None
    if saved is not None and saved.is_file():
        return WarmStartSource(text, path=saved)
    if text == WARM_START_AUTO:
        return WarmStartSource(text)
    if not text.strip():
        raise PlacerError("--warm-start: empty source (give auto, heuristic names, a .npy file or a run folder)")
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if not is_heuristic(name)]
    if not unknown:
        check_unique(names, "--warm-start")  # as every other list flag: was dropped, yet recorded twice
        return WarmStartSource(text, names=names)
    path = Path(text)
    if path.is_dir() or (path.is_file() and path.suffix == ".npy"):
        return WarmStartSource(text, path=path)
    if path.is_file():
        raise PlacerError(f"--warm-start {text!r}: a file must be a .npy file holding one (N,) int placement")
    raise PlacerError(f"--warm-start: unknown warm start {unknown[0]!r}: not a heuristic "
                      f"({heuristic_choices()}), 'auto', nor an existing .npy file or "
                      f"run folder")


def scored_baselines(config: SearchConfig) -> tuple[str, ...]:
    """The heuristics the search scores at its start: its baselines, plus the warm start's candidates."""
    source = check_warm_start_config(config)
    extra: Sequence[str] = ()
    if source is not None:
        extra = WARM_START_BASELINES if source.auto else source.names
    return tuple(dict.fromkeys((*config.baselines, *extra)))


def load_warm_start_placement(source: WarmStartSource | None, problem) -> np.ndarray | None:
    """(N,) int64: the placement a path names, checked for the problem's graph and machine (wrong length,
    unknown or disallowed device, split colocation group: PlacerError); None for heuristic sources."""
    from policies.rl.warm_start import check_warm_start

    if source is not None and source.names:
        _check_a_named_heuristic_places(source.names, problem.graph.name)
    if source is None or source.path is None:
        return None
    if source.path.is_dir():
        placement = _run_best_placement(source.path, problem.graph)
    else:
        placement = _read_npy(source.path)
    (checked,) = check_warm_start(problem, [placement])
    return checked


def _check_a_named_heuristic_places(names: Sequence[str], graph_name: str) -> None:
    """``--warm-start expert`` on a graph the expert has no rule for is refused, as ``--split-groups expert``
    is: the search ran without a warm start, and its result said only "warm_start": "expert". (Every other
    heuristic places any graph.)"""
    from policies.expert import check_expert_rule

    if set(names) == {"expert"}:
        check_expert_rule(graph_name, "--warm-start expert")


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:  # EOFError: an empty file
        raise PlacerError(f"--warm-start {path}: cannot read it as a .npy array ({exc})") from None


def _run_best_placement(run_dir: Path, graph) -> np.ndarray:
    from cluster.run_best import read_run_best_of

    return read_run_best_of(run_dir, graph, f"--warm-start {run_dir}").op_placement(graph)


def save_warm_start_placement(run_dir: Path, placement: np.ndarray | None) -> None:
    """Keep a path's placement in the run folder: a resume starts from it even when the path is gone."""
    if placement is not None and not (run_dir / WARM_START_FILE).is_file():
        # a resume never reads half a file; np.save on a path would add ".npy" to the temporary name
        with atomic_file(run_dir / WARM_START_FILE) as tmp, open(tmp, "wb") as handle:
            np.save(handle, placement)


def heuristic_choice(source: WarmStartSource, runtimes_s: Mapping[str, float],
                     placements: Mapping[str, np.ndarray]) -> WarmStartChoice:
    """The scored heuristics that ran ok (``auto``: every one; else the named ones), best-first."""
    names = runtimes_s if source.auto else source.names
    ran = sorted((runtimes_s[name], name) for name in names
                 if name in placements and math.isfinite(runtimes_s.get(name, math.nan)))
    if not ran:
        return WarmStartChoice(source.text, math.nan)
    return WarmStartChoice(ran[0][1], ran[0][0], [placements[name] for _, name in ran])


def path_choice(source: WarmStartSource, placement: np.ndarray, measurer: Measurer) -> WarmStartChoice:
    """A path's placement, scored once by ``measurer`` (outside the policy's budget)."""
    (measurement,) = measurer.measure([placement])
    runtime_s = float(measurement.runtime_s) if measurement.ok else math.nan
    return WarmStartChoice(source.text, runtime_s, [placement])
