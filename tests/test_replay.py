"""The replay benchmark's machinery: no policy beats its clairvoyant bound (synthetic traces,
every policy, several cost models), the replayed controller is the shipped one (a real run
on tiny f32 models, with the cost model's figures in place of timings, takes exactly the
replay's steps), and the traces say what the draft model would draft."""

import importlib
import pkgutil
import random
import sys

import pytest
from curves import VM_CURVE

import research.studies
from research.lab import policies
from research.lab.replay import (
    Clock,
    Costs,
    ModelTrace,
    Run,
    Trace,
    TraceModel,
    bound,
    drafter_options,
    load_traces,
    lookup_agreement,
    record,
    replay,
    save_traces,
)
from research.studies import copy_evidence, lookup_gap
from research.studies import replay as study
from specli.engine import Context, ContextConfig, Model
from specli.speculate.adaptive import adaptive_drafter, lookup_drafter
from specli.speculate.drafters import Drafter, LookupDrafter, ModelDrafter
from specli.speculate.loop import generate
from specli.speculate.settings import DEFAULTS
from specli.speculate.source import MODEL, Draft, lookup_key
from specli.speculate.verify import SamplingParams

CPU = Costs.measured("vm", VM_CURVE, 0.5)
COSTS = [CPU, Costs.linear(0.02, 0.05, 64), Costs.linear(0.2, 0.5, 64), Costs.linear(0.05, 0.2, 64)]


def synthetic(seed: int, n_edits: int, agree: float) -> Trace:
    """An answer that copies its prompt with edits, and a draft model right ``agree`` of the
    time (its wrong guesses are some other token)."""
    rng = random.Random(seed)
    src = [rng.randrange(50, 90) for _ in range(160)]
    out = list(src)
    for i in rng.sample(range(1, 160), n_edits):
        out[i] = rng.randrange(200, 220)
    argmax = [t if rng.random() < agree else t + 1000 for t in out]
    p_top = [round(rng.uniform(0.6, 1.0) if a == t else rng.uniform(0.1, 0.9), 3) for a, t in zip(argmax, out)]
    return Trace("synthetic", f"{seed}", [1] + src + [2], out, [], {"model": ModelTrace(argmax, p_top)})


TRACES = [synthetic(s, e, a) for s, e, a in [(1, 5, 0.9), (2, 40, 0.6), (3, 120, 0.3), (4, 0, 0.95)]]


@pytest.mark.parametrize("costs", COSTS, ids=lambda c: c.name)
def test_no_policy_beats_its_bound(costs):
    K = DEFAULTS.draft_max
    every = policies.every_policy(("lookup", "model"), K)
    assert {p.family for p in every} == {"specli", "fixed", "llama.cpp"}
    for t in TRACES:
        look = lookup_agreement(t.prompt, t.out, 64)
        for p in every:
            clock = Clock()
            run = replay(t, p.make(t, costs, clock), costs, p.draft_max, clock)
            # the bound at the policy's own longest draft; lookup's renames are off here
            # (a copy that renames can beat a verbatim copy's bound; these traces never rename)
            b = bound(len(t.out), drafter_options(t, costs, p.kinds, p.draft_max, look), costs.verify, p.draft_max)
            assert b <= run.cost + 1e-9, (p.name, t.id)
            assert run.accepted + run.steps == len(t.out) - 1  # every token emitted once


def test_bound_is_plain_without_drafts_and_the_cheapest_split_with_perfect_ones():
    t = TRACES[3]
    n = len(t.out)
    nothing = [(tuple([0] * n), 0.0, 0.0)]
    assert bound(n, nothing, VM_CURVE, 16) == pytest.approx(n - 1)
    perfect = [(tuple([16] * n), 0.0, 0.0)]
    best = {0: 0.0}
    for m in range(1, n):  # blocks of up to 17 tokens over the n - 1 after the first
        best[m] = min(VM_CURVE[b - 1] + best[m - b] for b in range(1, min(17, m) + 1))
    assert bound(n, perfect, VM_CURVE, 16) == pytest.approx(best[n - 1])


