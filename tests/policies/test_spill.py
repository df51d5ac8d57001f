"""The memory repair the memory-constrained heuristics share (policies/spill.py): a placement the simulator
says overflows has units moved until it fits; one that fits comes back exactly as it was."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import build_graph, training_chain, with_gpu_memory
from graphs.opgraph import ANY_DEVICE, kind_bit
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.machine import Machine
from measurers.sim.measurer import SimulatorMeasurer
from measurers.sim.reference import Simulator
from policies.problem import make_problem
from policies.registry import place
from policies.spill import SpillMove, fit_in_memory, spill

MEMORY_CONSTRAINED = ("m-topo", "m-etf", "m-sct", "heft")


def placed(name: str, graph_name: str, machine: Machine):
    graph = load_graph(graph_name)
    return place(name, make_problem(graph, machine), SimulatorMeasurer(graph, machine), 1, 0)


@pytest.mark.parametrize("name", ("m-topo", "m-etf", "m-sct"))
def test_heuristic__on_300_mb_gpus_comes_back_fitting_and_says_what_it_moved(name):
    """synthetic:300 on paper-2gpu with 300 MB GPUs: the "saved" memory model under-estimates the peak and
    m-ETF's schedule peaked at 373 MB on gpu:1 (m-TOPO 366 MB, m-SCT 380 MB): out of memory."""
    machine = with_gpu_memory(load_machine("paper-2gpu"), 300 * 10**6)
    result = placed(name, "synthetic:300", machine)
    assert result.best.status == "ok", result.notes
    assert max(result.best.peak_bytes[1:]) <= 300 * 10**6
    assert "the simulator's peak overflowed" in result.notes and "fits now" in result.notes
    assert "moved" in result.notes


@pytest.mark.parametrize("name", ("m-etf", "m-sct", "heft"))
def test_list_scheduler__a_repaired_placements_notes_say_the_makespan_is_the_schedules_before_it(name):
    """HEFT wrote "scheduled makespan 9.522 s" on transformer / cpu-igpu, its out-of-memory schedule's, beside
    the repaired placement it returned (9.646 s simulated); where nothing moved the note says nothing more."""
    machine = with_gpu_memory(load_machine("paper-2gpu"), 300 * 10**6)
    repaired = placed(name, "synthetic:300", machine)
    assert "fits now" in repaired.notes and "(the schedule's, before the memory repair moved ops)" in repaired.notes
    untouched = placed(name, "synthetic:300", load_machine("paper-2gpu"))
    assert "scheduled makespan" in untouched.notes and "before the memory repair" not in untouched.notes


@pytest.mark.parametrize("name", ("m-etf", "heft"))
def test_heuristic__transformer_on_cpu_igpu_comes_back_fitting(name):
    """Both overflowed the iGPU's 8 GiB (9.39 / 9.11 GB) before the repair."""
    result = placed(name, "transformer", load_machine("cpu-igpu"))
    assert result.best.status == "ok", result.notes
    assert "fits now" in result.notes


def test_heft__rnnlm_on_cpu_igpu_fits_and_its_notes_say_nothing_moved():
    result = placed("heft", "rnnlm", load_machine("cpu-igpu"))
    assert result.best.status == "ok", result.notes
    assert "overflowed" not in result.notes


@pytest.mark.parametrize("name", MEMORY_CONSTRAINED)
@pytest.mark.parametrize("graph_name,machine_name", [("rnnlm", "paper-2gpu"), ("inception-v3", "paper-4gpu"),
                                                     ("resnet-50-infer", "cpu-igpu")])
def test_heuristic__a_placement_that_fits_comes_back_exactly_as_the_schedule_gave_it(name, graph_name, machine_name):
    """The registry rows the baselines table records fit: the repair must not touch them (nor their notes)."""
    from policies.baechi import EtfScheduler, favourite_children, m_topo_fill
    from policies.heft import chosen_heft_run

    graph, machine = load_graph(graph_name), load_machine(machine_name)
    problem = make_problem(graph, machine)
    result = place(name, problem, SimulatorMeasurer(graph, machine), 1, 0)
    assert result.best.status == "ok"
    if name == "m-topo":
        expected = problem.expand(m_topo_fill(problem).units)
    elif name == "heft":
        expected = chosen_heft_run(problem)[0].device_of
    else:
        scheduler = EtfScheduler(problem)
        if name == "m-sct":
            scheduler.favourite_child = favourite_children(problem, scheduler.cand)
        expected = scheduler.run().device_of
    assert np.array_equal(result.op_placement, expected)
    assert "overflowed" not in result.notes


