"""`specli run` end to end on tiny models: output, JSON, stats, and one-line errors."""

import json
import os
import re

import pytest
from clihelp import specli

GREEDY = ["--raw", "--max-tokens", "40", "--temp", "0"]


def _json(out):
    return json.loads(out)


def test_draft_model_and_lookup_print_exactly_the_plain_output(tiny_target, tiny_draft):
    prompt = "The quick brown fox jumps over the lazy dog"
    outs = {}
    for draft in ("none", tiny_draft, "lookup"):
        rc, out, err = specli("run", "--target", tiny_target, "--draft", draft, *GREEDY, stdin=prompt)
        assert rc == 0, err
        outs[draft] = out
    assert outs["none"] == outs[tiny_draft] == outs["lookup"]
    assert len(outs["none"].strip()) > 20


def test_json_and_stats(tiny_target, tiny_draft):
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, *GREEDY, "--json", "--stats",
                          "--fixed", "--no-lookup", "--draft-max", "4", "--prompt", "Hello there")
    assert rc == 0, err
    d = _json(out)
    st = d["stats"]
    assert st["mode"] == "model-fixed" and st["generated"] == 40 and st["stop"] == "length"
    assert d["finish_reason"] == "length"
    assert 0 < st["accepted"] <= st["drafted"]
    assert st["acceptance"] == pytest.approx(st["accepted"] / st["drafted"])
    assert st["mean_accepted"] == pytest.approx(st["accepted"] / st["spec_steps"])
    assert st["tokens_per_s"] > 0 and st["t_draft"] > 0 and st["t_verify"] > 0
    assert d["draft"] == tiny_draft and d["text"]
    line = err.strip().splitlines()[-1]
    assert line.startswith("specli: 40 tokens,") and "accepted" in line and "draft" in line and "verify" in line


def test_adaptive_turns_off_a_draft_that_cannot_pay(tmp_path, tiny_target, tiny_draft):
    """A draft measured as slow as 1 s a token can never pay: the controller decodes plainly
    (and never probes it), and the output is still the target's own. A short run calibrates
    into a fresh cache, whose draft cost is then rewritten (as a slow machine would measure
    it), so the test does not depend on this machine's timing."""
    env = dict(os.environ, SPECLI_CACHE=str(tmp_path / "specli"))
    rc, _, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, "--no-lookup", "--raw",
                        "-n", "4", "--prompt", "Hello there", env=env)
    assert rc == 0, err
    path = tmp_path / "specli" / "calibration.json"
    cache = json.loads(path.read_text())
    drafts = [k for k in cache if k.startswith("draft:")]
    assert drafts, cache  # the draft model's cost per token, measured by the run
    path.write_text(json.dumps({**cache, **dict.fromkeys(drafts, 1.0)}))
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, "--no-lookup", "--raw",
                          "-n", "200", "--json", "--prompt", "Hello there", env=env)
    assert rc == 0, err
    res = _json(out)
    st = res["stats"]
    assert st["mode"] == "model" and st["generated"] == 200
    assert st["spec_steps"] == 0 and st["plain_steps"] == st["steps"], st
    rc, plain, _ = specli("run", "--target", tiny_target, "--draft", "none", "--raw", "-n", "200", "--json",
                          "--prompt", "Hello there")
    assert _json(plain)["tokens"] == res["tokens"]


def test_prompt_from_file_and_sampling_is_seeded(tmp_path, tiny_target):
    p = tmp_path / "prompt.txt"
    p.write_text("Once upon a time")
    args = ["run", "--target", tiny_target, "--file", str(p), "--raw", "-n", "20", "--temp", "0.9",
            "--top-p", "0.9", "--top-k", "40", "--seed", "7"]
    a, b = specli(*args), specli(*args)
    assert a[0] == 0 and a[1] == b[1]


@pytest.mark.parametrize("args, stdin, needle", [
    ([], "", "the prompt is empty (nothing on standard input)"),
    ([], "   \n", "the prompt is empty"),
    (["--file", "/nonexistent/prompt.txt"], "", "prompt file not found: /nonexistent/prompt.txt"),
    (["--prompt", "x", "--file", "y"], "", "give the prompt once"),
])
def test_bad_prompt_input(tiny_target, args, stdin, needle):
    rc, out, err = specli("run", "--target", tiny_target, *args, stdin=stdin)
    assert rc != 0 and out == ""
    assert err.strip().startswith(f"specli: error: {needle}")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_terminal_stdin_without_prompt(tiny_target):
    import pty
    import subprocess
    import sys
    master, slave = pty.openpty()
    r = subprocess.run([sys.executable, "-m", "specli", "run", "--target", tiny_target], stdin=slave,
                       capture_output=True, text=True, timeout=60)
    os.close(master)
    os.close(slave)
    assert r.returncode != 0
    assert r.stderr.strip() == ("specli: error: no prompt: pipe text in (specli run < prompt.txt), "
                                "or use --prompt or --file")


def test_bad_model_files(tmp_path, tiny_target):
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(open(tiny_target, "rb").read()[:-4096])
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    cases = [
        (["--target", str(tmp_path / "missing.gguf")], "model file not found"),
        (["--target", str(trunc)], "truncated GGUF file"),
        (["--target", str(junk)], "not a GGUF file"),
        (["--target", tiny_target, "--draft", str(trunc)], "truncated GGUF file"),
        (["--target", "no-such-model"], "unknown model 'no-such-model'"),
    ]
    for args, needle in cases:
        rc, out, err = specli("run", *args, "--prompt", "hi")
        assert rc != 0, args
        lines = err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, (args, err)


