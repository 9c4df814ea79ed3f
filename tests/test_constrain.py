"""Constrained decoding (llguidance) stays lossless: on tiny f32 models, greedy constrained output
with any drafter is token for token plain constrained output, and valid; at T > 0 the tokens
follow the target's masked distribution (chi-square); rejected drafts roll the grammar back."""

import json
import re
from collections import Counter

import numpy as np
import pytest
from clihelp import specli
from constrainhelp import CHEAP_VERIFY, EMAIL, SCHEMA
from exacthelp import CFG, PROMPTS, grounded_prompt
from stathelp import chi2_critical, chi2_stat

from specli.constrain import Constraint, from_options
from specli.engine import Context, Model
from specli.errors import SpecliError
from specli.speculate.adaptive import adaptive_drafter, lookup_drafter
from specli.speculate.drafters import Drafter, LookupDrafter, ModelDrafter, NoDrafter, greedy_drafts
from specli.speculate.forced import ForcedDrafter
from specli.speculate.loop import generate
from specli.speculate.settings import SpecSettings
from specli.speculate.source import FORCED, Draft
from specli.speculate.verify import SamplingParams, probs_from_logits


def run(tm, prompt, drafter, constraint, k=6, params=SamplingParams(), n=120, ctx=None):
    ctx = ctx or Context(tm, CFG)
    resp = generate(ctx, prompt, drafter, params, max_tokens=n, draft_max=k, constraint=constraint)
    toks = [t for ch in resp for t in ch.tokens]
    return toks, resp.stats


def drafters(dm):
    """Every kind of drafter, fresh: (label, drafter)."""
    s = SpecSettings(draft_max=6)
    return [
        ("lookup", LookupDrafter()),
        ("model", ModelDrafter(dm, CFG, p_min=0.0)),
        ("hybrid", adaptive_drafter(s, CHEAP_VERIFY, 0.01, lookup_drafter(s), ModelDrafter(dm, CFG, p_min=0.0))),
        ("forced", ForcedDrafter(NoDrafter())),
        ("hybrid+forced", ForcedDrafter(adaptive_drafter(s, CHEAP_VERIFY, 0.01, lookup_drafter(s),
                                                         ModelDrafter(dm, CFG, p_min=0.0)))),
    ]


# -- the constraint itself, no model --------------------------------------------------------

@pytest.mark.parametrize("c", [Constraint.json_schema(SCHEMA), Constraint.json_object(), Constraint.regex(EMAIL),
                               Constraint.lark('start: "yes" | "no"'), Constraint.gbnf('root ::= "yes" | "no"'),
                               Constraint.lark('start: "call " %json {"type": "object"}')])
def test_valid_constraints_check(c):
    c.check()


@pytest.mark.parametrize("make, msg", [
    (lambda: Constraint.regex("a(b"), "invalid regular expression: "),
    (lambda: Constraint.lark("start: foo"), "invalid Lark grammar: "),
    (lambda: Constraint.gbnf("root ::= foo"), "invalid GBNF grammar: "),
    (lambda: Constraint.json_schema("{not json"), "not valid JSON"),
    (lambda: Constraint.json_schema("[1, 2]"), "a JSON schema is an object"),
    (lambda: Constraint.json_schema({"type": "object", "properties": {"a": {"type": "nosuchtype"}}}),
     "invalid JSON schema: "),
])
def test_invalid_constraints_are_one_line_errors(make, msg):
    with pytest.raises(SpecliError, match=re.escape(msg)) as e:
        make().check()
    assert "\n" not in str(e.value)


def test_from_options(tmp_path):
    assert from_options() is None
    assert from_options(regex="a+") == Constraint.regex("a+")
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    assert from_options(json_schema=str(tmp_path / "s.json")).kind == "json_schema"
    (tmp_path / "g.lark").write_text('start: "x"')
    (tmp_path / "g.gbnf").write_text('root ::= "x"')
    assert from_options(grammar=str(tmp_path / "g.lark")).kind == "lark"
    assert from_options(grammar=str(tmp_path / "g.gbnf")).kind == "gbnf"
    with pytest.raises(SpecliError, match="exclude each other"):
        from_options(regex="a", grammar=str(tmp_path / "g.lark"))
    with pytest.raises(SpecliError, match="file not found"):
        from_options(json_schema=str(tmp_path / "missing.json"))


