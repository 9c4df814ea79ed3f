"""Shared by the tests on hybrid and recurrent targets and on drafting heads: the prompts, the
two rollback settings, the f32 context configuration, one generation, the chi-square check of
sampled tokens against the target, and one ``specli run`` on the command line."""

import json
from collections import Counter

import numpy as np
from clihelp import specli
from exacthelp import exact_joint
from stathelp import chi2_critical, chi2_stat

from specli.engine import Context, ContextConfig
from specli.speculate.loop import generate
from specli.speculate.verify import SamplingParams

PROMPTS = ["Once upon a time", "def fibonacci(n):", "The capital of France is", "1, 2, 3, 4, 5,"]
SNAPSHOTS, CHECKPOINTS = 6, 0  # n_rs_seq: snapshots where the architecture has them; 0: checkpoints


def cfg(n_rs_seq):
    return ContextConfig(n_ctx=512, n_batch=64, f32_kv=True, n_threads=2, n_rs_seq=n_rs_seq)


def run(model, prompt, make_drafter, n_rs_seq, k=4, n=48, params=SamplingParams(), ctx=None):
    c = ctx or Context(model, cfg(n_rs_seq))
    resp = generate(c, prompt, make_drafter(c), params, n, k)
    return [t for ch in resp for t in ch.tokens], resp.stats, c


def assert_sampling_follows_the_target(model, gen, drafter, snapshots: int, n: int) -> None:
    """The joint distribution of the first three tokens sampled with ``drafter`` (T = 1.5, top-k
    6, ``n`` seeds, on the context ``gen``) equals the target's own (chi-square), and the drafts
    were partly accepted."""
    params = SamplingParams(temperature=1.5, top_k=6)
    prompt = model.tokenize(PROMPTS[0])
    exact = exact_joint(Context(model, cfg(0)), prompt, params)
    keys = list(exact)
    probs = np.array([exact[k] for k in keys])
    assert abs(probs.sum() - 1) < 1e-9
    counts, drafted, accepted = Counter(), 0, 0
    for seed in range(n):
        out, st, _ = run(model, prompt, lambda c: drafter, snapshots, k=2, n=3,
                         params=SamplingParams(1.5, 6, 1.0, seed), ctx=gen)
        counts[tuple(out)] += 1
        drafted, accepted = drafted + st.drafted, accepted + st.accepted
    assert set(counts) <= set(keys)
    stat, dof = chi2_stat(np.array([counts[k] for k in keys], float), probs)
    assert stat < chi2_critical(dof), (stat, dof)
    assert 0 < accepted < drafted


def run_cli(path, draft, env, prompt, *extra):
    rc, out, err = specli("run", "--target", path, "--draft", draft, "--raw", "--prompt", prompt, "-n", "40",
                          "-t", "2", "--json", "--stats", *extra, env=env)
    assert rc == 0, err
    return json.loads(out), err


def cache_env(tmp_path):
    import os
    return {**os.environ, "SPECLI_CACHE": str(tmp_path)}
