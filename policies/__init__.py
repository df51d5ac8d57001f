"""Placement policies: heuristics, baselines and learned placers."""