# -- the loop, on tiny f32 models ----------------------------------------------------------

def test_plain_constrained_output_is_valid_and_masked(tm):
    """Without speculation: the schema holds, and the tokens are not the unconstrained ones
    (the mask is applied)."""
    prompt = tm.tokenize(PROMPTS[0])
    free, _ = run(tm, prompt, NoDrafter(), None, n=40)
    toks, st = run(tm, prompt, NoDrafter(), Constraint.json_schema(SCHEMA))
    assert st.stop == "stop"
    obj = json.loads(tm.detokenize(toks))
    assert set(obj) == set(SCHEMA["properties"]) and obj["role"] in ("admin", "editor", "viewer")
    assert toks[:5] != free[:5]


@pytest.mark.parametrize("constraint", [Constraint.json_schema(SCHEMA), Constraint.regex(EMAIL)],
                         ids=["schema", "regex"])
def test_greedy_speculation_under_a_constraint_is_plain_constrained(tm, dm, constraint):
    drafted = Counter()
    accepted = Counter()
    for text in PROMPTS[:3]:
        prompt = grounded_prompt(tm, text)
        plain, pst = run(tm, prompt, NoDrafter(), constraint)
        out = tm.detokenize(plain)
        if constraint.kind == "regex":
            assert re.fullmatch(constraint.source, out), out
        else:
            json.loads(out)
        assert pst.stop == "stop"
        for label, d in drafters(dm):
            spec, st = run(tm, prompt, d, constraint)
            assert spec == plain, (label, text)
            assert st.stop == "stop" and st.generated == pst.generated, label
            drafted[label] += st.drafted
            accepted[label] += st.accepted
            d.close()
    for label in ("model", "hybrid", "forced", "hybrid+forced"):
        assert drafted[label] > 0, (label, drafted)
    # forced tokens are mostly right; drafts were kept and rejected: both paths ran
    assert accepted["forced"] > 0.5 * drafted["forced"], (accepted, drafted)
    assert accepted["model"] > 0 and sum(accepted.values()) < sum(drafted.values()), (accepted, drafted)


def test_forced_drafts_keep_to_the_room_a_batch_gives(tm):
    """A slot in a batch may draft only its share (Drafter.room): forced tokens, and what runs
    on after them, too."""

    class Slot(NoDrafter):
        sizes = []

        def room(self, max_len):
            return min(max_len, 2)

        def forced(self, tokens, max_len):
            return len(tokens)

        def observe_forced(self, draft, n_forced, n_accepted, emitted, t_draft, t_verify):
            self.sizes.append(len(draft.tokens))

    c = Constraint.json_schema(SCHEMA)
    prompt = tm.tokenize(PROMPTS[2])
    plain, _ = run(tm, prompt, NoDrafter(), c)
    toks, st = run(tm, prompt, ForcedDrafter(Slot()), c, k=8)
    assert toks == plain and Slot.sizes and max(Slot.sizes) == 2, Slot.sizes
    _, st8 = run(tm, prompt, ForcedDrafter(NoDrafter()), c, k=8)
    assert st8.drafted > 0 and st8.steps < st.steps  # unbounded, forced runs are longer


def test_a_copy_after_forced_tokens_is_priced_like_lookup():
    """The copy that runs on after forced tokens must match as far as asked (text before the
    forced tokens, not just the structure they repeat) and is kept only as far as its match's
    learned acceptance pays, as lookup's own drafts are."""
    s = SpecSettings(draft_max=8)
    d = adaptive_drafter(s, CHEAP_VERIFY, 0.01, lookup_drafter(s), None)
    ctx = list(range(100, 140)) + [7, 8] + list(range(100, 110))
    d.lookup.propose(ctx, 8)
    head = [110, 111]  # the match: 100..111, 12 tokens
    src = d.lookup.continuation(ctx, head, 8, 4).source
    assert d.continuation(ctx, head, 8, 13).tokens == []  # shorter than asked
    for _ in range(40):
        d.ctl.observe(src, 4, 4)
    assert d.continuation(ctx, head, 8, 12).tokens == list(range(112, 120))
    for _ in range(40):
        d.ctl.observe(src, 4, 0)
    assert d.continuation(ctx, head, 8, 12).tokens == []


