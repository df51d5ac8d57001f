"""Links fitted to timed copies (`measurers/link_calibration.py`) and the profiler's bracket correction."""

import time

import numpy as np
import pytest

from graphs.errors import PlacerError
from measurers.catalog import load_machine
from measurers.link_calibration import CopyTiming, calibrated_machine, fit_link, time_torch_copies


def _timings(src: str, dst: str, latency_s: float, bandwidth_Bps: float) -> list[CopyTiming]:
    return [CopyTiming(src, dst, size, latency_s + size / bandwidth_Bps) for size in (4096, 1 << 20, 64 << 20)]


def test_fit_link__recovers_latency_and_bandwidth():
    latency_s, bandwidth_Bps = fit_link(_timings("cpu:0", "gpu:0", 22e-6, 9.4e9))
    assert latency_s == pytest.approx(22e-6, rel=1e-6) and bandwidth_Bps == pytest.approx(9.4e9, rel=1e-6)


def test_fit_link__a_negative_latency_is_refitted_through_zero():
    timings = [CopyTiming("a", "b", 1000, 1e-9), CopyTiming("a", "b", 2000, 3e-6)]  # the line crosses below 0
    latency_s, bandwidth_Bps = fit_link(timings)
    assert latency_s == 0.0 and bandwidth_Bps > 0


@pytest.mark.parametrize("timings", [
    [CopyTiming("a", "b", 4096, 1e-5)],  # one copy
    [CopyTiming("a", "b", 4096, 1e-5), CopyTiming("a", "b", 4096, 2e-5)],  # one size
    [CopyTiming("a", "b", 4096, 1e-3), CopyTiming("a", "b", 1 << 20, 1e-5)],  # more bytes, less time
])
def test_fit_link__timings_that_fit_no_link_are_an_error(timings):
    with pytest.raises(PlacerError, match="link fit|no bandwidth"):
        fit_link(timings)


def test_calibrated_machine__replaces_the_timed_links_only():
    machine = load_machine("paper-2gpu")
    first, second = machine.links[0], machine.links[1]
    fitted = calibrated_machine(machine, _timings(first.src, first.dst, 3e-5, 2e9))
    assert fitted.links[0].latency_s == pytest.approx(3e-5) and fitted.links[0].bandwidth_Bps == pytest.approx(2e9)
    assert fitted.links[0].channel == first.channel and fitted.links[1] == second
    assert fitted.links[2:] == machine.links[2:] and fitted.devices == machine.devices
    assert "links measured" in fitted.description
    assert calibrated_machine(machine, []) == machine


def test_calibrated_machine__says_links_measured_once_when_calibrated_again():
    """Profiling again with the machine file it wrote (--machine FILE --machine-out FILE) appended the note
    again each time."""
    machine = load_machine("paper-2gpu")
    first = machine.links[0]
    again = calibrated_machine(calibrated_machine(machine, _timings(first.src, first.dst, 3e-5, 2e9)),
                               _timings(first.src, first.dst, 2e-5, 3e9))
    assert again.description == machine.description + "; links measured"
    assert again.links[0].bandwidth_Bps == pytest.approx(3e9)


def test_time_torch_copies__times_each_size_of_each_link_between_different_torch_devices(monkeypatch):
    import torch

    real_to = torch.Tensor.to

    def to(tensor, device):  # no CUDA here: "meta" stands for a second device (a meta tensor holds no data)
        return torch.empty(tensor.shape, device=device) if tensor.is_meta else real_to(tensor, device)

    monkeypatch.setattr(torch.Tensor, "to", to)
    machine = load_machine("paper-2gpu")  # cpu:0, gpu:0, gpu:1
    sizes = (4096, 1 << 16)
    same = time_torch_copies(machine, ["cpu"] * machine.num_devices, sizes, runs=1, warmup=0)
    assert same == []  # the measurer copies nothing between ends that are one torch device
    found = time_torch_copies(machine, ["cpu", "meta", "cpu"], sizes, runs=1, warmup=0)
    timed_links = {(t.src, t.dst) for t in found}
    expected = {(link.src, link.dst) for link in machine.links if "gpu:0" in (link.src, link.dst)}
    assert timed_links == expected and len(found) == len(expected) * len(sizes)
    assert sorted({t.size_bytes for t in found}) == list(sizes) and all(t.median_s >= 0 for t in found)


def test_profile_torch__takes_the_brackets_own_time_off_each_op():
    """A sync that takes 2 ms (a slow device round trip) is in every bracketed op time; the profile must not
    charge it to the ops (before, each op came out at 2 ms or more)."""
    from graphs.benchmarks.torch_models import build_rnnlm
    from measurers.profiler import empty_bracket_s, profile_torch
    from measurers.torch.measurer import TorchMeasurer

    graph = build_rnnlm(batch_size=2, seq_len=2, hidden=8, vocab=20, layers=1)
    machine = load_machine("local")
    measurer = TorchMeasurer(graph, machine, runs=1, warmup=0)
    measurer.sync = lambda: time.sleep(2e-3)  # the profiler brackets each op with measurer.sync
    assert empty_bracket_s(measurer.sync, samples=5) >= 2e-3
    profile = profile_torch(graph, machine, runs=1, warmup=0, measurer=measurer)
    assert float(np.median(profile.time_s)) < 1e-3 and (profile.time_s >= 0).all()
