"""Lookup remembers earlier answers (``--lookup-history``): the bounded index, its drafts
lossless on the tiny f32 models (greedy and seeded, with measured history use), off at 0,
the stats that count it, bench's ``lookup-history`` mode and a server's history per API key."""

import pytest
from exacthelp import CFG

from specli.engine import Context
from specli.errors import SpecliError
from specli.speculate.adaptive import adaptive_drafter, lookup_drafter
from specli.speculate.drafters import LookupDrafter, NoDrafter
from specli.speculate.history import OFF, Bound, Histories, History, parse_bound
from specli.speculate.loop import generate
from specli.speculate.settings import SpecSettings
from specli.speculate.source import Source, history_key
from specli.speculate.verify import SamplingParams

CHEAP_VERIFY = [1.0 + k / 10 for k in range(17)]  # drafting pays: a block of 17 costs 2.6 tokens
# a repetitive job: one instruction over different short texts; the answers look alike
JOB = [f"Item {i}: the {w} costs {i * 3} euros. Repeat the sentence twice." for i, w in
       enumerate(["apple", "pear", "plum", "fig", "lime"], 1)]
N = 48


# -- the index ---------------------------------------------------------------------------
def test_bound_parses_counts_sizes_and_off():
    assert parse_bound("64") == Bound(answers=64)
    assert parse_bound("500k") == Bound(tokens=500_000) and parse_bound("2M") == Bound(tokens=2_000_000)
    assert parse_bound("50000t") == Bound(tokens=50_000) and parse_bound("256,100k") == Bound(256, 100_000)
    assert parse_bound("0") is OFF and parse_bound("off") is OFF
    for bad in ("-3", "many", "1.5", "2MB", "0k"):
        with pytest.raises(ValueError, match="--lookup-history"):
            parse_bound(bad)


def test_a_match_copies_what_most_earlier_answers_went_on_with():
    h = History(Bound(answers=8))
    h.add([], [1, 2, 3, 4, 5])
    h.add([], [9, 2, 3, 4, 6])
    h.add([], [8, 2, 3, 4, 6])
    # (2, 3, 4) went on with 6 twice, 5 once: the most frequent continuation
    assert h.find([7, 2, 3, 4], 3) == ([6], 3)
    # a match further back decides first: (1, 2, 3, 4) only ever went on with 5
    assert h.find([1, 2, 3, 4], 3) == ([5], 4)
    assert h.find([2, 3], 4) == ([4, 6], 2)
    assert h.find([7, 7], 4) == ([], 0) and h.find([3], 4) == ([], 0)


def test_the_oldest_answers_are_evicted_first_within_the_bound():
    h = History(Bound(answers=3))
    for i in range(10):
        h.add([100 + i], [i, 50, 51, 52, 53])
    assert len(h) == 3 and h.evicted == 7 and h.tokens == 3 * 6
    assert h.find([2, 50], 2) == ([], 0) and h.find([9, 50], 2) == ([51, 52], 2)  # 2's answer is gone, 9's kept
    assert h.find([7, 50, 51], 8) == ([52, 53], 3)
    t = History(Bound(tokens=20))
    for i in range(10):
        t.add([], [i, 1, 2, 3, 4, 5, 6])
    assert t.tokens <= 20 and len(t) == 2
    # the index holds the kept answers' n-grams only: as if the evicted ones were never added
    fresh = History(Bound(tokens=20))
    for i in (8, 9):
        fresh.add([], [i, 1, 2, 3, 4, 5, 6])
    assert len(t.index) == len(fresh.index)


def test_off_keeps_nothing_and_owners_never_share():
    assert Histories(OFF).of(None) is None
    hs = Histories(Bound(answers=4))
    hs.of("a").add([], [1, 2, 3, 4])
    assert hs.of("a").find([1, 2], 2) == ([3, 4], 2)
    assert hs.of("b").find([1, 2], 2) == ([], 0) and hs.of(None).find([1, 2], 2) == ([], 0)


def test_lookup_copies_from_history_only_where_it_matches_longer():
    h = History(Bound(answers=4))
    h.add([], [5, 6, 7, 8, 9, 10])
    d = LookupDrafter(n_max=4)
    d.recall(h)
    # the context has no match: the copy comes from the earlier answer, learned apart
    out = d.propose([1, 2, 6, 7], 3)
    assert out.tokens == [8, 9, 10] and out.source == history_key(2) == Source("history", 2)
    # the context's own match is longer: lookup's own copy
    out = d.propose([1, 6, 7, 8, 3, 6, 7, 8], 3)
    assert out.source.kind == "lookup" and out.tokens == [3, 6, 7]
    d.recall(None)
    assert d.propose([1, 2, 6, 7], 3).tokens == []


