"""Moving units off devices whose memory overflows until the simulator's liveness peak fits (``spill``).

The memory-constrained heuristics (m-TOPO, m-ETF, m-SCT, HEFT) place with a per-unit estimate of memory
(``policies.problem.unit_memory_bytes``); the simulator's liveness model is the truth, and the ``saved``
estimate can fall short of it. ``fit_in_memory`` runs after them: a placement the simulator says fits
comes back as it was (the same array); one that overflows has units moved, one at a time (or a region at
once, below), each move re-simulated, until it fits or a bounded number of moves is spent.
``Slot.fastest_device_start`` (policies/rl/gnn) spills its one-device start with the same ``spill`` (single
moves only).

Each move takes the device whose peak is the most over its capacity and, among its units, the one that frees
the most peak per byte of new cut traffic: the units are ranked by cut bytes added per byte of the estimate
(the heuristics' per-unit bytes), simulated ``shortlist`` at a time in that order (at most ``TRIALS``
shortlists), and of the first shortlist holding moves that lower that device's peak, the move with the
largest simulated drop per cut byte added wins (moves adding no cut bytes first, by the drop). Failing that,
the first move that leaves the overflowing device's peak as it was and does not raise its target's (a peak
several units share drops only once several have moved); failing that too, a region moves (below);
failing that, a single move of a unit whose estimate is 0 (no parameters, no output: it may still hold a
large copy it received from another device). A move never raises the overflowing peak nor overflows its
target (with ``shortlist=1`` it is not simulated: its
estimate alone says it fits); a unit that moved is no single move's candidate again (nothing goes back and
forth). A unit goes to the device it may run on where its estimate fits in the free memory (capacity minus
simulated peak), the lowest ``preference`` first, then the one with the most free memory.

When no single move lowers the peak (or the moves are spent), a region moves: the simulator's peak is often
made of many groups' live tensors, and one op-level group at a time frees nearly nothing there (its readers
left behind receive a copy; m-TOPO on nmt-4 / cpu-igpu: 3 GB over, 18 MB freed before no move helped). The
timeline says which buffers are live at the peak moment of the overflowing device
(``measurers.sim.liveness``) and which groups hold each there (its producer and readers on that device); the
holders of the first 1, 2, 4, ... of them (oldest first) move together to the allowed device with the most
free memory (a holder that may not run there stays, and its buffers with it), each size simulated, until one
fits: of those that lower the peak, leave the target fitting and make a placement not seen before in this
repair, the lowest peak wins (at most ``MAX_REGIONS`` regions; then single moves again, while allowed). Only
a placement the single moves leave out of memory reaches this step, so one they fit is unchanged. A holder
that moved before takes part (a group a move put on a device that overflows later may be the one holding
its buffers there); the move counts bound the repair. A region that would return to a placement the
repair has been at is skipped, so the region grows to its next size (a return's target overflows again,
which would have ended the growth).

Last, where all that left the step out of memory and one round of the search below takes at most
``DESCENT_SIMULATIONS`` simulations and ``DESCENT_OP_SIMULATIONS`` simulated ops in all (a few tens of groups
of a graph of a few thousand ops; not where the parameters alone exceed the devices' memory), a tabu search
looks for a placement that fits: each round simulates every one-unit move to every device the unit may run
on and makes the one that leaves the least overflow summed over the devices, even one that adds some, with
the units moved in the last ``U // 2`` rounds held where they are and no move back to a placement it was at
(the tenure alone let a cycle of six placements spend its budget). A fitting placement ends it; without one
the repair's placement stays as the moves above left it. Single moves that must each lower the overflowing
device's peak, and regions of one buffer's holders, can stop where only several moves together reach a
fitting placement: on random graphs of 5-8 ops with tight memory, m-TOPO, m-ETF, m-SCT and HEFT ended out of
memory in 25 of 140 runs that a placement could fit, none with this step (tests/bench/bench_memory_repair_small.py;
BENCHMARKS.md).

Why not the most free memory alone, as a target of single moves: on the paper machines the host's 256 GB
would take every move, and the CPU is 4-5x slower than a GPU; the heuristics prefer the devices their
memory model was fitted to (the GPUs), and only then the host. What it cannot do: make a step fit that
needs more than the devices hold, or free the buffers of holders that may run on no other device; nor, on
graphs of many groups (beyond the last step), reach a fit that only several moves together make. The notes
then say it is still out of memory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from policies.problem import PlacementProblem, parameters_cannot_fit

MAX_MOVES = 256  # single moves fit_in_memory makes at most (each simulates up to SHORTLIST * TRIALS placements)
MAX_REGIONS = 16  # region moves it makes at most, besides (each: a timeline, then log2(live buffers) + 2 at most)
SHORTLIST = 8  # units simulated together per move: the best of them moves
TRIALS = 4  # shortlists a move may try before giving up on lowering the peak
DESCENT_SIMULATIONS = 1024  # placements the last step (_overflow_descent) simulates at most
DESCENT_OP_SIMULATIONS = 4 * 10**6  # and ops simulated in all (about half a second): less on larger graphs


@dataclass(frozen=True)
class SpillMove:
    unit: int
    from_device: int
    to_device: int


@dataclass(frozen=True)
class Spill:
    """What ``spill`` did: the placement after its moves and the simulator's peaks before and after."""

    op_placement: np.ndarray  # (N,) int64 after the moves
    units: np.ndarray  # (U,) int64: each unit's (majority) device after the moves
    moves: tuple[SpillMove, ...]
    peak_bytes_before: np.ndarray  # (D,) int64
    peak_bytes: np.ndarray  # (D,) int64: of ``units``
    capacity_bytes: np.ndarray  # (D,) int64
    stop: str  # "fits", "no unit fits elsewhere", "no move lowers the peak" or "move limit"
    regions: tuple[int, ...] = ()  # units of each region move, among ``moves`` (``_region_move``)

    @property
    def fits(self) -> bool:
        return bool((self.peak_bytes <= self.capacity_bytes).all())

    def notes(self, problem: PlacementProblem) -> str:
        """"" when nothing overflowed; else what overflowed, what moved, and whether it fits now."""
        if not self.moves and self.fits:
            return ""
        names = [d.name for d in problem.machine.devices]
        over = np.flatnonzero(self.peak_bytes_before > self.capacity_bytes)
        text = "the simulator's peak overflowed " + ", ".join(
            f"{names[d]} ({_mb(self.peak_bytes_before[d])} of {_mb(self.capacity_bytes[d])})" for d in over)
        pairs: dict[tuple[int, int], int] = {}
        for move in self.moves:
            key = (move.from_device, move.to_device)
            pairs[key] = pairs.get(key, 0) + 1
        moved = ", ".join(f"{names[a]} -> {names[b]}: {n}" for (a, b), n in pairs.items())
        groups = len({move.unit for move in self.moves})  # a region may move a group a second time
        twice = f" in {len(self.moves)} moves" if len(self.moves) > groups else ""  # the pairs below count moves
        text += f"; moved {groups} groups{twice}" + (f" ({moved})" if moved else "")
        if self.regions:
            many = len(self.regions) > 1
            text += (f", {sum(self.regions)} of them in {len(self.regions)} region{'s' if many else ''} "
                     "(the groups holding the buffers live at the peak)")
        if self.fits:
            return text + "; fits now"
        still = np.flatnonzero(self.peak_bytes > self.capacity_bytes)
        return text + f"; {STILL_OUT_OF_MEMORY} (" + self.stop + "): " + ", ".join(
            f"{names[d]} peaks at {_mb(self.peak_bytes[d])} of {_mb(self.capacity_bytes[d])}" for d in still)


