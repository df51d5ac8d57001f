"""Which settings a search runs with: the flags given, or, for ``--resume``, the run's manifest with only a
higher budget or a time limit allowed to change (recorded in the manifest) and the session's own settings."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Mapping

from cluster.jobs.config import GROUPING_FILE, QUICK_BASELINES, SearchConfig
from cluster.runlog import read_manifest, read_result_json
from graphs.errors import PlacerError


SESSION_SETTINGS = ("workers", "ray_address", "out")
"""Settings a resume may give for its own session only: how it measures, not what (a resumed run stays
in its folder, so ``out`` does nothing); not given, the defaults, not the stopped session's."""
_DEFAULTS = {f.name: f.default for f in fields(SearchConfig)}
GROWABLE_SETTINGS = ("budget", "time_limit_s")
"""Settings a resume may change for the rest of the run (recorded in the manifest): the budget only
upwards; the time limit bounds each session from its start."""
FLAG_NAMES = {"time_limit_s": "--time-limit", "noise_std": "--noise", "bound_time_limit_s": "--bound-time-limit"}



def search_config(given: Mapping[str, object]) -> SearchConfig:
    """The search the user asked for: ``given`` holds only the settings given explicitly (a command's
    flags that were on its command line). A new run takes SearchConfig's defaults for the rest; a resumed
    one (``resume`` given) takes them from its manifest (see ``resume_config``)."""
    if given.get("resume"):
        return resume_config(str(given["resume"]), given)
    return SearchConfig(**given)



def resume_config(run_dir: str | Path, given: Mapping[str, object]) -> SearchConfig:
    """A stopped run's settings from its manifest, with the settings in ``given`` applied: session
    settings (SESSION_SETTINGS) for this session, a higher budget or a time limit for the rest of the run;
    a value that would change what the run searches (graph, machine, policy, seed, measurer, batch,
    groups, ...) is one PlacerError. A given value equal to the manifest's is no change."""
    manifest = read_manifest(run_dir)
    check_search_run(run_dir)  # before its settings: a baselines run's were compared with a search's defaults
    saved = _saved_config(manifest)
    if given.get("remove_devices") or saved.remove_devices:
        raise PlacerError(f"--remove-device is not supported for resumed runs (run {run_dir}"
                          + (" removes devices during its search)" if saved.remove_devices else ")"))
    # Not given: this session's defaults, not the last session's (a cluster address of a cluster gone since,
    # which RAY_ADDRESS in a `ray job submit` job could not override)
    changes = {name: _DEFAULTS[name] for name in SESSION_SETTINGS if name != "out"}
    for name, value in given.items():
        if name == "resume":
            continue
        value = tuple(value) if name == "baselines" else value
        was = getattr(saved, name)
        used = _default_used(name, saved, run_dir) if value is not None and was is None else was
        if _same(name, value, used, saved, run_dir) or name in SESSION_SETTINGS:
            changes[name] = was if name == "grouping" else value  # (the method asked for: a hierarchical run's
            # learner checks its prior against it)
        elif name in GROWABLE_SETTINGS:
            changes[name] = _grown(name, value, saved, run_dir)
        else:
            raise PlacerError(f"{_flag(name)} {value!r}: run {run_dir} searches "
                              + (f"with {was!r}" if was is not None else f"without {_flag(name)}")
                              + (f" (so with {used!r})" if was is None and used is not None else "")
                              + ", and a resumed run keeps it (start a new run to change it)")
    _check_budget(run_dir, saved, changes)
    return replace(saved, resume=str(run_dir), **changes)


def check_search_run(run_dir: str | Path) -> None:
    """A folder a search can resume: a search run's, which keeps its grouping (not a baselines run's)."""
    if not (Path(run_dir) / GROUPING_FILE).is_file():
        raise PlacerError(f"run folder {run_dir} has no {GROUPING_FILE}: not a search run")