def test_forced_tokens_are_drafted_and_learned(tm, dm):
    prompt = tm.tokenize(PROMPTS[2])
    s = SpecSettings(draft_max=8)
    d = ForcedDrafter(adaptive_drafter(s, CHEAP_VERIFY, 0.01, lookup_drafter(s), None))
    toks, st = run(tm, prompt, d, Constraint.json_schema(SCHEMA), k=8)
    plain, _ = run(tm, prompt, NoDrafter(), Constraint.json_schema(SCHEMA))
    assert toks == plain
    assert st.drafted_by_source.get("forced", 0) >= 4
    assert d.inner.ctl.sources[FORCED].f_n > 2  # its acceptance is learned like any source's
    assert d.name == "adaptive+forced" and st.mode == "adaptive+forced"


# the Q4_K_M 1.5B's verify curve on the AVX-512 development VM: a second row costs 0.85 of a first
STEEP_VERIFY = [1.0, 1.85, 2.46, 3.01, 3.73, 4.21, 4.91, 5.03, 5.42]


def test_forced_tokens_declined_at_first_are_learned_from_what_the_target_emits(tm):
    """On a steep curve the prior alone (a first token right 70 % of the time) declines forced
    tokens, and a source never drafted was never learned: forced tokens stayed off for good
    (specli's default ran below forced tokens alone). Declined, they are scored against what
    the target emits, as lookup's proposals are; once learned right, they are drafted."""
    prompt = tm.tokenize(PROMPTS[2])
    c = Constraint.json_schema(SCHEMA)
    s = SpecSettings(draft_max=8)
    fresh = adaptive_drafter(s, STEEP_VERIFY, 0.01, lookup_drafter(s), None)
    assert fresh.ctl.decide({FORCED: 4}, k_cap=8).k == 0  # the prior alone declines them here
    d = ForcedDrafter(adaptive_drafter(s, STEEP_VERIFY, 0.01, lookup_drafter(s), None))
    toks, st = run(tm, prompt, d, c, k=8)
    plain, _ = run(tm, prompt, NoDrafter(), c)
    assert toks == plain
    assert d.inner.ctl.sources[FORCED].alpha_first > 0.9  # learned from the target's own tokens
    assert st.drafted_by_source.get("forced", 0) > 0, st.drafted_by_source


class Misleading(Drafter):
    """Drafts tokens the grammar allows but the target would not pick: the lowest-numbered
    allowed token, then the next allowed after it. Every draft is rejected."""

    name = "misleading"

    def constrain(self, guide):
        self.guide = guide

    def propose(self, context, max_len):
        g = self.guide
        first = int(np.flatnonzero(g.allowed())[0])
        g.m.consume_token(first)
        second = int(np.flatnonzero(g.allowed())[0])
        g.m.rollback(1)
        return Draft([first, second][:max_len], FORCED)


def test_rejected_drafts_roll_the_grammar_back(tm):
    c = Constraint.json_schema(SCHEMA)
    prompt = tm.tokenize(PROMPTS[1])
    plain, _ = run(tm, prompt, NoDrafter(), c)
    toks, st = run(tm, prompt, Misleading(), c)
    assert toks == plain and st.drafted > 10 and st.accepted < st.drafted


def test_guide_masks_consume_and_settle_rolls_back(tm):
    c = Constraint.json_schema(SCHEMA)
    ref = c.guide(tm)
    g = c.guide(tm)
    forced = g.forced(8)
    assert forced and tm.detokenize(forced).startswith('{"name')
    g.m.consume_tokens(forced)
    after = np.flatnonzero(g.allowed())  # the name's first token: a free choice
    g.m.rollback(len(forced))
    assert len(after) > 2
    d = g.clip(forced + [int(after[0]), tm.eos])  # the end is not allowed there: cut
    assert d == forced + [int(after[0])]
    m = g.masks(d)
    assert m[len(d)].sum() > 0 and g.ahead == len(d)  # reading the last mask consumed the draft
    # the target kept all but the last drafted token and chose its own instead
    alt = int(after[1])
    assert m[len(forced)][alt]
    assert g.settle(forced + [alt]) == len(forced) + 1
    ref.m.consume_tokens(forced + [alt])
    assert np.array_equal(g.allowed(), ref.allowed())
    assert g.forced(8) == ref.forced(8)
    # and the check has teeth: a state one token further on differs
    ref.m.consume_token(int(np.flatnonzero(ref.allowed())[0]))
    assert not np.array_equal(g.allowed(), ref.allowed())


