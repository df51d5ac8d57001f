"""Training the graph-neural placers over problems: the teachers (policies/rl/gnn/teacher.py), the family
loop (family.py) and its checked checkpoint (checkpoint.py), which a policy can start from."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphs.errors import PlacerError
from graphs.registry import load_graph
from measurers.catalog import load_machine
from measurers.sim.measurer import SimulatorMeasurer
from policies.base import CountingMeasurer
from policies.problem import make_problem
from policies.registry import place
from policies.rl.gnn.checkpoint import read_checkpoint, read_resume_state, resume_path, write_checkpoint
from policies.rl.gnn.config import GnnConfig
from policies.rl.gnn.family import TrainProblem, train_family
from policies.rl.gnn.problems import Slot
from policies.rl.gnn.symmetry import canonical_placement, device_automorphisms
from policies.rl.gnn.teacher import teach

torch.set_num_threads(1)
SMALL = GnnConfig(kind="gdp", hidden_size=8, num_layers=1, batch_size=4, seed=0)





def _train_problem(graph_name: str, machine_name: str, groups: int = 8) -> TrainProblem:
    graph, machine = load_graph(graph_name), load_machine(machine_name)
    return TrainProblem(f"{graph_name}@{machine_name}", make_problem(graph, machine, max_groups=groups),
                        SimulatorMeasurer(graph, machine))


@pytest.fixture(scope="module")
def two_problems():
    return [_train_problem("synthetic:200", "paper-2gpu"), _train_problem("synthetic:200", "paper-4gpu", 6)]


@pytest.fixture(scope="module")
def family_run(two_problems, tmp_path_factory):
    out = tmp_path_factory.mktemp("family") / "gdp.pt"
    counted = [TrainProblem(p.name, p.problem, CountingMeasurer(p.measurer)) for p in two_problems]
    seen = []
    result = train_family(counted, SMALL, 60, out, teacher_budget=16, imitation_steps=10,
                          on_teacher=lambda name, found: seen.append(name))
    return out, result, counted, seen


def test_teacher_runtime_is_its_placements_runtime(two_problems):
    problem = two_problems[1]  # paper-4gpu: alike GPUs to relabel
    slot = Slot(problem.problem, counter=None)
    counted = CountingMeasurer(problem.measurer)
    found = teach(problem.problem, counted, 16, 0, slot.position, slot.work_weight)
    assert found is not None and found.measurements == counted.used and counted.used <= 16
    assert found.units.shape == (problem.problem.num_units,)
    autos = device_automorphisms(problem.problem.machine)
    relabeled = canonical_placement(found.units, slot.position, slot.work_weight, autos)
    assert tuple(relabeled) in {tuple(a[found.units]) for a in autos}  # canonical up to the tolerance rule
    [measured] = problem.measurer.measure([problem.problem.expand(found.units)])
    assert measured.ok and measured.runtime_s == pytest.approx(found.runtime_s, rel=1e-9)
    single = place("single-gpu", problem.problem, problem.measurer, 1, 0).best.runtime_s
    assert found.runtime_s <= single  # single-gpu is among the teacher's starts


def test_teacher_with_too_small_a_budget_finds_nothing(two_problems):
    problem = two_problems[0]
    counted = CountingMeasurer(problem.measurer)
    slot = Slot(problem.problem, counter=None)
    assert teach(problem.problem, counted, 1, 0, slot.position, slot.work_weight) is None
    assert counted.used <= 1


def test_family_checkpoint_holds_the_teachers(family_run, two_problems):
    out, result, counted, seen = family_run
    state = read_checkpoint(out, "gdp")
    progress = state["progress"]
    names = [p.name for p in two_problems]
    assert seen == names and progress["problems"] == names
    assert set(progress["teachers"]) == set(names)
    for problem in two_problems:
        teacher = progress["teachers"][problem.name]
        assert len(teacher["units"]) == problem.problem.num_units and teacher["runtime_s"] > 0
    assert result.measurements_used == progress["measurements_used"] <= 60
    assert sum(c.measurer.used for c in counted) == result.measurements_used  # what was measured, counted
    assert result.updates == progress["updates"] > 0 and result.checkpoint == out
    assert state["architecture"] == SMALL.architecture
    assert np.isfinite(progress["imitation_loss"])


def test_family_resume_refuses_other_problems(family_run, two_problems):
    out = family_run[0]
    other = [two_problems[0], _train_problem("family:transformer:0", "paper-2gpu")]
    with pytest.raises(PlacerError, match="family:transformer:0@paper-2gpu") as error:
        train_family(other, SMALL, 80, out, resume=True)
    assert str(out) in str(error.value)


def test_family_resume_continues_the_count(family_run, two_problems, tmp_path):
    import shutil

    out = tmp_path / "gdp.pt"
    shutil.copy(family_run[0], out)
    before = read_checkpoint(out, "gdp")["progress"]
    result = train_family(two_problems, SMALL, 72, out, resume=True, teacher_budget=16, imitation_steps=10)
    after = read_checkpoint(out, "gdp")["progress"]
    assert result.measurements_used == after["measurements_used"] <= 72
    assert after["measurements_used"] > before["measurements_used"]  # it went on, not started over
    assert after["updates"] > before["updates"] and after["teachers"] == before["teachers"]


def test_an_interrupted_family_run_resumed_measures_and_visits_as_one_run_does(tmp_path):
    """A stop after 5 updates, then a resume: the same problems visited in the same order and the same
    measurements counted as an uninterrupted run. The round in progress is in the checkpoint and the memo of
    each problem's measured placements beside it, in OUT.resume (a resume used to measure repeats again and
    restart the round)."""
    problems = [_train_problem(name, "paper-2gpu", 6) for name in ("synthetic:200", "synthetic:150", "synthetic:120")]

    def run(out, stop_after: int | None = None, resume: bool = False) -> list[tuple[str, int]]:
        visits = []
        train_family(problems, SMALL, 120, out, resume=resume, checkpoint_every=1,
                     should_stop=lambda: stop_after is not None and len(visits) >= stop_after,
                     on_update=lambda m: visits.append((m.problem, m.measurements_used)))
        return visits

    straight = run(tmp_path / "straight.pt")
    first = run(tmp_path / "split.pt", stop_after=5)
    rest = run(tmp_path / "split.pt", resume=True)
    assert len(first) == 5 and len(straight) > 8
    assert first + rest == straight
    progress = read_checkpoint(tmp_path / "split.pt", "gdp")["progress"]
    assert "slots" not in progress  # the checkpoint --init reads holds no memo
    memo = read_resume_state(tmp_path / "split.pt", progress["updates"])
    assert len(memo) == 3 and sum(len(slot["memo_units"]) for slot in memo) == progress["measurements_used"]


def test_a_resume_state_cut_short_damaged_or_foreign_is_refused_naming_it(family_run, two_problems, tmp_path):
    """A resume file from another update than its checkpoint (a save cut short between the two), a damaged
    one, or another file there: one PlacerError naming it, before anything is trained or written."""
    import shutil

    out = tmp_path / "gdp.pt"
    shutil.copy(family_run[0], out)
    shutil.copy(resume_path(family_run[0]), resume_path(out))
    updates = read_checkpoint(out, "gdp")["progress"]["updates"]
    state = torch.load(resume_path(out), weights_only=True)
    state["updates"] = updates + 1
    torch.save(state, resume_path(out))
    bad_files = (resume_path(out).read_bytes(), b"not a torch file",
                 _saved_bytes(tmp_path, {"format": "something else", "slots": []}))
    for bad in bad_files:
        resume_path(out).write_bytes(bad)
        before = out.read_bytes()
        with pytest.raises(PlacerError) as error:
            train_family(two_problems, SMALL, 80, out, resume=True, teacher_budget=16, imitation_steps=10)
        assert str(resume_path(out)) in str(error.value)
        assert out.read_bytes() == before and resume_path(out).read_bytes() == bad
    resume_path(out).write_bytes(bad_files[0])
    with pytest.raises(PlacerError) as error:
        read_resume_state(out, updates)
    assert f"written at update {updates + 1} and its checkpoint {out} at update {updates}" in str(error.value)


def _saved_bytes(tmp_path, state: dict) -> bytes:
    path = tmp_path / "other.pt"
    torch.save(state, path)
    return path.read_bytes()


def test_resume_with_another_network_is_refused(family_run, two_problems):
    wider = GnnConfig(kind="gdp", hidden_size=16, num_layers=1, batch_size=4)
    with pytest.raises(PlacerError, match="hidden"):
        train_family(two_problems, wider, 80, family_run[0], resume=True)


# ---- the checkpoint file --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imitated(two_problems):
    """A trainer fitted to one placement of the first problem, and that placement."""
    from policies.rl.gnn.trainer import GnnTrainer

    trainer = GnnTrainer(SMALL)
    slot = Slot(two_problems[0].problem, counter=None)
    target = np.array([2, 1, 1, 2, 0, 2, 1, 1])
    trainer.imitate([slot], [target], 300)
    np.testing.assert_array_equal(trainer.greedy(slot), target)
    return trainer, target


def test_round_trip_and_zero_shot_from_it(imitated, two_problems, tmp_path):
    trainer, target = imitated
    path = tmp_path / "sub" / "gdp.pt"
    write_checkpoint(path, "gdp", trainer.state(), {"measurements_used": 7, "problems": ["x@y"]})
    state = read_checkpoint(path, "gdp")
    assert state["progress"] == {"measurements_used": 7, "problems": ["x@y"]}
    assert state["architecture"] == {"kind": "gdp", "hidden_size": 8, "num_layers": 1}
    for key, value in trainer.net.state_dict().items():
        torch.testing.assert_close(state["trainer"]["net"][key], value)
    problem = two_problems[0]
    result = place("gdp", problem.problem, problem.measurer, 1, 5, init=str(path))
    np.testing.assert_array_equal(result.group_placement, target)
    assert result.measurements == 1


def _written(trainer, tmp_path, policy="gdp"):
    path = tmp_path / "ckpt.pt"
    write_checkpoint(path, policy, trainer.state(), {"measurements_used": 0})
    return path


def test_wrong_policy_is_refused(imitated, tmp_path):
    path = _written(imitated[0], tmp_path)
    with pytest.raises(PlacerError, match="placeto") as error:
        read_checkpoint(path, "placeto")
    assert str(path) in str(error.value)


def test_checkpoint_filed_under_another_policy__is_refused_by_its_policy_field(tmp_path):
    """The file's own policy field is checked, with its message, before anything else about the network: a
    gdp network written as a placeto checkpoint is refused as gdp's (its architecture alone, a gdp one, would
    let it through), and a gdp checkpoint read as placeto is named a gdp checkpoint, not only "a 'gdp'
    network"."""
    from policies.rl.gnn.trainer import GnnTrainer

    trainer = GnnTrainer(SMALL)
    mislabelled = tmp_path / "placeto" / "ckpt.pt"
    write_checkpoint(mislabelled, "placeto", trainer.state(), {"measurements_used": 0})
    assert torch.load(mislabelled, weights_only=True)["architecture"]["kind"] == "gdp"  # the premise
    with pytest.raises(PlacerError, match="is a placeto checkpoint, not gdp") as error:
        read_checkpoint(mislabelled, "gdp")
    assert str(mislabelled) in str(error.value)
    path = _written(trainer, tmp_path)
    with pytest.raises(PlacerError, match="is a gdp checkpoint, not placeto"):
        read_checkpoint(path, "placeto")
    assert read_checkpoint(path, "gdp")["policy"] == "gdp"


