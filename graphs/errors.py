"""The one exception type the command line turns into a clear message and a non-zero exit, and the check
of a count most bad-input messages need."""

import numbers


class PlacerError(Exception):
    """Bad input or an impossible request, with a message that names the problem."""


def first_line(error: BaseException | str, empty: str = "no detail") -> str:
    """The first line of an exception's message (a foreign library's or a user's may run to many): what an
    error of one line quotes."""
    text = str(error).strip()
    return text.splitlines()[0] if text else empty


def is_whole_number(value) -> bool:
    """An int (Python's or numpy's), not a bool and not a float, even an integral one: a count or a seed."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