def test_fit_in_memory__returns_the_very_array_it_was_given_when_it_fits():
    machine = load_machine("paper-2gpu")
    problem = make_problem(load_graph("synthetic:300"), machine)
    placement = np.full(problem.graph.num_ops, 1, dtype=np.int64)
    unit_bytes = np.ones(problem.num_units, dtype=np.int64)
    again, notes = fit_in_memory(problem, placement, unit_bytes, range(problem.num_devices))
    assert again is placement and notes == ""


def test_spill__says_plainly_when_it_cannot_fit():
    """Every device too small for the step: nothing can fit, and the notes say so."""
    base = load_machine("paper-2gpu")
    machine = dataclasses.replace(base, devices=tuple(dataclasses.replace(d, memory_bytes=10**6)
                                                      for d in base.devices))
    problem = make_problem(load_graph("synthetic:300"), machine)
    placement = np.full(problem.graph.num_ops, 1, dtype=np.int64)
    unit_bytes = np.full(problem.num_units, 10**5, dtype=np.int64)
    result = spill(problem, placement, unit_bytes, np.zeros(problem.num_devices), max_moves=5)
    assert not result.fits and len(result.moves) <= 5
    assert "STILL OUT OF MEMORY" in result.notes(problem)


def test_spill__notes_give_bytes_where_megabytes_round_to_zero(make_graph):
    """Devices of 1 byte (a machine file's): the notes read "0.0 MB of 0.0 MB", an overflow of nothing."""
    base = load_machine("paper-2gpu")
    machine = dataclasses.replace(base, devices=tuple(dataclasses.replace(d, memory_bytes=1) for d in base.devices))
    graph = make_graph([(0, 1, 160), (1, 2, 160)], flops=[1e6] * 3, name="tiny-memory")
    problem = make_problem(graph, machine)
    placement = np.full(graph.num_ops, 1, dtype=np.int64)
    notes = spill(problem, placement, np.ones(problem.num_units, dtype=np.int64), np.zeros(problem.num_devices),
                  max_moves=2).notes(problem)
    assert "STILL OUT OF MEMORY" in notes and "of 1 B" in notes and "0.0 MB" not in notes


def test_spill__each_move_lowers_the_overflowing_peak_or_keeps_it():
    machine = with_gpu_memory(load_machine("paper-2gpu"), 300 * 10**6)
    problem = make_problem(load_graph("synthetic:300"), machine)
    placement = np.full(problem.graph.num_ops, 1, dtype=np.int64)  # everything on gpu:0: a 460 MB peak
    unit_bytes = np.bincount(problem.op_unit, weights=problem.graph.param_bytes + problem.graph.out_bytes,
                             minlength=problem.num_units).astype(np.int64)
    result = spill(problem, placement, unit_bytes, np.array([1.0, 0.0, 0.0]))
    assert result.fits and result.moves
    assert all(move.from_device == 1 and move.to_device in (0, 2) for move in result.moves)
    assert len({move.unit for move in result.moves}) == len(result.moves)  # a unit moves once
    moved = np.zeros(problem.num_units, dtype=bool)
    moved[[move.unit for move in result.moves]] = True
    assert np.array_equal(result.op_placement[~moved[problem.op_unit]], placement[~moved[problem.op_unit]])


