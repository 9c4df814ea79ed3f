"""Tool calls constrained to their functions' parameter schemas: the Lark grammar (llguidance)
each tool-call format's answer follows, so a call's arguments always parse. The formats
themselves (how the prompt shows the tools, how an answer is parsed) are
:mod:`specli.toolcalls`'."""

from __future__ import annotations

import json
from collections.abc import Callable

from specli.constrain import JSON_OPTIONS, Constraint, tokenizer_for
from specli.toolcalls import Format, Llama3, Mistral, Tool

# a marker's text -> its token id when the vocabulary has it as one special token, else None
Special = Callable[[str], "int | None"]

TEXT = "TEXT: /(.|\\n)*/"


def _json(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _lit(text: str, special: Special) -> str:
    """A Lark atom for ``text``: the special token itself when the vocabulary has one (llguidance
    never matches a special token with plain text), else the text."""
    tid = special(text)
    return f"<[{tid}]>" if tid is not None else json.dumps(text)


def _call_schema(tools: list[Tool], args_key: str, extra: dict | None = None) -> dict:
    """One call as a JSON object: its name (one of ``tools``) then its arguments, compact JSON."""
    alts = [{"type": "object", "properties": {"name": {"const": t.name}, args_key: t.parameters, **(extra or {})},
             "required": ["name", args_key], "additionalProperties": False} for t in tools]
    schema = alts[0] if len(alts) == 1 else {"anyOf": alts}
    return {**schema, "x-guidance": JSON_OPTIONS}


def tagged(fmt: Format, tools: list[Tool], forced: bool, parallel: bool, special: Special) -> str:
    """Calls between an opening and a closing marker (Hermes, the fallback). ``forced``: nothing
    but calls; else free text until a call opens, the call constrained from there (text may
    follow it)."""
    opening = _lit(fmt.open, special)
    body = f'"\\n" %json {_json(_call_schema(tools, fmt.args_key))} "\\n" {_lit(fmt.close, special)}'
    if forced:
        # a newline may follow a call, and then the model chooses: another call, or the end
        more = ' ("\\n" call)* "\\n"?' if parallel else ' "\\n"?'
        return f"start: call{more}\ncall: {opening} {body}\n"
    rep = "*" if parallel else "?"
    if opening.startswith("<["):  # text never holds a special token: the call starts at it
        return f"%llguidance {{}}\nstart: call{rep} TEXT\ncall: TEXT {opening} {body}\n{TEXT}\n"
    # a lazy lexeme ends as soon as it can: at the first opening
    return f"%llguidance {{}}\nstart: call{rep} TEXT\ncall: opened {body}\nopened[lazy]: TEXT {opening}\n{TEXT}\n"


def bare(fmt: Format, tools: list[Tool], forced: bool, parallel: bool, special: Special) -> str:
    """Llama 3: one JSON call as the whole answer, after an optional ``<|python_tag|>``."""
    tag = special("<|python_tag|>")
    call = ("call: " + (f"<[{tag}]>? " if tag is not None else "")
            + f"%json {_json(_call_schema(tools, fmt.args_key))}\n")
    if forced:
        return "start: call\n" + call
    # free text is anything that does not open with "{"; a call is the whole answer
    return "start: call | PLAIN\n" + call + "PLAIN: /([^{](.|\\n)*)?/\n"


def listed(fmt: Format, tools: list[Tool], forced: bool, parallel: bool, special: Special) -> str:
    """Mistral: ``[TOOL_CALLS]`` then a JSON list of calls, each with a nine-character id."""
    item = _call_schema(tools, fmt.args_key, {"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}})
    array = {"type": "array", "items": item, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    call = f"call: {_lit(fmt.open, special)} %json {_json(array)}\n"
    if forced:
        return "start: call\n" + call
    return f"%llguidance {{}}\nstart: TEXT call?\n{call}{TEXT}\n"


Grammar = Callable[[Format, list[Tool], bool, bool, Special], str]
# each format's grammar; a format not listed writes its calls between markers
GRAMMARS: dict[type[Format], Grammar] = {Llama3: bare, Mistral: listed}


def grammar(fmt: Format, tools: list[Tool], forced: bool, parallel: bool, special: Special) -> str:
    """The Lark grammar of an answer in ``fmt`` that calls ``tools`` (``forced``: nothing but
    calls; ``parallel``: more than one)."""
    return GRAMMARS.get(type(fmt), tagged)(fmt, tools, forced, parallel, special)


def constraint_for(tools: list[Tool], choice: str | dict, fmt: Format, special: Special,
                   parallel: bool = True) -> Constraint | None:
    """The constraint for ``tool_choice``: ``required`` (one or more calls to any tool), a named
    function (one call to it), ``auto`` (free text, a call constrained once the model opens
    one), ``none`` (no constraint: the tools are not offered)."""
    if choice == "none" or not tools:
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        tools = [t for t in tools if t.name == name]
        return Constraint.lark(grammar(fmt, tools, forced=True, parallel=False, special=special))
    return Constraint.lark(grammar(fmt, tools, forced=choice == "required", parallel=parallel, special=special))


def special_tokens(model) -> Special:
    """``Special`` for a loaded model: a text that is one token of its vocabulary which
    llguidance counts as special (a control token, or a ``<...>`` user-defined one)."""
    tok = tokenizer_for(model)

    def special(text: str) -> int | None:
        toks = model.tokenize(text, add_special=False, parse_special=True)
        return toks[0] if len(toks) == 1 and tok.is_special_token(toks[0]) else None
    return special
