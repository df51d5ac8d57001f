"""The METIS baseline never asks METIS for more parts than it has units to place."""

from __future__ import annotations

import numpy as np
import pymetis
from conftest import build_graph

from measurers.catalog import load_machine
from policies.metis import metis_units
from policies.problem import make_problem


def _spy_on_metis(monkeypatch) -> list[tuple[int, int]]:
    calls = []
    real = pymetis.part_graph

    def spy(nparts, adjacency=None, *args, **kwargs):
        starts = adjacency.adj_starts if adjacency is not None else kwargs["xadj"]
        calls.append((int(nparts), len(starts) - 1))
        return real(nparts, adjacency, *args, **kwargs)

    monkeypatch.setattr(pymetis, "part_graph", spy)
    return calls


def test_metis_units__fewer_units_than_gpus_puts_each_unit_on_its_own_gpu(monkeypatch):
    calls = _spy_on_metis(monkeypatch)
    machine = load_machine("paper-8gpu")
    problem = make_problem(build_graph([(0, 1, 10**6), (1, 2, 10**6)]), machine)  # 3 units, 8 GPUs
    units, cut_bytes = metis_units(problem)
    assert calls == []  # never METIS with 8 parts of 3 vertices
    assert len(set(units.tolist())) == 3 and set(units.tolist()) <= set(problem.gpu_indices())
    assert cut_bytes == 2e6


def test_metis_units__more_units_than_gpus_still_partitions_with_metis(monkeypatch):
    calls = _spy_on_metis(monkeypatch)
    machine = load_machine("paper-2gpu")
    problem = make_problem(build_graph([(i, i + 1, 1000) for i in range(11)]), machine)  # 12 units, 2 GPUs
    units, _ = metis_units(problem)
    assert calls == [(2, 12)]
    assert np.isin(units, problem.gpu_indices()).all()
