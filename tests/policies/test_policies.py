"""Every baseline policy: valid placements, allowed kinds, units kept together, memory, budgets, seeds."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.errors import PlacerError
from graphs.opgraph import kind_bit
from graphs.synthetic import synthetic_graph
from measurers.catalog import load_machine
from measurers.sim.lower_bound import lower_bound_from_times
from policies.problem import PlacementProblem
from policies.registry import baseline_names, make_policy
from conftest import build_graph, with_gpu_memory

SEARCHES = ("random", "cem", "annealing")
NON_EXPERT = tuple(p for p in baseline_names() if p != "expert")
MEMORY_AWARE = ("m-topo", "m-etf", "m-sct", "heft", "random", "cem", "annealing")


class SimMeasurer:
    """SimulatorMeasurer, recording the size of every batch it is asked to measure."""

    def __init__(self, graph, machine):
        from measurers.sim.measurer import SimulatorMeasurer

        self.inner = SimulatorMeasurer(graph, machine)
        self.batches: list[int] = []

    def measure(self, placements):
        self.batches.append(len(placements))
        return self.inner.measure(placements)


def problem_for(graph, machine, op_unit=None) -> PlacementProblem:
    from measurers.sim.costs import op_time_matrix

    times = op_time_matrix(graph, machine)
    if op_unit is None:
        op_unit = np.unique(graph.colocation, return_inverse=True)[1].reshape(-1)
    return PlacementProblem(graph, machine, np.asarray(op_unit, dtype=np.int64), times,
                            lower_bound_from_times(graph, times, machine.num_devices))


@pytest.fixture(scope="module")
def machine():
    return load_machine("paper-2gpu")


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(120, seed=3)


def cpu_only_graph():
    """A chain with a CPU-only op in the middle and two colocated ops."""
    cpu = kind_bit("cpu")
    allowed = [3, 3, cpu, 3, 3, 3]
    return build_graph([(0, 1, 10**6), (1, 2, 10**6), (2, 3, 10**6), (3, 4, 10**6), (0, 5, 10**6), (5, 4, 10**6)],
                       flops=[1e9] * 6, allowed_mask=allowed, colocation=[0, 1, 2, 3, 4, 1], out_bytes=[10**6] * 6)


@pytest.mark.parametrize("name", NON_EXPERT)
def test_policy__places_every_op_on_an_allowed_device_and_keeps_units_together(name, machine):
    graph = cpu_only_graph()
    problem = problem_for(graph, machine)
    measurer = SimMeasurer(graph, machine)
    result = make_policy(name).place(problem, measurer, 20, seed=1)
    placement = result.op_placement
    assert placement.shape == (graph.num_ops,) and placement.dtype == np.int64
    assert problem.op_allowed[np.arange(graph.num_ops), placement].all()
    assert placement[2] == machine.device_index("cpu:0")
    assert placement[1] == placement[5]  # colocated
    assert 1 <= result.measurements <= 20
    assert result.placement_time_s >= 0 and result.measure_time_s >= 0
    assert result.best.runtime_s > 0


@pytest.mark.parametrize("name", SEARCHES)
def test_search__spends_exactly_its_budget_in_batches_and_reports_each_measurement(name, graph, machine):
    problem = problem_for(graph, machine)
    measurer = SimMeasurer(graph, machine)
    seen = []
    result = make_policy(name).place(problem, measurer, 70, seed=0, on_measurement=lambda p, m: seen.append(m))
    assert result.measurements == sum(measurer.batches) == len(seen) == 70
    assert max(measurer.batches) > 1
    assert min(m.runtime_s for m in seen if m.ok) == pytest.approx(result.best.runtime_s)
    assert result.stop_reason == "budget"


@pytest.mark.parametrize("name", SEARCHES)
def test_search__one_that_runs_out_of_new_placements_says_it_converged(name, machine):
    graph = cpu_only_graph()  # 5 units on 3 devices, 1 pinned to the CPU: 81 placements in all
    problem = problem_for(graph, machine)
    result = make_policy(name).place(problem, SimMeasurer(graph, machine), 1000, seed=0)
    assert result.measurements <= 81 and result.stop_reason == "converged"


@pytest.mark.parametrize("name", SEARCHES)
def test_search__with_nothing_to_move_measures_the_one_placement_and_says_it_converged(name, machine):
    cpu = kind_bit("cpu")
    graph = build_graph([(0, 1, 10**6), (1, 2, 10**6)], flops=[1e9] * 3, allowed_mask=[cpu] * 3,
                        out_bytes=[10**6] * 3)
    result = make_policy(name).place(problem_for(graph, machine), SimMeasurer(graph, machine), 100, seed=0)
    assert result.measurements == 1 and result.stop_reason == "converged"
    assert (result.op_placement == machine.device_index("cpu:0")).all()


@pytest.mark.parametrize("name", SEARCHES)
def test_search__stops_between_batches_when_its_context_says_so(name, graph, machine):
    """`placer search --time-limit` reached only the learners: annealing at --budget 3000 --time-limit 2 ran
    11 s and said "converged". A search checks its RunContext between batches, as a learner does, and before
    its first: with no time left, annealing measured its starts all the same."""
    from policies.base import RunContext

    problem, asked = problem_for(graph, machine), []
    measurer = SimMeasurer(graph, machine)
    context = RunContext(should_stop=lambda: asked.append(True) or len(asked) > 2)
    result = make_policy(name, context=context).place(problem, measurer, 500, seed=0)
    assert result.stop_reason == "should_stop" and result.measurements == sum(measurer.batches)
    assert len(measurer.batches) == 2  # annealing's first: its starts
    timed = make_policy(name, context=RunContext(time_limit_s=1e-9)).place(problem, SimMeasurer(graph, machine),
                                                                            500, seed=0)
    assert timed.stop_reason == "time_limit" and timed.measurements == 0


@pytest.mark.parametrize("name", SEARCHES)
def test_search__same_seed_same_answer_other_seed_other_path(name, graph, machine):
    problem = problem_for(graph, machine)
    first = make_policy(name).place(problem, SimMeasurer(graph, machine), 40, seed=5)
    again = make_policy(name).place(problem, SimMeasurer(graph, machine), 40, seed=5)
    assert np.array_equal(first.op_placement, again.op_placement)
    assert first.best.runtime_s == again.best.runtime_s


def test_single_gpu__reports_oom_not_an_exception_when_the_model_does_not_fit(graph, machine):
    small = with_gpu_memory(machine, graph.total_param_bytes // 3)
    result = make_policy("single-gpu").place(problem_for(graph, small), SimMeasurer(graph, small), 1, seed=0)
    assert result.best.status == "oom"
    assert set(result.op_placement.tolist()) <= {small.device_index("gpu:0"), small.device_index("cpu:0")}


def parameter_heavy_graph(layers: int = 12, param_bytes: int = 10**9):
    """A chain of matmuls, each with its own 1 GB parameter (a Variable feeding it): memory is parameters."""
    edges = [(i, i + 1, 10**6) for i in range(layers - 1)] + [(layers + i, i, 4) for i in range(layers)]
    return build_graph(edges, flops=[1e10] * layers + [0.0] * layers, out_bytes=[10**6] * layers + [0] * layers,
                       param_bytes=[0] * layers + [param_bytes] * layers,
                       kinds=["aten.mm"] * layers + ["Variable"] * layers, name="params")


@pytest.mark.parametrize("name", MEMORY_AWARE)
def test_memory_aware_policy__fits_when_one_gpu_is_too_small_but_two_are_enough(name, machine):
    graph = parameter_heavy_graph()  # 12 GB of parameters
    small = with_gpu_memory(machine, 8 * 10**9)  # one GPU overflows, two fit
    problem = problem_for(graph, small)
    measurer = SimMeasurer(graph, small)
    assert measurer.measure([np.full(graph.num_ops, 1)])[0].status == "oom"
    result = make_policy(name).place(problem, measurer, 300, seed=0)
    assert result.best.status == "ok", result.notes
    assert max(result.best.peak_bytes) <= 8 * 10**9


def test_m_etf__a_cpu_only_op_does_not_make_the_gpus_take_the_memory_model_only_the_cpu_could_hold(machine):
    from policies.baechi import EtfScheduler

    # 6 x 100 MB outputs (conservative: 600 MB) on two 200 MB GPUs; one op may only run on the CPU (256 GB)
    cpu = kind_bit("cpu")
    graph = build_graph([(i, i + 1, 10**6) for i in range(5)], flops=[1e9] * 6, out_bytes=[10**8] * 6,
                        allowed_mask=[3, 3, cpu, 3, 3, 3])
    problem = problem_for(graph, with_gpu_memory(machine, 2 * 10**8))
    reservations = EtfScheduler(problem).run().reservations
    assert reservations.model_used.startswith("saved") and reservations.overflowed == 0


def test_round_robin__deals_units_to_gpus_in_topological_order(machine):
    graph = build_graph([(0, 1), (1, 2), (2, 3)])
    result = make_policy("round-robin").place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)
    assert result.op_placement.tolist() == [1, 2, 1, 2]


def test_cpu_only_and_device_k__put_everything_on_that_device(graph, machine):
    problem, measurer = problem_for(graph, machine), SimMeasurer(graph, machine)
    assert set(make_policy("cpu-only").place(problem, measurer, 1, 0).op_placement) == {0}
    assert set(make_policy("device:2").place(problem, measurer, 1, 0).op_placement) == {2}


def test_make_policy__unknown_name_and_bad_device_are_errors():
    with pytest.raises(PlacerError, match="unknown policy 'nope'"):
        make_policy("nope")
    with pytest.raises(PlacerError, match="device:K"):
        make_policy("device:x")


def test_m_topo__fills_gpus_in_topological_order(machine):
    graph = build_graph([(i, i + 1) for i in range(7)], param_bytes=[10**9] * 8, out_bytes=[0] * 8)
    result = make_policy("m-topo").place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)
    assert result.op_placement.tolist() == [1] * 5 + [2] * 3  # share 4 GB + largest 1 GB per GPU


def test_m_sct__a_chain_keeps_every_child_favourite_and_stays_on_one_gpu(machine):
    from policies.baechi import favourite_children
    from policies.listsched import candidate_devices

    graph = build_graph([(i, i + 1, 10**8) for i in range(5)], flops=[1e9] * 6)
    problem = problem_for(graph, machine)
    assert favourite_children(problem, candidate_devices(problem, "gpus")).tolist() == [1, 2, 3, 4, 5, -1]
    result = make_policy("m-sct").place(problem, SimMeasurer(graph, machine), 1, 0)
    assert len(set(result.op_placement.tolist())) == 1


def test_m_etf__spreads_independent_branches_over_the_gpus(machine):
    graph = build_graph([(0, 1, 4), (0, 2, 4), (1, 3, 4), (2, 3, 4)], flops=[1e6, 1e11, 1e11, 1e6])
    result = make_policy("m-etf").place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)
    assert {result.op_placement[1], result.op_placement[2]} == {1, 2}


def test_heft__insertion_finds_the_earliest_gap_long_enough():
    from policies.heft import DeviceSlots

    slots = DeviceSlots()
    for start, end in ((0.0, 1.0), (2.0, 3.0), (3.5, 5.0)):
        slots.insert(start, end)
    assert slots.earliest_start(0.5, 0.8) == 1.0
    assert slots.earliest_start(0.5, 1.2) == 5.0
    assert slots.earliest_start(3.0, 0.5) == 3.0
    assert slots.earliest_start(6.0, 9.0) == 6.0


def test_metis__balances_two_heavy_independent_chains_over_two_gpus(machine):
    graph = build_graph([(0, 1, 10**8), (2, 3, 10**8)], flops=[1e11] * 4)
    result = make_policy("metis").place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)
    p = result.op_placement
    assert p[0] == p[1] and p[2] == p[3] and p[0] != p[2]


def test_expert__no_rule_for_a_graph_the_papers_do_not_describe(graph, machine):
    with pytest.raises(PlacerError, match="no expert rule for graph"):
        make_policy("expert").place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)


def test_expert__nmt_spreads_layers_and_puts_attention_and_softmax_on_the_last_gpu():
    machine = load_machine("paper-4gpu")
    scopes = ["encoder.embed", "encoder.layer0", "encoder.layer1.cell", "decoder.embed", "decoder.layer0",
              "decoder.layer1", "attention", "softmax", "", "encoder.layer0"]
    edges = [(0, 1), (1, 2), (2, 6), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (9, 1)]
    graph = build_graph(edges, scopes=np.array(scopes, dtype=object), name="nmt-2", kinds=["aten.mm"] * 10)
    result = make_policy("expert").place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)
    gpu = [machine.device_index(f"gpu:{i}") for i in range(4)]
    assert result.op_placement.tolist() == [gpu[0], gpu[0], gpu[1], gpu[0], gpu[0], gpu[1], gpu[3], gpu[3],
                                            gpu[3], gpu[0]]


def test_expert__rnnlm_puts_one_lstm_layer_per_gpu(machine):
    scopes = ["embed", "lstm.layer0", "lstm.layer1", "softmax"]
    graph = build_graph([(0, 1), (1, 2), (2, 3)], scopes=np.array(scopes, dtype=object), name="rnnlm")
    result = make_policy("expert").place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)
    assert result.op_placement.tolist() == [1, 1, 2, 2]


@pytest.mark.slow
def test_baselines_on_nmt2__single_gpu_fits_as_the_memory_model_says_and_feasible_policies_ranked():
    """The heuristics' memory model (``unit_memory_bytes``, what m-TOPO/m-ETF/HEFT reserve) and the measured
    step agree on one GPU: nmt-2 (8.2 GB at its peak) fits a 12 GB K80."""
    from graphs.registry import load_graph
    from policies.problem import make_problem, unit_memory_bytes
    from policies.table import run_baselines

    graph = load_graph("nmt-2")
    machine = load_machine("paper-2gpu")
    problem = make_problem(graph, machine, max_groups=64)
    gpu0 = machine.device_index("gpu:0")
    unit_bytes, _ = unit_memory_bytes(problem, "auto", [gpu0])
    assert unit_bytes.sum() <= problem.usable_bytes()[gpu0], "the memory model says one GPU cannot hold nmt-2"
    table = run_baselines(problem, SimMeasurer(graph, machine), ["single-gpu", "expert", "m-etf", "m-topo", "cem"],
                          budget=40, seed=0)
    rows = {row.policy: row for row in table.rows}
    assert rows["single-gpu"].status == "ok"
    feasible = sorted((r.runtime_s, r.policy) for r in table.rows if r.status == "ok")
    assert feasible, "no policy found a placement that fits"
    assert all(t >= table.lower_bound_s * (1 - 1e-9) for t, _ in feasible)


@pytest.mark.parametrize("memory_bytes", [4 * 10**18, 9 * 10**18])
def test_memory_model__more_memory_never_takes_the_lighter_model(graph, machine, memory_bytes):
    """Two GPUs of 9e18 bytes: their usable memory summed as int64 wrapped past 2**63 to a negative total, so
    the conservative model "did not fit" and m-TOPO took the saved one, measured 734x slower than at 4e18."""
    from policies.listsched import gpus_hold_the_model
    from policies.problem import unit_memory_bytes

    problem = problem_for(graph, with_gpu_memory(machine, memory_bytes))
    gpus = problem.gpu_indices()
    assert unit_memory_bytes(problem, "auto", gpus)[1] == "conservative"
    assert gpus_hold_the_model(problem)


def test_measurement_cost__an_overflow_on_devices_of_exabytes_ranks_as_out_of_memory():
    from measurers.base import Measurement
    from policies.base import FAILED_COST_S, measurement_cost_s

    capacity = np.array([9 * 10**18, 9 * 10**18, 9 * 10**18], dtype=np.int64)  # sums past 2**63
    oom = Measurement(runtime_s=1.0, samples_s=(1.0,), status="oom", peak_bytes=(10**19, 0, 0), measure_s=0.0)
    assert FAILED_COST_S < measurement_cost_s(oom, capacity) < FAILED_COST_S * 1.1


def test_baselines__a_zero_second_single_gpu_step_gives_no_ratio_instead_of_dividing_by_zero(machine):
    from policies.table import run_baselines

    graph = build_graph([(0, 1), (1, 2), (0, 3)], 4, kinds=["aten.view"] * 4, name="zerocost")  # views cost 0 s
    table = run_baselines(problem_for(graph, machine), SimMeasurer(graph, machine), ["m-etf"], budget=1)
    assert table.single_gpu_s == 0.0
    assert table.rows[0].status == "ok" and np.isnan(table.rows[0].ratio_to_single_gpu)


def test_annealing__warm_start_is_among_its_starts_and_bad_ones_are_refused():
    """Annealing takes the learners' warm start too: the candidates, collapsed onto its groups, are
    measured with its own starts and the chains begin at the best, so it never ends above them."""
    from graphs.registry import load_graph
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import place

    graph, machine = load_graph("nmt-2"), load_machine("paper-2gpu")
    problem = make_problem(graph, machine, max_groups=8)
    measurer = SimulatorMeasurer(graph, machine)
    expert = place("expert", problem, measurer, 1, 0).op_placement
    seen = []
    result = place("annealing", problem, measurer, 12, 0, lambda p, m: seen.append((p.copy(), m.runtime_s)),
                   warm_start=[expert])
    collapsed = problem.expand(problem.collapse(expert))
    starts = [runtime for placement, runtime in seen[:3] if np.array_equal(placement, collapsed)]
    assert len(starts) == 1 and result.best.runtime_s <= starts[0]
    with pytest.raises(PlacerError, match="warm-start candidate 0"):
        place("annealing", problem, measurer, 12, 0, warm_start=[expert[:-1]])


@pytest.mark.parametrize("cpu_last", [False, True])
@pytest.mark.parametrize("name", ["heft", "m-etf", "m-sct", "m-topo"])
def test_list_schedulers_keep_a_unit_of_a_gpu_capable_and_a_cpu_only_op_off_the_gpus(name, cpu_last):
    """The GPUs an op was offered came from its own mask, not its unit's: HEFT crashed on op 1 (no device
    for it), and with the CPU listed last m-ETF and m-SCT put op 2, which no GPU may run, on a GPU. TF's
    importer colocates such ops (``colocate_with``) and marks an op with no GPU kernel CPU-only."""
    from dataclasses import replace

    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import place

    cpu, gpu = kind_bit("cpu"), kind_bit("gpu")
    graph = build_graph([(0, 1, 1000), (1, 3, 1000), (3, 2, 1000)], flops=[1e9, 1e9, 1e8, 1e9],
                        param_bytes=[4000] * 4, colocation=[0, 1, 1, 2],
                        allowed_mask=[cpu | gpu, cpu | gpu, cpu, cpu | gpu])  # ops 1 and 2: one unit
    machine = load_machine("paper-2gpu")
    if cpu_last:
        machine = replace(machine, devices=(*machine.devices[1:], machine.devices[0]))
    problem = make_problem(graph, machine)
    result = place(name, problem, SimulatorMeasurer(graph, machine), 1, 0)
    assert problem.op_allowed[np.arange(4), result.op_placement].all() and result.best.ok
    assert result.op_placement[1] == result.op_placement[2]


def test_make_problem__the_lower_bound_is_that_of_the_profiles_op_times(graph, machine):
    """With a profile that makes every op 100x faster, the problem's bound was the cost model's: above the
    step the same profile simulates."""
    from measurers.sim.costs import OpProfile, op_time_matrix
    from measurers.sim.reference import Simulator
    from policies.problem import make_problem

    models = {device.model for device in machine.devices}
    modeled_s = op_time_matrix(graph, machine)  # (N, D)
    names = [name for name in graph.op_names for _ in models]
    profile = OpProfile(np.array(names, dtype=object), np.array([*models] * graph.num_ops, dtype=object),
                        np.full(len(names), float(np.min(modeled_s[np.isfinite(modeled_s)])) / 100),
                        graph.content_hash)
    problem = make_problem(graph, machine, profile=profile)
    simulator = Simulator(graph, machine, profile=profile)
    assert problem.lower_bound_s == simulator.lower_bound_s
    assert problem.lower_bound_s < make_problem(graph, machine).lower_bound_s / 10
    step_s = simulator.run(np.argmin(problem.op_time_s, axis=1)).runtime_s  # each op on its fastest device
    assert problem.lower_bound_s <= step_s


def test_baselines__the_single_gpu_step_measured_for_the_ratio_is_reported_as_the_others(machine):
    """With single-gpu not among the policies, its measurement for the "x single GPU" column reached no
    run log."""
    from policies.table import run_baselines

    graph = build_graph([(0, 1), (1, 2)])
    measurer = SimMeasurer(graph, machine)
    reported = []
    table = run_baselines(problem_for(graph, machine), measurer, ["heft"], 1,
                          on_measurement=lambda name, placement, m: reported.append(name))
    assert sum(measurer.batches) == len(reported) == 2 and reported == ["heft", "single-gpu"]
    assert np.isfinite(table.single_gpu_s)


def test_annealing__takes_a_warm_start_given_as_one_array_of_rows():
    from policies.problem import make_problem
    from policies.registry import place
    from measurers.sim.measurer import SimulatorMeasurer

    graph, machine = build_graph([(0, 1), (1, 2)]), load_machine("paper-2gpu")
    rows = np.array([[1, 1, 1], [2, 2, 2]])  # (B, N): "the truth value of an array is ambiguous" before
    result = place("annealing", make_problem(graph, machine, max_groups=3), SimulatorMeasurer(graph, machine), 8,
                   0, warm_start=rows)
    assert result.measurements <= 8 and result.best.ok


def test_annealing__steps_of_no_time_warn_of_nothing():
    """log(0 s) and -inf - -inf printed numpy's RuntimeWarnings on the terminal of `placer baselines`."""
    import warnings

    from policies.problem import make_problem
    from policies.registry import place
    from measurers.sim.measurer import SimulatorMeasurer

    graph, machine = build_graph([(0, 1)], 2, kinds=["aten.view"] * 2), load_machine("paper-2gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = place("annealing", make_problem(graph, machine), SimulatorMeasurer(graph, machine), 6, 0)
    assert result.best.runtime_s == 0.0


@pytest.mark.parametrize("name", ["m-etf", "m-sct"])
def test_list_schedulers__an_unknown_device_set_is_refused(name, graph, machine):
    from policies.baechi import METFPolicy, MSCTPolicy

    policy = (METFPolicy if name == "m-etf" else MSCTPolicy)(devices="al")  # ran as "gpus" without a word
    with pytest.raises(PlacerError, match="unknown devices 'al' \\(known: auto, gpus, all\\)"):
        policy.place(problem_for(graph, machine), SimMeasurer(graph, machine), 1, 0)


@pytest.mark.parametrize("name", ["m-topo", "m-etf", "m-sct", "heft"])
def test_memory_heuristics__an_op_no_device_may_run_is_the_clear_error(name):
    """m-topo's saved memory model simulated a placement of its own and reported the simulator's words
    about it (an op on a device it may not run on)."""
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import place

    graph = build_graph([(0, 1, 10**6), (1, 2, 10**6)], out_bytes=[10**6] * 3, allowed_mask=[1, 3, 3])  # CPU-only
    machine = with_gpu_memory(load_machine("paper-2gpu").without_devices(["cpu:0"]), 10**6)
    with pytest.raises(PlacerError, match="has no device on machine"):
        place(name, make_problem(graph, machine), SimulatorMeasurer(graph, machine), 1, 0)


def test_annealing__a_stalled_run_kicks_its_chains_and_spends_its_whole_budget():
    """Annealing stopped after 50 steps that proposed nothing new and called it converged: here with 141 of
    300 measurements spent, on the benchmark rows with up to 39% of 2,048 (BENCHMARKS.md, "Annealing spends
    its whole budget"). Its chains now restart a few random moves away from the best instead."""
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import place

    graph, machine = synthetic_graph(300, seed=1), load_machine("paper-2gpu")
    result = place("annealing", make_problem(graph, machine, max_groups=10), SimulatorMeasurer(graph, machine),
                   300, 0)
    assert result.measurements == 300 and result.stop_reason == "budget"


def test_annealing__starts_from_m_topo_repaired_to_fit_where_one_gpu_overflows():
    """Its m-TOPO start skipped the memory repair the m-topo policy makes (m-TOPO's even shares come from an
    estimate), so with GPUs of 0.4x the one-device peak both of its starts overflowed and the chains walked
    among out-of-memory placements, where cem and random search found ones that fit."""
    from graphs.registry import load_graph
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import place

    graph = load_graph("rnnlm")
    peak_bytes = make_problem(graph, load_machine("paper-4gpu")).single_device_peak_bytes
    machine = with_gpu_memory(load_machine("paper-4gpu"), 0.4 * peak_bytes)
    statuses = []
    result = place("annealing", make_problem(graph, machine, max_groups=32), SimulatorMeasurer(graph, machine), 2,
                   0, lambda _p, m: statuses.append(m.status))
    assert statuses == ["oom", "ok"] and result.best.ok  # one GPU, then m-TOPO's fill repaired


def test_annealing__measures_a_warm_start_first_so_a_budget_of_one_keeps_it():
    """The caller's candidates came after annealing's own two starts and were cut off by a budget below 3, as
    `--remove-device` can leave one: the search went on from one GPU instead of the best placement so far."""
    from graphs.registry import load_graph
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.problem import make_problem
    from policies.registry import place

    graph, machine = load_graph("nmt-2"), load_machine("paper-2gpu")
    problem = make_problem(graph, machine, max_groups=8)
    measurer = SimulatorMeasurer(graph, machine)
    expert = place("expert", problem, measurer, 1, 0).op_placement
    result = place("annealing", problem, measurer, 1, 0, warm_start=[expert])
    assert np.array_equal(result.op_placement, problem.expand(problem.collapse(expert)))
