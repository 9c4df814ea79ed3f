"""Replay: any drafting policy over recorded answers, on any hardware's costs, free of timing
noise, against the clairvoyant bound of each drafter.

A :class:`Trace` holds, for one prompt, the target's own greedy answer and, for each drafter
that is a model (a draft model, the target's MTP layers), what that model would propose at
every position of the answer from the true prefix: one teacher-forced pass over prompt +
answer gives its argmax and top probability there. A greedy draft starting at position i is
right exactly as far as those argmaxes agree with the answer, so every draft a policy could
make is known. Prompt lookup needs no trace: it copies from the context, which the answer
gives.

:func:`replay` runs a policy (any :class:`~specli.speculate.drafters.Drafter`, specli's own
adaptive one built by the same function every command uses) over a trace, charging each
step what it would cost under a :class:`Costs` model: the target's verify curve and the draft
model's cost per pass, in units of one target token. :func:`bound` is the least cost any
policy could reach with the same drafters, knowing the answer in advance (dynamic programming
over every step's choice of drafter and length).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specli.engine import Context
from specli.errors import SpecliError
from specli.speculate.controller import block_ratio
from specli.speculate.drafters import Drafter, NoDrafter, greedy_drafts, row_top
from specli.speculate.history import History
from specli.speculate.loop import generate
from specli.speculate.source import Draft, Source
from specli.speculate.verify import SamplingParams
from specli.tokens import common_prefix
from specli.util import cache_root

TRACE_VERSION = 3
UNKNOWN = -1  # a drafted token after the draft went wrong: never the answer's


# -- traces ------------------------------------------------------------------------------
@dataclass
class ModelTrace:
    """A model drafter's view of the answer: ``argmax[i]`` is its greedy token for out[i]
    given prompt + out[:i], ``p_top[i]`` that token's probability. Where it is wrong,
    ``off[i]`` holds how it would go on from its own wrong token ((token, probability) pairs,
    as many as a draft could still hold), so a drafter that decides how far to draft from
    those probabilities is replayed exactly."""

    argmax: list[int]
    p_top: list[float]
    off: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    def __post_init__(self):  # JSON gives string keys and lists
        self.off = {int(i): [tuple(x) for x in chain] for i, chain in self.off.items()}

    def agreement(self, out: Sequence[int], k_max: int) -> list[int]:
        """agree[i]: how many tokens of a greedy draft starting at out[i] are right (at most k_max)."""
        agree = [0] * (len(out) + 1)
        for i in range(len(out) - 1, -1, -1):
            agree[i] = min(k_max, agree[i + 1] + 1) if self.argmax[i] == out[i] else 0
        return agree[:len(out)]


@dataclass
class Trace:
    suite: str
    id: str
    prompt: list[int]
    out: list[int]  # the target's greedy answer, with its end-of-generation token when it stopped
    eog: list[int]  # the end-of-generation ids among its tokens (a greedy draft stops at one)
    models: dict[str, ModelTrace] = field(default_factory=dict)
    max_tokens: int | None = None  # the cap it was answered under (drafters are told it, not its length)

    @property
    def plain_cost(self) -> float:
        """Plain decoding's cost in one-token passes (the first token comes with the prompt)."""
        return float(len(self.out) - 1)


def teacher_forced(ctx: Context, prompt: Sequence[int], out: Sequence[int], depth: int) -> ModelTrace:
    """One pass of ``ctx``'s model over prompt + answer: its argmax and top probability for
    every token of the answer; then, from each token it gets wrong, its own greedy
    continuation (``depth`` - 1 tokens, the most a draft of ``depth`` could add after it)."""
    ctx.clear()
    seq = [prompt[-1]] + list(out[:-1])
    if len(prompt) > 1:
        ctx.eval(list(prompt[:-1]), "none")
    argmax: list[int] = []
    p_top: list[float] = []
    for s in range(0, len(seq), ctx.n_batch):
        for row in ctx.eval(seq[s:s + ctx.n_batch], "all"):
            tok, p = row_top(row)
            argmax.append(tok)
            p_top.append(p)
    off: dict[int, list[tuple[int, float]]] = {}
    base = len(prompt)
    for i, (tok, want) in enumerate(zip(argmax, out)):
        if tok == want or depth < 2:
            continue
        if ctx.n_past > base + i:  # the cache holds prompt + out[:i], nothing after
            ctx.rollback(base + i)
        elif ctx.n_past < base + i:
            ctx.eval(list(out[ctx.n_past - base:i]), "none")
        chain: list[tuple[int, float]] = []
        while len(chain) < depth - 1 and not ctx.model.is_eog(tok) and ctx.n_past < ctx.n_ctx:
            tok, p = row_top(ctx.eval([tok])[0])
            chain.append((tok, p))
        off[i] = chain
        ctx.rollback(base + i)
    ctx.clear()
    return ModelTrace(argmax, p_top, off)


