"""One OpenVINO core per process (measurers.openvino.core): two measurers built by the product's factory, each
having compiled, released in the order they were made, used to leave the compiling thread's alternate signal
stack on freed memory, and the user's Ctrl-C then killed the process with SIGSEGV. Run in a child process
without the suite's guard (conftest ``_switch_off_a_freed_signal_stack``): the crash is the point."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("openvino")

from measurers.factory import MeasurerSpec, build_measurer  # noqa: E402
from measurers.openvino.core import openvino_core  # noqa: E402
from measurers.openvino.devices import openvino_machine  # noqa: E402
from measurers.openvino.sample import save_sample_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

TWO_MEASURERS_THEN_CTRL_C = """
    import gc, signal
    import numpy as np
    from graphs.inference.openvino_import import import_openvino_ir
    from measurers.factory import MeasurerSpec, build_measurer
    from measurers.openvino.devices import openvino_machine
    from measurers.openvino.sample import save_sample_model

    graph = import_openvino_ir(str(save_sample_model({folder!r})))
    spec = MeasurerSpec("openvino", graph, openvino_machine(), runs=1, warmup=0)
    first, second = build_measurer(spec), build_measurer(spec)
    statuses = [m.measure([np.zeros(graph.num_ops, np.int64)])[0].status for m in (first, second)]
    del first  # released in the order they were made (a list would release the last first)
    gc.collect()
    del second
    gc.collect()
    signal.signal(signal.SIGINT, lambda signum, frame: print("handled", *statuses, flush=True))
    signal.raise_signal(signal.SIGINT)
    """


def test_openvino_core__ctrl_c_after_two_measurers_are_released_is_handled(tmp_path):
    script = textwrap.dedent(TWO_MEASURERS_THEN_CTRL_C).format(folder=str(tmp_path))
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert (child.returncode, child.stdout) == (0, "handled ok ok\n"), child.stderr[-2000:]


def test_openvino_core__the_machine_and_every_factory_measurer_use_the_one_core(tmp_path):
    from graphs.inference.openvino_import import import_openvino_ir

    graph = import_openvino_ir(str(save_sample_model(tmp_path)))
    spec = MeasurerSpec("openvino", graph, openvino_machine(), runs=1, warmup=0)
    first, second = build_measurer(spec), build_measurer(spec)
    assert first.core is second.core is openvino_core()
