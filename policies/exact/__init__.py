"""Exact placement of the coarse groups: a joint placement-and-scheduling model solved by CP-SAT."""
