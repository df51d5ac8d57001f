"""interrupts_deferred: the first signal in the block is held and recorded, a second acts as outside it.

Signals are sent with ``signal.raise_signal``: delivered to this thread and handled before it returns."""

from __future__ import annotations

import signal

import pytest

from cluster.jobs.interrupts import interrupts_deferred


def test_interrupts_deferred__the_first_ctrl_c_is_held_a_second_interrupts_and_the_handler_comes_back(capsys):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred("closing the run log") as held:
            signal.raise_signal(signal.SIGINT)
            assert held.pressed  # held: the block went on
            signal.raise_signal(signal.SIGINT)  # as outside the block: KeyboardInterrupt
            raise AssertionError("the second Ctrl-C did not interrupt")
    assert signal.getsignal(signal.SIGINT) is before
    assert "placer: closing the run log; press Ctrl-C again" in capsys.readouterr().err


def test_interrupts_deferred__sigterm_too_when_asked_and_nothing_said_without_a_name(capsys):
    before = signal.getsignal(signal.SIGTERM)
    with interrupts_deferred(signals=(signal.SIGINT, signal.SIGTERM)) as held:
        signal.raise_signal(signal.SIGTERM)
    assert held.pressed and signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err == ""
