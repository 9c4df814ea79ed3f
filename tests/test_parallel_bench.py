"""benchmarks/parallel_bench.py's pure parts, no model: where two texts part and whether at a
near-tie (from the single-client answer's top logprobs), the summaries, issue #30's goal on
synthetic measurements, and the report that states it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from specli.measure import lossless

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import parallel_bench as pb  # noqa: E402


def lps(*tokens: tuple[str, list[tuple[str, float]]]) -> list[pb.TokenLp]:
    """The single-client answer's tokens, each with its top alternatives (text, logprob), best first."""
    return [pb.TokenLp(t.encode(), tuple((a.encode(), lp) for a, lp in top)) for t, top in tokens]


# "def add(a, b):" then " return" where the target barely preferred "\n" to " " at token 3
REF = "def add(a, b):\n    return a + b"
REF_LPS = lps(("def", [("def", -0.01), ("class", -5.0)]),
              (" add", [(" add", -0.2), (" sum", -1.9)]),
              ("(a, b):", [("(a, b):", -0.05), ("(x, y):", -3.0)]),
              ("\n", [("\n", -0.60), (" ", -0.95)]),
              ("    return", [("    return", -0.01), ("    pass", -6.0)]),
              (" a + b", [(" a + b", -0.1), (" b + a", -4.0)]))


def test_identical_and_prefix():
    assert pb.verdict(REF, REF_LPS, REF) == lossless.IDENTICAL
    assert pb.text_divergence(REF, REF_LPS, REF[:10]) is None
    v = pb.verdict(REF, REF_LPS, REF[:10])
    assert v == pb.PREFIX and not pb.holds(v)  # every client asked for as many tokens: shorter is not the same


def test_parting_at_a_near_tie_with_the_runner_up():
    other = "def add(a, b): return a + b"
    d = pb.text_divergence(REF, REF_LPS, other)
    assert d.char == len("def add(a, b):") and d.token == 3
    assert d.expected == "\n" and d.runner_up == " " and d.took_runner_up
    assert d.margin == pytest.approx(0.35)
    assert d.near_tie
    v = pb.verdict(REF, REF_LPS, other)
    assert pb.holds(v) and lossless.holds(v)  # the same vocabulary as specli.measure.lossless
    assert "character 14" in v and "margin there 0.350" in v


def test_parting_where_the_target_was_sure_is_not_a_near_tie():
    other = "def sum(a, b):\n    return a + b"  # the runner-up " sum", but 1.7 logits behind
    d = pb.text_divergence(REF, REF_LPS, other)
    assert d.token == 1 and d.char == 4 and d.took_runner_up and d.margin == pytest.approx(1.7)
    assert not d.near_tie and not pb.holds(pb.verdict(REF, REF_LPS, other))


def test_parting_on_a_token_that_is_not_the_runner_up():
    other = "def add(a, b):\n    yield a + b"  # "    yield": neither the choice nor the runner-up
    d = pb.text_divergence(REF, REF_LPS, other)
    assert d.token == 4 and d.char == len("def add(a, b):\n    ") and not d.took_runner_up and d.took is None
    v = pb.verdict(REF, REF_LPS, other)
    assert "NOT a near-tie" in v and "none of the target's top 5" in v and not pb.holds(v)


def test_parting_on_the_third_choice_within_a_near_tie_of_the_answer():
    """The target's three best within half a logit: batched numerics may tip the answer to the
    third (seen: ' lookups' for ' retrieving', the runner-up ' storing' 0.07 behind). Judged by
    the gap to the token taken, as specli.measure.lossless judges; one far down is not a tie."""
    ref_lps = lps(("A hash map", [("A hash map", -0.1), ("The map", -4.0)]),
                  (" retrieving", [(" retrieving", -1.10), (" storing", -1.17), (" lookups", -1.45),
                                   (" deleting", -2.9)]),
                  (" values", [(" values", -0.1), (" keys", -3.0)]))
    ref = "A hash map retrieving values"
    d = pb.text_divergence(ref, ref_lps, "A hash map lookups values")
    assert d.took == " lookups" and not d.took_runner_up and d.gap == pytest.approx(0.35) and d.near_tie
    v = pb.verdict(ref, ref_lps, "A hash map lookups values")
    assert pb.holds(v) and "' lookups', 0.350 behind" in v
    d = pb.text_divergence(ref, ref_lps, "A hash map deleting values")
    assert d.took == " deleting" and d.gap == pytest.approx(1.8) and not d.near_tie


def test_a_run_split_otherwise_parts_at_the_token_before_the_first_differing_character():
    # a table cell: the answer padded with "   " then " |"; the other took the runner-up "  " (0.1
    # behind) and then " |": the texts agree one character past the token where they parted
    ref = "| 4222.6   | 0.39 |"
    ref_lps = lps(("| 4222.6", [("| 4222.6", -0.01), ("| 4222", -5.0)]),
                  ("  ", [("  ", -0.6), (" ", -0.7)]),
                  (" |", [(" |", -0.02), ("|", -6.0)]),
                  (" 0.39 |", [(" 0.39 |", -0.1), (" 0.4 |", -3.0)]))
    other = "| 4222.6  | 0.39 |"
    d = pb.text_divergence(ref, ref_lps, other)
    assert d.char == len("| 4222.6  ") and d.token == 1 and d.runner_up == " " and d.near_tie
    assert pb.holds(pb.verdict(ref, ref_lps, other))
    sure = [ref_lps[0], pb.TokenLp(b"  ", ((b"  ", -0.01), (b" ", -4.0)))] + ref_lps[2:]  # no near-tie before
    d = pb.text_divergence(ref, sure, other)
    assert d.token == 2 and not d.near_tie and not pb.holds(pb.verdict(ref, sure, other))


