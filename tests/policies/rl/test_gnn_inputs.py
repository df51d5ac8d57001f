"""What the graph-neural placers see of a problem (policies/rl/gnn/inputs.py) and the networks reading it
(network.py): sizes follow G and D, nothing depends on op names or on how many devices a machine has
beyond its D-sized arrays, not-allowed pairs are flagged and never chosen, and GDP's logits follow the
groups when they are permuted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import with_gpu_memory
from graphs.registry import load_graph
from measurers.catalog import load_machine
from policies.problem import make_problem
from policies.rl.gnn.inputs import (DEVICE_COLUMNS, EDGE_COLUMNS, FEATURE_LAYOUT, NODE_COLUMNS, PAIR_COLUMNS,
                                    graph_inputs)
from policies.rl.gnn.network import MASKED_LOGIT, GdpNet, PlacetoNet, placement_state
from policies.rl.gnn.problems import Slot

torch.set_num_threads(1)
GRAPH = "synthetic:200"


@pytest.fixture(scope="module")
def graph():
    return load_graph(GRAPH)


def _inputs(graph, machine: str, max_groups: int = 8):
    return graph_inputs(make_problem(graph, load_machine(machine), max_groups=max_groups))


def _tensors(x) -> dict[str, torch.Tensor]:
    return {"node": torch.from_numpy(x.node), "edge_index": torch.from_numpy(x.edge_index),
            "edge": torch.from_numpy(x.edge), "device": torch.from_numpy(x.device),
            "pair": torch.from_numpy(x.pair), "allowed": torch.from_numpy(x.allowed)}


def _cpu_only_graph(make_graph):
    """A chain of 6 ops whose op 2 may run on the CPU only (allowed_mask bit 0)."""
    mask = [3, 3, 1, 3, 3, 3]
    return make_graph([(i, i + 1, 4096) for i in range(5)], flops=[1e9] * 6, allowed_mask=mask, name="cpu-only")


def test_layout_names_every_column():
    assert FEATURE_LAYOUT == {"node": NODE_COLUMNS, "edge": EDGE_COLUMNS, "device": DEVICE_COLUMNS,
                              "pair": PAIR_COLUMNS}
    for columns in FEATURE_LAYOUT.values():
        assert len(set(columns)) == len(columns)


@pytest.mark.parametrize("machine", ["paper-2gpu", "paper-4gpu", "paper-8gpu"])
def test_shapes_follow_groups_devices_and_layout(graph, machine):
    problem = make_problem(graph, load_machine(machine), max_groups=8)
    x = graph_inputs(problem)
    g, d = problem.num_units, problem.num_devices
    assert (x.num_groups, x.num_devices) == (g, d)
    assert x.node.shape == (g, len(NODE_COLUMNS))
    assert x.edge_index.shape[0] == 2 and x.edge.shape == (x.edge_index.shape[1], len(EDGE_COLUMNS))
    assert x.device.shape == (d, len(DEVICE_COLUMNS))
    assert x.pair.shape == (g, d, len(PAIR_COLUMNS))
    assert x.allowed.shape == x.work_s.shape == (g, d) and x.allowed.dtype == bool
    assert x.edge_bytes.shape == (x.edge_index.shape[1],)
    assert x.edge_index.dtype == np.int64 and x.edge_index.min() >= 0 and x.edge_index.max() < g
    for array in (x.node, x.edge, x.device, x.pair):
        assert array.dtype == np.float32 and np.isfinite(array).all()


def test_edges_come_in_both_directions(graph):
    x = _inputs(graph, "paper-2gpu")
    e = x.edge_index.shape[1] // 2
    forward = EDGE_COLUMNS.index("forward_edge")
    np.testing.assert_array_equal(x.edge_index[:, :e], x.edge_index[::-1, e:])
    np.testing.assert_array_equal(x.edge[:e, forward], 1.0)
    np.testing.assert_array_equal(x.edge[e:, forward], 0.0)
    np.testing.assert_array_equal(x.edge_bytes[:e], x.edge_bytes[e:])


def test_no_feature_depends_on_op_names(graph):
    new_names = [f"zz_{i:05d}_renamed" for i in range(len(graph.op_names))][::-1]
    renamed = dataclasses.replace(graph, op_names=np.array(new_names, dtype=object))
    a, b = _inputs(graph, "paper-4gpu"), _inputs(renamed, "paper-4gpu")
    for key in ("node", "edge_index", "edge", "device", "pair", "allowed", "work_s", "edge_bytes"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)


def test_more_alike_gpus_keep_group_and_edge_features(graph):
    two, four = _inputs(graph, "paper-2gpu"), _inputs(graph, "paper-4gpu")
    np.testing.assert_array_equal(two.edge_index, four.edge_index)
    np.testing.assert_array_equal(two.node, four.node)
    np.testing.assert_array_equal(two.edge, four.edge)


def test_more_alike_gpus_change_only_device_sized_arrays(graph):
    two, four = _inputs(graph, "paper-2gpu"), _inputs(graph, "paper-4gpu")
    np.testing.assert_array_equal(two.edge_index, four.edge_index)
    np.testing.assert_array_equal(two.edge_bytes, four.edge_bytes)
    assert two.device.shape[0] == 3 and four.device.shape[0] == 5
    assert two.pair.shape[1] == 3 and four.pair.shape[1] == 5
    # the CPU and the first GPU are the same devices on both machines: same pair features and work
    np.testing.assert_array_equal(two.pair, four.pair[:, :3])
    np.testing.assert_array_equal(two.work_s, four.work_s[:, :3])
    same = [DEVICE_COLUMNS.index(c) for c in ("is_cpu", "is_gpu", "log_relative_speed", "log_memory_gib")]
    np.testing.assert_array_equal(two.device[:, same], four.device[:3, same])
    # every GPU alike: the pair features of a group are the same on each of them
    for x in (two, four):
        gpu = x.device[:, DEVICE_COLUMNS.index("is_gpu")] == 1.0
        gpu_pairs = x.pair[:, gpu]  # (G, #gpu, P)
        np.testing.assert_array_equal(gpu_pairs, np.broadcast_to(gpu_pairs[:, :1], gpu_pairs.shape))


@pytest.mark.parametrize("machine", ["paper-2gpu", "paper-4gpu", "paper-8gpu"])
def test_device_ordinal_spans_the_gpus(graph, machine):
    x = _inputs(graph, machine)
    is_gpu = x.device[:, DEVICE_COLUMNS.index("is_gpu")] == 1.0
    is_cpu = x.device[:, DEVICE_COLUMNS.index("is_cpu")] == 1.0
    assert (is_gpu ^ is_cpu).all() and is_cpu.sum() == 1
    ordinal = x.device[is_gpu, DEVICE_COLUMNS.index("kind_ordinal")]
    n = int(is_gpu.sum())
    np.testing.assert_allclose(ordinal, np.arange(n) / (n - 1), atol=1e-6)
    np.testing.assert_allclose(x.device[is_gpu, DEVICE_COLUMNS.index("inverse_kind_count")], 1.0 / n, atol=1e-6)
    assert x.device[is_cpu, DEVICE_COLUMNS.index("kind_ordinal")] == 0.0


def test_inverse_kind_count_is_one_over_the_devices_of_the_kind(graph):
    """Committed checkpoints store the column by name: it must keep meaning 1 / (devices of this device's kind),
    GPUs of different models one kind (k80-v100: a CPU, two K80s and two V100s), not the number of kinds."""
    x = _inputs(graph, "k80-v100")
    column = x.device[:, DEVICE_COLUMNS.index("inverse_kind_count")]
    is_cpu = x.device[:, DEVICE_COLUMNS.index("is_cpu")] == 1.0
    np.testing.assert_allclose(column, np.where(is_cpu, 1.0, 0.25), atol=1e-6)


def test_not_allowed_pairs_are_flagged(make_graph):
    graph = _cpu_only_graph(make_graph)
    problem = make_problem(graph, load_machine("paper-2gpu"))
    x = graph_inputs(problem)
    assert not x.allowed.all() and x.allowed.any(axis=1).all()
    np.testing.assert_array_equal(x.pair[..., PAIR_COLUMNS.index("allowed")], x.allowed.astype(np.float32))
    assert np.isinf(x.work_s[~x.allowed]).all() and np.isfinite(x.work_s[x.allowed]).all()
    cpu = [i for i, d in enumerate(problem.machine.devices) if d.kind == "cpu"]
    blocked = ~x.allowed.any(axis=0)  # no device is wholly forbidden, but some groups are CPU-only
    assert not blocked.any()
    only_cpu = ~x.allowed[:, [i for i in range(problem.num_devices) if i not in cpu]].any(axis=1)
    assert only_cpu.any() and x.allowed[only_cpu][:, cpu].all()
    slowdown = x.pair[..., PAIR_COLUMNS.index("log_slowdown")]
    assert (slowdown[~x.allowed] == pytest.approx(1.0)) and (slowdown[x.allowed] < 1.0).all()
    assert np.isfinite(x.pair).all() and np.isfinite(x.node).all()


def test_one_network_scores_any_graph_and_machine(graph):
    torch.manual_seed(0)
    gdp, placeto = GdpNet(hidden_size=8, num_layers=1), PlacetoNet(hidden_size=8, num_layers=1)
    family = load_graph("family:transformer:0")
    for source, machine, groups in ((graph, "paper-2gpu", 8), (graph, "paper-8gpu", 5), (family, "paper-4gpu", 12)):
        problem = make_problem(source, load_machine(machine), max_groups=groups)
        x = graph_inputs(problem)
        tensors = _tensors(x)
        with torch.no_grad():
            logits = gdp(tensors)
            assert logits.shape == (x.num_groups, x.num_devices) and torch.isfinite(logits).all()
            slot = Slot(problem, counter=None)
            groups, devices = placeto.embed(tensors)
            start = torch.zeros((3, x.num_groups), dtype=torch.int64) + 1
            targets = torch.tensor([0, 1, x.num_groups - 1])
            state = placement_state(start, targets, slot.adjacency, slot.work, slot.total_work_s)
            assert state.shape == (3, x.num_devices, 3)
            step = placeto.step_logits(groups, devices, tensors, targets, state)
            assert step.shape == (3, x.num_devices) and torch.isfinite(step).all()


def test_masked_pairs_are_never_chosen(make_graph):
    problem = make_problem(_cpu_only_graph(make_graph), load_machine("paper-2gpu"))
    x = graph_inputs(problem)
    tensors = _tensors(x)
    allowed = torch.from_numpy(x.allowed)
    torch.manual_seed(1)
    net = GdpNet(hidden_size=8, num_layers=1)
    with torch.no_grad():
        for p in net.scorer.out[-1].parameters():  # push every logit towards the forbidden GPUs' side
            p.add_(5.0)
        logits = net(tensors)
    assert (logits[~allowed] == MASKED_LOGIT).all()
    assert allowed[torch.arange(x.num_groups), logits.argmax(dim=1)].all()
    draws = torch.multinomial(torch.softmax(logits, dim=-1), 500, replacement=True,
                              generator=torch.Generator().manual_seed(0))  # (G, 500)
    assert allowed.gather(1, draws).all()


def test_gdp_logits_follow_a_permutation_of_the_groups(graph):
    x = _inputs(graph, "paper-4gpu")
    tensors = _tensors(x)
    perm = torch.from_numpy(np.random.default_rng(3).permutation(x.num_groups))  # new group i is old perm[i]
    inverse = torch.argsort(perm)
    permuted = dict(tensors, node=tensors["node"][perm], edge_index=inverse[tensors["edge_index"]],
                    pair=tensors["pair"][perm], allowed=tensors["allowed"][perm])
    torch.manual_seed(2)
    net = GdpNet(hidden_size=8, num_layers=2).eval()
    with torch.no_grad():
        base, moved = net(tensors), net(permuted)
    assert not torch.allclose(base, base[perm])  # the permutation does move something
    torch.testing.assert_close(moved, base[perm], atol=1e-4, rtol=1e-4)


def test_placement_state_describes_the_placement(graph):
    problem = make_problem(graph, load_machine("paper-4gpu"), max_groups=8)
    slot = Slot(problem, counter=None)
    placements = torch.tensor([[1, 1, 2, 2, 3, 3, 4, 4], [0, 1, 2, 3, 4, 1, 2, 3]])  # (B, G)
    targets = torch.tensor([2, 5])
    state = placement_state(placements, targets, slot.adjacency, slot.work, slot.total_work_s)  # (B, D, 3)
    assert state.shape == (2, 5, 3)
    on_device = state[..., 0]
    torch.testing.assert_close(on_device, torch.nn.functional.one_hot(torch.tensor([2, 1]), 5).float())
    for b, target in enumerate(targets.tolist()):
        traffic = slot.adjacency[target]  # (G,) bytes to each group
        expected = torch.zeros(5, dtype=torch.float64)
        expected.index_add_(0, placements[b], traffic)
        torch.testing.assert_close(state[b, :, 1], (expected / traffic.sum()).float())
        work = slot.work[torch.arange(8), placements[b]]  # (G,) each group's time where it is
        device_work = torch.zeros(5, dtype=torch.float64).index_add_(0, placements[b], work)
        torch.testing.assert_close(state[b, :, 2], (device_work / slot.total_work_s).float())
    assert (state[..., 1].sum(dim=-1) <= 1.0 + 1e-6).all()


def test_fastest_device_start_respects_allowed_devices(make_graph):
    problem = make_problem(_cpu_only_graph(make_graph), load_machine("paper-2gpu"))
    slot = Slot(problem, counter=None)
    start = slot.fastest_device_start()
    assert slot.inputs.allowed[np.arange(slot.num_groups), start].all()
    on_gpu = slot.inputs.allowed[:, 1:].any(axis=1)
    assert set(start[on_gpu]) <= {1, 2} and len(set(start[on_gpu])) == 1  # one GPU takes all it may


def test_fastest_device_start_spills_what_one_gpu_cannot_hold(graph):
    from measurers.sim.reference import Simulator

    roomy = make_problem(graph, load_machine("paper-4gpu"), max_groups=16)
    one_gpu = Slot(roomy, counter=None).fastest_device_start()
    assert len(set(one_gpu.tolist())) == 1  # the step fits on one GPU: it all goes there
    machine = with_gpu_memory(roomy.machine, 0.95 * roomy.single_device_peak_bytes)  # a GPU holds 95%
    problem = make_problem(graph, machine, max_groups=16)
    start = Slot(problem, counter=None).fastest_device_start()
    counts = np.bincount(start, minlength=machine.num_devices)  # (D,)
    assert (counts > 0).sum() >= 2 and counts.argmax() == one_gpu[0]  # the fastest GPU keeps the most
    result = Simulator(graph, machine).run(problem.expand(start))
    assert result.status == "ok"


def test_building_a_network_leaves_no_generated_code_in_the_temporary_folder(tmp_path):
    """PyTorch Geometric writes GATv2Conv's generated code to the temporary folder once per process; the
    encoder has it written to a folder of its own and removed."""
    import os
    import subprocess
    import sys

    code = "from policies.rl.gnn.network import GdpNet; GdpNet(hidden_size=8, num_layers=1)"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    assert not [p.name for p in tmp_path.iterdir() if "GATv2Conv" in p.name]


def test_a_graph_that_needs_no_memory_gets_the_lowest_whole_share_without_a_warning(make_graph):
    """All-zero costs (a hand-made graph file): log2(0 / memory) printed numpy's divide-by-zero warning on
    stderr for every placement; the share is clipped at its floor either way."""
    graph = make_graph([(0, 1, 0), (1, 2, 0)], flops=[0.0] * 3, out_bytes=[0] * 3, name="no-memory")
    problem = make_problem(graph, load_machine("paper-2gpu"))
    assert problem.single_device_peak_bytes == 0
    with np.errstate(all="raise"):
        x = graph_inputs(problem)
    assert (x.pair[..., PAIR_COLUMNS.index("log2_graph_memory_share")] == -1.0).all()


def test_links_near_the_largest_float_give_finite_features(graph):
    """Links of 1.5e308 B/s (a machine file may give them): the mean of two overflowed to inf, the device
    features turned inf and gdp, placeto and giph failed in torch.multinomial with a traceback."""
    machine = load_machine("paper-4gpu")
    machine = dataclasses.replace(machine, links=tuple(dataclasses.replace(link, bandwidth_Bps=1.5e308)
                                                       for link in machine.links))
    with np.errstate(over="raise", invalid="raise"):
        x = graph_inputs(make_problem(graph, machine, max_groups=8))
    bandwidth = x.device[:, DEVICE_COLUMNS.index("log_mean_bandwidth_gbps")]
    assert np.isfinite(x.device).all() and np.allclose(bandwidth, np.log10(1.5e308 / 1e9))
    assert np.isfinite(x.node).all() and np.isfinite(x.edge).all()