def _check_budget(run_dir, saved: SearchConfig, changes: dict) -> None:
    """Only a learner goes on from where it stopped (its checkpoint), so only a learner's budget may be
    raised. A search or heuristic is run again from its start, every placement it logged answered from the
    log; its proposals depend on its budget (annealing's schedule), so at another budget it proposes others,
    and its log would be no run's. A run that spent its budget (or converged) has nothing left to search
    unless the budget is raised: resuming it would only rewrite its result with an empty session's."""
    from policies.registry import policy_entry

    learned = policy_entry(saved.policy).learned
    budget = changes.get("budget", saved.budget)
    if budget != saved.budget:
        if not learned:
            raise PlacerError(f"--budget {budget}: a resume runs {saved.policy} (not a learner) again from its "
                              f"start, and its placements depend on its budget, so run {run_dir} cannot go on "
                              f"to another; start a new run with --budget {budget}")
        return
    stop_reason = (read_result_json(run_dir) or {}).get("stop_reason")  # none: stopped before the end
    if stop_reason == "budget":
        raise PlacerError(f"run {run_dir} finished (stopped by budget at --budget {saved.budget}): "
                          + ("pass a larger --budget to continue it" if learned else "start a new run"))
    if stop_reason == "converged":
        raise PlacerError(f"run {run_dir} finished: it converged (it sampled nothing new) before its --budget "
                          f"{saved.budget}; start a new run" + (", or pass a larger --budget to let it go on"
                                                                  if learned else ""))



def _same(name: str, value, used, saved: SearchConfig, run_dir) -> bool:
    """A given value that changes nothing: what the run used (its saved value, or where it recorded none,
    ``_default_used``), ``--init pretrained`` where a gdp, placeto or giph run took the default, which is
    the committed checkpoint, or the grouping method that made its groups."""
    from policies.rl.gnn.config import KINDS

    return (value == used or (name == "init" and saved.policy in KINDS and {value, used} <= {None, "pretrained"})
            or (name == "grouping" and value == _grouping_made(run_dir)))


def _grouping_made(run_dir) -> str | None:
    """The method that made a run's groups, as its grouping.npz records it (scope falls back to metis on a graph
    of more top-level scopes than groups, and every output names "metis"); None where it records none."""
    import numpy as np

    try:
        with np.load(Path(run_dir) / GROUPING_FILE) as arrays:
            return str(arrays["method"]) if "method" in arrays else None
    except (OSError, ValueError):  # unreadable: the resume refuses it, saying why
        return None


def _default_used(name: str, saved: SearchConfig, run_dir):
    """What a run that recorded no ``name`` used: the measurer's ``--runs`` / ``--warmup``, hsdag's ``--init``
    (scratch), and a placeto run's ``--order`` and ``--passes``: those of its network, built as the resume
    builds it (from the run's own checkpoint once it has one; the order is the one its checkpoint was trained
    in). None for any other setting."""
    if name in ("runs", "warmup"):
        from measurers.timing import default_timing

        return getattr(default_timing(saved.measurer), name)
    if name == "init" and saved.policy == "hsdag":
        from policies.rl.gnn.hsdag.config import HsdagConfig

        return HsdagConfig.init
    if name in ("order", "passes") and saved.policy == "placeto":
        from cluster.jobs.config import CHECKPOINT_DIR
        from policies.base import RunContext
        from policies.registry import make_policy

        policy = make_policy(saved.policy, init=saved.init, context=RunContext(Path(run_dir) / CHECKPOINT_DIR))
        config = policy.config(saved.seed)
        return config.order if name == "order" else config.greedy_passes
    return None


def _saved_config(manifest) -> SearchConfig:
    from policies.registry import policy_entry

    saved = dict(manifest.config)
    saved["baselines"] = tuple(saved.get("baselines", QUICK_BASELINES))
    if "policy" in saved and not policy_entry(saved["policy"]).learned:
        saved["batch"] = None  # a --batch an older placer recorded for a policy that never used it
    saved["remove_devices"] = tuple(saved.get("remove_devices", ()))
    names = SearchConfig.__dataclass_fields__
    return SearchConfig(**{k: v for k, v in saved.items() if k in names})



def _grown(name: str, value, saved: SearchConfig, run_dir) -> object:
    if name == "budget" and value < saved.budget:
        raise PlacerError(f"--budget {value}: run {run_dir} has a budget of {saved.budget}; a resumed run can "
                          f"only raise it")
    return value



def _flag(name: str) -> str:
    return FLAG_NAMES.get(name, "--" + name.replace("_", "-"))



def resume_changes(manifest, config: SearchConfig) -> dict[str, tuple]:
    """The growable settings this resume changes: name -> (value in the manifest, new value)."""
    saved = _saved_config(manifest)
    return {name: (getattr(saved, name), getattr(config, name)) for name in GROWABLE_SETTINGS
            if getattr(saved, name) != getattr(config, name)}
