"""The jobs' settings: what a search and a baselines run take, and the checks both share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from graphs.errors import PlacerError, is_whole_number
from graphs.grouping import DEFAULT_MAX_GROUPS, DEFAULT_METHOD
from policies.registry import QUICK_HEURISTICS
from policies.rl.config import HIDDEN_SIZE


QUICK_BASELINES = ("single-gpu", "expert", "m-etf")
WARM_START_BASELINES = QUICK_HEURISTICS
"""Heuristics a search with a warm start scores at its start (with its ``baselines``): the candidates of
``--warm-start auto``."""
WARM_START_AUTO = "auto"
WARM_START_FILE = "warm_start.npy"
"""A run folder's copy of a warm start read from a file or another run: what a resume starts from."""
GROUPING_FILE = "grouping.npz"
BASELINES_FILE = "baselines.json"
BASELINES_POLICY = "baselines"  # the manifest's policy of a `placer baselines --out` run
FILE_POLICY = "warm-start"  # the run log's policy of the one measurement of a warm start read from a path
CHECKPOINT_DIR = "checkpoint"


def warm_start_label(source: str) -> str:
    """Who found a run's best when a warm start read from ``source`` (the --warm-start text) did, as
    result.json and `placer analyze` both name it."""
    return f"warm start ({source})"



@dataclass
class SearchConfig:
    graph: str = "nmt-2"
    """Benchmark name or graph file."""
    machine: str = "paper-2gpu"
    """Catalog machine name or machine file."""
    policy: str = "reinforce"
    """A learned policy (reinforce, ppo, hierarchical, post) or any other name in policies.registry.POLICIES."""
    measurer: str = "sim"
    """sim | torch | tf | openvino."""
    budget: int = 2048
    """Measurements the policy may spend (baselines are scored on top of it, one each)."""
    time_limit_s: float | None = None
    """Stop the policy after this many seconds (checked between batches)."""
    workers: int = 2
    """Measurer actors when the cluster has no GPU node."""
    batch: int | None = None
    """Placements the learner samples and measures per iteration; None: the policy's own (BATCH_SIZE of
    policies.rl.config for the seq2seq learners, the graph-neural placers' search defaults)."""
    groups: int = DEFAULT_MAX_GROUPS
    """Groups the graph is coarsened to; searches and learners place groups (graphs.grouping)."""
    grouping: str = DEFAULT_METHOD
    """How ops become groups (graphs.grouping METHODS)."""
    seed: int = 0
    runs: int | None = None
    """Timed runs per placement (median reported); None: measurers.timing.default_timing."""
    warmup: int | None = None
    """Untimed runs before the timed ones; None: measurers.timing.default_timing."""
    noise_std: float = 0.0
    """Simulator only: relative noise of each timed run (0 = exact)."""
    ray_address: str | None = None
    out: str = "runs"
    """Folder the run folder is made in."""
    resume: str | None = None
    """A run folder to continue. Every other setting must then equal the manifest's, except the session's
    own (workers, ray_address, out) and a higher budget or a time limit; ``cluster.jobs.search_config``
    with only the flags a user gave takes the rest from the manifest."""
    baselines: tuple[str, ...] = QUICK_BASELINES
    hidden_size: int = HIDDEN_SIZE
    """Learner width (see policies.rl.config.RLConfig)."""
    bound_time_limit_s: float = 10.0
    """Seconds for the proven bound (policies.exact.bound: LP and MIP relaxations on the searched groups),
    solved once at the start; 0: the closed form only."""
    warm_start: str | None = None
    """Learned policies only: placements the learner imitates first (None: off). "auto": the best of the
    baselines scored at the start (WARM_START_BASELINES added to ``baselines``); "m-etf,heft": those
    heuristics; a path: a .npy file of one (N,) op placement, or a run folder (its best placement).
    See cluster/jobs/warm_start.py."""
    split_groups: str | None = None
    """A heuristic's name: every searched group is split by the devices that heuristic gives its ops (at most
    groups x devices groups), so its placement is exactly one the policy can place; with ``warm_start`` of
    the same heuristic the policy starts from the heuristic's own step time, not its collapse onto the groups.
    Only for policies that place the groups (searches and learners but hierarchical and hsdag)."""
    planner_groups: int | None = None
    """hierarchical only: G, the groups its grouper assigns the colocation groups to; None: the paper's 256
    (policies/rl/hierarchical/config.py NUM_GROUPS). `placer search --policy hierarchical --groups G` sets it."""
    init: str | None = None
    """gdp, placeto and giph: the network's weights: a checkpoint file from `placer train`, "pretrained" (None
    means it too: the committed checkpoint, policies/rl/gnn/checkpoint.py pretrained_path) or "scratch";
    hsdag: "scratch" (None means it too) or "pretrained" (gdp's encoder)."""
    order: str | None = None
    """placeto only: the order it visits the groups in (policies.rl.gnn.config.ORDERS; None: its default)."""
    passes: int | None = None
    """placeto only: the greedy passes over the groups of its zero-shot decode (GnnConfig.greedy_passes; None:
    the search's default, PlacetoPolicy.search_defaults)."""
    remove_devices: tuple[str, ...] = ()
    """Devices that leave during the search, "NAME@MEASUREMENTS" or "NAME@node-lost" (cluster/jobs/removal.py):
    the policy goes on, on the devices left. Not with policies whose network has one output per device."""



