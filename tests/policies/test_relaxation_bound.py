"""The relaxation bound (policies/exact/relaxation.py, bound.py) against the simulator: on graphs small
enough to enumerate, it never exceeds the best simulated step of any placement that fits in memory, and
never falls below the closed-form bound."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from graphs.errors import PlacerError
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.machine import Device, Link, Machine
from measurers.sim.reference import Simulator
from policies.exact.bound import EVERY_PLACEMENT, proven_bound
from policies.exact.relaxation import solve_relaxation
from policies.problem import make_problem
from conftest import build_graph

REL = 1e-6  # the solver's tolerances (see relaxation.py)


def staging_machine(num_gpus: int = 2, gpu_memory_bytes: int = 4 * 10**9) -> Machine:
    """A CPU and ``num_gpus`` GPUs; every GPU-to-GPU copy shares one channel, as on paper-4gpu."""
    devices = [Device("cpu:0", "cpu", "r", 2e9, 1e12, 10**10, 1e-5)]
    devices += [Device(f"gpu:{i}", "gpu", "r", 1e10, 1e12, gpu_memory_bytes, 1e-5) for i in range(num_gpus)]
    links = []
    for a, b in itertools.permutations(devices, 2):
        staged = a.kind == "gpu" and b.kind == "gpu"
        links.append(Link(a.name, b.name, 5e8 if staged else 1e9, 2e-5 if staged else 1e-5,
                          "staging" if staged else f"{a.name}>{b.name}"))
    return Machine("staging", tuple(devices), tuple(links))


def random_graph(seed: int, num_ops: int = 7, **extra):
    rng = np.random.default_rng(seed)
    edges = [(i, j, int(rng.integers(10**4, 10**7))) for i in range(num_ops) for j in range(i + 1, num_ops)
             if rng.random() < 0.35]
    return build_graph(edges, num_ops, flops=rng.uniform(1e5, 5e7, num_ops), name=f"random{seed}", **extra)


def best_simulated_s(problem) -> float:
    """The least simulated step over every unit placement that does not run out of memory."""
    sim = Simulator(problem.graph, problem.machine, engine="reference")
    choices = [np.flatnonzero(row) for row in problem.unit_allowed]
    best = np.inf
    for units in itertools.product(*choices):
        result = sim.run(problem.expand(np.array(units)))
        if result.status == "ok":
            best = min(best, result.runtime_s)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_relaxation__between_closed_form_and_every_simulated_placement(seed):
    machine = staging_machine(num_gpus=2 if seed % 2 else 3)
    problem = make_problem(random_graph(seed, num_ops=7 if seed % 2 else 6), machine)
    assert problem.num_units == problem.graph.num_ops  # single-op groups
    best_s = best_simulated_s(problem)
    mip = solve_relaxation(problem, 30.0, integer=True)
    lp = solve_relaxation(problem, 30.0, integer=False)
    assert mip.status == "optimal" and lp.status == "optimal"
    assert mip.bound_s <= best_s * (1 + REL)
    assert lp.bound_s <= mip.bound_s * (1 + REL)
    assert lp.bound_s >= problem.lower_bound_s * (1 - REL)


def test_relaxation__a_link_slowed_to_all_but_nothing_leaves_the_bound_valid():
    """A user keeps two devices apart with a 1 kB/s link: a 1 GB copy over it was a coefficient of 1e9 ms beside
    op times of a few ms, and HiGHS proved a bound 7% above the best placement's simulated step (one that never
    uses the link), and on a graph of two ops "infeasible" where every placement fits."""
    import dataclasses

    base = load_machine("paper-2gpu")
    links = tuple(dataclasses.replace(link, bandwidth_Bps=1e3) if (link.src, link.dst) == ("gpu:0", "cpu:0") else
                  link for link in base.links)
    machine = dataclasses.replace(base, name="slow", links=links)
    graph = build_graph([(0, 1, 10**8), (0, 2, 0), (0, 3, 10**6), (1, 3, 0), (2, 3, 10**8)],
                        flops=[5e11, 1e11, 1e11, 1e10], out_bytes=[1000, 10**9, 1000, 1000],
                        bytes_accessed=[0, 0, 1e8, 0], kinds=["MatMul"] * 4, name="r70")
    problem = make_problem(graph, machine)
    mip = solve_relaxation(problem, 30.0, integer=True)
    assert mip.status == "optimal" and mip.bound_s <= best_simulated_s(problem) * (1 + REL)
    two = make_problem(build_graph([(0, 1, 10**9)], flops=[0, 0], out_bytes=[10**9, 0], name="g2"), machine)
    assert solve_relaxation(two, 30.0, integer=True).status == "optimal"


def test_relaxation__infeasible_is_said_only_where_no_placement_fits(monkeypatch):
    """HiGHS can call a relaxation infeasible on a machine whose figures span a dozen orders of magnitude; only
    memory can leave it without a point, so where a placement's parameters fit that is numerics, not a proof
    (the bound said "infeasible", and exact "no placement fits in device memory")."""
    import highspy

    import policies.exact.relaxation as relaxation

    problem = make_problem(random_graph(0), staging_machine(num_gpus=2))
    real_status = relaxation._status_name
    monkeypatch.setattr(relaxation, "_status_name", lambda status: "infeasible" if
                        status == highspy.HighsModelStatus.kOptimal else real_status(status))
    assert solve_relaxation(problem, 30.0).status == relaxation.NUMERICAL_INFEASIBLE
    tight = make_problem(random_graph(0, param_bytes=[4 * 10**9] * 7), staging_machine(num_gpus=2))
    assert solve_relaxation(tight, 30.0).status == "infeasible"


@pytest.mark.parametrize("param_bytes", [50, 500])
def test_relaxation__devices_of_a_few_bytes_holding_hundreds_are_infeasible_in_lp_and_mip(param_bytes):
    """The rows are in GB: HiGHS's tolerances took 50 bytes on devices of 1 byte as a fit (LP and MIP
    "optimal"), and 500 as a fit for the MIP beside an "infeasible" LP, while no placement fits."""
    import dataclasses

    tiny = staging_machine(num_gpus=1)
    tiny = dataclasses.replace(tiny, devices=tuple(dataclasses.replace(d, memory_bytes=1) for d in tiny.devices))
    problem = make_problem(build_graph([(0, 1, 10), (1, 2, 10)], 3, param_bytes=[param_bytes, 0, 0]), tiny)
    for integer in (False, True):
        result = solve_relaxation(problem, 30.0, integer=integer)
        assert result.status == "infeasible" and result.bound_s is None


def test_relaxation__copies_lift_the_mip_bound_above_the_closed_form():
    """A fork of four heavy branches joined again, on two GPUs: the closed form (work / 2) lets the
    branches share the GPUs with free copies; any placement that uses both GPUs pays for copies on the one
    staging channel, and the MIP bound says so (0.6 s against 0.5 s; the best placement runs 0.767 s)."""
    edges = [(0, k, 5 * 10**7) for k in range(1, 5)] + [(k, 5, 5 * 10**7) for k in range(1, 5)]
    graph = build_graph(edges, 6, flops=[5e8] * 6, allowed_mask=[2] * 6)  # GPUs only
    problem = make_problem(graph, staging_machine(num_gpus=2))
    mip = solve_relaxation(problem, 30.0)
    assert mip.bound_s > problem.lower_bound_s * (1 + 1e-3)
    assert mip.bound_s <= best_simulated_s(problem) * (1 + REL)


def test_relaxation__one_output_sent_to_several_units_of_one_device_counts_one_copy():
    """op0 (9.6 GB of parameters) fans out 1 GB to each of four units (0.5 GB of parameters each) on two 10 GB
    GPUs: memory forces op0 apart from all four, and the simulator sends its output over the one channel once
    (1 s; both placements that fit run 3.01 s). The channel row weighs each (op, consumer unit) pair 1/4, so the
    MIP bound is 2.01 s; counting each pair as a whole copy charged four copies and "proved" 4 s, above a step
    the simulator runs."""
    gb = 10**9
    graph = build_graph([(0, i, gb) for i in range(1, 5)], 5, param_bytes=[int(9.6 * gb)] + [gb // 2] * 4,
                        flops=[3e9] + [1.5e11] * 4, name="fan")
    devices = tuple(Device(f"gpu:{i}", "gpu", "r", 1e12, 1e12, 10 * gb, 0.0) for i in range(2))
    machine = Machine("m2", devices, tuple(Link(a.name, b.name, 1e9, 0.0, "bus") for a, b in
                                           itertools.permutations(devices, 2)))
    problem = make_problem(graph, machine)
    assert problem.num_units == 5
    best_s = best_simulated_s(problem)
    assert best_s == pytest.approx(3.01, rel=1e-12)
    mip = solve_relaxation(problem, 30.0, integer=True)
    lp = solve_relaxation(problem, 30.0, integer=False)
    assert mip.status == "optimal" and lp.status == "optimal"
    assert mip.bound_s <= best_s * (1 + REL)
    assert mip.bound_s == pytest.approx(2.01, rel=REL)
    assert problem.lower_bound_s * (1 - REL) <= lp.bound_s <= mip.bound_s * (1 + REL)

def test_relaxation__memory_rules_out_placements_that_do_not_fit():
    """Each GPU holds the parameters of two ops only: the bound is below the best placement that fits,
    and above the best unconstrained one (which puts everything on one GPU)."""
    graph = random_graph(3, num_ops=6, param_bytes=[10**9] * 6, allowed_mask=[2] * 6)
    tight = make_problem(graph, staging_machine(num_gpus=3, gpu_memory_bytes=2 * 10**9 + 10**8))
    roomy = make_problem(graph, staging_machine(num_gpus=3, gpu_memory_bytes=10**11))
    tight_s, roomy_s = best_simulated_s(tight), best_simulated_s(roomy)
    assert tight_s > roomy_s
    mip = solve_relaxation(tight, 30.0)
    assert roomy_s * (1 - REL) <= mip.bound_s <= tight_s * (1 + REL)


def test_relaxation__memory_that_fits_nothing_is_infeasible():
    graph = random_graph(1, num_ops=4, param_bytes=[10**11] * 4, allowed_mask=[2] * 4)
    result = solve_relaxation(make_problem(graph, staging_machine(num_gpus=2)), 10.0)
    assert result.status == "infeasible" and result.bound_s is None


def test_relaxation__one_device_without_links_is_its_serial_time():
    graph = random_graph(2, num_ops=5)
    machine = Machine("one", (Device("cpu:0", "cpu", "r", 2e9, 1e12, 10**10, 1e-5),), ())
    problem = make_problem(graph, machine)
    result = solve_relaxation(problem, 10.0)
    assert result.bound_s == pytest.approx(best_simulated_s(problem), rel=REL)


@pytest.fixture(scope="module")
def rnnlm_problem():
    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    return make_problem(load_graph("rnnlm"), load_machine("paper-2gpu"), max_groups=6, grouping_method="scope")


def test_bound__rnnlm_groups_lie_between_closed_form_and_simulated_placements(rnnlm_problem):
    problem = rnnlm_problem
    report = proven_bound(problem, 20.0)
    assert report.lp_status == "optimal"
    assert report.lp_s <= report.mip_s * (1 + REL)
    assert report.best_s == pytest.approx(max(report.closed_form_s, report.lp_s, report.mip_s), rel=2e-6)
    assert report.best_s < max(report.closed_form_s, report.lp_s, report.mip_s)  # rounded down
    sim = Simulator(problem.graph, problem.machine)
    rng = np.random.default_rng(0)
    placements = [np.full(problem.num_units, d) for d in problem.gpu_indices()]
    placements += [rng.choice(problem.gpu_indices(), problem.num_units) for _ in range(8)]
    for units in placements:
        result = sim.run(problem.expand(problem.repair_allowed(units)))
        if result.status == "ok":
            assert report.best_s <= result.runtime_s * (1 + REL)
    if report.best_s > report.closed_form_s:
        assert report.holds_for == f"placements of {report.grouping}"
        assert "6" in report.grouping and "rnnlm" in report.grouping


def test_bound__time_limit_is_respected_and_zero_is_closed_form_only(rnnlm_problem):
    closed = proven_bound(rnnlm_problem, 0)
    assert (closed.lp_s, closed.mip_s, closed.lp_status, closed.mip_status) == (None, None, "skipped", "skipped")
    assert closed.best_s == rnnlm_problem.lower_bound_s and closed.holds_for == EVERY_PLACEMENT
    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    problem = make_problem(load_graph("rnnlm"), load_machine("paper-4gpu"), max_groups=32)
    report = proven_bound(problem, 1.5)
    assert report.wall_s < 1.5 + 1.0  # HiGHS checks its clock between nodes
    cut_short = Simulator(problem.graph, problem.machine).run(problem.expand(np.full(problem.num_units, 1)))
    assert cut_short.status == "ok" and report.best_s <= cut_short.runtime_s * (1 + REL)  # still a bound


@pytest.mark.parametrize("limit", [-1.0, float("nan"), float("inf"), "1", None])
def test_bound__bad_time_limit_is_one_error(rnnlm_problem, limit):
    with pytest.raises(PlacerError, match="time limit"):
        proven_bound(rnnlm_problem, limit)


def test_bound__never_above_a_simulated_step_time_not_even_by_an_ulp():
    """One group: the MIP's optimum is the best single GPU's serial time, which HiGHS reports a few ulps above
    the simulator's (synthetic:60:1 on paper-2gpu); the reported best is rounded down below it."""
    problem = make_problem(load_graph("synthetic:60:1"), load_machine("paper-2gpu"), max_groups=1)
    report = proven_bound(problem, 10.0)
    simulator = Simulator(problem.graph, problem.machine)
    fastest_s = min(simulator.run(problem.expand(np.array([d]))).runtime_s for d in problem.gpu_indices())
    assert report.mip_status == "optimal" and report.mip_s == pytest.approx(fastest_s, rel=1e-12)
    assert report.best_s <= fastest_s


