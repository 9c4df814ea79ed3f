"""Exact Python ports of llama.cpp's default speculative policies, for a noise-free replay
benchmark: given the same token history (and, for draft-simple, the draft model's
probabilities) they propose exactly what llama.cpp would. Reference: the llama.cpp vendored by
llama-cpp-python 0.3.36 (``vendor/llama.cpp``); ``spec.cpp`` below is common/speculative.cpp.

How llama.cpp calls a policy (llama-server, tools/server/server-context.cpp):
- ``begin(prompt)`` once per generation, after the prompt is evaluated, with the prompt's
  tokens (server-context.cpp:3821). The table of ngram-mod is shared and outlives it.
- ``draft`` with ``prompt`` = every token in the target's cache and ``id_last`` = the token
  just sampled, not yet in the cache (server-context.cpp:3005-3012; speculative.h:64-68).
  specli's ``context`` is both: ``context[:-1]`` is llama.cpp's prompt, ``context[-1]`` its
  ``id_last``.
- only when the draft cap ``n_draft_max`` > 0 (server-context.cpp:2985); the cap is
  ``n_ctx - n_cached - 2``, and ``n_remaining - 1`` when a token budget is set
  (server-context.cpp:453-472). A policy's draft longer than the cap is truncated after the
  policy ran (spec.cpp:2832-2836), so its own minimum-length rules see the uncut draft.
- ``accept(n_accepted)`` only after a non-empty draft (server-context.cpp:3880-3882, 3945).
  (examples/speculative-simple calls it every step, speculative-simple.cpp:291; for these
  policies an accept after an empty draft is a no-op either way.)

NgramSimple (spec.cpp:1750-1793, common/ngram-map.cpp:49-112): stateless, ``begin`` and
``accept`` are no-ops (spec.cpp:1768, 1790). ``min_hits`` is only printed (spec.cpp:1764); the
simple config has no such field (ngram-map.h:24-27), so it changes nothing.
- nothing unless ``len(prompt) > size_n + size_m + 1`` (ngram-map.cpp:65)
- pattern: the last ``size_n - 1`` cached tokens + ``id_last`` (ngram-map.cpp:72-75)
- searched from position ``len - size_n - 1`` down to 1, first hit wins; position 0 is never
  matched (ngram-map.cpp:77-94)
- draft: up to ``size_m`` tokens after the match, only cached tokens (never ``id_last``); fewer
  than ``size_n`` available gives nothing (ngram-map.cpp:96-111)
- the policy's n_max is ``size_m`` (spec.cpp:1759)

NgramMod (spec.cpp:1849-2022, common/ngram-mod.cpp):
- a table of 4*1024*1024 int32 slots, -1 = empty (spec.cpp:1876, ngram-mod.h:14-16); slot of an
  n-gram: ``res = res*6364136223846793005 + tok`` over its ``n_match`` tokens in size_t, then
  ``% size`` (ngram-mod.cpp:15-25); ``add`` writes the next token over whatever is in the slot
  and counts ``used`` only when it was empty (ngram-mod.cpp:27-35). Collisions overwrite.
- begin: ``i_last = n_draft_last = 0``; if ``len(prompt) >= n``, add the n-grams starting at
  0 .. len-n-1, ``i_last = len - n``; then if used/size > 0.25 reset the table
  (spec.cpp:1894-1920). ``n_low`` is not touched.
- draft: ``n_draft_last = 0``; nothing if ``len(prompt) < n``; if ``i_last + 32 < len`` add
  the n-grams starting at i_last .. len-n-1 (all with their next token inside the cache) and
  ``i_last = len - n`` (spec.cpp:1930-1946). Then from the key (last n-1 cached tokens +
  id_last) look up up to ``n_max`` tokens, sliding the key over what it found; an empty slot at
  step i < n_min gives no draft, else the draft stops there (spec.cpp:1948-1972).
  ``n_draft_last`` = the draft's length before any cap (spec.cpp:1975).
- accept (own drafts only, spec.cpp:1997): with ``n_draft_last > 0``, if
  ``n_accepted / n_draft_last < 0.25`` then ``n_low += 1`` and at 5 the table is reset,
  ``n_low = i_last = 0``; otherwise ``n_low = 0`` (spec.cpp:2003-2020; the comment at
  spec.cpp:1865 says 0.5, the code uses 0.25). After a reset the next draft re-adds every
  n-gram of the history (``i_last = 0``).

draft-simple (spec.cpp:179-418), the draft-model policy, defaults n_max=3, n_min=0, p_min=0
(common/common.h:327-332). Each step the draft model's row goes through the sampler chain
logit-bias(suppressed tokens) -> top-k 10 -> dist (spec.cpp:232-240, sampling.cpp:329-393); the
draft token is ``cur_p[0]`` after sorting by p, i.e. the argmax (greedy; the dist sampler's
random pick is ignored), and its ``p`` is the softmax over the top 10 logits only
(llama-sampler.cpp:1170-1208), see :func:`draft_simple_p`. Before appending a token: stop if
``p < p_min`` (also for the first token; never with p_min 0) (spec.cpp:366-371). After
appending: stop at ``n_max`` tokens or at the server's cap (spec.cpp:380-385). There is no
end-of-generation stop. At the end a draft shorter than ``n_min`` is dropped (spec.cpp:409-411).
With the defaults it therefore always submits exactly min(3, cap) greedy tokens. ``p_split``
(common.h:331) is not used by draft-simple, only by examples/speculative (speculative.cpp:67).
``accept`` is a no-op (spec.cpp:415). See :func:`draft_simple_length`.

Combined speculation exists but is not ported: ``--spec-type`` takes a comma list
(arg.cpp:4249-4256); the policies are tried in a fixed priority order, ngram-simple,
ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, draft-simple, eagle3, mtp, dflash, dspark
(spec.cpp:2616-2626), and the first non-empty draft wins, later policies are not called that
step (spec.cpp:2810-2860). ``accept`` goes to the winner; the others get ``is_other`` and
ngram-simple/ngram-mod ignore it (spec.cpp:2872-2906).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specli.speculate.drafters import Drafter
from specli.speculate.source import LOOKUP, Draft

_U64 = (1 << 64) - 1
_MULT = 6364136223846793005


def ngram_simple_draft(tokens: Sequence[int], sampled: int, size_n: int = 12, size_m: int = 48) -> list[int]:
    """``common_ngram_simple_draft`` (ngram-map.cpp:49-112): ``tokens`` are the cached tokens,
    ``sampled`` the token just sampled."""
    cur_len = len(tokens)
    if cur_len <= size_n + size_m + 1:
        return []
    pattern = list(tokens[cur_len - size_n + 1:]) + [sampled]
    first = pattern[0]
    match_pos = 0
    for j in range(cur_len - size_n - 1, 0, -1):
        if tokens[j] == first and list(tokens[j:j + size_n]) == pattern:
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(size_m, cur_len - (match_pos + size_n))
    if copy_max < size_n:
        return []
    start = match_pos + size_n
    return list(tokens[start:start + copy_max])


class NgramSimple(Drafter):
    """llama.cpp's ngram-simple (``--spec-type ngram-simple``). A draft's confidence is
    ``size_n`` (the matched length) for every token."""

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1):
        self.size_n, self.size_m = size_n, size_m
        self.min_hits = min_hits  # unused, as in llama.cpp (spec.cpp:1764)

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if max_len <= 0 or not context:
            return Draft([], LOOKUP)
        toks = ngram_simple_draft(context[:-1], context[-1], self.size_n, self.size_m)[:max_len]
        return Draft(toks, LOOKUP, [float(self.size_n)] * len(toks))


class ModTable:
    """``common_ngram_mod`` (ngram-mod.cpp): a fixed-size table indexed by an n-gram's hash,
    holding the token that last followed an n-gram with that slot. A dict of the non-empty
    slots stands in for the 4M-entry vector; ``used`` counts them."""

    def __init__(self, n: int, size: int = 4 * 1024 * 1024):
        self.n, self.size = n, size
        self.entries: dict[int, int] = {}

    def idx(self, tokens: Sequence[int], start: int) -> int:
        res = 0
        for t in tokens[start:start + self.n]:
            res = (res * _MULT + t) & _U64  # size_t arithmetic; int32 -> size_t sign-extends
        return res % self.size

    def add(self, tokens: Sequence[int], start: int) -> None:
        self.entries[self.idx(tokens, start)] = tokens[start + self.n]

    def get(self, tokens: Sequence[int], start: int) -> int:
        return self.entries.get(self.idx(tokens, start), -1)

    @property
    def used(self) -> int:
        return len(self.entries)

    def reset(self) -> None:
        self.entries.clear()


class NgramMod(Drafter):
    """llama.cpp's ngram-mod (``--spec-type ngram-mod``), one sequence. A generation starts
    with ``begin(prompt)``; ``propose`` calls it itself (with ``context[:-1]``) when the context
    does not continue the last one (the previous context plus what ``observe`` reported) and
    ``begin`` was not called for it. That is exact unless a new generation's first steps are
    not proposed (draft cap 0): then call ``begin`` at its start. Like llama-server's, the
    table is kept across generations: one instance per simulated server. A draft's
    confidence is ``n_match`` for every token."""

    name = "ngram-mod"
    OCCUPANCY_RESET = 0.25  # spec.cpp:1914
    ADD_CHUNK = 32  # spec.cpp:1940
    LOW_ACCEPT, LOW_STREAK = 0.25, 5  # spec.cpp:2006-2008

    def __init__(self, n_match: int = 24, n_max: int = 64, n_min: int = 48, size: int = 4 * 1024 * 1024):
        self.mod = ModTable(n_match, size)
        self.n_max, self.n_min = n_max, n_min
        self.i_last = 0  # the next n-gram start not yet added
        self.n_draft_last = 0  # length of the last draft, before any cap
        self.n_low = 0  # consecutive low-acceptance rounds
        self.resets = 0  # table resets so far (occupancy or low acceptance), for reports
        self._expect: list[int] | None = None  # the context a continuing generation proposes from
        self._begun: list[int] | None = None  # the prompt of a generation begun and not yet proposed in

    def begin(self, prompt: Sequence[int], max_tokens: int | None = None) -> None:
        """A generation from ``prompt`` starts (the server's call, server-context.cpp:3821; the
        decoding loop's and the replay's ``Drafter.begin``)."""
        self._begin(prompt)
        self._expect, self._begun = None, list(prompt)

    def _begin(self, prompt: Sequence[int]) -> None:
        """``begin`` (spec.cpp:1894-1920): the prompt's n-grams into the table."""
        self.i_last = self.n_draft_last = 0
        n = self.mod.n
        if len(prompt) < n:
            return
        for i in range(len(prompt) - n):
            self.mod.add(prompt, i)
        self.i_last = len(prompt) - n
        if self.mod.used / self.mod.size > self.OCCUPANCY_RESET:
            self.mod.reset()
            self.resets += 1

    def draft(self, tokens: Sequence[int], id_last: int) -> list[int]:
        """``draft_one`` (spec.cpp:1922-1976) for the cached ``tokens`` and ``id_last``."""
        self.n_draft_last = 0
        n, cur_len = self.mod.n, len(tokens)
        if cur_len < n:
            return []
        if self.i_last + self.ADD_CHUNK < cur_len:
            for i in range(self.i_last, cur_len - n):
                self.mod.add(tokens, i)
            self.i_last = cur_len - n
        result = list(tokens[cur_len - n + 1:]) + [id_last]
        for i in range(self.n_max):
            tok = self.mod.get(result, i)
            if tok == -1:
                if i < self.n_min:
                    return []
                break
            result.append(tok)
        out = result[n:]
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        """``accept`` (spec.cpp:1996-2021), after one of this policy's drafts."""
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < self.LOW_ACCEPT:
                self.n_low += 1
                if self.n_low >= self.LOW_STREAK:
                    self.mod.reset()
                    self.resets += 1
                    self.n_low = self.i_last = 0
            else:
                self.n_low = 0

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if max_len <= 0 or not context:  # the server does not call draft then
            return Draft([], LOOKUP)
        ctx = list(context)
        begun = self._begun is not None and ctx[:len(self._begun)] == self._begun
        if ctx != self._expect and not begun:
            self._begin(ctx[:-1])
        self._expect, self._begun = ctx, None
        toks = self.draft(ctx[:-1], ctx[-1])[:max_len]
        return Draft(toks, LOOKUP, [float(self.mod.n)] * len(toks))

    def observe(self, draft: Draft, n_accepted: int, emitted: list[int], t_draft: float, t_verify: float) -> None:
        if self._expect is not None:
            self._expect = self._expect + list(emitted)
        if draft.tokens:  # the server accepts only after a non-empty draft
            self.accept(n_accepted)


