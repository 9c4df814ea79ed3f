"""The request bodies the server accepts (pydantic models, strict types: ``"5"`` is not a
number) and the OpenAI-shaped bodies it answers with."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specli.speculate.loop import Stats

# OpenAI's finish_reason for each way a generation ends ("context" is the context filling up)
FINISH = {"stop": "stop", "length": "length", "context": "length"}


class _Body(BaseModel):
    # unknown fields (user, presence_penalty, ...) are ignored, as OpenAI-compatible servers do
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def as_dict(self) -> dict:
        """The message as a chat template expects it (``developer`` is OpenAI's new ``system``)."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(_Body):
    include_usage: bool = False


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


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int]
    echo: bool = Field(False, description="not supported")

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
        "speculative": {"mode": st.mode, "drafted": st.drafted, "accepted": st.accepted,
                        "acceptance": st.acceptance, "mean_accepted": st.mean_accepted,
                        "tokens_per_s": st.tokens_per_s},
    }


class Reply:
    """The bodies of one answer: a whole ``chat.completion``/``text_completion`` or its
    streamed chunks."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish: str, use: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                      "logprobs": None}
            return {**self._head("chat.completion"), "choices": [choice], "usage": use}
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return {**self._head("text_completion"), "choices": [choice], "usage": use}

    def chunk(self, text: str | None, finish: str | None = None, use: dict | None = None,
              first: bool = False, no_choice: bool = False) -> dict:
        if self.chat:
            delta = ({"role": "assistant", "content": ""} if first else {}) | ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            body = self._head("text_completion")
        body["choices"] = [] if no_choice else [choice]
        if use is not None:
            body["usage"] = use
        return body