def test_relaxed_step__never_above_the_placements_simulated_step(make_graph):
    """A reviewer's 2-op graph: the relaxation's least step of a placement came out one ulp above its simulated
    step (0.0005747465501698912 > ...911), where the README says it never is."""
    from policies.exact.relaxation import relaxed_step_s

    graph = make_graph([(0, 1, 1000)], flops=[1e9, 1e9 / 3], bytes_accessed=[1e6, 1e6], out_bytes=[1000, 0],
                       name="one")
    problem = make_problem(graph, load_machine("paper-2gpu"))
    for units in itertools.product(range(problem.num_devices), repeat=problem.num_units):
        placement = np.array(units)
        step_s = problem.simulator().run(problem.expand(placement)).runtime_s
        assert relaxed_step_s(problem, placement, 5.0) <= step_s


def nanosecond_problem():
    """A reviewer's 4-op graph stepping in about 55-76 ns, on a CPU and a GPU with fast links."""
    cpu = Device("cpu:0", "cpu", "Xeon-E5-2699v3", 2.8e14, 1.5e12, 10**11, 1e-9)
    gpu = Device("gpu:0", "gpu", "K80", 1.0e14, 9.8e13, 10**10, 0.0)
    machine = Machine("ns", (cpu, gpu), (Link("cpu:0", "gpu:0", 1.76e12, 1e-9, "a"),
                                          Link("gpu:0", "cpu:0", 3.1e13, 0.0, "b")))
    graph = build_graph([(0, 1, 50_000_000), (0, 3, 50_000_000), (1, 2, 500)], 4,
                        flops=[0.0, 0.0, 10403.64, 811.11], bytes_accessed=[20041.93, 34304.47, 32.27, 59.70],
                        out_bytes=[50_000_000, 1000, 1_000_000, 100_000], param_bytes=[0, 29_909_047, 0, 0],
                        kinds=["Sum", "Relu", "MatMul", "MatMul"], allowed_mask=np.array([1, 3, 3, 1], dtype=np.uint8),
                        name="nanoseconds")
    return make_problem(graph, machine)