def test_tokenizer_mismatch_is_refused_before_loading(tiny_target, tiny_draft_edited):
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft_edited, "--prompt", "hi")
    assert rc != 0 and out == ""
    assert err.strip().startswith("specli: error: draft vocabulary differs from target at token 1234: ")
    assert "'zzspecli'" in err and len(err.strip().splitlines()) == 1


def test_prompt_longer_than_context(tiny_target):
    rc, out, err = specli("run", "--target", tiny_target, "--ctx", "256", "--raw", stdin="word " * 400)
    assert rc != 0
    assert "longer than the context (256 tokens); use a larger --ctx" in err and len(err.strip().splitlines()) == 1


def test_the_context_asked_for_is_the_context_used(tiny_target):
    """llama.cpp rounds a context up to a multiple of 256 tokens; --ctx 8 with a 71-token
    prompt used to run without a word in those 256. The size asked for is the limit, and
    reaching it is said."""
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "none", "--ctx", "8", "--raw",
                          stdin="word " * 70)
    assert rc == 1 and out == ""
    assert err.strip().splitlines() == ["specli: error: the prompt is 71 tokens, longer than the context (8 tokens); "
                                        "use a larger --ctx or a shorter prompt"]
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "lookup", "--ctx", "8", "--raw", "-n", "30",
                          "--json", stdin="Hi")
    assert rc == 0, err
    d = _json(out)
    assert d["finish_reason"] == "context" and d["settings"]["ctx"] == 8
    assert len(d["prompt_tokens"]) + len(d["tokens"]) - 1 == 8  # the last token is sampled, never fed
    assert f"stopped after {len(d['tokens'])} tokens: the context (8 tokens) is full; use a larger --ctx" in err
    # more than the model was trained for: said, with what is used instead
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "none", "--ctx", "100000", "--raw", "-n", "2",
                          "--json", stdin="Hi")
    assert rc == 0 and _json(out)["settings"]["ctx"] == 4096
    assert "--ctx 100000 is more than tiny-test was trained for: using its 4096 tokens" in err


def test_help_has_examples():
    rc, out, _ = specli("run", "--help")
    assert rc == 0 and "Examples" in out and "--draft" in out


GRID_PROMPTS = {"short": "Hello", "about 40 tokens": " ".join(["word"] * 40)}


@pytest.mark.parametrize("ctx", [8, 16, 64, 0])
def test_tiny_contexts_and_long_drafts_end_in_output_or_one_line(tiny_target, ctx):
    """Every --ctx (llama.cpp rounds a tiny one up; specli holds the size asked for) with every
    --draft-max and prompt size ends in text or one `specli: error:` line, never an internal
    error. --ctx 8 used to end in `internal error: ValueError: logits for every token need a
    block no larger than n_batch` (the verify-cost calibration timed blocks longer than a batch)."""
    cases = [(dm, name, text) for dm in (0, 1, 16, 64) for name, text in GRID_PROMPTS.items()]
    cases.append((16, "longer than the context", "word " * 5000))
    for draft_max, name, text in cases:
        rc, out, err = specli("run", "--target", tiny_target, "--draft", "lookup", "--raw", "--ctx", str(ctx),
                              "--draft-max", str(draft_max), "-n", "24", "--prompt", text)
        what = f"--ctx {ctx} --draft-max {draft_max}, {name} prompt: rc {rc}, stderr {err!r}"
        assert "internal error" not in err and "Traceback" not in err, what
        errors = [ln for ln in err.splitlines() if ln.startswith("specli: error:")]
        if rc == 0:
            assert out.strip() and not errors, what
        else:
            assert len(err.strip().splitlines()) == 1 and len(errors) == 1, what
        if name == "longer than the context":
            assert rc != 0 and "longer than the context" in errors[0], what


def test_a_target_too_big_for_host_memory_is_refused_before_loading(tiny_target):
    """SPECLI_RAM stands in for the machine's available memory (MemAvailable): the CPU part of
    the target (here all of it) does not fit, so one line names the sizes and the fix."""
    env = dict(os.environ, SPECLI_RAM="40MiB")
    env.pop("SPECLI_VRAM", None)
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "none", "--raw", "--ctx", "256",
                          "--prompt", "hi", env=env)
    assert rc == 1 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    name = os.path.basename(tiny_target)
    assert re.fullmatch(rf"specli: error: {re.escape(name)} needs [\d.]+ MiB of memory on the CPU at --ctx 256 "
                        r"\(weights [\d.]+ MiB, KV cache [\d.]+ MiB, buffers [\d.]+ MiB\), but only 40\.0 MiB is "
                        r"available \(SPECLI_RAM\); use a smaller --ctx or a smaller quantisation .*", lines[0]), err
    # a GPU budget that takes the whole target leaves only the embeddings on the CPU: it runs
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "none", "--raw", "--ctx", "256", "-n", "4",
                          "--prompt", "hi", env=dict(env, SPECLI_VRAM="1GiB"))
    assert rc == 0 and out.strip(), err
