"""The one exception type the command line turns into a clear message and a non-zero exit, and the check
of a count most bad-input messages need."""

import numbers


class PlacerError(Exception):
    """Bad input or an impossible request, with a message that names the problem."""


def is_whole_number(value) -> bool:
    """An int (Python's or numpy's), not a bool and not a float, even an integral one: a count or a seed."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