def test_positions_count_characters_not_bytes():
    ref = "café crème"
    ref_lps = lps(("caf", [("caf", -0.1), ("cof", -3.0)]), ("é", [("é", -0.2), ("e", -0.4)]),
                  (" crème", [(" crème", -0.1), (" cream", -2.0)]))
    d = pb.text_divergence(ref, ref_lps, "cafe crème")
    assert d.char == 3 and d.token == 1 and d.took_runner_up and d.near_tie
    d = pb.text_divergence(ref, ref_lps, "café cream")
    assert d.char == 7 and d.token == 2 and not d.near_tie  # byte 8: "é" is two


def test_parting_past_the_logprobs_is_not_shown_a_near_tie():
    d = pb.text_divergence(REF + " + c", REF_LPS[:2], REF + " - c")
    assert d.token is None and d.char == len(REF) + 1 and not d.near_tie
    assert not pb.holds(d.describe())


def client(prompt: str, text: str, tokens: int, start: float, end: float, ttft: float = 0.5,
           tok_s: float = 10.0) -> dict:
    return {"prompt": prompt, "text": text, "tokens": tokens, "start": start, "end": end, "ttft": ttft,
            "tok_s": tok_s, "prompt_tokens": 30, "cached": 3, "drafted": 4, "accepted": 2}


def test_summarise_aggregates_over_the_waves_wall_time():
    runs = [{"clients": [client("p", "x", 100, 0, 5, ttft=0.2), client("q", "y", 60, 0, 4, ttft=1.0)], "wall": 5.0},
            {"clients": [client("r", "z", 40, 9, 14, tok_s=4.0), {"prompt": "s", "error": "APIError: boom"}],
             "wall": 5.0}]
    s = pb.summarise(runs)
    assert s["tokens"] == 200 and s["agg_tok_s"] == pytest.approx(20.0)
    assert s["ttft_max"] == 1.0 and s["ttft_mean"] == pytest.approx(1.7 / 3)
    assert s["client_tok_s_min"] == 4.0 and s["client_tok_s_median"] == 10.0
    assert s["cached"] == 9 and s["drafted"] == 12 and s["accepted"] == 6 and s["errors"] == ["APIError: boom"]


def summ(rates: dict[int, float]) -> dict[int, dict]:
    return {n: {"agg_tok_s": r, "errors": []} for n, r in rates.items()}


SERIAL = summ({1: 12.0, 2: 12.0, 4: 12.0, 8: 12.0})


def all_identical(modes=pb.SPECLI_MODES) -> dict:
    return {m: {n: [lossless.IDENTICAL] * 8 for n in (1, 2, 4, 8)} for m in modes}


def test_goal_met_and_by_how_much():
    summary = {"serial": SERIAL, "batched-plain": summ({1: 11.0, 2: 16.0, 4: 19.0, 8: 20.0}),
               "batched-spec": summ({2: 19.0, 4: 21.0, 8: 20.5})}
    g = pb.goal(summary, all_identical())
    assert g["measured"] and g["met"] and g["ratio"] == pytest.approx(1.75)
    assert g["vs_plain"][1] == pytest.approx(12 / 11)  # one client: the serial server against plain
    text = "\n".join(pb.goal_lines(g))
    assert "**Met**" in text and "1.75x" in text and "+17% over it" in text


def test_goal_short_of_the_ratio_says_how_far():
    summary = {"serial": SERIAL, "batched-plain": summ({1: 11.0, 4: 14.0}), "batched-spec": summ({4: 15.0})}
    g = pb.goal(summary, all_identical())
    assert g["measured"] and not g["speed_ok"] and g["plain_ok"] and not g["met"]
    text = "\n".join(pb.goal_lines(g))
    assert "**Not met**" in text and "1.25x" in text and "short by 17%" in text


def test_goal_below_batched_plain_at_any_n_is_not_met():
    summary = {"serial": SERIAL, "batched-plain": summ({1: 11.0, 4: 17.0, 8: 24.0}),
               "batched-spec": summ({4: 19.0, 8: 23.0})}
    g = pb.goal(summary, all_identical())
    assert g["speed_ok"] and not g["plain_ok"] and not g["met"]
    assert "below it at 8 clients" in "\n".join(pb.goal_lines(g))