def test_spill__moves_a_region_when_no_single_group_move_lowers_the_peak():
    """8 activations of 1 MB on gpu:0 of 5 MB: moving any one op leaves each activation held there (by its
    producer's copy or its other backward reader), so no single move frees a byte; moving the holders of the
    first activations together does, and gpu:1 (5 MB, empty) takes them."""
    graph = training_chain(8, 10**6)
    machine = with_gpu_memory(load_machine("paper-2gpu"), 5 * 10**6)
    problem = make_problem(graph, machine)
    placement = np.full(graph.num_ops, 1, dtype=np.int64)
    simulator = Simulator(graph, machine)
    peak_bytes = simulator.run(placement).peak_bytes[1]
    assert peak_bytes == 8 * 10**6
    for unit in range(problem.num_units):  # the premise: no single move lowers gpu:0's peak
        assert simulator.run(np.where(problem.op_unit == unit, 2, placement)).peak_bytes[1] >= peak_bytes
    preference = np.array([np.inf, 0.0, 0.0])  # never the host
    result = spill(problem, placement, graph.out_bytes.astype(np.int64), preference)
    assert result.fits, result.notes(problem)
    assert len(result.regions) == 1 and result.regions[0] == len(result.moves)
    assert all(move.from_device == 1 and move.to_device == 2 for move in result.moves)
    assert "1 region" in result.notes(problem) and "fits now" in result.notes(problem)
    single_only = spill(problem, placement, graph.out_bytes.astype(np.int64), preference, max_regions=0,
                        max_descent_simulations=0)
    assert not single_only.fits and single_only.stop == "no move lowers the peak"
    # the one unit with an estimate fits nowhere; the others were tried too, and the notes say so (they said
    # "no unit fits elsewhere" alone, as if nothing could move)
    one_big = np.zeros(problem.num_units, dtype=np.int64)
    one_big[problem.op_unit[0]] = 10**9
    stuck = spill(problem, placement, one_big, preference, max_regions=0, max_descent_simulations=0)
    assert stuck.stop == "no unit fits elsewhere; of the units of no estimate, no move lowers the peak"


def test_spill__its_last_step_fits_what_only_several_moves_together_fit():
    """A reviewer's 5 ops on paper-2gpu of 1400 / 900 / 600 MB: 10 of the 243 placements fit, and m-TOPO's
    ends 1 MB over on gpu:1, where every single move still overflows; m-TOPO, m-ETF and m-SCT ended out of
    memory. The tabu search of the last step reaches a placement that fits."""
    mb = 10**6
    graph = build_graph([(0, 1, 220 * mb), (1, 2, 170 * mb), (0, 2, 170 * mb), (1, 3, 50 * mb), (2, 4, 200 * mb)], 5,
                        flops=[1e9] * 5, out_bytes=[220 * mb, 170 * mb, 200 * mb, mb, mb],
                        param_bytes=[100 * mb, 100 * mb, 400 * mb, 400 * mb, 400 * mb])
    base = load_machine("paper-2gpu")
    machine = dataclasses.replace(base, devices=tuple(dataclasses.replace(d, memory_bytes=size * mb) for d, size
                                                      in zip(base.devices, (1400, 900, 600))))
    problem, simulator = make_problem(graph, machine), Simulator(graph, machine)
    start = np.array([1, 1, 0, 0, 2])  # m-TOPO's fill
    assert simulator.run(start).status == "oom"
    for op in range(5):  # the premise: no single move fits
        for device in range(3):
            assert simulator.run(np.where(np.arange(5) == op, device, start)).status == "oom"
    without = spill(problem, start, graph.param_bytes, np.zeros(3), max_descent_simulations=0)
    assert not without.fits
    result = spill(problem, start, graph.param_bytes, np.zeros(3))
    assert result.fits and result.stop == "fits" and "fits now" in result.notes(problem)
    assert simulator.run(result.op_placement).status == "ok"
    assert np.array_equal(result.units, problem.collapse(result.op_placement))
    for name in ("m-topo", "m-etf", "m-sct"):
        assert place(name, problem, SimulatorMeasurer(graph, machine), 1, 0).best.ok, name
    never_the_host = spill(problem, start, graph.param_bytes, np.array([np.inf, 0.0, 0.0]))
    assert all(move.to_device != 0 for move in never_the_host.moves)  # infinite preference: no target there either


