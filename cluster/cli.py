"""`placer`: the command line. Subcommands live in cluster/commands/, one module each."""

from __future__ import annotations

import argparse
import importlib
import sys

from cluster.commands import COMMAND_MODULES
from cluster.jsonout import json_stdout
from graphs.errors import PlacerError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="placer", description="Device placement of neural-network graphs.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "json", False):
        with json_stdout():  # stdout: the one JSON document; everything else (Ray, C libraries): stderr
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except PlacerError as exc:
        print(f"placer: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("placer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
