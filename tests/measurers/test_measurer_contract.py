"""One contract every measurer keeps (measurers/base.py): the simulator, PyTorch and TensorFlow alike.

Each measurer is built on three devices of this machine (the real ones map them all to the CPU, as their
own tests do) and answers the same placements: one Measurement each, in order; ``ok`` means a finite
runtime that is the median of ``runs`` samples; one peak per device; a bad placement is an ``error``
Measurement, never an exception.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from measurers.base import STATUSES
from measurers.catalog import load_machine
from measurers.machine import Device, Link, Machine

RUNS = 3


def three_cpus() -> Machine:
    devices = tuple(Device(f"cpu:{i}", "cpu", "test-cpu", 1e11, 1e10, 2**30, 1e-6) for i in range(3))
    links = tuple(Link(a.name, b.name, 1e9, 1e-6, f"{a.name}>{b.name}") for a in devices for b in devices if a != b)
    return Machine("three-cpus", devices, links)


def sim_measurer():
    from graphs.registry import load_graph
    from measurers.sim.measurer import SimulatorMeasurer

    graph = load_graph("synthetic:300")
    return graph, SimulatorMeasurer(graph, load_machine("paper-2gpu"), runs=RUNS, noise_std=0.05, seed=3)


def torch_measurer():
    from graphs.benchmarks.torch_models import build_rnnlm
    from measurers.torch.measurer import TorchMeasurer

    graph = build_rnnlm(batch_size=2, seq_len=3, hidden=8, vocab=20, layers=2)
    machine = load_machine("paper-2gpu")
    return graph, TorchMeasurer(graph, machine, runs=RUNS, warmup=1, torch_devices=lambda m: ["cpu"] * m.num_devices)


def tf_measurer():
    pytest.importorskip("tensorflow")
    from graphs.tf.importer import import_keras_spec
    from measurers.tf.measurer import TFMeasurer

    graph = import_keras_spec("tests/fixtures/tiny_models.py:tiny_keras_mlp")
    return graph, TFMeasurer(graph, three_cpus(), runs=RUNS, warmup=1)


@pytest.fixture(scope="module", params=["sim", "torch", "tf"])
def bound(request):
    return {"sim": sim_measurer, "torch": torch_measurer, "tf": tf_measurer}[request.param]()


def split_placement(graph, num_devices: int) -> np.ndarray:
    """Colocation groups dealt over the devices the ops may use (every op may use a CPU here)."""
    placement = graph.colocation_ids % num_devices
    allowed = (graph.allowed_mask[:, None] >> np.arange(8)[None, :]) & 1  # any kind bit
    return np.where(allowed.any(axis=1), placement, 0).astype(np.int64)


def check_ok_or_failed(measurement, num_devices: int) -> None:
    assert measurement.status in STATUSES
    assert len(measurement.peak_bytes) == num_devices
    assert measurement.measure_s >= 0
    if measurement.ok:
        assert len(measurement.samples_s) == RUNS
        assert np.isfinite(measurement.runtime_s) and measurement.runtime_s > 0
        assert measurement.runtime_s == pytest.approx(statistics.median(measurement.samples_s))


def test_measurer_contract__one_measurement_per_placement_in_order(bound):
    graph, measurer = bound
    devices = measurer.machine.num_devices
    one_device = np.zeros(graph.num_ops, dtype=np.int64)
    out_of_range = np.full(graph.num_ops, devices, dtype=np.int64)
    placements = [one_device, split_placement(graph, devices), out_of_range, one_device]
    results = measurer.measure(placements)
    assert len(results) == 4
    for measurement in results:
        check_ok_or_failed(measurement, devices)
    assert [results[0].status, results[2].status, results[3].status] == ["ok", "error", "ok"]  # in order


def test_measurer_contract__bad_placements_are_error_measurements(bound):
    graph, measurer = bound
    devices = measurer.machine.num_devices
    wrong_length = np.zeros(graph.num_ops + 1, dtype=np.int64)
    out_of_range = np.full(graph.num_ops, devices, dtype=np.int64)
    results = measurer.measure([wrong_length, out_of_range])
    assert [m.status for m in results] == ["error", "error"]
    assert all(m.error for m in results)
    assert all(len(m.peak_bytes) == devices for m in results)


def test_measurer_contract__empty_batch_gives_empty_list(bound):
    assert bound[1].measure([]) == []


# -- the same contract through the factory every search uses (MeasurerSpec + build_measurer) -----------------

TINY_TORCH = "tests/fixtures/tiny_models.py:tiny_torch_mlp"
TINY_GRAPHS = {"sim": TINY_TORCH, "torch": TINY_TORCH, "tf": "tests/fixtures/tiny_models.py:tiny_keras_mlp"}


@pytest.fixture(scope="module")
def tiny_graphs():
    """Each tiny graph imported once: {spec: graph}."""
    return {}


def tiny_graph(kind: str, cache: dict):
    spec = TINY_GRAPHS[kind]
    if spec not in cache:
        if kind == "tf":
            pytest.importorskip("tensorflow")
            from graphs.tf.importer import import_keras_spec

            cache[spec] = import_keras_spec(spec)
        else:
            from graphs.torch.importer import import_torch_spec

            cache[spec] = import_torch_spec(spec)
    return cache[spec]


@pytest.mark.parametrize("machine_name", ["local", "three-cpus"])
@pytest.mark.parametrize("kind", ["sim", "torch", "tf"])
def test_measurer_contract__built_from_a_spec_keeps_order_statuses_and_repeats(kind, machine_name, tiny_graphs):
    from measurers.factory import MeasurerSpec, build_measurer

    graph = tiny_graph(kind, tiny_graphs)
    machine = load_machine("local") if machine_name == "local" else three_cpus()
    measurer = build_measurer(MeasurerSpec(kind, graph, machine, runs=RUNS, warmup=1, seed=0))
    devices, n = machine.num_devices, graph.num_ops
    zeros = np.zeros(n, dtype=np.int64)
    last = np.full(n, devices - 1, dtype=np.int64)
    split = split_placement(graph, devices)
    negative = zeros.copy()
    negative[n // 2] = -1
    beyond = zeros.copy()
    beyond[1] = devices
    batch = [zeros, zeros[:-1], split, beyond, negative, last, zeros, split]
    results = measurer.measure(batch)
    assert len(results) == len(batch)
    for measurement in results:
        check_ok_or_failed(measurement, devices)
    # in order: the bad placements are exactly the errors, each with a message naming what is wrong
    assert [m.status for m in results] == ["ok", "error", "ok", "error", "error", "ok", "ok", "ok"]
    assert "shape" in results[1].error
    assert f"device {devices}" in results[3].error and "device -1" in results[4].error
    # the same placement twice: the same status; the simulator (noiseless) also the same runtime
    assert results[0].status == results[6].status and results[2].status == results[7].status
    if kind == "sim":
        assert results[0].runtime_s == results[6].runtime_s and results[2].runtime_s == results[7].runtime_s
        assert results[0].samples_s == (results[0].runtime_s,) * RUNS  # noiseless: every sample the same
    assert measurer.measure([]) == []


@pytest.mark.parametrize("noise_std", [float("nan"), 1e6, -0.1])
def test_measurer_spec__a_noise_that_is_no_small_number_is_refused_where_it_is_made(noise_std):
    """NaN passed (``nan < 0`` is False) and was refused only in each pool actor's constructor, as "no
    measurer actor started"."""
    from graphs.errors import PlacerError
    from graphs.synthetic import synthetic_graph
    from measurers.factory import MeasurerSpec

    with pytest.raises(PlacerError, match="measurer noise_std must be a number from 0 to"):
        MeasurerSpec("sim", synthetic_graph(50, 0), load_machine("paper-2gpu"), noise_std=noise_std)
