"""Op graphs: the IR, its file format, importers, benchmark graphs and grouping."""

from graphs.errors import PlacerError
from graphs.opgraph import OpGraph

__all__ = ["OpGraph", "PlacerError"]
