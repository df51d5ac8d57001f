"""Notes the commands print on stderr (not a subcommand: shared by several of them)."""

from __future__ import annotations

import sys


def groups_asked(requested_groups: int, given: bool) -> str:
    """``--groups N`` as the user gave it, or the default named as the default (no flag was given)."""
    return f"--groups {requested_groups}" if given else f"the default of {requested_groups} groups (--groups)"


def note_groups_above_colocation(requested_groups: int, colocation_groups: int, graph_name: str, *,
                                 given: bool) -> bool:
    """One line on stderr when ``--groups`` (``given``: on the command line, else its default) asks for more
    groups than the graph has colocation groups: grouping never splits a colocation group, so it makes exactly
    that many. Returns whether it printed."""
    if requested_groups <= colocation_groups:
        return False
    print(f"placer: note: {groups_asked(requested_groups, given)} is more than the {colocation_groups} colocation "
          f"groups of graph {graph_name!r}; using {colocation_groups}", file=sys.stderr)
    return True


def note_fewer_groups_than_asked(requested_groups: int, made_groups: int, colocation_groups: int,
                                 graph_name: str, method: str, *, given: bool) -> bool:
    """One line on stderr when the grouping made fewer groups than min(--groups, colocation groups): "topo"
    runs of equal cost can leave fewer runs, METIS can leave parts empty. Returns whether it printed."""
    expected_groups = min(requested_groups, colocation_groups)
    if made_groups >= expected_groups:
        return False
    print(f"placer: note: the {method} grouping made {made_groups} groups of graph {graph_name!r}, fewer than the "
          f"{expected_groups} asked for ({groups_asked(requested_groups, given)}, {colocation_groups} colocation "
          f"groups)", file=sys.stderr)
    return True