def record(target: Context, prompt: list[int], max_tokens: int, drafts: dict[str, Context], depth: int,
           suite: str = "", pid: str = "") -> Trace:
    """The target's plain greedy answer (exactly what ``specli run --draft none`` says) and
    each draft context's view of it, for drafts of up to ``depth`` tokens."""
    target.clear()
    resp = generate(target, prompt, NoDrafter(), SamplingParams(), max_tokens, 0)
    out = [t for ch in resp for t in ch.tokens]
    eog: list[int] = []
    if resp.finish_reason == "stop":  # the token that ended it: what the target says next
        seq = prompt + out
        kept = target.sync(seq)
        tok, _ = row_top(target.eval(seq[kept:])[0])
        eog = [tok]
    out += eog
    target.clear()
    views = {name: teacher_forced(ctx, prompt, out, depth) for name, ctx in drafts.items()}
    held = set(out).union(*(v.argmax for v in views.values()),
                          *({t for t, _ in chain} for v in views.values() for chain in v.off.values()))
    return Trace(suite, pid, list(prompt), out, sorted(t for t in held if target.model.is_eog(t)), views, max_tokens)


def trace_key(*parts) -> str:
    """A cache key for traces of these models and prompts (file names and sizes stand for the
    models; the suite's prompts and the settings go in whole)."""
    return hashlib.sha256(json.dumps([TRACE_VERSION, *parts], sort_keys=True, default=str).encode()).hexdigest()[:20]


def model_ident(path: str) -> list:
    return [os.path.basename(path), os.path.getsize(path)]


def save_traces(path: Path, traces: list[Trace]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps([asdict(t) for t in traces]))
    os.replace(tmp, path)  # a reader sees the old file or the new one, never half of one


def load_traces(path: Path) -> list[Trace] | None:
    try:
        data = json.loads(path.read_text())
        return [Trace(**{**d, "models": {k: ModelTrace(**m) for k, m in d["models"].items()}}) for d in data]
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as e:
        raise SpecliError(f"{path}: not a trace file ({e}); delete it to record the traces again") from None


def traces_dir() -> Path:
    return cache_root() / "traces"  # beside the models and the calibration


# -- costs -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Costs:
    """What a step costs on some hardware, in units of one target token: ``verify[k]`` checks
    k drafted tokens (a block of k + 1), ``draft`` is one pass of the draft model, ``mtp`` one
    pass of the target's MTP layers."""

    name: str
    verify: tuple[float, ...]
    draft: float
    mtp: float = 0.0
    parametric: bool = False  # GPU-like (:meth:`linear`), not measured on a machine

    @property
    def k_max(self) -> int:
        return len(self.verify) - 1

    def block(self, n: int) -> float:
        """A pass over n tokens, over one (the draft model catching up is priced by the
        target's curve shape, as the controller prices it)."""
        return block_ratio(self.verify, n)

    @classmethod
    def linear(cls, c: float, r: float, k_max: int = 64) -> Costs:
        """GPU-like: verifying k drafted tokens costs 1 + c·k, a draft pass r."""
        return cls(f"verify 1+{c:g}k, draft {r:g}", tuple(1.0 + c * k for k in range(k_max + 1)), r, r, True)

    @classmethod
    def measured(cls, name: str, verify_s: Sequence[float], draft_s: float, mtp_s: float = 0.0) -> Costs:
        """From seconds (a calibration, a cost-curve file): scaled to one target token."""
        verify = [float(v) for v in verify_s]
        if len(verify) < 2 or min(verify) <= 0:
            raise SpecliError(f"{name}: a verify curve needs positive costs for one token and for at least one "
                              f"longer block; this one has {len(verify)} point(s)")
        one = verify[0]
        return cls(name, tuple(v / one for v in verify), float(draft_s) / one, float(mtp_s) / one)

    @classmethod
    def from_file(cls, path: str) -> Costs:
        """A cost-curve file written by ``benchmarks/cost_curve.py --out`` on any machine:
        {"verify": [seconds for k = 0..K], "draft_token": seconds, "machine": "..."}. A file
        without the draft model's cost is refused: its passes would be replayed as free."""
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
            draft = d.get("draft_token")
            if not draft or draft <= 0:
                raise SpecliError(f"cost curve {path} has no draft model cost (draft_token); record it with "
                                  "benchmarks/cost_curve.py --draft REF --out FILE")
            return cls.measured(d.get("machine") or os.path.basename(path), d["verify"], draft,
                                d.get("mtp_token", 0.0))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise SpecliError(f"cannot read cost curve {path}: {e}") from None

    @classmethod
    def from_report(cls, path: str) -> Costs:
        """The first cost model of a replay report's JSON (``research/studies/replay.py`` writes it
        beside the report; this machine's curve when it was calibrated in that run), already
        in units of one target token."""
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)[0]
            return cls(entry["costs"], tuple(entry["verify"]), entry["draft"], entry["draft"])
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise SpecliError(f"cannot read the replay report {path} ({e}); "
                              "write one with python -m research.studies.replay") from None


