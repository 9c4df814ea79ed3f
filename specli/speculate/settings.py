"""The settings: one record, one place for each default. The CLI, profiles, sessions, the
engine, the loop, the controller and bench all take their defaults from :data:`DEFAULTS`
(the context size from :data:`N_CTX`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecSettings:
    draft_max: int = 16  # most tokens drafted per step
    # the draft model stops when its top probability falls below this when drafting a fixed
    # length (--fixed); the adaptive controller instead prices every further token
    draft_p_min: float = 0.6
    adaptive: bool = True  # cost-aware controller; False: always draft up to draft_max
    lookup_ngram: tuple[int, int] = (1, 8)  # n-gram sizes prompt lookup matches
    lookup_min_match: int = 2  # shortest match lookup drafts from
    # earlier answers lookup also copies from (specli.speculate.history.parse_bound): at most 256
    # answers and 100k tokens (about 30 MB), the oldest evicted first; "0": none
    lookup_history: str = "256,100k"


DEFAULTS = SpecSettings()
N_CTX = 4096  # context size in tokens when --ctx is not given (0: the model's own)
