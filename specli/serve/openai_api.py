"""OpenAI's API under ``/v1``: ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/models``. A request is validated and tokenized on the event loop's side, then answered
through the shared path (:func:`specli.serve.answer.answer`), written as OpenAI writes an
answer: a ``chat.completion`` / ``text_completion``, or its server-sent chunks."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from specli.constrain import Constraint
from specli.resolve.catalog import UnknownModel
from specli.serve.answer import Outcome, answer
from specli.serve.directory import Directory, api_error, lease, within
from specli.serve.schemas import ChatRequest, CompletionRequest, NamedChoice, Reply, Sampling, usage
from specli.serve.shared import APIError, Prompter, checked, schema_constraint, tokens, tool_setup
from specli.serve.toolstream import ToolStream
from specli.serve.worker import Event, Job
from specli.speculate.loop import TokenLogprob
from specli.speculate.verify import SamplingParams
from specli.toolcalls import Format, Tool

DEFAULT_TEMPERATURE = 1.0  # OpenAI's, for a request that gives none


def _data(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIAnswer:
    """An answer as OpenAI writes it (:class:`specli.serve.answer.Shape`): server-sent chunks,
    the tool calls as deltas, the stats on the last chunk (or a usage chunk of their own when
    the client asked for one), then ``[DONE]``; or the whole body."""

    media_type = "text/event-stream"

    def __init__(self, reply: Reply, include_usage: bool = False):
        self.reply, self.include_usage = reply, include_usage

    def splitter(self, fmt: Format) -> ToolStream:
        return ToolStream(fmt)

    def opening(self) -> list[str]:
        return [_data(self.reply.chunk(None, first=True))] if self.reply.chat else []

    def part(self, text: str, calls: list[dict], logprobs: list[TokenLogprob] | None) -> list[str]:
        out = [_data(self.reply.chunk(text, logprobs=logprobs))] if text or logprobs else []
        return out + [_data(self.reply.chunk(None, tool_calls=[d])) for d in calls]  # one chunk each, as OpenAI

    def finished(self, end: Event, n_prompt: int, called: bool) -> list[str]:
        finish = "tool_calls" if called and end.finish == "stop" else end.finish
        use = usage(end.stats, n_prompt)
        last = _data(self.reply.chunk(None, finish, None if self.include_usage else use))
        return [last, _data(self.reply.chunk(None, use=use, no_choice=True))] if self.include_usage else [last]

    def failed(self, error: APIError) -> str:
        return _data(error.body)

    def closing(self) -> list[str]:
        return ["data: [DONE]\n\n"]

    def whole(self, out: Outcome, n_prompt: int) -> dict:
        finish = "tool_calls" if out.calls and out.end.finish == "stop" else out.end.finish
        return self.reply.whole(out.text if out.text or not out.calls else None, finish,
                                usage(out.end.stats, n_prompt), [c.openai() for c in out.calls], out.logprobs)


def make_router(d: Directory, auth: list, temperature: float | None = None) -> APIRouter:
    """OpenAI's endpoints over the models of ``d``; ``auth`` guards them all; ``temperature``
    is what a request that gives none gets (None: OpenAI's 1)."""
    temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    router = APIRouter(dependencies=auth)

    @router.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": await run_in_threadpool(d.openai_models)}

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict:
        try:
            return await run_in_threadpool(d.openai_model, model_id)
        except UnknownModel as e:
            raise api_error(e) from None

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs set to true", param="top_logprobs")
        use = await lease(d, body.model, request, d.default_keep_alive)

        async def go():
            prompter, name = use.served.prompter, use.served.name
            msgs = [m.as_dict() for m in body.messages]
            fmt, tools, constraint = await run_in_threadpool(_chat_tools, body, prompter)
            constraint = _one_constraint(body, constraint)
            toks = await run_in_threadpool(tokens, prompter.chat, (msgs, tools, fmt), "messages")
            limit = body.limit or max(1, prompter.n_ctx - len(toks))  # OpenAI: up to the context's end
            n_lp = (body.top_logprobs or 0) if body.logprobs else None
            job = _job(body, toks, limit, temperature, constraint, n_lp)
            return await answer(request, use.served.worker, job, _shape(body, Reply(True, name)), body.stream,
                                fmt if tools else None)

        return await within(d, use, go)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        use = await lease(d, body.model, request, d.default_keep_alive)

        async def go():
            constraint = _one_constraint(body, None)
            toks = await run_in_threadpool(tokens, use.served.prompter.raw, (body.prompt,), "prompt")
            job = _job(body, toks, body.limit, temperature, constraint, body.logprobs)
            return await answer(request, use.served.worker, job, _shape(body, Reply(False, use.served.name)),
                                body.stream)

        return await within(d, use, go)

    return router


def _job(body: Sampling, toks: list[int], limit: int, temperature: float, constraint: Constraint | None,
         n_logprobs: int | None) -> Job:
    t = body.temperature if body.temperature is not None else temperature
    params = SamplingParams(temperature=t, top_k=body.top_k, top_p=body.top_p, seed=body.seed)
    return Job(toks, params, limit, body.stops, constraint=constraint, logprobs=n_logprobs)


def _shape(body: Sampling, reply: Reply) -> OpenAIAnswer:
    return OpenAIAnswer(reply, bool(body.stream_options and body.stream_options.include_usage))


def _chat_tools(body: ChatRequest, prompter: Prompter) -> tuple[Format | None, list[Tool] | None,
                                                                 Constraint | None]:
    """:func:`~specli.serve.shared.tool_setup` for a chat request, once its ``tool_choice`` is
    checked against its tools."""
    names = [t.function.name for t in body.tools or []]
    choice = body.tool_choice
    if choice is not None and not names:
        raise APIError(400, "tool_choice: only allowed when tools are given", param="tool_choice")
    if isinstance(choice, NamedChoice) and choice.function.name not in names:
        raise APIError(400, f"tool_choice: names '{choice.function.name}', which is not among the tools "
                            f"({', '.join(names)})", param="tool_choice")
    history = any(m.tool_calls or m.role == "tool" for m in body.messages)
    named = choice.model_dump() if isinstance(choice, NamedChoice) else choice or "auto"
    return tool_setup(prompter, [t.model_dump(exclude_none=True) for t in body.tools or []], history, named,
                      body.parallel_tool_calls is not False)


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
        asked["response_format"] = schema_constraint(rf.json_schema.schema_ or {}, "response_format")
    if body.json_schema is not None:
        asked["json_schema"] = schema_constraint(body.json_schema, "json_schema")
    if body.grammar is not None:
        asked["grammar"] = Constraint.gbnf(body.grammar)
    if len(asked) > 1:
        raise APIError(400, f"{' and '.join(asked)} each constrain the answer; give one of them", param=list(asked)[1])
    if not asked:
        return None
    ((param, c),) = asked.items()
    return checked(c, param)