def test_bound__a_step_of_nanoseconds_is_not_proven_above_a_placements_simulated_step():
    """HiGHS's MIP prunes within 1e-6 of its incumbent in the model's milliseconds (1 ns), and its dual bound
    came out 0.9% above this placement's simulated step; a relative slack alone cannot cover an absolute
    tolerance."""
    problem = nanosecond_problem()
    step_s = Simulator(problem.graph, problem.machine, engine="reference").run(np.array([0, 0, 1, 0])).runtime_s
    report = proven_bound(problem, 10.0)
    assert report.mip_status == "optimal" and report.mip_s > step_s  # HiGHS's own figure, as it solved
    assert report.best_s <= step_s


def test_exact__a_best_at_highs_own_bound_is_not_taken_as_proven_where_that_bound_is_too_high():
    """Warm-started at the placement HiGHS calls optimal (54.93 ns), exact stopped "converged" and called it
    proven best, while (0, 0, 1, 0) steps in 54.24 ns."""
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.registry import place

    problem = nanosecond_problem()
    measurer = SimulatorMeasurer(problem.graph, problem.machine)
    result = place("exact", problem, measurer, 2, 0, solver="highs", time_limit_s=10,
                   warm_start=[problem.expand(np.array([0, 0, 0, 0]))])
    best_s = Simulator(problem.graph, problem.machine).run(np.array([0, 0, 1, 0])).runtime_s
    assert result.stop_reason != "converged" and result.best.runtime_s == pytest.approx(best_s, rel=1e-9)


