"""Tool calls, structured output, logprobs and refused fields through `specli serve`, with the
official openai client against an in-process server (as tests/test_serve.py starts one).

The tiny models share SmolLM2's tokenizer and template, which knows no tools: they exercise
the fallback format (tools described by specli, ``<tool_call>`` as plain text), and, with
Qwen2.5's template (tests/templates/qwen2.5.jinja) over the same tokenizer, the template's own
rendering. The real pair (Qwen2.5-Coder 1.5B + 0.5B, ``<tool_call>`` a special token) runs the
"Done when" checks."""

import json
from pathlib import Path
from typing import Literal

import httpx
import numpy as np
import openai
import pytest
from conftest import TARGET_KW, TEST_CACHE
from pydantic import BaseModel, Field
from tinymodels import tiny_model

from specli import toolcalls, toolgrammar
from specli.engine import Context, ContextConfig
from specli.serve.app import create_app
from specli.serve.runner import background
from specli.serve.shared import Prompter
from specli.serve.toolstream import ToolStream
from specli.session import Options, Session
from specli.toolcalls import FORMATS, Tool

CTX = 2048
QWEN_TEMPLATE = (Path(__file__).parent / "templates" / "qwen2.5.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city for some days",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next three days?"}]


class Forecast(BaseModel):
    city: Literal["Paris", "London", "Tokyo"]
    days: int = Field(ge=1, le=7)
    rain: bool


def _served(target, draft):
    sess = Session(Options(target=target, draft=draft, n_ctx=CTX, f32_kv=True))
    app = create_app(sess)
    return sess, app


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft):
    sess, app = _served(tiny_target, tiny_draft)
    with background(app) as url:
        yield url, app, sess
    sess.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def mid(server):
    return server[1].state.model_ids[0]


def _chat(client, mid, **kw):
    kw = {"messages": ASK, "temperature": 0, "max_tokens": 120, **kw}
    return client.chat.completions.create(model=mid, **kw)


