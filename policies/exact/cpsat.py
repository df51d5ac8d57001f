"""Joint placement and scheduling of the coarse groups with OR-Tools CP-SAT (Moirai's formulation).

Variables: ``x[u, d]`` (group ``u`` on allowed device ``d``, exactly one per group); a start and an end
per piece of a group (policies/exact/quotient.py: a group is one piece when the groups form a DAG), one
optional interval per (piece, allowed device) of the piece's time there, present iff its group is there,
``AddNoOverlap`` per device. A transfer per (producer piece ``a``, destination device ``q``) is present iff
some consumer piece of another group is on ``q`` and ``a`` is not; it has one optional interval per source
device ``p`` (present iff ``a`` is on ``p``) whose size is the simulator's transfer time on link ``p -> q``
(``LinkTable``) of the largest piece edge into a consumer on ``q``, and lies on that link's channel:
``AddNoOverlap`` per channel. A transfer starts after its producer ends; a consumer starts after its
producer ends and, on another device, after the transfer to its device ends. Device memory: the parameter
bytes of the groups on a device fit its capacity (the simulator keeps parameters resident, so this never
cuts a placement that fits; activations are not modelled: the measurer says "oom" for those). Objective:
the makespan. Transfer sizes are per-pair optional intervals (not element constraints): one literal per
source device, which keeps every interval's size a constant where the consumers' edges are alike.

Times are integer ticks (``tick_s``, a power of ten chosen from the instance so the horizon spans 1e7 to
1e8 ticks, fewer where the tick is capped at 1 us); durations are rounded down, so with single-op groups
and ``dispatch=False`` every schedule the simulator can run is feasible in the model (a relaxation): the
proven bound is a lower bound of the simulated step of every placement whose parameters fit. The free
order can also find schedules the simulator's FIFO dispatch will not run, so the model's makespan of a
placement can be below its simulated step. ``dispatch=True`` (policies/exact/dispatch.py) adds the simulator's dispatch rule, so that for
single-op groups the model's makespan of a placement is its simulated step.
"""

from __future__ import annotations

import math
import os
import select
import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from graphs.errors import PlacerError
from measurers.sim.links import LinkTable, link_table
from policies.exact.quotient import QuotientGraph

TICKS_PER_HORIZON = 1e7
MAX_TICK_S = 1e-6
MAX_HORIZON_TICKS = 2.0**53  # ticks a float holds exactly; int64 and CP-SAT's domains hold more (ticks_fit)
LARGE_PIECES = 200  # above this many pieces the presolve does no probing (too slow for what it gains)
STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
          cp_model.MODEL_INVALID: "invalid", cp_model.UNKNOWN: "unknown"}


@dataclass(frozen=True)
class Solution:
    unit_placement: np.ndarray | None  # (U,) int64, None when the solver found none
    makespan_s: float  # the model's makespan of unit_placement (nan when none)
    bound_s: float  # the solver's proven lower bound on the model's makespan
    status: str  # optimal | feasible | infeasible | invalid | unknown
    wall_s: float


@dataclass
class Transfer:
    """The transfer of producer group ``producer`` to device ``dst`` (see the module docstring)."""
    producer: int  # piece
    dst: int
    present: cp_model.IntVar  # bool
    start: cp_model.IntVar
    end: cp_model.IntVar
    consumers: list[int]  # consumer pieces (of other groups) allowed on dst
    edges: list[int]  # their quotient edge indices, aligned with consumers
    by_source: dict[int, tuple] = field(default_factory=dict)  # p -> (present literal, size, per-consumer ticks)


def serial_horizon_s(quotient: QuotientGraph, transfer_s: np.ndarray) -> float:
    """Every piece on its slowest device, one after another, and the slowest transfer for every edge."""
    compute_s = np.where(np.isfinite(quotient.time_s), quotient.time_s, 0.0).max(axis=1).sum()
    return max(float(compute_s + transfer_s.max(initial=0.0) * max(1, quotient.num_edges)), 1e-9)


