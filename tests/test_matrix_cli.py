"""The combination matrix through the entry points (issue #36): `run`, `chat` and `bench` as a
user types them, and the HTTP server (`serve`, `serve --parallel 2`) over a session of the same
options, each over every drafter x length policy (the drafters from the target's own layers, early-exit and
layer-skip with lookup, too), with the constraints and the sampling
settings taken in turn (pairwise, not a full product of subprocesses: tests/test_matrix.py has
the full product in process). Greedy text is plain decoding's, seeded text plain decoding's
with that seed; a combination that cannot work is refused in one line, non-zero exit. The
machine's costs are simulated as a GPU's (clihelp.simulated_costs), so the adaptive controller
drafts on any machine."""

import json
import os

import openai
import pytest
from clihelp import simulate_costs_here, simulated_costs, specli
from matrixhelp import (
    BY_NAME,
    CONSTRAINTS,
    DRAFTERS,
    OWN,
    POLICIES,
    PROMPT,
    SAMPLINGS,
    SCHEMA,
    N,
    cli_flags,
    constraint_files,
    draft_arg,
    family_models,
    pairwise,
)

from specli.serve.app import create_app
from specli.serve.runner import background
from specli.session import Options, Session
from specli.speculate.settings import SpecSettings

CELLS = [(d.name, p) for d in DRAFTERS for p in POLICIES if not (d.name == "none" and p == "fixed")]
RUN_CELLS = pairwise(CELLS, [CONSTRAINTS, list(SAMPLINGS)])
HEADS = {"mtp", "eagle3", "dflash"}  # families whose slots draft with prompt lookup under --parallel


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return simulated_costs("gpu", {**os.environ, "SPECLI_CACHE": str(tmp_path_factory.mktemp("specli"))})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return constraint_files(tmp_path_factory.mktemp("constraints"))


@pytest.fixture(scope="module")
def models(smol_gguf):
    return lambda family: family_models(smol_gguf, family)


def _run(models, env, files, drafter, policy, constraint, sampling):
    d = BY_NAME[drafter]
    target, draft = models(d.family)
    rc, out, err = specli("run", "--target", target, "--draft", draft_arg(d, draft), "--raw", "--prompt", PROMPT,
                          "-n", str(N), "-t", "2", "--json", *cli_flags(d, POLICIES[policy], constraint, sampling,
                                                                         files), env=env)
    assert rc == 0, err
    return json.loads(out)


_plain: dict = {}


def _run_plain(models, env, files, family, constraint, sampling):
    target, _ = models(family)
    key = (target, constraint, sampling)  # families that share a target share its plain text
    if key not in _plain:
        none = next(d for d in DRAFTERS if d.name == "none")
        rc, out, err = specli("run", "--target", target, "--draft", "none", "--raw", "--prompt", PROMPT, "-n", str(N),
                              "-t", "2", "--json", *cli_flags(none, True, constraint, sampling, files)[2:], env=env)
        assert rc == 0, err
        _plain[key] = json.loads(out)["tokens"]
    return _plain[key]


@pytest.mark.parametrize("drafter,policy,constraint,sampling", RUN_CELLS)
def test_run(models, env, files, drafter, policy, constraint, sampling):
    got = _run(models, env, files, drafter, policy, constraint, sampling)
    assert got["tokens"] == _run_plain(models, env, files, BY_NAME[drafter].family, constraint, sampling)


def test_run_lookup_fixed_under_a_json_schema(models, env, files):
    """The crash issue #36 reports: `run --draft lookup --fixed --json-schema S`."""
    got = _run(models, env, files, "lookup", "fixed", "json-schema", "greedy")
    assert got["tokens"] == _run_plain(models, env, files, "dflash", "json-schema", "greedy")


