"""The one exception type the command line turns into a clear message and a non-zero exit, and the check
of a count most bad-input messages need."""

import numbers
import re


class PlacerError(Exception):
    """Bad input or an impossible request, with a message that names the problem."""


def first_line(error: BaseException | str, empty: str = "no detail") -> str:
    """The first line of an exception's message (a foreign library's or a user's may run to many): what an
    error of one line quotes."""
    text = str(error).strip()
    return text.splitlines()[0] if text else empty


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Keras colours and bolds its messages on a terminal


def one_line(error: BaseException | str, max_chars: int = 400, empty: str = "no detail") -> str:
    """An exception's whole message on one line (terminal escapes dropped, lines and spaces joined), cut at
    ``max_chars``: where the first line says nothing ("Exception encountered when calling Sequential.call()."),
    what follows it is the point, and the error stays one line."""
    text = " ".join(ANSI_ESCAPE.sub("", str(error)).split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)  # a raw byte in pyarrow's words
    if not text:
        return empty
    return text if len(text) <= max_chars else text[: max_chars - 3].rstrip() + "..."


def is_whole_number(value) -> bool:
    """An int (Python's or numpy's), not a bool and not a float, even an integral one: a count or a seed."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


MAX_SEED = 2**32 - 1  # what every seeded library here takes (METIS options, numpy's legacy seeding)


def check_seed(seed: int, what: str = "a seed") -> None:
    """``what`` names it in the message (the command line's flag: ``--seed``)."""
    if not is_whole_number(seed) or not 0 <= seed <= MAX_SEED:
        raise PlacerError(f"{what} must be a whole number in 0..{MAX_SEED}, got {seed!r}")


def raise_interrupt_within(error: SystemError) -> None:
    """Raise the KeyboardInterrupt chained inside ``error``, if any. A Ctrl-C (or a SIGTERM taken as one) that
    lands while numba-compiled code calls back into Python (``_numba_unpickle``) comes out of the compiled
    call as SystemError("... returned a result with an exception set"), the KeyboardInterrupt a few causes
    down: a command then crashed with a traceback instead of stopping as on any Ctrl-C."""
    cause, seen = error, set()
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt(*cause.args) from None
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
