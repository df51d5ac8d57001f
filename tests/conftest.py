"""Shared test fixtures: a small OpGraph builder and a private benchmark cache for the whole session."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys

import numpy as np
import pytest

import graphs.native_order  # noqa: F401  (before any test module imports TensorFlow)
from graphs.opgraph import PHASE_CODE, OpGraph

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A suite started as a background job (`make test &`) inherits Ctrl-C ignored, as would the placer processes
    # its tests start; the tests of Ctrl-C handling are about a placer run from a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)


class _SignalStack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


SS_DISABLE = 2  # Linux's sigaltstack flag: no alternate signal stack


def _switch_off_a_freed_signal_stack() -> None:
    """OpenVINO's CPU plugin gives the thread that compiles a model an alternate signal stack and, when two
    cores are released in the order they were made, puts back the first one's, already freed: the next signal
    the thread takes (a test's Ctrl-C) then kills the process with SIGSEGV (the suite's CI lost a worker so).
    A stack that lies in no mapping of the process is switched off; signals then run on the thread's own."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    current = _SignalStack()
    if libc.sigaltstack(None, ctypes.byref(current)) != 0 or current.ss_flags & SS_DISABLE or not current.ss_sp:
        return
    with open("/proc/self/maps") as maps:
        spans = [line.split(maxsplit=1)[0].split("-") for line in maps]
    if not any(int(low, 16) <= current.ss_sp < int(high, 16) for low, high in spans):
        libc.sigaltstack(ctypes.byref(_SignalStack(None, SS_DISABLE, 0)), None)


@pytest.fixture(autouse=True)
def _signal_stack_kept_valid():
    yield
    _switch_off_a_freed_signal_stack()


@pytest.fixture(autouse=True, scope="session")
def _private_placer_cache(tmp_path_factory):
    """Point PLACER_CACHE at a per-session temp dir so tests never touch ~/.cache/placer."""
    previous = os.environ.get("PLACER_CACHE")
    os.environ["PLACER_CACHE"] = str(tmp_path_factory.mktemp("placer-cache"))
    yield
    if previous is None:
        os.environ.pop("PLACER_CACHE", None)
    else:
        os.environ["PLACER_CACHE"] = previous


def with_gpu_memory(machine, memory_bytes: int):
    """``machine`` with every GPU's memory set to ``memory_bytes``."""
    import dataclasses

    devices = tuple(dataclasses.replace(d, memory_bytes=int(memory_bytes)) if d.kind == "gpu" else d
                    for d in machine.devices)
    return dataclasses.replace(machine, devices=devices)


def policy_placement(graph: OpGraph, machine, name: str) -> np.ndarray:
    """(N,) op placement of a registry policy (``single-gpu``, ``round-robin``, ``device:K``, ...), made the
    way `placer simulate --policy` makes one (scored once by the simulator)."""
    from measurers.sim.measurer import SimulatorMeasurer
    from policies.registry import place_once

    return place_once(name, graph, machine, SimulatorMeasurer(graph, machine)).op_placement


_RAY_FORWARDED_LINE = re.compile(r"^(\x1b\[[0-9;]*m)*\((raylet|gcs_server|pid=|[A-Za-z_]+ pid=)")


def placer_stderr(err: str) -> str:
    """``err`` without the lines Ray forwards from its own processes (``(raylet) ...``, ``(pid=...) ...``):
    they reach the driver's stderr whenever Ray logs (a full disk, a dying worker), whatever placer printed."""
    return "".join(line for line in err.splitlines(keepends=True) if not _RAY_FORWARDED_LINE.match(line))


def one_placer_error(capsys) -> str:
    """The one ``placer: error: ...`` line (newline included) a refused command printed, asserting that it
    printed nothing else: no stdout, no other stderr line but Ray's forwarded ones."""
    captured = capsys.readouterr()
    assert captured.out == ""
    err = placer_stderr(captured.err)
    assert err.startswith("placer: error: ") and err.count("\n") == 1, err
    return err


