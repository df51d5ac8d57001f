"""Hand-computed timelines (check them with pencil and paper), the cost model and placement files.

The toy machine makes every number round: a "MatMul" op with F flops takes F / 1e9 seconds on a GPU and
twice that on the CPU (no overhead, efficiency 1); a link moves 1e9 bytes per second with no latency.
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph, kind_bit
from measurers.sim.costs import OpProfile, load_profile, op_class, op_time_matrix, save_profile, transfer_time_s
from measurers.machine import Device, Link, Machine
from measurers.placement import check_placement, load_placement_file, save_placement_file
from measurers.sim.reference import simulate

ENGINES = ("reference", "fast")
GB = 1_000_000_000


def toy_graph(ops, edges, **extra) -> OpGraph:
    """ops: [(name, seconds on a GPU, out_bytes)], edges: [(src name, dst name, bytes)]."""
    names = [o[0] for o in ops]
    index = {name: i for i, name in enumerate(names)}
    n = len(ops)
    kinds = extra.pop("kinds", ["MatMul"] * n)
    return OpGraph(
        name="toy", framework="manual", op_names=np.array(names, dtype=object), op_kinds=np.array(kinds, dtype=object),
        flops=np.array([o[1] * 1e9 for o in ops]), bytes_accessed=extra.pop("bytes_accessed", np.zeros(n)),
        out_bytes=np.array([o[2] for o in ops]), param_bytes=extra.pop("param_bytes", np.zeros(n, dtype=np.int64)),
        edge_src=np.array([index[e[0]] for e in edges], dtype=np.int64),
        edge_dst=np.array([index[e[1]] for e in edges], dtype=np.int64),
        edge_bytes=np.array([e[2] for e in edges], dtype=np.int64), **extra)


def toy_machine(num_gpus=2, memory_bytes=100 * GB, shared_channel=False, latency_s=0.0) -> Machine:
    def device(name, kind, flops):
        return Device(name, kind, "toy", peak_flops=flops, mem_bandwidth_Bps=1e12, memory_bytes=memory_bytes,
                      op_overhead_s=0.0)

    devices = [device("cpu:0", "cpu", 0.5e9)] + [device(f"gpu:{i}", "gpu", 1e9) for i in range(num_gpus)]
    links = [Link(a.name, b.name, 1e9, latency_s, "bus" if shared_channel else f"{a.name}>{b.name}")
             for a in devices for b in devices if a is not b]
    return Machine("toy", tuple(devices), tuple(links))


def run(graph, machine, devices, engine):
    placement = [machine.device_index(d) for d in devices]
    return simulate(graph, machine, np.array(placement), engine=engine, timeline=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_chain_on_one_device__ops_run_back_to_back(engine):
    graph = toy_graph([("a", 1.0, 0), ("b", 2.0, 0), ("c", 3.0, 0)], [("a", "b", 8), ("b", "c", 8)])
    result = run(graph, toy_machine(), ["gpu:0"] * 3, engine)
    assert result.timeline.op_start_s.tolist() == [0.0, 1.0, 3.0]
    assert result.timeline.op_end_s.tolist() == [1.0, 3.0, 6.0]
    assert result.runtime_s == 6.0 and result.status == "ok"
    assert result.busy_s.tolist() == [0.0, 6.0, 0.0]
    assert result.link_bytes.sum() == 0 and len(result.timeline.transfer_op) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_diamond_on_two_devices__transfers_and_overlap(engine):
    # a(1s) -> b(2s) and a -> c(3s, on gpu:1); b, c -> d(1s). a->c and c->d carry 1 GB: 1 s each.
    graph = toy_graph([("a", 1.0, 10), ("b", 2.0, 10), ("c", 3.0, 10), ("d", 1.0, 10)],
                      [("a", "b", 10), ("a", "c", GB), ("b", "d", 10), ("c", "d", GB)])
    result = run(graph, toy_machine(), ["gpu:0", "gpu:0", "gpu:1", "gpu:0"], engine)
    timeline = result.timeline
    # a 0-1; b 1-3 on gpu:0 while a's output travels 1-2 and c runs 2-5 on gpu:1; c's output travels 5-6; d 6-7
    assert timeline.op_start_s.tolist() == [0.0, 1.0, 2.0, 6.0]
    assert timeline.op_end_s.tolist() == [1.0, 3.0, 5.0, 7.0]
    assert timeline.transfer_op.tolist() == [0, 2]
    assert timeline.transfer_start_s.tolist() == [1.0, 5.0] and timeline.transfer_end_s.tolist() == [2.0, 6.0]
    assert result.runtime_s == 7.0
    assert result.busy_s.tolist() == [0.0, 4.0, 3.0]
    assert result.link_bytes.sum() == 2 * GB


@pytest.mark.parametrize("engine", ENGINES)
def test_one_transfer__takes_latency_plus_bytes_over_bandwidth(engine):
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [("a", "b", GB // 2)])
    machine = toy_machine(latency_s=0.25)
    result = run(graph, machine, ["gpu:0", "gpu:1"], engine)
    assert result.timeline.transfer_start_s.tolist() == [1.0]
    assert result.timeline.transfer_end_s.tolist() == [1.75]  # 0.25 + 0.5e9 / 1e9
    assert result.runtime_s == 2.75
    assert transfer_time_s(machine, 1, 2, GB // 2) == 0.75 and transfer_time_s(machine, 1, 1, GB) == 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_two_transfers_on_one_channel__are_served_one_after_the_other(engine):
    # a(1s) on gpu:0 feeds b on gpu:1 and c on cpu:0, 1 GB each (1 s). b and c take 1 GPU-second (c: 2 s on the CPU).
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0), ("c", 1.0, 0)], [("a", "b", GB), ("a", "c", GB)])
    devices = ["gpu:0", "gpu:1", "cpu:0"]
    shared = run(graph, toy_machine(shared_channel=True), devices, engine)
    # both requested at 1; ties go to the lower destination index: cpu:0 (1-2) first, then gpu:1 (2-3)
    assert shared.timeline.transfer_dst.tolist() == [0, 2]
    assert shared.timeline.transfer_start_s.tolist() == [1.0, 2.0]
    assert shared.timeline.transfer_end_s.tolist() == [2.0, 3.0]
    assert shared.timeline.op_start_s.tolist() == [0.0, 3.0, 2.0]
    assert shared.runtime_s == 4.0  # c: 2-4 on the CPU; b: 3-4
    separate = run(graph, toy_machine(shared_channel=False), devices, engine)
    assert separate.timeline.transfer_end_s.tolist() == [2.0, 2.0]
    assert separate.runtime_s == 4.0 and separate.timeline.op_end_s.tolist() == [1.0, 3.0, 4.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_memory_peak__parameters_plus_live_activations(engine):
    # v: a Variable with 1000 resident bytes (its output aliases them); a(1s, 100 B) -> b(2s, 200 B) -> c(3s, 50 B)
    graph = toy_graph([("a", 1.0, 100), ("v", 0.0, 400), ("b", 2.0, 200), ("c", 3.0, 50)],
                      [("a", "b", 100), ("v", "b", 400), ("b", "c", 200)],
                      kinds=["MatMul", "Variable", "MatMul", "MatMul"], param_bytes=np.array([0, 1000, 0, 0]))
    result = run(graph, toy_machine(), ["gpu:0"] * 4, engine)
    # a 0-1 (1000 + 100); v 1-1 (nothing new); b 1-3 (1000 + 100 + 200 = 1300); a freed at 3; c 3-6 (1000 + 200 + 50)
    assert result.timeline.op_start_s.tolist() == [0.0, 1.0, 1.0, 3.0]
    assert result.peak_bytes.tolist() == [0, 1300, 0]
    assert result.runtime_s == 6.0 and result.status == "ok"


@pytest.mark.parametrize("engine", ENGINES)
def test_memory_peak__a_resource_variables_read_aliases_it_on_its_device_and_is_copied_to_another(engine):
    """TensorFlow's ReadVariableOp hands out the variable's buffer: counted as a new 1000 B, a Keras MLP's peak
    was 1.75x that of the same model imported from PyTorch. Read on gpu:0 and used on gpu:1, it is a copy."""
    graph = toy_graph([("h", 0.0, 1000), ("r", 0.0, 1000), ("a", 1.0, 100), ("b", 1.0, 10)],
                      [("h", "r", 0), ("r", "a", 1000), ("a", "b", 100)],
                      kinds=["VarHandleOp", "ReadVariableOp", "MatMul", "MatMul"],
                      param_bytes=np.array([1000, 0, 0, 0]))
    local = run(graph, toy_machine(), ["gpu:0"] * 4, engine)
    assert local.peak_bytes.tolist() == [0, 1110, 0]  # the variable, a's and b's outputs; no second 1000 for r
    remote = run(graph, toy_machine(), ["gpu:0", "gpu:0", "gpu:1", "gpu:1"], engine)
    assert remote.peak_bytes.tolist() == [0, 1000, 1100]  # the copy on gpu:1 (1000) lives until a (100) ends


@pytest.mark.parametrize("engine", ENGINES)
def test_received_copy__counts_on_the_receiver_until_its_last_consumer(engine):
    graph = toy_graph([("a", 1.0, 300), ("b", 1.0, 20), ("c", 1.0, 5)], [("a", "b", 300), ("b", "c", 20)])
    result = run(graph, toy_machine(), ["gpu:0", "gpu:1", "gpu:1"], engine)
    # gpu:1 holds a's copy (300, from the transfer's start) while b runs (+20): 320; then c: 300 freed, 20 + 5
    assert result.peak_bytes.tolist() == [0, 300, 320]


@pytest.mark.parametrize("engine", ENGINES)
def test_timeline__records_each_buffers_allocating_and_freeing_round(engine):
    # a(1s) -> z(0s) -> b(1s) on gpu:0; a -> c(1s) on gpu:1, 1 GB (1 s). Buffers: a, z, b, c, then a's copy.
    graph = toy_graph([("a", 1.0, 10), ("z", 0.0, 20), ("b", 1.0, 30), ("c", 1.0, 40)],
                      [("a", "z", 10), ("z", "b", 20), ("a", "c", GB)])
    timeline = run(graph, toy_machine(), ["gpu:0", "gpu:0", "gpu:0", "gpu:1"], engine).timeline
    # round 0 (0 s): a starts. 1 (1 s): a ends; z and the copy start. 2 (1 s): z ends (a 0 s op ends in a later
    # round of its instant); b starts. 3 (2 s): b and the copy end: a, z and b freed; c starts. 4 (3 s): c ends.
    assert timeline.round_s.tolist() == [0.0, 1.0, 1.0, 2.0, 3.0]
    assert timeline.buffer_op.tolist() == [0, 1, 2, 3, 0] and timeline.buffer_device.tolist() == [1, 1, 1, 2, 2]
    assert timeline.buffer_bytes.tolist() == [10, 20, 30, 40, GB]
    assert timeline.buffer_alloc_round.tolist() == [0, 1, 2, 3, 1]
    assert timeline.buffer_free_round.tolist() == [3, 3, 3, 4, 4]
    assert timeline.buffer_alloc_s.tolist() == [0.0, 1.0, 1.0, 2.0, 1.0]
    assert timeline.buffer_free_s.tolist() == [2.0, 2.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_oom_placement__is_a_status_with_the_runtime_still_computed(engine):
    graph = toy_graph([("a", 1.0, 100), ("v", 0.0, 400), ("b", 2.0, 200), ("c", 3.0, 50)],
                      [("a", "b", 100), ("v", "b", 400), ("b", "c", 200)],
                      kinds=["MatMul", "Variable", "MatMul", "MatMul"], param_bytes=np.array([0, 1000, 0, 0]))
    result = run(graph, toy_machine(memory_bytes=1200), ["gpu:0"] * 4, engine)
    assert result.status == "oom" and result.runtime_s == 6.0
    assert result.peak_bytes[1] == 1300 and result.capacity_bytes[1] == 1200


@pytest.mark.parametrize("engine", ENGINES)
def test_ready_order__ready_time_then_topological_position(engine):
    # x(1s) and y(1s) are both ready at 0 on one device: x first (earlier in topological order), then y.
    # z needs x only, so it is ready at 1 but y (ready at 0) goes first.
    graph = toy_graph([("x", 1.0, 0), ("y", 1.0, 0), ("z", 1.0, 0)], [("x", "z", 1)])
    result = run(graph, toy_machine(), ["gpu:0"] * 3, engine)
    assert result.timeline.op_start_s.tolist() == [0.0, 1.0, 2.0]


def test_op_class__torch_and_tensorflow_kinds():
    assert op_class("aten.mm.default") == op_class("MatMul") == op_class("Conv2D") == "dense"
    assert op_class("Gemm") == op_class("Convolution") == op_class("GroupConvolution") == "dense"  # ONNX, OpenVINO
    assert op_class("Convert") == op_class("ConvertLike") == op_class("Erf") == "elementwise"  # casts, no conv
    assert op_class("ShapeOf") == op_class("Unsqueeze") == "meta"
    assert op_class("aten.relu.default") == op_class("AddV2") == op_class("ResourceApplyAdam") == "elementwise"
    assert op_class("aten.view.default") == op_class("Variable") == op_class("Identity") == "meta"
    assert op_class("aten._softmax.default") == op_class("Transpose") == op_class("Mean") == "other"


def test_op_class__fused_attention_kernels_are_dense():
    """Their work is two matmuls (and a softmax): costed at the dense rate, not at "other"'s half (torch's CPU and
    GPU kernels and their backward, OpenVINO's ScaledDotProductAttention, ONNX Attention)."""
    kinds = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
             "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
             "aten._scaled_dot_product_efficient_attention.default", "aten._efficient_attention_backward.default",
             "ScaledDotProductAttention", "Attention")
    assert {op_class(kind) for kind in kinds} == {"dense"}