def test_spill__a_region_leaves_behind_a_holder_that_may_run_nowhere_else():
    """The host (5 MB) holds 8 activations of 1 MB; the first one's producer may run on a CPU only. Every
    region holds that producer, and no GPU could take a region whole: no region moved, and the placement
    stayed out of memory. The producer stays now, the other holders move, and the step fits."""
    mask = np.full(24, ANY_DEVICE, dtype=np.uint8)
    mask[0] = kind_bit("cpu")
    graph = training_chain(8, 10**6, allowed_mask=mask)
    machine = load_machine("paper-2gpu")
    machine = dataclasses.replace(machine, devices=tuple(
        dataclasses.replace(d, memory_bytes=5 * 10**6) if d.kind == "cpu" else d for d in machine.devices))
    problem = make_problem(graph, machine)
    placement = np.zeros(graph.num_ops, dtype=np.int64)  # everything on cpu:0
    result = spill(problem, placement, graph.out_bytes.astype(np.int64), np.array([np.inf, 0.0, 0.0]))
    assert result.fits and len(result.regions) == 1, result.notes(problem)
    assert result.op_placement[0] == 0 and all(move.unit != problem.op_unit[0] for move in result.moves)


def test_spill__a_region_may_move_a_group_that_moved_before():
    """8 inputs of 1 MB read by one op, all on gpu:0 (5 MB). With a shortlist of one the estimate alone picks
    the moves: the reader (4 MB by its estimate) goes to gpu:1, where its 8 received copies peak at 8 MB.
    gpu:1 then holds that one group and overflows; no single move is left there, and a region skipping the
    groups that moved before was empty: the repair stopped out of memory. The region of the reader moves it
    on to the host (the device with the most free memory), and the rest fits."""
    mb = 10**6
    graph = build_graph([(i, 8, mb) for i in range(8)], 9, out_bytes=[mb] * 8 + [0])
    machine = with_gpu_memory(load_machine("paper-2gpu"), 5 * mb)
    problem = make_problem(graph, machine)
    placement = np.full(graph.num_ops, 1, dtype=np.int64)
    unit_bytes = np.ones(problem.num_units, dtype=np.int64)
    reader = int(problem.op_unit[8])
    unit_bytes[reader] = 4 * mb
    result = spill(problem, placement, unit_bytes, np.array([1.0, 0.0, 0.0]), shortlist=1)
    assert result.fits, result.notes(problem)
    assert result.moves[0] == SpillMove(reader, 1, 2)  # the premise: the estimate sent it to gpu:1
    assert SpillMove(reader, 2, 0) in result.moves and result.regions == (1,)
    assert result.op_placement[8] == 0
    assert "moved 4 groups in 5 moves (" in result.notes(problem)  # the reader counted once as a group


def test_spill__a_region_skips_a_return_to_a_placement_the_repair_has_been_at():
    """Group A = {x, j} (GPU only): j reads x (4 MB) and k (1 MB). Group B = {y, k} (any device): k reads y
    (4 MB). A on gpu:0 (4 MB) and B on gpu:1 (6 MB): gpu:0 holds x and k's copy, 5 MB. With a shortlist of
    one, A's estimate (1 MB) sends it to gpu:1, where x, y and k are then live together: 9 MB. No single move
    is left there (B's estimate is 0, A moved). The region of the oldest buffer there is A alone, and the only
    device it may go to is gpu:0: back to the placement the repair started from. That one is skipped and the
    region grows to A and B: the host has the most free memory, A may not run there and stays, B goes, and
    gpu:1 keeps 5 MB. Without the skip, the return's target (gpu:0 at 5 MB again) ended the region's growth
    and the repair stopped at 9 MB of 6."""
    mb, gpu = 10**6, kind_bit("gpu")
    graph = build_graph([(0, 3, 4 * mb), (1, 2, 4 * mb), (2, 3, mb)], 4, out_bytes=[4 * mb, 4 * mb, mb, 0],
                        colocation=[0, 1, 1, 0], allowed_mask=[gpu, ANY_DEVICE, ANY_DEVICE, gpu])  # x, y, k, j
    base = load_machine("paper-2gpu")
    memory_bytes = {"gpu:0": 4 * mb, "gpu:1": 6 * mb}
    machine = dataclasses.replace(base, devices=tuple(
        dataclasses.replace(d, memory_bytes=memory_bytes.get(d.name, d.memory_bytes)) for d in base.devices))
    problem = make_problem(graph, machine)
    group_a, group_b = int(problem.op_unit[0]), int(problem.op_unit[1])
    start = np.array([1, 2, 2, 1], dtype=np.int64)
    simulator = Simulator(graph, machine)
    assert simulator.run(start).peak_bytes.tolist() == [0, 5 * mb, 5 * mb]  # the premise: gpu:0 overflows
    assert simulator.run(np.full(4, 2)).peak_bytes[2] == 9 * mb  # and gpu:1 does once A joins it
    unit_bytes = np.zeros(problem.num_units, dtype=np.int64)
    unit_bytes[group_a] = mb
    result = spill(problem, start, unit_bytes, np.array([1.0, 0.0, 0.0]), shortlist=1)
    assert result.fits, result.notes(problem)
    assert result.moves == (SpillMove(group_a, 1, 2), SpillMove(group_b, 2, 0)) and result.regions == (1,)
    assert result.op_placement.tolist() == [2, 0, 0, 2] and result.peak_bytes[2] == 5 * mb


