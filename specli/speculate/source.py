"""What a draft is and where it came from: the :class:`Draft` record, its :class:`Source`, and
the buckets prompt lookup's acceptance is learned in. A leaf module: it imports nothing else
from specli, so the controller, the calibration and every drafter can share it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """Which drafter made a draft: ``kind`` is "none", "lookup", "history" (lookup's copy
    from an earlier answer, :mod:`specli.speculate.history`), "model", "mtp" or "forced"
    (tokens a constraint's grammar forces, :mod:`specli.constrain`); lookup's and history's
    acceptance is learned per ``bucket`` of the match (see :func:`lookup_key`)."""

    kind: str
    bucket: int = 0

    @property
    def free(self) -> bool:
        """Drafting costs (almost) nothing: no model runs."""
        return self.kind in ("none", "lookup", "history", "forced")

    @property
    def copy(self) -> bool:
        """A copy of earlier text (from the context or an earlier answer), priced per match."""
        return self.kind in ("lookup", "history")

    def __str__(self) -> str:
        return f"{self.kind}:{BUCKET_NAMES.get(self.bucket, self.bucket)}" if self.bucket else self.kind


NONE, LOOKUP, MODEL, MTP = Source("none"), Source("lookup"), Source("model"), Source("mtp")
FORCED = Source("forced")  # tokens a constraint's grammar forces next (specli.constrain.ForcedDrafter)

LOOKUP_BUCKETS = (2, 4, 8, 16)  # match lengths; the buckets below 0 are kinds of match, not lengths
AMBIGUOUS = -1  # a match the context has gone on from in more than one way
RESYNC = -2  # a copy picked up again just past where the last one broke (see LookupDrafter)
BUCKET_NAMES = {AMBIGUOUS: "ambiguous", RESYNC: "resync"}


def lookup_key(match_len: int, ambiguous: bool = False) -> Source:
    """Lookup acceptance is learned apart by how long the context has matched its source
    (2-3, 4-7, 8-15, 16+ tokens): a long match means the answer is copying that source, and
    the copy tends to go on, so long matches earn long drafts. A match whose n-gram the
    context has already continued in another way (``ambiguous``) is a guess between
    continuations, at any length, and starts right far less often: it is learned apart
    (bucket ``AMBIGUOUS``). The measured rates: research/README.md, "Figures behind lookup's
    buckets"."""
    if ambiguous:
        return Source("lookup", AMBIGUOUS)
    return Source("lookup", max((e for e in LOOKUP_BUCKETS if match_len >= e), default=0))


def history_key(match_len: int) -> Source:
    """A copy from an earlier answer (``--lookup-history``) is learned apart from lookup's
    copies of the context, in the same match-length buckets: whether such a copy goes on
    depends on how alike the answers are, not on how much the answer quotes its prompt."""
    return Source("history", max((e for e in LOOKUP_BUCKETS if match_len >= e), default=0))


@dataclass
class Draft:
    tokens: list[int]
    source: Source = NONE
    # per drafted token: the drafter's confidence (draft model: its top probability;
    # lookup: the matched n-gram length), for the adaptive controller and the stats
    confidence: list[float] = field(default_factory=list)
    # context tokens a draft model evaluated before drafting (catching up on what the target
    # emitted; the whole prompt at the first step): not a cost of the drafted tokens
    caught_up: int = 0
    passes: int = 0  # one-token passes a model drafter made after that (a look past its last token too)
