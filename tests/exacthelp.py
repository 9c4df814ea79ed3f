"""Shared by the exactness tests on tiny f32 models: the f32 context configuration, the prompts,
one generation, a prompt lookup can copy from, and the exact joint distribution of three
sampled tokens."""

import numpy as np

from specli.engine import Context, ContextConfig
from specli.speculate.drafters import NoDrafter
from specli.speculate.loop import generate
from specli.speculate.verify import SamplingParams, probs_from_logits

CFG = ContextConfig(n_ctx=1024, n_batch=64, f32_kv=True, n_threads=2)
PROMPTS = [
    "Once upon a time",
    "def fibonacci(n):",
    "The capital of France is",
    "1, 2, 3, 4, 5,",
    "Translate to German: good morning",
    "SELECT name FROM users WHERE",
    "<html><body>",
    "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole, filled with the ends of worms",
]


def run(tm, prompt, drafter, k=4, params=SamplingParams(), n=80, ctx=None):
    ctx = ctx or Context(tm, CFG)
    resp = generate(ctx, prompt, drafter, params, max_tokens=n, draft_max=k)
    toks, flags = [], []
    for ch in resp:
        toks += ch.tokens
        flags += ch.from_draft
    return toks, resp.stats, ctx, flags


def grounded_prompt(tm, text):
    """Prompt that already contains the model's own continuation: lookup can copy from it."""
    p = tm.tokenize(text)
    cont, *_ = run(tm, p, NoDrafter(), n=40)
    return p + cont + tm.tokenize("\n", add_special=False) + p[1:]


def exact_joint(ctx, prompt, params):
    """The exact distribution of the first three sampled tokens after ``prompt``, enumerated
    from the target's own logits (``ctx`` is scratch)."""
    p1 = probs_from_logits(ctx.eval(prompt)[0], params)
    exact: dict[tuple, float] = {}
    for a in np.nonzero(p1)[0]:
        ctx.rollback(len(prompt))
        p2 = probs_from_logits(ctx.eval([int(a)])[0], params)
        for b in np.nonzero(p2)[0]:
            ctx.rollback(len(prompt) + 1)
            p3 = probs_from_logits(ctx.eval([int(b)])[0], params)
            for c in np.nonzero(p3)[0]:
                exact[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    return exact
