"""``hsdag`` (policies/rl/gnn/hsdag): the parser's groups are the connected components of the edges it
merged and change with the sample, a sample's log-probability is what the network assigns it (the
distribution sums to one), allowed devices are kept, a short training improves on its first batch, and a
warm start, a second run on a machine with a device fewer, and a resume all work."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from conftest import check_a_resume_inside_a_stall, check_stall_count_in_learner_state
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
from policies.base import CountingMeasurer, RunContext
from policies.problem import make_problem
from policies.rl.gnn.hsdag.parser import HsdagNet, ParseEdges, Sample, components, draw, log_prob, parse_of
from policies.rl.gnn.hsdag.policy import HsdagPolicy
from policies.rl.gnn.problems import Slot

torch.set_num_threads(1)
SMALL = {"hidden_size": 16, "num_layers": 1, "batch_size": 8}


@pytest.fixture(scope="module")
def setup():
    graph, machine = load_graph("synthetic:60"), load_machine("paper-2gpu")
    return make_problem(graph, machine, max_groups=16), SimulatorMeasurer(graph, machine)


def _net(seed: int = 0) -> HsdagNet:
    torch.manual_seed(seed)
    return HsdagNet(16, 1)


def _parse(problem):
    slot = Slot(problem, counter=None)
    return slot, ParseEdges.of(slot.tensors)


def _linked(num_units: int, pairs: list[tuple[int, int]]) -> np.ndarray:
    """(G,) component ids by union-find over ``pairs`` (independent of the parser's scipy call)."""
    parent = list(range(num_units))

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v
    for a, b in pairs:
        parent[root(a)] = root(b)
    return np.array([root(v) for v in range(num_units)])


def test_groups_are_the_components_of_the_merged_edges_and_vary_with_the_sample(setup):
    problem, _ = setup
    slot, edges = _parse(problem)
    sample = draw(_net(), slot.tensors, edges, 32, torch.Generator().manual_seed(0))
    src, dst = edges.src.numpy(), edges.dst.numpy()
    assert edges.num_edges > 0 and sample.merged.shape == (32, edges.num_edges)
    for b in range(32):
        merged_edges = zip(src[sample.merged[b]], dst[sample.merged[b]])
        expected = _linked(problem.num_units, [(int(s), int(d)) for s, d in merged_edges])
        same_expected = expected[:, None] == expected[None, :]  # (G, G)
        same_rows = sample.rows[b][:, None] == sample.rows[b][None, :]
        np.testing.assert_array_equal(same_rows, same_expected)
    offsets = np.concatenate([[0], np.cumsum(sample.num_groups)[:-1]])
    np.testing.assert_array_equal(sample.rows.min(axis=1), offsets)  # rows sample-major, none skipped
    assert sample.rows.max() + 1 == len(sample.group_device) == sample.num_groups.sum()
    assert len(set(sample.num_groups.tolist())) > 1  # the group count is an outcome of the sample
    partitions = {tuple(row - row.min()) for row in sample.rows}
    assert len(partitions) > 1


def test_log_prob_is_the_networks_probability_of_the_sample(setup):
    problem, _ = setup
    slot, edges = _parse(problem)
    net = _net(1)
    sample = draw(net, slot.tensors, edges, 6, torch.Generator().manual_seed(1))
    logp, entropy = log_prob(net, slot.tensors, edges, sample)
    assert logp.shape == (6,) and torch.isfinite(logp).all() and entropy > 0
    with torch.no_grad():
        units, devices = net.embed(slot.tensors)
        merge_p = torch.sigmoid(net.merge_logits(units, edges)).double().numpy()  # (M,)
        for b in range(6):  # one sample at a time: its edges, then its groups' devices on their own
            rows = sample.rows[b] - sample.rows[b].min()
            one = components(edges, sample.merged[b:b + 1])
            np.testing.assert_array_equal(one[0], rows)
            edge_logp = np.log(np.where(sample.merged[b], merge_p, 1.0 - merge_p)).sum()
            logits = net.device_logits(units, devices, slot.tensors, torch.from_numpy(rows[None]), int(rows.max()) + 1)
            chosen = sample.group_device[sample.rows[b].min():sample.rows[b].max() + 1]
            device_logp = torch.log_softmax(logits, 1).double().numpy()[np.arange(len(chosen)), chosen].sum()
            assert float(logp[b]) == pytest.approx(edge_logp + device_logp, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_probabilities_of_every_sample_sum_to_one(make_graph, temperature):
    graph = make_graph([(0, 1, 1 << 20), (1, 2, 1 << 20), (0, 2, 1 << 10)], flops=[1e9, 2e9, 1e9], name="tri")
    problem = make_problem(graph, load_machine("paper-2gpu"))  # 3 units, 3 devices
    slot, edges = _parse(problem)
    net = _net(2)
    total, num_devices = 0.0, problem.num_devices
    for merged in itertools.product([False, True], repeat=edges.num_edges):
        rows = components(edges, np.array([merged]))
        k = int(rows.max()) + 1
        for devices in itertools.product(range(num_devices), repeat=k):
            sample = Sample(np.array([merged]), rows, np.array(devices, dtype=np.int64))
            with torch.no_grad():
                total += float(log_prob(net, slot.tensors, edges, sample, temperature)[0].exp())
    assert edges.num_edges == 3 and total == pytest.approx(1.0, abs=1e-4)


def test_imitation_parse_merges_edges_whose_ends_share_a_device(setup):
    problem, _ = setup
    slot, edges = _parse(problem)
    target = np.random.default_rng(0).integers(0, problem.num_devices, problem.num_units)
    sample = parse_of(edges, target)
    np.testing.assert_array_equal(sample.unit_device[0], target)
    np.testing.assert_array_equal(sample.merged[0], target[edges.src.numpy()] == target[edges.dst.numpy()])


def _restricted(graph):
    """Every fifth op CPU-only, every seventh GPU-only (colocation groups agreeing)."""
    from graphs.opgraph import kind_bit

    mask = graph.allowed_mask.copy()
    cpu = np.isin(graph.colocation_ids, graph.colocation_ids[::5])
    gpu = np.isin(graph.colocation_ids, graph.colocation_ids[3::7]) & ~cpu
    mask[cpu], mask[gpu] = kind_bit("cpu"), kind_bit("gpu")
    return dataclasses.replace(graph, allowed_mask=mask)


def test_allowed_devices_are_respected(setup):
    problem, _ = setup
    restricted = make_problem(_restricted(problem.graph), problem.machine, max_groups=16)
    allowed = restricted.unit_allowed
    assert not allowed.all()
    slot, edges = _parse(restricted)
    sample = draw(_net(3), slot.tensors, edges, 64, torch.Generator().manual_seed(3))
    for b in range(64):
        for group in np.unique(sample.rows[b]):
            members = sample.rows[b] == group
            common = allowed[members].all(axis=0)
            if common.any():  # a device every member may use is chosen whenever there is one
                assert common[sample.group_device[group]]
    measurer = SimulatorMeasurer(restricted.graph, restricted.machine)
    result = HsdagPolicy(**SMALL).place(restricted, measurer, 40, 0)
    assert result.best.ok
    ops_ok = (restricted.graph.allowed_mask & restricted.machine.kind_bits[result.op_placement]) != 0
    assert ops_ok.all()


def test_short_training_improves_on_its_first_batch(setup):
    problem, measurer = setup
    batches = []
    context = RunContext(on_iteration=lambda i, m: batches.append(m["mean_scored_runtime_s"]))
    counted = CountingMeasurer(measurer)
    result = HsdagPolicy(context=context, **SMALL).place(problem, counted, 200, 0)
    assert counted.used == result.measurements <= 200 and len(batches) > 10
    assert np.mean(batches[-3:]) < 0.8 * batches[0]
    assert result.best.runtime_s < batches[0]
    [again] = measurer.measure([result.op_placement])
    assert again.runtime_s == pytest.approx(result.best.runtime_s)


def _without_last_device(machine):
    last = machine.devices[-1].name
    return dataclasses.replace(machine, name=machine.name + "-1", devices=machine.devices[:-1],
                               links=tuple(link for link in machine.links if last not in (link.src, link.dst)))


def test_warm_start_then_a_second_place_on_a_machine_with_a_device_fewer(setup):
    from policies.simple import SingleGpuPolicy

    problem, measurer = setup
    warm = SingleGpuPolicy().place(problem.at_op_level(), measurer, 1, 0)
    policy = HsdagPolicy(warm_start=[warm.op_placement], **SMALL)
    first = policy.place(problem, measurer, 40, 0)
    assert first.warm_start_runtime_s == pytest.approx(warm.best.runtime_s)
    assert first.best.runtime_s <= warm.best.runtime_s and "warm start" in first.notes
    trained = {k: v.clone() for k, v in policy.trainer.net.state_dict().items()}
    updates = policy.trainer.iteration

    smaller = _without_last_device(problem.machine)
    problem2 = make_problem(problem.graph, smaller, max_groups=16)
    measurer2 = SimulatorMeasurer(problem2.graph, smaller)
    warm2 = SingleGpuPolicy().place(problem2.at_op_level(), measurer2, 1, 0)
    policy.warm_start = [warm2.op_placement]
    kept = policy.trainer
    second = policy.place(problem2, measurer2, 40, 0)
    assert policy.trainer is kept and "kept from the last run" in second.notes
    assert second.op_placement.max() < smaller.num_devices and second.best.ok
    assert second.best.runtime_s <= warm2.best.runtime_s
    changed = [k for k, v in policy.trainer.net.state_dict().items() if not torch.equal(v, trained[k])]
    assert changed  # trained further from the kept weights
    assert policy.trainer.iteration > updates > 0  # the update count goes on: the run's metrics number each once


def test_a_resumed_run_says_what_its_warm_start_was(setup, tmp_path):
    """The note "warm start: candidate K at S s" was written only by the session that measured the candidates:
    a resumed run's notes lost it (its warm_start_runtime_s was kept)."""
    from policies.simple import SingleGpuPolicy

    problem, measurer = setup
    warm = SingleGpuPolicy().place(problem.at_op_level(), measurer, 1, 0)
    context = RunContext(checkpoint_dir=tmp_path)
    first = HsdagPolicy(context=context, warm_start=[warm.op_placement], **SMALL).place(problem, measurer, 20, 0)
    resumed = HsdagPolicy(context=context, warm_start=[warm.op_placement], **SMALL).place(problem, measurer, 40, 0)
    note = f"warm start: candidate 0 at {warm.best.runtime_s:.4f} s"
    assert note in first.notes and note in resumed.notes
    assert resumed.warm_start_runtime_s == pytest.approx(warm.best.runtime_s)


def test_resume_measures_nothing_twice(setup, tmp_path):
    problem, measurer = setup
    seen: list[bytes] = []
    record = lambda placement, m: seen.append(np.asarray(placement).tobytes())  # noqa: E731
    first = HsdagPolicy(context=RunContext(checkpoint_dir=tmp_path), **SMALL).place(problem, measurer, 40, 0, record)
    assert (tmp_path / "learner.pt").is_file() and first.measurements == len(seen)
    second = HsdagPolicy(context=RunContext(checkpoint_dir=tmp_path), **SMALL).place(problem, measurer, 80, 0, record)
    assert second.measurements == len(seen) and len(seen) > first.measurements
    assert len(set(seen)) == len(seen)
    assert second.best.runtime_s <= first.best.runtime_s


def test_a_run_cut_inside_a_stall_and_resumed_stops_at_the_update_one_run_does(setup, tmp_path, monkeypatch):
    """learner.pt keeps the stall count (conftest.check_a_resume_inside_a_stall)."""
    from policies.rl.gnn.hsdag import policy as hsdag_policy

    monkeypatch.setattr(hsdag_policy, "STALL_ITERATIONS", 6)  # short stalls: a fast test
    _, measurer = setup
    problem = make_problem(measurer.graph, measurer.machine, max_groups=4)
    options = {**SMALL, "batch_size": 4, "max_temperature": 1.5}  # one step of heat, then a stall ends the run
    check_a_resume_inside_a_stall(lambda context: HsdagPolicy(context=context, **options), problem, measurer,
                                  tmp_path, stall_iterations=6)


def test_budget_of_one_measures_the_greedy_parse(setup):
    problem, measurer = setup
    counted = CountingMeasurer(measurer)
    result = HsdagPolicy(**SMALL).place(problem, counted, 1, 0)
    assert counted.used == result.measurements == 1 and result.best.ok


def test_a_time_limit_spent_before_the_start_measures_nothing(setup, tmp_path):
    """Nor does it save a learner, which a resume would take for one that had begun (its greedy parse never
    measured)."""
    problem, measurer = setup
    counted = CountingMeasurer(measurer)
    context = RunContext(checkpoint_dir=tmp_path, time_limit_s=0.0)
    result = HsdagPolicy(context=context, **SMALL).place(problem, counted, 20, 0)
    assert counted.used == result.measurements == 0 and result.stop_reason == "time_limit"
    assert list(tmp_path.iterdir()) == []


def test_heat_raises_the_temperature_by_its_growth_up_to_the_cap():
    from policies.rl.gnn.hsdag.config import HsdagConfig
    from policies.rl.gnn.hsdag.trainer import HsdagTrainer

    trainer = HsdagTrainer(HsdagConfig(hidden_size=8, num_layers=1, stall_temperature_growth=2.0, max_temperature=5.0))
    assert trainer.temperature == 1.0
    assert trainer.heat() and trainer.temperature == 2.0
    assert trainer.heat() and trainer.heat() and trainer.temperature == 5.0
    assert not trainer.heat() and trainer.temperature == 5.0
    assert not HsdagTrainer(HsdagConfig(hidden_size=8, num_layers=1, stall_temperature_growth=1.0)).heat()


def test_the_learner_state_keeps_the_stall_count_and_one_written_before_it_loads_as_zero():
    from policies.rl.gnn.hsdag.config import HsdagConfig
    from policies.rl.gnn.hsdag.trainer import HsdagTrainer

    config = HsdagConfig(hidden_size=8, num_layers=1)
    check_stall_count_in_learner_state(HsdagTrainer(config), HsdagTrainer(config))


def test_a_hotter_draw_spreads_the_devices(setup):
    problem, _ = setup
    slot, edges = _parse(problem)
    net = _net(3)
    cold = draw(net, slot.tensors, edges, 64, torch.Generator().manual_seed(0), temperature=0.2)
    hot = draw(net, slot.tensors, edges, 64, torch.Generator().manual_seed(0), temperature=20.0)
    distinct = lambda s: len({row.tobytes() for row in s.unit_device})  # noqa: E731
    assert distinct(hot) > distinct(cold)
    assert abs(hot.merged.mean() - 0.5) < abs(cold.merged.mean() - 0.5)  # merges towards a fair coin


def test_a_stalled_run_heats_up_and_measures_more_before_it_stops(setup):
    _, measurer = setup
    problem = make_problem(measurer.graph, measurer.machine, max_groups=6)  # 3^6 placements at most
    runs = {growth: HsdagPolicy(**SMALL, stall_temperature_growth=growth).place(problem, measurer, 300, 0)
            for growth in (1.0, 1.5)}
    assert runs[1.0].stop_reason == "converged" and runs[1.0].measurements < 300
    assert runs[1.5].measurements > runs[1.0].measurements
    assert runs[1.5].best.runtime_s <= runs[1.0].best.runtime_s


def test_a_machine_with_one_allowed_device_per_group_measures_once_and_stops(setup, monkeypatch):
    """Nothing to choose: the greedy parse's placement is the only one, and the run ends "converged" without
    an update (it went on through every temperature step: 210 updates, 10 minutes, for one measurement)."""
    from measurers.machine import Machine
    from policies.rl.gnn.hsdag import policy as hsdag_policy

    monkeypatch.setattr(hsdag_policy, "STALL_ITERATIONS", 2)  # the old way: 2 updates for nothing, not 210
    problem, measurer = setup
    machine = Machine("one-gpu", problem.machine.devices[:1], ())
    hsdag = HsdagPolicy(**SMALL, stall_temperature_growth=1.0)
    result = hsdag.place(make_problem(problem.graph, machine, max_groups=16),
                         SimulatorMeasurer(problem.graph, machine), 100, 0)
    assert result.measurements == 1 and result.stop_reason == "converged"
    assert hsdag.trainer.iteration == 0


@pytest.mark.parametrize("edit, message", [
    (lambda net: net.update({next(iter(net)): torch.zeros(3, 3)}), "do not fit hsdag's network of hidden size 16"),
    (lambda net: next(iter(net.values())).fill_(float("nan")), "NaN or infinite"),
])
def test_a_learner_to_resume_with_weights_the_run_cannot_use_is_refused_naming_it(setup, tmp_path, edit, message):
    """Checked by ``check_settings`` (a search calls it before it changes its run folder) and by place before
    it loads them or measures anything: loading failed with a size mismatch, sampling from NaN weights with an
    invalid distribution."""
    from graphs.errors import PlacerError
    from policies.rl.gnn.hsdag.policy import check_settings

    problem, measurer = setup
    context = RunContext(checkpoint_dir=tmp_path)
    HsdagPolicy(context=context, **SMALL).place(problem, measurer, 2, 0)
    path = tmp_path / "learner.pt"
    state = torch.load(path, weights_only=True)
    edit(state["trainer"]["net"])
    torch.save(state, path)
    with pytest.raises(PlacerError, match=message) as error:
        check_settings(tmp_path, **SMALL)
    assert str(path) in str(error.value)
    counted = CountingMeasurer(measurer)
    with pytest.raises(PlacerError, match=message) as error:
        HsdagPolicy(context=context, **SMALL).place(problem, counted, 4, 0)
    assert str(path) in str(error.value) and counted.used == 0


def test_a_resumed_place_reads_its_learner_once(setup, tmp_path, monkeypatch):
    """Making the policy read and checked learner.pt, then place read it again to load it (a search made
    the policy twice besides: once to check it)."""
    from policies.rl import learner_file

    problem, measurer = setup
    HsdagPolicy(context=RunContext(checkpoint_dir=tmp_path), **SMALL).place(problem, measurer, 8, 0)
    reads = []
    original = learner_file.read_learner_state
    monkeypatch.setattr(learner_file, "read_learner_state", lambda path: reads.append(path) or original(path))
    policy = HsdagPolicy(context=RunContext(checkpoint_dir=tmp_path), **SMALL)
    assert reads == []
    result = policy.place(problem, measurer, 16, 0)
    assert reads == [tmp_path / "learner.pt"] and result.measurements > 8  # went on from the first run