def test_op_class__torch_set_is_a_view_and_resize_a_copy():
    """``set_`` only points a tensor at other storage (no kernel); a growing ``resize_`` copies into new storage
    (the recorder gives a non-growing one 0 bytes). ONNX's Resize is an interpolation, not a copy."""
    assert op_class("aten.set_.source_Tensor") == op_class("aten.set_.source_Storage") == "meta"
    assert op_class("aten.resize_.default") == op_class("aten.resize_as_.default") == "elementwise"
    assert op_class("Resize") == "other"


def test_op_time_matrix__roofline_overhead_and_allowed_mask():
    graph = toy_graph([("mm", 2.0, 0), ("add", 0.0, 0)], [], kinds=["MatMul", "AddV2"],
                      allowed_mask=np.array([kind_bit("gpu"), 3], dtype=np.uint8), bytes_accessed=np.array([0.0, 3e12]))
    times = op_time_matrix(graph, toy_machine(num_gpus=1))
    assert times[0].tolist() == [np.inf, 2.0]  # may not run on the CPU; 2e9 flops at 1e9 FLOP/s
    assert times[1].tolist() == [3.0 / 0.8, 3.0]  # memory-bound: 3e12 B at 1e12 B/s (CPU elementwise: 0.8)


def test_profile__overrides_roofline_for_its_model_and_round_trips(tmp_path):
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [("a", "b", 8)])
    profile = OpProfile(np.array(["b", "not-in-graph"], dtype=object), np.array(["toy", "toy"], dtype=object),
                        np.array([0.125, 9.0]))
    umask = os.umask(0o022)
    try:
        saved = [save_profile(profile, tmp_path / name) for name in ("p.json", "p.parquet")]
    finally:
        os.umask(umask)
    assert [oct(path.stat().st_mode & 0o777) for path in saved] == ["0o644", "0o644"]  # not mkstemp's 0600
    for name in ("p.json", "p.parquet"):
        loaded = load_profile(tmp_path / name)
        times = op_time_matrix(graph, toy_machine(num_gpus=1), loaded)
        assert times[:, 1].tolist() == [1.0, 0.125] and times[1, 0] == 0.125
        result = simulate(graph, toy_machine(num_gpus=1), np.array([1, 1]), profile=loaded)
        assert result.runtime_s == 1.125


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_simulator__op_times_given_instead_of_a_profile_time_the_step(engine):
    """A placement problem's op times (made from a profile) simulate as that profile does."""
    from measurers.sim.reference import Simulator

    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [("a", "b", 8)])
    machine = toy_machine(num_gpus=1)
    profile = OpProfile(np.array(["b"], dtype=object), np.array(["toy"], dtype=object), np.array([0.125]))
    times = op_time_matrix(graph, machine, profile)
    given = Simulator(graph, machine, engine=engine, op_time_s=times).run(np.array([1, 1]))
    assert given.runtime_s == Simulator(graph, machine, profile, engine=engine).run(np.array([1, 1])).runtime_s == 1.125
    with pytest.raises(PlacerError, match=r"op_time_s must be a \(2, 2\) array .* got shape \(2, 3\)"):
        Simulator(graph, machine, op_time_s=np.ones((2, 3)))
    with pytest.raises(PlacerError, match="and a profile"):
        Simulator(graph, machine, profile, op_time_s=times)