def test_spill__moves_a_unit_of_no_estimate_when_nothing_else_fits():
    """op6 has no parameters and no output (estimate 0) but holds the 10 MB copy of op2's output it reads on
    gpu:0. HEFT's memory model says its placement fits; the simulator overflows gpu:0, and the repair, which
    never offered a unit of no estimate a move, stopped still out of memory."""
    edges = [(0, 1, 1000), (0, 2, 100000), (0, 4, 300000), (0, 5, 300000), (1, 3, 400000), (1, 6, 1000),
             (2, 3, 300000), (2, 6, 10000000), (3, 4, 4000), (4, 5, 100000)]
    graph = build_graph(edges, 7, flops=[2.18e9, 4.97e9, 0.98e9, 5.13e9, 7.91e9, 9.99e9, 4.76e9],
                        out_bytes=[300000, 400000, 10000000, 4000, 100000, 0, 0],
                        param_bytes=[2000000, 20000000, 0, 0, 2000000, 10000000, 0], allowed_mask=[2] * 7)
    machine = with_gpu_memory(load_machine("paper-2gpu"), 26878409)
    result = place("heft", make_problem(graph, machine), SimulatorMeasurer(graph, machine), 1, 0)
    assert result.best.status == "ok" and "fits now" in result.notes


def test_spill__peaks_are_the_problems_own_op_times_a_profiles():
    """The memory repair simulated with the cost model's op times, not a profile's (``make_problem(profile=)``):
    the order ops run in sets the peaks, so it checked peaks the measurer would not see."""
    graph, machine = load_graph("rnnlm"), load_machine("paper-4gpu")
    problem = make_problem(graph, machine, max_groups=32)
    rng = np.random.default_rng(0)
    profiled = dataclasses.replace(problem, op_time_s=problem.op_time_s * rng.uniform(0.2, 5.0, (graph.num_ops, 1)))
    placement = profiled.expand(profiled.repair_allowed(rng.integers(0, machine.num_devices, problem.num_units)))
    repair = spill(profiled, placement, np.zeros(problem.num_units, dtype=np.int64), np.zeros(machine.num_devices),
                   max_moves=0, max_regions=0, max_descent_simulations=0)
    profile_peaks = Simulator(graph, machine, op_time_s=profiled.op_time_s).run(placement).peak_bytes
    assert np.array_equal(repair.peak_bytes_before, profile_peaks)
    assert not np.array_equal(profile_peaks, Simulator(graph, machine).run(placement).peak_bytes)  # they differ