def test_fixed_policies_cost_what_their_steps_cost():
    t = TRACES[0]
    costs = COSTS[3]
    clock = Clock()
    p = policies.fixed(("model",), 4)
    run = replay(t, p.make(t, costs, clock), costs, 4, clock)
    agree = t.models["model"].agreement(t.out, 4)
    i, cost, steps, catch_up = 1, 0.0, 0, len(t.prompt) + 1
    while i < len(t.out):  # always 4 drafted (fewer at the end), accepted as far as the model agrees
        k = min(4, len(t.out) - 1 - i)
        # the draft model first catches up, in one batch, on what its cache lacks (the prompt
        # at the first step; then the target's token, and the last drafted one when all passed)
        cost += costs.verify[k] + (costs.draft * (costs.block(catch_up) + k - 1) if k else 0.0)
        a = min(k, agree[i])
        catch_up = 2 if a == k else 1
        i += a + 1
        steps += 1
    assert run.steps == steps
    assert run.cost == pytest.approx(cost)


def test_traces_round_trip(tmp_path):
    save_traces(tmp_path / "s.json", TRACES)
    assert load_traces(tmp_path / "s.json") == TRACES
    assert load_traces(tmp_path / "missing.json") is None


# -- on tiny f32 models: the trace and the replay against a real run ------------------------
CFG = ContextConfig(n_ctx=1024, n_batch=64, f32_kv=True, n_threads=2)


class Priced(Drafter):
    """The shipped drafter in a real run, told the cost model's figures instead of timings:
    each draft-model pass is billed as the replay bills it."""

    def __init__(self, inner: Drafter, costs: Costs, clock: Clock):
        self.inner, self.costs, self.clock, self.name = inner, costs, clock, inner.name
        self.steps: list[tuple[int, int]] = []

    def begin(self, prompt, max_tokens):
        self.inner.begin(prompt, max_tokens)

    def propose(self, context, max_len):
        self.clock.spent = 0.0
        return self.inner.propose(context, max_len)

    def observe(self, draft, n_accepted, emitted, t_draft, t_verify):
        k = len(draft.tokens)
        self.steps.append((k, n_accepted))
        self.inner.observe(draft, n_accepted, emitted, self.clock.spent, self.costs.verify[k])


def billed(drafter: ModelDrafter, costs: Costs, clock: Clock) -> ModelDrafter:
    ev = drafter.ctx.eval

    def eval_(tokens, *a, **kw):
        clock.spent += costs.draft * costs.block(len(tokens))
        return ev(tokens, *a, **kw)

    drafter.ctx.eval = eval_
    return drafter


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    tm, dm = Model(tiny_target), Model(tiny_draft)
    yield tm, dm
    tm.close()
    dm.close()


PROMPTS = ["def fibonacci(n):", "Once upon a time, in a land far away,",
           "Rewrite this list in order: pear, apple, fig, pear, apple, fig, pear, apple, fig."]


@pytest.mark.parametrize("costs", [Costs.linear(0.05, 0.2, 16), Costs.measured("vm", VM_CURVE, 0.05)],
                         ids=["gpu-like", "vm"])
def test_the_replayed_controller_takes_the_real_runs_steps(pair, costs):
    tm, dm = pair
    s = DEFAULTS
    ctx, dctx = Context(tm, CFG), Context(dm, CFG)
    hybrid = policies.specli(("lookup", "model"), s)
    n_drafted = 0
    for text in PROMPTS:
        prompt = tm.tokenize(text)
        clock = Clock()
        real = Priced(adaptive_drafter(s, list(costs.verify[:s.draft_max + 1]), costs.draft, lookup_drafter(s),
                                       billed(ModelDrafter(dm, CFG), costs, clock)), costs, clock)
        ctx.clear()
        out = [t for ch in generate(ctx, prompt, real, SamplingParams(), 96, s.draft_max) for t in ch.tokens]
        trace = record(ctx, prompt, 96, {"model": dctx}, s.draft_max)
        assert trace.out == out and len(out) == 96  # the trace's answer is the target's own
        rclock = Clock()
        run = replay(trace, hybrid.make(trace, costs, rclock), costs, hybrid.draft_max, rclock)
        assert list(zip(run.lengths, run.accepted_at)) == real.steps
        n_drafted += sum(k for k, _ in real.steps)
    assert n_drafted > 10  # the comparison covered real drafting


