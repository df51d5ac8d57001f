"""From a run folder to the user's own training run: the placed step trains exactly as the unplaced one,
another model is refused by its graph hash, and `placer apply` summarizes the placement."""

import functools
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cluster.apply import apply_keras, apply_torch
from cluster.cli import main
from cluster.pool import PoolResult
from cluster.runlog import LoggedPlacement, RunLogWriter, make_run_id, new_manifest
from conftest import one_placer_error
from fixtures.tiny_models import tiny_keras_classifier, tiny_torch_classifier
from graphs.errors import PlacerError
from graphs.io import save_graph
from graphs.torch.importer import import_torch_spec
from measurers.base import Measurement
from measurers.catalog import load_machine
from measurers.machine import Device, Link, Machine

TORCH_SPEC = "tests/fixtures/tiny_models.py:tiny_torch_classifier"
KERAS_SPEC = "tests/fixtures/tiny_models.py:tiny_keras_classifier"


def all_cpu(machine):
    """Every machine device mapped to the CPU: logical devices stay distinct, so copies still happen."""
    return ["cpu"] * machine.num_devices


def three_cpus() -> Machine:
    devices = tuple(Device(f"cpu:{i}", "cpu", "test-cpu", 1e11, 1e10, 2**30, 1e-6) for i in range(3))
    links = tuple(Link(a.name, b.name, 1e9, 1e-6, f"{a.name}>{b.name}") for a in devices for b in devices if a != b)
    return Machine("three-cpus", devices, links)


def spread_over_groups(graph, num_devices: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(G,) device per colocation group, using every device, and (N,) group of each op."""
    groups = graph.colocation_ids
    rng = np.random.default_rng(seed)
    while True:
        devices = rng.integers(0, num_devices, groups.max() + 1)
        if len(set(devices[groups].tolist())) == num_devices:
            return devices, groups


def write_run(root, graph, graph_file, machine, group_devices=None, group_of_op=None):
    """A run folder as `placer search` leaves it: manifest, the group map and one ok measurement of
    ``group_devices`` (no measurement at all when it is None)."""
    manifest = new_manifest(make_run_id(graph.name, "random", 0), graph, machine, seed=0, policy="random",
                            config={"graph": str(graph_file)}, command=["placer", "search"], runs=1, warmup=0)
    with RunLogWriter.create(root, manifest) as log:
        log.write_groups(group_of_op if group_of_op is not None else graph.colocation_ids, graph.op_names)
        if group_devices is not None:
            now = time.time()
            measurement = Measurement(1e-3, (1e-3,), "ok", (0,) * machine.num_devices, 0.01)
            log.append(PoolResult(0, group_devices[group_of_op], measurement, "a0", "n0", now, now, now,
                                  policy="random", log_placement=LoggedPlacement(group_devices, "group")))
    return log.folder


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory, one_torch_thread):
    """A run of the classifier's imported graph on paper-2gpu whose best placement uses all three devices."""
    root = tmp_path_factory.mktemp("torch-run")
    graph = import_torch_spec(TORCH_SPEC)
    graph_file = save_graph(graph, root / "classifier.parquet")
    machine = load_machine("paper-2gpu")
    devices, groups = spread_over_groups(graph, machine.num_devices, seed=3)
    return write_run(root, graph, graph_file, machine, devices, groups), graph


def batches(count: int, seed: int = 7) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 8, generator=generator), torch.randint(0, 3, (4,), generator=generator))
            for _ in range(count)]


