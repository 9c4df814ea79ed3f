"""Cost-aware choice of the draft length: plain functions and small state objects, no model.

At every step the controller estimates, for each draft length k (k = 0 is plain decoding),
the tokens a step yields (1 + expected accepted drafted tokens) over the time it takes
(drafting k tokens + verifying a block of k + 1), and picks the k with the best rate. The
costs are measured on the user's hardware; the acceptance probabilities are learned online
for each drafter. When nothing beats plain decoding it drafts nothing, and probes now and
then to notice when drafts become good again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specli.speculate.drafters import NONE, Source
from specli.speculate.settings import DEFAULTS


def expected_accepted(alpha: float, k: int, first: float | None = None) -> float:
    """Expected accepted tokens of a k-token draft when each token, given the previous ones
    were accepted, is accepted with probability ``alpha`` (the first with ``first``, default
    alpha): first * (1 + alpha + ... + alpha^(k-1))."""
    if k <= 0:
        return 0.0
    a1 = alpha if first is None else first
    if alpha >= 1.0:
        return a1 * k
    return a1 * (1.0 - alpha ** k) / (1.0 - alpha)


def step_rate(alpha: float, k: int, verify: list[float], draft_token: float, draft_step: float = 0.0,
              first: float | None = None) -> float:
    """Tokens per second of one step that drafts k tokens."""
    t = verify[min(k, len(verify) - 1)] + (k * draft_token + draft_step if k > 0 else 0.0)
    return (1.0 + expected_accepted(alpha, k, first)) / t if t > 0 else 0.0


def best_length(alpha: float, verify: list[float], draft_token: float, k_max: int,
                draft_step: float = 0.0, first: float | None = None) -> tuple[int, float]:
    """(k, tokens/s) maximising :func:`step_rate` over 0..k_max; ties go to the shorter draft."""
    best_k, best = 0, step_rate(alpha, 0, verify, draft_token)
    for k in range(1, min(k_max, len(verify) - 1) + 1):
        r = step_rate(alpha, k, verify, draft_token, draft_step, first)
        if r > best * (1 + 1e-9):
            best_k, best = k, r
    return best_k, best


def marginal_token_pays(p_all: float, k: int, verify: list[float], draft_token: float, rate: float) -> bool:
    """Is drafting one more token (the (k+1)-th) worth it? It adds ``p_all`` expected tokens
    (the chance that it and every token before it is accepted) for the extra verify and draft
    time; worth it when that beats the rate the step already promises."""
    if k + 1 >= len(verify):
        return False
    extra = verify[k + 1] - verify[k] + draft_token
    return extra <= 0 or p_all / extra > rate


@dataclass
class CostModel:
    """verify[k]: seconds for the target to check k drafted tokens (a block of k + 1);
    draft_token: seconds per draft-model forward pass (one per drafted token, plus one per
    step to catch up on the tokens the target emitted).

    The calibrated curve is corrected by what real steps take: each observed block size keeps
    its own ratio of measured to calibrated time, and sizes not seen yet follow the average
    ratio of all blocks seen (longer contexts, a busy machine and timing noise move every
    block alike; a correction learned on short drafts then also prices the long ones)."""

    verify: list[float]
    draft_token: float = 0.0
    smoothing: float = 0.1

    def __post_init__(self):
        self.calibrated = list(self.verify)
        self.ratio: list[float | None] = [None] * len(self.verify)  # measured / calibrated
        self.block_ratio = 1.0  # over all blocks of 2+ tokens

    def observe_verify(self, k: int, seconds: float) -> None:
        if k >= len(self.verify) or seconds <= 0 or self.calibrated[k] <= 0:
            return
        r, s = seconds / self.calibrated[k], self.smoothing
        old = self.ratio[k] if self.ratio[k] is not None else (self.block_ratio if k else 1.0)
        self.ratio[k] = old + s * (r - old)
        if k:
            self.block_ratio += s * (r - self.block_ratio)
        self.verify = [c * (q if q is not None else (self.block_ratio if i else 1.0))
                       for i, (c, q) in enumerate(zip(self.calibrated, self.ratio))]

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0 and seconds > 0:
            per = seconds / n_tokens
            self.draft_token += self.smoothing * (per - self.draft_token)


@dataclass
class Acceptance:
    """Online estimate of a drafter's acceptance: the chance its first token is accepted, and
    the chance each later token is, given the ones before it were (a copy that starts right
    tends to stay right). Beta-style counts with exponential forgetting, so a drop shows within
    a few steps."""

    first: float = 0.5  # prior acceptance of the first drafted token
    rest: float = 0.5  # prior acceptance of each later one
    weight: float = 2.0  # prior strength in trials
    decay: float = 0.92

    def __post_init__(self):
        self.f_ok, self.f_n = self.first * self.weight, self.weight
        self.r_ok, self.r_n = self.rest * self.weight, self.weight

    @property
    def alpha_first(self) -> float:
        return self.f_ok / self.f_n

    @property
    def alpha_rest(self) -> float:
        return self.r_ok / self.r_n

    @property
    def alpha(self) -> float:
        return self.alpha_first

    def expected(self, k: int) -> float:
        return expected_accepted(self.alpha_rest, k, self.alpha_first)

    def _trial(self, first: bool, ok: bool) -> None:
        d = self.decay
        if first:
            self.f_ok, self.f_n = self.f_ok * d + ok, self.f_n * d + 1.0
        else:
            self.r_ok, self.r_n = self.r_ok * d + ok, self.r_n * d + 1.0

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """n_accepted successes, then (when the draft was cut short) one failure; tokens after
        the first rejection were never tested."""
        for i in range(min(n_drafted, n_accepted + 1)):
            self._trial(i == 0, i < n_accepted)


LOOKUP_BUCKETS = (2, 4, 8, 16)


def lookup_key(match_len: int) -> Source:
    """Lookup acceptance is learned apart by how long the context has matched its source
    (2-3, 4-7, 8-15, 16+ tokens): a long match means the answer is copying that source, and
    the copy tends to go on. On the grounded suite's answers the next token follows a 2-3
    token match 67% of the time, a longer one 84-92%, and each later token of a 16+ match
    95% (vs 84-87%), so long matches earn long drafts."""
    b = max((e for e in LOOKUP_BUCKETS if match_len >= e), default=0)
    return Source("lookup", b)


def prior(source: Source) -> Acceptance:
    """Start pessimistic: a drafter must earn its drafts. Lookup is scored for free on every
    step it has a match (shadow accounting), so on text that repeats its input it proves itself
    within a few tokens; on text that does not, it never costs a verify pass."""
    if source.kind == "lookup":
        return Acceptance(first=0.4, rest=0.8)
    return Acceptance(first=0.6, rest=0.7)


@dataclass
class Decision:
    source: Source  # which drafter to use, NONE for a plain step
    k: int
    rate: float  # expected tokens/s of this choice
    plain_rate: float
    probe: bool = False


@dataclass
class Controller:
    """Chooses, per step, the drafter and the draft length with the best expected rate."""

    cost: CostModel
    k_max: int = DEFAULTS.draft_max
    probe_every: int = 16  # plain steps between probes of a drafter that did not pay
    probe_len: int = 2
    sources: dict[Source, Acceptance] = field(default_factory=dict)
    plain_streak: int = 0
    plain_steps: int = 0
    probes: int = 0

    def __post_init__(self):
        self.probe_gap = self.probe_every

    def acceptance(self, source: Source) -> Acceptance:
        if source not in self.sources:
            self.sources[source] = prior(source)
        return self.sources[source]

    def batch_ratio(self, n: int) -> float:
        """A pass over n tokens over a pass over one, by the target's verify curve (a draft
        model catching up is priced by the same shape); past the curve's end, on the slope of
        its upper half."""
        v = self.cost.verify
        if v[0] <= 0:
            return float(max(n, 1))
        if n <= len(v):
            return v[max(n, 1) - 1] / v[0]
        h = len(v) // 2
        slope = (v[-1] - v[h]) / max(1, len(v) - 1 - h)
        return (v[-1] + slope * (n - len(v))) / v[0]

    def draft_costs(self, source: Source, behind: int = 1) -> tuple[float, float]:
        """(per drafted token, per step) seconds of a drafter. A draft model also catches up,
        once a step, on the ``behind`` tokens it has not seen (the target's last token; more
        after plain steps), in one pass as wide; MTP is fed inside the target's pass."""
        if source.free:
            return 0.0, 0.0
        dt = self.cost.draft_token
        return dt, (dt * self.batch_ratio(behind) if source.kind == "model" else 0.0)

    def decide(self, candidates: dict[Source, int], k_cap: int | None = None, behind: int = 1,
               probe_behind: int | None = None) -> Decision:
        """``candidates``: source -> most tokens it can draft this step (a lookup match may be
        short), for the drafters that can propose now. Learned acceptance per source.
        ``behind``: the tokens a draft model's step is charged for catching up on first;
        ``probe_behind``: those a probe is (all it lacks, the prompt too: a probe that does
        not pay leaves that cost behind for nothing)."""
        k_lim = self.k_max if k_cap is None else min(self.k_max, k_cap)
        plain_rate = step_rate(0.0, 0, self.cost.verify, 0.0)
        best = Decision(NONE, 0, plain_rate, plain_rate)
        for src, avail in candidates.items():
            a = self.acceptance(src)
            dt, ds = self.draft_costs(src, behind)
            k, rate = best_length(a.alpha_rest, self.cost.verify, dt, min(k_lim, avail), ds, a.alpha_first)
            if k > 0 and rate > best.rate:
                best = Decision(src, k, rate, plain_rate)
        if best.k == 0:
            self.plain_streak += 1
            probe = self._probe(candidates, k_lim, plain_rate, behind if probe_behind is None else probe_behind)
            if probe is not None:
                return probe
            self.plain_steps += 1
        else:
            self.plain_streak = 0
            if not best.source.free:
                self.probe_gap = self.probe_every
        return best

    def _probe(self, candidates: dict[Source, int], k_lim: int, plain_rate: float, behind: int) -> Decision | None:
        """Now and then, draft a little with a paid drafter that is currently off, to notice
        when its drafts turn good. Never for a drafter that would lose even if it were always
        right (its cost alone rules it out) or when catching up on the text would cost more
        than a token (a slow draft model far behind), and less often after each probe that
        changes nothing (the gap doubles, up to 16 times)."""
        if self.plain_streak < self.probe_gap or k_lim <= 0:
            return None
        for src in candidates:
            if src.free:
                continue
            dt, ds = self.draft_costs(src, behind)
            if best_length(0.95, self.cost.verify, dt, k_lim, ds, 0.95)[0] == 0:
                continue
            if ds > self.cost.verify[0]:
                continue  # catching up (on the prompt, say) would cost more than a token
            self.plain_streak = 0
            self.probe_gap = min(self.probe_gap * 2, self.probe_every * 16)
            self.probes += 1
            return Decision(src, min(self.probe_len, k_lim), plain_rate, plain_rate, probe=True)
        return None

    def observe(self, source: Source, n_drafted: int, n_accepted: int) -> None:
        if n_drafted > 0:
            self.acceptance(source).observe(n_drafted, n_accepted)
