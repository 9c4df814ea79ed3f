"""Tool calls in the model's own syntax: the tools go into the prompt through the GGUF's chat
template, the model's answer is parsed back into calls, and a call can be constrained to the
function's parameter schema so its arguments always parse.

Each model family writes calls its own way; :func:`detect` reads the family from the chat
template (as llama.cpp's ``common/chat.cpp`` does):

- ``hermes``: Qwen2.5 / Qwen3 and other Hermes-style templates, ``<tool_call>\\n{"name": ...,
  "arguments": {...}}\\n</tool_call>``, one block per call;
- ``llama3``: Llama 3.x, a bare JSON object ``{"name": ..., "parameters": {...}}`` (after an
  optional ``<|python_tag|>``) as the whole answer;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]``;
- ``fallback``: a template that knows no tools. specli describes the tools in the system
  message itself, in the Hermes wording, and the model answers with ``<tool_call>`` blocks;
  earlier calls and their results go back as text (``<tool_call>``, ``<tool_response>``).

Templates with another tool syntax (Qwen3-Coder's and Qwen3.5's XML ``<function=...>``, ...)
are refused rather than guessed at (:class:`ToolsUnsupported`).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from specli.constrain import JSON_OPTIONS, Constraint, tokenizer_for
from specli.errors import SpecliError
from specli.prompt import render_chat

# a marker's text -> its token id when the vocabulary has it as one special token, else None
Special = Callable[[str], "int | None"]


class ToolsUnsupported(SpecliError):
    """The chat template writes tool calls in a syntax specli does not parse."""


def new_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = field(default_factory=new_id)
    raw: str | None = None  # the arguments as the model wrote them (what a stream sent)

    def arguments_json(self) -> str:
        return self.raw if self.raw is not None else json.dumps(self.arguments, ensure_ascii=False)

    def openai(self) -> dict:
        """The call as OpenAI's ``message.tool_calls`` entry (arguments as a JSON string)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json()}}


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict
    description: str = ""

    @classmethod
    def from_openai(cls, t: dict) -> Tool:
        f = t["function"]
        return cls(f["name"], f.get("parameters") or {"type": "object", "properties": {}}, f.get("description", ""))

    def openai(self) -> dict:
        fn = {"name": self.name, **({"description": self.description} if self.description else {}),
              "parameters": self.parameters}
        return {"type": "function", "function": fn}


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


TEXT = "TEXT: /(.|\\n)*/"
# the start of a call object up to its arguments' first character: {"name": "NAME", "KEY": (NAME
# a JSON string's body)
HEAD = r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"%s"\s*:\s*(?=\S)'


