"""Constrained decoding: JSON schemas, regular expressions and grammars, through llguidance.

A :class:`Constraint` is what the user asked for (a JSON schema, any JSON object, a regular
expression, a Lark or GBNF grammar), checked without a model. A :class:`Guide` is one
generation's grammar state over a model's vocabulary (llguidance's ``LLMatcher``): which
tokens may come next (:meth:`Guide.allowed`), how far a draft may go (:meth:`Guide.clip`),
which tokens the grammar forces next (:meth:`Guide.forced`). The verify loop masks the
target's logits at every position with the matcher's state there, advances the matcher over
the tokens it keeps and rolls back the ones it rejects, so the output is the target's own
constrained output, with or without speculation.

JSON schemas compile to one-line JSON with ``", "`` and ``": "`` between items (as Python's
``json.dumps`` writes it): no free whitespace, so keys and punctuation are forced, and drafted
for free (:class:`specli.speculate.forced.ForcedDrafter`). A schema's own ``x-guidance`` options override that.
"""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specli.errors import SpecliError

try:
    import llguidance
    from llguidance import LLMatcher
except ImportError as e:  # pragma: no cover - import guard for a broken install
    raise SpecliError(f"llguidance is not installed or failed to load: {e}") from None

KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf")
# compact one-line JSON, as json.dumps writes it (a schema's x-guidance overrides these)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What the output must match: ``kind`` in :data:`KINDS`, ``source`` its text (a JSON
    schema as JSON text)."""

    kind: str
    source: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Constraint:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise SpecliError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise SpecliError(f"a JSON schema is an object, not {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object", '{"type": "object"}')

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def lark(cls, text: str) -> Constraint:
        return cls("lark", text)

    @classmethod
    def gbnf(cls, text: str) -> Constraint:
        return cls("gbnf", text)

    def grammar(self) -> str:
        """llguidance's grammar text for this constraint (not yet validated)."""
        try:
            if self.kind in ("json_schema", "json_object"):
                return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            if self.kind == "regex":
                return LLMatcher.grammar_from_regex(self.source)
            if self.kind == "lark":
                return LLMatcher.grammar_from_lark(self.source)
            return llguidance.grammar_from("gbnf", self.source)
        except (ValueError, TypeError) as e:
            raise SpecliError(f"invalid {self.label}: {_first_line(str(e))}") from None

    @property
    def label(self) -> str:
        return {"json_schema": "JSON schema", "json_object": "JSON object constraint", "regex": "regular expression",
                "lark": "Lark grammar", "gbnf": "GBNF grammar"}[self.kind]

    def check(self) -> None:
        """Raise a one-line :class:`SpecliError` if the grammar or schema is invalid."""
        msg = LLMatcher.validate_grammar(self.grammar())
        if msg:
            raise SpecliError(f"invalid {self.label}: {_first_line(msg)}")

    def guide(self, model) -> Guide:
        """A fresh grammar state for one generation on ``model`` (a :class:`specli.engine.Model`)."""
        m = LLMatcher(tokenizer_for(model), self.grammar(), log_level=0)
        if m.is_error():
            raise SpecliError(f"invalid {self.label}: {_first_line(m.get_error())}")
        return Guide(m, model.n_vocab)


def _first_line(msg: str) -> str:
    return next((ln.strip() for ln in msg.splitlines() if ln.strip()), msg.strip()) or "rejected by llguidance"