def test_simulator__op_times_given_are_copied_and_none_counts_where_an_op_may_not_run():
    """Two CPU-only ops timed 1 s on the CPU and 1 ms on the GPU, where they may not run: the lower bound took
    the GPU's 2 ms against steps of 2 s; and a change to the caller's array after made the engines disagree
    (the reference engine read it on every run, the fast one its copy)."""
    from measurers.sim.reference import Simulator

    graph = dataclasses.replace(toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [("a", "b", 8)]),
                                allowed_mask=np.array([1, 1], dtype=np.uint8))  # the CPU only
    machine = toy_machine(num_gpus=1)
    times = np.array([[1.0, 0.001], [1.0, 0.001]])
    fast, reference = (Simulator(graph, machine, engine=e, op_time_s=times) for e in ("fast", "reference"))
    assert fast.lower_bound_s == pytest.approx(2.0, rel=1e-3)
    times[:, 0] = 5.0
    assert fast.run(np.array([0, 0])).runtime_s == reference.run(np.array([0, 0])).runtime_s == pytest.approx(2.0)


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("bad_s, words", [(-5.0, "must be finite and >= 0"), (np.nan, "must be finite and >= 0"),
                                          (np.inf, "must be finite and >= 0"), (1e300, "too extreme to simulate")])
