"""The proven bound of a search's groups (policies/exact/bound.py), solved in a thread while the search runs.

The bound's solves (HiGHS's LP and MIP, up to ``--bound-time-limit``, 10 s by default) used to run before Ray
started, so every search, the 64-measurement one on a small model and ``make demo`` alike, waited for them
first (the demo: 15 s of its 36, loading the model included). HiGHS releases the GIL while it solves, so the
search measures meanwhile; it waits for the bound only at its end, for the rest of the time limit. The limit
is the same, so the bound is too, up to what the search's own work leaves HiGHS of the cores (on 2 cores the
demo's came out 0.3836 s, against 0.3839 s solved alone; a MIP cut short by its limit proves less in less CPU
time). A search stopped before the bound is done stops the solve and records no bound: its resume solves it
again; one stopped after records it.

Solves are shared within a process per graph, machine, grouping and time limit (`placer reproduce` runs two
searches of each cell on the same groups): the second waits for the first's.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np


class BoundSolve:
    """``proven_bound(problem, time_limit_s)`` in a thread of its own: ``report()`` waits for it, ``stop()``
    ends it early (its report is then what was proven by then, and it leaves the shared solves)."""

    def __init__(self, problem, time_limit_s: float, key: tuple | None = None):
        from policies.exact.relaxation import silence_highs_banner

        silence_highs_banner()  # here, not in the thread: silencing the banner takes fd 1 from the whole process
        self._stop, self._done, self._key = threading.Event(), threading.Event(), key
        self._report = self._error = None
        self._thread = threading.Thread(target=self._solve, args=(problem, time_limit_s), daemon=True,
                                        name="placer-proven-bound")
        self._thread.start()

    def _solve(self, problem, time_limit_s: float) -> None:
        from policies.exact.bound import proven_bound

        try:
            self._report = proven_bound(problem, time_limit_s, stop=self._stop)
        except BaseException as exc:  # noqa: BLE001 - raised again in the thread that asks for the report
            self._error = exc
        finally:
            self._done.set()

    def _wait(self) -> None:
        """Until the solve has returned. Not ``Thread.join``: one that Ctrl-C interrupts marks the thread as
        ended while HiGHS still solves (Python 3.11), so the next join returned at once, the process exited
        under the running solver, and C++ aborted it (exit 134 after the JSON, once with heap corruption)."""
        while not self._done.wait(0.2):
            pass

    def report(self):
        """The BoundReport, once solved (a Ctrl-C while waiting stops the solve and is raised)."""
        try:
            self._wait()
        except BaseException:
            self.stop()
            raise
        if self._error is not None:
            raise self._error
        return self._report

    @property
    def finished(self) -> bool:
        """Solved to its own end (its time limit or optimality): not running, not stopped early, no error."""
        return self._done.is_set() and not self._stop.is_set() and self._error is None

    def stop(self) -> None:
        """End the solve at HiGHS's next interrupt check and wait for it; a stopped solve is not shared."""
        self._stop.set()
        try:
            self._wait()
        finally:
            if _SOLVES.get(self._key) is self:
                del _SOLVES[self._key]


_SOLVES: dict[tuple, BoundSolve] = {}  # (graph hash, machine, grouping digest, time limit) -> its solve


def bound_solve(problem, time_limit_s: float) -> BoundSolve:
    """The solve of ``problem``'s proven bound within ``time_limit_s``, started now or shared with the one
    this process started already for the same graph, machine, grouping and limit."""
    grouping = hashlib.sha256(np.ascontiguousarray(problem.op_unit, dtype=np.int64).tobytes()).hexdigest()
    key = (problem.graph.content_hash, problem.machine, grouping, float(time_limit_s))
    shared = _SOLVES.get(key)
    if shared is None or shared._error is not None:  # a failed solve is tried again, not its error repeated
        _SOLVES[key] = BoundSolve(problem, time_limit_s, key)
    return _SOLVES[key]


def proven_bound_once(problem, time_limit_s: float):
    """The problem's BoundReport (policies.exact.bound), solved once per graph, machine, grouping and time
    limit in this process, waited for."""
    return bound_solve(problem, time_limit_s).report()
