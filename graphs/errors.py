"""The one exception type the command line turns into a clear message and a non-zero exit."""


class PlacerError(Exception):
    """Bad input or an impossible request, with a message that names the problem."""