@dataclass
class BaselinesConfig:
    """``placer baselines``: every named non-learned policy on one graph and machine, one measurer."""
    graph: str
    machine: str
    policies: tuple[str, ...] | None = None
    """Registry names (None: every non-learned policy, policies.registry.baseline_names())."""
    budget: int = 500
    """Measurements each search may spend (heuristics spend one)."""
    groups: int = DEFAULT_MAX_GROUPS
    grouping: str = DEFAULT_METHOD
    seed: int = 0
    measurer: str = "sim"
    """sim: the simulator in this process; torch | tf: real runs through the Ray measurer pool."""
    runs: int | None = None
    warmup: int | None = None
    ray_address: str | None = None
    out: str | None = None
    """Write a run log (and baselines.json) under this folder."""
    bound_time_limit_s: float = 10.0
    """Seconds for the proven bound on the searches' groups (see SearchConfig); 0: the closed form only."""



def check_bound_time_limit(seconds: float, flag: str = "--bound-time-limit") -> None:
    import math

    if not (seconds >= 0 and math.isfinite(seconds)):
        raise PlacerError(f"{flag} must be a finite number of seconds >= 0, got {seconds}")


MAX_RUNS = 10_000  # timed or warm-up runs per placement: 10**11 allocated 745 GiB for the samples
MAX_WORKERS = 256  # measurer actors without GPU nodes: each is a process (99,999 flooded Ray and hung)


def check_measurer_settings(measurer: str, runs: int | None, warmup: int | None) -> None:
    """The measurer's name and timing counts, checked before any work (a bound, Ray) starts."""
    from measurers.factory import MEASURER_KINDS

    if measurer not in MEASURER_KINDS:
        raise PlacerError(f"--measurer: unknown measurer {measurer!r} (known: {', '.join(MEASURER_KINDS)})")
    if runs is not None and not 1 <= runs <= MAX_RUNS:
        raise PlacerError(f"--runs must be from 1 to {MAX_RUNS:,}, got {runs}")
    if warmup is not None and not 0 <= warmup <= MAX_RUNS:
        raise PlacerError(f"--warmup must be from 0 to {MAX_RUNS:,}, got {warmup}")
    if measurer == "sim" and warmup:  # it was taken and recorded in the manifest, which then said what never ran
        raise PlacerError(f"--warmup {warmup}: the simulator runs no warm-up (its steps need none); give --warmup "
                          "with a real measurer (--measurer torch, tf or openvino)")


def check_unique(names: Sequence[str], flag: str) -> None:
    """One PlacerError naming the entries of ``flag`` given more than once."""
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise PlacerError(f"{flag}: {', '.join(repeated)} given more than once")


def check_counts(budget: int, groups: int, grouping: str) -> None:
    from graphs.grouping import METHODS

    if not is_whole_number(budget) or budget < 1:
        raise PlacerError(f"--budget must be a whole number of at least 1 measurement, got {budget!r}")
    if not is_whole_number(groups) or groups < 1:
        raise PlacerError(f"--groups must be a whole number of at least 1, got {groups!r}")
    if grouping not in METHODS:
        raise PlacerError(f"--grouping: unknown grouping method {grouping!r} (known: {', '.join(METHODS)})")


def check_policy_groups(policy: str, groups: int) -> None:
    """A policy with a solver (exact) places at most its ``max_groups``: more is refused before any work."""
    from policies.registry import policy_entry

    most = policy_entry(policy).max_groups
    if most is not None and groups > most:
        raise PlacerError(f"--groups {groups}: policy {policy!r} places at most {most} groups (its solver's "
                          f"memory); use --groups {most} or fewer")