def unplaced_training(data: list, seed: int):
    """The user's own loop: one device, a fresh Adam, the same model drawn from the same seed."""
    torch.manual_seed(seed)
    model, _ = tiny_torch_classifier()
    optimizer = torch.optim.Adam(model.parameters())
    losses = []
    for x, y in data:
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_apply_torch__placed_training_matches_unplaced_training(torch_run):
    run_dir, _ = torch_run
    data = batches(5)
    ref_losses, ref_params = unplaced_training(data, seed=11)
    torch.manual_seed(11)
    step = apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)
    initial = {name: p.clone() for name, p in step.parameters().items()}
    losses = [float(step(x, y)) for x, y in data]
    assert len(set(step.placement.tolist())) == 3 and step.copies > 0  # tensors really cross devices
    assert losses == pytest.approx(ref_losses, rel=1e-6)
    params = step.parameters()
    assert set(params) == set(ref_params)
    for name, value in params.items():
        assert torch.allclose(value, ref_params[name], rtol=1e-5, atol=1e-7), name
        assert not torch.equal(value, initial[name]), name  # trained (Adam's bias correction follows the steps)
    model, _ = tiny_torch_classifier()
    step.copy_to(model)
    assert all(torch.equal(p, params[name]) for name, p in model.named_parameters())


def test_apply_torch__copy_to_a_model_named_or_shaped_otherwise_is_refused_and_writes_nothing(torch_run):
    """A wrapped model (``nn.Sequential(model)``: names ``0.fc1.weight``...) got none of the trained weights and
    no word of it; one of another width was left half-written by torch's error (a review)."""
    run_dir, _ = torch_run
    step = apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)
    wrapped = torch.nn.Sequential(tiny_torch_classifier()[0])
    wider = tiny_torch_classifier(hidden=32)[0]
    for model, message in ((wrapped, r"copy_to: the model has no 'fc1.weight', 'fc1.bias', 'fc2.weight' and \d+ "
                                     r"more \(\d+ of the step's \d+ parameters and buffers\)"),
                           (wider, r"copy_to: the model's shapes differ from the step's: 'fc1.weight' \(32, \d+\), "
                                   r"not \(\d+, \d+\), .*; nothing was written")):
        before = {name: value.clone() for name, value in model.state_dict().items()}
        with pytest.raises(PlacerError, match=message):
            step.copy_to(model)
        assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())


def test_apply_torch__a_model_of_another_width_is_refused_naming_the_hash(torch_run):
    run_dir, graph = torch_run
    wider = functools.partial(tiny_torch_classifier, hidden=32)
    with pytest.raises(PlacerError, match="graph hash") as caught:
        apply_torch(run_dir, wider, torch_devices=all_cpu)
    assert graph.content_hash in str(caught.value) and "tiny_torch_classifier" in str(caught.value)


def test_apply_torch__an_op_placement_array_needs_its_machine_and_the_right_length(torch_run):
    _, graph = torch_run
    placement = np.zeros(graph.num_ops, dtype=np.int64)
    with pytest.raises(PlacerError, match="needs its machine"):
        apply_torch(placement, tiny_torch_classifier)
    with pytest.raises(PlacerError, match="placement has shape"):
        apply_torch(placement[:-1], tiny_torch_classifier, machine="paper-2gpu", torch_devices=all_cpu)
    step = apply_torch(placement, tiny_torch_classifier, machine="paper-2gpu", torch_devices=all_cpu)
    assert np.isfinite(float(step())) and step.copies == 0  # one device: nothing crosses


def test_apply_torch__a_device_torch_cannot_parse_and_a_negative_learning_rate_are_refused(torch_run):
    run_dir, _ = torch_run
    with pytest.raises(PlacerError, match="torch_devices gave 'gpu:7', not a torch device"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=lambda machine: ["cpu", "cpu", "gpu:7"])
    with pytest.raises(PlacerError, match=r"optimizer options \{'lr': -1.0\}"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu, optimizer_options={"lr": -1.0})


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_apply_torch__a_cuda_device_torch_lacks_is_refused_naming_it(torch_run):
    """An AssertionError from deep inside torch ("Torch not compiled with CUDA enabled") when the step was built."""
    run_dir, _ = torch_run
    with pytest.raises(PlacerError, match="torch_devices gave 'cuda:0', but torch sees only 0 CUDA devices"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=lambda machine: ["cpu", "cuda:0", "cuda:1"])