NGRAM_MIN, NGRAM_MAX = 1, 4  # ngram-cache.h:9-10 (LLAMA_NGRAM_MIN/MAX)
CACHE_MIN_SAMPLES = (2, 2, 1, 1)  # ngram-cache.cpp:60, per n-gram size 1..4 (the "lax" context thresholds)
CACHE_MIN_PERCENT = (66, 50, 50, 50)  # ngram-cache.cpp:61


class NgramCache(Drafter):
    """llama.cpp's n-gram cache lookup, one sequence, no static or dynamic cache file (the
    defaults), in its two forms:

    - ``--spec-type ngram-cache`` (llama-server; spec.cpp:2024-2160, 2186-2199): drafts up to
      8 tokens (``n_draft = 8``, spec.cpp:2191). Before each draft it adds to the context cache
      the tokens it has not seen (the cached ones past the last call, then ``id_last``) as a
      sequence of their own (spec.cpp:2101-2116): n-grams that span two calls' tokens are never
      counted.
    - the ``llama-lookup`` tool (examples/lookup/lookup.cpp), with its defaults: drafts up to
      ``draft.n_max`` = 3 tokens (lookup.cpp:30, common.h:328) and counts every n-gram of the
      history (the prompt at the start, then each token as it is accepted, lookup.cpp:61,
      160, 186): ``whole_history=True``.

    The cache maps each 1- to 4-gram to the tokens seen after it with their counts
    (``common_ngram_cache_update``, ngram-cache.cpp:12-52). Each drafted token
    (``common_ngram_cache_draft``, ngram-cache.cpp:138-200): from the longest n-gram ending
    the history plus the draft so far down to the shortest, the first whose most frequent
    follower has at least ``CACHE_MIN_SAMPLES`` observations in all and at least
    ``CACHE_MIN_PERCENT`` % of them (ngram-cache.cpp:100-136) gives the token; none: the draft
    ends. Ties between followers go to the first one C++ iterates: for libstdc++'s
    ``unordered_map`` of token ids in distinct buckets, the one inserted last (taken here for
    all; ``research/studies/check_ngram_cache.py`` finds every draft identical to the compiled C++'s
    on random histories)."""

    SERVER_N_DRAFT, TOOL_N_DRAFT = 8, 3

    def __init__(self, n_draft: int = SERVER_N_DRAFT, whole_history: bool = False):
        self.n_draft, self.whole_history = n_draft, whole_history
        self.name = "llama-lookup" if whole_history else "ngram-cache"
        self.cache: dict[tuple[int, ...], dict[int, int]] = {}
        self.seen = 0  # tokens of the history already counted

    def begin(self, prompt: Sequence[int], max_tokens: int | None = None) -> None:
        self.cache, self.seen = {}, 0

    def _count(self, tokens: Sequence[int], start: int) -> None:
        """Count the n-grams followed by tokens[i] for i >= start, within ``tokens``."""
        for n in range(NGRAM_MIN, NGRAM_MAX + 1):
            for i in range(max(start, n), len(tokens)):
                followers = self.cache.setdefault(tuple(tokens[i - n:i]), {})
                followers[tokens[i]] = followers.get(tokens[i], 0) + 1

    def _next(self, seq: Sequence[int]) -> int | None:
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            followers = self.cache.get(tuple(seq[-n:])) if len(seq) >= n else None
            if not followers:
                continue
            best, most = None, 0
            for tok, c in reversed(followers.items()):
                if c > most:
                    best, most = tok, c
            total = sum(followers.values())
            if total >= CACHE_MIN_SAMPLES[n - 1] and 100 * most >= CACHE_MIN_PERCENT[n - 1] * total:
                return best
        return None

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if max_len <= 0 or len(context) < 2:  # nothing before LLAMA_NGRAM_STATIC tokens (ngram-cache.cpp:145)
            return Draft([], LOOKUP)
        if len(context) < self.seen:  # another generation without begin: count it afresh
            self.begin(context)
        if self.whole_history:
            self._count(context, self.seen)
        else:
            self._count(context[self.seen:], 0)
        self.seen = len(context)
        seq, draft = list(context), []
        while len(draft) < self.n_draft:
            tok = self._next(seq)
            if tok is None:
                break
            draft.append(tok)
            seq.append(tok)
        draft = draft[:max_len]
        return Draft(draft, LOOKUP, [1.0] * len(draft))