# -- replay ------------------------------------------------------------------------------
@dataclass
class Clock:
    """What the drafters of one step spent, in cost units."""

    spent: float = 0.0


class TraceModel(Drafter):
    """A model drafter replayed from its trace: proposes what the model would, through the
    same ``greedy_drafts`` as the real one (with the same ``keep_going`` and ``p_min``), and
    bills its passes to the clock: a draft model first catches up on the tokens its cache
    lacks (one batched pass), then one pass per further token; MTP layers are fed inside the
    target's pass and pay one pass per token. Past a wrong token it follows the recorded
    continuation of that wrong token."""

    max_len: int | None = None  # as PaidDrafter's: the replayed drafters draft any length

    def __init__(self, trace: Trace, name: str, source: Source, costs: Costs, clock: Clock,
                 p_min: float = 0.0):
        self.m, self.out, self.base = trace.models[name], trace.out, len(trace.prompt)
        self.eog = set(trace.eog)
        self.source, self.clock, self.p_min = source, clock, p_min
        self.pass_cost = costs.mtp if source.kind == "mtp" else costs.draft
        self.costs = costs
        self.held = 0  # context tokens in the draft model's cache
        self.fed: list[int] = []  # drafted tokens evaluated after them

    def behind(self, context: Sequence[int]) -> int:
        """The tokens of ``context`` the model's cache lacks (as ``ModelDrafter.behind``)."""
        if self.source.kind != "model":
            return 0
        return len(context) - min(len(context) - 1, self.held + common_prefix(self.fed, context[self.held:]))

    def propose(self, context: Sequence[int], max_len: int,
                keep_going: Callable[[int, float, list[int]], bool] | None = None, p_min: float | None = None) -> Draft:
        if max_len <= 0:
            return Draft([], self.source)
        i = len(context) - self.base
        caught_up = 0
        if self.source.kind == "model":  # catch up: a batch of what the cache lacks
            caught_up = self.behind(context)
            self.clock.spent += self.pass_cost * self.costs.block(caught_up)
        else:
            self.clock.spent += self.pass_cost
        self.held, self.fed = len(context), []
        at = {"pos": i, "chain": None}  # on the answer at pos, or off it along a recorded chain

        def row() -> tuple[int, float]:
            chain, pos = at["chain"], at["pos"]
            if chain is None:
                return (self.m.argmax[pos], self.m.p_top[pos]) if pos < len(self.out) else (UNKNOWN, 0.0)
            return chain[pos] if pos < len(chain) else (UNKNOWN, 0.0)

        def step(tok: int) -> tuple[int, float]:
            self.clock.spent += self.pass_cost
            self.fed.append(tok)
            if at["chain"] is None and at["pos"] < len(self.out) and tok != self.out[at["pos"]]:
                at["chain"], at["pos"] = self.m.off.get(at["pos"], []), 0  # its own wrong token
            else:
                at["pos"] += 1
            return row()

        toks, conf, passes = greedy_drafts(row(), step, max_len, self.eog.__contains__,
                                           self.p_min if p_min is None else p_min, keep_going, top=lambda r: r)
        return Draft(toks, self.source, conf, caught_up, passes)


@dataclass
class Run:
    """A replayed answer: its cost, and what was drafted and accepted."""

    cost: float = 0.0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    lengths: list[int] = field(default_factory=list)  # drafted tokens per step
    accepted_at: list[int] = field(default_factory=list)  # accepted tokens per step


