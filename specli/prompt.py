"""Turn user text into prompt tokens: the GGUF's own chat template (rendered in a Jinja
sandbox, as llama.cpp and transformers render it) or the raw text."""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specli.engine import Model
from specli.errors import NoChatTemplate, SpecliError

if TYPE_CHECKING:
    from specli.measure.suite import SuitePrompt


def _raise(msg):
    raise TemplateError(msg)


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    """transformers' ``tojson`` for chat templates: keys in their order, no HTML escaping
    (jinja2's own sorts keys and escapes ``<``, which would change a tool's description)."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def render_chat(template: str, messages: list[dict], bos: str = "", eos: str = "",
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """``messages`` through the chat template; ``tools`` (OpenAI's tool definitions) go to
    templates that describe tools themselves."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    extra = {"tools": tools} if tools is not None else {}
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos, eos_token=eos, **extra)
    except TemplateError as e:
        raise NoChatTemplate("the model", str(e)) from None


def chat_text(model: Model, messages: list[dict], add_generation_prompt: bool = True) -> str:
    tmpl = model.chat_template()
    if not tmpl:
        raise NoChatTemplate(model.name)
    return render_chat(tmpl, messages, model.detokenize([model.bos], special=True) if model.bos >= 0 else "",
                       model.detokenize([model.eos], special=True) if model.eos >= 0 else "",
                       add_generation_prompt)


def tokenize_prompt(model: Model, text: str, templated: bool) -> list[int]:
    """Tokens for the prompt. A template that writes the BOS text itself does not get a second BOS."""
    toks = model.tokenize(text, add_special=True, parse_special=templated)
    if len(toks) >= 2 and toks[0] == toks[1] == model.bos:
        toks = toks[1:]
    return toks


def build_prompt(model: Model, text: str, chat: bool, system: str | None = None) -> list[int]:
    if not chat:
        return tokenize_prompt(model, text, templated=False)
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tokenize_prompt(model, chat_text(model, msgs), templated=True)


def prompt_tokens(model: Model, p: SuitePrompt, chat: bool) -> list[int]:
    """Tokens for a suite prompt: its text as ``build_prompt`` makes it, or its whole
    conversation (``messages``) rendered with the model's chat template."""
    if not p.messages:
        return build_prompt(model, p.text, chat)
    if not chat:
        why = f"{model.name} has no chat template" if model.chat_template() is None else "chat formatting is off"
        raise SpecliError(f"prompt '{p.id}' is a conversation ('messages') and needs the model's chat template, "
                          f"but {why}")
    msgs = [{"role": role, "content": content} for role, content in p.messages]
    return tokenize_prompt(model, chat_text(model, msgs), templated=True)