def test_relaxation__not_solved_when_building_the_model_took_the_whole_time_limit(rnnlm_problem):
    """Building counts against the limit: HiGHS was given a floor of 0.01 s after a build that took longer
    than the limit (nmt-2 on paper-4gpu at 0.5 s: the LP's wall 1.12 s); now it does not run at all."""
    from policies.exact.relaxation import NOT_SOLVED

    for integer in (False, True):
        result = solve_relaxation(rnnlm_problem, 1e-9, integer=integer)
        assert (result.status, result.bound_s, result.unit_placement) == (NOT_SOLVED, None, None)
    report = proven_bound(rnnlm_problem, 1e-9)
    assert report.lp_status == NOT_SOLVED and report.lp_s is None
    assert report.best_s == report.closed_form_s and report.holds_for == EVERY_PLACEMENT


def test_solve_relaxation__ctrl_c_stops_the_solve_and_is_raised():
    """HiGHS's run holds the main thread in C++: Ctrl-C during a MIP that would run to its 60 s limit was
    seen only once the limit was reached (status "time limit"). It now stops the solve at HiGHS's next
    interrupt check (status "interrupted"), then raises KeyboardInterrupt, and Ctrl-C is Python's own again."""
    import os
    import signal
    import threading

    import highspy

    from graphs.synthetic import synthetic_graph
    from policies.exact.relaxation import _build, _interruptible, quiet_highs

    problem = make_problem(synthetic_graph(300, 0), load_machine("paper-4gpu"), max_groups=64, grouping_method="metis")
    lp, _ = _build(problem, True, 0.0, ())
    highs = quiet_highs()
    highs.setOptionValue("time_limit", 60.0)
    highs.passModel(lp)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        with _interruptible(highs):
            highs.run()
    timer.join()
    assert highs.getModelStatus() == highspy.HighsModelStatus.kInterrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_solve_relaxation__sigterm_as_ctrl_c_stops_the_solve_and_is_raised():
    """Every command takes SIGTERM as Ctrl-C (cluster/ray_setup.sigterm_as_ctrl_c). Raised inside HiGHS's
    interrupt callback, its KeyboardInterrupt became HiGHS's "solve error": the solve went on, then the rest of
    the command, which ended with status 0. SIGTERM now goes the way a Ctrl-C held by the solve goes."""
    import os
    import signal
    import threading

    import highspy

    from cluster.ray_setup import sigterm_as_ctrl_c
    from graphs.synthetic import synthetic_graph
    from policies.exact.relaxation import _build, _interruptible, quiet_highs

    problem = make_problem(synthetic_graph(300, 0), load_machine("paper-4gpu"), max_groups=64, grouping_method="metis")
    lp, _ = _build(problem, True, 0.0, ())
    highs = quiet_highs()
    highs.setOptionValue("time_limit", 60.0)
    highs.passModel(lp)
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
        with _interruptible(highs):
            highs.run()
    timer.join()
    assert highs.getModelStatus() == highspy.HighsModelStatus.kInterrupt
    assert signal.getsignal(signal.SIGTERM) is before