def test_a_draft_runs_on_through_forced_and_copied_text(tm):
    """Guide.extend: after a draft, what the grammar forces, then the copy lookup offers, then
    what that forces, as far as the grammar and the room allow; the state is left as it was."""
    g = Constraint.json_schema(SCHEMA).guide(tm)
    before = g.allowed()
    head = g.clip(g.forced(20) + tm.tokenize(' "Bob"', add_special=False))
    assert tm.detokenize(head) == '{"name": "Bob"'
    age = g.extend(head, 20, lambda h, n, f: [])
    assert tm.detokenize(age) == ', "age": '
    seen = []
    n42 = tm.tokenize("42", add_special=False)

    def copy(h, n, forced):
        seen.append((tm.detokenize(h), forced))  # a copy is told how many forced tokens end the text
        return n42 if len(seen) == 1 else []

    out = g.extend(head, 20, copy)
    assert tm.detokenize(out) == ', "age": 42, "role": "'
    role = len(out) - len(age) - len(n42)
    assert seen == [('{"name": "Bob", "age": ', len(age)), ('{"name": "Bob", "age": 42, "role": "', role)]
    assert len(g.extend(head, 2, copy)) == 2  # the room caps it
    refused = g.extend(head, 20, lambda h, n, f: tm.tokenize("x", add_special=False))  # not a number: cut
    assert tm.detokenize(refused) == ', "age": '
    # a drafter's own draft that stops inside a value is not copied on; forced text is
    bo = g.clip(g.forced(20) + tm.tokenize(' "Bo', add_special=False))
    seen.clear()
    assert g.extend(bo, 20, copy) == [] and seen == []
    assert g.extend(bo, 20, copy, forced=1) == tm.tokenize("42", add_special=False) and seen[0][1] == 1
    assert np.array_equal(g.allowed(), before) and g.ahead == 0


def test_a_model_draft_stops_where_the_grammar_forces_the_next_token(tm):
    """Under ForcedDrafter (``chained``), a model's draft makes no pass for a token the grammar
    forces: the draft runs on through it for free."""
    quote, comma = tm.tokenize('"', add_special=False)[0], tm.tokenize(",", add_special=False)[0]
    prefix = tm.tokenize('{"name": "Bob', add_special=False)
    first, nxt = np.zeros(tm.n_vocab, np.float32), np.zeros(tm.n_vocab, np.float32)
    first[quote] = nxt[comma] = 10.0
    for chained, passes in ((False, 1), (True, 0)):
        g = Constraint.json_schema(SCHEMA).guide(tm)
        assert g.m.try_consume_tokens(prefix) == len(prefix)
        g.chained = chained
        calls = []
        toks, _, n = greedy_drafts(first, lambda t, calls=calls: calls.append(t) or nxt, 2, tm.is_eog, 0.0, guide=g)
        assert toks[0] == quote and n == len(calls) == passes, (chained, toks, calls)
        assert g.forced(4) == [] and g.m.try_consume_tokens([quote]) == 1 and g.forced(4)  # as it was


def test_grammar_completion_ends_with_stop(tm, dm):
    c = Constraint.lark('start: "The answer is " ("yes" | "no") "."')
    prompt = tm.tokenize(PROMPTS[0])
    for d in (NoDrafter(), ForcedDrafter(NoDrafter()), ModelDrafter(dm, CFG, p_min=0.0)):
        toks, st = run(tm, prompt, d, c, n=50)
        assert st.stop == "stop" and tm.detokenize(toks) in ("The answer is yes.", "The answer is no.")
    toks, st = run(tm, prompt, ForcedDrafter(NoDrafter()), c, n=50)
    assert st.drafted >= 3 and st.steps < len(toks)  # the forced text went through in blocks