def choose_tick_s(quotient: QuotientGraph, transfer_s: np.ndarray) -> float:
    """A power of ten, at most MAX_TICK_S, with the serial horizon about TICKS_PER_HORIZON ticks."""
    horizon_s = serial_horizon_s(quotient, transfer_s)
    return min(MAX_TICK_S, 10.0 ** math.floor(math.log10(horizon_s / TICKS_PER_HORIZON)))


def ticks_fit(quotient: QuotientGraph, machine) -> bool:
    """Whether the serial horizon, in ticks of at most MAX_TICK_S, stays within MAX_HORIZON_TICKS: a step of
    years (a hand-made graph's 1e26 FLOPs) overflowed int64 ticks, and CP-SAT called the model invalid."""
    transfer_s = edge_transfer_s(quotient, link_table(machine))
    return _horizon_fits(quotient, transfer_s, choose_tick_s(quotient, transfer_s))


def _horizon_fits(quotient: QuotientGraph, transfer_s: np.ndarray, tick_s: float) -> bool:
    return serial_horizon_s(quotient, transfer_s) / tick_s <= MAX_HORIZON_TICKS


def edge_transfer_s(quotient: QuotientGraph, links: LinkTable) -> np.ndarray:
    """(E, D, D) seconds each quotient edge's transfer takes on each device pair (0 on the diagonal): the
    link table's time of its bytes plus one latency per further producer op."""
    times = links.transfer_matrix_s(quotient.edge_bytes)  # (E, D, D)
    latency = links.transfer_matrix_s(0.0)  # (D, D): an empty transfer takes the link's latency
    return times + (quotient.edge_transfers - 1)[:, None, None] * latency[None, :, :]


def model_size(quotient: QuotientGraph) -> int:
    """Rough count of the model's variables and intervals: the memory the solver needs grows with it."""
    producers = len(np.unique(quotient.edge_src[quotient.cut_edge]))
    d = quotient.num_devices
    return int(quotient.num_groups * d + 3 * quotient.num_pieces * d + 4 * producers * d * d
               + quotient.num_edges * d * 2)


