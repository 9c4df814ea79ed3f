"""Ollama's HTTP API over the same Session and worker as the OpenAI one, so clients written
for Ollama (the ``ollama`` package, editors, chat front-ends) work unchanged against
``specli serve --port 11434``: ``/api/chat`` and ``/api/generate`` (NDJSON streaming by
default), ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, and ``/`` ("Ollama is
running"). Errors come back as Ollama gives them, ``{"error": "..."}``.

Every request field and option either does what Ollama does or gets a 400 naming it; the
few accepted without effect (``keep_alive``, load-time options) cannot change the text."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.concurrency import run_in_threadpool

from specli import __version__, toolcalls
from specli.constrain import Constraint
from specli.errors import SpecliError
from specli.resolve import integrity
from specli.resolve.hfcache import blob_sha256
from specli.serve.app import APIError, Prompter, _event_error, _events, _tokens
from specli.serve.worker import Event, Job, QueueFull, Worker
from specli.session import Session
from specli.speculate.verify import SamplingParams

# the Ollama API version these endpoints follow (clients gate features such as tools and
# structured outputs on it); specli's own version rides beside it
OLLAMA_VERSION = "0.12.0"
# Ollama's sampling defaults (its Modelfile documentation); num_predict -1: until the context is full
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# options accepted only at their neutral value: specli samples the model's own distribution
NEUTRAL = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
           "typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
# accepted and without effect on the text: the model is loaded once, when the server starts
# (--ctx, --threads, --gpu-layers), and no repetition penalty is applied (repeat_last_n,
# penalize_newline); num_keep only matters to Ollama's context shifting, which specli never does
LOAD_TIME = ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
             "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "repeat_last_n", "penalize_newline")


# -- request bodies ----------------------------------------------------------------------
class _Body(BaseModel):
    # unknown fields are refused: each may be something the client expects to change the output
    model_config = ConfigDict(strict=True, extra="forbid")


class Options(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    temperature: float | None = Field(None, ge=0.0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    num_predict: int | None = Field(None, ge=-2)
    num_ctx: int | None = Field(None, ge=1)
    stop: list[str] | None = None

    @model_validator(mode="after")
    def _known(self):
        extra = dict(self.model_extra or {})
        unknown = sorted(k for k in extra if k not in NEUTRAL and k not in LOAD_TIME)
        if unknown:
            raise ValueError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (specli serves "
                             "temperature, top_k, top_p, seed, num_predict, num_ctx, stop)")
        for k, neutral in NEUTRAL.items():
            v = extra.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v != neutral):
                raise ValueError(f"{k} {v!r} is not supported: specli samples the model's own distribution "
                                 f"(send {neutral} or leave it out)")
        return self

    @field_validator("num_predict")
    @classmethod
    def _predict(cls, v):
        if v == 0:
            raise ValueError("num_predict must be positive, -1 (until the context is full) or -2")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if v and any(not s for s in v):
            raise ValueError("stop sequences must not be empty")
        return v

    def sampling(self, temperature: float | None) -> SamplingParams:
        """Ollama's defaults where the request gives nothing; a negative seed is a random one."""
        t = self.temperature if self.temperature is not None else (
            temperature if temperature is not None else DEFAULTS["temperature"])
        return SamplingParams(temperature=t, top_k=DEFAULTS["top_k"] if self.top_k is None else self.top_k,
                              top_p=DEFAULTS["top_p"] if self.top_p is None else self.top_p,
                              seed=self.seed if self.seed is not None and self.seed >= 0 else None)


def _refused(why: str) -> AfterValidator:
    """For a field accepted only when empty: anything else is a 400 saying ``why``."""
    def check(v):
        if v:
            raise ValueError(why)
        return v
    return AfterValidator(check)


NO_LOGPROBS = "log-probabilities are not supported on Ollama's API yet"
NO_THINKING = "thinking is not supported: specli does not separate a model's thinking from its answer"


class _Request(_Body):
    model: str = Field(min_length=1)
    stream: bool = True
    format: Any = None  # "json" or a JSON schema
    options: Options | None = None
    keep_alive: Any = None  # a duration; the model stays loaded until the server stops whatever it says
    think: bool | str | None = None
    logprobs: Annotated[bool | None, _refused(NO_LOGPROBS)] = None
    top_logprobs: Annotated[int | None, _refused(NO_LOGPROBS)] = None

    @field_validator("format")
    @classmethod
    def _format(cls, v):
        if v not in (None, "", "json") and not isinstance(v, dict):
            raise ValueError('must be "json" or a JSON schema (an object)')
        return v

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, v):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
            raise ValueError('must be a duration: seconds, or a string such as "5m"')
        return v

    @field_validator("think")
    @classmethod
    def _no_thinking(cls, v):
        if v not in (None, False):
            raise ValueError(f"{NO_THINKING} (leave think out, or send false)")
        return v

    @property
    def opts(self) -> Options:
        return self.options or Options()