def test_simulator__op_times_given_that_no_step_could_take_are_refused(engine, bad_s, words):
    """Checked only when the cost model made them: NaN or a negative time looped the fast engine forever (or
    crashed it writing a timeline), inf on an allowed device read as one the op may not run on, 1e300 s was
    an "ok" step of inf."""
    from measurers.sim.reference import Simulator

    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [("a", "b", 8)])
    machine = toy_machine(num_gpus=1)
    times = op_time_matrix(graph, machine)
    times[0, 1] = bad_s
    with pytest.raises(PlacerError, match=words):
        Simulator(graph, machine, engine=engine, op_time_s=times)


def test_profile__bad_file_is_one_error(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "entries": [{"op": "a"}]}))
    with pytest.raises(PlacerError, match="missing field 'device_model'"):
        load_profile(path)


def test_profile__a_key_named_twice_is_one_error(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"format": "placer-op-profile", "version": 1, "entries": '
                    '[{"op": "a", "device_model": "toy", "time_s": 1.0, "time_s": 2.0}]}')
    with pytest.raises(PlacerError, match="p.json': 'time_s' is named twice in one object$"):
        load_profile(path)


@pytest.mark.parametrize("graph_hash", [None, 7])
def test_profile__a_graph_hash_that_is_no_string_is_one_error(tmp_path, graph_hash):
    """A hand-written "graph_hash": null was read as the hash "None": "--profile ... was measured on a graph
    with hash None"."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "graph_hash": graph_hash,
                                "entries": [{"op": "a", "device_model": "toy", "time_s": 1.0}]}))
    with pytest.raises(PlacerError, match=f"p.json': field 'graph_hash' must be a string, got {json.dumps(graph_hash)}$"):
        load_profile(path)


def test_profile__parquet_keeps_the_graph_hash_like_json(tmp_path):
    """The Parquet form dropped the hash, so `simulate --profile` took a profile of another graph."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    profile = OpProfile(np.array(["a"], dtype=object), np.array(["toy"], dtype=object), np.array([1.0]), "abc123")
    for name in ("p.json", "p.parquet"):
        assert load_profile(save_profile(profile, tmp_path / name)).graph_hash == "abc123"
    columns = {"op": ["a"], "device_model": ["toy"], "time_s": [1.0]}
    pq.write_table(pa.table(columns), tmp_path / "older.parquet")  # no header: names no graph, as a JSON without one
    assert load_profile(tmp_path / "older.parquet").graph_hash == ""
    header = {b"placer.op_profile": json.dumps({"format": "placer-op-profile", "version": 2}).encode()}
    pq.write_table(pa.table(columns).replace_schema_metadata(header), tmp_path / "v2.parquet")
    with pytest.raises(PlacerError, match="v2.parquet': not a placer-op-profile version 1 file"):
        load_profile(tmp_path / "v2.parquet")


