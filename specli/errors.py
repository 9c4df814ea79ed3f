"""One exception type for every user-facing failure: the CLI prints its message as one line."""


class SpecliError(Exception):
    """An error the user can act on. ``str(e)`` is a single line, without a traceback."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class TokenizerMismatch(SpecliError):
    """Target and draft do not share a vocabulary, so drafted tokens would mean other text."""