class Format:
    """A family's tool-call syntax (Hermes' unless a subclass says otherwise). ``native``: the
    chat template renders the tools itself."""

    name = ""
    native = False
    args_key = "arguments"
    open = "<tool_call>"
    close = "</tool_call>"

    # -- the prompt ----------------------------------------------------------------------
    def message(self, m: dict) -> dict:
        """An OpenAI message as the template takes it: a call's arguments as an object."""
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": _args(c["function"])}}
                                     for c in m["tool_calls"]]}
        return m

    def messages(self, msgs: list[dict], tools: list[Tool] | None) -> list[dict]:
        """The conversation as this format renders it (the fallback writes tools and calls as text)."""
        return [self.message(m) for m in msgs]

    # -- the answer ----------------------------------------------------------------------
    def opening(self, text: str) -> int | None:
        """Where a call opens in the answer so far, if one does."""
        i = text.find(self.open)
        return i if i >= 0 else None

    def could_open(self, text: str) -> int:
        """How many characters at the end of ``text`` may be the start of an opening (held back
        from the content while the next text decides)."""
        return max((k for k in range(1, len(self.open)) if text.endswith(self.open[:k])), default=0)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The content and the calls of an answer; a block that does not parse stays content."""
        calls, content, pos = [], [], 0
        for m in re.finditer(re.escape(self.open) + r"\s*(.*?)\s*" + re.escape(self.close), text, re.S):
            call = _call_from(m.group(1), self.args_key)
            if call is None:
                continue
            call.raw = self.raw_arguments(m.group(0), call)
            content.append(text[pos:m.start()])
            calls.append(call)
            pos = m.end()
        content.append(text[pos:])
        body = "".join(content)
        return (body.strip() if calls else body), calls

    def complete(self, text: str) -> int:
        """The end of the first complete call in ``text`` (0: none yet)."""
        i = text.find(self.close)
        return i + len(self.close) if i >= 0 else 0

    def head(self, text: str) -> tuple[str, int] | None:
        """A call's name and where its arguments start, once ``text`` (a call, from its opening
        on) has got that far; None before (or for a format whose calls stream whole)."""
        m = re.match(re.escape(self.open) + r"\s*" + HEAD % self.args_key, text)
        return (json.loads(f'"{m.group(1)}"'), m.end()) if m else None

    @property
    def tail(self) -> str:
        """What closes a call after its arguments."""
        return "}\n" + self.close

    def arguments_text(self, call_text: str, start: int) -> str:
        """The arguments as written in a complete call's text, from ``start`` (see :meth:`head`)."""
        t = call_text[start:].rstrip().removesuffix(self.tail[1:].strip()).rstrip()  # the closing marker
        return t.removesuffix("}").rstrip()  # the call object's own brace

    def raw_arguments(self, call_text: str, call: ToolCall) -> str | None:
        """The arguments as the model wrote them, when they read back as the parsed ones."""
        h = self.head(call_text.lstrip())
        if h is None:
            return None
        raw = self.arguments_text(call_text.lstrip(), h[1])
        try:
            return raw if json.loads(raw) == call.arguments else None
        except json.JSONDecodeError:
            return None

    # -- the constraint ------------------------------------------------------------------
    def body(self, tools: list[Tool], special: Special) -> str:
        """A call after its opening marker, as Lark."""
        return f'"\\n" %json {_json(_call_schema(tools, self.args_key))} "\\n" {_lit(self.close, special)}'

    def grammar(self, tools: list[Tool], forced: bool, parallel: bool, special: Special) -> str:
        """A Lark grammar (llguidance) for the answer. ``forced``: nothing but calls; else free
        text until a call opens, the call constrained from there (text may follow it)."""
        opening = _lit(self.open, special)
        if forced:
            # a newline may follow a call, and then the model chooses: another call, or the end
            more = ' ("\\n" call)* "\\n"?' if parallel else ' "\\n"?'
            return f"start: call{more}\ncall: {opening} {self.body(tools, special)}\n"
        rep = "*" if parallel else "?"
        if opening.startswith("<["):  # text never holds a special token: the call starts at it
            return (f"%llguidance {{}}\nstart: call{rep} TEXT\ncall: TEXT {opening} {self.body(tools, special)}\n"
                    f"{TEXT}\n")
        # a lazy lexeme ends as soon as it can: at the first opening
        return (f"%llguidance {{}}\nstart: call{rep} TEXT\ncall: opened {self.body(tools, special)}\n"
                f"opened[lazy]: TEXT {opening}\n{TEXT}\n")

    def new_id(self) -> str:
        return new_id()


class Hermes(Format):
    name = "hermes"
    native = True


class Fallback(Format):
    """Hermes-style calls for a template that knows no tools: the tools, the calls and their
    results are written into the conversation as text."""

    name = "fallback"

    def messages(self, msgs: list[dict], tools: list[Tool] | None) -> list[dict]:
        out = []
        for m in msgs:
            if m.get("tool_calls"):
                calls = "".join(
                    f"\n{self.open}\n{_json({'name': c['function']['name'], 'arguments': _args(c['function'])})}"
                    f"\n{self.close}" for c in m["tool_calls"])
                m = {"role": "assistant", "content": ((m.get("content") or "") + calls).strip()}
            elif m.get("role") == "tool":
                m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
            out.append(m)
        if tools:
            text = fallback_system(tools)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out