Images = Annotated[list[str] | None, _refused("images are not supported: the served model takes text only")]


class ToolFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: str
    arguments: dict[str, Any]
    index: int | None = None


class ToolCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    function: ToolFunction


class Message(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: Images = None
    thinking: Annotated[str | None, _refused(NO_THINKING)] = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None

    def as_dict(self) -> dict:
        """The message as a chat template expects it."""
        d: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [{"type": "function", "function": {"name": c.function.name,
                                                                 "arguments": c.function.arguments}}
                               for c in self.tool_calls]
        if self.tool_name:
            d["name"] = self.tool_name
        return d


class Function(_Body):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: Function


class ChatBody(_Request):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateBody(_Request):
    prompt: str | None = None
    system: str | None = None
    raw: bool = False
    images: Images = None
    suffix: Annotated[str | None, _refused("suffix (fill-in-the-middle) is not supported")] = None
    template: Annotated[str | None, _refused(
        "a template override is not supported: specli renders the GGUF's own chat template (or send raw: true "
        "with the prompt already formatted)")] = None
    context: Annotated[list[int] | None, _refused(
        "context (deprecated by Ollama) is not supported: send the conversation to /api/chat")] = None

    @model_validator(mode="after")
    def _raw_system(self):
        if self.raw and self.system:
            raise ValueError("system has no effect with raw: true; put it in the prompt")
        return self


# -- what /api/tags, /api/show and /api/ps say about the model -----------------------------
def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def _now() -> str:
    return _rfc3339(time.time())


def parameter_size(n: int) -> str:
    """Ollama's way of writing a parameter count: 1.5B, 494.03M."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            x = n / scale
            return f"{x:.0f}{unit}" if x == int(x) else f"{x:.1f}{unit}" if unit == "B" else f"{x:.2f}{unit}"
    return str(n)


def quantization_level(header) -> str:
    """The file type as Ollama names it (Q4_K_M, F16, ...), from ``general.file_type``."""
    from gguf import LlamaFileType
    ft = header.get("general.file_type")
    try:
        name = LlamaFileType(int(ft)).name
    except (TypeError, ValueError):
        return "unknown"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def file_digest(path: str) -> str:
    """The file's SHA-256: the Hub's blob name, or what specli verified before, else hashed once
    (seconds for GB files) and remembered beside the other verified files."""
    return blob_sha256(path) or integrity.cached_sha256(path)


def _plain(v: Any, verbose: bool) -> Any:
    """A header value as JSON; arrays (the vocabulary, merges) empty unless ``verbose``, as Ollama does."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return (v.tolist() if isinstance(v, np.ndarray) else list(v)) if verbose else []
    return v.item() if isinstance(v, np.generic) else v


def _tools_supported(template: str) -> bool:
    try:
        toolcalls.detect(template)
    except SpecliError:
        return False
    return True


class ModelCard:
    """The served model as Ollama's listing endpoints describe it, from the GGUF header."""

    def __init__(self, session: Session, ids: list[str]):
        self.session, self.ids = session, ids
        self.name = ids[0] if ":" in ids[0] else f"{ids[0]}:latest"
        h = self.header = session.target.header
        arch = h.architecture
        self.details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                        "parameter_size": parameter_size(h.n_params), "quantization_level": quantization_level(h)}
        self.path = session.target.path
        self.size = os.path.getsize(self.path)
        self.modified_at = _rfc3339(os.path.getmtime(self.path))
        self._digest: str | None = None

    def names(self) -> set[str]:
        """Every name a request may use: the served ones, with or without ``:latest``."""
        return {n for i in self.ids for n in (i, f"{i}:latest")}

    async def digest(self) -> str:
        if self._digest is None:
            self._digest = await run_in_threadpool(file_digest, self.path)
        return self._digest

    async def listed(self) -> dict:
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": await self.digest(), "details": self.details}

    async def running(self) -> dict:
        s = self.session
        layers = int(self.header.arch_key("block_count", 0) or 0)
        on_gpu = layers if s.target_gpu_layers < 0 else min(s.target_gpu_layers, layers)
        size_vram = self.size * on_gpu // layers if layers else 0
        # loaded until the server stops, whatever keep_alive said
        expires = _rfc3339(time.time() + timedelta(days=365 * 100).total_seconds())
        return {**await self.listed(), "expires_at": expires, "size_vram": size_vram,
                "context_length": s.ctx.n_ctx}

    def show(self, verbose: bool) -> dict:
        s = self.session
        info = {k: _plain(v, verbose) for k, v in self.header.metadata.items() if k != "tokenizer.chat_template"}
        template = s.target.chat_template() or ""
        caps = ["completion"] + (["tools"] if template and _tools_supported(template) else [])
        params = "\n".join(f"{k:<30} {v}" for k, v in [*DEFAULTS.items(), ("num_ctx", s.ctx.n_ctx)])
        draft = f"# draft: {os.path.basename(s.draft_path)}\n" if s.draft_path else ""
        return {"modelfile": f"# served by specli (drafter: {s.drafter.name})\n{draft}FROM {self.path}\n",
                "parameters": params, "template": template, "details": self.details, "model_info": info,
                "capabilities": caps, "modified_at": self.modified_at,
                "license": str(self.header.get("general.license", ""))}