_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tokenizer_for(model) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for a loaded model, built from its llama.cpp vocabulary once
    (about a second) and kept as long as the model. Every end-of-generation token ends a
    constrained answer where the grammar allows an end."""
    tok = _tokenizers.get(model)
    if tok is None:
        from llguidance.llamacpp import lltokenizer_from_vocab

        eog = [i for i in range(model.n_vocab) if model.is_eog(i)] or None
        with warnings.catch_warnings():  # it reads token attributes through a call now deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            tok = lltokenizer_from_vocab(model.vocab, eos_token=eog)
        _tokenizers[model] = tok
    return tok


class Guide:
    """One generation's grammar state. The loop keeps it at the tokens emitted so far:
    :meth:`masks` hands out the allowed tokens at each position of a draft (consuming the
    draft as far as asked), :meth:`settle` then rolls back what the target rejected and
    consumes what it emitted."""

    def __init__(self, matcher: LLMatcher, n_vocab: int):
        self.m = matcher
        self.n_vocab = n_vocab
        self._bits = np.zeros(((n_vocab + 31) // 32,), dtype=np.int32)
        self._ahead: list[int] = []  # draft tokens consumed past the emitted ones
        self.chained = False  # drafts run on through forced tokens (ForcedDrafter): a model draft stops at them

    @property
    def stopped(self) -> bool:
        """The grammar is complete: nothing but an end of generation may follow."""
        return self.m.is_stopped()

    def _check(self) -> None:
        if self.m.is_error():
            raise SpecliError(f"constraint error: {_first_line(self.m.get_error())}")

    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: the tokens the grammar allows next."""
        self.m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._check()
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.n_vocab].astype(bool)

    def clip(self, draft: Sequence[int]) -> list[int]:
        """The longest prefix of ``draft`` the grammar allows, ending at the token that
        completes the grammar, if one does. Leaves the state as it was."""
        d = list(draft)
        n = self.m.try_consume_tokens(d) if d else 0
        if n and self.m.is_stopped():  # find the token that completed it
            self.m.rollback(n)
            n = 0
            while not self.m.is_stopped():
                self.m.consume_token(d[n])
                n += 1
        if n:
            self.m.rollback(n)
        return d[:n]

    def masks(self, draft: Sequence[int]) -> _Masks:
        """The allowed tokens after the emitted tokens plus ``draft[:i]``, for i = 0..len(draft)
        (``draft`` must be clipped), computed as the verify rule asks for them."""
        return _Masks(self, list(draft))

    def drafting(self, draft, top, step):
        """Run ``draft(top, step)`` (a greedy drafter's loop) under the grammar: ``top`` sees
        each row masked by the grammar after the tokens drafted so far, ``step`` advances the
        grammar over each; afterwards the grammar is rolled back to where it was."""
        pushed = 0

        def g_top(row):
            return top(np.where(self.allowed(), row, -np.inf))

        def g_step(tok):
            nonlocal pushed
            self.m.consume_token(tok)
            pushed += 1
            return step(tok)

        try:
            return draft(g_top, g_step)
        finally:
            if pushed:
                self.m.rollback(pushed)

    def consume_ahead(self, tok: int) -> None:
        """Consume a draft token past the emitted ones (:meth:`masks`; :meth:`settle` then
        rolls back what the target did not keep)."""
        self.m.consume_token(tok)
        self._ahead.append(tok)

    @property
    def ahead(self) -> int:
        """Draft tokens consumed past the emitted ones."""
        return len(self._ahead)

    def forced(self, max_len: int) -> list[int]:
        """Tokens the grammar forces next (llguidance's fast-forward tokens), up to ``max_len``."""
        return self.m.compute_ff_tokens()[:max_len] if max_len > 0 else []

    def extend(self, head: Sequence[int], room: int, copy, forced: int = 0) -> list[int]:
        """Up to ``room`` tokens to draft after ``head`` (a clipped draft whose last ``forced``
        tokens the grammar forced): the tokens the grammar then forces; after forced tokens,
        what ``copy(tokens so far, n, forced)`` copies on from the context (prompt lookup,
        told how many forced tokens end them), then what that forces, and so on, as far as
        the grammar allows. A draft that fills a value runs on through the keys and
        punctuation after it for free; a drafter's own draft is not copied on (it chose its
        length). Leaves the state as it was."""
        m = self.m
        pushed = m.try_consume_tokens(list(head)) if head else 0
        out: list[int] = []
        try:
            if pushed < len(head):
                return []
            while len(out) < room and not m.is_stopped():
                more = m.compute_ff_tokens()[:room - len(out)]
                copied = not more
                if copied and forced:
                    more = self.clip(copy(list(head) + out, room - len(out), forced))
                if not more:
                    break
                n = m.try_consume_tokens(more)
                pushed += n
                out += more[:n]
                forced = 0 if copied else forced + n
                if n < len(more):
                    break
        finally:
            if pushed:
                m.rollback(pushed)
        return out

    def forces_after(self, tok: int) -> bool:
        """Whether the grammar forces the token after ``tok`` (a model drafter stops there when
        the draft runs on through forced tokens for free, :meth:`extend`)."""
        n = self.m.try_consume_tokens([tok])
        try:
            return bool(n) and not self.m.is_stopped() and bool(self.m.compute_ff_tokens())
        finally:
            if n:
                self.m.rollback(n)

    def settle(self, emitted: Sequence[int]) -> int:
        """After a verify step: roll back the drafted tokens consumed past the kept ones and
        consume the rest of ``emitted``. Returns how many of ``emitted`` count: all, or up to
        the token that completed the grammar."""
        ahead = self._ahead
        keep = 0
        while keep < len(ahead) and keep < len(emitted) and ahead[keep] == emitted[keep]:
            keep += 1
        if len(ahead) > keep:
            self.m.rollback(len(ahead) - keep)
        self._ahead = []
        n = keep
        if n and self.stopped:  # the kept draft completed the grammar (clip ends a draft there)
            return n
        for t in emitted[keep:]:
            if not self.m.consume_token(t):
                self._check()
            n += 1
            if self.stopped:
                break
        return n


class _Masks:
    """The masks of one verify block, computed lazily in order (the verify rule stops at the
    first rejection; the later ones are never needed)."""

    def __init__(self, guide: Guide, draft: list[int]):
        self.g, self.draft, self.rows = guide, draft, []

    def __len__(self) -> int:
        return len(self.draft) + 1

    def __getitem__(self, i: int) -> np.ndarray:
        g = self.g
        while len(self.rows) <= i:
            j = len(self.rows)
            if j:
                g.consume_ahead(self.draft[j - 1])
            self.rows.append(g.allowed())
        return self.rows[i]


def from_options(json_schema: str | None = None, regex: str | None = None,
                 grammar: str | None = None) -> Constraint | None:
    """The constraint ``specli run`` was given: a JSON schema file, a regular expression, or a
    grammar file (GBNF, Lark when it ends in .lark), at most one; checked, so a bad one fails
    before any model loads."""
    given = [(flag, v) for flag, v in (("--json-schema", json_schema), ("--regex", regex), ("--grammar", grammar))
             if v is not None]
    if len(given) > 1:
        raise SpecliError(f"give one constraint: {' and '.join(f for f, _ in given)} exclude each other")
    if not given:
        return None
    flag, value = given[0]
    if flag == "--regex":
        c = Constraint.regex(value)
    else:
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise SpecliError(f"{flag}: file not found: {value}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecliError(f"{flag}: cannot read {value}: {getattr(e, 'strerror', None) or e}") from None
        if flag == "--json-schema":
            try:
                c = Constraint.json_schema(text)
            except SpecliError as e:
                raise SpecliError(f"{value}: {e}") from None
        else:
            c = Constraint.lark(text) if value.endswith(".lark") else Constraint.gbnf(text)
    c.check()
    return c
