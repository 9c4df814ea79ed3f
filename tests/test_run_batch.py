"""`specli run --batch FILE` end to end on tiny f32 models: each item's text is the single
`specli run` of its prompt, the output in input order (also with --parallel 2), a job killed
and restarted writes every id exactly once, bad lines are reported by number and skipped (or
stop the job: --strict), standard input, and the progress bar on a terminal only. The
machine's costs are simulated as a GPU's, so the controller drafts on any machine."""

import io
import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from clihelp import simulated_costs, specli
from rich.console import Console

from specli.batchjob.items import read_items
from specli.batchjob.output import InOrder, ResultFile
from specli.batchjob.progress import BatchProgress
from specli.measure.suite import load_suite
from specli.speculate.loop import Stats

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
ITEMS = [
    {"id": "fox", "prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox", "max_tokens": 40},
    {"id": 2, "prompt": "def add(a, b):"},
    {"id": "seeded", "prompt": "List three colours.", "temperature": 0.8, "seed": 7},
    {"id": "chat", "messages": [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Tell me about the number 7."}], "max_tokens": 12},
    {"id": "json", "prompt": "A number as JSON:", "json_schema": SCHEMA},
]
N = "24"


def _jsonl(rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def _lines(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return simulated_costs("gpu", {**os.environ, "SPECLI_CACHE": str(tmp_path_factory.mktemp("specli"))})


@pytest.fixture(scope="module")
def models(tiny_target, tiny_draft):
    return ["--target", tiny_target, "--draft", tiny_draft, "-t", "1"]  # one thread: quick on a busy machine too


@pytest.fixture(scope="module")
def items_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("batch") / "items.jsonl"
    f.write_text(_jsonl(ITEMS))
    return f


@pytest.fixture(scope="module")
def serial(models, env, items_file):
    rc, out, err = specli("run", *models, "-n", N, "--batch", str(items_file), env=env)
    assert rc == 0, err
    return _lines(out), err


def _single(models, env, item, folder) -> dict:
    """The item as a single `specli run --json`."""
    flags = ["-n", str(item.get("max_tokens", N))]
    if "temperature" in item:
        flags += ["--temp", str(item["temperature"]), "--seed", str(item["seed"])]
    if "json_schema" in item:
        schema = folder / "schema.json"
        schema.write_text(json.dumps(item["json_schema"]))
        flags += ["--json-schema", str(schema)]
    if "messages" in item:
        sys_msg, user = item["messages"]
        flags += ["--system", sys_msg["content"], "--prompt", user["content"]]
    else:
        flags += ["--prompt", item["prompt"]]
    rc, out, err = specli("run", *models, *flags, "--json", env=env)
    assert rc == 0, err
    return json.loads(out)


def test_each_item_is_its_single_run_text_greedy_seeded_chat_and_schema(models, env, serial, tmp_path):
    got, err = serial
    assert [r["id"] for r in got] == [it["id"] for it in ITEMS]
    for item, r in zip(ITEMS, got, strict=True):
        one = _single(models, env, item, tmp_path)
        assert r["text"] == one["text"], item["id"]
        assert r["finish_reason"] == one["finish_reason"]
        assert r["prompt_tokens"] == len(one["prompt_tokens"]) and r["completion_tokens"] == len(one["tokens"])
        assert r["total_tokens"] == r["prompt_tokens"] + r["completion_tokens"]
        # the usage.speculative object serve reports
        assert set(r["speculative"]) >= {"mode", "drafted", "accepted", "acceptance", "mean_accepted",
                                         "tokens_per_s"}
    assert sum(r["speculative"]["drafted"] for r in got) > 0  # it speculated
    assert "━" not in err  # standard error is no terminal here: no progress bar


def test_parallel_2_keeps_input_order_and_the_texts(models, env, serial, tmp_path):
    # a long item first, short ones after: they finish before it, and still come out after it
    rows = [{**it, "max_tokens": n} for it, n in zip(ITEMS, [48, 3, 5, 4, 6], strict=True)]
    f = tmp_path / "order.jsonl"
    f.write_text(_jsonl(rows))
    outs = {}
    for par in ("1", "2"):
        rc, out, err = specli("run", *models, "--batch", str(f), "--parallel", par, "--stats", env=env)
        assert rc == 0, err
        outs[par] = _lines(out)
        assert [r["id"] for r in outs[par]] == [it["id"] for it in ITEMS]
    greedy = [i for i, it in enumerate(ITEMS) if "temperature" not in it]
    assert [outs["2"][i]["text"] for i in greedy] == [outs["1"][i]["text"] for i in greedy]
    assert [r["completion_tokens"] for r in outs["2"]] == [r["completion_tokens"] for r in outs["1"]]
    assert all(r["stats"]["generated"] == r["completion_tokens"] for r in outs["2"])  # --stats: the whole stats


def test_in_order_buffers_what_finishes_early():
    class Sink:
        written: list = []

        def write(self, rec):
            self.written.append(rec["id"])

    order = InOrder(Sink())
    assert order.put(2, {"id": "c"}) == [] and order.put(1, {"id": "b"}) == []
    assert [r["id"] for r in order.put(0, {"id": "a"})] == ["a", "b", "c"]
    assert Sink.written == ["a", "b", "c"]


def test_restart_drops_a_torn_line_and_skips_the_ids_written(models, env, items_file, serial, tmp_path):
    out = tmp_path / "results.jsonl"
    # what a killed job leaves: two whole lines (made-up texts: kept, not redone) and a torn one
    out.write_text(_jsonl([{"id": "fox", "text": "kept"}, {"id": 2, "text": "kept too"}]) + '{"id": "seeded", "te')
    rc, _, err = specli("run", *models, "-n", N, "--batch", str(items_file), "--out", str(out), env=env)
    assert rc == 0, err
    assert "dropped a torn last line" in err and "2 of 5 items already in" in err
    got = _lines(out.read_text())
    assert [r["id"] for r in got] == [it["id"] for it in ITEMS]  # each exactly once
    assert [r["text"] for r in got[:2]] == ["kept", "kept too"]
    assert [r["text"] for r in got[2:]] == [r["text"] for r in serial[0][2:]]  # the torn one redone
    # run again: nothing left to do, nothing written twice
    rc, _, err = specli("run", *models, "-n", N, "--batch", str(items_file), "--out", str(out), env=env)
    assert rc == 0 and "5 of 5 items already in" in err
    assert len(_lines(out.read_text())) == len(ITEMS)


def test_a_job_killed_mid_run_and_restarted_writes_each_id_once(models, env, tmp_path):
    rows = [{"id": i, "prompt": f"Item {i}: the quick brown fox jumps over the lazy dog"} for i in range(20)]
    f = tmp_path / "many.jsonl"
    f.write_text(_jsonl(rows))
    out = tmp_path / "killed.jsonl"
    args = [sys.executable, "-m", "specli", "run", *models, "-n", "32", "--batch", str(f), "--out", str(out)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out.exists() and out.stat().st_size > 0):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    first = _lines(out.read_text().rsplit("\n", 1)[0] + "\n")
    assert 0 < len(first) < len(rows)  # killed mid-job
    rc, _, err = specli("run", *models, "-n", "32", "--batch", str(f), "--out", str(out), env=env)
    assert rc == 0, err
    got = _lines(out.read_text())
    assert [r["id"] for r in got] == list(range(20))
    rc, ref, err = specli("run", *models, "-n", "32", "--batch", str(f), env=env)  # one uninterrupted job
    assert rc == 0, err
    assert [r["text"] for r in got] == [r["text"] for r in _lines(ref)]


BAD = [
    {"id": "ok1", "prompt": "Hello there"},
    "not json",
    {"prompt": "no id"},
    {"id": "noprompt"},
    {"id": "ok1", "prompt": "a repeated id"},
    {"id": "t", "prompt": "x", "max_tokens": "5"},
    {"id": "k", "prompt": "x", "temprature": 1},
    {"id": "long", "prompt": "word " * 200},
    {"id": "ok2", "prompt": "General Kenobi"},
]


def test_bad_lines_are_reported_by_number_and_the_others_run(models, env, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(_jsonl(BAD))
    rc, out, err = specli("run", *models, "-n", "8", "--ctx", "128", "--batch", str(f), env=env)
    assert rc == 1, err
    assert [r["id"] for r in _lines(out)] == ["ok1", "ok2"]
    *lines, last = [x for x in err.splitlines() if x.startswith("specli: line ")]
    assert lines == ["specli: line 2: not valid JSON (Expecting value)",
                     "specli: line 3: no 'id'",
                     "specli: line 4: give 'prompt' or 'messages'",
                     "specli: line 5: id \"ok1\" repeats line 1's",
                     "specli: line 6: 'max_tokens' must be an integer, not \"5\"",
                     "specli: line 7: unknown key 'temprature' (allowed: id, prompt, messages, max_tokens, "
                     "temperature, seed, json_schema)"]
    assert re.fullmatch(r"specli: line 8: the prompt is \d+ tokens, longer than the context \(128 tokens\)", last)
    assert "Traceback" not in err


def test_strict_stops_before_anything_runs(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(_jsonl(BAD))
    out = tmp_path / "never.jsonl"
    # no model is even looked for: the target does not exist
    rc, stdout, err = specli("run", "--target", str(tmp_path / "none.gguf"), "--batch", str(f), "--strict",
                             "--out", str(out))
    assert rc == 2 and stdout == "" and not out.exists()
    assert err.splitlines()[0] == "specli: line 2: not valid JSON (Expecting value)"
    assert err.splitlines()[-1] == "specli: error: 6 bad lines in the batch; nothing ran (--strict)"


def test_standard_input(models, env, serial, items_file):
    rc, out, err = specli("run", *models, "-n", N, "--batch", "-", stdin=items_file.read_text(), env=env)
    assert rc == 0, err
    assert [r["text"] for r in _lines(out)] == [r["text"] for r in serial[0]]


@pytest.mark.parametrize("flags, msg", [
    (["--out", "x.jsonl"], "--out, --strict and --parallel go with --batch FILE"),
    (["--parallel", "2"], "--out, --strict and --parallel go with --batch FILE"),
    (["--batch", "-", "--prompt", "hi"], "--batch and --prompt exclude each other"),
    (["--batch", "-", "--json"], "--batch and --json exclude each other"),
    (["--batch", "missing.jsonl"], "batch file not found: missing.jsonl"),
])
def test_flags_that_do_not_go_together(tmp_path, flags, msg):
    rc, out, err = specli("run", "--target", str(tmp_path / "none.gguf"), *flags, stdin="", cwd=tmp_path)
    assert rc == 1 and out == ""
    assert err.strip().startswith(f"specli: error: {msg}") and len(err.strip().splitlines()) == 1


def test_read_items_checks_each_line_alone():
    items, bad = read_items(_jsonl([{"id": 1, "prompt": "a"}, {"id": "1", "prompt": "b"}, "",
                                    {"id": 3, "messages": [{"role": "assistant", "content": "x"}]},
                                    {"id": True, "prompt": "a"}, [1], {"id": 4, "prompt": "a", "seed": 1.5}]))
    assert [it.id for it in items] == [1, "1"]  # 1 and "1" are two ids; the blank line is nothing
    assert [str(b) for b in bad] == [
        "line 4: messages: 'messages' must end with a user message (the last is 'assistant')",
        "line 5: 'id' must be a string or an integer, not true",
        "line 6: a line is a JSON object with 'id' and 'prompt', not list",
        "line 7: 'seed' must be an integer, not 1.5"]


def test_result_file_refuses_a_file_that_is_not_results(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("my notes\n")
    with pytest.raises(Exception, match="line 1 is not a result of specli run --batch"):
        ResultFile(str(f))


def test_progress_on_a_terminal_only():
    def show(terminal: bool) -> str:
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=terminal, width=100)
        with BatchProgress(3, console) as p:
            for _ in range(3):
                p.done(Stats(generated=10, drafted=8, accepted=6))
        return buf.getvalue()

    shown = show(True)
    assert "3/3" in shown and "tok/s" in shown and "acceptance 75%" in shown
    assert show(False) == ""


def _read_all(fd: int, into: list) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other end closed
            return
        if not chunk:
            return
        into.append(chunk)


def test_progress_bar_when_stderr_is_a_terminal(models, env, items_file):
    master, slave = pty.openpty()
    seen: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(master, seen), daemon=True)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "specli", "run", *models, "-n", "8", "--batch",
                                 str(items_file)], stdout=subprocess.PIPE, stderr=slave, env={**env, "TERM": "xterm"})
        os.close(slave)
        reader.start()  # read as it writes: a full terminal buffer would block it
        out, _ = proc.communicate(timeout=300)
        reader.join(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert len(_lines(out.decode())) == len(ITEMS)
    text = b"".join(seen).decode("utf-8", "replace")
    assert f"{len(ITEMS)}/{len(ITEMS)}" in text and "tok/s" in text


def test_bench_takes_a_batch_file_as_its_suite(models, env, items_file, tmp_path):
    suite = load_suite(str(items_file))
    assert [p.id for p in suite.prompts] == ["fox", "2", "seeded", "chat", "json"]
    assert suite.prompts[2].seed == 7 and json.loads(suite.prompts[4].json_schema) == SCHEMA
    greedy = tmp_path / "greedy.jsonl"
    greedy.write_text(_jsonl([it for it in ITEMS if "temperature" not in it]))
    rc, out, err = specli("bench", *models, "--suite", str(greedy), "--modes", "none,lookup", "-n", "12", "--json",
                          env=env)
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["suite"] == "greedy"
    assert rep["modes"]["lookup"]["lossless"] == {"fox": "identical", "2": "identical", "chat": "identical",
                                                  "json": "identical"}