def exact_masked_joint(ctx, prompt, params, constraint):
    """The exact distribution of the first three constrained tokens (a sequence ending early
    at an end of generation is its own outcome), from the target's logits masked by the
    grammar at each position."""
    model = ctx.model
    g = constraint.guide(model)

    ctx.clear()
    first = ctx.eval(list(prompt))[0].copy()

    def probs(prefix):
        ctx.rollback(len(prompt))
        row = ctx.eval(prefix)[0] if prefix else first
        return probs_from_logits(np.where(g.allowed(), row, -np.inf), params)

    exact = {}

    def walk(prefix, p):
        if len(prefix) == 3:
            exact[tuple(prefix)] = p
            return
        dist = probs(prefix)
        for t in np.nonzero(dist)[0]:
            t = int(t)
            if model.is_eog(t):
                exact[tuple(prefix)] = exact.get(tuple(prefix), 0.0) + p * dist[t]
                continue
            g.m.consume_token(t)
            walk(prefix + [t], p * dist[t])
            g.m.rollback(1)

    walk([], 1.0)
    return exact


def test_sampling_under_a_constraint_follows_the_masked_distribution(tm, dm):
    """Joint distribution of the first three tokens under speculative sampling with a grammar
    equals the target's masked distribution (chi-square). Masking skipped, or top-k taken
    before the mask, puts mass on other sequences and fails."""
    c = Constraint.regex(r"[^eE]{1,60}")
    params = SamplingParams(temperature=1.5, top_k=6)
    prompt = tm.tokenize(PROMPTS[0])
    exact = exact_masked_joint(Context(tm, CFG), prompt, params, c)
    keys = list(exact)
    probs = np.array([exact[k] for k in keys])
    assert abs(probs.sum() - 1) < 1e-9
    n = 1500
    drafter = ModelDrafter(dm, CFG, p_min=0.0)
    counts = Counter()
    gen = Context(tm, CFG)
    drafted = accepted = 0
    for seed in range(n):
        resp = generate(gen, prompt, drafter, SamplingParams(1.5, 6, 1.0, seed), 3, 2, constraint=c)
        counts[tuple(t for ch in resp for t in ch.tokens)] += 1
        drafted += resp.stats.drafted
        accepted += resp.stats.accepted
    assert set(counts) <= set(keys), set(counts) - set(keys)
    stat, dof = chi2_stat(np.array([counts[k] for k in keys], float), probs)
    assert stat < chi2_critical(dof), (stat, dof)
    assert 0 < accepted < drafted


# -- the CLI -------------------------------------------------------------------------------

GREEDY = ["--raw", "--max-tokens", "120", "--temp", "0"]


def test_cli_json_schema_prints_the_plain_constrained_output(tmp_path, tiny_target, tiny_draft):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    outs = {}
    for draft in ("none", tiny_draft, "lookup"):
        rc, out, err = specli("run", "--target", tiny_target, "--draft", draft, *GREEDY, "--json-schema", str(schema),
                              "--json", "--prompt", "Extract the person: Ada, 36, admin")
        assert rc == 0, err
        d = json.loads(out)
        assert d["finish_reason"] == "stop"
        outs[draft] = d["tokens"]
        obj = json.loads(d["text"])
        assert set(obj) == set(SCHEMA["properties"])
    assert outs["none"] == outs[tiny_draft] == outs["lookup"]
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "lookup", *GREEDY, "--regex", EMAIL,
                          "--prompt", "An email address:")
    assert rc == 0, err
    assert re.fullmatch(EMAIL, out.strip()), out


def test_cli_lookup_fixed_under_a_json_schema_prints_the_plain_constrained_output(tmp_path, tiny_target):
    """Issue #36's crash: --draft lookup --fixed --json-schema S ended in "internal error:
    TypeError: 'Draft' object is not iterable" (lookup's copy is a Draft, the grammar's
    run-on expected a list). Greedy, it prints what plain constrained decoding prints."""
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    common = [*GREEDY, "--json-schema", str(schema), "--json", "--prompt",
              'Ada is 36 and an admin. {"name": "Ada", "age": 36, "role": "admin", "tags": []}']
    outs = {}
    for draft in (["none"], ["lookup", "--fixed"]):
        rc, out, err = specli("run", "--target", tiny_target, "--draft", *draft, *common)
        assert rc == 0, err
        assert "internal error" not in err
        outs[draft[0]] = json.loads(out)
    assert outs["lookup"]["tokens"] == outs["none"]["tokens"]
    assert outs["lookup"]["text"] == outs["none"]["text"]
    assert set(json.loads(outs["none"]["text"])) == set(SCHEMA["properties"])