STILL_OUT_OF_MEMORY = "STILL OUT OF MEMORY"  # in a repair's notes when its moves could not make the step fit


def _mb(nbytes) -> str:
    """Megabytes to one decimal; bytes below 0.1 MB (a machine file's 1-byte device read "0.0 MB of 0.0 MB")."""
    nbytes = int(nbytes)
    return f"{nbytes:,} B" if nbytes < 100_000 else f"{nbytes / 1e6:.1f} MB"


def unit_edges(problem: PlacementProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(from unit, to unit, bytes) of every graph edge between two units, in both directions."""
    graph = problem.graph
    src, dst = problem.op_unit[graph.edge_src], problem.op_unit[graph.edge_dst]
    between = src != dst
    src, dst, nbytes = src[between], dst[between], graph.edge_bytes[between].astype(np.float64)
    return np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([nbytes, nbytes])


def spill(problem: PlacementProblem, op_placement: np.ndarray, unit_bytes: np.ndarray, preference: np.ndarray,
          max_moves: int = MAX_MOVES, shortlist: int = SHORTLIST,
          edges: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, max_regions: int = MAX_REGIONS,
          max_descent_simulations: int | None = None) -> Spill:
    """Move units of ``op_placement`` (N,) until every device's simulated peak fits its capacity (module
    docstring); a moved unit's ops all go to its target, the other ops stay where they are.

    ``unit_bytes`` (U,): the memory estimate that ranks units and checks that a target has room;
    ``preference`` (D,): lower first as a target, inf: never one; ``edges``: (from unit, to unit, bytes),
    both directions (default ``unit_edges``). With ``shortlist=1`` the estimate alone picks each move;
    ``max_regions``: region moves at most, once single moves stop (0: single moves only);
    ``max_descent_simulations``: placements the last step may simulate (0: no last step; default
    ``DESCENT_SIMULATIONS``, read when called)."""
    simulator = problem.simulator()  # the problem's op times: a profile's order of ops sets the peaks
    placement = np.array(op_placement, dtype=np.int64)
    units = problem.collapse(placement)
    capacity = problem.capacity_bytes()
    peaks = simulator.run(placement).peak_bytes
    before, moves, stop = peaks.copy(), [], "fits"
    moved = np.zeros(problem.num_units, dtype=bool)
    seen = {_digest(placement)}  # the placements this repair has been at: no region returns to one
    edges = unit_edges(problem) if edges is None else edges
    singles, regions = 0, []
    while (peaks > capacity).any():
        here = int(np.argmax(peaks - capacity))
        stop, best = _single_move(problem, simulator, placement, units, moved, unit_bytes, preference, edges,
                                  peaks, here, shortlist, singles >= max_moves)
        if best is None and len(regions) < max_regions:
            best = _region_move(problem, simulator, placement, seen, preference, peaks, here)
            regions += [] if best is None else [len(best[0])]
        elif best is not None:
            singles += 1
        if best is None:  # last, the units of no estimate: one may hold a copy it received here
            why, best = _single_move(problem, simulator, placement, units, moved, unit_bytes, preference, edges,
                                     peaks, here, shortlist, singles >= max_moves, zero_estimate=True)
            singles += best is not None
            if best is None and why not in (stop, "no unit fits elsewhere"):  # there were some: say why none moved
                stop += f"; of the units of no estimate, {why}"
        if best is None:
            break
        picked, target, peaks = best
        moves += [SpillMove(int(unit), here, target) for unit in picked]
        units[picked], moved[picked] = target, True
        placement[np.isin(problem.op_unit, picked)] = target
        seen.add(_digest(placement))
        stop = "fits"
    fitted = None
    max_descent_simulations = DESCENT_SIMULATIONS if max_descent_simulations is None else max_descent_simulations
    max_descent_simulations = min(max_descent_simulations, DESCENT_OP_SIMULATIONS // max(problem.graph.num_ops, 1))
    if (peaks > capacity).any() and max_descent_simulations > 0 and not parameters_cannot_fit(problem):
        fitted = _overflow_descent(problem, simulator, placement, units, peaks, preference, max_descent_simulations)
    if fitted is not None:
        fitted_units, placement, peaks = fitted
        changed = np.flatnonzero(fitted_units != units)
        moves += [SpillMove(int(unit), int(units[unit]), int(fitted_units[unit])) for unit in changed]
        units, stop = fitted_units, "fits"
    return Spill(placement, units, tuple(moves), before, peaks, capacity, stop, tuple(regions))


def _overflow(peaks: np.ndarray, capacity: np.ndarray) -> int:
    """Bytes of the simulated peaks above capacity, summed over the devices."""
    return int(np.maximum(peaks - capacity, 0).sum())


def _overflow_descent(problem, simulator, placement, units, peaks, preference,
                      max_simulations: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The last step (module docstring): a tabu search over one-unit moves from ``placement`` (N,) and its
    ``units`` (U,). Each round simulates every move of a unit to another device it may run on (of finite
    ``preference``) and makes the one of least summed overflow (of equal overflows, the faster step), even
    one that raises it, where no unit moved in the last ``U // 2`` rounds and to no placement it was at before.
    The first placement that fits comes back: ((U,) units, (N,) op placement, the simulated peaks); None when
    none did before the next round would pass ``max_simulations`` (one round must fit in it: a few tens of
    groups at most)."""
    capacity = problem.capacity_bytes()
    targets = problem.unit_allowed & np.isfinite(preference)  # (U, D)
    options = [(u, d) for u in range(problem.num_units) for d in np.flatnonzero(targets[u]).tolist()]
    tenure = problem.num_units // 2
    current, here = units.copy(), placement.copy()  # (U,), (N,)
    visited = {current.tobytes()}  # a move back to one is no move: the tenure alone let a 6-move cycle repeat
    last_moved = np.full(problem.num_units, -problem.num_units - 1)
    simulated, rounds = 0, 0
    while simulated + len(options) <= max_simulations:
        round_key, pick = None, None
        for unit, device in options:
            if current[unit] == device or rounds - last_moved[unit] <= tenure or _moved_to(current, unit, device) \
                    in visited:
                continue
            result = simulator.run(np.where(problem.op_unit == unit, device, here))
            simulated += 1
            key = (_overflow(result.peak_bytes, capacity), result.runtime_s)
            if round_key is None or key < round_key:
                round_key, pick, after = key, (unit, device), result.peak_bytes
        if pick is None:
            return None
        current[pick[0]], last_moved[pick[0]] = pick[1], rounds
        here[problem.op_unit == pick[0]] = pick[1]
        visited.add(current.tobytes())
        rounds += 1
        if round_key[0] == 0:
            return current, here, after
    return None