def test_bound__a_stop_set_from_another_thread_ends_the_solve_with_what_it_proved(monkeypatch):
    """`placer search` solves the bound in a thread while it measures (cluster/jobs/bound_solve.py) and stops
    it when the search is stopped. A MIP that would run to its 60 s limit ends at HiGHS's next interrupt
    check once the stop is set, "stopped", its dual bound still a bound; a stop set before the solve skips
    the MIP and proves the closed form alone."""
    import threading

    from graphs.synthetic import synthetic_graph

    from policies.exact import relaxation

    problem = make_problem(synthetic_graph(300, 0), load_machine("paper-4gpu"), max_groups=64, grouping_method="metis")
    stop = threading.Event()
    timers, real_solve = [], relaxation.solve_relaxation

    def solve(*args, integer=True, **kwargs):  # the stop comes 1 s into the MIP (a fixed time fell in a slow LP)
        if integer and not stop.is_set():
            timers.append(threading.Timer(1.0, stop.set))
            timers[-1].start()
        return real_solve(*args, integer=integer, **kwargs)

    monkeypatch.setattr(relaxation, "solve_relaxation", solve)
    report = proven_bound(problem, 60.0, stop=stop)
    timers[0].join()
    assert report.mip_status == "stopped" and report.lp_status == "optimal"
    assert report.mip_s is None or report.mip_s >= report.lp_s * (1 - REL)  # what it proved by then
    assert report.best_s >= report.closed_form_s
    stopped_first = proven_bound(problem, 60.0, stop=stop)  # already set
    assert (stopped_first.lp_status, stopped_first.mip_status) == ("stopped", "skipped")
    assert stopped_first.best_s == stopped_first.closed_form_s and stopped_first.holds_for == EVERY_PLACEMENT


