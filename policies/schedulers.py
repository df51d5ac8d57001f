"""The list schedulers by name, each with its own scheduled makespan: what the agreement benchmark and
its tests compare with the simulator (issue 16). ``heft-insertion`` is HEFT with the paper's insertion
into idle slots instead of the simulator's first-come-first-served device queues; ``heft-all`` and
``heft-gpus`` are HEFT held to one device set (every device; the GPUs alone), the two schedules ``heft``
chooses between."""

from __future__ import annotations

import numpy as np

from policies.problem import PlacementProblem

HEFT_VARIANTS = {"heft": ("fifo", "best"), "heft-insertion": ("insertion", "best"),  # name: timeline, devices
                 "heft-all": ("fifo", "all"), "heft-gpus": ("fifo", "gpus")}
LIST_SCHEDULERS = ("m-etf", "m-sct", *HEFT_VARIANTS)


def list_schedule(problem: PlacementProblem, name: str) -> tuple[np.ndarray, float]:
    """(N,) device of every op and the scheduler's own makespan (s), on an op-level problem."""
    from graphs.errors import PlacerError
    from policies.baechi import EtfScheduler, favourite_children
    from policies.heft import heft_schedule

    if name not in LIST_SCHEDULERS:
        raise PlacerError(f"unknown list scheduler {name!r} (known: {', '.join(LIST_SCHEDULERS)})")
    if name in HEFT_VARIANTS:
        timeline, devices = HEFT_VARIANTS[name]
        device_of, makespan_s, _ = heft_schedule(problem, devices=devices, timeline=timeline)
        return device_of, makespan_s
    scheduler = EtfScheduler(problem)
    if name == "m-sct":
        scheduler.favourite_child = favourite_children(problem, scheduler.cand)
    scheduler.run()
    return scheduler.device_of, scheduler.makespan_s