class ExactModel:
    """The CP-SAT model of one quotient graph on one machine; solve it, cut placements, solve again."""

    def __init__(self, quotient: QuotientGraph, machine, capacity_bytes: np.ndarray, dispatch: bool = False):
        self.quotient, self.links = quotient, link_table(machine)
        self.edge_s = edge_transfer_s(quotient, self.links)  # (E, D, D)
        self.tick_s = choose_tick_s(quotient, self.edge_s)
        if not _horizon_fits(quotient, self.edge_s, self.tick_s):
            raise PlacerError(f"exact: the groups' serial step, {serial_horizon_s(quotient, self.edge_s):.3g} s, is "
                              f"more ticks of {self.tick_s:g} s than CP-SAT's model holds (2**53)")
        self.model = cp_model.CpModel()
        self._build(np.asarray(capacity_bytes, dtype=np.int64))
        if dispatch:
            from policies.exact.dispatch import add_dispatch_rule

            add_dispatch_rule(self)

    def ticks(self, seconds) -> np.ndarray:
        """Seconds rounded down to ticks (so the model stays a relaxation), as int64."""
        return np.floor(np.asarray(seconds, dtype=np.float64) / self.tick_s * (1 - 1e-12)).astype(np.int64)

    def _build(self, capacity_bytes: np.ndarray) -> None:
        q, m = self.quotient, self.model
        num_groups, num_devices = q.num_groups, q.num_devices
        piece_ticks = self.ticks(np.where(np.isfinite(q.time_s), q.time_s, 0.0))  # (P, D)
        horizon = int(piece_ticks.max(axis=1).sum() + self.ticks(self.edge_s).max(initial=0) * max(1, q.num_edges)) + 1
        self.horizon = horizon
        self.x: list[dict[int, cp_model.IntVar]] = []  # per group: device -> literal
        for u in range(num_groups):
            xs = {d: m.new_bool_var(f"x{u}_{d}") for d in np.flatnonzero(q.allowed[u]).tolist()}
            m.add_exactly_one(xs.values())
            self.x.append(xs)
        self.px = [self.x[u] for u in q.piece_group.tolist()]  # per piece: its group's literals
        self.start, self.end = [], []
        device_intervals: list[list] = [[] for _ in range(num_devices)]
        for k, xs in enumerate(self.px):
            s, e = m.new_int_var(0, horizon, f"s{k}"), m.new_int_var(0, horizon, f"e{k}")
            m.add(e == s + sum(int(piece_ticks[k, d]) * var for d, var in xs.items()))
            for d, var in xs.items():
                device_intervals[d].append(m.new_optional_interval_var(s, int(piece_ticks[k, d]), e, var, f"g{k}_{d}"))
            self.start.append(s)
            self.end.append(e)
        for intervals in device_intervals:
            m.add_no_overlap(intervals)
        self.makespan = m.new_int_var(0, horizon, "makespan")
        for e in self.end:
            m.add(self.makespan >= e)
        for a, b in zip(q.edge_src.tolist(), q.edge_dst.tolist()):
            m.add(self.start[b] >= self.end[a])
        self._build_transfers(horizon)
        for d in range(num_devices):
            terms = [(int(q.param_bytes[u]), self.x[u][d]) for u in range(num_groups)
                     if d in self.x[u] and q.param_bytes[u] > 0]
            if terms and sum(w for w, _ in terms) > capacity_bytes[d]:
                m.add(sum(w * var for w, var in terms) <= int(capacity_bytes[d]))
        m.minimize(self.makespan)

    def _build_transfers(self, horizon: int) -> None:
        q, m, links = self.quotient, self.model, self.links
        channel_of = links.channel_of  # (D, D)
        channel_intervals: list[list] = [[] for _ in range(links.num_channels)]
        edge_ticks = self.ticks(self.edge_s)  # (E, D, D)
        self.transfers: list[Transfer] = []
        edges_of: dict[int, list[int]] = {}
        for k in np.flatnonzero(q.cut_edge).tolist():
            edges_of.setdefault(int(q.edge_src[k]), []).append(k)
        x = self.px
        for a, edges in edges_of.items():
            sources = list(x[a])
            for dst in range(q.num_devices):
                mine = [k for k in edges if dst in x[int(q.edge_dst[k])]]
                if not mine or sources == [dst]:
                    continue
                consumers = [int(q.edge_dst[k]) for k in mine]
                present = m.new_bool_var(f"y{a}_{dst}")
                here = x[a].get(dst)
                if here is not None:
                    m.add_implication(present, here.negated())
                m.add_bool_or([x[b][dst] for b in consumers]).only_enforce_if(present)
                for b in consumers:
                    m.add_bool_or([x[b][dst].negated(), present] + ([here] if here is not None else []))
                t = Transfer(a, dst, present, m.new_int_var(0, horizon, f"ts{a}_{dst}"),
                             m.new_int_var(0, horizon, f"te{a}_{dst}"), consumers, mine)
                m.add(t.start >= self.end[a])
                m.add(self.makespan >= t.end).only_enforce_if(present)
                elsewhere = [here.negated()] if here is not None else []  # the producer is not on dst
                for b in consumers:
                    m.add(self.start[b] >= t.end).only_enforce_if([x[b][dst]] + elsewhere)
                for p in sources:
                    if p == dst:
                        continue
                    on_p = m.new_bool_var(f"z{a}_{p}_{dst}")
                    m.add_bool_and([x[a][p], present]).only_enforce_if(on_p)
                    m.add_bool_or([x[a][p].negated(), present.negated(), on_p])
                    sizes = [int(edge_ticks[k, p, dst]) for k in mine]
                    if min(sizes) == max(sizes):
                        size = sizes[0]
                    else:
                        size = m.new_int_var(min(sizes), max(sizes), f"sz{a}_{p}_{dst}")
                        for b, need in zip(consumers, sizes):
                            m.add(size >= need).only_enforce_if(x[b][dst])
                    interval = m.new_optional_interval_var(t.start, size, t.end, on_p, f"t{a}_{p}_{dst}")
                    channel_intervals[int(channel_of[p, dst])].append(interval)
                    t.by_source[p] = (on_p, size, sizes)
                self.transfers.append(t)
        for intervals in channel_intervals:
            m.add_no_overlap(intervals)

    def forbid(self, unit_placement: np.ndarray) -> None:
        """A no-good cut: the model may not choose ``unit_placement`` again."""
        self.model.add_bool_or([self.x[u][int(d)].negated() for u, d in enumerate(unit_placement)])

    def solve(self, time_limit_s: float, hints: np.ndarray | None = None, num_workers: int | None = None,
              seed: int = 0, work_limit: float | None = None, stop: threading.Event | None = None) -> Solution:
        """Solve within ``time_limit_s`` (and ``work_limit``, CP-SAT's deterministic time, when given);
        ``hints`` (U,) is a unit placement to start from (the whole schedule is hinted: policies/exact/hint.py).
        ``stop``: once set (by another thread), the search ends with what it has, as at the time limit."""
        self.model.clear_hints()
        if hints is not None:
            from policies.exact.hint import schedule_hint

            for var, value in schedule_hint(self, np.asarray(hints, dtype=np.int64)):
                self.model.add_hint(var, value)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = float(time_limit_s)
        solver.parameters.num_workers = int(num_workers or min(8, os.cpu_count() or 1))
        solver.parameters.random_seed = int(seed)
        if work_limit is not None:
            solver.parameters.max_deterministic_time = float(work_limit)
        if self.quotient.num_pieces > LARGE_PIECES:  # probing alone took 16 s of presolve on rnnlm's 609 pieces
            solver.parameters.cp_model_probing_level = 0
        started = time.perf_counter()
        with _stopped_by_ctrl_c(solver), _stopped_by_event(solver, stop):
            code = solver.solve(self.model)
        wall_s = time.perf_counter() - started
        status = STATUS.get(code, "unknown")
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            bound = math.inf if code == cp_model.INFEASIBLE else solver.best_objective_bound * self.tick_s
            return Solution(None, math.nan, float(bound), status, wall_s)
        placement = np.array([next(d for d, var in xs.items() if solver.boolean_value(var)) for xs in self.x],
                             dtype=np.int64)
        return Solution(placement, solver.objective_value * self.tick_s,
                        solver.best_objective_bound * self.tick_s, status, wall_s)


