"""One exception type for every user-facing mistake, so the CLI and server can turn it into a
clean one-line message (CLI exit code 2, HTTP 400) instead of a traceback."""


class SpecdecError(ValueError):
    """Bad input from the user: a wrong path, parameter, model folder or prompt."""