@pytest.mark.parametrize("device, message", [
    ("meta", "torch_devices gave 'meta': the meta device holds no data"),
    pytest.param("xpu", "torch_devices gave 'xpu', which this torch cannot use", marks=pytest.mark.skipif(
        hasattr(torch, "xpu") and torch.xpu.is_available(), reason="needs a torch without XPU")),
])
def test_apply_torch__a_device_this_torch_cannot_run_is_refused_naming_it(torch_run, device, message):
    """xpu: an AssertionError from inside torch ("Torch not compiled with XPU enabled") as the step was built;
    meta: accepted, then the first step failed (Tensor.item() cannot be called on meta tensors)."""
    run_dir, _ = torch_run
    with pytest.raises(PlacerError, match=message):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=lambda machine: ["cpu", "cpu", device])


@pytest.mark.parametrize("option", ["capturable", "differentiable"])
def test_apply_torch__an_optimizer_option_torch_refuses_at_its_first_step_is_one_error(torch_run, option):
    """capturable off CUDA was an AssertionError, differentiable a RuntimeError (an in-place update of a leaf)."""
    run_dir, _ = torch_run
    with pytest.raises(PlacerError, match=f"optimizer options {{'{option}': True}}"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu, optimizer_options={option: True})


def test_apply_torch__inputs_of_another_shape_are_refused(torch_run):
    run_dir, _ = torch_run
    step = apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)
    with pytest.raises(PlacerError, match=r"input 0 must be a tensor of shape \(4, 8\)"):
        step(torch.randn(5, 8), torch.zeros(5, dtype=torch.int64))


def test_apply_torch__misuse_of_the_step_or_its_device_mapping_is_one_placer_error(torch_run):
    """copy_to(None), a torch_devices that returns None, an input on the meta device: an AttributeError, a
    TypeError and torch's NotImplementedError ("Cannot copy out of meta tensor") from deep inside."""
    run_dir, _ = torch_run
    for mapping in (lambda machine: None, lambda machine: "cpu"):
        with pytest.raises(PlacerError, match="torch_devices must return a list of devices, one per device of "
                                              "machine 'paper-2gpu'"):
            apply_torch(run_dir, tiny_torch_classifier, torch_devices=mapping)
    step = apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)
    with pytest.raises(PlacerError, match="copy_to takes a torch.nn.Module, got NoneType"):
        step.copy_to(None)
    x, y = batches(1)[0]
    with pytest.raises(PlacerError, match="input 0 is on the meta device"):
        step(x.to("meta"), y)

    def meta_example():
        model, (x, y) = tiny_torch_classifier()
        return model, (x.to("meta"), y)

    with pytest.raises(PlacerError, match="an example input is on the meta device"):
        apply_torch(run_dir, meta_example, torch_devices=all_cpu)


def test_apply__a_run_without_a_best_placement_is_refused(tmp_path):
    graph = import_torch_spec(TORCH_SPEC)
    run_dir = write_run(tmp_path, graph, tmp_path / "missing.parquet", load_machine("paper-2gpu"))
    with pytest.raises(PlacerError, match="no best placement .*no placement has been measured ok yet"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)
    (run_dir / "result.json").write_text("{}")  # finished: every placement it measured failed, none comes later
    with pytest.raises(PlacerError, match="it finished without one: no placement it measured ran"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)
    (run_dir / "best_placement.json").write_text("[0, 1")
    with pytest.raises(PlacerError, match=r"best_placement\.json is damaged"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)


def test_apply__a_best_placement_file_removed_from_a_run_whose_log_has_one_says_so(torch_run, tmp_path):
    """It said the run "finished without one: no placement it measured ran", which its log contradicted."""
    run_dir = tmp_path / torch_run[0].name
    shutil.copytree(torch_run[0], run_dir)
    (run_dir / "best_placement.json").unlink()
    (run_dir / "result.json").write_text("{}")
    with pytest.raises(PlacerError, match="no best placement .*its log holds 1 placement measured ok, so the file "
                                          "was removed or lost"):
        apply_torch(run_dir, tiny_torch_classifier, torch_devices=all_cpu)