@pytest.mark.parametrize("drafter,policy,sampling", pairwise(CELLS, [list(SAMPLINGS)]))
def test_chat(models, env, drafter, policy, sampling):
    d = BY_NAME[drafter]
    target, draft = models(d.family)

    def chat(ref, flags):
        rc, out, err = specli("chat", "--target", target, "--draft", ref, "-n", str(N), "-t", "2", *flags,
                              stdin=PROMPT + "\n", env=env)
        assert rc == 0, err
        return out.split(">>> ")[1].rsplit("\n", 2)[0]  # the reply (the stats line after it)

    flags = cli_flags(d, POLICIES[policy], "none", sampling, {})
    assert chat(draft_arg(d, draft), flags) == chat("none", flags[2:])


@pytest.mark.parametrize("family", ["pair", "mtp", "eagle3", "dflash", "early-exit"])
def test_bench(models, env, tmp_path, family):
    """One bench per family of models, every mode its models allow, adaptive and fixed: each
    mode's text is plain decoding's (bench's own lossless check)."""
    target, draft = models(family)
    modes = sorted({d.mode(a) for d in DRAFTERS if d.family == family or d.name == "none" for a in (True, False)})
    suite = tmp_path / "one.yaml"
    suite.write_text(f"prompts:\n  - id: count\n    text: '{PROMPT}'\n")
    rc, out, err = specli("bench", "--target", target, "--draft", draft or "mtp", "--suite", str(suite), "-n", str(N),
                          "-t", "2", "--modes", ",".join(modes), "--json", env=env)
    assert rc == 0, err
    rep = json.loads(out)["modes"]
    assert set(rep) == set(modes)
    for m, r in rep.items():
        assert r["error"] == "", (m, r["error"])
        if m != "none":
            assert r["lossless"] == {"count": "identical"}, m


def _request(client, model, constraint, sampling):
    temp, seed = SAMPLINGS[sampling]
    kw = dict(model=model, max_tokens=N, temperature=temp, messages=[{"role": "user", "content": PROMPT}])
    if seed is not None:
        kw["seed"] = seed
    if constraint == "json-schema":
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    elif constraint == "tools":
        kw["tools"] = [{"type": "function", "function": {"name": "count", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]
        kw["tool_choice"] = "required"
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    return m.content, [(c.function.name, c.function.arguments) for c in (m.tool_calls or [])]


def _served(models, env, monkeypatch, drafter, policy, parallel, plain=False):
    """A session of ``drafter``'s family's target drafting with it (``plain``: with none, the
    reference: the same target decoding plainly)."""
    d = BY_NAME[drafter]
    target, draft = models(d.family)
    if plain:
        d = BY_NAME["none"]
    monkeypatch.setenv("SPECLI_CACHE", env["SPECLI_CACHE"])
    simulate_costs_here(monkeypatch, "gpu")
    spec = SpecSettings(adaptive=POLICIES[policy])
    return Session(Options(target=target, draft=draft_arg(d, draft), threads=2, lookup=d.lookup, spec=spec,
                           parallel=parallel))


SERVE_CONSTRAINTS = ["none", "json-schema", "tools"]


@pytest.mark.parametrize("parallel", [1, 2])
@pytest.mark.parametrize("drafter,policy,constraint,sampling", pairwise(CELLS, [SERVE_CONSTRAINTS, list(SAMPLINGS)]))
def test_serve(models, env, monkeypatch, drafter, policy, constraint, sampling, parallel):
    answers = []
    for name in (drafter, "none"):  # the same target, drafting and plain
        sess = _served(models, env, monkeypatch, drafter, policy if name != "none" else "adaptive", parallel,
                       plain=name == "none")
        try:
            if parallel > 1 and name != "none" and BY_NAME[drafter].family in HEADS:
                # the slots draft with prompt lookup (MTP layers and heads read one sequence's hidden
                # rows), and the server says so
                assert sess.drafter_name.startswith("lookup"), sess.drafter_name
            if name != "none" and drafter in OWN:  # every slot drafts with the target's own layers
                assert sess.drafter_name == BY_NAME[drafter].mode(POLICIES[policy]), sess.drafter_name
            app = create_app(sess, queue=4)
            with background(app) as url:
                client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
                answers.append(_request(client, app.state.model_ids[0], constraint, sampling))
        finally:
            sess.close()
    assert answers[0] == answers[1]
