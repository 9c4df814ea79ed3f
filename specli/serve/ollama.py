"""Ollama's HTTP API over the same model and worker as the OpenAI one, so clients written for
Ollama (the ``ollama`` package, editors, chat front-ends) work unchanged against ``specli serve
--port 11434``: ``/api/chat`` and ``/api/generate`` (NDJSON streaming by default),
``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, and ``/`` ("Ollama is running").
Errors come back as Ollama gives them, ``{"error": "..."}``. The bodies are
:mod:`~specli.serve.ollama_schemas`', the model card :mod:`~specli.serve.ollama_card`'s, the
answers :mod:`~specli.serve.ollama_reply`'s, through the shared path of
:mod:`specli.serve.answer`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from specli import __version__
from specli.constrain import Constraint
from specli.errors import SpecliError
from specli.serve.answer import answer
from specli.serve.ollama_card import ModelCard
from specli.serve.ollama_reply import OllamaAnswer, Reply, single
from specli.serve.ollama_schemas import AnswerBody, ChatBody, GenerateBody, ShowBody, error_line
from specli.serve.shared import APIError, Prompter, Served, checked, tokens, tool_setup
from specli.serve.worker import Job
from specli.toolcalls import Format

# the Ollama API version these endpoints follow (clients gate features such as tools and
# structured outputs on it); specli's own version rides beside it
OLLAMA_VERSION = "0.12.0"
SERVED = "/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version"


def _format(fmt: Any) -> Constraint | None:
    """``format``: "json" (any JSON object) or a JSON schema, as a constraint."""
    if not fmt:
        return None
    try:
        c = Constraint.json_object() if fmt == "json" else Constraint.json_schema(fmt)
    except SpecliError as e:
        raise APIError(400, f"format: {e}") from None
    return checked(c, "format")


async def _parse(request: Request, cls: type[BaseModel]):
    """The request's body as ``cls``, whatever its content type says (Ollama reads JSON from
    ``curl -d``, which sends a form content type)."""
    try:
        return cls.model_validate_json(await request.body())
    except ValidationError as e:
        raise APIError(400, error_line(e.errors())) from None


class _Route(APIRoute):
    """Every failure of an Ollama endpoint (a bad body, a wrong key, a busy server) answered
    in Ollama's error shape."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as e:
                return JSONResponse({"error": str(e)}, status_code=e.status, headers=e.headers)

        return route


def make_router(served: Served, auth: list, temperature: float | None = None) -> APIRouter:
    """Ollama's endpoints over ``served``; ``auth`` guards all but ``/`` and ``/api/version``;
    ``temperature`` is what a request that gives none gets (None: Ollama's 0.8)."""
    card = ModelCard(served)
    router = APIRouter(route_class=_Route)
    _listing(router, card, auth)
    _answering(router, served, card, auth, temperature)

    @router.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "HEAD"], include_in_schema=False)
    async def not_served(rest: str, request: Request):
        raise APIError(404, f"{request.method} /api/{rest} is not served: specli serves one model, loaded when it "
                            f"started (it serves {SERVED})")

    return router


def _check_model(card: ModelCard, name: str) -> None:
    if name not in card.names():
        raise APIError(404, f"model '{name}' not found; this server serves '{card.name}'")


def _listing(router: APIRouter, card: ModelCard, auth: list) -> None:
    """``/``, ``/api/version``, and what the model is: ``/api/tags``, ``/api/ps``, ``/api/show``."""

    @router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def running() -> PlainTextResponse:
        return PlainTextResponse("Ollama is running")

    @router.get("/api/version")
    async def version() -> dict:
        return {"version": OLLAMA_VERSION, "specli": __version__}

    @router.get("/api/tags", dependencies=auth)
    async def tags() -> dict:
        return {"models": [await card.listed()]}

    @router.get("/api/ps", dependencies=auth)
    async def ps() -> dict:
        return {"models": [await card.running()]}

    @router.post("/api/show", dependencies=auth)
    async def show(request: Request) -> dict:
        body = await _parse(request, ShowBody)
        _check_model(card, body.model)
        return card.show(body.verbose)