@pytest.mark.parametrize("mode", ["lookup", "lookup-fixed", "model-fixed", "hybrid", "model"])
@pytest.mark.parametrize("constraint", [Constraint.json_schema(SCHEMA), Constraint.regex(EMAIL)],
                         ids=["schema", "regex"])
def test_every_registry_mode_under_a_constraint_is_plain_constrained(pair_session, mode, constraint):
    """Each mode as the registry builds it, under a schema and a regular expression, through
    the session's constrained path (ForcedDrafter over the mode's capabilities): greedy text
    equals plain constrained decoding's."""
    sess = pair_session
    prompt = grounded_prompt(sess.target, PROMPTS[0])

    def tokens(m):
        sess.ctx.clear()
        d = sess.drafter_for(m)
        resp = sess.generate(prompt, SamplingParams(), 80, d, constraint=constraint)
        out = [t for ch in resp for t in ch.tokens]
        return out, resp.stats

    plain, _ = tokens("none")
    out, st = tokens(mode)
    assert out == plain, mode
    assert st.mode == f"{mode}+forced"


@pytest.fixture(scope="module")
def pair_session(tiny_target, tiny_draft):
    from specli.session import Options, Session

    sess = Session(Options(target=tiny_target, draft=tiny_draft, spec=SpecSettings(draft_max=6)),
                   build_drafter=False)
    yield sess
    sess.close()


@pytest.mark.parametrize("args, msg", [
    (["--regex", "a(b"], "invalid regular expression: "),
    (["--grammar", "{tmp}/bad.gbnf"], "invalid GBNF grammar: "),
    (["--grammar", "{tmp}/bad.lark"], "invalid Lark grammar: "),
    (["--json-schema", "{tmp}/bad.json"], "not valid JSON"),
    (["--json-schema", "{tmp}/missing.json"], "file not found"),
    (["--regex", "a", "--json-schema", "{tmp}/bad.json"], "exclude each other"),
])
def test_cli_bad_constraints_are_one_line_errors(tmp_path, tiny_target, args, msg):
    (tmp_path / "bad.gbnf").write_text("root ::= missing_rule")
    (tmp_path / "bad.lark").write_text("start: missing_rule")
    (tmp_path / "bad.json").write_text("{nope")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "none", "--prompt", "x", *args)
    assert rc != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specli: error: ") and msg in lines[0], err


# -- the real pair -------------------------------------------------------------------------

@pytest.mark.real
def test_real_pair_json_schema_is_plain_constrained(real_model, tmp_path):
    """`specli run --profile default --json-schema` prints valid JSON, the plain constrained
    output (--draft none), or parts from it only at a near-tie (batched quantised numerics)."""
    from specli.engine import ContextConfig
    from specli.measure.lossless import divergence

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "company": {"type": "string"},
                                               "city": {"type": "string"}, "email": {"type": "string"}},
              "required": ["name", "company", "city", "email"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    prompt = ("Extract the contact as JSON.\n\nBest regards,\nMargaret Okonkwo-Hale\nNorthwind Logistics GmbH, "
              "Hamburg\nmargaret.okonkwo-hale@northwind-logistics.example\n")
    outs = {}
    for draft in ("none", "auto"):
        rc, out, err = specli("run", "--profile", "default", "--draft", draft, "--temp", "0", "-n", "120",
                              "--json-schema", str(tmp_path / "s.json"), "--json", stdin=prompt)
        assert rc == 0, err
        outs[draft] = json.loads(out)
        assert outs[draft]["finish_reason"] == "stop"
        obj = json.loads(outs[draft]["text"])
        assert set(obj) == set(schema["properties"]) and obj["email"].startswith("margaret")
    plain, spec = outs["none"], outs["auto"]
    assert spec["stats"]["drafted_by_source"].get("forced", 0) > 0
    if plain["tokens"] != spec["tokens"]:
        m = Model(real_model("qwen2.5-coder-1.5b-instruct-q4_k_m"))
        d = divergence(Context(m, ContextConfig(n_ctx=1024)), plain["prompt_tokens"], plain["tokens"], spec["tokens"])
        assert d is None or d.near_tie, d.describe()