def test_the_loop_and_the_replay_tell_the_drafter_the_prompt_and_the_cap(pair):
    class Told(Drafter):
        def __init__(self):
            self.told = []

        def begin(self, prompt, max_tokens):
            self.told.append((list(prompt), max_tokens))

        def propose(self, context, max_len):
            return Draft([])

    tm, _ = pair
    prompt = tm.tokenize(PROMPTS[1])
    d = Told()
    out = [t for ch in generate(Context(tm, CFG), prompt, d, SamplingParams(), 9, 4) for t in ch.tokens]
    assert d.told == [(prompt, 9)] and len(out) == 9
    t = Trace("s", "p", prompt, out[:5], [], {}, max_tokens=9)  # an answer that stopped early
    replay(t, d, Costs.linear(0.1, 0.1, 8), 4, Clock())
    assert d.told[1] == (prompt, 9)  # the cap, not the answer's length


def test_the_trace_says_what_the_draft_model_drafts(pair):
    tm, dm = pair
    ctx, dctx = Context(tm, CFG), Context(dm, CFG)
    prompt = tm.tokenize(PROMPTS[0])
    trace = record(ctx, prompt, 48, {"model": dctx}, 6)
    real = ModelDrafter(dm, CFG, p_min=0.0)
    costs = Costs.linear(0.05, 0.2, 16)
    agree = trace.models["model"].agreement(trace.out, 6)
    for i in range(1, len(trace.out) - 6, 5):
        context = prompt + trace.out[:i]
        d = real.propose(context, 6)
        r = TraceModel(trace, "model", MODEL, costs, Clock()).propose(context, 6)
        right = 0
        while right < 6 and d.tokens[right] == trace.out[i + right]:
            right += 1
        assert right == agree[i]
        assert r.tokens[:right + 1] == d.tokens[:right + 1]
        assert r.confidence[:right + 1] == pytest.approx(d.confidence[:right + 1], abs=1e-4)
    real.close()


def _edited_copies(n_edits: int, seed: int = 3, reps: int = 3):
    rng = random.Random(seed)
    for r in range(reps):
        src = [rng.randrange(50, 90) for _ in range(400)]
        out = list(src)
        for i in rng.sample(range(1, 400), n_edits):  # an edited copy of its input
            out[i] = rng.randrange(200, 220)
        yield Trace("edits", f"{n_edits}-{r}", [1] + src + [2], out, [])


def _lookup_costs(n_edits: int) -> tuple[float, float, float, list[int]]:
    """(specli's adaptive lookup, fixed 16, plain, the adaptive's draft lengths) over edited
    copies on this VM's curve."""
    out, lengths = [0.0, 0.0, 0.0], []
    for t in _edited_copies(n_edits):
        for j, p in enumerate((policies.specli(("lookup",)), policies.fixed(("lookup",), 16))):
            clock = Clock()
            run = replay(t, p.make(t, CPU, clock), CPU, p.draft_max, clock)
            out[j] += run.cost
            if j == 0:
                lengths += [k for k in run.lengths if k]
        out[2] += t.plain_cost
    return out[0], out[1], out[2], lengths


def test_adaptive_lookup_gains_on_copies_and_stays_near_plain_on_heavy_edits():
    adaptive, fixed16, plain, lengths = _lookup_costs(10)
    # long copies: it drafts long, within 4% of always drafting 16 (3.6% today: at the start,
    # and right after each edit, where the copy is picked up again, it is cautious until
    # those copies have proved themselves; always drafting 16 is right every time here)
    assert plain / adaptive > 1.3 and adaptive <= 1.04 * fixed16
    assert sum(k for k in lengths if k >= 8) > 0.6 * sum(lengths)  # most drafted tokens in long drafts
    adaptive, fixed16, plain, _ = _lookup_costs(150)
    assert adaptive <= 1.01 * plain and fixed16 > 1.5 * plain  # an edit every ~3 tokens: drafts little


