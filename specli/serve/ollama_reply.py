"""Ollama's answers: ``/api/chat`` messages and ``/api/generate`` responses, streamed as NDJSON
lines (the content as it comes, each tool call whole) or whole, with Ollama's timings; an
:class:`OllamaAnswer` is the shared answering path's :class:`~specli.serve.answer.Shape`."""

from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse, Response

from specli.serve.answer import Outcome
from specli.serve.ollama_schemas import rfc3339
from specli.serve.shared import APIError
from specli.serve.toolstream import CallStream, ollama_call
from specli.serve.worker import Event
from specli.speculate.loop import TokenLogprob
from specli.toolcalls import Format

MEDIA_TYPE = "application/x-ndjson"


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


class Reply:
    """The objects of one answer: ``/api/chat`` messages or ``/api/generate`` responses."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
        self.t0 = time.perf_counter_ns()
        self.load_duration = 0.0  # seconds this request waited for its model's load

    def part(self, text: str, calls: list[dict] | None = None) -> dict:
        body: dict = {"model": self.model, "created_at": rfc3339(time.time())}
        if self.chat:
            body["message"] = {"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {})
        else:
            body["response"] = text
        body["done"] = False
        return body

    def loaded(self, load_duration: float = 0.0) -> dict:
        """The answer to an empty request, which Ollama clients send to load the model."""
        return self.part("") | {"done": True, "done_reason": "load", "load_duration": _ns(load_duration)}

    def unloaded(self) -> dict:
        """The answer to an empty request with ``keep_alive: 0``, which unloads the model."""
        return self.part("") | {"done": True, "done_reason": "unload"}

    def done(self, ev: Event, n_prompt: int, text: str = "", calls: list[dict] | None = None) -> dict:
        st = ev.stats
        return self.part(text, calls) | {
            "done": True, "done_reason": ev.finish,
            "total_duration": time.perf_counter_ns() - self.t0, "load_duration": _ns(self.load_duration),
            "prompt_eval_count": n_prompt, "prompt_eval_duration": _ns(st.t_prefill),
            "eval_count": st.generated, "eval_duration": _ns(st.t_generate),
            "specli": {"mode": st.mode, "drafted": st.drafted, "accepted": st.accepted, "history": st.history,
                       "prompt_tokens_cached": st.prompt_tokens_cached}}


class OllamaAnswer:
    """An answer as Ollama writes it: NDJSON lines, each tool call whole in a message of its
    own, the stats on the last line; or the whole object."""

    media_type = MEDIA_TYPE

    def __init__(self, reply: Reply):
        self.reply = reply

    def splitter(self, fmt: Format) -> CallStream:
        return CallStream(fmt)

    def opening(self) -> list[str]:
        return []

    def part(self, text: str, calls: list[dict], logprobs: list[TokenLogprob] | None) -> list[str]:
        return [line(self.reply.part(text, calls))] if text or calls else []

    def finished(self, end: Event, n_prompt: int, called: bool) -> list[str]:
        return [line(self.reply.done(end, n_prompt))]

    def failed(self, error: APIError) -> str:
        return line({"error": str(error)})

    def closing(self) -> list[str]:
        return []

    def whole(self, out: Outcome, n_prompt: int) -> dict:
        return self.reply.done(out.end, n_prompt, out.text, [ollama_call(c) for c in out.calls])


def single(obj: dict, stream: bool) -> Response:
    """One object, as one NDJSON line when the client asked for a stream."""
    if stream:
        return Response(line(obj), media_type=MEDIA_TYPE)
    return JSONResponse(obj)