@pytest.mark.parametrize("entry, message", [
    ({"op": "a", "device_model": ["toy"], "time_s": 1.0}, r"entry 1: device_model must be a string, got \['toy'\]"),
    ({"op": {"x": 1}, "device_model": "toy", "time_s": 1.0}, r"entry 1: op must be a string, got \{'x': 1\}"),
    ({"op": 7, "device_model": "toy", "time_s": 1.0}, "entry 1: op must be a string, got 7"),
    ({"op": "a", "device_model": "toy", "time_s": True}, "field 'time_s' must hold numbers, got True"),  # was 1 s
    ({"op": "a", "device_model": "toy", "time_s": "0.25"}, "field 'time_s' must hold numbers, got '0.25'"),
])
def test_profile__entry_that_is_not_a_string_is_one_error(tmp_path, entry, message):
    """Such entries crashed with TypeError (unhashable) while looking for duplicate pairs."""
    path = tmp_path / "p.json"
    entries = [{"op": "b", "device_model": "toy", "time_s": 1.0}, entry]
    path.write_text(json.dumps({"format": "placer-op-profile", "version": 1, "entries": entries}))
    with pytest.raises(PlacerError, match=message) as error:
        load_profile(path)
    assert "p.json" in str(error.value)


def test_profile__parquet_list_column_is_one_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"op": ["a"], "device_model": [["toy"]], "time_s": [1.0]}), tmp_path / "p.parquet")
    with pytest.raises(PlacerError, match=r"p.parquet': op profile: entry 0: device_model must be a string"):
        load_profile(tmp_path / "p.parquet")


def test_profile__folder_is_named_a_folder(tmp_path):
    with pytest.raises(PlacerError, match="is a folder, not a file"):
        load_profile(tmp_path)
    with pytest.raises(PlacerError, match="does not exist"):
        load_profile(tmp_path / "missing.json")


def _extreme_machine(*, device=None, link=None) -> Machine:
    """toy_machine(num_gpus=1) with gpu:0's or every link's figures replaced."""
    from dataclasses import replace

    machine = toy_machine(num_gpus=1)
    devices = tuple(replace(d, **device) if device and d.name == "gpu:0" else d for d in machine.devices)
    links = tuple(replace(l, **link) if link else l for l in machine.links)
    return replace(machine, devices=devices, links=links)


