"""What the OpenAI and the Ollama routes share: the model they serve (:class:`Served`: its
session, worker and prompter), the errors, request text to prompt tokens, the tool-call
set-up, and a queued job's events. The routes import this module, never each other; the
answer itself is :mod:`specli.serve.answer`'s."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from specli import toolcalls
from specli.constrain import Constraint
from specli.errors import NoChatTemplate, PromptTooLong, SpecliError
from specli.prompt import render_chat, tokenize_prompt
from specli.resolve import store_refs
from specli.serve.schemas import error_body
from specli.serve.worker import Event, Job, QueueFull, Worker
from specli.session import Session
from specli.speculate.loop import check_prompt_fits
from specli.toolcalls import Format, Tool
from specli.toolgrammar import Special, constraint_for, special_tokens


class APIError(Exception):
    """A request answered with an error: OpenAI's body (``body``), or Ollama's ``{"error":
    str(e)}`` on its routes."""

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
        self._special: Special | None = None

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

    def special(self) -> Special:
        """Which marker texts are special tokens of the model (llguidance's tokenizer, built once)."""
        if self._special is None:
            self._special = special_tokens(self.model)
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
    first = name or (session.profile.name if session.profile else store_refs.name_of(o.target) if o.target and
                     store_refs.is_ref(o.target) else os.path.basename(session.target.path).removesuffix(".gguf"))
    ids = [first, session.target.name, session.target.path, o.target, o.profile]
    return list(dict.fromkeys(i for i in ids if i))


@dataclass
class Served:
    """One model as the routes serve it: its session, the worker that generates on it, its
    prompter, and the names a request may give it (the first is the one it is listed under)."""

    session: Session
    worker: Worker
    prompter: Prompter
    ids: list[str]

    @property
    def name(self) -> str:
        return self.ids[0]

    @property
    def drafter(self) -> str:
        """The drafter its generations really use (with ``--parallel``, the slots')."""
        return self.worker.drafter


def tokens(fn, args: tuple, param: str) -> list[int]:
    """``fn(*args)``, a prompter's tokens; a prompt that does not fit or cannot be rendered is a 400."""
    try:
        return fn(*args)
    except PromptTooLong as e:
        raise APIError(400, f"{e}; shorten it or start the server with a larger --ctx", param=param,
                       code="context_length_exceeded") from None
    except SpecliError as e:
        raise APIError(400, str(e), param=param) from None


def checked(c: Constraint, param: str) -> Constraint:
    """``c``, once it compiles; else a 400 naming ``param``."""
    try:
        c.check()
    except SpecliError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None
    return c


def schema_constraint(schema: dict, param: str) -> Constraint:
    """A JSON schema's constraint (not compiled yet); a schema it cannot take is a 400 naming ``param``."""
    try:
        return Constraint.json_schema(schema)
    except SpecliError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def tool_setup(prompter: Prompter, tools: list[dict], history: bool, choice: str | dict = "auto",
               parallel: bool = True) -> tuple[Format | None, list[Tool] | None, Constraint | None]:
    """The tool-call format when the conversation involves tools (``tools`` offered, in
    OpenAI's shape, or calls and results in its ``history``), the tools the model is told of
    (none for ``choice`` ``none``: it cannot call them), and the constraint ``choice`` asks for."""
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: two tools have the same name", param="tools")
    if not names and not history:
        return None, None, None
    try:
        fmt = toolcalls.detect(prompter.template)
    except SpecliError as e:
        param = "tools" if names else "messages"
        raise APIError(400, f"{param}: {e}", param=param) from None
    offered = [Tool.from_openai(t) for t in tools]
    if choice == "none" or not offered:
        return fmt, None, None
    return fmt, offered, constraint_for(offered, choice, fmt, prompter.special(), parallel)


def submit(worker: Worker, job: Job) -> None:
    """Queue ``job``; a full queue is a 503 the client may retry."""
    try:
        worker.submit(job)
    except QueueFull as e:
        raise APIError(503, f"the server is busy ({e}); retry later", type="server_error",
                       code="queue_full", headers={"Retry-After": "1"}) from None


async def events(job: Job, request: Request) -> AsyncIterator[Event]:
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


def event_error(ev: Event) -> APIError:
    """A job's end that is not an answer, as the error the client gets."""
    if ev.kind == "cancelled":
        return APIError(503, "the generation was cancelled: the server is shutting down", type="server_error",
                        code="cancelled")
    if isinstance(ev.error, SpecliError):
        return APIError(400, str(ev.error))
    return APIError(500, f"generation failed: {type(ev.error).__name__}: {ev.error}", type="server_error")
