"""`specli serve` end to end: the official openai client against a real server (uvicorn on
a loopback port, in this process so tests can hold a generation at a hook), on the tiny
models; the CLI in a subprocess for binding, API-key and signal behaviour."""

import json
import os
import re
import signal
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from clihelp import specli
from nearties import assert_same_or_near_tie, tokens_of_text
from servehelp import health, hooked_worker

from specli.serve.app import create_app
from specli.serve.runner import background, is_loopback
from specli.serve.worker import StopScanner
from specli.session import Options, Session

CTX = 1024
PROMPT = "Write a short story about a lighthouse keeper."


@pytest.fixture(scope="module")
def session(tiny_target, tiny_draft):
    sess = Session(Options(target=tiny_target, draft=tiny_draft, n_ctx=CTX))
    yield sess
    sess.close()


def run_json(tiny_target, tiny_draft, *args) -> dict:
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, "--ctx", str(CTX), "--temp", "0",
                          "--json", *args)
    assert rc == 0, err
    return json.loads(out)


def chat(client, model_id, text=PROMPT, **kw):
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": text}], **kw)


def test_chat_greedy_is_specli_run_streamed_or_not(client, model_id, tiny_target, tiny_draft):
    ref = run_json(tiny_target, tiny_draft, "-n", "40", "--prompt", PROMPT)
    assert len(ref["text"]) > 20
    r = chat(client, model_id, temperature=0, max_tokens=40)
    assert r.choices[0].message.content == ref["text"]
    assert r.choices[0].finish_reason == "length" and ref["finish_reason"] == "length"
    assert r.usage.completion_tokens == ref["stats"]["generated"] == 40
    assert r.usage.prompt_tokens == len(ref["prompt_tokens"])
    spec = r.usage.model_extra["speculative"]
    assert spec["mode"] == ref["stats"]["mode"] and {"drafted", "accepted", "acceptance"} <= set(spec)
    assert 0 <= spec["accepted"] <= spec["drafted"]

    chunks = list(chat(client, model_id, temperature=0, max_tokens=40, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 40
    # a cached prompt is reused in whole batches only (so a repeated prompt is evaluated in the
    # blocks a fresh run uses): this one is shorter than a batch
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    long_text = "word " * 560  # > 512 tokens
    first = chat(client, model_id, text=long_text, temperature=0, max_tokens=4)
    again = chat(client, model_id, text=long_text, temperature=0, max_tokens=4)
    assert first.usage.prompt_tokens > 512 and again.usage.prompt_tokens_details.cached_tokens == 512
    assert again.choices[0].message.content == first.choices[0].message.content


def test_stream_usage_chunk_on_request(client, model_id):
    chunks = list(chat(client, model_id, temperature=0, max_tokens=8, stream=True,
                       stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_raw_prompt_is_specli_run_raw(client, model_id, tiny_target, tiny_draft):
    ref = run_json(tiny_target, tiny_draft, "--raw", "-n", "30", "--prompt", "The quick brown fox")
    r = client.completions.create(model=model_id, prompt="The quick brown fox", temperature=0, max_tokens=30)
    assert r.choices[0].text == ref["text"] and r.usage.completion_tokens == 30
    streamed = client.completions.create(model=model_id, prompt="The quick brown fox", temperature=0,
                                         max_tokens=30, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == ref["text"]


def test_models_and_health(client, model_id, served):
    assert [m.id for m in client.models.list().data] == [model_id]
    h = health(served)
    assert h["status"] == "ok" and h["model"] == model_id and h["limit"] == 8


def test_stop_sequences_cut_the_text(client, model_id):
    full = chat(client, model_id, temperature=0, max_tokens=40).choices[0].message.content
    stop = full[15:18]
    want = full[:full.find(stop)]
    r = chat(client, model_id, temperature=0, max_tokens=40, stop=[stop, "never-appears-xyz"])
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    chunks = list(chat(client, model_id, temperature=0, max_tokens=40, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_scanner_holds_back_a_possible_stop():
    s = StopScanner(["END", "xy"])
    assert s.feed("abc E") == ("abc ", False)  # "E" may start "END"
    assert s.feed("N") == ("", False)
    assert s.feed("Dzz") == ("", True)  # cut before "END"
    s = StopScanner(["END"])
    assert s.feed("aE") == ("a", False) and s.feed("x") == ("Ex", False) and s.flush() == ""
    assert StopScanner([]).feed("END") == ("END", False)


def test_eight_concurrent_clients_all_answered_in_arrival_order(client, model_id, worker):
    prompts = [f"Tell me about the number {i}." for i in range(8)]
    want = {p: chat(client, model_id, p, temperature=0, max_tokens=12).choices[0].message.content for p in prompts}
    started: list[int] = []
    worker.before_job = lambda job: started.append(job.seq)
    got: dict[str, str] = {}

    def ask(p):
        got[p] = chat(client, model_id, p, temperature=0, max_tokens=12).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want  # every client answered, each with its own prompt's text
    assert len(started) == 8 and started == sorted(started)  # served in the order they arrived


def test_disconnect_mid_stream_cancels_the_generation(served, client, model_id, worker):
    before = health(served)
    # hold the generation after its first chunk until the server has seen the client leave
    worker.after_chunk = lambda job, n: job.cancel_requested.wait(60) if n == 1 else None
    body = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
            "max_tokens": 200, "stream": True}
    with httpx.stream("POST", served[0] + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        first = next(r.iter_lines())
        assert first.startswith("data: ")
    # the connection is closed; the next request is served after the cancelled one
    worker.after_chunk = None
    assert chat(client, model_id, temperature=0, max_tokens=5).usage.completion_tokens == 5
    after = health(served)
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["served"] == before["served"] + 1 and after["active"] == 0


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served, client, model_id):
    url = served[0] + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    ok = {"model": model_id, "messages": msgs}
    assert "JSON" in _error(httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}),
                            400)["message"]
    assert _error(httpx.post(url, json={**ok, "max_tokens": "10"}), 400)["param"] == "max_tokens"
    assert _error(httpx.post(url, json={**ok, "messages": "hi"}), 400)["param"] == "messages"
    assert _error(httpx.post(url, json={**ok, "temperature": -1}), 400)["param"] == "temperature"
    assert _error(httpx.post(url, json={**ok, "max_tokens": 0}), 400)["param"] == "max_tokens"
    assert _error(httpx.post(url, json={**ok, "n": 2}), 400)["param"] == "n"
    assert _error(httpx.post(url, json={**ok, "messages": []}), 400)["param"] == "messages"
    assert _error(httpx.post(url, json={"messages": msgs}), 400)["param"] == "model"
    assert _error(httpx.post(url, json={**ok, "stop": [""]}), 400)["param"] == "stop"
    err = _error(httpx.post(url, json={**ok, "model": "no-such-model"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    long = {**ok, "messages": [{"role": "user", "content": "word " * (CTX + 10)}]}
    assert _error(httpx.post(url, json=long), 400)["code"] == "context_length_exceeded"
    long_raw = {"model": model_id, "prompt": "word " * (CTX + 10)}
    assert _error(httpx.post(served[0] + "/v1/completions", json=long_raw), 400)["param"] == "prompt"
    _error(httpx.get(served[0] + "/v1/nothing-here"), 404)
    with pytest.raises(openai.BadRequestError):
        chat(client, model_id, temperature=-1)
    assert chat(client, model_id, temperature=0, max_tokens=3).usage.completion_tokens == 3


def test_full_queue_answers_503_with_retry_after(served, client, model_id, worker):
    gate = threading.Event()
    worker.limit = 1
    worker.before_job = lambda job: gate.wait(60)
    rejected = health(served)["rejected"]
    try:
        # a stream's create() returns once the request is admitted: A generates (held), B waits
        a = chat(client, model_id, temperature=0, max_tokens=4, stream=True)
        b = chat(client, model_id, temperature=0, max_tokens=4, stream=True)
        r = httpx.post(served[0] + "/v1/chat/completions", json={
            "model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert _error(r, 503)["code"] == "queue_full" and int(r.headers["retry-after"]) >= 1
        with pytest.raises(openai.APIStatusError) as e:
            chat(client, model_id, max_tokens=4)
        assert e.value.status_code == 503
    finally:
        gate.set()
    for s in (a, b):
        assert [c.choices[0].finish_reason for c in s if c.choices and c.choices[0].finish_reason] == ["length"]
    assert health(served)["rejected"] == rejected + 2


def test_api_key_required_when_set(session, served):
    with background(create_app(session, api_key="s3cret")) as url:
        no_key = httpx.post(url + "/v1/chat/completions", json={"model": "x", "messages": []})
        assert _error(no_key, 401)["code"] == "invalid_api_key"
        _error(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        mid = good.models.list().data[0].id
        assert chat(good, mid, temperature=0, max_tokens=3).usage.completion_tokens == 3


def test_shutdown_stops_a_running_generation(session):
    worker = hooked_worker(session)
    app = create_app(session, worker=worker)
    worker.after_chunk = lambda job, n: job.cancel_requested.wait(60)  # held until something cancels it
    with background(app) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        stream = chat(c, app.state.model_ids[0], temperature=0, max_tokens=200, stream=True)
    # leaving the block shut the server down: the generation was stopped, the stream told why
    with pytest.raises(openai.APIError, match="shutting down"):
        list(stream)
    assert worker.status()["cancelled"] == 1 and worker.status()["served"] == 0


def test_loopback_addresses():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.10", "example.com"]))


def test_non_loopback_bind_needs_an_api_key(tiny_target):
    env = {k: v for k, v in os.environ.items() if k != "SPECLI_API_KEY"}
    rc, _, err = specli("serve", "--target", tiny_target, "--host", "0.0.0.0", env=env)
    assert rc != 0 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specli: error: refusing to listen on 0.0.0.0")
    assert "--api-key" in lines[0] and "SPECLI_API_KEY" in lines[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_the_server_cleanly(tiny_target, sig):
    p = subprocess.Popen([sys.executable, "-m", "specli", "serve", "--target", tiny_target, "--draft", "none",
                          "--port", "0", "--ctx", str(CTX)], stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in p.stderr:  # the server says where it listens once it does
            lines.append(line)
            m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            if m:
                break
        assert m, "".join(lines)
        assert httpx.get(m.group(1) + "/health").json()["status"] == "ok"
        p.send_signal(sig)
        rest = p.stderr.read()
        assert p.wait(60) in (0, 130)
    finally:
        if p.poll() is None:
            p.kill()
    assert "Traceback" not in rest and "stopped" in rest, rest


@pytest.mark.real
def test_real_pair_through_the_openai_client_is_specli_run(real_model):
    target = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    draft = real_model("qwen2.5-coder-0.5b-instruct-q4_k_m")
    prompt = "Write a Python function that reverses a string."
    rc, out, err = specli("run", "--target", target, "--draft", draft, "--temp", "0", "-n", "48", "--json",
                          "--prompt", prompt)
    assert rc == 0, err
    ref = json.loads(out)
    sess = Session(Options(target=target, draft=draft))
    try:
        with background(create_app(sess)) as url:
            c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
            mid = c.models.list().data[0].id
            r = chat(c, mid, prompt, temperature=0, max_tokens=48)
            streamed = chat(c, mid, prompt, temperature=0, max_tokens=48, stream=True)
            streamed = "".join(ch.choices[0].delta.content or "" for ch in streamed)
            assert r.usage.model_extra["speculative"]["mode"] == ref["stats"]["mode"]
        # the adaptive drafter picks its draft lengths from this machine's timings, so the batch
        # shapes (and with them a near-tie) can move between the run and the server
        for label, text in (("chat", r.choices[0].message.content), ("streamed", streamed)):
            other = tokens_of_text(sess.target, ref["tokens"], text)
            assert_same_or_near_tie(sess.ctx, ref["prompt_tokens"], ref["tokens"], other, label)
    finally:
        sess.close()
