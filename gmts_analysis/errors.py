"""The one exception type for bad input.

A :class:`GmtsError` carries a one-line message that names the file, line or field
at fault. The CLI prints it as ``gmts: error: <message>`` and exits with status 2,
without a traceback. Library callers can catch it like any exception.
"""


class GmtsError(Exception):
    """User-facing error: bad input, missing path, unsupported option."""

    exit_code = 2


class FieldError(ValueError):
    """A settings dataclass's field out of its domain, raised as the dataclass is built (its ``__post_init__``).

    A ``ValueError`` as TRL's configs raise (its message names the field: ``selection_rho must be in (0, 1],
    got 0``), which also carries the ``field`` and the ``value`` given, so that a command line can name the flag
    (``--selection_rho 0: ...``) without checking the value a second time."""

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.value = value
