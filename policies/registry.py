"""One registry of every placement policy, learned ones included, and one way to run any of them.

``place(name, problem, measurer, budget, seed)`` is what every command and job calls: it builds the policy
and hands it the units it places. Heuristics (rules, partitioners, list schedulers) place the graph's
colocation groups, as their authors ran them; searches and learned placers place the problem's coarse
groups, except a learner that groups the graph itself (``groups_itself``: the hierarchical planner), which
gets the colocation groups to group. ``device:K`` is everything on device K. A new policy joins with ``register_policy``.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from graphs.errors import PlacerError, check_seed
from measurers.base import Measurer
from measurers.machine import Machine
from policies.base import OnMeasurement, Policy, PolicyResult
from policies.problem import PlacementProblem

KINDS = ("heuristic", "search", "learned")
QUICK_HEURISTICS = ("single-gpu", "expert", "m-topo", "m-etf", "m-sct", "heft")
"""Heuristics cheap enough to score at the start of a search: ``--warm-start auto``'s candidates, and
where the graph-neural placers' teacher searches start."""


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    target: str  # "module:Class", imported on use so listing policies stays cheap
    kind: str  # one of KINDS
    summary: str
    groups_itself: bool = False  # learns its own grouping of the colocation groups (the hierarchical planner)
    warm_startable: bool = False  # a non-learned policy that takes ``warm_start`` too (annealing)
    stoppable: bool = False  # a non-learned policy that takes ``context`` too (a RunContext: its time limit and
    # stop flag, checked between batches; random, cem, annealing)
    default_baseline: bool = True  # `placer baselines` runs it when no --policies are named (exact: not, it is slow)
    takes_time_limit: bool = False  # its constructor takes ``time_limit_s`` (exact: the solver's wall time)
    max_groups: int | None = None  # the most groups it can place (exact: policies.exact.policy.MAX_GROUPS)

    @property
    def places_groups(self) -> bool:
        """Searches and learners place the coarse groups; heuristics, and learners that group the graph
        themselves, place colocation groups."""
        return self.kind != "heuristic" and not self.groups_itself

    @property
    def learned(self) -> bool:
        return self.kind == "learned"

    @property
    def takes_context(self) -> bool:
        """Its constructor takes ``context`` (policies.base.RunContext): every learner, and the searches that
        stop between batches."""
        return self.learned or self.stoppable

    @property
    def takes_warm_start(self) -> bool:
        """Its constructor takes ``warm_start`` (op placements, best-first): every learner, annealing and exact."""
        return self.learned or self.warm_startable


POLICIES: dict[str, PolicyEntry] = {}


def register_policy(entry: PolicyEntry) -> None:
    if entry.kind not in KINDS:
        raise PlacerError(f"policy {entry.name!r}: kind must be one of {', '.join(KINDS)}, got {entry.kind!r}")
    POLICIES[entry.name] = entry


