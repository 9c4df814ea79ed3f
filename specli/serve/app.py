"""The OpenAI-compatible HTTP API over one Session (FastAPI): ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``, ``/health``. Requests are validated and tokenized on
the event loop's side; the :class:`~specli.serve.worker.Worker` thread generates."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
from contextlib import aclosing, asynccontextmanager
from typing import AsyncIterator, Union

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from specli.errors import NoChatTemplate, PromptTooLong, SpecliError
from specli.prompt import render_chat, tokenize_prompt
from specli.serve.schemas import (
    ChatRequest,
    CompletionRequest,
    Reply,
    error_body,
    usage,
)
from specli.serve.worker import Event, Job, QueueFull, Worker
from specli.session import Session
from specli.speculate.loop import check_prompt_fits
from specli.speculate.verify import SamplingParams


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.body, self.headers = status, error_body(message, type, param, code), headers


class Prompter:
    """Request text to prompt tokens, safe to call beside a running generation: the chat
    template's BOS/EOS texts are read once here (detokenizing shares a buffer with the
    generating thread), and llama.cpp's tokenizer only reads the vocabulary."""

    def __init__(self, session: Session):
        m = self.model = session.target
        self.n_ctx = session.ctx.n_ctx
        self.template = m.chat_template()
        self.bos = m.detokenize([m.bos], special=True) if m.bos >= 0 else ""
        self.eos = m.detokenize([m.eos], special=True) if m.eos >= 0 else ""

    def chat(self, messages: list[dict]) -> list[int]:
        if not self.template:
            raise NoChatTemplate(self.model.name)
        text = render_chat(self.template, messages, self.bos, self.eos)
        return self._fits(tokenize_prompt(self.model, text, templated=True))

    def raw(self, prompt: Union[str, list[str], list[int]]) -> list[int]:
        if isinstance(prompt, list) and isinstance(prompt[0], int):
            bad = [t for t in prompt if not 0 <= t < self.model.n_vocab]
            if bad:
                raise APIError(400, f"token {bad[0]} is not in the vocabulary (0..{self.model.n_vocab - 1})",
                               param="prompt")
            return self._fits(list(prompt))
        text = prompt[0] if isinstance(prompt, list) else prompt
        if not text:
            raise APIError(400, "the prompt is empty", param="prompt")
        return self._fits(tokenize_prompt(self.model, text, templated=False))

    def _fits(self, toks: list[int]) -> list[int]:
        check_prompt_fits(len(toks), self.n_ctx)
        return toks


def model_ids(session: Session, name: str | None = None) -> list[str]:
    """The model names a request may use: the served name first, then the references the
    server was started with."""
    o = session.opts
    first = name or (session.profile.name if session.profile else
                     os.path.basename(session.target.path).removesuffix(".gguf"))
    ids = [first, session.target.name, session.target.path, o.target, o.profile]
    return list(dict.fromkeys(i for i in ids if i))