def test_picking_a_copy_up_again_past_an_edit_pays(monkeypatch):
    with_resync = _lookup_costs(10)
    monkeypatch.setattr(LookupDrafter, "RESYNC_HELD", 10 ** 9)  # never picked up again
    without = _lookup_costs(10)
    assert with_resync[0] < 0.995 * without[0]  # the adaptive policy
    assert with_resync[1] < 0.95 * without[1]  # always drafting 16


def test_a_model_draft_that_runs_into_a_copy_hands_over_to_lookup():
    src = list(range(100, 140))
    out = [7, 8] + src[:30]  # two new tokens, then a copy of the prompt's text
    argmax = list(out)  # a draft model that is always right
    t = Trace("s", "h", [1] + src + [2], out, [], {"model": ModelTrace(argmax, [0.99] * len(out))})
    costs = Costs.linear(0.01, 0.05, 64)
    clock = Clock()
    hybrid = policies.specli(("lookup", "model")).make(t, costs, clock)
    for _ in range(4):  # copies from long matches have been right
        hybrid.ctl.observe(lookup_key(4), 8, 8)
    d = hybrid.propose(t.prompt + out[:1], 16)  # no lookup match yet: the model drafts
    own = len(d.confidence)  # the model's own tokens; the rest came from the copy
    assert d.source.kind == "model" and own == 5  # 8, then 4 tokens that match the prompt
    assert d.tokens == out[1:17] and len(d.tokens) == 16
    # the catch-up pass yields the first token, one pass each the next 4: none for the copy
    assert d.passes == own - 1
    assert clock.spent == pytest.approx(costs.draft * (costs.block(len(t.prompt) + 1) + own - 1))


def test_a_model_draft_goes_on_where_it_promises_more_than_the_copy():
    src = list(range(100, 140))
    out = [7, 8] + src[:30]
    t = Trace("s", "h", [1] + src + [2], out, [], {"model": ModelTrace(list(out), [0.99] * len(out))})
    costs = Costs.linear(0.01, 0.05, 64)
    hybrid = policies.specli(("lookup", "model")).make(t, costs, Clock())
    for _ in range(4):  # copies from long matches have broken at once; the model has been right
        hybrid.ctl.observe(lookup_key(4), 8, 0)
        hybrid.ctl.observe(MODEL, 8, 8)
    d = hybrid.propose(t.prompt + out[:1], 16)
    assert d.source.kind == "model" and len(d.confidence) == len(d.tokens) == 16  # all its own


def test_the_prompt_catch_up_is_not_learned_as_the_cost_of_a_draft_token():
    t = TRACES[3]
    costs = Costs.linear(0.2, 0.2, 64)
    clock = Clock()
    drafter = policies.specli(("model",)).make(t, costs, clock)
    context = t.prompt + t.out[:1]
    d = drafter.propose(context, 16)
    assert d.tokens and d.caught_up == len(context)  # the first draft evaluates the whole prompt
    assert clock.spent > 5 * costs.draft * len(d.tokens)
    n = len(d.tokens)  # this model is right here
    drafter.observe(d, n, t.out[1:n + 2], clock.spent, costs.verify[n])
    assert drafter.ctl.cost.draft_token == pytest.approx(costs.draft)


def test_lookup_gap_sorts_each_step_against_how_far_the_copy_held():
    verify = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    # positions 1..: a plain step where a 4-token copy held; a 2-token draft passed whole, its
    # copy held for 5; a 3-token draft kept 1; a 2-token draft failed at once; a plain step
    # with nothing to copy
    own = [0, 4, 5, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0]
    run = Run(lengths=[0, 2, 3, 2, 0], accepted_at=[0, 2, 1, 0, 0])
    lost = lookup_gap.where_lost(run, own, verify)
    assert lost["not drafted"] == 1 and lost["not drafted tokens"] == 4
    assert lost["cut short"] == 1 and lost["cut short tokens"] == 3
    assert lost["past the break"] == 1 and lost["past the break cost"] == pytest.approx(verify[3] - verify[1])
    assert lost["failed"] == 1 and lost["failed cost"] == pytest.approx(verify[2] - verify[0])


