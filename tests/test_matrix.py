"""The combination matrix, in process (issue #36): every drafter (none, lookup, model, hybrid,
mtp, mtp-lookup, eagle3, eagle3-lookup, dflash, dflash-lookup) under each length policy
(--adaptive, --fixed), each constraint (none, a JSON schema, a regex, a GBNF grammar) and each
sampling (greedy; T > 0 with a seed), on the tiny f32 models it drafts for: the text is plain
decoding's under the same constraint and sampling, token for token. One session per family of
models, reused by every cell; the calibration is a GPU's (tests/curves.py), so the adaptive
controller drafts on any machine. The drafters from the target's own layers
(early-exit, layer-skip with lookup) take each constraint and sampling in turn, not every
combination. The entry points (run, chat, bench, serve) are tests/test_matrix_cli.py's."""

import pytest
from curves import gpu_like_costs
from matrixhelp import (
    BY_NAME,
    CONSTRAINTS,
    DRAFTERS,
    FAMILIES,
    GBNF,
    OWN,
    POLICIES,
    PROMPT,
    REGEX,
    SAMPLINGS,
    SCHEMA,
    N,
    draft_arg,
    family_models,
    pairwise,
)

from specli.constrain import Constraint
from specli.session import Options, Session
from specli.speculate.verify import SamplingParams

CONSTRAINT = {"none": None, "json-schema": Constraint.json_schema(SCHEMA), "regex": Constraint.regex(REGEX),
              "grammar": Constraint.gbnf(GBNF)}


def _session(family: str, smol_gguf: str) -> Session:
    target, draft = family_models(smol_gguf, family)
    ref = draft if draft is not None else "mtp"
    return Session(Options(target=target, draft=ref, f32_kv=True, threads=2), build_drafter=False)


@pytest.fixture(scope="module")
def sessions(smol_gguf, tmp_path_factory):
    """family -> its session, calibrated as a GPU (drafting pays): each mode priced here once,
    the cache rewritten, then the sessions opened again on it."""
    cache = tmp_path_factory.mktemp("specli")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLI_CACHE", str(cache))
        for family in FAMILIES:
            s = _session(family, smol_gguf)
            for m in s.modes():
                s.prepare(m)
            s.close()
        gpu_like_costs(cache)
        opened = {f: _session(f, smol_gguf) for f in FAMILIES}
        for s in opened.values():
            for m in s.modes():
                s.prepare(m)
        yield opened
        for s in opened.values():
            s.close()


def _generate(sess: Session, mode: str, constraint: str, sampling: str):
    temp, seed = SAMPLINGS[sampling]
    sess.ctx.clear()
    # (a drafter built by drafter_for shares the session's draft model: the session closes that)
    resp = sess.generate(sess.target.tokenize(PROMPT), SamplingParams(temperature=temp, seed=seed), N,
                         sess.drafter_for(mode), constraint=CONSTRAINT[constraint])
    return [t for ch in resp for t in ch.tokens], resp.stats


_plain: dict = {}


def _reference(sessions, family, constraint, sampling):
    key = (family, constraint, sampling)
    if key not in _plain:
        _plain[key] = _generate(sessions[family], "none", constraint, sampling)[0]
    return _plain[key]


CELLS = [(d.name, p, c, s) for d in DRAFTERS for p in POLICIES for c in CONSTRAINTS for s in SAMPLINGS
         if not (d.name == "none" and p == "fixed") and d.name not in OWN]
CELLS += [(d, p, c, s) for d, p, s, c in pairwise([(d, p, s) for d in sorted(OWN) for p in POLICIES
                                                   for s in SAMPLINGS], [CONSTRAINTS])]


@pytest.mark.parametrize("drafter,policy,constraint,sampling", CELLS)
def test_every_combination_decodes_plain_decodings_text(sessions, drafter, policy, constraint, sampling):
    d = BY_NAME[drafter]
    mode = d.mode(POLICIES[policy])
    plain = _reference(sessions, d.family, constraint, sampling)
    out, st = _generate(sessions[d.family], mode, constraint, sampling)
    assert out == plain
    # under a constraint a speculating drafter also drafts the tokens the grammar forces
    assert st.mode == mode or (constraint != "none" and drafter != "none" and st.mode == mode + "+forced")
    if drafter != "none" and constraint == "none" and sampling == "greedy":
        assert st.drafted > 0  # the cell really speculated (GPU costs; --fixed drafts regardless)
    if drafter == "none":
        assert st.drafted == 0


def test_the_matrix_covers_every_axis():
    assert {d.name for d in DRAFTERS} == {"none", "lookup", "model", "hybrid", "mtp", "mtp-lookup", "eagle3",
                                          "eagle3-lookup", "dflash", "dflash-lookup", "early-exit",
                                          "layer-skip-lookup"}
    full = len(DRAFTERS) - len(OWN)
    assert len(CELLS) == (2 * full - 1) * len(CONSTRAINTS) * len(SAMPLINGS) + len(OWN) * 2 * len(SAMPLINGS)
    for d in OWN:  # every constraint, every policy and every sampling, in turn
        mine = [cell[1:] for cell in CELLS if cell[0] == d]
        assert [{cell[i] for cell in mine} for i in range(3)] == [set(POLICIES), set(CONSTRAINTS), set(SAMPLINGS)]
    assert draft_arg(BY_NAME["mtp"], None) == "mtp"
