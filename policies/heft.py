"""HEFT: heterogeneous earliest finish time (Topcuoglu, Hariri, Wu 2002), with memory limits.

1. Rank every op by its upward rank: its mean time over the devices plus the longest (mean transfer +
   rank) path through its successors. Higher rank first (ties: topological order) is a valid order.
2. Take ops in that order; put each on the device where it would *finish* earliest, using the earliest
   idle slot long enough for it after its inputs arrive (insertion-based).

Unlike ETF, HEFT compares finish times, so a slow CPU is used only when it actually finishes an op first;
it therefore considers every allowed device. Units (groups) stay together: the first op of a unit picks
the device among those where the unit's memory fits, and the rest of the unit follows. Inputs arrive as
the simulator moves them (``policies.listsched.TransferBook``): one transfer per (producer, device), queued
on its link's channel behind the transfers already booked there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.base import DecisionClock, check_budget, finish
from policies.problem import PlacementProblem
from policies.listsched import (FreeSourceTracker, Reservations, TransferBook, bottom_level_s,
                                candidate_devices, mean_times)


@dataclass
class HeftPolicy:
    name: str = "heft"
    memory_model: str = "auto"
    devices: str = "all"  # "all" allowed devices, or "gpus"

    def place(self, problem, measurer, budget, seed, on_measurement=None):
        check_budget(budget)
        clock = DecisionClock()
        device_of, makespan_s, notes = heft_schedule(problem, self.memory_model, self.devices)
        return finish(self.name, problem, None, clock, measurer, on_measurement, op_placement=device_of,
                      notes=f"scheduled makespan {makespan_s:.4g} s; {notes}")


def heft_schedule(problem: PlacementProblem, memory_model: str = "auto",
                  devices: str = "all") -> tuple[np.ndarray, float, str]:
    """(N,) device of every op, the schedule's own makespan, and notes."""
    graph = problem.graph
    cand = candidate_devices(problem, devices)  # (N, D)
    op_mean, edge_mean = mean_times(problem, cand)
    rank = bottom_level_s(problem, op_mean, edge_mean)  # upward rank
    position = np.empty(graph.num_ops, dtype=np.int64)
    position[graph.topo_order] = np.arange(graph.num_ops)
    order = np.lexsort((position, -rank))
    times = np.where(problem.op_allowed, problem.op_time_s, np.inf)  # (N, D)
    reservations = Reservations(problem, cand, memory_model)
    sources = FreeSourceTracker(problem, cand, reservations)
    slots = [DeviceSlots() for _ in range(problem.num_devices)]
    finish_s = np.zeros(graph.num_ops)
    device_of = np.full(graph.num_ops, -1, dtype=np.int64)
    book = TransferBook(problem, finish_s, device_of)
    for op in order[~sources.free[order]]:
        ops = np.array([op])
        mask = reservations.feasible(ops, np.array([sources.pending_bytes(int(op))]))[0]
        if not mask.any():
            mask = reservations.fallback(ops)[0]
        best = (np.inf, np.inf, -1)
        for device in np.flatnonzero(mask).tolist():
            start = slots[device].earliest_start(book.arrival_s(int(op), device), times[op, device])
            best = min(best, (start + times[op, device], start, device))
        end, start, device = best
        sources.follow(int(op), device, finish_s, device_of)  # HEFT asks each arrival once: no invalidate
        ready_s = book.commit(int(op), device)
        if ready_s > start:  # a free input went elsewhere (its unit's device): it has to be sent
            start = slots[device].earliest_start(ready_s, times[op, device])
            end = start + times[op, device]
        slots[device].insert(start, end)
        finish_s[op], device_of[op] = end, device
        reservations.place(int(op), device)
    for op in np.flatnonzero(device_of < 0):  # free sources nobody consumes
        unit_device = reservations.unit_device[problem.op_unit[op]]
        device_of[op] = unit_device if unit_device >= 0 else int(np.argmin(np.where(cand[op], 0, 1)))
        reservations.place(int(op), int(device_of[op]))
    return device_of, float(finish_s.max(initial=0.0)), reservations.notes()


class DeviceSlots:
    """Busy intervals of one device, sorted by start, for insertion-based scheduling."""

    def __init__(self) -> None:
        self.starts = np.zeros(0)  # (K,) float64
        self.ends = np.zeros(0)  # (K,) float64, sorted too: intervals do not overlap

    def earliest_start(self, ready_s: float, duration_s: float) -> float:
        """Earliest start >= ready_s of an idle gap of at least duration_s."""
        i = int(np.searchsorted(self.ends, ready_s, side="right"))  # intervals i.. end after ready_s
        if i == len(self.starts):
            return ready_s
        gap_start = np.maximum(np.concatenate(([ready_s], self.ends[i:-1])), ready_s)  # before interval j
        fits = np.flatnonzero(gap_start + duration_s <= self.starts[i:])
        return float(gap_start[fits[0]]) if len(fits) else max(ready_s, float(self.ends[-1]))

    def insert(self, start_s: float, end_s: float) -> None:
        # a zero-length op goes before, a real one after, the intervals starting at the same time
        i = int(np.searchsorted(self.starts, start_s, side="left" if end_s == start_s else "right"))
        self.starts = np.insert(self.starts, i, start_s)
        self.ends = np.insert(self.ends, i, end_s)