for _entry in (
    PolicyEntry("single-gpu", "policies.simple:SingleGpuPolicy", "heuristic",
                "everything on the GPU the cost model says is fastest"),
    PolicyEntry("cpu-only", "policies.simple:CpuOnlyPolicy", "heuristic", "everything on the CPU"),
    PolicyEntry("round-robin", "policies.simple:RoundRobinPolicy", "heuristic",
                "colocation groups dealt in turn to the GPUs"),
    PolicyEntry("expert", "policies.expert:ExpertPolicy", "heuristic", "the papers' hand placements"),
    PolicyEntry("metis", "policies.metis:MetisPolicy", "heuristic", "balanced min-cut partition"),
    PolicyEntry("m-topo", "policies.baechi:MTopoPolicy", "heuristic", "Baechi's memory-constrained topo order"),
    PolicyEntry("m-etf", "policies.baechi:METFPolicy", "heuristic", "Baechi's earliest task first"),
    PolicyEntry("m-sct", "policies.baechi:MSCTPolicy", "heuristic", "Baechi's small communication times"),
    PolicyEntry("heft", "policies.heft:HeftPolicy", "heuristic", "heterogeneous earliest finish time"),
    PolicyEntry("random", "policies.search:RandomSearchPolicy", "search", "random search over the groups",
                stoppable=True),
    PolicyEntry("cem", "policies.search:CrossEntropyPolicy", "search", "cross-entropy method", stoppable=True),
    PolicyEntry("annealing", "policies.search:AnnealingPolicy", "search", "simulated annealing",
                warm_startable=True, stoppable=True),
    PolicyEntry("exact", "policies.exact.policy:ExactPolicy", "search",
                "solver: the simulator's relaxation (HiGHS) or joint scheduling (CP-SAT, Moirai)",
                warm_startable=True, default_baseline=False, takes_time_limit=True, max_groups=1000),
    PolicyEntry("reinforce", "policies.rl.seq2seq.policy:ReinforcePolicy", "learned",
                "seq2seq placer trained with REINFORCE (Mirhoseini et al. 2017)"),
    PolicyEntry("ppo", "policies.rl.seq2seq.policy:PPOPolicy", "learned", "seq2seq placer trained with PPO"),
    PolicyEntry("hierarchical", "policies.rl.hierarchical.policy:HierarchicalPolicy", "learned",
                "grouper + seq2seq placer trained jointly (Mirhoseini, Goldie et al. 2018)", groups_itself=True),
    PolicyEntry("post", "policies.rl.post.policy:PostPolicy", "learned",
                "cross-entropy minimization interleaved with PPO (Post, Gao et al. 2018)"),
    PolicyEntry("gdp", "policies.rl.gnn.policy:GdpPolicy", "learned",
                "graph-neural one-shot placer, pre-trained across graphs (GDP, Zhou et al. 2019)"),
    PolicyEntry("placeto", "policies.rl.gnn.policy:PlacetoPolicy", "learned",
                "graph-neural iterative placer, pre-trained across graphs (Placeto, Addanki et al. 2019)"),
    PolicyEntry("giph", "policies.rl.gnn.policy:GiphPolicy", "learned",
                "graph policy of relocation moves, trained across heterogeneous machines (GiPH, Hu et al. 2023)"),
    PolicyEntry("hsdag", "policies.rl.gnn.hsdag.policy:HsdagPolicy", "learned",
                "structure-aware placer: graph parsing into groups it chooses, then devices (HSDAG, 2024)",
                groups_itself=True),
):
    register_policy(_entry)



def baseline_names() -> tuple[str, ...]:
    """Every non-learned policy registered so far that runs by default (not ``exact``): what `placer
    baselines` runs when no policies are named."""
    return tuple(name for name, entry in POLICIES.items() if not entry.learned and entry.default_baseline)


def learned_names() -> tuple[str, ...]:
    return tuple(name for name, entry in POLICIES.items() if entry.learned)


def warm_start_names() -> tuple[str, ...]:
    """Every policy that takes a warm start."""
    return tuple(name for name, entry in POLICIES.items() if entry.takes_warm_start)


def groups_itself(spec: str) -> bool:
    """Whether ``spec`` places groups of its own making, for which the proven bound of the searched groups
    does not hold (its placements may go below it); False for a name the registry does not know."""
    entry = POLICIES.get(spec)
    return entry is not None and entry.groups_itself


def policy_entry(spec: str) -> PolicyEntry:
    """The registry entry of ``spec``; ``device:K`` is a heuristic of its own."""
    if spec.startswith("device:"):
        text = spec.split(":", 1)[1]
        if not (text.isascii() and text.isdigit() and str(int(text)) == text):  # one spelling per device
            raise PlacerError(f"bad policy {spec!r}: expected device:K with K a device index (0, 1, 2, ...)")
        device = int(text)
        return PolicyEntry(spec, "policies.simple:SingleDevicePolicy", "heuristic", f"everything on device {device}")
    if spec not in POLICIES:
        raise PlacerError(f"unknown policy {spec!r} (known: {', '.join(POLICIES)}, device:K)")
    return POLICIES[spec]