def _answering(router: APIRouter, served: Served, card: ModelCard, auth: list, temperature: float | None) -> None:
    """``/api/chat`` and ``/api/generate``, through the shared answering path."""
    prompter = served.prompter

    async def respond(request: Request, body: AnswerBody, toks: list[int], reply: Reply,
                      constraint: Constraint | None = None, fmt: Format | None = None):
        job = _job(body, toks, prompter, temperature, constraint)
        return await answer(request, served.worker, job, OllamaAnswer(reply), body.stream, fmt)

    @router.post("/api/chat", dependencies=auth)
    async def chat(request: Request):
        body = await _parse(request, ChatBody)
        reply = Reply(body.model, chat=True)
        _check_model(card, body.model)
        if not body.messages:
            return single(reply.loaded(), body.stream)
        fmt, tools, constraint = await run_in_threadpool(_tools, body, prompter)
        if constraint is not None and body.format:
            raise APIError(400, "format: tools and format each constrain the answer; give one of them")
        msgs = [m.as_dict() for m in body.messages]
        toks = await run_in_threadpool(tokens, prompter.chat, (msgs, tools, fmt), "messages")
        return await respond(request, body, toks, reply, constraint, fmt if tools else None)

    @router.post("/api/generate", dependencies=auth)
    async def generate(request: Request):
        body = await _parse(request, GenerateBody)
        reply = Reply(body.model, chat=False)
        _check_model(card, body.model)
        if not body.prompt:
            return single(reply.loaded(), body.stream)
        toks = await run_in_threadpool(_generate_tokens, body, served)
        return await respond(request, body, toks, reply)


def _tools(body: ChatBody, prompter: Prompter) -> tuple[Format | None, list | None, Constraint | None]:
    """The tool-call set-up (:func:`~specli.serve.shared.tool_setup`): Ollama lets the model
    choose, a call constrained to its function's parameters once the model opens one."""
    history = any(m.tool_calls or m.role == "tool" for m in body.messages)
    fmt, tools, c = tool_setup(prompter, [t.model_dump(exclude_none=True) for t in body.tools or []], history)
    return fmt, tools, checked(c, "tools") if c is not None else None


def _generate_tokens(body: GenerateBody, served: Served) -> list[int]:
    """``/api/generate``'s prompt: as it is (``raw``, or a model without a chat template), else
    as the user's message after the system one, through the chat template."""
    prompter = served.prompter
    if body.raw or not prompter.template:
        if body.system:
            raise APIError(400, f"system: {served.session.target.name} has no chat template to put it in; "
                                "put it in the prompt")
        return tokens(prompter.raw, (body.prompt,), "prompt")
    msgs = [{"role": "system", "content": body.system}] if body.system else []
    msgs.append({"role": "user", "content": body.prompt})
    return tokens(prompter.chat, (msgs,), "prompt")


def _job(body: AnswerBody, toks: list[int], prompter: Prompter, temperature: float | None,
         constraint: Constraint | None) -> Job:
    """The generation a request asks for, its options checked against the loaded context."""
    o = body.opts
    if body.think is False and "enable_thinking" in (prompter.template or ""):
        raise APIError(400, "think: false cannot be honoured: this model's chat template thinks unless told "
                            "otherwise, and specli does not switch it off (leave think out)")
    n_ctx = prompter.n_ctx
    if o.num_ctx is not None:
        if o.num_ctx > n_ctx:
            raise APIError(400, f"options.num_ctx: {o.num_ctx} is more than the context this server loaded "
                                f"({n_ctx} tokens); restart specli serve with --ctx {o.num_ctx}")
        n_ctx = o.num_ctx
        if len(toks) >= n_ctx:
            raise APIError(400, f"options.num_ctx: the prompt is {len(toks)} tokens, longer than the context "
                                f"asked for ({n_ctx} tokens)")
    constraint = constraint or _format(body.format)
    room = n_ctx - len(toks)
    limit = min(o.num_predict, room) if o.num_predict and o.num_predict > 0 else room
    return Job(toks, o.sampling(temperature), limit, list(o.stop or []), constraint=constraint)