@pytest.mark.parametrize("machine, profile_s, message", [
    (_extreme_machine(device={"peak_flops": 1e-300}), None, "op 'a' .* takes longer than a float can hold on "
     "device 'gpu:0' \\(peak_flops 1e-300"),
    (_extreme_machine(), 1e308, "the ops of graph 'toy' take inf s in all on machine 'toy'"),
    (_extreme_machine(), 1e300, "the ops of graph 'toy' take 2e\\+300 s in all"),  # finite, yet absurd
    (_extreme_machine(link={"latency_s": 1e308}), None, "the transfers of graph 'toy' may take 1e\\+308 s"),
    (_extreme_machine(link={"bandwidth_Bps": 1e-300}), None, "the transfers of graph 'toy' may take 8e\\+300 s"),
])
def test_times_too_extreme_to_simulate__are_one_error_without_numpy_warnings(machine, profile_s, message):
    """Such figures gave a step of inf s (or 1.6e308 s) reported as "ok", and numpy overflow warnings."""
    import warnings

    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [("a", "b", 8)])
    profile = None if profile_s is None else OpProfile(np.array(["a", "b"], dtype=object),
                                                       np.array(["toy", "toy"], dtype=object),
                                                       np.array([profile_s, profile_s]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for engine in ENGINES:
            with pytest.raises(PlacerError, match=message):
                simulate(graph, machine, np.array([1, 2]), engine=engine, profile=profile)


@pytest.mark.parametrize("engine", ENGINES)
def test_link_latency_nan__is_one_error_not_an_endless_loop(engine):
    """``Link`` let latency_s NaN through, and a NaN on any link but the first slipped past the transfer
    check (Python's ``max`` skips it): the step's clock became NaN and both engines looped forever."""
    import copy
    from dataclasses import replace

    from measurers.sim.reference import Simulator

    machine = toy_machine(num_gpus=1)
    with pytest.raises(PlacerError, match="latency not negative, got .* and nan s"):
        replace(machine.links[1], latency_s=float("nan"))  # Link refuses it now; the simulator checks too:
    nan_link = copy.copy(machine.links[1])
    object.__setattr__(nan_link, "latency_s", float("nan"))  # a Link made past its check
    machine = replace(machine, links=(machine.links[0], nan_link))
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [("a", "b", 8)])
    with pytest.raises(PlacerError, match="the transfers of graph 'toy' may take nan s"):
        Simulator(graph, machine, engine=engine)  # never run: without the check, run([1, 0]) does not return


@pytest.mark.parametrize("engine", ENGINES)
def test_memory_totals_past_int64__are_one_error(engine):
    """Parameters, outputs and edges each below the graph's 2**62 limit, but live together on one device:
    the fast engine's int64 counter wrapped (peak 2**63 - 2**41 reported, not 3 * B) and the reference
    raised an OverflowError."""
    from measurers.sim.reference import Simulator

    big = 2**62 - 2**40
    graph = toy_graph([("a", 1.0, big), ("b", 1.0, 8), ("c", 1.0, 8)], [("a", "c", 8), ("b", "c", big)],
                      param_bytes=np.array([big, 0, 0]))
    with pytest.raises(PlacerError, match="more than the simulator's int64 memory counters hold"):
        Simulator(graph, toy_machine(), engine=engine)

def test_check_placement__wrong_length_range_and_kind():
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [], allowed_mask=np.array([2, 3], dtype=np.uint8))
    machine = toy_machine(num_gpus=1)
    assert check_placement(graph, machine, [1, 0]).tolist() == [1, 0]
    with pytest.raises(PlacerError, match="2 ops"):
        check_placement(graph, machine, [1])
    with pytest.raises(PlacerError, match="devices 0..1"):
        check_placement(graph, machine, [1, 5])
    with pytest.raises(PlacerError, match="'a'.*may not run on"):
        check_placement(graph, machine, [0, 0])


def test_check_placement__ragged_or_huge_unsigned_is_one_error_and_measure_does_not_raise():
    """A ragged nested list raised numpy's ValueError (out of ``SimulatorMeasurer.measure`` too), and a
    uint64 index of 2**63 + 1 was reported as device -9223372036854775807."""
    from measurers.sim.measurer import SimulatorMeasurer

    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [])
    machine = toy_machine(num_gpus=1)
    with pytest.raises(PlacerError, match="not a flat sequence of device indices"):
        check_placement(graph, machine, [[0], [1, 1]])
    with pytest.raises(PlacerError, match="device 9223372036854775809, but"):
        check_placement(graph, machine, np.array([2**63 + 1, 0], dtype=np.uint64))
    assert check_placement(graph, machine, np.array([1, 0], dtype=np.uint64)).tolist() == [1, 0]
    (bad,) = SimulatorMeasurer(graph, machine).measure([[[0], [1, 1]]])
    assert bad.status == "error" and "flat sequence" in bad.error

def test_placement_file__per_op_per_group_and_by_name(tmp_path):
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0), ("c", 1.0, 0)], [], colocation=np.array([0, 0, 2]))
    machine = toy_machine()
    cases = {"ops.json": ["gpu:0", "gpu:0", "gpu:1"], "groups.json": {"groups": ["gpu:0", "gpu:1"]},
             "names.json": {"ops": {"a": "gpu:0", "b": "gpu:0", "c": 2}}, "bare.json": ["gpu:0", "gpu:1"]}
    for name, data in cases.items():
        (tmp_path / name).write_text(json.dumps(data))
        assert load_placement_file(tmp_path / name, graph, machine).tolist() == [1, 1, 2], name
    saved = save_placement_file(tmp_path / "saved.json", graph, machine, [0, 0, 1])
    assert load_placement_file(saved, graph, machine).tolist() == [0, 0, 1]


@pytest.mark.parametrize("data, message", [
    (["gpu:0"] * 4, "4 entries"), (["gpu:0", "tpu:0", "gpu:0"], "no device 'tpu:0'"),
    ({"ops": {"a": "gpu:0"}}, "'b' has no device"), ({"groups": ["gpu:0"]}, "'groups' has 1 entries"),
    ({"ops": ["gpu:0"] * 3, "graph_hash": "deadbeef"}, "written for a graph with hash 'deadbeef'"),
    ({"ops": ["gpu:0"] * 3, "graph": "other"}, "written for graph 'other', not 'toy'"),
    ({"ops": ["gpu:0"] * 3, "machine": "paper-8gpu"}, "written for machine 'paper-8gpu', not 'toy'"),
    ({"ops": ["gpu:0"] * 3, "machine": 4}, "'machine' must be a string, got 4"),
])
def test_placement_file__bad_content_is_one_error_naming_the_file(tmp_path, data, message):
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0), ("c", 1.0, 0)], [])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlacerError, match=message) as error:
        load_placement_file(path, graph, toy_machine())
    assert "bad.json" in str(error.value)