# -- lossless on the tiny models -----------------------------------------------------------
def _tokens(resp):
    return [t for ch in resp for t in ch.tokens]


def _job(tm, drafter_for, params, history, ctx):
    """Every prompt of the job in order, each answer joining ``history``: the texts and stats."""
    out = []
    for text in JOB:
        resp = generate(ctx, tm.tokenize(text), drafter_for(), params, max_tokens=N, draft_max=8, history=history)
        out.append((_tokens(resp), resp.stats))
    return out


@pytest.fixture(scope="module")
def ctx(tm):
    c = Context(tm, CFG)
    yield c
    c.close()


def _adaptive():
    s = SpecSettings()
    return adaptive_drafter(s, CHEAP_VERIFY, 0.0, lookup_drafter(s))


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=11)],
                         ids=["greedy", "seeded"])
@pytest.mark.parametrize("drafter", [_adaptive, lambda: LookupDrafter()], ids=["adaptive", "fixed"])
def test_history_drafts_keep_the_plain_text(tm, ctx, params, drafter):
    plain = _job(tm, NoDrafter, params, None, ctx)
    h = History(parse_bound("64"))
    # the job twice over: the second pass finds each answer in history (and the first, the earlier ones)
    spec = _job(tm, drafter, params, h, ctx) + _job(tm, drafter, params, h, ctx)
    assert [t for t, _ in spec] == [t for t, _ in plain] * 2
    assert len(h) == 2 * len(JOB)
    used = sum(st.history for _, st in spec)
    assert used > 0 and used == sum(n for _, st in spec for k, n in st.accepted_by_source.items()
                                    if k.startswith("history"))
    assert all(st.history == 0 for _, st in plain)


def test_history_off_drafts_nothing_from_history(tm, ctx):
    for _ in range(2):
        for _, st in _job(tm, _adaptive, SamplingParams(), None, ctx):
            assert st.history == 0 and not any(k.startswith("history") for k in st.drafted_by_source)


def test_an_interrupted_answer_is_not_kept(tm, ctx):
    h = History(Bound(answers=4))
    resp = generate(ctx, tm.tokenize(JOB[0]), _adaptive(), SamplingParams(), max_tokens=N, history=h)
    next(iter(resp))
    resp.close()
    assert len(h) == 0
    _tokens(generate(ctx, tm.tokenize(JOB[0]), _adaptive(), SamplingParams(), max_tokens=N, history=h))
    assert len(h) == 1


def test_a_wrong_bound_is_a_one_line_error(tiny_target):
    from specli.session import Options, Session
    from specli.speculate.settings import SpecSettings as S
    with pytest.raises((SpecliError, ValueError), match="--lookup-history"):
        Session(Options(target=tiny_target, draft="lookup", spec=S(lookup_history="lots")))


def test_the_stats_summary_counts_history_tokens(tm, ctx):
    h = History(Bound(answers=4))
    first = _job(tm, _adaptive, SamplingParams(), h, ctx)
    again = _job(tm, _adaptive, SamplingParams(), h, ctx)
    st = max((st for _, st in first + again), key=lambda st: st.history)
    assert st.history > 0 and f"{st.history} from history" in st.summary()
    assert st.to_dict()["history"] == st.history


# -- bench, the CLI, serve -----------------------------------------------------------------
def test_bench_lookup_history_copies_from_the_suites_earlier_answers(tiny_target, monkeypatch):
    from clihelp import simulate_costs_here
    from rich.console import Console

    from specli.measure.bench import run_bench
    from specli.measure.report import render_tables
    from specli.measure.suite import Suite, SuitePrompt
    from specli.session import Options, Session

    simulate_costs_here(monkeypatch, "gpu")  # drafting pays
    suite = Suite("job", "", [SuitePrompt(f"p{i}", t) for i, t in enumerate(JOB)])
    sess = Session(Options(target=tiny_target, draft="lookup", f32_kv=True, threads=2), build_drafter=False)
    try:
        rep = run_bench(sess, suite, ["none", "lookup", "lookup-history"], max_tokens=32, chat=False)
        assert len(sess.histories.of(None) or []) == 0  # bench never feeds the session's own history
    finally:
        sess.close()
    modes = rep.to_dict()["modes"]
    assert list(modes) == ["none", "lookup", "lookup-history"]
    assert modes["none"]["history"] == modes["lookup"]["history"] == 0  # lookup runs without history
    assert modes["lookup-history"]["history"] > 0
    assert set(modes["lookup-history"]["lossless"].values()) == {"identical"}
    console = Console(record=True, width=200)
    render_tables([rep], console)
    assert "history" in console.export_text()