def _moved_to(units: np.ndarray, unit: int, device: int) -> bytes:
    """The key of ``units`` (U,) with ``unit`` on ``device``."""
    moved = units.copy()
    moved[unit] = device
    return moved.tobytes()


def _single_move(problem, simulator, placement, units, moved, unit_bytes, preference, edges, peaks, here,
                 shortlist, out_of_moves,
                 zero_estimate: bool = False) -> tuple[str, tuple[np.ndarray, int, np.ndarray] | None]:
    """The best one-unit move off ``here`` (module docstring) among ``_movable``'s units: ("fits", ((1,) the
    unit, its target, the simulated peaks after)), or (why there is none, None)."""
    if out_of_moves:
        return "move limit", None
    candidates, targets = _movable(problem, units, unit_bytes, preference, peaks, here, zero_estimate)
    keep = ~moved[candidates]  # a unit moves once: no unit goes back and forth
    candidates, targets = candidates[keep], targets[keep]
    if not len(candidates):
        return "no unit fits elsewhere", None
    added = _added_cut_bytes(units, edges, candidates, here, targets, problem.num_units, problem.num_devices)
    ranked = np.argsort(added / np.maximum(unit_bytes[candidates], 1), kind="stable")
    ranked = ranked[:max(shortlist, 1) * TRIALS]
    best = _best_move(problem, simulator, placement, candidates[ranked], targets[ranked], added[ranked],
                      peaks, here, max(shortlist, 1))
    if best is None:
        return "no move lowers the peak", None
    pick, after = best
    return "fits", (candidates[ranked[pick]:ranked[pick] + 1], int(targets[ranked[pick]]), after)


