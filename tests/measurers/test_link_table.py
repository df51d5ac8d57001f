import numpy as np
import pytest

from measurers.catalog import load_machine
from measurers.sim.costs import transfer_time_s
from measurers.sim.links import link_table


@pytest.mark.parametrize("name", ["paper-2gpu", "paper-4gpu", "dgx1-v100"])
def test_link_table_agrees_with_the_cost_function_on_every_pair(name):
    machine = load_machine(name)
    links = link_table(machine)
    matrix = links.transfer_matrix_s(np.array([0.0, 3e6]))  # (2, D, D)
    for src in range(machine.num_devices):
        for dst in range(machine.num_devices):
            for k, nbytes in enumerate((0.0, 3e6)):
                expected = transfer_time_s(machine, src, dst, nbytes)
                assert links.transfer_s(src, dst, nbytes) == pytest.approx(expected, rel=1e-12)
                assert matrix[k, src, dst] == pytest.approx(expected, rel=1e-12)
            if src != dst:
                assert links.channel_names[links.channel_of[src, dst]] == machine.link(src, dst).channel


def test_gpu_to_gpu_copies_on_paper_4gpu_share_one_channel():
    links = link_table(load_machine("paper-4gpu"))
    gpu_pairs = {int(links.channel_of[a, b]) for a in range(1, 5) for b in range(1, 5) if a != b}
    assert len(gpu_pairs) == 1
    assert links.channel_of[0, 1] != links.channel_of[1, 0]  # host-to-device and back are two channels


def test_a_one_device_machine_has_no_links_and_free_transfers():
    from measurers.machine import Device, Machine

    machine = Machine("one", (Device("cpu:0", "cpu", "x", 1e12, 1e11, 2**30, 1e-6),), ())
    links = link_table(machine)
    assert links.channel_of.tolist() == [[-1]]
    assert links.transfer_matrix_s(np.array([5.0])).tolist() == [[[0.0]]]
    assert links.transfer_s(0, 0, 1e9) == 0.0