def test_goal_counts_near_ties_and_fails_on_a_real_divergence():
    summary = {"serial": SERIAL, "batched-plain": summ({1: 11.0, 4: 17.0}), "batched-spec": summ({4: 19.0})}
    tie = pb.verdict(REF, REF_LPS, "def add(a, b): return a + b")
    checks = all_identical()
    checks["batched-spec"][4][0] = tie
    g = pb.goal(summary, checks)
    assert g["met"] and g["near_ties"] == 1 and g["identical"] == g["texts"] - 1
    checks["batched-plain"][4][1] = pb.verdict(REF, REF_LPS, "def add(a, b):\n    yield a + b")
    g = pb.goal(summary, checks)
    assert not g["met"] and not g["texts_ok"] and g["not_holding"] == 1
    assert "1 otherwise" in "\n".join(pb.goal_lines(g))
    # llama-server's texts are shown, outside the goal
    checks = {**all_identical(), "llama-server": {4: ["differs ...: NOT a near-tie: likely a bug"]}}
    assert pb.goal(summary, checks)["texts_ok"]


def test_goal_failed_requests_are_not_met():
    summary = {"serial": SERIAL, "batched-plain": summ({4: 17.0}), "batched-spec": summ({4: 19.0})}
    summary["batched-spec"][4]["errors"] = ["APIError: 503"]
    g = pb.goal(summary, all_identical())
    assert g["speed_ok"] and g["plain_ok"] and not g["met"] and "1 failed requests" in "\n".join(pb.goal_lines(g))


def test_goal_without_batched_runs_is_not_measured():
    g = pb.goal({"serial": SERIAL, "batched-plain": summ({1: 11.0})}, all_identical(["serial", "batched-plain"]))
    assert not g["measured"] and not g["met"]
    assert "**Not measured**" in "\n".join(pb.goal_lines(g))


def test_report_states_the_goal_and_the_machine():
    ref = {"p": {"text": REF, "logprobs": [{"bytes": list(t.data), "top": [[list(b), lp] for b, lp in t.top]}
                                            for t in REF_LPS]}}
    tie = "def add(a, b): return a + b"

    def wave(texts, rate_s):
        return {"round": 0, "wave": 0, "clients": [client("p", t, 10, 0, rate_s, ttft=rate_s / 10) for t in texts],
                "wall": rate_s, "load": 1.0}

    runs = {"serial": {1: [wave([REF], 1.0)] * 4, 4: [wave([REF] * 4, 4.0)]},
            "batched-plain": {1: [wave([REF], 1.1)] * 4, 4: [wave([REF] * 4, 2.5)]},
            "batched-spec": {4: [wave([REF, REF, tie, REF], 2.0)]},
            "llama-server": {1: [wave([REF], 1.0)] * 4, 4: [wave([REF] * 3 + ["class X"], 2.2)]}}
    meta = {"command": "python benchmarks/parallel_bench.py", "when": "2026-01-01 00:00 UTC", "seconds": 600.0,
            "machine": {"cpu": "Test CPU", "cores": 2, "memory_mib": 23000, "system": "Linux x86_64",
                        "commit": "abc1234", "llama_cpp_python": "0.3.36"},
            "load": [[1.5, 1.0, 0.5], [2.5, 1.0, 0.5], [1.75, 1.0, 0.5]], "target": "/m/t.gguf",
            "draft": "/m/d.gguf", "threads": 2, "clients": [1, 4], "prompts": ["p"], "max_tokens": 10, "repeat": 1,
            "specli_parallel": True, "notes": [], "servers": {"serial": ["/usr/bin/python", "-m", "specli"]}}
    rep = pb.assemble(meta, runs, ref)
    assert rep["goal"]["met"] and rep["goal"]["ratio"] == pytest.approx(2.0) and rep["goal"]["near_ties"] == 1
    assert rep["checks"]["llama-server"][4][3].endswith("likely a bug")
    md = pb.render(rep)
    assert "**Met**: batched speculative is **2.00x** the serial server with 4 clients" in md
    assert "Test CPU, 2 cores" in md and "load average 1.50 at the start, 1.50–2.50 over the run" in md
    assert "| 4 | 10.00 (1.00x) | 16.00 (1.60x) | 20.00 (2.00x) | 18.18 (1.82x) |" in md
    assert "| batched-spec | = serial | 3 identical of 4, 1 near-tie |" in md
    assert "| llama-server | 4 identical of 4 | 3 identical of 4, **1 not** |" in md
    assert "- batched-spec, 4 clients, p: differs from the single-client text at character 14" in md
    # each of the 4 clients, by mode
    assert "| wave | prompt | serial | batched-plain | batched-spec | llama-server |" in md
    assert "| 0 | p | 0.40 / 10.00 | 0.25 / 10.00 | 0.20 / 10.00 | 0.22 / 10.00 |" in md


def test_clients_and_modes():
    assert pb.parse_clients("8,1,4,2,4") == [1, 2, 4, 8]
    for bad in ("", "0,2", "two"):
        with pytest.raises(argparse.ArgumentTypeError):
            pb.parse_clients(bad)
    assert not pb.runnable("batched-spec", 1, True) and pb.runnable("batched-spec", 4, True)
    assert pb.runnable("batched-plain", 1, False) and not pb.runnable("batched-plain", 2, False)
    assert not pb.runnable("batched-spec", 4, False) and pb.runnable("llama-server", 4, False)