@contextmanager
def _stopped_by_event(solver: cp_model.CpSolver, stop: threading.Event | None):
    """A thread that stops the search once ``stop`` is set. It asks again until the solve returns: a stop
    asked before CP-SAT has started its search is lost."""
    if stop is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if stop.wait(0.05) and not done.is_set():
                solver.stop_search()
                done.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


@contextmanager
def _stopped_by_ctrl_c(solver: cp_model.CpSolver):
    """Ctrl-C stops the search and is raised as KeyboardInterrupt once ``solve`` returns. CP-SAT's own
    handler stopped it and swallowed the signal: the caller went on with the solution so far as if the time
    limit had come (a search measured it, then ran its bound). Python's handler, which marks the signal, is
    left in place; a thread reading its wakeup file stops the search. Only where Ctrl-C is Python's default;
    elsewhere (a solve in a background thread: the proven bound while a search runs) CP-SAT is still kept off
    SIGINT, whose handler it would leave at the system default when it returns: the next Ctrl-C killed the
    process, with no interrupted result and Ray's workers left running."""
    solver.parameters.catch_sigint_signal = False
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    done = threading.Event()

    def stop_on_a_signal() -> None:
        while not done.is_set():
            if select.select([reader], [], [], 0.1)[0]:
                solver.stop_search()
                return

    watcher = threading.Thread(target=stop_on_a_signal, daemon=True)
    watcher.start()
    try:
        yield  # Python raises KeyboardInterrupt here, as solve returns, when Ctrl-C was pressed
    finally:
        done.set()
        watcher.join()
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
