"""The policies the replay compares: specli's adaptive one (built by the function every
command uses), fixed draft lengths, and llama.cpp's defaults, each over the drafters a trace
holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from research.lab.replay import Clock, Costs, Trace, TraceModel, replay
from specli.speculate.adaptive import adaptive_drafter, lookup_drafter
from specli.speculate.drafters import Drafter
from specli.speculate.history import History, parse_bound
from specli.speculate.settings import DEFAULTS, SpecSettings
from specli.speculate.source import MODEL, MTP, Draft

SOURCES = {"model": MODEL, "mtp": MTP}


@dataclass(frozen=True)
class Policy:
    name: str
    family: str  # "specli", "fixed", "llama.cpp"
    kinds: tuple[str, ...]  # the drafters it uses ("lookup", "model", "mtp"): its bound uses the same
    draft_max: int
    make: Callable[[Trace, Costs, Clock], Drafter]


def speedup(policy: Policy, traces: Sequence[Trace], costs: Costs, history: str = "0") -> float:
    """``policy`` replayed over ``traces`` on ``costs``: its speed-up over plain decoding.
    ``history``: a ``--lookup-history`` bound; lookup then copies from the answers of the
    traces replayed before, in order (default "0": none)."""
    plain = cost = 0.0
    bound = parse_bound(history)
    kept = None if bound.off else History(bound)
    for t in traces:
        clock = Clock()
        cost += replay(t, policy.make(t, costs, clock), costs, policy.draft_max, clock, kept).cost
        plain += t.plain_cost
    return plain / cost


class FirstOf(Drafter):
    """Lookup's copy when the context repeats, else the model's draft (fixed length)."""

    def __init__(self, lookup: Drafter, model: Drafter):
        self.lookup, self.model = lookup, model

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        d = self.lookup.propose(context, max_len)
        return d if d.tokens else self.model.propose(context, max_len)

    def observe(self, draft, n_accepted, emitted, t_draft, t_verify) -> None:
        self.lookup.observe(draft, n_accepted, emitted, t_draft, t_verify)


def _model(kind: str, p_min: float = 0.0):
    return lambda t, c, clk: TraceModel(t, kind, SOURCES[kind], c, clk, p_min)


def _model_kind(kinds: Sequence[str]) -> str | None:
    """The model drafter among ``kinds`` ("model" or "mtp"), if any."""
    return next((k for k in kinds if k != "lookup"), None)


def specli(kinds: tuple[str, ...], s: SpecSettings = DEFAULTS, drift: float = 1.0) -> Policy:
    """specli's adaptive policy over these drafters, as ``Session.drafter_for`` builds it.
    ``drift``: the machine ran this many times slower when it was calibrated than the steps
    now take (the controller is handed the costs times ``drift``)."""
    model_kind = _model_kind(kinds)

    def make(t: Trace, c: Costs, clk: Clock) -> Drafter:
        model = _model(model_kind)(t, c, clk) if model_kind else None
        dcost = (c.mtp if model_kind == "mtp" else c.draft) if model_kind else 0.0
        return adaptive_drafter(s, [drift * v for v in c.verify[:s.draft_max + 1]], drift * dcost,
                                lookup_drafter(s) if "lookup" in kinds else None, model)

    return Policy("specli " + "+".join(kinds), "specli", kinds, s.draft_max, make)


def fixed(kinds: tuple[str, ...], k: int, s: SpecSettings = DEFAULTS) -> Policy:
    """Always draft k tokens (lookup: as many as its copy has, up to k)."""
    model_kind = _model_kind(kinds)

    def make(t: Trace, c: Costs, clk: Clock) -> Drafter:
        model = _model(model_kind)(t, c, clk) if model_kind else None
        if "lookup" not in kinds:
            return model
        return FirstOf(lookup_drafter(s), model) if model else lookup_drafter(s)

    return Policy(f"fixed {'+'.join(kinds)} k={k}", "fixed", kinds, k, make)


def llama_cpp(kinds: Sequence[str]) -> list[Policy]:
    """llama.cpp's speculative types with their default settings (common/common.h), for the
    drafters at hand; ``research.lab.llamacpp_policies`` has the n-gram ports and their
    sources. draft-simple's defaults (n_max 3, n_min 0, p_min 0) submit exactly 3 greedy
    tokens a step: a fixed length of 3. The n-gram cache comes twice: as llama-server's
    ``--spec-type ngram-cache`` and as the ``llama-lookup`` tool, whose defaults differ."""
    from research.lab import llamacpp_policies as lp

    out = []
    if "lookup" in kinds:
        out += [Policy("llama.cpp ngram-simple", "llama.cpp", ("lookup",), lp.NgramSimple().size_m,
                       lambda t, c, clk: lp.NgramSimple()),
                Policy("llama.cpp ngram-mod", "llama.cpp", ("lookup",), lp.NgramMod().n_max,
                       lambda t, c, clk: lp.NgramMod())]
        out += [Policy("llama.cpp ngram-cache", "llama.cpp", ("lookup",), lp.NgramCache.SERVER_N_DRAFT,
                       lambda t, c, clk: lp.NgramCache()),
                Policy("llama.cpp llama-lookup", "llama.cpp", ("lookup",), lp.NgramCache.TOOL_N_DRAFT,
                       lambda t, c, clk: lp.NgramCache(lp.NgramCache.TOOL_N_DRAFT, whole_history=True))]
    for kind in kinds:
        if kind in SOURCES:
            out.append(Policy(f"llama.cpp draft-simple ({kind})", "llama.cpp", (kind,), 3, _model(kind, 0.0)))
    return out


def every_policy(kinds: Sequence[str], k_max: int, s: SpecSettings = DEFAULTS) -> list[Policy]:
    """specli over each drafter alone and over all together; fixed k = 1..k_max for each; and
    llama.cpp's defaults."""
    sets = [(k,) for k in kinds] + ([tuple(kinds)] if len(kinds) > 1 else [])
    return ([specli(ks, s) for ks in sets] + [fixed(ks, k, s) for ks in sets for k in range(1, k_max + 1)]
            + llama_cpp(kinds))