def _digest(op_placement: np.ndarray) -> bytes:
    return hashlib.blake2b(op_placement.tobytes(), digest_size=16).digest()


def _region_move(problem, simulator, placement, seen, preference, peaks,
                 here) -> tuple[np.ndarray, int, np.ndarray] | None:
    """((R,) units, their target, the simulated peaks after) or None: the units holding the first buffers
    live at ``here``'s peak, 1, 2, 4, ... of them, moved together to the allowed device with the most free
    memory (those of them that may run there; one that may run on no other device stays); of the regions
    that lower ``here``'s peak, leave the target fitting and lead to a placement whose ``_digest`` is not in
    ``seen``, the lowest peak (the first that fits ``here``; growing stops once the target overflows)."""
    capacity = problem.capacity_bytes()
    first_rank = _holders_by_buffer(problem, simulator, placement, here)  # (U,)
    allowed = problem.unit_allowed & np.isfinite(preference)  # (U, D)
    allowed[:, here] = False
    movable = allowed.any(axis=1)  # (U,) a holder that may run nowhere else keeps its buffers here
    held = first_rank[first_rank < np.iinfo(np.int64).max]
    best, taken = None, 0
    for size in 2 ** np.arange(int(held.max(initial=0)).bit_length() + 1):
        region = np.flatnonzero((first_rank < size) & movable)
        if len(region) == taken:
            continue
        taken = len(region)
        target = int(np.argmax(np.where(allowed[region].any(axis=0), capacity - peaks, -np.inf)))
        region = region[allowed[region, target]]  # the holders that may run there
        trial = np.where(np.isin(problem.op_unit, region), target, placement)
        if _digest(trial) in seen:
            continue
        after = simulator.run(trial).peak_bytes
        if after[target] > capacity[target]:
            break
        if after[here] < peaks[here] and (best is None or after[here] < best[2][here]):
            best = (region, target, after)
        if after[here] <= capacity[here]:
            break
    return best


