"""Build a measurer from a picklable description, so a Ray actor on any node can build its own.

A ``MeasurerSpec`` carries the graph and machine objects themselves (the pool ships the spec through
Ray's object store once), so worker nodes need no files. ``build_measurer(spec)`` turns it into a
``Measurer``. The pool accepts either a spec or any zero-argument factory returning a measurer; tests
pass their own factories (a measurer that sleeps, hangs or kills its process). Example::

    spec = MeasurerSpec("sim", graph, machine, runs=3, noise_std=0.02, seed=7)
    measurer = build_measurer(spec)
    measurer.measure([np.zeros(graph.num_ops, dtype=np.int64)])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph
from measurers.base import Measurer
from measurers.machine import Machine
from measurers.timing import REAL_TIMING, check_noise_std, default_timing

MEASURER_KINDS = ("sim", "torch", "tf", "openvino")


@dataclass(frozen=True)
class MeasurerSpec:
    kind: str  # one of MEASURER_KINDS
    graph: OpGraph  # the graph itself, not a file name
    machine: Machine  # the devices of one node, in the order placements index them
    runs: int | None = None  # timed runs per placement, the median reported; None: default_timing(kind)
    warmup: int | None = None  # untimed runs before the timed ones; None: default_timing(kind)
    noise_std: float = 0.0  # relative noise of the simulator's samples (0: exact)
    seed: int = 0
    timeout_s: float = REAL_TIMING.timeout_s  # limit for one placement; the pool enforces it by killing the actor

    def __post_init__(self) -> None:
        if self.kind not in MEASURER_KINDS:
            raise PlacerError(f"unknown measurer kind {self.kind!r} (known: {', '.join(MEASURER_KINDS)})")
        default = default_timing(self.kind)
        if self.runs is None:
            object.__setattr__(self, "runs", default.runs)
        if self.warmup is None:
            object.__setattr__(self, "warmup", default.warmup)
        if self.runs < 1:
            raise PlacerError(f"measurer runs must be at least 1, got {self.runs}")
        if self.warmup < 0:
            raise PlacerError(f"measurer warmup must not be negative, got {self.warmup}")
        check_noise_std(self.noise_std, "measurer noise_std")
        if not self.timeout_s > 0:
            raise PlacerError(f"measurer timeout_s must be positive, got {self.timeout_s}")


def build_measurer(spec: MeasurerSpec) -> Measurer:
    """The measurer ``spec`` describes, built in this process."""
    if spec.kind == "sim":
        from measurers.sim.measurer import SimulatorMeasurer

        return SimulatorMeasurer(spec.graph, spec.machine, runs=spec.runs, noise_std=spec.noise_std,
                                 seed=spec.seed)
    machine = _node_machine(spec.machine)
    if spec.kind == "torch":
        from measurers.torch.measurer import TorchMeasurer

        return TorchMeasurer(spec.graph, machine, runs=spec.runs, warmup=spec.warmup, timeout_s=spec.timeout_s,
                             seed=spec.seed)
    if spec.kind == "openvino":
        from measurers.openvino.measurer import OpenVinoMeasurer

        return OpenVinoMeasurer(spec.graph, machine, runs=spec.runs, warmup=spec.warmup, timeout_s=spec.timeout_s,
                                seed=spec.seed)
    from graphs.tensorflow_quiet import import_tensorflow_quietly

    import_tensorflow_quietly()  # in a pool's actor too: its start-up lines reached the driver's stderr
    from measurers.tf.measurer import TFMeasurer

    return TFMeasurer(spec.graph, machine, runs=spec.runs, warmup=spec.warmup, timeout_s=spec.timeout_s,
                      seed=spec.seed)


def _node_machine(machine: Machine) -> Machine:
    """The ``local`` machine is re-read where the measurer runs (a Ray actor sees the GPUs Ray gave it);
    placements index the spec's devices, so the node must have the same ones."""
    if not machine.meta.get("local"):
        return machine
    from measurers.local import local_machine

    here = local_machine()
    if [d.name for d in here.devices] != [d.name for d in machine.devices]:
        raise PlacerError(f"machine 'local' was {[d.name for d in machine.devices]} where the search started "
                          f"but this node has {[d.name for d in here.devices]}")
    return here


class SpecFactory:
    """A zero-argument measurer factory bound to a spec (picklable, unlike a lambda in a closure)."""

    def __init__(self, spec: MeasurerSpec):
        self.spec = spec

    def __call__(self) -> Measurer:
        return build_measurer(self.spec)


MeasurerFactory = Callable[[], Measurer]


def as_factory(measurer: MeasurerSpec | MeasurerFactory) -> MeasurerFactory:
    """A spec becomes a SpecFactory; a callable is taken as it is."""
    if isinstance(measurer, MeasurerSpec):
        if measurer.kind != "sim":
            build_measurer(measurer)  # fail here, in the driver, with the clear message
        return SpecFactory(measurer)
    if not callable(measurer):
        raise PlacerError(f"a measurer pool needs a MeasurerSpec or a factory, got {type(measurer).__name__}")
    return measurer