def own_channel_machine(num_gpus: int = 2) -> Machine:
    """A CPU and ``num_gpus`` GPUs, every link its own channel (no copies queue behind each other)."""
    devices = [Device("cpu:0", "cpu", "r", 2e9, 1e12, 10**10, 1e-5)]
    devices += [Device(f"gpu:{i}", "gpu", "r", 1e10, 1e12, 4 * 10**9, 1e-5) for i in range(num_gpus)]
    links = [Link(a.name, b.name, 1e9, 1e-5, f"{a.name}>{b.name}") for a, b in itertools.permutations(devices, 2)]
    return Machine("own-channels", tuple(devices), tuple(links))


def without_window_rows(problem, monkeypatch, **kwargs):
    """The relaxation as it was before constraint 7 (no window rows)."""
    import policies.exact.relaxation as relaxation

    with monkeypatch.context() as patch:
        patch.setattr(relaxation, "WINDOW_OPS", 0)
        return solve_relaxation(problem, 30.0, **kwargs)


def random_training_graph(seed: int, forward: int = 8, units: int = 6):
    """A random forest of ``forward`` heavy forward ops into a loss op, the backward ops mirroring it (each
    reads its forward op), on GPUs only; a forward op and its backward op share a random one of ``units``
    groups, as scope groups do. Wide and cheap to copy, so the GPUs share the work and the window rows bind."""
    rng = np.random.default_rng(seed)
    loss = forward
    edges = [(int(rng.integers(j)), j, int(rng.integers(10**4, 10**6))) for j in range(1, forward)
             if rng.random() < 0.5]
    ends = [i for i in range(forward) if all(src != i for src, _, _ in edges)]
    edges += [(i, loss, 10**4) for i in ends] + [(loss, forward + 1 + i, 10**4) for i in ends]
    edges += [(forward + 1 + j, forward + 1 + i, size) for i, j, size in edges if j < forward]
    edges += [(i, forward + 1 + i, 10**5) for i in range(forward)]
    unit = rng.integers(0, units, forward).tolist()
    flops = np.concatenate([rng.uniform(1e7, 1e8, forward), [1e4], rng.uniform(1e7, 2e8, forward)])
    return build_graph(edges, 2 * forward + 1, flops=flops, colocation=unit + [units] + unit,
                       allowed_mask=[2] * (2 * forward + 1), name=f"training{seed}")


