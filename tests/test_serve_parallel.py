"""`specli serve --parallel N`: several clients at once, in one batch. The official openai and
ollama clients against a real server on the tiny f32 pair (in this process, so tests can hold
requests at the worker's hooks): every text is its single-client text, the requests shared
their decodes, a client that leaves frees its slot at once, and a full queue still answers 503."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import ollama
import pytest
from pydantic import BaseModel, Field
from servehelp import health

from specli.session import Options, Session

CTX = 1024
PROMPTS = ["Write a short story about a lighthouse keeper.", "List three colours.",
           "def add(a, b):", "Tell me about the number 7."]
MAX_TOKENS = [40, 24, 31, 18]


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def session(tiny_target, tiny_draft):
    sess = Session(Options(target=tiny_target, draft=tiny_draft, n_ctx=CTX, f32_kv=True, parallel=4))
    yield sess
    sess.close()


def together(worker, calls) -> list:
    """Run ``calls`` on threads, admitted into the batch together (the worker holds admission
    until all of them wait); their results in order."""
    worker.hold()
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        deadline = time.monotonic() + 60
        while worker.status()["waiting"] < len(calls) and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting for the requests to arrive, not for generation
        worker.release()
        return [f.result() for f in futures]


def test_four_openai_clients_in_one_batch_each_get_their_single_client_text(served, client, model_id, worker):
    def ask(i):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPTS[i]}],
                                           temperature=0, max_tokens=MAX_TOKENS[i])
        return r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason

    want = [ask(i) for i in range(4)]  # one client at a time
    before = health(served)["batch"]
    got = together(worker, [lambda i=i: ask(i) for i in range(4)])
    assert got == want
    after = health(served)
    batch = after["batch"]
    assert after["parallel"] == 4 and batch["max_sequences"] == 4
    generated = sum(n for _, n, _ in got)
    # they shared their passes: fewer decodes than tokens generated, several holding 2+ requests
    assert batch["decodes"] - before["decodes"] < generated
    assert batch["shared_decodes"] - before["shared_decodes"] > 0


def test_structured_output_logprobs_and_ollama_in_the_same_batch(served, client, model_id, worker):
    ask = [{"role": "user", "content": "Invent a person."}]

    def parsed():
        r = client.chat.completions.parse(model=model_id, messages=ask, response_format=Person, temperature=0,
                                          max_tokens=80)
        return r.choices[0].message.parsed, r.choices[0].finish_reason

    def logprobs():
        r = client.chat.completions.create(model=model_id, messages=ask, temperature=0, max_tokens=12,
                                           logprobs=True, top_logprobs=3)
        return [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in r.choices[0].logprobs.content]

    def olla():
        r = ollama.Client(host=served[0], timeout=120).chat(model=model_id, messages=ask,
                                                             options={"temperature": 0, "num_predict": 20})
        return r.message.content, r.done_reason

    def plain():
        r = client.chat.completions.create(model=model_id, messages=ask, temperature=0, max_tokens=30)
        return r.choices[0].message.content

    calls = [parsed, logprobs, olla, plain]
    want = [c() for c in calls]
    assert isinstance(want[0][0], Person) and want[0][1] == "stop" and len(want[1]) == 12
    got = together(worker, calls)
    assert got[0] == want[0] and got[2:] == want[2:]
    # the same tokens and alternatives; the values to f32 precision (batched with the others, a
    # logit moves in its last bits: a 4-place rounding could fall either side of a boundary)
    assert [(t, top) for t, _, top in got[1]] == [(t, top) for t, _, top in want[1]]
    assert np.allclose([lp for _, lp, _ in got[1]], [lp for _, lp, _ in want[1]], atol=1e-4)


def test_a_client_that_leaves_frees_its_slot_for_the_next_request_at_once(served, client, model_id, worker):
    """Three requests held after their first chunk, a fourth whose client leaves: a fifth
    request is answered while the three are still held (were the slot not freed, it would
    wait for them, and they wait for it)."""
    before = health(served)
    held = threading.Event()
    waiting = 200  # the held requests' max_tokens
    leaving = 201

    def hook(job, n):
        if n == 1 and job.max_tokens == waiting:
            held.wait(60)
        elif n == 1 and job.max_tokens == leaving:
            job.cancel_requested.wait(60)  # until the server has seen its client leave

    worker.after_chunk = hook
    streams = [client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": p}],
                                              temperature=0, max_tokens=waiting, stream=True) for p in PROMPTS[:3]]
    try:
        body = {"model": model_id, "messages": [{"role": "user", "content": PROMPTS[3]}], "temperature": 0,
                "max_tokens": leaving, "stream": True}
        with httpx.stream("POST", served[0] + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200 and next(r.iter_lines()).startswith("data: ")
        fifth = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi."}],
                                               temperature=0, max_tokens=5)
        assert fifth.usage.completion_tokens == 5
        now = health(served)
        assert now["active"] == 3 and not held.is_set()  # the three were still held meanwhile
        assert now["cancelled"] == before["cancelled"] + 1
    finally:
        held.set()
    for s in streams:
        assert [c.choices[0].finish_reason for c in s if c.choices and c.choices[0].finish_reason] == ["length"]


def test_beyond_the_slots_and_the_queue_503_with_retry_after(served, client, model_id, worker):
    gate = threading.Event()
    worker.limit = 1
    worker.before_job = lambda job: gate.wait(60)  # admitted, held before generating (the batch goes on)
    rejected = health(served)["rejected"]
    try:
        # four fill the slots, one waits in the queue
        streams = [client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": p}],
                                                  temperature=0, max_tokens=4, stream=True)
                   for p in PROMPTS + ["one more"]]
        r = httpx.post(served[0] + "/v1/chat/completions", json={
            "model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        assert int(r.headers["retry-after"]) >= 1
        st = health(served)
        assert st["active"] == 4 and st["waiting"] == 1
    finally:
        gate.set()
    for s in streams:
        assert [c.choices[0].finish_reason for c in s if c.choices and c.choices[0].finish_reason] == ["length"]
    assert health(served)["rejected"] == rejected + 1


def test_a_client_that_leaves_during_its_prompt_frees_its_slot_before_the_prompt_is_in(served, model_id, worker):
    """A prompt of several chunks whose client leaves after the first: the rest is never
    decoded, the slot is free at once (its first chunk stays cached), the job counts as cancelled."""
    before = health(served)
    first = threading.Event()
    seen, slots = [], []

    def hook(job, n):
        seen.append(n)
        slots.append(worker.current_slot())  # the hook runs on the job's own thread
        first.set()
        job.cancel_requested.wait(60)  # until the server has seen its client leave

    worker.prompt_chunk = hook
    prompt = "Count the words: " + "lighthouse keeper " * 150
    body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": 8, "stream": True}).encode()
    host, port = served[0].removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            assert first.wait(60), sock.recv(4096)
        deadline = time.monotonic() + 60
        while health(served)["cancelled"] == before["cancelled"] and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting for the server to see the client leave, not for generation
    finally:
        worker.prompt_chunk = None
    now = health(served)
    assert seen == [1]  # stopped before its second chunk
    assert now["cancelled"] == before["cancelled"] + 1 and now["failed"] == before["failed"]
    assert now["active"] == 0 and not slots[0].busy
    assert len(slots[0].ctx.tokens) == slots[0].ctx.n_batch  # its first chunk, cached; no more


def test_api_show_names_the_drafter_the_slots_use(served, session, model_id, worker):
    """With --parallel the session builds no drafter of its own (each slot builds its own):
    /api/show and the start-up line name the slots', not "none"."""
    assert worker.drafter == session.draft.mode.name != "none"
    show = httpx.post(served[0] + "/api/show", json={"model": model_id}).json()
    assert f"# served by specli (drafter: {worker.drafter})" in show["modelfile"]
    assert served[1].state.served.drafter == worker.drafter
