"""The OpenAI-compatible HTTP API over one Session (FastAPI): ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``, ``/health``. Requests are validated and tokenized on
the event loop's side; the :class:`~specli.serve.worker.Worker` thread generates."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from specli import toolcalls
from specli.constrain import Constraint
from specli.errors import NoChatTemplate, PromptTooLong, SpecliError
from specli.prompt import render_chat, tokenize_prompt
from specli.resolve import stores
from specli.serve.schemas import (
    ChatRequest,
    CompletionRequest,
    NamedChoice,
    Reply,
    Sampling,
    error_body,
    usage,
)
from specli.serve.worker import Event, Job, QueueFull, Worker, make_worker
from specli.session import Session
from specli.speculate.loop import check_prompt_fits
from specli.speculate.verify import SamplingParams
from specli.toolcalls import Format, Tool, ToolStream


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
        self._special: toolcalls.Special | None = None

    def chat(self, messages: list[dict], tools: list[Tool] | None = None, fmt: Format | None = None) -> list[int]:
        """The conversation through the chat template; with ``fmt``, tool calls, tool results
        and the offered ``tools`` as that tool-call format renders them."""
        if not self.template:
            raise NoChatTemplate(self.model.name)
        if fmt is None:
            text = render_chat(self.template, messages, self.bos, self.eos)
        else:
            text = toolcalls.render(self.template, messages, tools, fmt, self.bos, self.eos)
        return self._fits(tokenize_prompt(self.model, text, templated=True))

    def special(self) -> toolcalls.Special:
        """Which marker texts are special tokens of the model (llguidance's tokenizer, built once)."""
        if self._special is None:
            self._special = toolcalls.special_tokens(self.model)
        return self._special

    def raw(self, prompt: str | list[str] | list[int]) -> list[int]:
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
    first = name or (session.profile.name if session.profile else stores.name_of(o.target) if o.target and
                     stores.is_ref(o.target) else os.path.basename(session.target.path).removesuffix(".gguf"))
    ids = [first, session.target.name, session.target.path, o.target, o.profile]
    return list(dict.fromkeys(i for i in ids if i))


def create_app(session: Session, name: str | None = None, api_key: str | None = None,
               queue: int = 8, temperature: float | None = None) -> FastAPI:
    """The API over ``session`` (the caller closes it): OpenAI's under /v1, Ollama's under
    /api. ``temperature`` is what a request that gives none gets (None: each API's own
    default, OpenAI's 1 and Ollama's 0.8)."""
    from specli.serve.ollama import make_router
    worker = make_worker(session, queue)
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
        return {"status": "ok", "model": ids[0], "mode": session.draft.mode.name, **worker.status()}

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
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs set to true", param="top_logprobs")
        msgs = [m.as_dict() for m in body.messages]
        fmt, tools, constraint = await run_in_threadpool(_chat_tools, body, prompter)
        constraint = _one_constraint(body, constraint)
        toks = await run_in_threadpool(_tokens, prompter.chat, (msgs, tools, fmt), "messages")
        limit = body.limit or max(1, prompter.n_ctx - len(toks))  # OpenAI: up to the context's end
        n_lp = (body.top_logprobs or 0) if body.logprobs else None
        return await _answer(request, worker, Reply(True, ids[0]), body, toks, limit, temperature, constraint, n_lp,
                             fmt if tools else None)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body.model, ids)
        constraint = _one_constraint(body, None)
        toks = await run_in_threadpool(_tokens, prompter.raw, (body.prompt,), "prompt")
        return await _answer(request, worker, Reply(False, ids[0]), body, toks, body.limit, temperature, constraint,
                             body.logprobs)

    return app


def _chat_tools(body: ChatRequest, prompter: Prompter) -> tuple[Format | None, list[Tool] | None,
                                                                 Constraint | None]:
    """The tool-call format when the conversation involves tools, the tools offered to the model
    (none for ``tool_choice: none``: the model is not told of them, so it cannot call them), and
    the constraint ``tool_choice`` asks for."""
    names = [t.function.name for t in body.tools or []]
    choice = body.tool_choice
    if choice is not None and not names:
        raise APIError(400, "tool_choice: only allowed when tools are given", param="tool_choice")
    if isinstance(choice, NamedChoice) and choice.function.name not in names:
        raise APIError(400, f"tool_choice: names '{choice.function.name}', which is not among the tools "
                            f"({', '.join(names)})", param="tool_choice")
    if len(set(names)) != len(names):
        raise APIError(400, "tools: two tools have the same name", param="tools")
    history = any(m.tool_calls or m.role == "tool" for m in body.messages)
    if not names and not history:
        return None, None, None
    try:
        fmt = toolcalls.detect(prompter.template)
    except SpecliError as e:
        param = "tools" if names else "messages"
        raise APIError(400, f"{param}: {e}", param=param) from None
    tools = [Tool.from_openai(t.model_dump(exclude_none=True)) for t in body.tools or []]
    choice = choice or "auto"
    if choice == "none" or not tools:
        return fmt, None, None
    named = choice.model_dump() if isinstance(choice, NamedChoice) else choice
    parallel = body.parallel_tool_calls is not False
    return fmt, tools, toolcalls.constraint_for(tools, named, fmt, prompter.special(), parallel)


