"""A pool of measurer actors, one per GPU node, that is itself a Measurer.

Placements go in with ``submit`` (or ``measure`` for a whole batch in order); results come back as they
finish (``as_completed``, ``poll``, ``gather``). The driver keeps a queue and hands out chunks: cheap
measurements travel many to a call, so Ray's ~1 ms per call is paid once per chunk. At most
``calls_per_actor`` calls wait on an actor; an actor runs them one at a time, in order, so the oldest
unfinished call is the running one: its deadline and its crashes are counted against it. An actor starts
work once its measurer has built its step (a real measurer's capture or trace, never charged to a
placement's deadline); the pool waits ``start_timeout_s`` for its actors, plus one placement's limit for
a real measurer's.

Faults, all handled in the driver:
- an actor dies (its process crashed, it was killed, its node left): the running call's placements are
  measured again one at a time (a single placement that kills ``max_crashes`` actors becomes ``crash``),
  the other calls go back to the front of the queue, and the actor is replaced on the same node while
  the node is alive;
- a call runs past its deadline (``timeout_s`` per placement): the actor is killed (Ray cannot stop a
  running call otherwise), a lone placement becomes ``timeout``, a chunk is split and retried one by one;
  a placement of a chunk that came back in time but took longer than ``timeout_s`` itself (its
  ``measure_s``) becomes ``timeout`` too (a chunk's deadline is ``timeout_s`` times its placements);
- a node joins: every ``node_check_interval_s`` the pool adds actors on new GPU nodes;
- a GPU node leaves for good: its place is retired, and the pool reports the node (``lost_nodes()``, and
  ``on_node_lost`` when given): a search can take that as devices leaving (``--remove-device NAME@node-lost``).
Every placement submitted finishes exactly once: as a measurement, a cache hit or a failure status.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster import ray_setup
from cluster.actors import ActorInfo, ChunkOutcome, error_measurement, remote_actor_class
from cluster.runlog import LoggedPlacement
from graphs.errors import PlacerError
from measurers.base import Measurement
from measurers.factory import MeasurerFactory, MeasurerSpec, SpecFactory, as_factory
from measurers.timing import REAL_TIMING


class MeasurersLost(PlacerError):
    """Every measurer actor is gone (their nodes left the cluster, none to start again) with placements still
    unmeasured: a failure at run time, not bad input, so a search stops and keeps its run folder to resume."""


@dataclass(frozen=True)
class PoolResult:
    ticket: int  # what submit() returned for this placement
    placement: np.ndarray  # (N,) int64: the op placement measured
    measurement: Measurement
    actor_id: str  # the actor that measured it ("" when no actor ran it)
    node_id: str
    submitted_at: float  # wall clock (time.time()) when submit() took it
    started_at: float  # when the actor call carrying it began (the node's clock)
    finished_at: float  # when that call ended; for a cache hit both equal the hit's time
    cache_hit: bool = False
    attempts: int = 1  # actor calls that carried it (more than 1 after faults)
    policy: str = ""  # caller's tags, passed through to the run log
    iteration: int = 0
    log_placement: LoggedPlacement | None = None  # what the log records; None: placement, per op

    @property
    def status(self) -> str:
        return self.measurement.status

    @property
    def runtime_s(self) -> float:
        return self.measurement.runtime_s


@dataclass(frozen=True)
class LostNode:
    """A GPU node whose measurer actor died and that has left the cluster: its place is retired for good."""
    node_id: str
    slot: str  # the place's name, "node:<first 8 hex of the id>"
    num_gpus: int
    seen_at: float  # wall clock (time.time()) when the pool saw it gone
    reason: str  # what the pool saw (the actor's death, or its failed start)


class ResultSink(Protocol):
    def append(self, result: PoolResult) -> None: ...


@dataclass(frozen=True)
class PoolConfig:
    num_cpu_actors: int = 2
    """Actors to start when the cluster has no GPU node (or use_gpus is off)."""
    actor_num_cpus: float = 0.0
    """CPUs each actor reserves from Ray (0 lets measurers share a small machine)."""
    cpu_actor_threads: int = 0
    """OMP_NUM_THREADS of a CPU actor (0: Ray's, 1 for an actor reserving no CPU)."""
    use_gpus: bool = True
    """One actor per GPU node, when the cluster has GPU nodes."""
    hold_gpus: bool = True
    """A GPU node's actor reserves all the node's GPUs (a real measurer runs on them); False: no GPU (the
    simulator uses none, so searches that simulate share the nodes instead of waiting for each other)."""
    node_labels: dict = field(default_factory=dict)
    """Only GPU nodes carrying all these labels host measurers (e.g. {"placer/role": "measurer"})."""
    min_gpus: int = 1
    """Only GPU nodes with at least this many GPUs host measurers (a real measurer: the machine's GPUs)."""
    chunk_size: int = 64
    """Most placements one call carries; a batch is split so every actor gets work."""
    calls_per_actor: int = 2
    """Calls queued on one actor: the next is ready as soon as the running one ends."""
    max_in_flight: int = 0
    """Most placements out at actors at once; 0: actors x calls_per_actor x chunk_size."""
    timeout_s: float | None = None
    """Limit for one placement; None: the spec's timeout_s (REAL_TIMING.timeout_s for a bare factory)."""
    timeout_slack_s: float = 1.0
    """Added once per call to its deadline (call overhead)."""
    max_crashes: int = 2
    """A placement whose measurement kills this many actors is recorded as crash and never retried."""
    max_start_failures: int = 3
    """An actor place whose actor fails to start this many times in a row is given up."""
    node_check_interval_s: float = 10.0
    """How often to look for GPU nodes that joined."""
    poll_interval_s: float = 1.0
    """Longest a wait blocks before the pool checks deadlines and nodes again."""

    def __post_init__(self) -> None:
        for key in ("num_cpu_actors", "chunk_size", "calls_per_actor", "max_crashes", "max_start_failures"):
            if getattr(self, key) < 1:
                raise PlacerError(f"pool setting {key} must be at least 1, got {getattr(self, key)}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise PlacerError(f"pool setting timeout_s must be positive, got {self.timeout_s}")


CUDA_MEASURERS = ("torch", "tf")
"""Real measurers that run the machine's GPUs as Ray's GPUs (NVIDIA): each placement on one node that has them."""
REAL_MEASURERS = (*CUDA_MEASURERS, "openvino")
"""Measurers that time placements for real (openvino: this node's CPU and Intel GPU, which Ray does not count):
one placement per call, and never two timed at once on one node's cores."""


def pool_config_for(spec: MeasurerSpec, workers: int | None = None) -> PoolConfig:
    """The pool a search or a baselines table measures ``spec`` with: the GPU nodes labelled
    ``placer/role=measurer`` when the cluster labels any (ray_config.yaml does), else every GPU node; only a real
    measurer's actors reserve the node's GPUs (the simulator's reserve none, so two searches share). A CUDA
    measurer (torch, tf) runs each placement on one node, one placement per call, so it needs nodes with at
    least the machine's GPUs; without one, CPU actors would fail every placement that uses a GPU, so that
    is one PlacerError, before anything is written. A real measurer without Ray GPUs to run (openvino, or a
    machine without GPUs) times on the CPUs of one actor, alone and with every core as a thread: two actors
    of one thread each timed at once, on the same cores. Needs Ray initialized."""
    gpus, labels = measurer_nodes(spec.kind, spec.machine)
    real = spec.kind in REAL_MEASURERS
    if real and not gpus:  # timed on this node's CPUs: one placement at a time, with all of them
        return PoolConfig(num_cpu_actors=1, cpu_actor_threads=os.cpu_count() or 1, chunk_size=1, use_gpus=False)
    actors = {} if workers is None else {"num_cpu_actors": workers}
    return PoolConfig(chunk_size=1 if real else 64, node_labels=labels, min_gpus=max(gpus, 1), hold_gpus=real,
                      **actors)


def measurer_nodes(kind: str, machine) -> tuple[int, dict[str, str]]:
    """(the GPUs one placement of ``machine`` runs on with measurer ``kind``: 0 but for a CUDA measurer, the
    labels of the nodes the pool measures on); one PlacerError when no node has those GPUs. Needs Ray."""
    gpus = len(machine.indices_of_kind("gpu")) if kind in CUDA_MEASURERS else 0
    labels = ray_setup.MEASURER_LABELS if ray_setup.gpu_nodes(ray_setup.MEASURER_LABELS) else {}
    if gpus and not ray_setup.gpu_nodes(labels, gpus):
        raise PlacerError(f"--measurer {kind} runs machine {machine.name!r}'s {gpus} GPUs on one node, "
                          f"but the Ray cluster has no {'labelled ' if labels else ''}node with {gpus} GPUs "
                          f"(are the GPU workers up? does RAY_ADDRESS name the cluster?)")
    return gpus, labels


@dataclass(eq=False)
class _Job:
    ticket: int
    key: bytes  # placement bytes (int64): the cache key
    placement: np.ndarray  # (N,) int64
    submitted_at: float
    policy: str
    iteration: int
    log_placement: LoggedPlacement | None
    solo: bool = False  # measure alone, on an otherwise idle actor (it was on an actor that died)
    crashes: int = 0
    attempts: int = 0
    followers: list = field(default_factory=list)  # jobs with the same key waiting for this one


@dataclass(eq=False)
class _Call:
    ref: object  # ray.ObjectRef of a ChunkOutcome
    jobs: list
    head_since: float | None = None  # monotonic time it became the actor's running call
    solo: bool = False  # the only call on its actor: if the actor dies, this placement killed it


@dataclass(eq=False)
class _Slot:
    """A place for one actor: a GPU node (pinned) or one of the CPU actors (anywhere)."""
    name: str
    node_id: str | None
    num_gpus: int
    num_cpus: int = 0  # the node's CPUs (a GPU node's actor computes its CPU ops with them)
    handle: object = None
    ready_ref: object = None  # the info() call of an actor that is starting
    info: ActorInfo | None = None
    calls: deque = field(default_factory=deque)
    start_failures: int = 0
    retired: bool = False


@dataclass(frozen=True)
class _CacheEntry:
    measurement: Measurement
    actor_id: str
    node_id: str


def _compact(placements: np.ndarray) -> np.ndarray:
    """(B, N) int64 -> the narrowest integer type holding every value (the actor widens it back): calls up
    to ~100 KB travel inside the call message instead of through the object store."""
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if placements.size == 0 or (placements.min() >= info.min and placements.max() <= info.max):
            return placements.astype(dtype)
    return placements


def _check_log_placements(log_placements: Sequence[LoggedPlacement] | None, num_placements: int) -> None:
    if log_placements is None:
        return
    if len(log_placements) != num_placements:
        raise PlacerError(f"{len(log_placements)} log placements for {num_placements} placements")
    wrong = next((p for p in log_placements if not isinstance(p, LoggedPlacement)), None)
    if wrong is not None:
        raise PlacerError(f"a log placement must be a cluster.runlog.LoggedPlacement (devices and level), "
                          f"got {type(wrong).__name__}")


class MeasurerPool:
    """Measurer actors on a Ray cluster; implements the Measurer protocol. Example::

        with MeasurerPool(MeasurerSpec("sim", graph, machine), PoolConfig(num_cpu_actors=2)) as pool:
            measurements = pool.measure(placements)  # in order
            tickets = pool.submit(more, policy="cem", iteration=3)
            for result in pool.as_completed(tickets):
                print(result.ticket, result.status, result.runtime_s)
    """

    def __init__(self, measurer: MeasurerSpec | MeasurerFactory, config: PoolConfig | None = None, *,
                 run_log: ResultSink | None = None, start_timeout_s: float = 120.0,
                 on_node_lost: Callable[[LostNode], None] | None = None):
        if not ray.is_initialized():
            raise PlacerError("Ray is not running in this process: call cluster.ray_setup.init_ray() first")
        self.config = config or PoolConfig()
        self.run_log = run_log
        self.on_node_lost = on_node_lost  # called once per GPU node that left, when the pool sees it
        self._lost: list[LostNode] = []
        spec = measurer.spec if isinstance(measurer, SpecFactory) else measurer  # (what the jobs pass: as_factory's)
        spec = spec if isinstance(spec, MeasurerSpec) else None
        default_timeout_s = spec.timeout_s if spec is not None else REAL_TIMING.timeout_s
        self.timeout_s = self.config.timeout_s or default_timeout_s
        self._factory_ref = ray.put(as_factory(measurer))
        self._tickets = itertools.count()
        self._queue: deque[_Job] = deque()
        self._leaders: dict[bytes, _Job] = {}
        self._cache: dict[bytes, _CacheEntry] = {}
        self._finished: OrderedDict[int, PoolResult] = OrderedDict()
        self._open: set[int] = set()  # tickets submitted and not yet finished
        self._last_error = ""
        self._closed = False
        self._gpu_mode = self.config.use_gpus and bool(self._gpu_nodes())
        self._slots: list[_Slot] = []
        self._next_node_check = time.monotonic() + self.config.node_check_interval_s
        self._add_slots()
        real = spec is not None and spec.kind in REAL_MEASURERS  # actors build its step first
        self.wait_ready(start_timeout_s + (self.timeout_s if real else 0.0))

    # ---- public API --------------------------------------------------------------------------------

    def submit(self, placements: Sequence[np.ndarray], *, policy: str = "", iteration: int = 0,
               log_placements: Sequence[LoggedPlacement] | None = None, refresh: bool = False) -> list[int]:
        """Queue placements; returns one ticket each. ``log_placements``: what the run log records for
        each (devices and level, group or op); None logs the op placement. ``refresh`` measures again what
        the cache holds (except a crash, which is never retried)."""
        self._check_open()
        _check_log_placements(log_placements, len(placements))
        tickets = []
        now = time.time()
        for i, placement in enumerate(placements):
            array = np.ascontiguousarray(placement, dtype=np.int64)  # (N,)
            if array.ndim != 1:
                raise PlacerError(f"a placement must be a 1-D array of device indices, got shape {array.shape}")
            log_placement = None if log_placements is None else log_placements[i]
            job = _Job(next(self._tickets), array.tobytes(), array, now, policy, iteration, log_placement)
            self._open.add(job.ticket)
            tickets.append(job.ticket)
            self._route(job, refresh)
        self._dispatch()
        return tickets

    def gather(self, tickets: Sequence[int]) -> list[PoolResult]:
        """The results of ``tickets``, in that order, waiting for those not finished yet."""
        wanted = self._check_tickets(tickets)
        while not all(t in self._finished for t in wanted):
            self._pump(self.config.poll_interval_s)
        return [self._finished.pop(t) for t in tickets]

    def as_completed(self, tickets: Sequence[int] | None = None) -> Iterator[PoolResult]:
        """Results as they finish: of ``tickets``, or of everything submitted and not yet collected."""
        wanted = None if tickets is None else self._check_tickets(tickets)
        while True:
            ready = [t for t in self._finished if wanted is None or t in wanted]
            for ticket in ready:
                if wanted is not None:
                    wanted.discard(ticket)
                yield self._finished.pop(ticket)
            left = self._open if wanted is None else wanted
            if not left:
                return
            self._pump(self.config.poll_interval_s)

    def poll(self, timeout_s: float = 0.0) -> list[PoolResult]:
        """Whatever has finished (waiting up to ``timeout_s`` for at least one), in finishing order."""
        deadline = time.monotonic() + timeout_s
        self._pump(0.0)
        while not self._finished and self._open and time.monotonic() < deadline:
            self._pump(min(self.config.poll_interval_s, max(0.0, deadline - time.monotonic())))
        results = list(self._finished.values())
        self._finished.clear()
        return results

    def _check_tickets(self, tickets: Sequence[int]) -> set[int]:
        """The tickets as a set; each must be submitted and not yet collected, and given once (a collected one
        would be waited for forever): else one PlacerError."""
        wanted = set(tickets)
        unknown = wanted - self._open - set(self._finished)
        if unknown:
            raise PlacerError(f"unknown or already collected tickets: {sorted(unknown)[:5]}")
        if len(wanted) != len(tickets):
            repeated = sorted(t for t in wanted if list(tickets).count(t) > 1)
            raise PlacerError(f"tickets given more than once: {repeated[:5]} (each result is collected once)")
        return wanted

    def measure_results(self, placements: Sequence[np.ndarray], **submit_options) -> list[PoolResult]:
        return self.gather(self.submit(placements, **submit_options))

    def measure(self, placements: Sequence[np.ndarray]) -> list[Measurement]:
        """The Measurer protocol: one Measurement per placement, in order."""
        return [r.measurement for r in self.measure_results(placements)]

    @property
    def num_pending(self) -> int:
        """Placements submitted and not yet finished."""
        return len(self._open)

    def lost_nodes(self) -> tuple[LostNode, ...]:
        """GPU nodes that left the cluster during this pool's life, in the order the pool saw them go."""
        return tuple(self._lost)

    @property
    def actors(self) -> list[ActorInfo]:
        """The running actors."""
        return [s.info for s in self._slots if s.info is not None and not s.retired]

    def wait_ready(self, timeout_s: float = 120.0) -> list[ActorInfo]:
        """Wait until every actor has started (or its place was given up); at least one must run."""
        deadline = time.monotonic() + timeout_s
        while any(s.ready_ref is not None for s in self._slots) and time.monotonic() < deadline:
            self._pump(min(self.config.poll_interval_s, max(0.0, deadline - time.monotonic())))
        if not self.actors:
            timed_out = time.monotonic() >= deadline  # else every start was given up (its node left) before it
            lost = {node.node_id for node in self._lost}
            departed = not timed_out and bool(self._slots) and all(slot.node_id in lost for slot in self._slots)
            self.close()
            error = MeasurersLost if departed else PlacerError  # nodes that left: a run-time failure, not bad input
            raise error("no measurer actor started" + (f" within {timeout_s:g} s" if timed_out else "")
                        + (f": {self._last_error}" if self._last_error else self._no_start_hint()))
        return self.actors

    def _no_start_hint(self) -> str:
        if not self._gpu_mode:
            return f" ({len(self._slots)} CPU actor(s); is the cluster short of CPUs? `ray status`)"
        if self.config.hold_gpus:
            return (f" on {len(self._slots)} node(s): each actor takes all of its node's GPUs; does another job "
                    "hold them (`ray status`)?")
        return f" on {len(self._slots)} node(s) (`ray status`)"

    def close(self) -> None:
        """Kill every actor (unfinished placements are dropped) and flush the run log."""
        if self._closed:
            return
        self._closed = True
        for slot in self._slots:
            self._kill(slot)
            slot.retired = True
        if self.run_log is not None and hasattr(self.run_log, "flush"):
            self.run_log.flush()

    def __enter__(self) -> MeasurerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- queue and cache ---------------------------------------------------------------------------

    def _route(self, job: _Job, refresh: bool) -> None:
        entry = self._cache.get(job.key)
        if entry is not None and (not refresh or entry.measurement.status == "crash"):
            now = time.time()
            self._finish(job, entry.measurement, entry.actor_id, entry.node_id, now, now, cache_hit=True)
            return
        leader = self._leaders.get(job.key)
        if leader is not None and not refresh:
            leader.followers.append(job)
            return
        self._leaders.setdefault(job.key, job)
        self._queue.append(job)

    def _finish(self, job: _Job, measurement: Measurement, actor_id: str, node_id: str,
                started_at: float, finished_at: float, cache_hit: bool = False) -> None:
        result = PoolResult(job.ticket, job.placement, measurement, actor_id, node_id, job.submitted_at,
                            started_at, finished_at, cache_hit, job.attempts, job.policy, job.iteration,
                            job.log_placement)
        if self.run_log is not None:
            self.run_log.append(result)
        self._open.discard(job.ticket)
        self._finished[job.ticket] = result
        if cache_hit:
            return
        self._cache[job.key] = _CacheEntry(measurement, actor_id, node_id)
        if self._leaders.get(job.key) is job:
            del self._leaders[job.key]
        for follower in job.followers:
            now = time.time()
            self._finish(follower, measurement, actor_id, node_id, now, now, cache_hit=True)

    def _requeue_front(self, jobs: list[_Job], solo: bool) -> None:
        for job in reversed(jobs):
            job.solo = job.solo or solo
            self._queue.appendleft(job)

    # ---- actors ------------------------------------------------------------------------------------

    def _add_slots(self) -> None:
        if self._gpu_mode:
            taken = {s.node_id for s in self._slots}  # a node that left never comes back under its id
            for node in self._gpu_nodes():
                if node.node_id not in taken:
                    self._slots.append(_Slot(f"node:{node.node_id[:8]}", node.node_id, node.num_gpus,
                                             int(node.num_cpus)))
        elif not self._slots:
            self._slots = [_Slot(f"cpu:{i}", None, 0) for i in range(self.config.num_cpu_actors)]
        for slot in self._slots:
            if slot.handle is None and not slot.retired:
                self._start(slot)

    def _actor_options(self, slot: _Slot) -> dict:
        """A GPU node's actor is pinned to it, holds its GPUs (with ``hold_gpus``), and gets its CPUs as
        threads: with ``num_cpus=0`` Ray would set OMP_NUM_THREADS=1, and a real measurer would run a step's CPU
        ops on one thread of a 32-CPU node."""
        num_gpus = slot.num_gpus if self.config.hold_gpus else 0
        options = {"num_cpus": self.config.actor_num_cpus, "num_gpus": num_gpus}
        if slot.node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(slot.node_id, soft=False)
            options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(max(slot.num_cpus, 1))}}
        elif self.config.cpu_actor_threads:
            options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(self.config.cpu_actor_threads)}}
        return options

    def _gpu_nodes(self) -> list:
        return ray_setup.gpu_nodes(self.config.node_labels, self.config.min_gpus)

    def _start(self, slot: _Slot) -> None:
        slot.handle = remote_actor_class().options(**self._actor_options(slot)).remote(self._factory_ref)
        slot.info = None
        slot.ready_ref = slot.handle.ready.remote()  # after its measurer has built its step

    def _kill(self, slot: _Slot) -> None:
        if slot.handle is not None:
            try:
                ray.kill(slot.handle, no_restart=True)
            except Exception:  # already gone
                pass
        slot.handle, slot.info, slot.ready_ref = None, None, None

    def _replace(self, slot: _Slot) -> None:
        """Kill the slot's actor and start another on the same node, unless the node has left."""
        self._kill(slot)
        if slot.node_id is not None and not ray_setup.node_alive(slot.node_id):
            slot.retired = True
            self._note_lost(slot, self._last_error)
            self._last_error = f"node {slot.node_id[:8]} left the cluster"
            return
        self._start(slot)

    def _retire_departed(self) -> None:
        """Places on GPU nodes that left, noticed without a failed call (an actor given no work since):
        retired, their calls queued again, the node reported."""
        alive = {node.node_id for node in ray_setup.list_nodes(alive_only=True)}
        for slot in self._slots:
            if slot.node_id is None or slot.retired or slot.node_id in alive:
                continue
            calls = list(slot.calls)
            slot.calls.clear()
            self._kill(slot)
            slot.retired = True
            self._note_lost(slot, f"node {slot.node_id[:8]} is no longer alive")
            self._requeue_front([job for call in calls for job in call.jobs], solo=False)

    def _note_lost(self, slot: _Slot, reason: str) -> None:
        """Report a GPU node that left (once): ``lost_nodes()`` and the ``on_node_lost`` callback."""
        if slot.node_id is None or any(lost.node_id == slot.node_id for lost in self._lost):
            return
        lost = LostNode(slot.node_id, slot.name, slot.num_gpus, time.time(), reason)
        self._lost.append(lost)
        if self.on_node_lost is not None:
            self.on_node_lost(lost)

    # ---- the event loop ----------------------------------------------------------------------------

    def _pump(self, timeout_s: float) -> None:
        """Hand out work, wait for one event (or the next deadline), handle everything that is ready."""
        self._check_open()
        self._dispatch()
        refs = self._waitable_refs()
        if not refs:
            self._recover_empty_pool()
            return
        wait_s = min(timeout_s, max(0.0, self._next_deadline() - time.monotonic()))
        ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        for slot in list(self._slots):
            self._handle_ready(slot, ready_set)
        self._expire_deadlines()
        if time.monotonic() >= self._next_node_check and self._gpu_mode:
            self._next_node_check = time.monotonic() + self.config.node_check_interval_s
            self._retire_departed()
            self._add_slots()
        self._dispatch()

    def _waitable_refs(self) -> list:
        refs = []
        for slot in self._slots:
            if slot.ready_ref is not None:
                refs.append(slot.ready_ref)
            refs.extend(call.ref for call in slot.calls)
        return refs

    def _recover_empty_pool(self) -> None:
        if not self._queue:
            return
        if self._gpu_mode:
            self._add_slots()
        if not any(s.handle is not None for s in self._slots):
            raise MeasurersLost(f"no measurer actors left with {len(self._open)} placements unmeasured"
                              + (f" ({self._last_error})" if self._last_error else ""))

    def _dispatch(self) -> None:
        """Hand queued placements to actors, first come first served, within the in-flight bound.

        A solo job goes only to an idle actor and nothing queues behind it, so when that actor dies the
        job is known to be the cause (a finished call's reply can be lost when its process dies next)."""
        ready = [s for s in self._slots if s.info is not None and not s.retired]
        if not ready:
            return
        limit = self.config.max_in_flight or len(ready) * self.config.calls_per_actor * self.config.chunk_size
        in_flight = sum(len(c.jobs) for s in ready for c in s.calls)
        while self._queue and in_flight < limit:
            if self._queue[0].solo:
                slot = next((s for s in ready if not s.calls), None)
                jobs = [self._queue[0]]
            else:
                open_slots = [s for s in ready if len(s.calls) < self.config.calls_per_actor
                              and not any(c.solo for c in s.calls)]
                slot = min(open_slots, key=lambda s: len(s.calls), default=None)
                free_calls = sum(self.config.calls_per_actor - len(s.calls) for s in open_slots)
                jobs = self._take_chunk(free_calls, limit - in_flight)
            if slot is None:
                return
            for _ in jobs:
                self._queue.popleft()
            self._send(slot, jobs, solo=jobs[0].solo)
            in_flight += len(jobs)

    def _take_chunk(self, free_calls: int, room: int) -> list[_Job]:
        """The next call's placements (left in the queue): an even share of the queue over free calls."""
        share = math.ceil(len(self._queue) / max(1, free_calls))
        size = max(1, min(self.config.chunk_size, share, room))
        jobs = []
        for job in self._queue:
            if len(jobs) == size or job.solo:
                break
            jobs.append(job)
        return jobs

    def _send(self, slot: _Slot, jobs: list[_Job], solo: bool) -> None:
        placements = [job.placement for job in jobs]
        if len({len(p) for p in placements}) == 1:
            placements = _compact(np.stack(placements))  # (B, N): one small buffer, inlined in the call
        for job in jobs:
            job.attempts += 1
        head_since = time.monotonic() if not slot.calls else None
        slot.calls.append(_Call(slot.handle.measure.remote(placements), jobs, head_since, solo))

    def _handle_ready(self, slot: _Slot, ready: set) -> None:
        if slot.ready_ref is not None:
            if slot.ready_ref in ready:
                self._actor_started(slot)
            return
        while slot.calls and slot.calls[0].ref in ready:
            call = slot.calls[0]
            try:
                outcome: ChunkOutcome = ray.get(call.ref)
            except ray.exceptions.RayTaskError as exc:  # the call itself failed; the actor lives
                slot.calls.popleft()
                for job in call.jobs:
                    self._finish(job, error_measurement(f"measurer call failed: {exc}"), slot.info.actor_id,
                                 slot.info.node_id, time.time(), time.time())
            except Exception as exc:  # the actor died or its node left
                self._actor_lost(slot, str(exc))
                return
            else:
                slot.calls.popleft()
                for job, measurement in zip(call.jobs, outcome.measurements):
                    if measurement.measure_s > self.timeout_s:  # inside its chunk's deadline, past its own
                        measurement = error_measurement(
                            f"ran {measurement.measure_s:.3g} s, past the {self.timeout_s:g} s limit for one "
                            "placement", measurement.measure_s, status="timeout")
                    self._finish(job, measurement, slot.info.actor_id, slot.info.node_id,
                                 outcome.started_at, outcome.finished_at)
                slot.start_failures = 0
            if slot.calls:
                slot.calls[0].head_since = time.monotonic()

    def _actor_started(self, slot: _Slot) -> None:
        try:
            slot.info = ray.get(slot.ready_ref)
            slot.ready_ref = None
        except Exception as exc:
            self._last_error = f"measurer actor on {slot.name} failed to start: {exc}"
            slot.start_failures += 1
            init_failed = getattr(exc, "actor_init_failed", False)  # its constructor raised: it will again
            if init_failed or slot.start_failures >= self.config.max_start_failures:
                self._kill(slot)
                slot.retired = True
                if slot.node_id is not None and not ray_setup.node_alive(slot.node_id):
                    self._note_lost(slot, self._last_error)  # it left while its actor was starting
            else:
                self._replace(slot)

    def _actor_lost(self, slot: _Slot, reason: str) -> None:
        """The slot's actor died. A solo call is to blame; otherwise its placements go again, alone."""
        calls = list(slot.calls)
        slot.calls.clear()
        info = slot.info
        self._last_error = f"measurer actor on {slot.name} died: {reason.splitlines()[0] if reason else ''}"
        self._replace(slot)
        if slot.retired or not calls[0].solo:  # the node left (nobody's fault), or the culprit is unknown
            self._requeue_front([j for c in calls for j in c.jobs], solo=not slot.retired)
            return
        (job,) = calls[0].jobs
        job.crashes += 1
        if job.crashes >= self.config.max_crashes:
            message = f"the measurement killed {job.crashes} actors; last: {reason[:500]}"
            self._finish(job, error_measurement(message, status="crash"), info.actor_id, info.node_id,
                         time.time(), time.time())
        else:
            self._requeue_front([job], solo=True)

    def _deadline(self, call: _Call) -> float:
        return call.head_since + self.timeout_s * len(call.jobs) + self.config.timeout_slack_s

    def _next_deadline(self) -> float:
        heads = [s.calls[0] for s in self._slots if s.calls and s.calls[0].head_since is not None]
        return min((self._deadline(c) for c in heads), default=math.inf)

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for slot in list(self._slots):
            if not slot.calls or slot.calls[0].head_since is None or now < self._deadline(slot.calls[0]):
                continue
            calls = list(slot.calls)
            slot.calls.clear()
            info = slot.info
            self._replace(slot)
            self._requeue_front([j for c in calls[1:] for j in c.jobs], solo=False)
            head = calls[0]
            if len(head.jobs) > 1:
                self._requeue_front(head.jobs, solo=True)
                continue
            elapsed_s = now - head.head_since
            message = f"no result within {self.timeout_s:g} s; the actor was killed"
            self._finish(head.jobs[0], error_measurement(message, elapsed_s, status="timeout"),
                         info.actor_id, info.node_id, time.time() - elapsed_s, time.time())

    def _check_open(self) -> None:
        if self._closed:
            raise PlacerError("the measurer pool is closed")
