"""Tool calls in the model's own syntax: the tools go into the prompt through the GGUF's chat
template, and the model's answer is parsed back into calls (:mod:`specli.toolgrammar`
constrains a call to its function's parameter schema, so its arguments always parse; the
server streams calls with :mod:`specli.serve.toolstream`).

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
from dataclasses import dataclass, field

from specli.errors import SpecliError
from specli.prompt import render_chat


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