def test_spill__the_move_freeing_the_most_peak_per_cut_byte_wins():
    """op0 (no parameters, estimate 0) feeds op1 (2 MB of parameters) 1 MB and op2 (3 MB) 3 MB, all on gpu:0
    (4 MB: a 5 MB peak); gpu:1 has 100 MB. Either move fits: op1 frees 2 MB for 1 MB of new cut traffic
    (2 bytes per byte), op2 3 MB for 3 MB (1 per byte). op1 moves and nothing else. op2 moving would mean the
    drop was weighed by the bytes added, not per byte added (the larger cut preferred)."""
    mb = 10**6
    graph = build_graph([(0, 1, mb), (0, 2, 3 * mb)], 3, param_bytes=[0, 2 * mb, 3 * mb], out_bytes=[4, 4, 4])
    base = load_machine("paper-2gpu")
    memory_bytes = {"gpu:0": 4 * mb, "gpu:1": 100 * mb}
    machine = dataclasses.replace(base, devices=tuple(
        dataclasses.replace(d, memory_bytes=memory_bytes.get(d.name, d.memory_bytes)) for d in base.devices))
    problem = make_problem(graph, machine)
    assert problem.op_unit.tolist() == [0, 1, 2]
    start = np.ones(3, dtype=np.int64)
    simulator = Simulator(graph, machine)
    # the premise: 5 MB on gpu:0; moving op1 leaves 3 MB there, moving op2 2 MB, both fitting on gpu:1
    assert simulator.run(start).peak_bytes.tolist() == [0, 5 * mb + 8, 0]
    assert simulator.run(np.array([1, 2, 1])).peak_bytes.tolist() == [0, 3 * mb + 8, 3 * mb + 4]
    assert simulator.run(np.array([1, 1, 2])).peak_bytes.tolist() == [0, 2 * mb + 8, 6 * mb + 4]
    unit_bytes = np.array([0, 2 * mb, 3 * mb], dtype=np.int64)
    result = spill(problem, start, unit_bytes, np.array([np.inf, 0.0, 0.0]))
    assert result.fits and result.stop == "fits"
    assert result.moves == (SpillMove(1, 1, 2),)
    assert result.op_placement.tolist() == [1, 2, 1]
    assert result.peak_bytes.tolist() == [0, 3 * mb + 8, 3 * mb + 4]


@pytest.mark.parametrize("name", ["m-etf", "m-sct"])
def test_spill__the_last_step_never_returns_to_a_placement_it_was_at(name):
    """A reviewer's 5-op graph on a CPU and a GPU, one of its 32 placements fitting: the last step walked a cycle
    of six placements until its 1,024 simulations ran out (the tenure of U // 2 rounds alone let it), and
    m-ETF and m-SCT came back out of memory."""
    import itertools

    from measurers.machine_json import machine_from_json

    graph = build_graph([(0, 1, 10_000), (0, 2, 10_000_000), (0, 3, 1_000_000), (1, 4, 1_000_000)], 5,
                        flops=[1e6, 1e6, 1e6, 1e8, 1e9], bytes_accessed=[0.0] * 5,
                        out_bytes=[50_000_000, 10_000_000, 50_000_000, 1_000_000, 1_000_000],
                        param_bytes=[0, 0, 10_000_000, 0, 0], kinds=["aten.add"] * 5, name="s20")
    device = {"op_overhead_s": 0.0, "compute_efficiency": 1.0, "memory_efficiency": 1.0, "mem_bandwidth_Bps": 1e10}
    machine = machine_from_json({"name": "m20", "devices": [
        {"name": "cpu:0", "model": "Xeon-E5-2699v3", "peak_flops": 1e12, "memory_bytes": 77_183_349, **device},
        {"name": "gpu:1", "model": "K80", "peak_flops": 1e10, "memory_bytes": 60_021_403, **device}], "links": [
        {"src": "cpu:0", "dst": "gpu:1", "bandwidth_Bps": 1e10, "latency_s": 1e-5, "channel": "c01"},
        {"src": "gpu:1", "dst": "cpu:0", "bandwidth_Bps": 1e8, "latency_s": 1e-5, "channel": "c10"}]})
    problem = make_problem(graph, machine)
    simulator = problem.simulator()
    fitting = [units for units in itertools.product(range(2), repeat=5)
               if simulator.run(problem.expand(np.array(units))).status == "ok"]
    assert fitting == [(1, 1, 0, 0, 0)]
    result = place(name, problem, SimulatorMeasurer(graph, machine), 1, 0)
    assert result.best.status == "ok" and "fits now" in result.notes