def test_a_table_rule_told_the_first_token_drafts_only_copies_that_start_right():
    """research/studies/replay.py's oracle rule (what knowing where copies break would be worth):
    told the answer, it drafts no copy whose first token fails; the same rule untold drafts
    those too, and the told rule takes the same steps with plain ones in their place."""
    src = list(range(100, 160))
    out = [7] + src[:12] + [300] + src[13:30] + [301, 302] + src[32:50]  # a copy with two edits
    t = Trace("s", "c", [1] + src + [2], out, [])
    table = {(b, kind): 4 for b in range(len(study.MATCH_BANDS)) for kind in study.KINDS}
    costs = Costs.linear(0.5, 0.5, 16)
    untold, told = (replay(t, study.TableRule(table, x), costs, 16, Clock()) for x in (None, t))
    failed = [k for k, a in zip(untold.lengths, untold.accepted_at) if k and a == 0]
    assert failed  # the untold rule drafts into an edit
    assert all(a > 0 for k, a in zip(told.lengths, told.accepted_at) if k)
    assert told.accepted_at == untold.accepted_at  # the same steps; those failed drafts became plain steps
    assert told.cost == pytest.approx(untold.cost - sum(costs.verify[k] - costs.verify[0] for k in failed))


def test_a_cost_curve_file_without_the_draft_cost_is_refused(tmp_path):
    from specli.errors import SpecliError

    good = tmp_path / "curve.json"
    good.write_text('{"verify": [0.02, 0.03, 0.04], "draft_token": 0.005, "machine": "m"}')
    c = Costs.from_file(str(good))
    assert c.verify == pytest.approx((1.0, 1.5, 2.0)) and c.draft == pytest.approx(0.25) and c.name == "m"
    for draft in ('"draft_token": null, ', '"draft_token": 0.0, ', ""):  # as cost_curve.py wrote it without --draft
        bad = tmp_path / "bad.json"
        bad.write_text('{"verify": [0.02, 0.03], ' + draft + '"machine": "m"}')
        with pytest.raises(SpecliError, match="no draft model cost"):
            Costs.from_file(str(bad))


def test_a_cost_curve_must_price_one_token_and_a_longer_block():
    from specli.errors import SpecliError

    for verify in ([0.02], [0.0, 0.03], [0.02, -0.01, 0.04]):
        with pytest.raises(SpecliError, match="verify curve needs positive costs"):
            Costs.measured("m", verify, 0.01)


def test_replay_takes_traces_from_a_folder_only_when_they_are_the_suites_prompts(tmp_path):
    """``research/studies/replay.py --traces DIR`` reads DIR/<suite>.json; traces recorded for an
    earlier version of the suite (other prompts) are recorded anew, not replayed as the suite."""
    from dataclasses import replace
    from types import SimpleNamespace

    from specli.measure.suite import load_suite


    class Recording(Exception):
        pass

    class NoModels:  # recording would start by resolving the models
        def paths(self):
            raise Recording

    ids = [p.id for p in load_suite("grounded").prompts]
    a = SimpleNamespace(traces=str(tmp_path), max_tokens=128)
    save_traces(tmp_path / "grounded.json", [replace(TRACES[0], id=i, max_tokens=None) for i in ids])
    got = study.suite_traces("grounded", NoModels(), a)
    assert [t.id for t in got] == ids and all(t.max_tokens for t in got)
    save_traces(tmp_path / "grounded.json", [replace(TRACES[0], id=i) for i in ids[:-1]])  # a prompt since added
    with pytest.raises(Recording):
        study.suite_traces("grounded", NoModels(), a)