# -- the answers ---------------------------------------------------------------------------
def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class Reply:
    """The objects of one answer: ``/api/chat`` messages or ``/api/generate`` responses."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
        self.t0 = time.perf_counter_ns()

    def part(self, text: str, calls: list[dict] | None = None) -> dict:
        body: dict = {"model": self.model, "created_at": _now()}
        if self.chat:
            body["message"] = {"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {})
        else:
            body["response"] = text
        body["done"] = False
        return body

    def loaded(self) -> dict:
        """The answer to an empty request, which Ollama clients send to load the model."""
        return self.part("") | {"done": True, "done_reason": "load"}

    def done(self, ev: Event, n_prompt: int, text: str = "", calls: list[dict] | None = None) -> dict:
        st = ev.stats
        return self.part(text, calls) | {
            "done": True, "done_reason": ev.finish,
            "total_duration": time.perf_counter_ns() - self.t0, "load_duration": 0,
            "prompt_eval_count": n_prompt, "prompt_eval_duration": _ns(st.t_prefill),
            "eval_count": st.generated, "eval_duration": _ns(st.t_generate),
            "specli": {"mode": st.mode, "drafted": st.drafted, "accepted": st.accepted,
                       "prompt_tokens_cached": st.prompt_tokens_cached}}


def _line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _call(c: toolcalls.ToolCall) -> dict:
    """A tool call as Ollama returns it: the arguments as an object."""
    return {"function": {"name": c.name, "arguments": c.arguments}}


class CallStream(toolcalls.OpeningStream):
    """A streamed answer as Ollama streams one: the content as it comes (text that may open a
    tool call held back until the next text decides), each call whole once it is complete."""

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """The content to send now, and the calls ``text`` completed."""
        out = self.content(text)
        if not self.opened:
            return out, []
        end = self.fmt.complete(self.buf)
        if not end:
            return out, []
        content, calls = toolcalls.parse(self.buf[:end], self.fmt)
        self.buf = self.buf[end:]
        return out + content, [_call(c) for c in calls]

    def flush(self) -> tuple[str, list[dict]]:
        """The rest at the end (a call cut short stays text)."""
        content, calls = toolcalls.parse(self.buf, self.fmt)
        self.buf = ""
        return content, [_call(c) for c in calls]


async def _ndjson(events: AsyncIterator[Event], reply: Reply, n_prompt: int,
                  fmt: toolcalls.Format | None) -> AsyncIterator[str]:
    calls = CallStream(fmt) if fmt is not None else None
    async with aclosing(events):
        async for ev in events:
            if ev.kind == "text":
                text, made = calls.feed(ev.text) if calls else (ev.text, [])
                if text or made:
                    yield _line(reply.part(text, made))
            elif ev.kind == "done":
                text, made = calls.flush() if calls else ("", [])
                if text or made:
                    yield _line(reply.part(text, made))
                yield _line(reply.done(ev, n_prompt))
            else:
                yield _line({"error": str(_event_error(ev))})


def _format(fmt: Any) -> Constraint | None:
    """``format``: "json" (any JSON object) or a JSON schema, as a constraint."""
    if not fmt:
        return None
    try:
        c = Constraint.json_object() if fmt == "json" else Constraint.json_schema(fmt)
        c.check()
    except SpecliError as e:
        raise APIError(400, f"format: {e}") from None
    return c


def _tools(body: ChatBody, prompter: Prompter) -> tuple[toolcalls.Format | None, list[toolcalls.Tool] | None,
                                                         Constraint | None]:
    """The tool-call format when the conversation involves tools, the tools offered, and the
    constraint for their calls (Ollama lets the model choose: a call is constrained to its
    function's parameters once the model opens one)."""
    names = [t.function.name for t in body.tools or []]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: two tools have the same name")
    if not names and not any(m.tool_calls or m.role == "tool" for m in body.messages):
        return None, None, None
    try:
        fmt = toolcalls.detect(prompter.template)
    except SpecliError as e:
        raise APIError(400, f"{'tools' if names else 'messages'}: {e}") from None
    if not names:
        return fmt, None, None
    tools = [toolcalls.Tool.from_openai(t.model_dump(exclude_none=True)) for t in body.tools]
    c = toolcalls.constraint_for(tools, "auto", fmt, prompter.special())
    try:
        c.check()
    except SpecliError as e:
        raise APIError(400, f"tools: {e}") from None
    return fmt, tools, c


def _message(errors: list) -> str:
    """One line for the first problem pydantic found in a body, naming the field."""
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"invalid JSON: {first['ctx']['error']}"
    field = ".".join(str(p) for p in first["loc"])
    msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    return f"{field}: {msg}" if field else msg


async def _parse(request: Request, cls: type[BaseModel]):
    """The request's body as ``cls``, whatever its content type says (Ollama reads JSON from
    ``curl -d``, which sends a form content type)."""
    try:
        return cls.model_validate_json(await request.body())
    except ValidationError as e:
        raise APIError(400, _message(e.errors())) from None


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


class ShowBody(_Body):
    model: str = Field(min_length=1)
    verbose: bool = False


def make_router(session: Session, worker: Worker, prompter: Prompter, ids: list[str], auth: list,
                temperature: float | None = None) -> APIRouter:
    """Ollama's endpoints over the app's worker; ``auth`` guards all but ``/`` and
    ``/api/version``; ``temperature`` is what a request that gives none gets (None: Ollama's 0.8)."""
    card = ModelCard(session, ids)
    names = card.names()
    router = APIRouter(route_class=_Route)

    def check_model(name: str) -> None:
        if name not in names:
            raise APIError(404, f"model '{name}' not found; this server serves '{card.name}'")

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
        check_model(body.model)
        return card.show(body.verbose)

    @router.post("/api/chat", dependencies=auth)
    async def chat(request: Request):
        body = await _parse(request, ChatBody)
        reply = Reply(body.model, chat=True)
        check_model(body.model)
        if not body.messages:
            return _single(reply.loaded(), body.stream)
        fmt, tools, constraint = await run_in_threadpool(_tools, body, prompter)
        if constraint is not None and body.format:
            raise APIError(400, "format: tools and format each constrain the answer; give one of them")
        msgs = [m.as_dict() for m in body.messages]
        toks = await run_in_threadpool(_tokens, prompter.chat, (msgs, tools, fmt), "messages")
        return await answer(request, body, toks, reply, constraint, fmt if tools else None)

    @router.post("/api/generate", dependencies=auth)
    async def generate(request: Request):
        body = await _parse(request, GenerateBody)
        reply = Reply(body.model, chat=False)
        check_model(body.model)
        if not body.prompt:
            return _single(reply.loaded(), body.stream)
        if body.raw or not prompter.template:
            if body.system:
                raise APIError(400, f"system: {session.target.name} has no chat template to put it in; "
                                    "put it in the prompt")
            toks = await run_in_threadpool(_tokens, prompter.raw, (body.prompt,), "prompt")
        else:
            msgs = [{"role": "system", "content": body.system}] if body.system else []
            msgs.append({"role": "user", "content": body.prompt})
            toks = await run_in_threadpool(_tokens, prompter.chat, (msgs,), "prompt")
        return await answer(request, body, toks, reply)

    @router.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "HEAD"], include_in_schema=False)
    async def not_served(rest: str, request: Request):
        raise APIError(404, f"{request.method} /api/{rest} is not served: specli serves one model, loaded when it "
                            "started (it serves /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version)")

    async def answer(request: Request, body: _Request, toks: list[int], reply: Reply,
                     constraint: Constraint | None = None, fmt: toolcalls.Format | None = None):
        """Queue the generation and answer, whole or streamed; with ``fmt`` (tools offered) the
        text is parsed for the model's tool calls."""
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
        job = Job(toks, o.sampling(temperature), limit, list(o.stop or []), constraint=constraint)
        try:
            worker.submit(job)
        except QueueFull as e:
            raise APIError(503, f"the server is busy ({e}); retry later", headers={"Retry-After": "1"}) from None
        events = _events(job, request)
        if body.stream:
            return StreamingResponse(_ndjson(events, reply, len(toks), fmt), media_type="application/x-ndjson",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        pieces: list[str] = []
        async with aclosing(events):
            async for ev in events:
                if ev.kind == "text":
                    pieces.append(ev.text)
                elif ev.kind == "done":
                    text, calls = toolcalls.parse("".join(pieces), fmt) if fmt else ("".join(pieces), [])
                    return reply.done(ev, len(toks), text, [_call(c) for c in calls])
                else:
                    raise _event_error(ev)
        raise APIError(499, "client closed the request")  # nobody reads this

    return router


def _single(obj: dict, stream: bool) -> Response:
    """One object, as one NDJSON line when the client asked for a stream."""
    if stream:
        return Response(_line(obj), media_type="application/x-ndjson")
    return JSONResponse(obj)