def _streamed_calls(chunks) -> tuple[list[dict], str | None, str]:
    """The tool calls a stream sends, accumulated by index as clients do; the finish reason; the content."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for ch in chunks:
        if not ch.choices:
            continue
        c = ch.choices[0]
        content += c.delta.content or ""
        for d in c.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.function.name and d.type == "function"  # the first delta names the call
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            calls[d.index]["arguments"] += d.function.arguments or ""
        finish = c.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content


# -- tool calls on the tiny models (fallback format) --------------------------------------
def test_required_tool_call_parses_and_follows_the_schema(client, mid):
    r = _chat(client, mid, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert args["city"] in ("Paris", "London", "Tokyo") and 1 <= args["days"] <= 7
    else:
        assert call.function.name == "get_time" and args["zone"] in ("UTC", "CET")
    # streamed: the same call, the name first, then the arguments
    calls, finish, content = _streamed_calls(_chat(client, mid, tools=[WEATHER, TIME], tool_choice="required",
                                                   parallel_tool_calls=False, stream=True))
    assert finish == "tool_calls" and content == ""
    assert [(x["name"], x["arguments"]) for x in calls] == [(call.function.name, call.function.arguments)]


def test_named_tool_choice_calls_that_function(client, mid):
    r = _chat(client, mid, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")


def test_auto_without_a_call_is_the_plain_answer_to_the_same_prompt(client, mid, server):
    """Under ``auto`` the text is unconstrained until a call opens: a model that does not call
    says exactly what it says with no constraint (the same prompt, sent as raw tokens)."""
    r = _chat(client, mid, tools=[WEATHER], max_tokens=40)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"
    prompter = Prompter(server[2])
    toks = prompter.chat(ASK, [Tool.from_openai(WEATHER)], FORMATS["fallback"])
    plain = client.completions.create(model=mid, prompt=toks, temperature=0, max_tokens=40)
    assert r.choices[0].message.content == plain.choices[0].text
    # tool_choice none: the model is not told of the tools; the answer is the plain chat answer
    none = _chat(client, mid, tools=[WEATHER], tool_choice="none", max_tokens=20)
    assert none.choices[0].message.content == _chat(client, mid, max_tokens=20).choices[0].message.content


def test_tool_results_go_back_through_the_conversation(client, mid):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": '{"city": "Paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sunny"}'}]
    r = _chat(client, mid, messages=history, tools=[WEATHER], max_tokens=5)
    assert r.usage.prompt_tokens > _chat(client, mid, tools=[WEATHER], max_tokens=1).usage.prompt_tokens
    bad = [*history[:1], {**history[1], "tool_calls": [{**history[1]["tool_calls"][0],
                                                         "function": {"name": "get_weather", "arguments": "{oops"}}]}]
    with pytest.raises(openai.BadRequestError, match="not valid JSON"):
        _chat(client, mid, messages=bad, tools=[WEATHER])


def test_the_fallback_renders_tools_calls_and_results_as_text():
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
            {"role": "tool", "tool_call_id": "c", "content": "12:00"}]
    out = FORMATS["fallback"].messages(msgs, [Tool.from_openai(TIME)])
    assert out[0]["role"] == "system" and '<tools>\n{"type": "function", "function": {"name": "get_time"' \
        in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}'
                                                      '\n</tool_call>'}
    assert out[3] == {"role": "user", "content": "<tool_response>\n12:00\n</tool_response>"}


def test_qwen_template_renders_tools_itself():
    msgs = [{"role": "user", "content": "hi <b>"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
            {"role": "tool", "tool_call_id": "c", "content": "12:00"}]
    fmt = toolcalls.detect(QWEN_TEMPLATE)
    assert fmt.name == "hermes" and fmt.native
    text = toolcalls.render(QWEN_TEMPLATE, msgs, [Tool.from_openai(TIME)], fmt)
    # the tool as the template writes it: keys in order, no HTML escaping (transformers' tojson)
    assert '<tools>\n{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"' in text
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_qwen_template_on_a_tiny_model_required_call(smol_gguf, tiny_draft):
    target = str(tiny_model(TEST_CACHE, smol_gguf, chat_template=QWEN_TEMPLATE, **TARGET_KW))
    sess, app = _served(target, tiny_draft)
    try:
        with background(app) as url:
            c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
            r = _chat(c, app.state.model_ids[0], tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
            (call,) = r.choices[0].message.tool_calls
            assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city", "days"}
    finally:
        sess.close()


# -- parsing each family's syntax ---------------------------------------------------------
@pytest.mark.parametrize("fmt,text,content,calls", [
    ("hermes", ('Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
                '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'),
     "Let me look.", [("f", {"a": 1}), ("g", {})]),
    ("hermes", "no call here", "no call here", []),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": \n</tool_call>',
     '<tool_call>\n{"name": "f", "arguments": {"a": \n</tool_call>', []),  # broken JSON stays text
    ("llama3", '{"name": "f", "parameters": {"a": "x"}}', "", [("f", {"a": "x"})]),
    ("llama3", "The answer is {a}.", "The answer is {a}.", []),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 2}, "id": "abcDEF123"}]', "", [("f", {"a": 2})]),
    ("mistral", '[{"name": "f", "arguments": {}}]', "", [("f", {})]),  # the control token is not in the text
    ("fallback", 'x <tool_call>{"name": "f", "arguments": "{\\"a\\": 3}"}</tool_call>', "x", [("f", {"a": 3})]),
])
def test_parse(fmt, text, content, calls):
    got_content, got = toolcalls.parse(text, FORMATS[fmt])
    assert got_content == content and [(c.name, c.arguments) for c in got] == calls


def test_mistral_ids_and_detection():
    _, (call,) = toolcalls.parse('[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "abcDEF123"}]', FORMATS["mistral"])
    assert call.id == "abcDEF123"
    _, (call,) = toolcalls.parse('[{"name": "f", "arguments": {}}]', FORMATS["mistral"])
    assert len(call.id) == 9 and call.id.isalnum()  # Mistral's templates want nine letters or digits
    assert toolcalls.detect("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert toolcalls.detect("{{ '<|python_tag|>' }}").name == "llama3"
    assert toolcalls.detect("{{ messages }}").name == "fallback"
    with pytest.raises(toolcalls.ToolsUnsupported):
        toolcalls.detect("<tool_call>\n<function=")


def test_tool_stream_sends_content_then_the_call_piece_by_piece():
    s = ToolStream(FORMATS["hermes"])
    assert s.feed("Sure. <tool") == ("Sure. ", [])  # "<tool" may open a call: held back
    assert s.feed('_call>\n{"name": "f", "argu') == ("", [])
    assert s.feed('ments": ') == ("", [])  # the arguments start at their first character
    text, deltas = s.feed('{"a": 1')  # the name is known: the call's first delta, then its arguments
    assert text == "" and deltas[0]["index"] == 0 and deltas[0]["type"] == "function"
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"] == {"name": "f", "arguments": ""}
    assert deltas[1:] == [{"index": 0, "function": {"arguments": '{"a": 1'}}]
    # "}\n</tool" may be the call's closing: only the arguments' own brace goes
    assert s.feed('}}\n</tool') == ("", [{"index": 0, "function": {"arguments": "}"}}])
    assert s.feed("_call>") == ("", [])
    _, deltas = s.feed('\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    assert [d["index"] for d in deltas] == [1, 1] and deltas[1]["function"]["arguments"] == "{}"
    assert s.flush() == ("", []) and s.n_calls == 2
    s = ToolStream(FORMATS["hermes"])
    assert s.feed("a <to") == ("a ", []) and s.feed("p") == ("<top", []) and s.flush() == ("", [])
    # Mistral's list goes whole, once complete
    s = ToolStream(FORMATS["mistral"])
    assert s.feed('[{"name": "f", "arguments": {"a": 1}}') == ("", [])
    _, deltas = s.feed("]")
    assert deltas[0]["function"]["name"] == "f" and deltas[1]["function"]["arguments"] == '{"a": 1}'


def test_arguments_are_returned_as_the_model_wrote_them():
    _, (call,) = toolcalls.parse('<tool_call>\n{"name": "f", "arguments": {"b": 1,   "a": "\\u00e9"}}\n</tool_call>',
                                 FORMATS["hermes"])
    assert call.arguments == {"b": 1, "a": "\u00e9"} and call.openai()["function"]["arguments"] == \
        '{"b": 1,   "a": "\\u00e9"}'


def test_auto_grammar_constrains_only_after_the_opening(server):
    """The ``auto`` grammar lets any text through, and once ``<tool_call>`` is written, only a
    call that follows the schema."""
    sess = server[2]
    model = sess.target
    tools = [Tool.from_openai(WEATHER)]
    c = toolgrammar.constraint_for(tools, "auto", FORMATS["fallback"], toolgrammar.special_tokens(model))
    c.check()

    def accepts(text: str) -> bool:
        toks = model.tokenize(text, add_special=False, parse_special=False)
        return c.guide(model).clip(toks) == toks

    assert accepts("Any text at all, with { braces } and <tags>.")
    assert accepts('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo", "days": 2}}\n'
                   '</tool_call>')
    assert not accepts('Sure.\n<tool_call>\n{"name": "get_time"')
    assert not accepts('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"')


# -- structured output -----------------------------------------------------------------------
def test_parse_with_a_pydantic_model_gives_a_valid_object(client, mid):
    r = client.chat.completions.parse(model=mid, messages=ASK, response_format=Forecast, temperature=0,
                                      max_tokens=60)
    assert isinstance(r.choices[0].message.parsed, Forecast) and r.choices[0].finish_reason == "stop"


def test_llama_server_json_schema_and_grammar_fields(server, mid):
    url = server[0]
    schema = Forecast.model_json_schema()
    for path, body in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "Weather:"})):
        r = httpx.post(url + path, timeout=300, json={"model": mid, "temperature": 0, "max_tokens": 60,
                                                      "json_schema": schema, **body}).json()
        text = r["choices"][0]["message"]["content"] if "messages" in body else r["choices"][0]["text"]
        Forecast.model_validate_json(text)
        r = httpx.post(url + path, json={"model": mid, "temperature": 0, "max_tokens": 20,
                                         "grammar": 'root ::= "yes" | "no"', **body}, timeout=300).json()
        text = r["choices"][0]["message"]["content"] if "messages" in body else r["choices"][0]["text"]
        assert text in ("yes", "no")


# -- logprobs ----------------------------------------------------------------------------------
def _reference_logprobs(sess: Session, prompt: list[int], n: int) -> list[tuple[str, float, list[str]]]:
    """Greedy decoding by hand on a fresh context of the same f32 model: each token, its
    log-softmax value, the three best tokens there."""
    ctx = Context(sess.target, ContextConfig(n_ctx=CTX, f32_kv=True))
    try:
        out, row = [], ctx.eval(prompt)[0]
        for _ in range(n):
            lp = row.astype(np.float64) - row.max()
            lp -= np.log(np.exp(lp).sum())
            tok = int(lp.argmax())
            top = [sess.target.detokenize([t]) for t in np.argsort(-lp, kind="stable")[:3]]
            out.append((sess.target.detokenize([tok]), float(lp[tok]), top))
            row = ctx.eval([tok])[0]
        return out
    finally:
        ctx.close()


def test_logprobs_are_the_targets_own(client, mid, server):
    sess = server[2]
    r = _chat(client, mid, max_tokens=12, logprobs=True, top_logprobs=3)
    got = r.choices[0].logprobs.content
    ref = _reference_logprobs(sess, Prompter(sess).chat(ASK), 12)
    assert "".join(t.token for t in got) == r.choices[0].message.content
    assert [t.token for t in got] == [x[0] for x in ref]
    assert np.allclose([t.logprob for t in got], [x[1] for x in ref], atol=1e-4)
    assert [[a.token for a in t.top_logprobs] for t in got] == [x[2] for x in ref]
    assert all(t.top_logprobs[0].logprob == t.logprob for t in got)  # greedy: the best token
    # streamed: the same entries, spread over the chunks
    chunks = list(_chat(client, mid, max_tokens=12, logprobs=True, top_logprobs=3, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    # (the stream's verify blocks can have other shapes than the first answer's, and a batched
    # f32 pass moves a logit in its last bits: the same tolerance as against the reference)
    assert [t.token for t in streamed] == [t.token for t in got]
    assert np.allclose([t.logprob for t in streamed], [x[1] for x in ref], atol=1e-4)
    # without top_logprobs: each token's own value only
    plain = _chat(client, mid, max_tokens=4, logprobs=True).choices[0].logprobs.content
    assert all(t.top_logprobs == [] for t in plain) and np.isclose(plain[0].logprob, got[0].logprob, atol=1e-4)
    assert _chat(client, mid, max_tokens=4).choices[0].logprobs is None


def test_completions_logprobs(client, mid):
    r = client.completions.create(model=mid, prompt="The quick brown fox", temperature=0, max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 6
    assert all(len(t) == 2 and max(t.values()) == v for t, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True))
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


# -- every field that would change the answer and is not implemented: 400 naming it ------------
REFUSED_CHAT = [
    ({"n": 2}, "n"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, "messages.0.content.0"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"no_such_field": 1}, "no_such_field"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
]


@pytest.mark.parametrize("extra,param", REFUSED_CHAT, ids=[p for _, p in REFUSED_CHAT])
def test_refused_chat_fields(server, mid, extra, param):
    r = httpx.post(server[0] + "/v1/chat/completions", json={"model": mid, "messages": ASK, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param.split(".")[0] in err["message"], err


REFUSED_COMPLETIONS = [({"best_of": 2}, "best_of"), ({"suffix": "end"}, "suffix"), ({"echo": True}, "echo"),
                       ({"logit_bias": {"1": 1}}, "logit_bias"), ({"bogus": True}, "bogus"),
                       ({"logprobs": 21}, "logprobs")]


@pytest.mark.parametrize("extra,param", REFUSED_COMPLETIONS, ids=[p for _, p in REFUSED_COMPLETIONS])
def test_refused_completion_fields(server, mid, extra, param):
    r = httpx.post(server[0] + "/v1/completions", json={"model": mid, "prompt": "hi", "max_tokens": 2, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_fields_without_effect_are_accepted(client, mid):
    r = _chat(client, mid, max_tokens=3, user="u1", metadata={"k": "v"}, store=False, presence_penalty=0,
              frequency_penalty=0, logit_bias={}, n=1, parallel_tool_calls=True, tools=[WEATHER], tool_choice="none",
              stream_options=None, seed=1, service_tier="auto")
    assert r.usage.completion_tokens == 3


# -- the real pair: the "Done when" checks ---------------------------------------------------------
@pytest.mark.real
def test_real_pair_structured_output_and_tool_calls(real_model):
    target = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    draft = real_model("qwen2.5-coder-0.5b-instruct-q4_k_m")
    sess = Session(Options(target=target, draft=draft, n_ctx=4096))
    try:
        with background(create_app(sess)) as url:
            c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900)
            mid = c.models.list().data[0].id
            r = c.chat.completions.parse(model=mid, response_format=Forecast, temperature=0, max_tokens=80,
                                         messages=[{"role": "user", "content": "Forecast for Tokyo, 2 days, rain."}])
            assert isinstance(r.choices[0].message.parsed, Forecast), r.choices[0].message.content
            r = c.chat.completions.create(model=mid, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                          temperature=0, max_tokens=80)
            assert r.choices[0].finish_reason == "tool_calls"
            call = r.choices[0].message.tool_calls[0]
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
            calls, finish, _ = _streamed_calls(c.chat.completions.create(
                model=mid, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=80,
                stream=True))
            assert finish == "tool_calls" and (calls[0]["name"], json.loads(calls[0]["arguments"])) == \
                ("get_weather", {"city": "Paris", "days": 3})
            # auto: the text is the model's own until it opens a call (this model answers in a
            # Markdown block rather than <tool_call>): exactly the unconstrained text of the same prompt
            r = c.chat.completions.create(model=mid, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=60)
            toks = Prompter(sess).chat(ASK, [Tool.from_openai(WEATHER), Tool.from_openai(TIME)], FORMATS["hermes"])
            plain = c.completions.create(model=mid, prompt=toks, temperature=0, max_tokens=60).choices[0].text
            got = r.choices[0]
            if got.finish_reason == "tool_calls":
                assert plain.startswith(got.message.content or "") and "<tool_call>" in plain
            else:
                assert got.message.content == plain
    finally:
        sess.close()
