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
from specli.resolve.catalog import UnknownModel
from specli.serve.answer import answer
from specli.serve.directory import Directory, Use, api_error, keep_alive, lease, within
from specli.serve.ollama_pull import add_pull
from specli.serve.ollama_reply import OllamaAnswer, Reply, single
from specli.serve.ollama_schemas import AnswerBody, ChatBody, GenerateBody, ShowBody, error_line
from specli.serve.shared import APIError, Prompter, Served, checked, tokens, tool_setup
from specli.serve.worker import Job
from specli.toolcalls import Format

# the Ollama API version these endpoints follow (clients gate features such as tools and
# structured outputs on it); specli's own version rides beside it
OLLAMA_VERSION = "0.12.0"
SERVED = "/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version"
WRITES = {"delete": "remove a model with the tool that stored it, e.g. ollama rm",
          "create": "create models with ollama create", "copy": "copy models with ollama cp",
          "push": "push models with ollama push", "blobs": "upload blobs with ollama create"}


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


def make_router(d: Directory, auth: list, temperature: float | None = None) -> APIRouter:
    """Ollama's endpoints over the models of ``d``; ``auth`` guards all but ``/`` and
    ``/api/version``; ``temperature`` is what a request that gives none gets (None: Ollama's 0.8)."""
    router = APIRouter(route_class=_Route)
    _listing(router, d, auth)
    _answering(router, d, auth, temperature)
    if d.pulls:  # a pulled model is served only where every model on disk is
        add_pull(router, auth, _parse)
    _refusing(router, auth)
    return router


def _refusing(router: APIRouter, auth: list) -> None:
    """What specli does not do: write into a store, or an endpoint it does not serve."""

    @router.api_route("/api/{what}", methods=["POST", "DELETE"], dependencies=auth, include_in_schema=False)
    async def writes(what: str, request: Request):
        if what not in WRITES:
            raise APIError(404, f"{request.method} /api/{what} is not served (specli serves {SERVED})")
        raise APIError(403, f"/api/{what} is refused: specli never writes into another tool's model store "
                            f"({WRITES[what]})")

    @router.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "HEAD"], include_in_schema=False)
    async def not_served(rest: str, request: Request):
        raise APIError(404, f"{request.method} /api/{rest} is not served (specli serves {SERVED})")


def _listing(router: APIRouter, d: Directory, auth: list) -> None:
    """``/``, ``/api/version``, and what the models are: ``/api/tags``, ``/api/ps``, ``/api/show``."""

    @router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def running() -> PlainTextResponse:
        return PlainTextResponse("Ollama is running")

    @router.get("/api/version")
    async def version() -> dict:
        return {"version": OLLAMA_VERSION, "specli": __version__}

    @router.get("/api/tags", dependencies=auth)
    async def tags() -> dict:
        return {"models": await d.tags()}

    @router.get("/api/ps", dependencies=auth)
    async def ps() -> dict:
        return {"models": await d.running()}

    @router.post("/api/show", dependencies=auth)
    async def show(request: Request) -> dict:
        body = await _parse(request, ShowBody)
        try:
            return await d.show(body.model, body.verbose)
        except SpecliError as e:
            raise api_error(e) from None


def _answering(router: APIRouter, d: Directory, auth: list, temperature: float | None) -> None:
    """``/api/chat`` and ``/api/generate``, through the shared answering path."""

    async def respond(request: Request, body: AnswerBody, use: Use, toks: list[int], reply: Reply,
                      constraint: Constraint | None = None, fmt: Format | None = None):
        job = _job(body, toks, use.served.prompter, temperature, constraint)
        return await answer(request, use.served.worker, job, OllamaAnswer(reply), body.stream, fmt)

    async def empty(request: Request, body: AnswerBody, reply: Reply, keep: float | None):
        """No prompt: load the model (``keep_alive: 0``: unload it)."""
        if keep == 0:
            try:
                await d.unload(body.model)
            except UnknownModel as e:
                raise api_error(e) from None
            return single(reply.unloaded(), body.stream)
        use = await lease(d, body.model, request, keep)
        await run_in_threadpool(d.release, use)
        return single(reply.loaded(use.load_duration), body.stream)

    @router.post("/api/chat", dependencies=auth)
    async def chat(request: Request):
        body = await _parse(request, ChatBody)
        reply = Reply(body.model, chat=True)
        keep = keep_alive(body.keep_alive, d.default_keep_alive)
        if not body.messages:
            return await empty(request, body, reply, keep)
        use = await lease(d, body.model, request, keep)
        reply.load_duration = use.load_duration

        async def go():
            prompter = use.served.prompter
            fmt, tools, constraint = await run_in_threadpool(_tools, body, prompter)
            if constraint is not None and body.format:
                raise APIError(400, "format: tools and format each constrain the answer; give one of them")
            msgs = [m.as_dict() for m in body.messages]
            toks = await run_in_threadpool(tokens, prompter.chat, (msgs, tools, fmt), "messages")
            return await respond(request, body, use, toks, reply, constraint, fmt if tools else None)

        return await within(d, use, go)

    @router.post("/api/generate", dependencies=auth)
    async def generate(request: Request):
        body = await _parse(request, GenerateBody)
        reply = Reply(body.model, chat=False)
        keep = keep_alive(body.keep_alive, d.default_keep_alive)
        if not body.prompt:
            return await empty(request, body, reply, keep)
        use = await lease(d, body.model, request, keep)
        reply.load_duration = use.load_duration

        async def go():
            toks = await run_in_threadpool(_generate_tokens, body, use.served)
            return await respond(request, body, use, toks, reply)

        return await within(d, use, go)


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
