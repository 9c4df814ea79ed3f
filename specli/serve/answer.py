"""The one answering path of both APIs: a request's job is queued on its model's worker, and
its events become the answer, whole or streamed, with the model's tool calls parsed out of
the text when tools were offered. What differs between OpenAI's API and Ollama's is only
how an answer is written: a :class:`Shape`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request
from fastapi.responses import StreamingResponse

from specli import toolcalls
from specli.serve.shared import APIError, event_error, events, submit
from specli.serve.worker import Event, Job, Worker
from specli.speculate.loop import TokenLogprob
from specli.toolcalls import Format, ToolCall

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Outcome:
    """A whole answer: its content, its tool calls, how it ended (the ``done`` event) and the
    tokens' log-probabilities (None when the job did not ask for them)."""

    text: str
    calls: list[ToolCall]
    end: Event
    logprobs: list[TokenLogprob] | None


class Splitter(Protocol):
    """A streamed answer's content and tool calls apart (:mod:`specli.serve.toolstream`)."""

    n_calls: int

    def feed(self, text: str) -> tuple[str, list[dict]]: ...

    def flush(self) -> tuple[str, list[dict]]: ...


class Shape(Protocol):
    """How one API writes an answer: its stream's pieces (each a string to send as is) and
    its whole body."""

    media_type: str

    def splitter(self, fmt: Format) -> Splitter: ...

    def opening(self) -> list[str]: ...

    def part(self, text: str, calls: list[dict], logprobs: list[TokenLogprob] | None) -> list[str]: ...

    def finished(self, end: Event, n_prompt: int, called: bool) -> list[str]: ...

    def failed(self, error: APIError) -> str: ...

    def closing(self) -> list[str]: ...

    def whole(self, out: Outcome, n_prompt: int) -> dict: ...


async def answer(request: Request, worker: Worker, job: Job, shape: Shape, stream: bool,
                 fmt: Format | None = None):
    """Queue ``job`` on ``worker`` and answer, whole or streamed, as ``shape`` writes it; with
    ``fmt`` (tools offered) the text is parsed for the model's tool calls. The job's owner is
    the request's API key (when the server has keys): whose earlier answers it copies from."""
    job.owner = getattr(request.state, "owner", None)
    submit(worker, job)
    evs = events(job, request)
    if stream:
        return StreamingResponse(_stream(evs, shape, len(job.prompt), fmt), media_type=shape.media_type,
                                 headers=STREAM_HEADERS)
    return shape.whole(await _collect(evs, fmt, job.logprobs is not None), len(job.prompt))


async def _collect(evs: AsyncIterator[Event], fmt: Format | None, logprobs: bool) -> Outcome:
    pieces: list[str] = []
    lps: list[TokenLogprob] | None = [] if logprobs else None
    async with aclosing(evs):
        async for ev in evs:
            if ev.kind == "text":
                pieces.append(ev.text)
                if lps is not None:
                    lps.extend(ev.logprobs or [])
            elif ev.kind == "done":
                text, calls = toolcalls.parse("".join(pieces), fmt) if fmt is not None else ("".join(pieces), [])
                return Outcome(text, calls, ev, lps)
            else:
                raise event_error(ev)
    raise APIError(499, "client closed the request", code="client_closed")  # nobody reads this


async def _stream(evs: AsyncIterator[Event], shape: Shape, n_prompt: int, fmt: Format | None) -> AsyncIterator[str]:
    calls = shape.splitter(fmt) if fmt is not None else None
    async with aclosing(evs):
        for piece in shape.opening():
            yield piece
        async for ev in evs:
            if ev.kind == "text":
                text, made = calls.feed(ev.text) if calls is not None else (ev.text, [])
                pieces = shape.part(text, made, ev.logprobs)
            elif ev.kind == "done":
                text, made = calls.flush() if calls is not None else ("", [])
                pieces = shape.part(text, made, None) + shape.finished(ev, n_prompt, bool(calls and calls.n_calls))
            else:
                pieces = [shape.failed(event_error(ev))]
            for piece in pieces:
                yield piece
        for piece in shape.closing():
            yield piece
