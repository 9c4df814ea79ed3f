"""Ollama's API on `specli serve`, end to end with the official `ollama` client against a real
server (uvicorn on a loopback port, in this process), on the tiny models; the real pair
through `specli serve --profile default` at the end."""

import hashlib
import json
import re
import subprocess
import sys
from typing import Literal

import httpx
import ollama
import pytest
from clihelp import specli
from pydantic import BaseModel, Field
from servehelp import hooked_worker

from specli.serve.app import create_app
from specli.serve.ollama_card import parameter_size
from specli.serve.runner import background
from specli.serve.toolstream import CallStream
from specli.session import Options, Session
from specli.toolcalls import FORMATS

CTX = 1024
PROMPT = "Write a short story about a lighthouse keeper."
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def session(tiny_target, tiny_draft):
    # the adaptive controller (its draft lengths follow this machine's timings): a seed gives one
    # text whatever they are (the sampling noise belongs to the position, specli.speculate.verify)
    sess = Session(Options(target=tiny_target, draft=tiny_draft, n_ctx=CTX))
    yield sess
    sess.close()


@pytest.fixture(scope="module")
def served(session):
    app = create_app(session)
    with background(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(served):
    return ollama.Client(host=served[0], timeout=300)


@pytest.fixture(scope="module")
def name(client):
    return client.list().models[0].model


def run_json(tiny_target, tiny_draft, *args) -> dict:
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, "--ctx", str(CTX), "--temp", "0",
                          "--json", *args)
    assert rc == 0, err
    return json.loads(out)


def chat(client, name, text=PROMPT, **kw):
    return client.chat(model=name, messages=[{"role": "user", "content": text}], **kw)


def streamed(parts) -> tuple[str, list]:
    """The text of a streamed answer and its objects; only the last says done."""
    parts = list(parts)
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    text = "".join((p.message.content if hasattr(p, "message") else p.response) or "" for p in parts)
    return text, parts


def error(r: httpx.Response, status: int) -> str:
    """Ollama's error shape: {"error": "one line"}."""
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str) and "\n" not in body["error"]
    return body["error"]


def test_list_show_ps_version_and_the_root(client, served, session, name):
    models = client.list().models
    assert len(models) == 1 and name == served[1].state.model_ids[0] + ":latest"
    m = models[0]
    with open(session.target.path, "rb") as f:
        assert m.digest == hashlib.file_digest(f, "sha256").hexdigest()
    assert m.size == len(open(session.target.path, "rb").read())
    d = m.details
    assert (d.format, d.family, d.families, d.quantization_level) == ("gguf", "llama", ["llama"], "F32")
    assert d.parameter_size == parameter_size(session.target.header.n_params)

    shown = client.show(name)
    assert shown.details == d and "completion" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["tokenizer.ggml.tokens"] == []  # the vocabulary only when verbose
    assert shown.template == session.target.chat_template()
    verbose = httpx.post(served[0] + "/api/show", json={"model": name, "verbose": True}).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == session.target.n_vocab

    (running,) = client.ps().models
    assert running.model == name and running.context_length == CTX and running.size_vram == 0
    assert running.digest == m.digest and running.expires_at is not None

    assert re.fullmatch(r"\d+\.\d+\.\d+", httpx.get(served[0] + "/api/version").json()["version"])
    for r in (httpx.get(served[0] + "/"), httpx.head(served[0] + "/")):
        assert r.status_code == 200
    assert httpx.get(served[0] + "/").text == "Ollama is running"


def test_parameter_size_is_written_as_ollama_writes_it():
    assert [parameter_size(n) for n in (1_543_714_304, 494_032_768, 7_000_000_000, 6_370_000, 999)] == \
        ["1.5B", "494.03M", "7B", "6.37M", "999"]


