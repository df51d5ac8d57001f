"""`placer machines list|show`: the machine catalog."""

from __future__ import annotations

from cluster.commands.console import column_figure
from cluster.jsonout import emit_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("machines", help="list and show machines (devices, links)")
    sub = parser.add_subparsers(dest="machines_command", required=True, metavar="ACTION")
    sub.add_parser("list", help="catalog machines").set_defaults(func=_list)
    show = sub.add_parser("show", help="one machine's devices and links")
    show.add_argument("machine", metavar="NAME_OR_FILE")
    show.add_argument("--json", action="store_true", help="the full machine file (copy it to make your own)")
    show.set_defaults(func=_show)


def _list(args) -> int:
    from measurers.catalog import list_machines, load_machine

    for name in list_machines():
        machine = load_machine(name)
        models = ", ".join(sorted({f"{sum(d.model == m for d in machine.devices)} x {m}"
                                   for m in (d.model for d in machine.devices)}))
        print(f"{name:12s} {machine.num_devices:2d} devices  {models}")
    print(f"{'hetero:SEED':12s} seeded heterogeneous machines: mixed GPU generations or a CPU with its "
          "integrated GPU (seeds from 1000 on: held out from training)")
    return 0


def _show(args) -> int:
    from measurers.catalog import load_machine, machine_to_json

    machine = load_machine(args.machine)
    if args.json:
        emit_json(machine_to_json(machine))
        return 0
    print(f"{machine.name}: {machine.description}")
    print(f"{'device':8s} {'model':15s} {'TFLOP/s':>8s} {'GB/s':>7s} {'memory GB':>9s} {'overhead us':>11s}")
    for d in machine.devices:
        print(f"{d.name:8s} {d.model:15s} {column_figure(d.peak_flops / 1e12, 8, 2)} "
              f"{column_figure(d.mem_bandwidth_Bps / 1e9, 7, 0)} {column_figure(d.memory_bytes / 1e9, 9, 1)} "
              f"{column_figure(d.op_overhead_s * 1e6, 11, 1)}")
    if not machine.links:  # a header over no rows read as a table that failed to print
        print("links: none (one device)" if machine.num_devices == 1 else "links: none")
    else:
        print(f"{'link':16s} {'GB/s':>7s} {'latency us':>10s}  channel")
    for link in machine.links:
        print(f"{link.src + '->' + link.dst:16s} {column_figure(link.bandwidth_Bps / 1e9, 7, 1)} "
              f"{column_figure(link.latency_s * 1e6, 10, 1)}  {link.channel}")
    if machine.profile:  # the figures above were all a reader saw, as if the simulator used them for every op
        print(f"profile {machine.profile} (measured op times: the simulator uses them, not the device figures, "
              "for the ops it times)")
    return 0
