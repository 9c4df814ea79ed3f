"""The exceptions every user-facing failure raises: the CLI prints one as one line.

Library errors carry data (sizes, names) and a ``hint`` that names the command-line flag
that fixes them; a server or another caller can use the data and ignore the flags.
"""


class SpecliError(Exception):
    """An error the user can act on. ``str(e)`` is a single line, without a traceback."""

    hint: str | None = None  # the flag or command that fixes it, for the CLI

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class TokenizerMismatch(SpecliError):
    """Target and draft do not share a vocabulary, so drafted tokens would mean other text."""

    hint = "use a draft from the same model family, or --draft lookup"


class PromptTooLong(SpecliError):
    hint = "use a larger --ctx or a shorter prompt"

    def __init__(self, n_prompt: int, n_ctx: int):
        super().__init__(f"the prompt is {n_prompt} tokens, longer than the context ({n_ctx} tokens)")
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


class ContextFull(SpecliError):
    hint = "use a larger --ctx"

    def __init__(self, needed: int, n_ctx: int):
        super().__init__(f"context full: {needed} tokens do not fit in a context of {n_ctx}")
        self.needed, self.n_ctx = needed, n_ctx


class Interrupted(SpecliError):
    """A request stopped between two chunks of its prompt (its client left): what was
    evaluated stays cached, consistent."""

    def __init__(self):
        super().__init__("interrupted between two chunks of the prompt")


class NoChatTemplate(SpecliError):
    hint = "use --raw"

    def __init__(self, model_name: str, detail: str | None = None):
        super().__init__(f"{model_name}'s chat template failed: {detail}" if detail
                         else f"{model_name} has no chat template")
        self.model_name = model_name