def test_a_wrong_bound_on_the_command_line_is_one_line(tiny_target):
    from clihelp import specli
    rc, out, err = specli("run", "--target", tiny_target, "--lookup-history", "lots", "--prompt", "hi")
    assert rc != 0 and out == ""
    assert err.startswith("specli: error: --lookup-history: 'lots'") and err.count("\n") == 1


def test_serve_keeps_a_history_per_api_key(tiny_target):
    import httpx

    from specli.serve.app import create_app
    from specli.serve.runner import background
    from specli.session import Options, Session

    # lookup drafting a fixed length: every step it has a copy, it drafts it
    sess = Session(Options(target=tiny_target, draft="lookup", n_ctx=1024, spec=SpecSettings(adaptive=False)))

    def ask(url, key=None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(url + "/v1/completions", headers=headers, timeout=60,
                       json={"model": "m", "prompt": JOB[0], "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        return body["choices"][0]["text"], body["usage"]["speculative"]["history"]

    try:
        with background(create_app(sess, name="m", api_key=["k1", "k2"])) as url:
            first = ask(url, "k1")
            other = ask(url, "k2")  # k1's answer is not k2's to copy
            again = ask(url, "k1")  # k1 copies its own earlier answer
        with background(create_app(sess, name="m")) as url:  # no keys: one history for every request
            open1, open2 = ask(url), ask(url)
    finally:
        sess.close()
    assert first[0] == other[0] == again[0] == open1[0] == open2[0]
    assert first[1] == other[1] == 0 and again[1] > 0
    assert open1[1] == 0 and open2[1] > 0


def test_the_slots_of_a_batch_share_the_models_history(tiny_target, monkeypatch):
    from batchhelp import run_together
    from clihelp import simulate_costs_here

    from specli.session import Options, Session
    from specli.speculate.batch import Batch

    simulate_costs_here(monkeypatch, "gpu")  # drafting pays
    job = [JOB[0], JOB[2]]
    one = Session(Options(target=tiny_target, draft="none", n_ctx=512, f32_kv=True, threads=2))
    try:
        plain = [_tokens(one.generate(one.target.tokenize(t), SamplingParams(), 32, history=None)) for t in job]
    finally:
        one.close()
    two = Session(Options(target=tiny_target, draft="lookup", n_ctx=512, f32_kv=True, threads=2, parallel=2))
    batch = Batch(two)
    try:
        reqs = [dict(prompt=two.target.tokenize(t), params=SamplingParams(), max_tokens=32) for t in job]
        rounds = [run_together(batch, reqs) for _ in range(2)]
        kept = len(two.histories.of(None))
    finally:
        batch.close()
        two.close()
    for out in rounds:
        assert [[t for ch in r.chunks for t in ch.tokens] for r in out] == plain
    assert kept == 4 and sum(r.stats.history for r in rounds[1]) > 0


def test_the_replay_copies_from_the_answers_replayed_before():
    from research.lab import policies
    from research.lab.replay import Clock, Costs, Trace, replay

    skeleton = [500 + i for i in range(40)]
    traces = [Trace("job", f"t{i}", [1, 2, 3, 10 + i], skeleton[:20] + [900 + i] + skeleton[20:], [0])
              for i in range(4)]
    costs = Costs.linear(0.02, 0.05, 64)
    p = policies.specli(("lookup",))
    h = History(parse_bound("8"))
    runs = []
    for t in traces:
        clock = Clock()
        runs.append(replay(t, p.make(t, costs, clock), costs, p.draft_max, clock, h))
    assert len(h) == 4 and runs[0].accepted == 0 and runs[-1].accepted > 30
    assert policies.speedup(p, traces, costs, history="8") > policies.speedup(p, traces, costs) >= 1.0