@pytest.mark.parametrize("text, key", [('{"ops": {"a": 1, "b": 1, "c": 1, "a": 0}}', "a"),
                                       ('{"ops": ["gpu:0", "gpu:0", "gpu:0"], "machine": "toy", "machine": "x"}',
                                        "machine")])
def test_placement_file__a_key_named_twice_is_one_error(tmp_path, text, key):
    """An op named twice in {"ops": {...}} ran where its last entry said, the first dropped without a word."""
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0), ("c", 1.0, 0)], [])
    (tmp_path / "twice.json").write_text(text)
    with pytest.raises(PlacerError, match=f"twice.json': '{key}' is named twice in one object$"):
        load_placement_file(tmp_path / "twice.json", graph, toy_machine())


@pytest.mark.parametrize("text", ["[" + "1" * 5000 + ", 0, 0]", "[" * 100_000 + "]" * 100_000])
def test_placement_file__json_past_pythons_limits_is_one_error(tmp_path, text):
    """Python's json refuses 4,300+ digits (ValueError) and deep nesting (RecursionError): one error."""
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0), ("c", 1.0, 0)], [])
    (tmp_path / "big.json").write_text(text)
    with pytest.raises(PlacerError, match="big.json' is not readable JSON"):
        load_placement_file(tmp_path / "big.json", graph, toy_machine())


def test_simulator_measurer__noise_off_median_and_statuses():
    from measurers.sim.measurer import SimulatorMeasurer

    graph = toy_graph([("a", 1.0, 100), ("b", 2.0, 0)], [("a", "b", 100)])
    measurer = SimulatorMeasurer(graph, toy_machine(memory_bytes=50), runs=3)
    on_cpu, on_gpu, bad = measurer.measure([np.array([0, 0]), np.array([1, 1]), np.array([0, 9])])
    assert on_cpu.samples_s == (6.0, 6.0, 6.0) and on_cpu.runtime_s == 6.0 and on_cpu.status == "oom"
    assert on_gpu.runtime_s == 3.0 and on_gpu.peak_bytes == (0, 100, 0)
    assert bad.status == "error" and "device 9" in bad.error and bad.runtime_s == np.inf


def test_simulator_measurer__seeded_noise_is_repeatable_and_reported_as_median():
    from measurers.sim.measurer import SimulatorMeasurer

    graph = toy_graph([("a", 1.0, 0), ("b", 2.0, 0)], [("a", "b", 8)])

    def sample(seed):
        return SimulatorMeasurer(graph, toy_machine(), runs=5, noise_std=0.1, seed=seed).measure([np.array([1, 1])])[0]

    first, again, other = sample(4), sample(4), sample(5)
    assert first.samples_s == again.samples_s != other.samples_s
    assert first.runtime_s == float(np.median(first.samples_s)) and len(set(first.samples_s)) == 5
    assert all(abs(s / 3.0 - 1) < 0.6 for s in first.samples_s)


def test_simulator_measurer__noise_depends_on_placement_not_on_call_order():
    from measurers.sim.measurer import SimulatorMeasurer

    graph = toy_graph([("a", 1.0, 0), ("b", 2.0, 0)], [("a", "b", 8)])
    p, q = np.array([1, 1]), np.array([1, 2])
    forward = SimulatorMeasurer(graph, toy_machine(), runs=3, noise_std=0.1, seed=7).measure([p, q])
    backward = SimulatorMeasurer(graph, toy_machine(), runs=3, noise_std=0.1, seed=7).measure([q, p])
    assert forward[0].samples_s == backward[1].samples_s and forward[1].samples_s == backward[0].samples_s


@pytest.mark.parametrize("options, message", [
    ({"noise_std": float("inf")}, "noise_std must be a number from 0 to 10, got inf"),
    ({"noise_std": -0.1}, "noise_std must be a number from 0 to 10"),
    ({"noise_std": 1000.0}, "noise_std must be a number from 0 to 10, got 1000.0"),
    ({"noise_std": float("nan")}, "noise_std must be a number from 0 to 10, got nan"),
    ({"runs": 1.5}, "runs must be a whole number of at least 1, got 1.5"),
    ({"runs": 0}, "runs must be a whole number of at least 1, got 0"),
    ({"seed": -1, "noise_std": 0.1}, "seed must be a whole number >= 0, got -1"),
])
def test_simulator_measurer__bad_noise_or_runs_is_one_error(options, message):
    """Infinite noise used to pass, and a step of 0 s came out of samples (0, inf, 0)."""
    from conftest import build_graph
    from measurers.catalog import load_machine
    from measurers.sim.measurer import SimulatorMeasurer

    with pytest.raises(PlacerError, match=message):
        SimulatorMeasurer(build_graph([(0, 1)]), load_machine("paper-2gpu"), **options)