def test_edited_feature_layout_is_refused(imitated, tmp_path):
    path = _written(imitated[0], tmp_path)
    state = torch.load(path, weights_only=True)
    state["feature_layout"]["pair"] = state["feature_layout"]["pair"][:-1]
    torch.save(state, path)
    with pytest.raises(PlacerError, match="feature layout") as error:
        read_checkpoint(path, "gdp")
    assert str(path) in str(error.value) and "pair" in str(error.value)


def test_truncated_file_is_refused(imitated, tmp_path):
    path = _written(imitated[0], tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PlacerError, match="damaged or truncated") as error:
        read_checkpoint(path, "gdp")
    assert str(path) in str(error.value)


def test_missing_and_foreign_files_are_refused(tmp_path):
    with pytest.raises(PlacerError, match="no such file") as error:
        read_checkpoint(tmp_path / "absent.pt", "gdp")
    assert str(tmp_path / "absent.pt") in str(error.value)
    foreign = tmp_path / "learner.pt"
    torch.save({"policy": "gdp", "trainer": {}}, foreign)
    with pytest.raises(PlacerError, match="not a gdp/placeto/giph checkpoint") as error:
        read_checkpoint(foreign, "gdp")
    assert str(foreign) in str(error.value)
    with pytest.raises(PlacerError, match=str(foreign)):
        place("gdp", None, None, 1, 0, init=str(foreign))