def draft_simple_p(row: np.ndarray, top_k: int = 10) -> float:
    """The ``p`` draft-simple compares with ``p_min`` for a draft-model logits ``row``: the
    top token's softmax over the ``top_k`` largest logits only, in float32 with a double sum
    (llama-sampler.cpp:1170-1208). Suppressed tokens (logit bias -inf) are not applied."""
    row = np.asarray(row, dtype=np.float32)
    k = min(top_k, row.size)
    top = np.partition(row, row.size - k)[row.size - k:]
    e = np.exp(top - top.max(), dtype=np.float32)
    return float(np.float32(1.0 / e.astype(np.float64).sum()))


def draft_simple_length(p_tops: Sequence[float], n_max: int = 3, n_min: int = 0, p_min: float = 0.0,
                        cap: int = 0) -> int:
    """How many tokens of a greedy draft whose tokens have top probabilities ``p_tops``
    (llama.cpp's, see :func:`draft_simple_p`) draft-simple submits for verification
    (spec.cpp:339-411). ``cap``: the server's ``n_draft_max`` (> 0; 0 = none). Raises
    ValueError when ``p_tops`` ends before llama.cpp would have stopped."""
    p_min32 = np.float32(p_min)
    n = 0
    for p in p_tops:
        if np.float32(p) < p_min32:
            break
        n += 1
        if n_max <= n or (cap > 0 and cap <= n):
            break
    else:
        raise ValueError(f"draft-simple would go on after {len(p_tops)} tokens; give the probabilities of more")
    return 0 if n < n_min else n