@pytest.mark.parametrize("machine", [staging_machine, own_channel_machine])
@pytest.mark.parametrize("seed", [0, 2, 3, 4])
def test_window_rows__hold_for_every_placement_and_never_lower_the_bound(seed, machine, monkeypatch):
    """Constraint 7 is valid: the MIP bound with it stays at most the best simulated placement (all of them
    enumerated), and it is at least the bound without it (it only adds rows). On these seeds the rows bind:
    they raise the MIP bound by 3.7-8.2%, up to the optimum itself on seeds 0 and 4 (within 0.02%)."""
    problem = make_problem(random_training_graph(seed), machine(num_gpus=2))
    best_s = best_simulated_s(problem)
    mip = solve_relaxation(problem, 30.0)
    lp = solve_relaxation(problem, 30.0, integer=False)
    assert mip.status == "optimal" and lp.status == "optimal"
    assert lp.bound_s <= mip.bound_s * (1 + REL) and mip.bound_s <= best_s * (1 + REL)
    before = [without_window_rows(problem, monkeypatch, integer=integer) for integer in (True, False)]
    assert mip.bound_s >= before[0].bound_s * (1 - REL) and lp.bound_s >= before[1].bound_s * (1 - REL)
    assert mip.bound_s > before[0].bound_s * 1.03


def phase_bound_problem():
    """Forward ops 1-4 (33 ms each) fan out of op 0 and into the loss (5), backward ops 6-9 (33 ms each) fan
    out of it into op 10, on two GPUs. The units: {1, 2, 3}, {4, 6}, {7, 8, 9} (the rest tiny, on
    their own). A device's total work can be balanced (5 ops against 3), but not each phase's: every placement
    takes at least 6 ops' time, the forward's busiest device then the backward's."""
    edges = [(0, k, 10**3) for k in range(1, 5)] + [(k, 5, 10**3) for k in range(1, 5)]
    edges += [(5, k, 10**3) for k in range(6, 10)] + [(k, 10, 10**3) for k in range(6, 10)]
    flops = [1e3] + [1e8] * 4 + [1e3] + [1e8] * 4 + [1e3]
    graph = build_graph(edges, 11, flops=flops, colocation=[0, 1, 1, 1, 2, 3, 2, 4, 4, 4, 5], allowed_mask=[2] * 11)
    return make_problem(graph, staging_machine(num_gpus=2))