def test_other_format_version_is_refused(imitated, tmp_path):
    path = _written(imitated[0], tmp_path)
    state = torch.load(path, weights_only=True)
    state["version"] = 99
    torch.save(state, path)
    with pytest.raises(PlacerError, match="version 99") as error:
        read_checkpoint(path, "gdp")
    assert str(path) in str(error.value)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["architecture"].update(hidden_size="8"), "needs whole numbers"),  # int("8") let it through
    (lambda s: s["architecture"].update(num_layers=True), "needs whole numbers"),  # int(True) is 1 layer
    (lambda s: s["trainer"]["config"].update(order="zigzag"), "trainer.config.order 'zigzag' is no visiting order"),
])
def test_architecture_values_and_order_the_run_cannot_use_are_refused(imitated, tmp_path, edit, message):
    """Checked as the run will use them (plain ints, a known order), not through int(): a string width ended
    in a TypeError traceback, an unknown order in an error naming no file, both after the run folder was made."""
    path = _written(imitated[0], tmp_path)
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    with pytest.raises(PlacerError, match=message) as error:
        read_checkpoint(path, "gdp")
    assert str(path) in str(error.value)


def test_a_checkpoint_claiming_a_huge_network_is_refused_without_building_it(imitated, tmp_path, monkeypatch):
    """hidden 1024 and 64 layers (within the config's limits): its weights are compared on the meta device,
    where building the network allocated 1.6 GB and took 14 s (17 GiB at the limits) before refusing it."""
    from policies.rl.gnn import network

    path = _written(imitated[0], tmp_path)
    state = torch.load(path, weights_only=True)
    state["architecture"].update(hidden_size=1024, num_layers=64)
    torch.save(state, path)
    devices = set()
    build = network.make_net

    def recording_make_net(*args, **kwargs):
        net = build(*args, **kwargs)
        devices.update(p.device.type for p in net.parameters())
        return net

    monkeypatch.setattr(network, "make_net", recording_make_net)
    with pytest.raises(PlacerError, match="do not fit its architecture") as error:
        read_checkpoint(path, "gdp")
    assert str(path) in str(error.value) and devices == {"meta"}


def test_family_memo_holds_the_teachers_placements(family_run, two_problems):
    """Every teacher's placement is in its problem's memo and best: training never measures it again."""
    out = family_run[0]
    progress = read_checkpoint(out, "gdp")["progress"]
    for problem, slot in zip(two_problems, read_resume_state(out, progress["updates"])):
        teacher = progress["teachers"][problem.name]
        memo = {tuple(row) for row in slot["memo_units"].tolist()}
        assert tuple(teacher["units"]) in memo
        assert slot["best_runtime_s"] <= teacher["runtime_s"]
