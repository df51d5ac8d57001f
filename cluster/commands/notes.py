"""Notes the commands print on stderr (not a subcommand: shared by several of them)."""

from __future__ import annotations

import sys


def note_groups_above_colocation(requested_groups: int, colocation_groups: int, graph_name: str) -> bool:
    """One line on stderr when ``--groups`` asks for more groups than the graph has colocation groups:
    grouping never splits a colocation group, so it makes exactly that many. Returns whether it printed."""
    if requested_groups <= colocation_groups:
        return False
    print(f"placer: note: --groups {requested_groups} is more than the {colocation_groups} colocation groups of "
          f"graph {graph_name!r}; using {colocation_groups}", file=sys.stderr)
    return True