def test_chat_greedy_is_specli_run_streamed_or_not(client, name, tiny_target, tiny_draft):
    ref = run_json(tiny_target, tiny_draft, "-n", "40", "--prompt", PROMPT)
    assert len(ref["text"]) > 20
    r = chat(client, name, options={**GREEDY, "num_predict": 40})
    assert r.message.role == "assistant" and r.message.content == ref["text"]
    assert r.done and r.done_reason == "length" and ref["finish_reason"] == "length"
    assert r.eval_count == ref["stats"]["generated"] == 40
    assert r.prompt_eval_count == len(ref["prompt_tokens"])
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0 and r.load_duration == 0
    assert r.model == name

    text, parts = streamed(chat(client, name, options={**GREEDY, "num_predict": 40}, stream=True))
    assert text == ref["text"] and len(parts) > 2
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 40
    assert all(p.message.role == "assistant" for p in parts)


def test_generate_applies_the_template_unless_raw(client, name, tiny_target, tiny_draft):
    templated = chat(client, name, options={**GREEDY, "num_predict": 24}).message.content
    r = client.generate(model=name, prompt=PROMPT, options={**GREEDY, "num_predict": 24})
    assert r.response == templated and r.done_reason == "length" and r.eval_count == 24

    ref = run_json(tiny_target, tiny_draft, "--raw", "-n", "30", "--prompt", "The quick brown fox")
    r = client.generate(model=name, prompt="The quick brown fox", raw=True, options={**GREEDY, "num_predict": 30})
    assert r.response == ref["text"] and r.prompt_eval_count == len(ref["prompt_tokens"])
    text, parts = streamed(client.generate(model=name, prompt="The quick brown fox", raw=True, stream=True,
                                           options={**GREEDY, "num_predict": 30}))
    assert text == ref["text"] and parts[-1].response == ""

    ref = run_json(tiny_target, tiny_draft, "-n", "20", "--system", "You are terse.", "--prompt", PROMPT)
    r = client.generate(model=name, prompt=PROMPT, system="You are terse.", options={**GREEDY, "num_predict": 20})
    assert r.response == ref["text"]