def build_graph(edges, num_ops: int | None = None, *, flops=None, out_bytes=None, param_bytes=None,
                kinds=None, colocation=None, phases=None, allowed_mask=None, bytes_accessed=None,
                name: str = "tiny", **extra) -> OpGraph:
    """A hand-made OpGraph. ``edges`` holds (src, dst) or (src, dst, bytes) tuples (bytes default 4);
    per-op values default to flops 1e6, out_bytes 4, param_bytes 0, kind "aten.add". ``phases`` may be
    phase names. Ops are named op0, op1, ..."""
    edges = [tuple(e) if len(e) == 3 else (e[0], e[1], 4) for e in edges]
    n = num_ops if num_ops is not None else (1 + max((max(s, d) for s, d, _ in edges), default=-1))

    def per_op(value, default, dtype):
        return np.full(n, default, dtype=dtype) if value is None else np.asarray(value, dtype=dtype)

    if phases is not None and len(phases) and isinstance(phases[0], str):
        phases = [PHASE_CODE[p] for p in phases]
    return OpGraph(
        name=name, framework="manual",
        op_names=np.array([f"op{i}" for i in range(n)], dtype=object),
        op_kinds=np.array(kinds if kinds is not None else ["aten.add"] * n, dtype=object),
        flops=per_op(flops, 1e6, np.float64),
        bytes_accessed=per_op(bytes_accessed, 0.0, np.float64),
        out_bytes=per_op(out_bytes, 4, np.int64),
        param_bytes=per_op(param_bytes, 0, np.int64),
        edge_src=np.array([e[0] for e in edges], dtype=np.int64),
        edge_dst=np.array([e[1] for e in edges], dtype=np.int64),
        edge_bytes=np.array([e[2] for e in edges], dtype=np.int64),
        colocation=None if colocation is None else np.asarray(colocation, dtype=np.int64),
        phases=None if phases is None else np.asarray(phases, dtype=np.int8),
        allowed_mask=None if allowed_mask is None else np.asarray(allowed_mask, dtype=np.uint8),
        **extra,
    )


def training_chain(layers: int, activation_bytes: int, **extra) -> OpGraph:
    """Forward ops 0..L-1, each output read by the next and by two backward ops (L + i and 2L + i) that run
    after the whole forward pass: the peak, at the forward pass's end, holds every activation. ``extra``:
    more ``build_graph`` arguments (``allowed_mask``)."""
    edges = []
    for i in range(layers):
        edges += [(i, layers + i, activation_bytes), (i, 2 * layers + i, activation_bytes)]
        if i + 1 < layers:
            edges += [(i, i + 1, activation_bytes), (layers + i + 1, layers + i, 0),
                      (layers + i + 1, 2 * layers + i, 0)]
    return build_graph(edges, 3 * layers, out_bytes=[activation_bytes] * layers + [0] * (2 * layers), **extra)


def check_a_resume_inside_a_stall(new_policy, problem, measurer, folder, stall_iterations: int) -> None:
    """A learner whose learner.pt keeps its stall count: a run cut 3 updates into its last stall and resumed
    converges at the update one run does, with the same measurements, best and placement (a count started
    over at 0 went on for a whole stall more); a converged run resumed with a larger budget samples again for
    a whole stall. ``new_policy(context)``: a fresh policy writing its checkpoints through ``context``."""
    from policies.base import RunContext

    def run(name: str, budget: int = 1000, stop_after: int | None = None):
        updates = []
        context = RunContext(checkpoint_dir=folder / name, on_iteration=lambda i, metrics: updates.append(i),
                             should_stop=None if stop_after is None else lambda: len(updates) >= stop_after)
        policy = new_policy(context)
        return policy.place(problem, measurer, budget, 0), policy.trainer.iteration

    whole, whole_updates = run("whole")
    assert whole.stop_reason == "converged" and whole.measurements < 1000
    cut, cut_updates = run("cut", stop_after=whole_updates - 3)  # 3 updates into the last stall
    assert cut.stop_reason == "should_stop" and cut_updates == whole_updates - 3
    resumed, resumed_updates = run("cut")
    assert resumed.stop_reason == "converged" and resumed_updates == whole_updates
    assert resumed.measurements == whole.measurements and resumed.best.runtime_s == whole.best.runtime_s
    np.testing.assert_array_equal(resumed.op_placement, whole.op_placement)
    _, more_updates = run("cut", budget=2000)
    assert more_updates >= whole_updates + stall_iterations


def check_stall_count_in_learner_state(trainer, loaded) -> None:
    """``trainer.state()`` keeps the stall count and ``loaded.load_state`` restores it; a state written before
    the count was saved loads as 0. ``trainer`` and ``loaded``: two trainers of one config."""
    trainer.stalled = 7
    state = trainer.state()
    loaded.load_state(state)
    assert loaded.stalled == 7
    del state["stalled"]  # a learner.pt written before the count was saved
    loaded.load_state(state)
    assert loaded.stalled == 0


@pytest.fixture
def make_graph():
    """The ``build_graph`` helper: ``make_graph([(0, 1), (1, 2, 1024)], flops=[...], ...)``."""
    return build_graph


def fake_gpu_cluster(labels: dict | None = None, num_nodes: int = 2, gpus_per_node: int = 4):
    """A Ray cluster on this machine: a 1-CPU head and ``num_nodes`` nodes of fake GPUs (no CPUs, so
    measurer actors need ``num_cpus=0``). A generator for module fixtures: ``yield from fake_gpu_cluster()``."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # another module's Ray: this one needs its own cluster
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(num_nodes):
        cluster.add_node(num_cpus=0, num_gpus=gpus_per_node, labels=labels or {})
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: one torch thread avoids OpenMP barrier stalls on a busy 2-core machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