def create_app(session: Session, name: str | None = None, api_key: str | None = None,
               queue: int = 8, temperature: float | None = None) -> FastAPI:
    """The API over ``session`` (the caller closes it): OpenAI's under /v1, Ollama's under
    /api. ``temperature`` is what a request that gives none gets (None: each API's own
    default, OpenAI's 1 and Ollama's 0.8)."""
    from specli.serve.ollama import make_router
    worker = Worker(session, queue)
    prompter = Prompter(session)
    ids = model_ids(session, name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        await run_in_threadpool(worker.stop)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if not hmac.compare_digest(auth.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key")

    app = FastAPI(title="specli", lifespan=lifespan)
    app.state.worker, app.state.session, app.state.model_ids = worker, session, ids
    _error_handlers(app)
    auth = [Depends(authorized)]
    app.include_router(make_router(session, worker, prompter, ids, auth, temperature))
    temperature = 1.0 if temperature is None else temperature  # OpenAI's default, for /v1

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": ids[0], "mode": session.drafter.name, **worker.status()}

    @app.get("/v1/models", dependencies=auth)
    async def list_models() -> dict:
        return {"object": "list", "data": [_model_card(ids[0], session)]}

    @app.get("/v1/models/{model_id:path}", dependencies=auth)
    async def get_model(model_id: str) -> dict:
        _check_model(model_id, ids)
        return _model_card(ids[0], session)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(body: ChatRequest, request: Request):
        _check_model(body.model, ids)
        msgs = [m.as_dict() for m in body.messages]
        toks = await run_in_threadpool(_tokens, prompter.chat, msgs, "messages")
        limit = body.limit or max(1, prompter.n_ctx - len(toks))  # OpenAI: up to the context's end
        return await _answer(request, worker, Reply(True, ids[0]), body, toks, limit, temperature)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body.model, ids)
        toks = await run_in_threadpool(_tokens, prompter.raw, body.prompt, "prompt")
        return await _answer(request, worker, Reply(False, ids[0]), body, toks, body.limit, temperature)

    return app


def _tokens(fn, arg, param: str) -> list[int]:
    try:
        return fn(arg)
    except PromptTooLong as e:
        raise APIError(400, f"{e}; shorten it or start the server with a larger --ctx", param=param,
                       code="context_length_exceeded") from None
    except SpecliError as e:
        raise APIError(400, str(e), param=param) from None


def _check_model(name: str, ids: list[str]) -> None:
    if name not in ids:
        raise APIError(404, f"the model '{name}' does not exist; this server serves '{ids[0]}'",
                       param="model", code="model_not_found")


def _model_card(model_id: str, session: Session) -> dict:
    created = int(os.path.getmtime(session.target.path)) if os.path.exists(session.target.path) else 0
    return {"id": model_id, "object": "model", "created": created, "owned_by": "specli"}


async def _answer(request: Request, worker: Worker, reply: Reply, body, toks: list[int], limit: int,
                  temperature: float):
    t = body.temperature if body.temperature is not None else temperature
    params = SamplingParams(temperature=t, top_k=body.top_k, top_p=body.top_p, seed=body.seed)
    job = Job(toks, params, limit, body.stops)
    try:
        worker.submit(job)
    except QueueFull as e:
        raise APIError(503, f"the server is busy ({e}); retry later", type="server_error",
                       code="queue_full", headers={"Retry-After": "1"}) from None
    events = _events(job, request)
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(events, reply, len(toks), include), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    pieces: list[str] = []
    async with aclosing(events):
        async for ev in events:
            if ev.kind == "text":
                pieces.append(ev.text)
            elif ev.kind == "done":
                return reply.whole("".join(pieces), ev.finish, usage(ev.stats, len(toks)))
            else:
                raise _event_error(ev)
    raise APIError(499, "client closed the request", code="client_closed")  # nobody reads this


async def _events(job: Job, request: Request) -> AsyncIterator[Event]:
    """The job's events until it ends; a client that disconnects cancels it (the worker stops
    at the next chunk, or skips the job if it is still waiting)."""
    gone = asyncio.ensure_future(_disconnected(request, job))
    try:
        while True:
            ev = await job.events.get()
            if ev.kind == "gone":
                return
            yield ev
            if ev.kind != "text":
                return
    finally:
        gone.cancel()
        job.cancel()  # no-op once it has ended


async def _disconnected(request: Request, job: Job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()
    job.events.put_nowait(Event("gone"))


async def _sse(events: AsyncIterator[Event], reply: Reply, n_prompt: int, include_usage: bool):
    def data(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    if reply.chat:
        yield data(reply.chunk(None, first=True))
    async for ev in events:
        if ev.kind == "text":
            yield data(reply.chunk(ev.text))
        elif ev.kind == "done":
            use = usage(ev.stats, n_prompt)
            # the stats ride on the last chunk; a separate usage chunk when the client asked for one
            yield data(reply.chunk(None, ev.finish, None if include_usage else use))
            if include_usage:
                yield data(reply.chunk(None, use=use, no_choice=True))
        else:
            yield data(_event_error(ev).body)
    yield "data: [DONE]\n\n"


def _event_error(ev: Event) -> APIError:
    if ev.kind == "cancelled":
        return APIError(503, "the generation was cancelled: the server is shutting down", type="server_error",
                        code="cancelled")
    if isinstance(ev.error, SpecliError):
        return APIError(400, str(ev.error))
    return APIError(500, f"generation failed: {type(ev.error).__name__}: {ev.error}", type="server_error")


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body, status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            return JSONResponse(error_body(f"invalid JSON: {first.get('ctx', {}).get('error', first['msg'])}"),
                                status_code=400)
        loc = [str(p) for p in first["loc"] if p != "body"]
        param = ".".join(loc) or None
        msg = first["msg"].removeprefix("Value error, ")
        return JSONResponse(error_body(f"{param}: {msg}" if param else msg, param=param,
                                       code="invalid_value"), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return JSONResponse(error_body(str(e.detail), param=None, code=str(e.status_code)),
                            status_code=e.status_code, headers=getattr(e, "headers", None))
