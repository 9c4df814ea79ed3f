"""Cost-aware choice of the draft length: plain functions and small state objects, no model.

At every step the controller estimates, for each draft length k (k = 0 is plain decoding),
the tokens a step yields (1 + expected accepted drafted tokens) over the time it takes
(drafting k tokens + verifying a block of k + 1), and picks the k with the best rate. The
costs are measured on the user's hardware; the acceptance probabilities are learned online
for each drafter. When nothing beats plain decoding it drafts nothing, and probes a paid
drafter now and then to notice when its drafts become good: once the gain it would have
brought, were its drafts good, has mounted up to what the probe costs (a rent-or-buy rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from specli.speculate.settings import DEFAULTS
from specli.speculate.source import AMBIGUOUS, LOOKUP, NONE, RESYNC, Source, history_key

# a drafter that is off is probed as if its drafts were this good (were they, would it pay?)
GOOD_DRAFTS = 0.95
PROBE_PRICE = 1.0  # a probe waits until the gain it forwent is this many times its cost...
PROBE_PRICE_MAX = 16.0  # ...doubling after each probe that fails, up to this
CAUTION = 0.5  # standard deviations off a lookup bucket's first-token acceptance (see cautious_first)
AMORTISE = 16  # a draft model's first catch-up (the prompt) is priced as spread over this many steps
RECENT = 0.9  # decay, per step, of the rate achieved lately
SHARED_REST = 10.0  # trials' worth a shared continuation rate weighs in a lookup bucket's (see Acceptance)


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


def step_rate(alpha: float, k: int, verify: list[float], draft_token: float, draft_step: float | None = None,
              first: float | None = None) -> float:
    """Tokens per second of one step that drafts k tokens: the first costs ``draft_step``
    (a draft model's catch-up pass, which yields it; default one ``draft_token``), each
    further one a ``draft_token`` pass."""
    d1 = draft_token if draft_step is None else draft_step
    t = verify[min(k, len(verify) - 1)] + (d1 + (k - 1) * draft_token if k > 0 else 0.0)
    return (1.0 + expected_accepted(alpha, k, first)) / t if t > 0 else 0.0


def best_length(alpha: float, verify: list[float], draft_token: float, k_max: int,
                draft_step: float | None = None, first: float | None = None) -> tuple[int, float]:
    """(k, tokens/s) maximising :func:`step_rate` over 0..k_max; ties go to the shorter draft."""
    best_k, best = 0, step_rate(alpha, 0, verify, draft_token)
    for k in range(1, min(k_max, len(verify) - 1) + 1):
        r = step_rate(alpha, k, verify, draft_token, draft_step, first)
        if r > best * (1 + 1e-9):
            best_k, best = k, r
    return best_k, best


def block_ratio(verify: Sequence[float], n: int) -> float:
    """A pass over n tokens over a pass over one, by a verify curve (``verify[k]``: a block of
    k + 1): read off the curve within it; past its end, along the chord from one token to its
    last point (the cost per token a wide batch settles to)."""
    v0, last = verify[0], len(verify)
    if v0 <= 0:
        return float(max(n, 1))
    if n <= last:
        return verify[max(n, 1) - 1] / v0
    return 1.0 + (verify[-1] / v0 - 1.0) * (n - 1) / (last - 1)


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

    The calibrated curve is corrected by what real steps take, in two parts. ``speed``, the
    ratio of measured to calibrated time for one token, is how much faster or slower the
    machine runs now than when it was calibrated (a busy neighbour, a cooler CPU, a calibration
    cached from another day), and moves every size alike: blocks not drafted for a while keep
    their price relative to a plain step, so a machine that sped up since its calibration does
    not find its blocks dear and stop drafting (nor a slower one find them cheap). On top of
    it each observed block size keeps its own ratio, and sizes not seen yet follow the average
    ratio of all blocks seen (longer contexts and timing noise move every block alike; a
    correction learned on short drafts then also prices the long ones). A draft pass follows
    ``speed`` too until one has been timed (it was calibrated on the same machine at the same
    time), then what passes take."""

    verify: list[float]
    draft_token: float = 0.0
    smoothing: float = 0.1

    def __post_init__(self):
        self.calibrated = list(self.verify)
        self.speed = 1.0  # measured / calibrated, one token
        self.draft_calibrated, self.draft_timed = self.draft_token, False
        self.ratio: list[float | None] = [None] * len(self.verify)  # per block size: measured / calibrated / speed
        self.block_ratio = 1.0  # the same over all blocks of 2+ tokens

    def observe_verify(self, k: int, seconds: float) -> None:
        if k >= len(self.verify) or seconds <= 0 or self.calibrated[k] <= 0:
            return
        r, s = seconds / self.calibrated[k], self.smoothing
        if k == 0:
            self.speed += s * (r - self.speed)
            if not self.draft_timed:
                self.draft_token = self.draft_calibrated * self.speed
        else:
            r /= self.speed
            old = self.ratio[k] if self.ratio[k] is not None else self.block_ratio
            self.ratio[k] = old + s * (r - old)
            self.block_ratio += s * (r - self.block_ratio)
        self.verify = [c * self.speed * (1.0 if i == 0 else q if q is not None else self.block_ratio)
                       for i, (c, q) in enumerate(zip(self.calibrated, self.ratio))]

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0 and seconds > 0:
            per = seconds / n_tokens
            self.draft_token += self.smoothing * (per - self.draft_token)
            self.draft_timed = True


@dataclass
class Acceptance:
    """Online estimate of a drafter's acceptance: the chance its first token is accepted, and
    the chance each later token is, given the ones before it were (a copy that starts right
    tends to stay right). Beta-style counts with exponential forgetting, so a drop shows within
    a few steps. With ``rest_from``, the later tokens are learned there too, and that shared
    estimate stands in for the prior of this one's (``SHARED_REST`` trials' worth): the lookup
    buckets share one, since whether a copy, once started, goes on is mostly one habit of the
    answer, and a bucket alone sees too few trials to learn it before the answer ends; a
    bucket whose copies go on longer (or less) than the others' still learns so."""

    first: float = 0.5  # prior acceptance of the first drafted token
    rest: float = 0.5  # prior acceptance of each later one
    weight: float = 2.0  # prior strength in trials
    decay: float = 0.92
    rest_from: Acceptance | None = None

    def __post_init__(self):
        self.f_ok, self.f_n = self.first * self.weight, self.weight
        self.r_ok, self.r_n = (self.rest * self.weight, self.weight) if self.rest_from is None else (0.0, 0.0)

    @property
    def alpha_first(self) -> float:
        return self.f_ok / self.f_n

    @property
    def alpha_rest(self) -> float:
        if self.rest_from is None:
            return self.r_ok / self.r_n
        return (self.r_ok + SHARED_REST * self.rest_from.alpha_rest) / (self.r_n + SHARED_REST)

    @property
    def alpha(self) -> float:
        return self.alpha_first

    def cautious_first(self) -> float:
        """The first token's acceptance, lowered by ``CAUTION`` standard deviations of its
        estimate: few trials, a wide margin; many, almost none. (A first token that fails
        wastes the whole block; once a copy has started right, later tokens are judged on
        their own estimate.)"""
        f = self.alpha_first
        return max(0.0, f - CAUTION * (f * (1 - f) / (self.f_n + 1)) ** 0.5)

    def expected(self, k: int) -> float:
        return expected_accepted(self.alpha_rest, k, self.alpha_first)

    def trial(self, first: bool, ok: bool) -> None:
        d = self.decay
        if not first and self.rest_from is not None:
            self.rest_from.trial(False, ok)
        if first:
            self.f_ok, self.f_n = self.f_ok * d + ok, self.f_n * d + 1.0
        else:
            self.r_ok, self.r_n = self.r_ok * d + ok, self.r_n * d + 1.0

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """n_accepted successes, then (when the draft was cut short) one failure; tokens after
        the first rejection were never tested."""
        for i in range(min(n_drafted, n_accepted + 1)):
            self.trial(i == 0, i < n_accepted)


def prior(source: Source) -> Acceptance:
    """Lookup starts pessimistic: it is scored for free on every step it has a match (shadow
    accounting), so on text that repeats its input it proves itself within a few tokens; on
    text that does not, it never costs a verify pass; an ambiguous match (``AMBIGUOUS``) and a
    copy picked up again past an edit (``RESYNC``) start lower still. A draft model is learned
    only from its own drafts, which cost: it starts where a same-family draft usually is (a
    first token right 70 % of the time) and forgets more slowly (how well it agrees with its
    target moves less abruptly than whether the text is being copied)."""
    if source.kind == "lookup":
        first = {AMBIGUOUS: 0.2, RESYNC: 0.3}.get(source.bucket, 0.4)
        return Acceptance(first=first, rest=0.8)
    return Acceptance(first=0.7, rest=0.8, decay=0.97)


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
    probe_len: int = 2  # a first probe's length
    sources: dict[Source, Acceptance] = field(default_factory=dict)
    plain_streak: int = 0  # plain steps since a paid drafter last drafted or probed
    plain_steps: int = 0
    probes: int = 0

    def __post_init__(self):
        self.probe_price = PROBE_PRICE  # the next probe waits for this many times its cost in forgone gain
        self.probe_now = self.probe_len  # the next probe's length
        self.probing = False
        self.done = [0.0, 0.0]  # recent tokens and seconds, decayed: the rate achieved lately
        self.copies = prior(LOOKUP)  # how often a copy that started right goes on (all lookup buckets)
        self.recalls = prior(history_key(0))  # the same for copies from earlier answers (all history buckets)

    def acceptance(self, source: Source) -> Acceptance:
        if source not in self.sources:
            a = prior(source)
            # every match bucket's continuation rate starts from (and teaches) the one of all copies
            # of its kind: of the context (lookup), or of earlier answers (history)
            shared = {"lookup": self.copies, "history": self.recalls}.get(source.kind)
            self.sources[source] = replace(a, rest_from=shared) if shared is not None else a
        return self.sources[source]

    def worth(self, source: Source, avail: int, k_cap: int | None = None) -> float:
        """The tokens/s a free copy from ``source`` of up to ``avail`` tokens promises this
        step at its learned acceptance (plain decoding's rate when no length pays)."""
        a = self.acceptance(source)
        k_lim = self.k_max if k_cap is None else min(self.k_max, k_cap)
        return best_length(a.alpha_rest, self.cost.verify, 0.0, min(k_lim, avail), 0.0, a.cautious_first())[1]

    def batch_ratio(self, n: int) -> float:
        """A pass over n tokens over a pass over one, by the target's verify curve (a draft
        model catching up is priced by the same shape)."""
        return block_ratio(self.cost.verify, n)

    def draft_costs(self, source: Source, behind: int = 1) -> tuple[float, float]:
        """(per further token, for the first token) seconds of a drafter's step. A draft
        model's first token comes from its catch-up pass over the ``behind`` tokens it has not
        seen (the target's last token and its own last draft; more after plain steps), as wide;
        MTP is fed inside the target's pass and pays one pass a token; DFlash pays one pass for
        its whole block (``draft_token`` is that pass), further tokens nothing."""
        if source.free:
            return 0.0, 0.0
        dt = self.cost.draft_token
        if source.kind == "dflash":
            return 0.0, dt
        return dt, (dt * self.batch_ratio(behind) if source.kind == "model" else dt)

    def decide(self, candidates: dict[Source, int], k_cap: int | None = None, behind: int = 1,
               probe_behind: int | None = None, left: int | None = None) -> Decision:
        """``candidates``: source -> most tokens it can draft this step (a lookup match may be
        short), for the drafters that can propose now. Learned acceptance per source.
        ``behind``: the tokens a draft model's step is charged for catching up on first;
        ``probe_behind``: those a probe is (all it lacks, the prompt too: a probe that does
        not pay leaves that cost behind for nothing); ``left``: the most tokens the answer may
        still take (None: no cap)."""
        k_lim = self.k_max if k_cap is None else min(self.k_max, k_cap)
        plain_rate = step_rate(0.0, 0, self.cost.verify, 0.0)
        best = Decision(NONE, 0, plain_rate, plain_rate)
        p_behind = behind if probe_behind is None else probe_behind
        for src, avail in candidates.items():
            a = self.acceptance(src)
            first = a.cautious_first() if src.copy else a.alpha_first
            dt, ds = self.draft_costs(src, behind)
            if p_behind > behind:  # a first draft catches up on the prompt: an outlay for the drafts to come
                ds += (self.draft_costs(src, p_behind)[1] - ds) / AMORTISE
            k, rate = best_length(a.alpha_rest, self.cost.verify, dt, min(k_lim, avail), ds, first)
            if k > 0 and rate > best.rate:
                best = Decision(src, k, rate, plain_rate)
        if best.k and not best.source.free:
            self.plain_streak, self.probe_price, self.probe_now = 0, PROBE_PRICE, self.probe_len
            return best
        if best.k == 0:  # (a lookup step neither counts nor resets: it does not tell the model's worth)
            self.plain_streak += 1
            probe = self._probe(candidates, k_lim, plain_rate, p_behind, left)
            if probe is not None:
                return probe
            self.plain_steps += 1
        return best

    def achieved_rate(self, plain_rate: float) -> float:
        """Tokens per second of the last steps (plain decoding's before any)."""
        return self.done[0] / self.done[1] if self.done[1] > 0 else plain_rate

    def _probe(self, candidates: dict[Source, int], k_lim: int, plain_rate: float, behind: int,
               left: int | None) -> Decision | None:
        """Now and then, draft a little with a paid drafter that is currently off, to notice
        when its drafts turn good: once the plain steps since it last drafted would have
        gained, had its drafts been good (``GOOD_DRAFTS``), as much over the rate achieved
        lately as the probe costs (catching up included: a draft model's first probe pays for
        the prompt), and only while the answer has room left to earn that back. Never for a
        drafter that could not beat that rate at all. A probe that passes whole is followed
        at once by one twice as long; one that does not doubles the forgone gain the next
        must wait for (up to ``PROBE_PRICE_MAX`` times its cost)."""
        if k_lim <= 0:
            return None
        base = max(plain_rate, self.achieved_rate(plain_rate))
        for src in candidates:
            if src.free:
                continue
            dt, ds1 = self.draft_costs(src, 1)
            k, rate = best_length(GOOD_DRAFTS, self.cost.verify, dt, k_lim, ds1, GOOD_DRAFTS)
            if k == 0 or rate <= base:
                continue
            n = min(self.probe_now, k_lim)
            cost = self.draft_costs(src, behind)[1] + (n - 1) * dt + self.cost.verify[n] - self.cost.verify[0]
            gain = self.cost.verify[0] * (1.0 - base / rate)  # a token's worth, were the drafts good
            if self.plain_streak * gain < self.probe_price * cost or (left is not None and left * gain < cost):
                continue
            self.plain_streak = 0
            self.probes += 1
            self.probing = True
            return Decision(src, n, plain_rate, plain_rate, probe=True)
        return None

    def observe_step(self, n_emitted: int, seconds: float) -> None:
        """A step's yield, for the rate achieved lately."""
        d = RECENT
        self.done = [self.done[0] * d + n_emitted, self.done[1] * d + seconds]

    def observe(self, source: Source, n_drafted: int, n_accepted: int) -> None:
        if n_drafted > 0:
            self.acceptance(source).observe(n_drafted, n_accepted)
        if self.probing and not source.free:
            self.probing = False
            if n_drafted and n_accepted >= n_drafted:
                self.probe_price, self.probe_now = 0.0, min(2 * self.probe_now, self.k_max)
            else:
                self.probe_price = min(max(2 * self.probe_price, PROBE_PRICE), PROBE_PRICE_MAX)
                self.probe_now = self.probe_len