def _holders_by_buffer(problem, simulator, placement, here) -> np.ndarray:
    """(U,) for each unit on ``here``, the rank of the first buffer live at ``here``'s simulated peak that it
    holds (produces there, or reads there); int64 max for the units holding none. Moving every holder of a
    buffer takes the buffer off ``here``."""
    from measurers.sim.liveness import buffers_on, live_at, peak_moment

    graph = problem.graph
    buffers = buffers_on(graph, simulator.run(placement, timeline=True).timeline, here)
    live = np.flatnonzero(live_at(buffers, peak_moment(buffers)[0]))
    live = live[np.argsort(buffers.alloc_s[live], kind="stable")]
    rank = np.full(graph.num_ops, -1, dtype=np.int64)
    rank[buffers.producer[live]] = np.arange(len(live))
    read_here = (rank[graph.edge_src] >= 0) & (placement[graph.edge_dst] == here)
    produced_here = buffers.producer[live][placement[buffers.producer[live]] == here]
    holder_rank = np.concatenate([rank[graph.edge_src[read_here]], rank[produced_here]])
    holder_op = np.concatenate([graph.edge_dst[read_here], produced_here])
    first_rank = np.full(problem.num_units, np.iinfo(np.int64).max)
    np.minimum.at(first_rank, problem.op_unit[holder_op], holder_rank)
    return first_rank