def test_streaming_is_the_default_and_ndjson(served, name):
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "options": {**GREEDY, "num_predict": 6}}
    with httpx.stream("POST", served[0] + "/api/chat", json=body) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) > 1 and lines[-1]["done"] is True and lines[-1]["eval_count"] == 6
    whole = httpx.post(served[0] + "/api/chat", json={**body, "stream": False}).json()
    assert whole["message"]["content"] == "".join(x["message"]["content"] for x in lines)
    # curl -d sends a form content type; Ollama reads the body as JSON all the same
    gen = {"model": name, "prompt": "hi", "stream": False, "options": {**GREEDY, "num_predict": 6}}
    form = httpx.post(served[0] + "/api/generate", content=json.dumps(gen),
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 200 and form.json()["eval_count"] == 6


def test_model_names_with_or_without_latest(client, served, name):
    base = served[1].state.model_ids[0]
    for n in (base, base + ":latest", name):
        assert chat(client, n, options={**GREEDY, "num_predict": 2}).eval_count == 2
    with pytest.raises(ollama.ResponseError) as e:
        chat(client, base + ":7b")
    assert e.value.status_code == 404 and "not found" in e.value.error
    assert "not found" in error(httpx.post(served[0] + "/api/show", json={"model": "nope"}), 404)


def test_an_empty_request_loads_the_model(client, name):
    r = client.chat(model=name, messages=[])
    assert r.done and r.done_reason == "load" and r.message.content == ""
    r = client.generate(model=name)
    assert r.done and r.done_reason == "load" and r.response == ""


def test_options_num_predict_seed_and_stop(client, name):
    for n in (1, 7):
        assert chat(client, name, options={**GREEDY, "num_predict": n}).eval_count == n

    def sample(seed):
        return chat(client, name, options={"temperature": 0.9, "seed": seed, "num_predict": 24}).message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1  # the seed is used, not ignored

    full = chat(client, name, options={**GREEDY, "num_predict": 40}).message.content
    stop = full[15:18]
    want = full[:full.find(stop)]
    r = chat(client, name, options={**GREEDY, "num_predict": 40, "stop": [stop, "never-appears-xyz"]})
    assert r.message.content == want and r.done_reason == "stop"
    text, parts = streamed(chat(client, name, stream=True, options={**GREEDY, "num_predict": 40, "stop": [stop]}))
    assert text == want and parts[-1].done_reason == "stop"


def test_num_ctx_is_honoured_or_refused(client, name):
    r = chat(client, name, options={**GREEDY, "num_ctx": CTX, "num_predict": 5})
    assert r.eval_count == 5
    n_prompt = r.prompt_eval_count
    small = chat(client, name, options={**GREEDY, "num_ctx": n_prompt + 3, "num_predict": 50})
    assert small.eval_count == 3 and small.done_reason == "length"
    for bad, why in ((CTX + 1, "--ctx"), (n_prompt, "longer than the context")):
        with pytest.raises(ollama.ResponseError) as e:
            chat(client, name, options={"num_ctx": bad})
        assert e.value.status_code == 400 and "num_ctx" in e.value.error and why in e.value.error


def test_accepted_without_effect(client, name):
    want = chat(client, name, options={**GREEDY, "num_predict": 12}).message.content
    same = chat(client, name, keep_alive="5m", think=False,
                options={**GREEDY, "num_predict": 12, "repeat_penalty": 1.0, "num_thread": 2, "num_keep": 4,
                         "min_p": 0.0, "top_k": 40})
    assert same.message.content == want


@pytest.mark.parametrize("kw, words", [
    ({"options": {"mirostat_mode": 1}}, ["unknown option", "mirostat_mode"]),
    ({"options": {"repeat_penalty": 1.1}}, ["repeat_penalty", "not supported"]),
    ({"options": {"presence_penalty": 0.5}}, ["presence_penalty"]),
    ({"options": {"temperature": -1}}, ["options.temperature"]),
    ({"options": {"num_predict": 0}}, ["num_predict"]),
    ({"options": {"stop": [""]}}, ["options.stop"]),
    ({"think": True}, ["think"]),
    ({"logprobs": True}, ["logprobs"]),
])
def test_refused_options_name_the_field(client, name, kw, words):
    with pytest.raises(ollama.ResponseError) as e:
        chat(client, name, **kw)
    assert e.value.status_code == 400 and all(w in e.value.error for w in words), e.value.error


def test_bad_requests_get_ollama_errors_and_the_server_keeps_serving(client, served, name):
    url = served[0]
    ok = {"model": name, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    assert "invalid JSON" in error(httpx.post(url + "/api/chat", content=b"{not json"), 400)
    assert error(httpx.post(url + "/api/chat", json={**ok, "mystery": 1}), 400) == "mystery: unknown field"
    assert "model" in error(httpx.post(url + "/api/chat", json={"messages": []}), 400)
    assert "format" in error(httpx.post(url + "/api/chat", json={**ok, "format": "yaml"}), 400)
    assert "messages.0.role" in error(httpx.post(url + "/api/chat", json={
        **ok, "messages": [{"role": "wizard", "content": "hi"}]}), 400)
    assert "images" in error(httpx.post(url + "/api/chat", json={
        **ok, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}), 400)
    gen = {"model": name, "prompt": "hi", "stream": False}
    for field, value in (("suffix", "end"), ("template", "{{ .Prompt }}"), ("context", [1, 2]), ("images", ["aGk="])):
        assert field in error(httpx.post(url + "/api/generate", json={**gen, field: value}), 400)
    assert "system" in error(httpx.post(url + "/api/generate", json={**gen, "raw": True, "system": "x"}), 400)
    long = {**ok, "messages": [{"role": "user", "content": "word " * (CTX + 10)}]}
    assert "longer than the context" in error(httpx.post(url + "/api/chat", json=long), 400)
    assert "/api/pull" in error(httpx.post(url + "/api/pull", json={"model": name}), 404)
    assert "/api/embed" in error(httpx.post(url + "/api/embed", json={"model": name, "input": "x"}), 404)
    assert chat(client, name, options={**GREEDY, "num_predict": 3}).eval_count == 3


def test_api_key_required_when_set(session, served):
    with background(create_app(session, api_key="s3cret")) as url:
        assert httpx.get(url + "/").text == "Ollama is running"  # the probe needs no key
        assert httpx.get(url + "/api/version").status_code == 200
        assert "API key" in error(httpx.get(url + "/api/tags"), 401)
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=url).list()
        assert e.value.status_code == 401
        good = ollama.Client(host=url, headers={"Authorization": "Bearer s3cret"})
        name = good.list().models[0].model
        assert chat(good, name, options={**GREEDY, "num_predict": 3}).eval_count == 3


def test_full_queue_and_shutdown_are_ollama_errors(session):
    worker = hooked_worker(session, queue=0)
    app = create_app(session, worker=worker)
    # the generation holds at its first chunk until something cancels it
    worker.after_chunk = lambda job, n: job.cancel_requested.wait(60)
    with background(app) as url:
        c = ollama.Client(host=url, timeout=120)
        name = c.list().models[0].model
        held = chat(c, name, stream=True, options={**GREEDY, "num_predict": 50})
        first = next(held)  # admitted and generating
        assert not first.done
        with pytest.raises(ollama.ResponseError) as e:
            chat(c, name, options={"num_predict": 2})
        assert e.value.status_code == 503 and "busy" in e.value.error
    # leaving the block shut the server down: the held stream ends with Ollama's error line
    with pytest.raises(ollama.ResponseError, match="shutting down"):
        list(held)


def test_specli_serve_answers_ollama_clients(tiny_target):
    p = subprocess.Popen([sys.executable, "-m", "specli", "serve", "--target", tiny_target, "--draft", "none",
                          "--port", "0", "--ctx", str(CTX)], stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:  # the server says where it listens once it does
            m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1 \(OpenAI\) and /api \(Ollama\)", line)
            if m:
                break
        assert m
        c = ollama.Client(host=m.group(1), timeout=120)
        (model,) = c.list().models
        assert chat(c, model.model, options={**GREEDY, "num_predict": 4}).eval_count == 4
    finally:
        p.terminate()
        p.wait(60)


class Forecast(BaseModel):
    city: Literal["Paris", "London", "Tokyo"]
    days: int = Field(ge=1, le=7)
    rain: bool


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city for some days",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}}
ASK = "What is the weather in Paris for the next three days?"


def test_format_schema_gives_a_valid_object_identical_to_specli_run(client, name, tiny_target, tiny_draft, tmp_path):
    schema = Forecast.model_json_schema()
    r = chat(client, name, ASK, format=schema, options={**GREEDY, "num_predict": 200})
    got = Forecast.model_validate_json(r.message.content)  # raises unless it follows the schema
    assert r.done_reason == "stop" and got.city in ("Paris", "London", "Tokyo")
    text, _ = streamed(chat(client, name, ASK, format=schema, stream=True, options={**GREEDY, "num_predict": 200}))
    assert text == r.message.content
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    ref = run_json(tiny_target, tiny_draft, "-n", "200", "--json-schema", str(path), "--prompt", ASK)
    assert ref["text"] == r.message.content
    g = client.generate(model=name, prompt=ASK, format=schema, options={**GREEDY, "num_predict": 200})
    Forecast.model_validate_json(g.response)


def test_format_json_gives_an_object_at_any_temperature(client, name):
    r = chat(client, name, ASK, format="json", options={"temperature": 0.8, "seed": 1, "num_predict": 60})
    assert r.message.content.startswith("{")
    if r.done_reason == "stop":  # a random tiny model may write a longer object than that
        assert isinstance(json.loads(r.message.content), dict)


def test_tools_go_through_the_template_and_history_back(client, name, served):
    """The tiny models' template knows no tools: specli describes them (the fallback format).
    A model that does not call answers with content and no tool_calls; a conversation with a
    call and its result goes back through the template."""
    r = chat(client, name, ASK, tools=[WEATHER], options={**GREEDY, "num_predict": 16})
    assert r.message.content and not r.message.tool_calls
    history = [{"role": "user", "content": ASK},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
               {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    r = client.chat(model=name, messages=history, tools=[WEATHER], options={**GREEDY, "num_predict": 8})
    assert r.eval_count == 8
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    assert "same name" in error(httpx.post(served[0] + "/api/chat", json={**body, "tools": [WEATHER, WEATHER]}), 400)
    assert "give one" in error(httpx.post(served[0] + "/api/chat", json={**body, "tools": [WEATHER],
                                                                          "format": "json"}), 400)
    assert "format" in error(httpx.post(served[0] + "/api/chat", json={**body, "format": {"type": "nonsense"}}), 400)


def test_streamed_tool_calls_come_whole_with_arguments_as_objects():
    stream = CallStream(FORMATS["fallback"])
    pieces = ["Let me check. <tool_", 'call>\n{"name": "get_weather", "arguments": {"city": "Par', 'is", "days": 3}}',
              "\n</tool_call>"]
    out = [stream.feed(p) for p in pieces] + [stream.flush()]
    assert "".join(t for t, _ in out).strip() == "Let me check."
    assert [c for _, calls in out for c in calls] == [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]


def near_tie_or_same(prompt_tokens: list[int], ref_tokens: list[int], text: str) -> str | None:
    """None when ``text`` is the reference's; else the verdict where they part (the target's
    own top-2 margin there, specli.measure.lossless), which must be a near-tie."""
    from specli.measure.lossless import divergence
    sess = Session(Options(profile="default", draft="none"))
    try:
        got = sess.target.tokenize(text, add_special=False, parse_special=False)
        d = divergence(sess.ctx, prompt_tokens, ref_tokens, got)
    finally:
        sess.close()
    assert d is None or d.near_tie, d.describe()
    return None if d is None else d.describe()


@pytest.mark.real
def test_real_pair_through_the_ollama_client_is_specli_run():
    """The "done when": the ollama client chats and streams against `specli serve --profile
    default`, with the text `specli run` gives (greedy), or one that parts from it only at a
    near-tie of the target's own logits."""
    prompt = "Write a Python function that reverses a string."
    rc, out, err = specli("run", "--profile", "default", "--temp", "0", "-n", "48", "--json", "--prompt", prompt)
    assert rc == 0, err
    ref = json.loads(out)
    p = subprocess.Popen([sys.executable, "-m", "specli", "serve", "--profile", "default", "--port", "0"],
                         stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in p.stderr:
            lines.append(line)
            m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            if m:
                break
        assert m, "".join(lines)
        c = ollama.Client(host=m.group(1), timeout=600)
        name = c.list().models[0].model
        r = chat(c, name, prompt, options={**GREEDY, "num_predict": 48})
        text, parts = streamed(chat(c, name, prompt, stream=True, options={**GREEDY, "num_predict": 48}))
        gen = c.generate(model=name, prompt=prompt, options={**GREEDY, "num_predict": 48})
        answer = chat(c, name, ASK, tools=[WEATHER], options={**GREEDY, "num_predict": 80}).message
        structured = chat(c, name, ASK + " Answer in JSON.", format=Forecast.model_json_schema(),
                          options={**GREEDY, "num_predict": 80}).message.content
    finally:
        p.terminate()
        p.wait(60)
    assert r.eval_count == ref["stats"]["generated"] and r.prompt_eval_count == len(ref["prompt_tokens"])
    assert parts[-1].eval_count == ref["stats"]["generated"]
    Forecast.model_validate_json(structured)
    # Ollama has no tool_choice: the model decides (this one may answer in a Markdown block);
    # a call it makes comes back with its arguments as an object that follows the schema
    assert answer.tool_calls or answer.content
    for call in answer.tool_calls or []:
        assert call.function.name == "get_weather" and call.function.arguments["city"] in ("Paris", "London", "Tokyo")
    for got in (r.message.content, text, gen.response):
        if got != ref["text"]:
            print(near_tie_or_same(ref["prompt_tokens"], ref["tokens"], got))