# ---- Keras ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory):
    """A run of the Keras classifier's graph (imported as in a fresh process, batch 8) on three CPUs."""
    keras = pytest.importorskip("keras")
    from graphs.tf.importer import import_keras_spec

    root = tmp_path_factory.mktemp("keras-run")
    keras.backend.clear_session()  # layer and op names are numbered per session, as in a fresh import
    graph = import_keras_spec(KERAS_SPEC, batch_size=8)
    machine = three_cpus()
    devices, groups = spread_over_groups(graph, machine.num_devices, seed=1)
    return write_run(root, graph, save_graph(graph, root / "keras.parquet"), machine, devices, groups), graph


def keras_batches(count: int) -> list:
    rng = np.random.default_rng(5)
    return [(rng.standard_normal((8, 8)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32))
            for _ in range(count)]


def unplaced_keras_training(data: list, seed: int):
    import keras
    import tensorflow as tf

    from graphs.tf.importer import keras_train_step

    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    model = tiny_keras_classifier()
    train_step = tf.function(keras_train_step(model)[0], autograph=False)
    losses = [float(train_step(x, y)) for x, y in data]
    return losses, [w.numpy() for w in model.weights]


def test_apply_keras__placed_training_matches_unplaced_training(keras_run):
    run_dir, _ = keras_run
    data = keras_batches(4)
    ref_losses, ref_weights = unplaced_keras_training(data, seed=0)
    with apply_keras(run_dir, tiny_keras_classifier, batch_size=8, seed=0) as step:
        losses = [step(x, y) for x, y in data]
        assert len(set(step.placement.tolist())) == 3
        step.copy_to_model()
        weights = [w.numpy() for w in step.model.weights]
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert losses[-1] != losses[0]
    for got, want in zip(weights, ref_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def keras_2gpu_run(keras_run, tmp_path_factory):
    """The Keras classifier's run placed on paper-2gpu (a CPU and two GPUs), every device used."""
    _, graph = keras_run
    root = tmp_path_factory.mktemp("keras-2gpu-run")
    machine = load_machine("paper-2gpu")
    devices, groups = spread_over_groups(graph, machine.num_devices, seed=1)
    return write_run(root, graph, save_graph(graph, root / "keras.parquet"), machine, devices, groups)


def logical_cpus(machine):
    """Machine device k on the k-th CPU of the step's Session (logical CPUs: copies between them still happen)."""
    return [f"/device:CPU:{k}" for k in range(machine.num_devices)]


@pytest.mark.parametrize("tf_devices, cpus_used", [(logical_cpus, 3), (lambda machine: ["cpu:0"] * 3, 1)],
                         ids=["logical-cpus", "one-cpu"])
def test_apply_keras__a_gpu_placement_mapped_to_cpus_trains_as_unplaced(keras_2gpu_run, tf_devices, cpus_used):
    """A placement for paper-2gpu on a machine without GPUs: refused as the measurer maps devices, and with
    every device mapped to a CPU it trains as the unplaced step does (placing was a PlacerError before)."""
    import tensorflow as tf

    data = keras_batches(3)
    ref_losses, ref_weights = unplaced_keras_training(data, seed=0)
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(PlacerError, match="need 2 GPUs but TensorFlow sees only 0"):
            apply_keras(keras_2gpu_run, tiny_keras_classifier, batch_size=8)
    with apply_keras(keras_2gpu_run, tiny_keras_classifier, batch_size=8, tf_devices=tf_devices) as step:
        assert len(set(step.placement.tolist())) == 3
        losses = [step(x, y) for x, y in data]
        step.copy_to_model()
        weights = [w.numpy() for w in step.user.model.weights]
        ran_on = {stats.device.split("/")[-1] for stats in step.session.step(trace=True).step_stats.dev_stats}
    assert ran_on == {f"device:CPU:{k}" for k in range(cpus_used)}  # TensorFlow's record of where nodes ran
    assert losses == pytest.approx(ref_losses, rel=1e-5) and losses[-1] != losses[0]
    for got, want in zip(weights, ref_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("tf_devices, message", [
    (lambda machine: ["cpu:0"] * 2, "tf_devices gave 2 devices for the 3 of machine 'paper-2gpu'"),
    (lambda machine: ["cpu:0", "cpu:1", "gpu-7"], "tf_devices gave 'gpu-7', not a TensorFlow device"),
    (lambda machine: ["cpu:0", "cpu:1", "/device:TPU:0"], "tf_devices gave '/device:TPU:0', not a CPU or GPU"),
    (lambda machine: ["cpu:0", "cpu:1", "/job:worker/device:CPU:0"], "not a CPU or GPU of this process"),
], ids=["too-few", "unparsable", "tpu", "another-job"])
def test_apply_keras__a_device_mapping_tensorflow_cannot_use_is_refused_naming_it(keras_2gpu_run, tf_devices,
                                                                                   message):
    with pytest.raises(PlacerError, match=message):
        apply_keras(keras_2gpu_run, tiny_keras_classifier, batch_size=8, tf_devices=tf_devices)


def test_apply_keras__a_closed_step_and_a_mapping_that_returns_none_are_refused(keras_run):
    """A closed step's call, variables() and copy_to_model() were TensorFlow's RuntimeError "Attempted to use a
    closed Session"; tf_devices returning None a TypeError."""
    run_dir, _ = keras_run
    with pytest.raises(PlacerError, match="tf_devices must return a list of devices"):
        apply_keras(run_dir, tiny_keras_classifier, batch_size=8, tf_devices=lambda machine: None)
    with apply_keras(run_dir, tiny_keras_classifier, batch_size=8, seed=0) as step:
        assert np.isfinite(step())
    for use in (step, step.variables, step.copy_to_model):
        with pytest.raises(PlacerError, match=r"the placed Keras step was closed .* call copy_to_model\(\) before"):
            use()
    step.close()  # a second close is harmless


def test_apply_keras__inputs_nested_otherwise_or_of_a_dtype_that_would_change_are_refused(keras_run):
    """A dict of targets with a misspelt key trained on (a list was fed in the dict's sorted key order), and
    float targets for int classes were truncated: 0.7 more on every label gave the loss of the labels."""
    run_dir, _ = keras_run
    x, y = keras_batches(1)[0]
    with apply_keras(run_dir, tiny_keras_classifier, batch_size=8, seed=0) as step:
        with pytest.raises(PlacerError, match=r"inputs and targets must be nested as .* \(\(array, array\)\), not "
                                              r"as given \(\(array, \[array\]\)\)$") as refused:
            step(x, [y])
        assert "\n" not in str(refused.value) and len(str(refused.value)) < 300  # no arrays printed
        with pytest.raises(PlacerError, match=r"not as given \(a dict and a ndarray\)$"):  # tf.nest cannot sort it
            step({1: x, "a": x}, y)
        with pytest.raises(PlacerError, match="array 1 of the step holds float64, which int32 .* cannot hold"):
            step(x, y + 0.7)
        assert np.isfinite(step(x.astype(np.float64), y.astype(np.int64)))  # same kind: cast as before


def test_apply_keras__a_model_of_another_width_is_refused_naming_the_hash(keras_run):
    import keras

    run_dir, graph = keras_run

    def wider_classifier():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu", name="fc1"),
                                  keras.layers.Dense(5, name="logits")], name="tiny_keras_classifier")
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    with pytest.raises(PlacerError, match="graph hash") as caught:
        apply_keras(run_dir, wider_classifier, batch_size=8)
    assert graph.content_hash in str(caught.value)