def _movable(problem, units, unit_bytes, preference, peaks, here,
             zero_estimate: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(K,) units on ``here`` that may go elsewhere, (K,) where each goes: the allowed device of the lowest
    preference, then the most free memory, where its estimate fits. Units of positive estimate only, unless
    none has one; ``zero_estimate``: the others (none where every unit's estimate is 0: they came first)."""
    on_here = np.flatnonzero(units == here)
    positive = unit_bytes[on_here] > 0
    if zero_estimate:
        on_here = on_here[~positive] if positive.any() else on_here[:0]
    elif positive.any():
        on_here = on_here[positive]
    free = problem.capacity_bytes() - peaks  # (D,)
    room = (free[None, :] >= unit_bytes[on_here, None]) & problem.unit_allowed[on_here] & np.isfinite(preference)
    room[:, here] = False
    order = np.lexsort((np.arange(len(free)), -free, preference))  # devices, best target first
    first = np.argmax(room[:, order], axis=1)  # (K,) position in ``order`` of each unit's best target
    fits = room[np.arange(len(on_here)), order[first]]
    return on_here[fits], order[first[fits]]


def _added_cut_bytes(units, edges, candidates, here, targets, num_units, num_devices) -> np.ndarray:
    """(K,) bytes of the edges a move from ``here`` to its target cuts, less those it stops cutting."""
    src, dst, nbytes = edges
    to_device = np.bincount(src * num_devices + units[dst], weights=nbytes,
                            minlength=num_units * num_devices).reshape(num_units, num_devices)  # (U, D)
    return to_device[candidates, here] - to_device[candidates, targets]


def _best_move(problem, simulator, placement, candidates, targets, added, peaks, here,
               shortlist) -> tuple[int, np.ndarray] | None:
    """(index into ``candidates``, the simulated peaks after that move), or None when no move helps.

    The candidates are simulated ``shortlist`` at a time, best estimate first, until a group of them holds
    a move that lowers ``here``'s peak and leaves its target fitting: of those, the largest drop per cut
    byte added (moves adding none first, by the drop). Failing that, the first move that leaves ``here``'s
    peak as it was and does not raise its target's (a peak that several units share drops only when several
    have moved). With a shortlist of
    one, the first candidate, unsimulated beyond its move."""
    capacity = problem.capacity_bytes()
    still = None
    for lo in range(0, len(candidates), shortlist):
        best_key, best = None, None
        for i in range(lo, min(lo + shortlist, len(candidates))):
            target = int(targets[i])
            after = simulator.run(np.where(problem.op_unit == candidates[i], target, placement)).peak_bytes
            if shortlist == 1:
                return i, after
            drop = float(peaks[here] - after[here])
            if after[target] > capacity[target] or drop < 0:
                continue
            if drop == 0:
                still = (i, after) if still is None and after[target] <= peaks[target] else still
                continue
            key = (0, -drop) if added[i] <= 0 else (1, -drop / added[i])
            if best_key is None or key < best_key:
                best_key, best = key, (i, after)
        if best is not None:
            return best
    return still


def fit_units_in_memory(problem: PlacementProblem, units: np.ndarray) -> tuple[np.ndarray, str]:
    """(U,) ``units`` as they are where the simulator's memory model says the step fits, else repaired as the
    memory-constrained heuristics' placements are (``fit_in_memory``: units move whole, to the GPUs first,
    by the heuristics' memory model ``unit_memory_bytes``); with notes ("" when it fitted already). For
    placements from a model that sees parameters only or nothing of memory (the graph-neural placers' one
    shots, ``exact``'s relaxation)."""
    from policies.problem import unit_memory_bytes

    targets = problem.gpu_indices() or list(range(problem.num_devices))
    unit_bytes, _ = unit_memory_bytes(problem, "auto", targets)  # (U,)
    placed, notes = fit_in_memory(problem, problem.expand(units), unit_bytes, targets)
    return (units if not notes else problem.collapse(placed)), notes


def fit_in_memory(problem: PlacementProblem, op_placement: np.ndarray, unit_bytes: np.ndarray,
                  preferred_devices: Sequence[int], max_moves: int = MAX_MOVES) -> tuple[np.ndarray, str]:
    """A heuristic's (N,) op placement made to fit the simulator's memory where moves can, and notes on it
    ("" when it fitted already: then ``op_placement`` itself comes back). Units move whole (their ops are
    on one device); ``preferred_devices``: those the heuristic placed on, tried as targets before the others
    (the GPUs, before the host's memory)."""
    preference = np.ones(problem.num_devices)
    preference[list(preferred_devices)] = 0.0
    result = spill(problem, op_placement, unit_bytes, preference, max_moves)
    return (result.op_placement if result.moves else op_placement), result.notes(problem)
