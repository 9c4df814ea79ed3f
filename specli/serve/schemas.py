"""The request bodies the server accepts (pydantic models, strict types: ``"5"`` is not a
number) and the OpenAI-shaped bodies it answers with."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specli.speculate.loop import Stats, TokenLogprob

# OpenAI's finish_reason for each way a generation ends ("context" is the context filling up)
FINISH = {"stop": "stop", "length": "length", "context": "length"}


class _Body(BaseModel):
    # a field this server does not know is refused (400 naming it), as OpenAI refuses one:
    # nothing that could change the answer is ignored silently
    model_config = ConfigDict(strict=True, extra="forbid")


def refuse(value, default, why: str = "is not supported by this server"):
    """A field that would change the output and is not implemented: only its default passes."""
    if value is not None and value != default:
        raise ValueError(why)
    return value


class Part(_Body):
    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str | None = None
    refusal: str | None = None
    image_url: dict | None = None
    input_audio: dict | None = None
    file: dict | None = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.type in ("image_url", "input_audio", "file"):
            raise ValueError(f"'{self.type}' parts are not supported: this server serves a text model")
        if (self.text if self.type == "text" else self.refusal) is None:
            raise ValueError(f"a '{self.type}' part needs its '{self.type}' field")
        return self


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCallIn(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant
    tool_call_id: str | None = None  # tool
    refusal: str | None = None  # assistant: OpenAI's clients send it back as they got it (null)
    audio: dict | None = None
    function_call: dict | None = None

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, v):
        return refuse(v, None, "audio is not supported: this server serves a text model")

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, v):
        return refuse(v, None, "the deprecated function_call is not supported; use tool_calls")

    def as_dict(self) -> dict:
        """The message as a chat template expects it (``developer`` is OpenAI's new ``system``;
        tool calls and results in OpenAI's shape: :mod:`specli.toolcalls` adapts them)."""
        parts = self.content if isinstance(self.content, list) else []
        text = self.content if isinstance(self.content, str) else "".join(p.text or p.refusal or "" for p in parts)
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


class StreamOptions(_Body):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # no effect: nothing is obfuscated


class Sampling(_Body):
    """What both endpoints share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # not OpenAI's, as llama.cpp's server accepts it
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="only one choice per request")
    # llama-server's constraints: a JSON schema, a GBNF grammar
    json_schema: dict | None = None
    grammar: str | None = None
    # not implemented: only the value that changes nothing passes
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict | None = None
    # no effect on the answer
    user: str | None = None

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, v):
        return refuse(v, 0, "penalties are not supported (they would change the target's own distribution); "
                            "only 0 is accepted")

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v):
        return refuse(v or None, None, "logit_bias is not supported; only an empty object is accepted")

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # the arguments follow the schema whenever they are constrained


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class Named(_Body):
    name: str


class NamedChoice(_Body):
    type: Literal["function"]
    function: Named


class SchemaFormat(_Body):
    name: str
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: SchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs its 'json_schema' object")
        return self


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # no effect on the answer
    metadata: dict | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # not implemented
    modalities: list[str] | None = None
    audio: dict | None = None
    prediction: dict | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict | None = None
    functions: list | None = None
    function_call: str | dict | None = None

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v):
        return refuse(v, ["text"], "only the 'text' modality is supported")

    @field_validator("audio", "prediction", "reasoning_effort", "verbosity", "web_search_options")
    @classmethod
    def _unsupported(cls, v):
        return refuse(v, None)

    @field_validator("functions", "function_call")
    @classmethod
    def _deprecated(cls, v):
        return refuse(v, None, "the deprecated functions API is not supported; use tools and tool_choice")

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int]
    echo: bool = Field(False, description="not supported")
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("best_of")
    @classmethod
    def _one(cls, v):
        return refuse(v, 1, "only best_of 1 is supported")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        return refuse(v or None, None, "suffix (insertion) is not supported")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is empty")
        if isinstance(v, list) and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("one prompt per request")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v):
        if v:
            raise ValueError("echo is not supported")
        return v

    @property
    def limit(self) -> int:
        return self.max_tokens or 16  # OpenAI's default for completions


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def usage(st: Stats, n_prompt: int) -> dict:
    """Token counts as OpenAI gives them, plus what speculation did."""
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": st.generated,
        "total_tokens": n_prompt + st.generated,
        "prompt_tokens_details": {"cached_tokens": st.prompt_tokens_cached},
        "speculative": {"mode": st.mode, "drafted": st.drafted, "accepted": st.accepted, "history": st.history,
                        "acceptance": st.acceptance, "mean_accepted": st.mean_accepted,
                        "tokens_per_s": st.tokens_per_s},
    }


def chat_logprobs(lps: list[TokenLogprob]) -> dict:
    """``choice.logprobs`` of a chat answer (or of one streamed chunk)."""
    def entry(text: str, lp: float) -> dict:
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}
    return {"content": [{**entry(t.text, t.logprob), "top_logprobs": [entry(s, v) for _, s, v in t.top]}
                        for t in lps], "refusal": None}


def completion_logprobs(lps: list[TokenLogprob], offset: int = 0) -> dict:
    """``choice.logprobs`` of a completion (the legacy shape); ``offset``: the characters sent
    before these tokens."""
    offsets = []
    for t in lps:
        offsets.append(offset)
        offset += len(t.text)
    return {"tokens": [t.text for t in lps], "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{s: v for _, s, v in t.top} for t in lps], "text_offset": offsets}


class Reply:
    """The bodies of one answer: a whole ``chat.completion``/``text_completion`` or its
    streamed chunks."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.sent = 0  # characters of completion text streamed so far (logprobs' text_offset)

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _logprobs(self, lps: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        if lps is None:
            return None
        return chat_logprobs(lps) if self.chat else completion_logprobs(lps, offset)

    def whole(self, text: str | None, finish: str, use: dict, tool_calls: list[dict] | None = None,
              logprobs: list[TokenLogprob] | None = None) -> dict:
        lp = self._logprobs(logprobs)
        if self.chat:
            msg = {"role": "assistant", "content": text} | ({"tool_calls": tool_calls} if tool_calls else {})
            choice = {"index": 0, "message": msg, "finish_reason": finish, "logprobs": lp}
            return {**self._head("chat.completion"), "choices": [choice], "usage": use}
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": lp}
        return {**self._head("text_completion"), "choices": [choice], "usage": use}

    def chunk(self, text: str | None, finish: str | None = None, use: dict | None = None,
              first: bool = False, no_choice: bool = False, tool_calls: list[dict] | None = None,
              logprobs: list[TokenLogprob] | None = None) -> dict:
        lp = self._logprobs(logprobs, self.sent)
        self.sent += len(text or "")
        if self.chat:
            delta = ({"role": "assistant", "content": ""} if first else {}) | ({"content": text} if text else {})
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lp}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": lp}
            body = self._head("text_completion")
        body["choices"] = [] if no_choice else [choice]
        if use is not None:
            body["usage"] = use
        return body