def test_a_copy_checked_by_the_draft_is_cut_where_the_draft_disagrees():
    """research/studies/copy_evidence.py's checked copy: the draft's pass over what its cache lacks
    plus the copy is billed, the copy is cut at the draft's first disagreement and the draft's
    own token drafted there; the evidence tables count each copied token once by what the
    draft made of it."""
    src = list(range(100, 140))
    out = [7] + src[:10] + [300] + src[11:20]  # a copy of the prompt with one edit
    argmax = list(out)
    argmax[5] = 999  # the draft model is wrong once inside the copy, before the edit
    t = Trace("s", "c", [1] + src + [2], out, [], {"model": ModelTrace(argmax, [0.99] * len(out))})
    costs, clock = Costs.linear(0.1, 0.2, 64), Clock()
    checked = copy_evidence.CheckedCopy(t, costs, clock, 16)
    context = t.prompt + out[:3]  # "100, 101" matches the prompt: lookup copies 102, 103, ...
    d = checked.propose(context, 16)
    assert d.tokens == out[3:5] + [999]  # cut where the draft disagrees, its token in place
    assert clock.spent == pytest.approx(costs.draft * costs.block(len(context) + 16))
    clock.spent = 0.0
    d = checked.propose(context + out[3:6], 16)  # two accepted, then the target's 104
    assert d.tokens == out[6:11] + [300]  # the edit: the draft knew it
    assert clock.spent == pytest.approx(costs.draft * costs.block(1 + 16))  # it lacked only the target's token
    trials = copy_evidence.copy_trials(t, 16)
    assert (11, 11, 110, False) in trials and (3, 5, 104, True) in trials
    _, by_draft = copy_evidence.continuation([t], {"c": [0.5] * len(out)}, 16)
    # the copies from positions 3-5 held at 5 though the draft disagreed; the 9 from 3-11 broke at the edit
    assert by_draft["disagrees, sure"] == [12, 3]
    assert by_draft["agrees, sure"][1] == by_draft["agrees, sure"][0]  # the draft never agreed with a wrong copy
    fresh = copy_evidence.speed(TRACES[:2], policies.specli(("lookup",)).make, CPU)
    carried = copy_evidence.speed(TRACES[:2], policies.specli(("lookup",)).make, CPU, carry=True)
    assert carried != fresh  # the second answer starts from what the first taught


def test_a_replay_reports_first_curve_is_read_back_and_a_bad_report_refused(tmp_path):
    from specli.errors import SpecliError

    report = tmp_path / "replay.json"
    report.write_text('[{"costs": "m", "verify": [1.0, 1.5, 2.0], "draft": 0.4, "suites": {}}]')
    c = Costs.from_report(str(report))
    assert c.name == "m" and c.verify == (1.0, 1.5, 2.0) and c.draft == 0.4
    for bad in ("[]", "{}", '[{"costs": "m"}]', "not json"):
        report.write_text(bad)
        with pytest.raises(SpecliError, match="cannot read the replay report"):
            Costs.from_report(str(report))
    with pytest.raises(SpecliError, match="cannot read the replay report"):
        Costs.from_report(str(tmp_path / "missing.json"))


STUDIES = sorted(m.name for m in pkgutil.iter_modules(research.studies.__path__))


@pytest.mark.parametrize("name", STUDIES)
def test_every_study_imports_against_the_package_and_parses_its_options(name, monkeypatch, capsys):
    """The studies live outside the package: a change to specli that breaks one fails here."""
    module = importlib.import_module(f"research.studies.{name}")
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["copy_evidence", "lookup_gap", "calibration_drift"])
def test_a_study_without_traces_says_so_and_writes_nothing(name, tmp_path, monkeypatch):
    report = tmp_path / "replay.json"
    report.write_text('[{"costs": "m", "verify": [1.0, 1.5, 2.0], "draft": 0.4, "suites": {}}]')
    save_traces(tmp_path / "grounded.json", TRACES)  # one suite of the two asked for
    out = tmp_path / "out.md"
    args = ["--traces", str(tmp_path), "--suites", "grounded,rag"]
    args += ["--out", str(out)] if name != "lookup_gap" else []
    args += ["--report", str(report)] if name != "calibration_drift" else []
    monkeypatch.setattr(sys, "argv", [name, *args])
    with pytest.raises(SystemExit, match=f"{name}: no traces for rag in {tmp_path}"):
        importlib.import_module(f"research.studies.{name}").main()
    assert not out.exists()
