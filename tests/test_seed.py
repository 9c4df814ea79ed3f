"""A seed fixes the sampled text: every drafter, every draft length, fixed or adaptive, gives
the text plain sampling gives with that seed (the noise belongs to the position, not to a
stream the drafts consume), through the Python API and `specli run`, on the tiny f32 pair."""

import json

import pytest
from clihelp import specli
from curves import gpu_like_costs

from specli.session import Options, Session
from specli.speculate.drafters import Drafter
from specli.speculate.loop import generate
from specli.speculate.source import LOOKUP, Draft
from specli.speculate.verify import SamplingParams

PROMPT = "Once upon a time"
N = 40
PARAMS = SamplingParams(temperature=0.8, seed=7)
FIXED = [("model-fixed", k) for k in range(1, 7)] + [("lookup-fixed", 4)]


def _tokens(resp) -> list[int]:
    return [t for ch in resp for t in ch.tokens]


@pytest.fixture(scope="module")
def gpu_like_cache(tmp_path_factory, tiny_target, tiny_draft):
    """A calibration cache whose costs make the adaptive controller draft (the costs of a GPU,
    where a verify block costs about one token): measured here once, then rewritten."""
    cache = tmp_path_factory.mktemp("specli")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLI_CACHE", str(cache))
        s = Session(Options(target=tiny_target, draft=tiny_draft, f32_kv=True, threads=2))
        s.prepare(s.draft.mode)
        s.close()
    gpu_like_costs(cache)
    return cache


@pytest.fixture(scope="module")
def session(gpu_like_cache, tiny_target, tiny_draft):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLI_CACHE", str(gpu_like_cache))
        s = Session(Options(target=tiny_target, draft=tiny_draft, f32_kv=True, threads=2))
        yield s
    s.close()


@pytest.fixture(scope="module")
def plain(session):
    prompt = session.target.tokenize(PROMPT)
    return _tokens(generate(session.ctx, prompt, session.drafter_for("none"), PARAMS, N))


@pytest.mark.parametrize("mode, k", [("none", 16), ("lookup", 16), ("model", 16), ("hybrid", 16), *FIXED])
def test_every_drafter_and_draft_length_gives_the_plain_text(session, plain, mode, k):
    prompt = session.target.tokenize(PROMPT)
    resp = generate(session.ctx, prompt, session.drafter_for(mode), PARAMS, N, draft_max=k)
    assert _tokens(resp) == plain
    st = resp.stats
    if mode == "model-fixed":  # both outcomes happened
        assert 0 < st.accepted < st.drafted, st
    elif mode in ("model", "hybrid"):  # the controller drafts (how long for follows this machine's timings)
        assert st.drafted > 0, st


class Scripted(Drafter):
    """A deterministic drafter (as prompt lookup is) that knows the answer: at each step it
    proposes the next 1 to 6 tokens of ``text``, the last one of every third draft wrong."""

    name = "lookup"

    def __init__(self, start: int, text: list[int]):
        self.start, self.text, self.steps = start, text, 0

    def propose(self, context, max_len):
        self.steps += 1
        at = len(context) - self.start
        toks = list(self.text[at:at + min(max_len, 1 + self.steps % 6)])
        if toks and self.steps % 3 == 0:
            toks[-1] = (toks[-1] + 1) % 1000
        return Draft(toks, LOOKUP, [2.0] * len(toks))


def test_a_deterministic_drafter_of_any_length_keeps_the_plain_text(session, plain):
    prompt = session.target.tokenize(PROMPT)
    resp = generate(session.ctx, prompt, Scripted(len(prompt), plain), PARAMS, N)
    assert _tokens(resp) == plain
    assert 0 < resp.stats.accepted < resp.stats.drafted


def test_the_session_api_and_other_seeds(session, plain):
    prompt = session.prompt_tokens(PROMPT, chat=False)
    assert _tokens(session.generate(prompt, PARAMS, N)) == plain  # the session's own drafter: hybrid, adaptive
    texts = {tuple(_tokens(session.generate(prompt, SamplingParams(0.8, seed=s), N))) for s in range(1, 5)}
    assert len(texts) == 4 and tuple(plain) not in texts
    unseeded = {tuple(_tokens(session.generate(prompt, SamplingParams(0.8), N))) for _ in range(2)}
    assert len(unseeded) == 2


def test_top_k_top_p_and_a_constraint_keep_the_text(session):
    from specli.constrain import Constraint
    prompt = session.target.tokenize(PROMPT)
    params = SamplingParams(temperature=1.2, top_k=40, top_p=0.9, seed=3)
    for c in (None, Constraint.regex("[a-z ]{10,60}")):
        texts = [_tokens(session.generate(prompt, params, N, drafter=session.drafter_for(m), constraint=c))
                 for m in ("none", "lookup", "model-fixed", "hybrid")]
        assert texts[0] and all(t == texts[0] for t in texts), c


def _cli(env, draft, *extra, seed=7):
    rc, out, err = specli("run", "--target", env["target"], "--draft", draft, "--raw", "--prompt", PROMPT,
                          "-n", str(N), "-t", "2", "--temp", "0.8", "--seed", str(seed), "--json", *extra,
                          env=env["env"])
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory, tiny_target, tiny_draft):
    """The CLI's own calibration cache (its KV cache type is another), made to draft as the
    Python API's is: measured by a first run, then rewritten."""
    import os
    cache = tmp_path_factory.mktemp("specli-cli")
    env = {"env": {**os.environ, "SPECLI_CACHE": str(cache)}, "target": tiny_target}
    _cli(env, tiny_draft)
    gpu_like_costs(cache)
    return env


@pytest.fixture(scope="module")
def cli_plain(cli_env):
    return _cli(cli_env, "none")["tokens"]


@pytest.mark.parametrize("extra", [["--no-lookup"], [], *[["--no-lookup", "--fixed", "--draft-max", str(k)]
                                                         for k in range(1, 7)]])
def test_cli_seed_gives_the_plain_text(cli_env, cli_plain, tiny_draft, extra):
    out = _cli(cli_env, tiny_draft, *extra)
    assert out["tokens"] == cli_plain
    st = out["stats"]
    assert (0 < st["accepted"] < st["drafted"]) if "--fixed" in extra else st["drafted"] > 0, st


def test_cli_lookup_and_other_seeds(cli_env, cli_plain):
    assert _cli(cli_env, "lookup")["tokens"] == cli_plain
    assert _cli(cli_env, "none", seed=8)["tokens"] != cli_plain