def check_device_policies(specs: Sequence[str], machine: Machine, what: str) -> None:
    """Every ``device:K`` among ``specs`` names a device of ``machine``: else one PlacerError starting with
    ``what`` (the flag), before any work (a search would otherwise fail after its folder is made)."""
    for spec in specs:
        policy_entry(spec)  # a malformed device:K, or an unknown name
        if spec.startswith("device:") and not 0 <= int(spec.split(":", 1)[1]) < machine.num_devices:
            raise PlacerError(f"{what}: {spec} names no device of machine {machine.name!r} "
                              f"(devices 0..{machine.num_devices - 1})")


def make_policy(spec: str, **options) -> Policy:
    """A policy by name; ``options`` go to its constructor (learned policies: RLConfig fields, ``context``)."""
    entry = policy_entry(spec)
    module_name, class_name = entry.target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if spec.startswith("device:"):
        options = {**options, "device": int(spec.split(":", 1)[1])}
    try:  # an option the constructor does not take (those taking **options check their own names)
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        raise PlacerError(f"policy {spec!r}: {exc}") from None
    return cls(**options)


def place(spec: str, problem: PlacementProblem, measurer: Measurer, budget: int, seed: int,
          on_measurement: OnMeasurement | None = None, **options) -> PolicyResult:
    """Run the named policy on the units it places (see the module docstring) and return its result."""
    check_seed(seed)
    entry = policy_entry(spec)
    target = problem if entry.places_groups else problem.at_op_level()
    return make_policy(spec, **options).place(target, measurer, budget, seed, on_measurement)


def heuristic_names() -> list[str]:
    """Every registered heuristic (one placement from the cost model, no budget); ``device:K`` besides."""
    return [name for name, entry in POLICIES.items() if entry.kind == "heuristic"]


def heuristic_choices() -> str:
    """The heuristics as an error message lists them: every registered name, then ``device:K``."""
    return f"{', '.join(heuristic_names())}, device:K"


def is_heuristic(spec: str) -> bool:
    try:
        return policy_entry(spec).kind == "heuristic"
    except PlacerError:
        return False


def heuristic_op_placement(spec: str, problem: PlacementProblem, seed: int = 0) -> np.ndarray:
    """(N,) the named heuristic's op placement for ``problem``'s graph and machine, computed without a real
    run (the heuristics decide from the cost model; the simulator scores the one measurement they make)."""
    from measurers.sim.measurer import SimulatorMeasurer

    _require_heuristic(spec)
    measurer = SimulatorMeasurer(problem.graph, problem.machine)
    return np.asarray(place(spec, problem, measurer, 1, seed).op_placement, dtype=np.int64)


def _require_heuristic(spec: str) -> None:
    entry = policy_entry(spec)
    if entry.kind != "heuristic":
        where = f"placer search --policy {spec}" + ("" if entry.learned else f", or placer baselines --policies {spec}")
        raise PlacerError(f"{spec!r} is a {entry.kind} policy: it needs a budget ({where})")


def place_once(spec: str, graph, machine, measurer: Measurer, seed: int = 0, profile=None) -> PolicyResult:
    """A heuristic's placement of ``graph`` on ``machine`` (on colocation groups, as ``placer baselines``
    runs it), scored once by ``measurer``: what ``placer simulate --policy`` and ``placer measure --policy``
    run. ``profile``: the op times the heuristic plans with (``placer simulate --profile``; else the
    machine's own, as the measurer's). Searches and learned policies need a budget and are refused."""
    from policies.problem import make_problem

    _require_heuristic(spec)
    return place(spec, make_problem(graph, machine, profile=profile), measurer, 1, seed)