def fallback_system(tools: list[Tool]) -> str:
    """The tools described as Qwen2.5's template describes them."""
    listed = "\n".join(_json(t.openai()) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class Llama3(Format):
    """Llama 3.x: the whole answer is one JSON call, after an optional ``<|python_tag|>`` (a
    control token: not in the text)."""

    name = "llama3"
    native = True
    args_key = "parameters"
    open = "{"

    def opening(self, text: str) -> int | None:
        return 0 if text.lstrip().startswith("{") else None

    def could_open(self, text: str) -> int:
        return len(text) if not text.strip() else 0

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        s = text.lstrip()
        if not s.startswith("{"):
            return text, []
        try:
            obj, end = json.JSONDecoder().raw_decode(s)
        except json.JSONDecodeError:
            return text, []
        call = _call_obj(obj, self.args_key)
        if call is None:
            return text, []
        call.raw = self.raw_arguments(s[:end], call)
        return s[end:].strip(), [call]

    def complete(self, text: str) -> int:
        s = text.lstrip()
        try:
            return len(text) - len(s) + json.JSONDecoder().raw_decode(s)[1]
        except json.JSONDecodeError:
            return 0

    def head(self, text: str) -> tuple[str, int] | None:
        m = re.match(HEAD % self.args_key, text)
        return (json.loads(f'"{m.group(1)}"'), m.end()) if m else None

    @property
    def tail(self) -> str:
        return "}"

    def grammar(self, tools: list[Tool], forced: bool, parallel: bool, special: Special) -> str:
        tag = special("<|python_tag|>")
        call = ("call: " + (f"<[{tag}]>? " if tag is not None else "")
                + f"%json {_json(_call_schema(tools, self.args_key))}\n")
        if forced:
            return "start: call\n" + call
        # free text is anything that does not open with "{"; a call is the whole answer
        return "start: call | PLAIN\n" + call + "PLAIN: /([^{](.|\\n)*)?/\n"


class Mistral(Format):
    """Mistral: ``[TOOL_CALLS]`` (a control token: not in the text) then a JSON list of calls."""

    name = "mistral"
    native = True
    open = "[TOOL_CALLS]"

    def opening(self, text: str) -> int | None:
        i = text.find(self.open)
        if i >= 0:
            return i
        return 0 if text.lstrip().startswith("[{") else None

    def could_open(self, text: str) -> int:
        s = text.lstrip()
        return len(text) if s in ("", "[") else super().could_open(text)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        i = self.opening(text)
        if i is None:
            return text, []
        s = text[i:].removeprefix(self.open).lstrip()
        try:
            items, end = json.JSONDecoder().raw_decode(s)
        except json.JSONDecodeError:
            return text, []
        calls = [_call_obj(o, self.args_key) for o in items] if isinstance(items, list) else []
        if not calls or None in calls:
            return text, []
        for c, o in zip(calls, items, strict=True):
            c.id = str(o.get("id") or c.id)
        return (text[:i] + s[end:]).strip(), calls

    def complete(self, text: str) -> int:
        i = self.opening(text)
        if i is None:
            return 0
        s = text[i:].removeprefix(self.open)
        try:
            return len(text) - len(s.lstrip()) + json.JSONDecoder().raw_decode(s.lstrip())[1]
        except json.JSONDecodeError:
            return 0

    def grammar(self, tools: list[Tool], forced: bool, parallel: bool, special: Special) -> str:
        item = _call_schema(tools, self.args_key, {"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}})
        array = {"type": "array", "items": item, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        call = f"call: {_lit(self.open, special)} %json {_json(array)}\n"
        if forced:
            return "start: call\n" + call
        return f"%llguidance {{}}\nstart: TEXT call?\n{call}{TEXT}\n"

    def head(self, text: str) -> tuple[str, int] | None:
        return None  # a list of calls: each is sent once the list is complete

    def new_id(self) -> str:  # Mistral's templates require nine letters or digits
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


FORMATS = {f.name: f for f in (Hermes(), Llama3(), Mistral(), Fallback())}


def detect(template: str | None) -> Format:
    """The tool-call format a chat template uses, from the markers it writes."""
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    if "<tool_call>" in t and "<function=" in t:
        raise ToolsUnsupported("this model's chat template writes tool calls as XML (<function=...>), "
                               "which specli does not parse yet")
    if "<tool_call>" in t:
        return FORMATS["hermes"]
    if "<|python_tag|>" in t or ("<|start_header_id|>" in t and "tools" in t):
        return FORMATS["llama3"]
    return FORMATS["fallback"]


def render(template: str, messages: list[dict], tools: list[Tool] | None = None, fmt: Format | None = None,
           bos: str = "", eos: str = "", add_generation_prompt: bool = True) -> str:
    """The prompt text: ``messages`` (OpenAI's shape: ``tool_calls`` with JSON-string arguments,
    ``role: tool`` results) and ``tools`` through the chat template, as ``fmt`` (else the
    template's own format) needs them."""
    fmt = fmt or detect(template)
    msgs = fmt.messages(messages, tools)
    native_tools = [t.openai() for t in tools] if tools and fmt.native else None
    return render_chat(template, msgs, bos, eos, add_generation_prompt, tools=native_tools)


def parse(text: str, fmt: Format) -> tuple[str, list[ToolCall]]:
    """The content and the tool calls of a model's answer, each call with a fresh id."""
    content, calls = fmt.parse(text)
    for c in calls:
        if c.id.startswith("call_"):
            c.id = fmt.new_id()
    return content, calls


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
        return Constraint.lark(fmt.grammar(tools, forced=True, parallel=False, special=special))
    return Constraint.lark(fmt.grammar(tools, forced=choice == "required", parallel=parallel, special=special))


class OpeningStream:
    """Content sent as it comes until a tool call opens: text that may be the opening of one
    is held back until the next text decides (the base of :class:`ToolStream` and of the
    Ollama API's whole-call stream)."""

    def __init__(self, fmt: Format):
        self.fmt, self.buf, self.opened = fmt, "", False

    def content(self, text: str) -> str:
        """Take ``text``; the content that is safe to send now (up to a call's opening, after
        which ``opened`` is set and the rest waits in ``buf``)."""
        self.buf += text
        if self.opened:
            return ""
        i = self.fmt.opening(self.buf)
        if i is None:
            keep = len(self.buf) - self.fmt.could_open(self.buf)
            out, self.buf = self.buf[:keep], self.buf[keep:]
            return out
        out, self.buf, self.opened = self.buf[:i], self.buf[i:], True
        return out


class ToolStream(OpeningStream):
    """A streamed answer split into content, sent as it comes (text that may open a call is
    held back until the next text decides), and tool calls, streamed as OpenAI streams them:
    a delta ``{index, id, type, function: {name, arguments: ""}}`` once the call's name is
    written, then its arguments piece by piece as the model writes them (text that may be the
    call's closing held back). Mistral's calls, a JSON list, are sent once the list is complete."""

    def __init__(self, fmt: Format):
        super().__init__(fmt)
        self.n_calls = 0
        self.cur: tuple[int, int, str] | None = None  # the call being streamed: index, arguments' start, sent

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """The content to send now, and the tool-call deltas."""
        out = self.content(text)
        if not self.opened:
            return out, []
        deltas: list[dict] = []
        while True:
            if self.cur is None:
                lead = len(self.buf) - len(self.buf.lstrip())
                h = self.fmt.head(self.buf[lead:])
                if h is None:  # not a call's start (yet), or a format whose calls go whole
                    end = self.fmt.complete(self.buf)
                    if not end:
                        return out, deltas
                    content, calls = parse(self.buf[:end], self.fmt)
                    self.buf = self.buf[end:]
                    out += content
                    deltas += self._whole(calls)
                    continue
                deltas.append({"index": self.n_calls, "id": self.fmt.new_id(), "type": "function",
                               "function": {"name": h[0], "arguments": ""}})
                self.cur = (self.n_calls, lead + h[1], "")
                self.n_calls += 1
            idx, start, sent = self.cur
            end = self.fmt.complete(self.buf)
            if end:  # the call is complete: the rest of its arguments
                rest = self.fmt.arguments_text(self.buf[:end], start)[len(sent):]
                self.buf, self.cur = self.buf[end:], None
            else:
                avail = self.buf[start:]
                hold = max((k for k in range(1, len(self.fmt.tail) + 1) if avail.endswith(self.fmt.tail[:k])),
                           default=0)
                rest = avail[len(sent):len(avail) - hold]
                self.cur = (idx, start, sent + rest)
            if rest:
                deltas.append({"index": idx, "function": {"arguments": rest}})
            if self.cur is not None:
                return out, deltas

    def flush(self) -> tuple[str, list[dict]]:
        """What is left at the end: the rest of the content, a call cut short, a last whole call."""
        if self.cur is not None:  # cut short (max_tokens): what was written of its arguments
            idx, start, sent = self.cur
            rest, self.buf, self.cur = self.buf[start + len(sent):], "", None
            return "", [{"index": idx, "function": {"arguments": rest}}] if rest else []
        content, calls = parse(self.buf, self.fmt)
        self.buf = ""
        if self.n_calls and not calls:
            content = content.strip()
        return content, self._whole(calls)

    def _whole(self, calls: list[ToolCall]) -> list[dict]:
        out = []
        for c in calls:
            out.append({"index": self.n_calls, "id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": ""}})
            out.append({"index": self.n_calls, "function": {"arguments": c.arguments_json()}})
            self.n_calls += 1
        return out


def special_tokens(model) -> Special:
    """``Special`` for a loaded model: a text that is one token of its vocabulary which
    llguidance counts as special (a control token, or a ``<...>`` user-defined one)."""
    tok = tokenizer_for(model)

    def special(text: str) -> int | None:
        toks = model.tokenize(text, add_special=False, parse_special=True)
        return toks[0] if len(toks) == 1 and tok.is_special_token(toks[0]) else None
    return special


def _args(fn: dict) -> dict:
    """A call's arguments as an object (OpenAI sends them as a JSON string)."""
    a = fn.get("arguments")
    if isinstance(a, dict):
        return a
    try:
        obj = json.loads(a or "{}")
    except json.JSONDecodeError as e:
        raise SpecliError(f"the arguments of the call to '{fn.get('name')}' are not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise SpecliError(f"the arguments of the call to '{fn.get('name')}' are not a JSON object")
    return obj


def _call_obj(obj, args_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


def _call_from(text: str, args_key: str) -> ToolCall | None:
    try:
        return _call_obj(json.loads(text), args_key)
    except json.JSONDecodeError:
        return None
