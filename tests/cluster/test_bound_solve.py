"""cluster/jobs/bound_solve.py: the proven bound's solve in a thread, and Ctrl-C while a search waits for it."""

from __future__ import annotations

import _thread
import threading
import time

import pytest

from cluster.jobs import bound_solve as module


class SlowSolver:
    """Stands in for policies.exact.bound.proven_bound: solves until stopped, then takes ``wind_down_s`` to
    return (as HiGHS does at its next interrupt check)."""

    def __init__(self, wind_down_s: float = 0.5):
        self.wind_down_s, self.returned = wind_down_s, threading.Event()

    def __call__(self, problem, time_limit_s, stop):
        while not stop.wait(0.01):
            pass
        time.sleep(self.wind_down_s)
        self.returned.set()
        return "report"


def test_bound_solve__ctrl_c_while_waiting_stops_the_solver_and_waits_until_it_has_returned(monkeypatch):
    """An interrupted Thread.join marked the solver's thread as ended (Python 3.11): stop() returned at once,
    the process exited with HiGHS still solving, and C++ aborted it (exit 134, once heap corruption)."""
    import policies.exact.bound
    import policies.exact.relaxation

    solver = SlowSolver()
    monkeypatch.setattr(policies.exact.bound, "proven_bound", solver)
    monkeypatch.setattr(policies.exact.relaxation, "silence_highs_banner", lambda: None)
    solve = module.BoundSolve(problem=None, time_limit_s=60.0)
    threading.Timer(0.2, _thread.interrupt_main).start()  # Ctrl-C while report() waits
    with pytest.raises(KeyboardInterrupt):
        solve.report()
    assert solver.returned.is_set() and not solve.finished


def test_bound_solve__a_solve_that_ends_on_its_own_reports_and_is_finished(monkeypatch):
    import policies.exact.bound
    import policies.exact.relaxation

    monkeypatch.setattr(policies.exact.bound, "proven_bound", lambda problem, time_limit_s, stop: "report")
    monkeypatch.setattr(policies.exact.relaxation, "silence_highs_banner", lambda: None)
    solve = module.BoundSolve(problem=None, time_limit_s=1.0)
    assert solve.report() == "report" and solve.finished