def test_window_rows__see_that_each_phase_must_be_balanced(monkeypatch):
    """Without constraint 7 the MIP proves 5 ops' time (device work); with it, 6 (the loss starts after the
    forward work on each device, and the backward work on each device runs after it): the optimum.
    ``window_rows=False`` builds the model without them."""
    problem = phase_bound_problem()
    op_s = float(problem.op_time_s[1, 1])
    best_s = best_simulated_s(problem)
    mip = solve_relaxation(problem, 30.0)
    before = without_window_rows(problem, monkeypatch)
    assert mip.status == before.status == "optimal"
    assert before.bound_s == pytest.approx(5 * op_s, rel=1e-3)
    assert solve_relaxation(problem, 30.0, window_rows=False).bound_s == pytest.approx(before.bound_s, rel=REL)
    assert mip.bound_s == pytest.approx(6 * op_s, rel=1e-3) and mip.bound_s <= best_s * (1 + REL)
    assert best_s == pytest.approx(6 * op_s, rel=1e-3)


def test_longest_path_ops__one_chain_even_where_paths_tie():
    """Two branches of equal length: the ops chosen lie on one of them, each an ancestor of the next (the rows
    between consecutive ops need that), spread from its first op to its last; ``count`` caps them."""
    from policies.exact.relaxation import _related, longest_path_ops

    edges = [(0, 1), (1, 2), (2, 3), (0, 4), (4, 5), (5, 3), (3, 6)]
    problem = make_problem(build_graph(edges, 7, flops=[1e7] * 7), staging_machine(num_gpus=2))
    chosen = longest_path_ops(problem, 48)
    assert len(chosen) == 5 and chosen[0] == 0 and chosen[-1] == 6
    ancestors = _related(problem.graph, chosen, ancestors=True)  # (N, M)
    assert all(ancestors[chosen[m], m + 1] for m in range(len(chosen) - 1))
    assert longest_path_ops(problem, 3).tolist() == [0, 2, 6]  # positions 0, 2 and 4 of 0 1 2 3 6
    assert len(longest_path_ops(problem, 0)) == 0


def test_bound_and_exact__a_step_of_ages_is_refused_by_the_solvers_by_name_not_reported_as_a_zero_bound():
    """A hand-made graph of 1e25 FLOPs an op (a step of ~1e13 s, which the simulator still takes) overflowed
    CP-SAT's int64 ticks (a RuntimeWarning, status "invalid", bound 0.0) and HiGHS's coefficient limit (it
    solved an empty model: "modelempty", MIP bound 0.0). Both now say they did not solve; the closed form
    stands; exact returns its fallback and says why."""
    import warnings

    from policies.exact.cpsat import ExactModel
    from policies.exact.policy import ExactPolicy
    from policies.exact.quotient import quotient_graph
    from policies.exact.relaxation import REFUSED
    from measurers.sim.measurer import SimulatorMeasurer

    graph = build_graph([(0, 1, 4000), (1, 2, 4000)], flops=[1e25, 1e25, 1e6], name="ages")
    problem = make_problem(graph, load_machine("paper-2gpu"))
    assert problem.lower_bound_s > 1e12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = proven_bound(problem, 10.0)
        result = ExactPolicy(time_limit_s=5.0).place(problem, SimulatorMeasurer(graph, problem.machine), 4, 0)
    assert report.lp_status == report.mip_status == REFUSED and report.lp_s is None and report.mip_s is None
    assert report.exact_s is None and report.best_s == report.closed_form_s and report.holds_for == EVERY_PLACEMENT
    assert REFUSED in result.notes and result.best.ok
    with pytest.raises(PlacerError, match=r"more ticks of 1e-06 s than CP-SAT's model holds \(2\*\*53\)"):
        ExactModel(quotient_graph(problem), problem.machine, problem.capacity_bytes())