def test_placement_file__a_synthetic_graph_named_without_its_seed_is_the_seed_0_graph(tmp_path):
    from graphs.registry import load_graph
    from measurers.catalog import load_machine

    graph, machine = load_graph("synthetic:30"), load_machine("paper-2gpu")
    assert graph.name == "synthetic:30:0"
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"graph": "synthetic:30", "ops": ["gpu:0"] * 30}))
    assert load_placement_file(path, graph, machine).tolist() == [1] * 30
    path.write_text(json.dumps({"graph": "synthetic:30:1", "ops": ["gpu:0"] * 30}))
    with pytest.raises(PlacerError, match="written for graph 'synthetic:30:1', not 'synthetic:30:0'"):
        load_placement_file(path, graph, machine)


def test_chrome_trace__a_result_of_another_graph_or_machine_is_refused():
    """A paper-2gpu result traced with paper-4gpu was labelled with that machine's links; one of a larger
    graph failed on an index."""
    from graphs.synthetic import synthetic_graph
    from measurers.catalog import load_machine
    from measurers.sim.reference import Simulator
    from measurers.sim.trace import chrome_trace

    graph, machine = synthetic_graph(50, seed=1), load_machine("paper-2gpu")
    result = Simulator(graph, machine).run(np.arange(50) % 3, timeline=True)
    assert len(chrome_trace(graph, machine, result)["traceEvents"]) > graph.num_ops
    for other_graph, other_machine in ((graph, load_machine("paper-4gpu")), (synthetic_graph(7, seed=1), machine)):
        with pytest.raises(PlacerError, match=f"the result is not of graph {other_graph.name!r} on machine "
                                              f"{other_machine.name!r}"):
            chrome_trace(other_graph, other_machine, result)


def test_op_time_matrix__memory_bound_op_uses_the_devices_memory_efficiency():
    """Zero-flop ops of 3e12 bytes on a GPU of 1e12 B/s at memory_efficiency 0.5 (overhead 1e-6 s): an
    elementwise op takes 3e12 / (1e12 * 0.5) + 1e-6 s, an "other" one (bandwidth factor 0.7) 3e12 /
    (1e12 * 0.5 * 0.7) + 1e-6 s. 3 s or 4.29 s would mean the device's memory efficiency was left out."""
    graph = toy_graph([("add", 0.0, 0), ("mean", 0.0, 0)], [], kinds=["AddV2", "Mean"],
                      bytes_accessed=np.array([3e12, 3e12]))
    device = Device("gpu:0", "gpu", "toy", peak_flops=1e9, mem_bandwidth_Bps=1e12, memory_bytes=GB,
                    op_overhead_s=1e-6, compute_efficiency=0.25, memory_efficiency=0.5)
    times = op_time_matrix(graph, Machine("half-bandwidth", (device,), ()))
    assert times[0, 0] == pytest.approx(3e12 / (1e12 * 0.5) + 1e-6, rel=1e-12)
    assert times[1, 0] == pytest.approx(3e12 / (1e12 * 0.5 * 0.7) + 1e-6, rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_oom__a_peak_equal_to_the_capacity_fits_and_one_byte_less_does_not(engine):
    """The graph of test_memory_peak (peak 1300 bytes on gpu:0): with exactly 1300 bytes per device the step
    is "ok"; with 1299 it is "oom". "oom" at 1300 would mean memory that fills a device exactly was refused."""
    graph = toy_graph([("a", 1.0, 100), ("v", 0.0, 400), ("b", 2.0, 200), ("c", 3.0, 50)],
                      [("a", "b", 100), ("v", "b", 400), ("b", "c", 200)],
                      kinds=["MatMul", "Variable", "MatMul", "MatMul"], param_bytes=np.array([0, 1000, 0, 0]))
    exact = run(graph, toy_machine(memory_bytes=1300), ["gpu:0"] * 4, engine)
    assert exact.status == "ok" and exact.peak_bytes[1] == exact.capacity_bytes[1] == 1300
    short = run(graph, toy_machine(memory_bytes=1299), ["gpu:0"] * 4, engine)
    assert short.status == "oom" and short.peak_bytes[1] == 1300 and short.capacity_bytes[1] == 1299


def test_check_placement__device_index_equal_to_the_number_of_devices_is_refused():
    """Devices are 0..D-1: index D (here 2, one past gpu:0) is a PlacerError naming the op and the device,
    not an IndexError from the kind lookup nor a placement let through."""
    graph = toy_graph([("a", 1.0, 0), ("b", 1.0, 0)], [])
    machine = toy_machine(num_gpus=1)
    with pytest.raises(PlacerError, match=r"placement puts op 'b' on device 2, but machine 'toy' has devices 0\.\.1"):
        check_placement(graph, machine, [1, 2])
    with pytest.raises(PlacerError, match=r"op 'a' on device 2,"):
        check_placement(graph, machine, np.array([2, 0], dtype=np.uint64))