# ---- placer apply -----------------------------------------------------------------------------------


def test_placer_apply__json_sums_to_the_graph_and_counts_transfers_as_the_simulator(torch_run, tmp_path, capsys):
    from cluster.run_best import read_run_best
    from measurers.sim.reference import Simulator

    run_dir, graph = torch_run
    module_map = tmp_path / "maps" / "modules.json"  # missing folders are made, as for every output file
    capsys.readouterr()
    assert main(["apply", str(run_dir), "--json", "--module-map", str(module_map)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["graph_hash"] == graph.content_hash and report["machine"] == "paper-2gpu"
    assert sum(d["param_bytes"] for d in report["devices"]) == int(graph.param_bytes.sum())
    assert sum(d["ops"] for d in report["devices"]) == graph.num_ops
    assert {s["scope"] for s in report["scopes"]} == {"fc1", "fc2", "(top level)"}
    run = read_run_best(run_dir)
    timeline = Simulator(graph, run.machine).run(run.op_placement(graph), timeline=True).timeline
    assert report["transfers"] == {"count": len(timeline.transfer_op),
                                   "total_bytes": int(timeline.transfer_bytes.sum())}
    written = json.loads(module_map.read_text())
    assert set(written["modules"]) == {"fc1", "fc2"} and written["modules"] == report["modules"]
    assert set(written["modules"].values()) <= {"cpu:0", "gpu:0", "gpu:1"}


def test_placer_apply__prints_a_table_per_device_and_per_scope(torch_run, capsys):
    run_dir, _ = torch_run
    assert main(["apply", str(run_dir), "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert "per device" in out and "gpu:1" in out and "fc2" in out and "transfers per step" in out


def test_placer_apply__tied_weights_are_one_device_in_the_module_map_and_said_so(tmp_path, capsys, one_torch_thread):
    """emb's weight on gpu:1 and out's matmuls (which read it) on gpu:0: the map puts out with emb, lists them as
    tied, and the printed summary says so."""
    graph = import_torch_spec("tests/fixtures/tiny_models.py:tiny_torch_tied_lm")
    groups = graph.colocation_ids
    devices = np.ones(groups.max() + 1, dtype=np.int64)  # gpu:0 ...
    devices[groups[list(graph.op_names).index("param:emb.weight")]] = 2  # ... but emb's weight and update: gpu:1
    run_dir = write_run(tmp_path, graph, save_graph(graph, tmp_path / "tied.parquet"), load_machine("paper-2gpu"),
                        devices, groups)
    module_map = tmp_path / "modules.json"
    capsys.readouterr()
    assert main(["apply", str(run_dir), "--module-map", str(module_map)]) == 0
    assert "tied weights: emb, out share emb.weight, so the module map puts each on gpu:1" in capsys.readouterr().out
    written = json.loads(module_map.read_text())
    assert written["modules"] == {"emb": "gpu:1", "mid": "gpu:0", "out": "gpu:1"}
    assert written["tied"] == [{"modules": ["emb", "out"], "parameters": ["emb.weight"], "device": "gpu:1"}]


def test_placer_apply__a_parameter_the_model_itself_shares_puts_the_model_in_the_map(tmp_path, capsys,
                                                                                    one_torch_thread):
    """The model's own table (``self.out.weight = self.table``) on gpu:1: the map has an entry for the model
    itself (""), tied with out, and the printed summary names it."""
    graph = import_torch_spec("tests/fixtures/tiny_models.py:tiny_torch_root_tied_lm")
    groups = graph.colocation_ids
    devices = np.ones(groups.max() + 1, dtype=np.int64)  # gpu:0 ...
    devices[groups[list(graph.op_names).index("param:table")]] = 2  # ... but the table and its update: gpu:1
    run_dir = write_run(tmp_path, graph, save_graph(graph, tmp_path / "tied.parquet"), load_machine("paper-2gpu"),
                        devices, groups)
    module_map = tmp_path / "modules.json"
    capsys.readouterr()
    assert main(["apply", str(run_dir), "--module-map", str(module_map)]) == 0
    out = capsys.readouterr().out
    assert ("tied weights: the model itself (''), out share table, so the module map puts each on gpu:1"
            in out)
    assert "modules split across devices: the model itself ('')" in out  # it printed an empty name
    written = json.loads(module_map.read_text())
    assert list(written["modules"].items()) == [("", "gpu:1"), ("mid", "gpu:0"), ("out", "gpu:1")]
    assert written["tied"] == [{"modules": ["", "out"], "parameters": ["table"], "device": "gpu:1"}]


@pytest.mark.parametrize("case", ["not a run", "no best placement"])
def test_placer_apply__bad_folder_exits_2_and_writes_nothing(case, tmp_path, capsys):
    run_dir = tmp_path
    if case == "no best placement":
        graph = import_torch_spec(TORCH_SPEC)
        run_dir = write_run(tmp_path, graph, save_graph(graph, tmp_path / "g.parquet"), load_machine("paper-2gpu"))
    module_map = tmp_path / "modules.json"
    code = main(["apply", str(run_dir), "--module-map", str(module_map)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("placer: error:") and len(err.strip().splitlines()) == 1
    assert ("not a run folder" if case == "not a run" else "no best placement") in err
    assert not module_map.exists()


@pytest.mark.parametrize("name", ["manifest.json", "best_placement.json", "maps/modules.json"])
def test_placer_apply__a_module_map_inside_the_run_folder_is_refused(torch_run, capsys, name):
    """The run folder is never changed: ``--module-map RUN/manifest.json`` replaced the manifest, and the run
    could be analysed no more."""
    run_dir, _ = torch_run
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert main(["apply", str(run_dir), "--module-map", str(run_dir / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error: --module-map ") and "lies inside the run folder" in err
    assert {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_placer_apply__a_module_map_inside_another_run_folder_is_refused(torch_run, tmp_path, capsys):
    """`--module-map OTHER_RUN/manifest.json` replaced another run's manifest, and that run was ruined."""
    import shutil

    run_dir, _ = torch_run
    other = shutil.copytree(run_dir, tmp_path / "other" / run_dir.name)
    manifest = (other / "manifest.json").read_bytes()
    assert main(["apply", str(run_dir), "--module-map", str(other / "manifest.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error: --module-map ") and f"lies inside the run folder {other}," in err
    assert (other / "manifest.json").read_bytes() == manifest
    project = tmp_path / "project"  # a web project's manifest.json alone makes no run folder
    project.mkdir()
    (project / "manifest.json").write_text('{"name": "my-extension", "manifest_version": 3}')
    assert main(["apply", str(run_dir), "--module-map", str(project / "maps" / "modules.json")]) == 0
    assert (project / "maps" / "modules.json").is_file()


def test_placer_apply__a_graph_file_gone_is_named_where_the_run_read_it(tmp_path, monkeypatch, capsys):
    """`--graph clf.parquet` given relative: from another folder, after the file moved, the error names the
    absolute path the run recorded, not only the relative name looked up from here."""
    graph = import_torch_spec(TORCH_SPEC)
    monkeypatch.chdir(tmp_path)
    save_graph(graph, "clf.parquet")
    machine = load_machine("paper-2gpu")
    run_dir = write_run(tmp_path / "runs", graph, Path("clf.parquet"), machine,
                        *spread_over_groups(graph, machine.num_devices, seed=3))
    (tmp_path / "clf.parquet").rename(tmp_path / "moved.parquet")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["apply", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error: cannot find graph 'clf.parquet'") and err.count("\n") == 1
    assert f"{tmp_path / 'clf.parquet'}, which the run read, is gone" in err


def test_placer_apply__a_module_map_over_the_runs_graph_file_or_the_cache_is_refused(torch_run, tmp_path, capsys,
                                                                                      monkeypatch):
    """The graph file found through the run's manifest was not protected as --graph is: the map replaced it,
    and the next apply found the graph damaged."""
    run_dir, graph = torch_run
    graph_file = run_dir.parent / "classifier.parquet"
    before = graph_file.read_bytes()
    capsys.readouterr()
    assert main(["apply", str(run_dir), "--module-map", str(graph_file)]) == 2
    assert "is the graph file the run read" in one_placer_error(capsys)
    assert graph_file.read_bytes() == before
    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / "graphs" / "x.parquet"
    assert main(["apply", str(run_dir), "--module-map", str(cached)]) == 2
    assert "lies in placer's cache" in one_placer_error(capsys) and not cached.exists()


def frozen_statistics_classifier():
    """A classifier returned in eval mode: fine-tuning with BatchNorm's running statistics frozen."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    model.eval()
    data = torch.randn(4, 8)
    return model, (data,), lambda out: out.square().mean()


def test_apply_torch__a_model_returned_in_eval_mode_trains_as_it_was_traced():
    """apply switched it to train mode after the trace: its step then differed from its graph, and every
    placement was refused ("the real step does not match graph")."""
    model, (data,), loss_fn = frozen_statistics_classifier()
    placement = np.random.default_rng(0).integers(0, 3, import_graph_of(frozen_statistics_classifier).num_ops)
    step = apply_torch(placement, frozen_statistics_classifier, machine="paper-2gpu", torch_devices=all_cpu)
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(2):
        optimizer.zero_grad()
        loss = loss_fn(model(data))
        loss.backward()
        optimizer.step()
        assert float(step(data)) == pytest.approx(float(loss), rel=1e-6)
    assert step.copies > 0 and not model.training
    eager = {**dict(model.named_parameters()), **dict(model.named_buffers())}  # the statistics stay as they were
    for name, value in step.parameters().items():
        assert torch.allclose(value.float(), eager[name].float(), rtol=1e-5, atol=1e-7), name


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.f, self.g = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

    def forward(self, a, b):
        return (self.f(a) * self.g(b)).sum()


def two_inputs_one_storage():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    return _TwoInputs(), (x, x.view(3, 4))  # two tensors, one storage


class _ShiftedTokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10)

    def forward(self, tokens, targets):
        return torch.nn.functional.cross_entropy(self.out(self.emb(tokens)).flatten(0, 1), targets.flatten())


def shifted_tokens():
    torch.manual_seed(0)
    tokens = torch.randint(0, 10, (2, 6))
    return _ShiftedTokens(), (tokens[:, :-1], tokens[:, 1:])  # a language model's inputs: slices of one tensor


@pytest.mark.parametrize("build", [two_inputs_one_storage, shifted_tokens])
def test_apply_torch__example_inputs_that_share_storage_are_each_fed_on_their_own(build):
    """A view of one input given as another shared its leaf: the placed step fed the first input's values to
    both, silently; slices of one token tensor ran a clone the graph does not have (every apply refused:
    "is aten.view in the graph but the step ran aten.clone"). Import and measurer each take a copy."""
    model, _ = build()
    placement = np.random.default_rng(0).integers(0, 3, import_graph_of(build).num_ops)
    step = apply_torch(placement, build, machine="paper-2gpu", torch_devices=all_cpu)
    assert None not in step.input_slots
    torch.manual_seed(3)
    inputs = ((torch.randn(3, 4), torch.randn(3, 4)) if build is two_inputs_one_storage else
              (torch.randint(0, 10, (2, 5)), torch.randint(0, 10, (2, 5))))
    assert float(step(*inputs)) == pytest.approx(float(model(*inputs).detach()), rel=1e-6)


def import_graph_of(build_fn):
    from graphs.torch.importer import trace_training_step

    model, inputs, *loss_fn = build_fn()
    return trace_training_step(model, inputs, *loss_fn, name=build_fn.__name__)


def two_alike_blocks():
    """Two nested models, each with a layer named "dense": their variables share TensorFlow's and Keras's names."""
    import keras

    def block(name):
        inputs = keras.Input((6,))
        return keras.Model(inputs, keras.layers.Dense(6, activation="relu", name="dense")(inputs), name=name)

    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(block("b2")(block("b1")(inputs))), name="two")
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    return model, rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)


def test_apply_keras__variables_of_layers_named_alike_are_each_listed():
    """Keyed by name, b1's and b2's "dense/kernel:0" were one entry: 14 of the 20 variables came back."""
    from graphs.tf.importer import import_keras_spec

    graph = import_keras_spec(f"{__file__}:two_alike_blocks")
    with apply_keras(np.zeros(graph.num_ops, dtype=np.int64), two_alike_blocks, machine="paper-2gpu",
                     tf_devices=lambda machine: ["/cpu:0"] * machine.num_devices) as step:
        values = step.variables()
        assert len(values) == len(step.user.traced.variables) == 20
        assert "head/kernel" in values and sum(name.startswith("dense/kernel (") for name in values) == 2