def replay(trace: Trace, drafter: Drafter, costs: Costs, draft_max: int, clock: Clock,
           history: History | None = None) -> Run:
    """``drafter`` emitting the trace's answer, step by step as the decoding loop runs it: told
    the prompt and the cap the answer was recorded under first (not its length), the same
    draft cap, the same observe call with the step's draft and verify cost (the cost model's
    figures in place of timings). ``history``: the earlier answers lookup copies from, as the
    loop hands them (``--lookup-history``); the answer joins them at the end."""
    out = trace.out
    drafter.begin(trace.prompt, trace.max_tokens)
    if history is not None:  # (the ports of other tools' drafters have no recall)
        drafter.recall(history)
    context = list(trace.prompt) + [out[0]]
    i, n, run = 1, len(out), Run()
    while i < n:
        k_max = max(0, min(draft_max, n - 1 - i, costs.k_max))
        clock.spent = 0.0
        draft = drafter.propose(context, k_max) if k_max else Draft([])
        d = draft.tokens[:k_max]
        a = common_prefix(d, out[i:i + len(d)])
        emitted = out[i:i + a + 1]
        t_draft, t_verify = clock.spent, costs.verify[len(d)]
        drafter.observe(draft, a, emitted, t_draft, t_verify)
        run.cost += t_draft + t_verify
        run.steps += 1
        run.drafted += len(d)
        run.accepted += a
        run.lengths.append(len(d))
        run.accepted_at.append(a)
        context += emitted
        i += a + 1
    if history is not None:
        history.add(trace.prompt, out)
    return run


# -- the clairvoyant bound --------------------------------------------------------------
def gain_share(x: float, b: float) -> float:
    """The share of a bound's gain over plain decoding that a speed-up ``x`` takes (bound ``b``)."""
    return (x - 1) / (b - 1) if b > 1 + 1e-9 else 1.0


def lookup_agreement(prompt: Sequence[int], out: Sequence[int], k_max: int) -> list[int]:
    """agree[i]: the most tokens of out[i:] (at most k_max) that a verbatim copy from any
    earlier occurrence of the token before out[i] reproduces; 0 for i = 0 (the prefill's
    token). A drafter that copies one earlier occurrence verbatim is right at most this far;
    one that renames (specli's lookup) or strings together the followers of several
    occurrences (llama.cpp's ngram-mod and n-gram cache) may go further, so for those the
    lookup bound is a yardstick, not a proof."""
    full = list(prompt) + list(out)
    agree = [0] * len(out)
    where: dict[int, list[int]] = {}  # token -> its positions so far

    def add(j: int) -> None:
        where.setdefault(full[j], []).append(j)

    for j in range(len(prompt)):
        add(j)
    for i in range(1, len(out)):
        pos = len(prompt) + i
        if i >= 2:
            add(pos - 2)  # every position before the last token's own
        tail = full[pos:pos + k_max]
        agree[i] = max((common_prefix(full[j + 1:j + 1 + k_max], tail) for j in where.get(full[pos - 1], ())),
                       default=0)
    return agree


Option = tuple[Sequence[int], float, float]  # agreement at each position, cost per drafted token, per step


def bound(n: int, options: Sequence[Option], verify: Sequence[float], k_max: int) -> float:
    """Least total cost to emit out[1:] of an n-token answer when at each step one may draft k
    <= k_max tokens with any of ``options`` or none, knowing how far each draft would be
    right."""
    k_max = min(k_max, len(verify) - 1)
    best = [0.0] * (n + 1)
    for i in range(n - 1, 0, -1):
        b = verify[0] + best[i + 1]
        top = min(k_max, n - 1 - i)
        for agree, per, fixed in options:
            a = agree[i]
            for k in range(1, top + 1):
                c = verify[k] + per * k + fixed + best[min(n, i + min(k, a) + 1)]
                if c < b:
                    b = c
        best[i] = b
    return best[1] if n > 1 else 0.0


def drafter_options(trace: Trace, costs: Costs, kinds: Sequence[str], k_max: int,
                    lookup_agree: Sequence[int] | None = None) -> list[Option]:
    """The bound's options for a set of drafters ("lookup", "model", "mtp"). With lookup and
    a model together, also a draft that starts with the model and goes on copying (what
    specli's hand-over does), priced at the least it can cost: one model pass."""
    look = None
    if "lookup" in kinds:
        look = lookup_agree if lookup_agree is not None else lookup_agreement(trace.prompt, trace.out, k_max)
    opts: list[Option] = [(look, 0.0, 0.0)] if look is not None else []
    for kind in kinds:
        if kind == "lookup":
            continue
        per = costs.mtp if kind == "mtp" else costs.draft
        agree = trace.models[kind].agreement(trace.out, k_max)
        opts.append((agree, per, 0.0))
        if look is not None:  # j model tokens, then a copy from where they end
            n = len(trace.out)
            joined = [min(k_max, max([a] + [j + look[i + j] for j in range(1, a + 1) if i + j < n]))
                      for i, a in enumerate(agree)]
            opts.append((joined, 0.0, per))
    return opts
