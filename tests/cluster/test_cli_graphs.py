import json
import os
from pathlib import Path

import numpy as np
import pytest

from cluster.cli import main
from cluster.commands.graphs import _flops_text
from graphs.io import load_graph_file, save_graph
from graphs.registry import list_benchmarks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def graph_file(make_graph, tmp_path):
    """A 40-op training-like graph file: a chain with colocated forward/backward pairs and a Variable."""
    n = 40
    colocation = np.arange(n)
    colocation[20:] = np.arange(20)[::-1]
    graph = make_graph([(i, i + 1, 100 + i) for i in range(n - 1)], n, colocation=colocation,
                       param_bytes=[64] + [0] * (n - 1), kinds=["Variable"] + ["aten.mm.default"] * (n - 1),
                       name="chain40", batch_size=8, num_params=16)
    return graph, save_graph(graph, tmp_path / "chain40.parquet")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("placer: error: ")
    return err


def test_graphs_list__json_names_every_benchmark_and_synthetic(capsys):
    assert main(["graphs", "list", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    names = [entry["name"] for entry in entries]
    assert names[:-1] == [b.name for b in list_benchmarks()]
    assert names[-1] == "synthetic:N[:SEED]"
    assert all(entry["description"] for entry in entries)


def test_graphs_list__table(capsys):
    assert main(["graphs", "list"]) == 0
    assert "synthetic:N[:SEED]" in capsys.readouterr().out


def test_graphs_show__json_figures_of_a_file(graph_file, capsys):
    graph, path = graph_file
    assert main(["graphs", "show", str(path), "--json", "--groups", "5"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["name"] == "chain40" and figures["framework"] == "manual"
    assert (figures["ops"], figures["edges"]) == (40, 39)
    assert figures["flops"] == pytest.approx(graph.total_flops)
    assert (figures["params"], figures["param_bytes"], figures["batch_size"]) == (16, 64, 8)
    assert 1 <= figures["groups"] <= 5 and figures["colocation_groups"] == 20
    assert figures["hash"] == graph.content_hash


def test_graphs_show__names_the_grouping_method_used_not_the_one_asked_for(capsys):
    # a graph without scopes falls back from the default "scope" to METIS, as placer bound reports
    assert main(["graphs", "show", "synthetic:300:1", "--json", "--groups", "5"]) == 0
    assert json.loads(capsys.readouterr().out)["grouping_method"] == "metis"


def test_graphs_show__an_unknown_method_is_refused_before_the_graph_is_built(tmp_path, capsys, monkeypatch):
    """The graph was built (minutes for a large one) and cached before the typo was named."""
    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "cache"))
    assert main(["graphs", "show", "family:rnn:3", "--method", "bogus"]) == 2
    assert "unknown grouping method 'bogus'" in _error_line(capsys)
    assert not (tmp_path / "cache").exists()


def test_graphs_show__a_cache_it_cannot_write_is_a_note_and_the_graph_is_shown(tmp_path, capsys, monkeypatch):
    """The built graph was thrown away, and the error named a path, not the cache."""
    (tmp_path / "cache").write_text("a file where the cache folder goes")
    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "cache"))
    assert main(["graphs", "show", "family:rnn:3", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ops"] > 0
    assert "placer: note: family:rnn:3 is not cached: cannot write the graph cache" in err


def test_graphs_show__a_folder_where_the_cache_entry_goes_is_a_note_and_the_graph_is_shown(tmp_path, capsys,
                                                                                            monkeypatch):
    """Every use of the benchmark failed, "graph file ... is a folder", a file the user never named."""
    from graphs import registry

    monkeypatch.setenv("PLACER_CACHE", str(tmp_path / "cache"))
    registry._cache_path(registry._find_benchmark("family:rnn:3")).mkdir(parents=True)
    assert main(["graphs", "show", "family:rnn:3", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ops"] > 0
    assert "placer: note: family:rnn:3 is not cached: cannot write the graph cache" in err and "is a folder" in err


def test_graphs_show__default_groups_keep_colocation_groups(graph_file, capsys):
    _, path = graph_file
    assert main(["graphs", "show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["groups"] == 20  # 20 colocation groups < 256


def test_graphs_show__readable_table(graph_file, capsys):
    _, path = graph_file
    assert main(["graphs", "show", str(path)]) == 0
    out = capsys.readouterr().out
    flops = float(graph_file[0].flops.sum())
    assert "chain40" in out and "colocation_groups" in out and _flops_text(flops) in out


@pytest.mark.parametrize("flops, text", [
    (2.5e13, "2.5e+13 (25.000 TFLOP)"), (3.262e9, "3.262e+09 (3.262 GFLOP)"), (1e6, "1e+06 (1.000 MFLOP)"),
    (4480.0, "4480 (4.480 kFLOP)"), (512.0, "512 FLOP"), (0.0, "0 FLOP"),
])
def test_graphs_show__flops_in_the_largest_unit_they_reach(flops, text):
    assert _flops_text(flops) == text  # a small graph used to read "(0.000 TFLOP)"


def test_graphs_show__unknown_name_is_one_error_line(capsys):
    assert main(["graphs", "show", "no-such-graph"]) == 2
    assert "no-such-graph" in _error_line(capsys)


def test_graphs_show__damaged_file_is_one_error_line(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not really parquet")
    assert main(["graphs", "show", str(bad)]) == 2
    assert "bad.parquet" in _error_line(capsys)


def test_graphs_show__bad_group_count_is_an_error(graph_file, capsys):
    _, path = graph_file
    assert main(["graphs", "show", str(path), "--groups", "0"]) == 2
    assert "--groups" in _error_line(capsys)


def test_graphs_show__an_unknown_method_is_the_only_line_even_with_too_many_groups(graph_file, capsys):
    _, path = graph_file
    assert main(["graphs", "show", str(path), "--groups", "500", "--method", "bogus"]) == 2
    assert "unknown grouping method 'bogus'" in _error_line(capsys)  # no note about the 500 groups before it


def test_graphs_export__writes_an_identical_graph(graph_file, tmp_path, capsys):
    graph, path = graph_file
    out = tmp_path / "sub" / "copy.parquet"
    assert main(["graphs", "export", str(path), "-o", str(out)]) == 0
    assert load_graph_file(out).content_hash == graph.content_hash
    assert str(out) in capsys.readouterr().out


def test_graphs_export__unknown_name_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never.parquet"
    assert main(["graphs", "export", "no-such-graph", "-o", str(out)]) == 2
    _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["g.json", "g.CSV"])
def test_graphs_export_and_import__a_name_of_another_data_format_is_refused_before_anything(graph_file, tmp_path,
                                                                                              capsys, name):
    """A graph file is Parquet: `-o g.json` wrote Parquet under a JSON name (a user piping it to jq, or
    keeping a JSON file of that name, found out later)."""
    _, path = graph_file
    out = tmp_path / name
    out.write_text("the user's own file\n")
    for args in (["export", str(path)], ["import", "--torch", f"{FIXTURES / 'tiny_models.py'}:tiny_torch_mlp"]):
        with pytest.raises(SystemExit) as exit_:
            main(["graphs", *args, "-o", str(out)])
        assert exit_.value.code == 2
        assert f"a graph file is Parquet, not {out.suffix.lower()}; name it with .parquet" in _error_line(capsys)
    assert out.read_text() == "the user's own file\n"


def test_graphs_export__synthetic_graph(tmp_path):
    out = tmp_path / "s.parquet"
    assert main(["graphs", "export", "synthetic:3000:1", "-o", str(out)]) == 0
    assert load_graph_file(out).num_ops == 3000


def test_graphs_show__synthetic_graph_groups_to_at_most_g(capsys):
    assert main(["graphs", "show", "synthetic:3000:1", "--json", "--groups", "64"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["ops"] == 3000 and figures["colocation_groups"] > 64
    assert 32 <= figures["groups"] <= 64 and figures["max_groups"] == 64


def test_graphs_show__bad_synthetic_spec_is_one_error_line(capsys):
    assert main(["graphs", "show", "synthetic:abc"]) == 2
    assert "synthetic:abc" in _error_line(capsys)


def test_graphs_import__torch_model_end_to_end(tmp_path, capsys, monkeypatch):
    out = tmp_path / "mlp.parquet"
    monkeypatch.chdir(FIXTURES.parent)
    assert main(["graphs", "import", "--torch", "fixtures/tiny_models.py:tiny_torch_mlp", "-o", str(out)]) == 0
    graph = load_graph_file(out)
    assert graph.source == f"torch:{FIXTURES / 'tiny_models.py'}:tiny_torch_mlp"  # the measurer finds it anywhere
    assert graph.framework == "torch" and graph.num_params == 8 * 16 + 16 + 16 * 2 + 2
    assert (graph.op_kinds == "Variable").sum() == 4
    assert main(["graphs", "show", str(out), "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("spec, problem", [
    ("no_such_module_xyz:build", "no_such_module_xyz"),
    (f"{FIXTURES / 'broken_model.py'}:build", "broken on purpose"),
    (f"{FIXTURES / 'tiny_models.py'}:missing_function", "missing_function"),
    (f"{FIXTURES / 'tiny_models.py'}:not_a_model", "must return"),
    (f"{FIXTURES / 'tiny_models.py'}:exits_when_called", "exits_when_called() raised SystemExit: 3"),
    (f"{FIXTURES / 'tiny_models.py'}:raises_a_message_of_three_lines",  # one line still, without the bolding
     "raises_a_message_of_three_lines() raised ValueError: first line second line third"),
])
def test_graphs_import__bad_torch_spec_is_one_error_line_and_writes_nothing(tmp_path, capsys, spec, problem):
    out = tmp_path / "never.parquet"
    assert main(["graphs", "import", "--torch", spec, "-o", str(out)]) == 2
    assert problem in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_graphs_import__a_torch_shape_error_is_one_line_without_torchs_logged_traceback(tmp_path, capfd):
    spec = f"{FIXTURES / 'tiny_models.py'}:torch_inputs_of_the_wrong_shape"
    assert main(["graphs", "import", "--torch", spec, "-o", str(tmp_path / "never.parquet")]) == 2
    err = capfd.readouterr().err.strip()  # the file descriptor: torch's log handler writes there
    assert err.count("\n") == 0 and err.startswith("placer: error: ") and "same reduction dim" in err, err
    assert list(tmp_path.iterdir()) == []


def test_graphs_import__a_torch_step_whose_dtypes_cannot_run_is_one_line_and_writes_nothing(tmp_path, capfd):
    spec = f"{FIXTURES / 'tiny_models.py'}:torch_half_weight_fed_float_input"
    assert main(["graphs", "import", "--torch", spec, "-o", str(tmp_path / "never.parquet")]) == 2
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("placer: error: "), err
    assert "aten.addmm" in err and "float16" in err and "float32" in err, err
    assert list(tmp_path.iterdir()) == []


def test_graphs_import__output_naming_the_model_file_is_refused_and_the_model_kept(tmp_path, capsys):
    model = tmp_path / "models.py"
    model.write_bytes((FIXTURES / "tiny_models.py").read_bytes())
    assert main(["graphs", "import", "--torch", f"{model}:tiny_torch_mlp", "-o", str(model)]) == 2
    assert "is the model's own file" in _error_line(capsys)
    assert model.read_bytes() == (FIXTURES / "tiny_models.py").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["models.py"]


def _onnx_with_external_data(tmp_path) -> tuple:
    """A one-MatMul ONNX model whose weight lives in ``weights.data`` beside it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 64), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    model_path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model_path),
              save_as_external_data=True, location="weights.data", size_threshold=0)
    return ["--onnx", str(model_path)], tmp_path / "weights.data"


def _saved_keras_file(tmp_path) -> tuple:
    path = tmp_path / "model.keras"
    path.write_bytes(b"a saved Keras model")  # refused before anything reads it
    return ["--keras", str(path)], path


@pytest.mark.parametrize("make", [_saved_keras_file, _onnx_with_external_data], ids=["keras-file", "onnx-data"])
def test_graphs_import__output_naming_a_saved_model_or_its_weights_is_refused_and_kept(tmp_path, capsys, make):
    """``-o`` naming the saved ``.keras`` model, or the file an ONNX model keeps its weights in, used to
    replace it with the graph file (exit 0; a later import of the ONNX model read the graph as weights)."""
    source, target = make(tmp_path)
    before = target.read_bytes()
    assert main(["graphs", "import", *source, "-o", str(target)]) == 2
    assert "is the model's own file" in _error_line(capsys)
    assert target.read_bytes() == before


def test_graphs_import__batch_size_with_torch_is_one_error_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never.parquet"
    spec = f"{FIXTURES / 'tiny_models.py'}:tiny_torch_mlp"
    assert main(["graphs", "import", "--torch", spec, "-o", str(out), "--batch-size", "8"]) == 2
    assert "--batch-size applies to --keras only" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_graphs_import__keras_model_end_to_end(tmp_path, capsys, monkeypatch):
    out = tmp_path / "keras_mlp.parquet"
    monkeypatch.chdir(FIXTURES.parent)
    assert main(["graphs", "import", "--keras", "fixtures/tiny_models.py:tiny_keras_mlp", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    graph = load_graph_file(out)
    assert graph.meta["keras_spec"] == f"{FIXTURES / 'tiny_models.py'}:tiny_keras_mlp"
    assert graph.framework == "tensorflow" and graph.num_params == 8 * 16 + 16 + 16 * 2 + 2
    assert (graph.op_kinds == "Variable").sum() == 4
    assert 2 in graph.phases and 1 in graph.phases  # update and backward ops are in the graph


def test_graphs_import__a_subclassed_keras_model_never_called_gets_its_weights_first(tmp_path, capsys):
    out = tmp_path / "subclassed.parquet"
    spec = f"{FIXTURES / 'tiny_models.py'}:tiny_keras_subclassed"
    assert main(["graphs", "import", "--keras", spec, "-o", str(out)]) == 0, capsys.readouterr().err
    graph = load_graph_file(out)
    assert graph.num_params == 6 * 16 + 16 + 16 * 2 + 2 and (graph.op_kinds == "Variable").sum() == 4


def test_graphs_import__a_keras_models_own_train_step_is_said_not_traced(tmp_path, capsys):
    """The importer traces its own step (forward, loss, gradients, update), which the tf measurer and apply_keras
    run too: a model overriding train_step was imported without a word that its step was not the one traced."""
    out = tmp_path / "own.parquet"
    spec = f"{FIXTURES / 'tiny_models.py'}:tiny_keras_own_train_step"
    assert main(["graphs", "import", "--keras", spec, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith(
        "placer: note: tiny_keras_own_train_step.<locals>.OwnStep.train_step of Keras model 'own_step' is not traced")
    assert captured.out.startswith(f"wrote {out}")
    assert load_graph_file(out).meta["own_train_step"] == "tiny_keras_own_train_step.<locals>.OwnStep.train_step"
    plain = tmp_path / "plain.parquet"
    assert main(["graphs", "import", "--keras", f"{FIXTURES / 'tiny_models.py'}:tiny_keras_mlp", "-o", str(plain)]) == 0
    assert capsys.readouterr().err == "" and "own_train_step" not in load_graph_file(plain).meta


@pytest.mark.parametrize("batch_size", ["10000000000000", "99999999999999999999"])
def test_graphs_import__a_keras_batch_too_large_to_make_up_is_one_error(tmp_path, capsys, batch_size):
    """Made-up examples of 10**13 rows: a NumPy MemoryError (291 TiB) or ValueError traceback before."""
    out = tmp_path / "never.parquet"
    spec = f"{FIXTURES / 'tiny_models.py'}:tiny_keras_classifier"  # a compiled model alone: examples made up
    assert main(["graphs", "import", "--keras", spec, "--batch-size", batch_size, "-o", str(out)]) == 2
    assert "would hold more than 2,147,483,648 values: use a smaller --batch-size" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_keras_import_and_the_tf_measurer_in_a_fresh_process_print_nothing_of_tensorflows_startup(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "keras_mlp.parquet"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "graphs", "import", "--keras",
                           f"{FIXTURES / 'tiny_models.py'}:tiny_keras_mlp", "-o", str(out)],
                          cwd=FIXTURES.parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"wrote {out}")
    for command in (["measure", "--graph", str(out), "--machine", "local", "--measurer", "tf", "--policy",
                     "device:0", "--runs", "1", "--warmup", "0"],  # 7 lines of TensorFlow's, 23 for profile
                    ["profile", "--graph", str(out), "--measurer", "tf", "--runs", "1", "--warmup", "0", "-o",
                     str(tmp_path / "profile.json")]):
        done = subprocess.run([sys.executable, "-m", "cluster.cli", *command], cwd=FIXTURES.parents[1], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stderr == "", (command[0], done.stderr)


def test_profile__tf_notes_the_ops_of_uninlined_calls_it_could_not_time(tmp_path, capsys):
    """Ops of ``_noinline`` function calls whose step-stats names fit two ops are left out of the profile:
    one note on stderr counts and names them, and the profile of the rest is written."""
    pytest.importorskip("tensorflow")
    graph, out = tmp_path / "calls.parquet", tmp_path / "profile.json"
    spec = f"{FIXTURES / 'tiny_models.py'}:tiny_keras_uninlined_calls"
    assert main(["graphs", "import", "--keras", spec, "-o", str(graph)]) == 0
    capsys.readouterr()
    assert main(["profile", "--graph", str(graph), "--measurer", "tf", "--runs", "1", "--warmup", "0",
                 "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("profiled ") and out.exists()
    assert captured.err.count("\n") == 1 and captured.err.startswith("placer: note: 14 ops ran inside ")
    assert "calls_1/PartitionedCall/Tanh" in captured.err and "(9 more)" in captured.err


@pytest.mark.parametrize("spec, message", [("missing.keras", "Keras model file 'missing.keras' does not exist"),
                                           ("missing/models.py:build", "no file 'missing/models.py'")])
def test_graphs_import__a_missing_keras_file_is_named_before_tensorflow_loads(tmp_path, capsys, spec, message):
    assert main(["graphs", "import", "--keras", spec, "-o", str(tmp_path / "never.parquet")]) == 2
    assert message in _error_line(capsys)


def test_graphs_import__a_keras_file_of_an_unregistered_custom_layer_names_it_in_one_short_line(tmp_path, capsys):
    """Keras's error held the whole model's config (about 2,000 characters, five lines) around the point."""
    keras = pytest.importorskip("keras")

    class Doubled(keras.layers.Layer):
        def call(self, x):
            return 2.0 * x

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(Doubled(name="doubled")(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    model.save(saved := tmp_path / "custom.keras")
    out = tmp_path / "never.parquet"
    assert main(["graphs", "import", "--keras", str(saved), "-o", str(out)]) == 2
    error = _error_line(capsys)
    assert f"cannot load Keras model '{saved}': its class 'Doubled' of module '{__name__}' is not registered" in error
    assert "custom_objects={'Doubled': Doubled}" in error and "config" not in error and len(error) < 400
    assert not out.exists()


def test_graphs_import__bad_keras_spec_is_one_error_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never.parquet"
    assert main(["graphs", "import", "--keras", f"{FIXTURES / 'broken_model.py'}:build", "-o", str(out)]) == 2
    assert "broken on purpose" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_graphs_show__a_name_holding_an_emoji_code_prints_as_it_is(capsys):
    """rich turned ":100:" into an emoji: synthetic:100:0 printed as synthetic💯0 in every table."""
    assert main(["graphs", "show", "synthetic:100:0"]) == 0
    out = capsys.readouterr().out
    assert "synthetic:100:0" in out and "\U0001f4af" not in out


def test_graphs_show__a_training_step_says_what_its_parameter_bytes_hold(tmp_path, capsys):
    """Linear(8, 16) and Linear(16, 2), batch 4: 178 fp32 weights, held with their gradients and Adam's two
    moments (4 x 712 bytes); the forward FLOPs are the model's own count."""
    path = tmp_path / "mlp.parquet"
    assert main(["graphs", "import", "--torch", f"{FIXTURES}/tiny_models.py:tiny_torch_mlp", "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["graphs", "show", str(path), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["params"], figures["param_bytes"]) == (8 * 16 + 16 + 16 * 2 + 2, 4 * 178 * 4)
    assert figures["forward_flops"] == 2 * 4 * (8 * 16 + 16 * 2)
    assert main(["graphs", "show", str(path)]) == 0
    assert "weights, gradients and optimizer state" in capsys.readouterr().out


def test_graphs_import__a_keras_file_saved_without_compile_says_which_step_it_traced(tmp_path, capsys):
    """It imported with mean squared error and Adam made up, and said nothing: the graph (and the tf
    measurer's step) was not the training the user meant."""
    keras = pytest.importorskip("keras")

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
    model.save(saved := tmp_path / "bare.keras")
    assert main(["graphs", "import", "--keras", str(saved), "-o", str(tmp_path / "g.parquet")]) == 0
    err = capsys.readouterr().err
    assert (f"placer: note: Keras model file '{saved}' was saved without compile(): its training step is traced "
            "with mean squared error against float targets shaped like its outputs, and Adam") in err


@pytest.mark.parametrize("build, message", [
    ("per_example_loss", "the loss of Keras model 'per_example' has shape [8, 4], not one number"),
    ("one_loss_two_weights", "Keras model 'two_heads' is compiled with one loss and 2 loss_weights, which Keras "
                             "refuses to train"),
])
def test_graphs_import__a_keras_loss_keras_would_not_train_with_is_one_error(tmp_path, capsys, build, message):
    """A loss returned with the model that gives one value per example was summed by the gradient tape without
    a word; one compiled loss with a weight per output imported although Keras's fit refuses the model."""
    pytest.importorskip("keras")
    source = tmp_path / "losses.py"
    source.write_text(
        "import keras\nimport numpy as np\n\n"
        "def per_example_loss():\n"
        "    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)], name='per_example')\n"
        "    model.compile(optimizer='sgd', loss='mse')\n"
        "    x, y = np.zeros((8, 16), 'float32'), np.zeros((8, 4), 'float32')\n"
        "    return model, x, y, (lambda target, prediction: target - prediction)\n\n"
        "def one_loss_two_weights():\n"
        "    a = keras.Input((8,))\n"
        "    h = keras.layers.Dense(16)(a)\n"
        "    model = keras.Model(a, [keras.layers.Dense(3)(h), keras.layers.Dense(2)(h)], name='two_heads')\n"
        "    model.compile(optimizer='sgd', loss='mse', loss_weights=[0.25, 4.0])\n"
        "    return model\n")
    out = tmp_path / "never.parquet"
    assert main(["graphs", "import", "--keras", f"{source}:{build}", "-o", str(out)]) == 2
    assert message in _error_line(capsys) and not out.exists()


def test_graphs_import__a_file_beside_the_model_does_not_shadow_an_installed_module(tmp_path):
    """Run from the model's folder, the folder went first on the import path: a neighbour `idna.py` was
    imported where the installed idna was, against the README (the folder goes at the end)."""
    import subprocess
    import sys

    (tmp_path / "idna.py").write_text("SHADOW = True\n")
    (tmp_path / "model.py").write_text(
        "import sys\nimport torch\n\n"
        "def build():\n"
        "    import idna\n"
        "    print('idna from', idna.__file__, file=sys.stderr)\n"
        "    return torch.nn.Linear(4, 2), torch.randn(3, 4)\n")
    placer = tmp_path / "bin" / "placer.py"  # as the installed `placer` script runs (not `python -m`, `-c`:
    placer.parent.mkdir()  # those put the current folder first themselves)
    placer.write_text("import sys\nfrom cluster.cli import console_main\nsys.exit(console_main())\n")
    done = subprocess.run([sys.executable, str(placer), "graphs", "import", "--torch", "model.py:build", "-o",
                           str(tmp_path / "g.parquet")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(FIXTURES.parents[1])})
    assert done.returncode == 0, done.stderr
    assert "idna from" in done.stderr and str(tmp_path / "idna.py") not in done.stderr