def _one_constraint(body: Sampling, tools: Constraint | None) -> Constraint | None:
    """The constraint a request asks for: tool calls, ``response_format``, or llama-server's
    ``json_schema`` / ``grammar``; at most one of them."""
    asked: dict[str, Constraint] = {}
    if tools is not None:
        asked["tools"] = tools
    rf = getattr(body, "response_format", None)
    if rf is not None and rf.type == "json_object":
        asked["response_format"] = Constraint.json_object()
    elif rf is not None and rf.type == "json_schema":
        asked["response_format"] = _schema(rf.json_schema.schema_ or {}, "response_format")
    if body.json_schema is not None:
        asked["json_schema"] = _schema(body.json_schema, "json_schema")
    if body.grammar is not None:
        asked["grammar"] = Constraint.gbnf(body.grammar)
    if len(asked) > 1:
        raise APIError(400, f"{' and '.join(asked)} each constrain the answer; give one of them", param=list(asked)[1])
    if not asked:
        return None
    ((param, c),) = asked.items()
    _check(c, param)
    return c


def _schema(schema: dict, param: str) -> Constraint:
    try:
        return Constraint.json_schema(schema)
    except SpecliError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def _check(c: Constraint, param: str) -> None:
    try:
        c.check()
    except SpecliError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def _tokens(fn, args: tuple, param: str) -> list[int]:
    try:
        return fn(*args)
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
                  temperature: float, constraint: Constraint | None = None, n_logprobs: int | None = None,
                  fmt: Format | None = None):
    """Queue the generation and answer: whole, or streamed. With ``fmt`` (tools offered) the
    text is parsed for the model's tool calls."""
    t = body.temperature if body.temperature is not None else temperature
    params = SamplingParams(temperature=t, top_k=body.top_k, top_p=body.top_p, seed=body.seed)
    job = Job(toks, params, limit, body.stops, constraint=constraint, logprobs=n_logprobs)
    try:
        worker.submit(job)
    except QueueFull as e:
        raise APIError(503, f"the server is busy ({e}); retry later", type="server_error",
                       code="queue_full", headers={"Retry-After": "1"}) from None
    events = _events(job, request)
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(events, reply, len(toks), include, fmt), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    pieces: list[str] = []
    lps: list | None = None if n_logprobs is None else []
    async with aclosing(events):
        async for ev in events:
            if ev.kind == "text":
                pieces.append(ev.text)
                if lps is not None:
                    lps.extend(ev.logprobs or [])
            elif ev.kind == "done":
                text, calls = "".join(pieces), []
                if fmt is not None:
                    text, calls = toolcalls.parse(text, fmt)
                finish = "tool_calls" if calls and ev.finish == "stop" else ev.finish
                return reply.whole(text if text or not calls else None, finish, usage(ev.stats, len(toks)),
                                   [c.openai() for c in calls], lps)
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


async def _sse(events: AsyncIterator[Event], reply: Reply, n_prompt: int, include_usage: bool,
               fmt: Format | None = None):
    def data(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    calls = ToolStream(fmt) if fmt is not None else None
    if reply.chat:
        yield data(reply.chunk(None, first=True))
    async for ev in events:
        if ev.kind == "text":
            if calls is None:
                yield data(reply.chunk(ev.text, logprobs=ev.logprobs))
                continue
            text, deltas = calls.feed(ev.text)
            if text or ev.logprobs:
                yield data(reply.chunk(text, logprobs=ev.logprobs))
            for d in deltas:  # one chunk each, as OpenAI sends them
                yield data(reply.chunk(None, tool_calls=[d]))
        elif ev.kind == "done":
            finish = ev.finish
            if calls is not None:
                text, deltas = calls.flush()
                if text:
                    yield data(reply.chunk(text))
                for d in deltas:
                    yield data(reply.chunk(None, tool_calls=[d]))
                finish = "tool_calls" if calls.n_calls and finish == "stop" else finish
            use = usage(ev.stats, n_prompt)
            # the stats ride on the last chunk; a separate usage chunk when the client asked for one
            yield data(reply.chunk(None, finish, None if include_usage else use))
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
        errs = e.errors()
        if errs[0]["type"] == "json_invalid":
            first = errs[0]
            return JSONResponse(error_body(f"invalid JSON: {first.get('ctx', {}).get('error', first['msg'])}"),
                                status_code=400)
        # a union's members each report; the member the value was meant for says most
        first = next((x for x in errs if not x["type"].endswith("_type")), errs[0])
        param = _param(first["loc"], e.body) or None
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = "unknown field: this server does not implement it (nothing is ignored silently)"
        return JSONResponse(error_body(f"{param}: {msg}" if param else msg, param=param,
                                       code="invalid_value"), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return JSONResponse(error_body(str(e.detail), param=None, code=str(e.status_code)),
                            status_code=e.status_code, headers=getattr(e, "headers", None))


def _param(loc: tuple, body) -> str:
    """The dotted path of the field an error is about, as the client wrote it: pydantic's
    union member names (``str``, ``list[Part]``) in the path are left out."""
    out, cur = [], body
    for i, p in enumerate(p for p in loc if p != "body"):
        if isinstance(cur, dict) and p in cur or isinstance(cur, list) and isinstance(p, int) and p < len(cur):
            out.append(str(p))
            cur = cur[p]
        elif i == len(loc) - 1 - ("body" in loc) and isinstance(cur, dict):
            out.append(p)  # a missing field
    return ".".join(out)
