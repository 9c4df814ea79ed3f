"""Tool calls in a streamed answer: the content goes out as it comes until a call opens (text
that may be a call's opening held back until the next text decides), then the calls, as
OpenAI streams them (:class:`ToolStream`: deltas, the arguments piece by piece) or as Ollama
does (:class:`CallStream`: each call whole once it is complete)."""

from __future__ import annotations

from specli.toolcalls import Format, ToolCall, parse


def ollama_call(c: ToolCall) -> dict:
    """A tool call as Ollama returns it: the arguments as an object."""
    return {"function": {"name": c.name, "arguments": c.arguments}}


class OpeningStream:
    """Content sent as it comes until a tool call opens: text that may be the opening of one
    is held back until the next text decides (the base of :class:`ToolStream` and
    :class:`CallStream`)."""

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


class CallStream(OpeningStream):
    """A streamed answer as Ollama streams one: the content as it comes (text that may open a
    tool call held back until the next text decides), each call whole once it is complete."""

    def __init__(self, fmt: Format):
        super().__init__(fmt)
        self.n_calls = 0

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """The content to send now, and the calls ``text`` completed."""
        out = self.content(text)
        if not self.opened:
            return out, []
        end = self.fmt.complete(self.buf)
        if not end:
            return out, []
        content, calls = parse(self.buf[:end], self.fmt)
        self.buf = self.buf[end:]
        return out + content, self._whole(calls)

    def flush(self) -> tuple[str, list[dict]]:
        """The rest at the end (a call cut short stays text)."""
        content, calls = parse(self.buf, self.fmt)
        self.buf = ""
        return content, self._whole(calls)

    def _whole(self, calls: list[ToolCall]) -> list[dict]:
        self.n_calls += len(calls)
        return [ollama_call(c) for c in calls]
