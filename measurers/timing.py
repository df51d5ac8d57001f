"""The timing rule every real measurer shares: warm-up runs discarded, then N timed runs, the median.

``time_runs(run_once, settings, sync=..., clock=...)`` calls ``run_once`` ``warmup + runs`` times, each
timed sample bracketed by ``sync()`` (device synchronization, so queued GPU work is counted) and read from
``clock`` (a stub in tests). A measurement that has spent more than ``timeout_s`` in total stops after
the run in progress and reports ``timeout`` (even when that was the last run) (a run cannot be interrupted from inside; the measurer pool
kills an actor that hangs). "In total" counts from ``began`` (the ``clock`` reading when the measurement
started), so its set-up (a Session built, leaves copied to their devices) counts as the pool counts it: the
pool calls ``timeout`` any placement whose whole ``measure_s`` is past the limit.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from measurers.base import Measurement


MAX_NOISE_STD = 10.0  # the simulator's multiplicative noise exp(noise_std * z): far past any real spread,
# and below where a sample overflows to inf or underflows to 0 s (noise_std * |z| > 700) and reads as "ok"


def check_noise_std(noise_std: float, what: str) -> None:
    """One PlacerError naming ``what`` (``noise_std``, ``--noise``) unless 0 <= noise_std <= MAX_NOISE_STD."""
    from graphs.errors import PlacerError

    if not 0 <= noise_std <= MAX_NOISE_STD:  # nan fails too
        raise PlacerError(f"{what} must be a number from 0 to {MAX_NOISE_STD:g}, got {noise_std}")


@dataclass(frozen=True)
class TimingSettings:
    runs: int = 5  # timed runs; the median is reported
    warmup: int = 5  # untimed runs first (allocator, kernels, caches warm up)
    timeout_s: float = 600.0  # limit for the whole measurement of one placement

    def __post_init__(self) -> None:
        from graphs.errors import PlacerError

        if self.runs < 1:
            raise PlacerError(f"runs must be at least 1, got {self.runs}")
        if self.warmup < 0:
            raise PlacerError(f"warmup must not be negative, got {self.warmup}")
        if not self.timeout_s > 0:
            raise PlacerError(f"timeout_s must be positive, got {self.timeout_s}")


ESTIMATOR = "median"  # how a measurement's runtime_s is reduced from its timed samples (median_s below)


REAL_TIMING = TimingSettings()  # real measurers: 5 warm-up runs thrown away, the median of 5 timed runs
SIM_TIMING = TimingSettings(runs=1, warmup=0)  # the simulator is deterministic: one run, nothing to warm up
# OpenVINO inference: one run takes milliseconds next to a compile of seconds, so more samples cost little and
# steady the median; its first inferences allocate buffers, a few warm-ups cover that (kernels are compiled
# with the model, not on first use)
INFERENCE_TIMING = TimingSettings(runs=10, warmup=3)


def default_timing(measurer_kind: str) -> TimingSettings:
    """The timing every command uses for ``measurer_kind`` ("sim", "torch", "tf", "openvino") unless a flag
    says otherwise."""
    return {"sim": SIM_TIMING, "openvino": INFERENCE_TIMING}.get(measurer_kind, REAL_TIMING)


@dataclass(frozen=True)
class Timing:
    samples_s: tuple[float, ...]  # the timed runs, in order
    timed_out: bool

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s) if self.samples_s else math.inf

    def measurement(self, settings: TimingSettings, peak_bytes, began_s: float) -> Measurement:
        """What a real measurer reports for these runs: the median, ``ok``, or ``timeout`` past the limit (no
        step time, as a pool's timeout that ends the actor has none: the runs that finished stay in its samples);
        ``began_s`` is when the measurement started (``time.perf_counter()``)."""
        if self.timed_out:
            return Measurement(math.inf, self.samples_s, "timeout", tuple(peak_bytes), time.perf_counter() - began_s,
                               f"past the time limit of {settings.timeout_s} s")
        return Measurement(self.median_s, self.samples_s, "ok", tuple(peak_bytes), time.perf_counter() - began_s)


def time_runs(run_once: Callable[[], object], settings: TimingSettings, sync: Callable[[], None] = lambda: None,
              clock: Callable[[], float] = time.perf_counter, began: float | None = None) -> Timing:
    """The runs of one measurement; ``began``: its start by ``clock`` (default: now, set-up not counted)."""
    began = clock() if began is None else began
    samples: list[float] = []
    for index in range(settings.warmup + settings.runs):
        sync()
        start = clock()
        run_once()
        sync()
        end = clock()
        if index >= settings.warmup:
            samples.append(end - start)
        if end - began > settings.timeout_s:
            return Timing(tuple(samples), True)
    return Timing(tuple(samples), False)
