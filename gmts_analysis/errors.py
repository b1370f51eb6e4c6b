"""The one exception type for bad input.

A :class:`GmtsError` carries a one-line message that names the file, line or field
at fault. The CLI prints it as ``gmts: error: <message>`` and exits with status 2,
without a traceback. Library callers can catch it like any exception.
"""


class GmtsError(Exception):
    """User-facing error: bad input, missing path, unsupported option."""

    exit_code = 2
