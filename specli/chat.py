"""A multi-turn conversation over one Session: the chat template renders the whole history
each turn, and the target's KV cache keeps the conversation so far, so only the new turn is
prefilled."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from specli.errors import SpecliError
from specli.prompt import chat_text, tokenize_prompt
from specli.session import Session
from specli.speculate.loop import Chunk, Stats
from specli.speculate.verify import SamplingParams


def trim_history(messages: list[dict], fits: Callable[[list[dict]], bool]) -> tuple[list[dict], int]:
    """Drop the oldest user/assistant turns (never the system prompt, never the last user
    message) until ``fits(messages)``; returns (messages, number of messages dropped)."""
    msgs = list(messages)
    dropped = 0
    while not fits(msgs):
        first = 1 if msgs and msgs[0]["role"] == "system" else 0
        if len(msgs) - first <= 1:
            raise SpecliError("this message alone does not fit in the context; shorten it or use a larger --ctx")
        # drop a whole exchange (user + assistant) when there is one
        n = 2 if len(msgs) - first >= 3 and msgs[first + 1]["role"] == "assistant" else 1
        del msgs[first:first + n]
        dropped += n
    return msgs, dropped


@dataclass
class Chat:
    session: Session
    params: SamplingParams
    max_tokens: int = 512
    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    last: Stats | None = None  # the last reply's stats

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.session.ctx.clear()
        self.last = None
        self._hist_text, self._hist_tokens = "", []
        self._reply = ("", [], [], [])

    def _text(self, msgs: list[dict]) -> str:
        return chat_text(self.session.target, msgs)

    def _tokens(self, text: str) -> list[int]:
        """Prompt tokens for the rendered conversation. When it extends what the cache already
        holds (the last prompt and the reply exactly as generated), only the new text is
        tokenized: re-tokenizing the reply could split it differently and lose the cache."""
        if self._hist_text and text.startswith(self._hist_text):
            rest = text[len(self._hist_text):]
            return self._hist_tokens + self.session.target.tokenize(rest, add_special=False, parse_special=True)
        return tokenize_prompt(self.session.target, text, templated=True)

    def send(self, text: str) -> tuple[Iterator[Chunk], int]:
        """Start a reply; returns (stream of chunks, number of old messages trimmed). Consume
        the stream (or stop early), then call :meth:`finish`."""
        self._reply = ("", [], [], [])
        n_ctx = self.session.ctx.n_ctx
        budget = min(self.max_tokens, max(16, n_ctx // 4))
        msgs = self.messages + [{"role": "user", "content": text}]
        msgs, dropped = trim_history(msgs, lambda m: len(self._tokens(self._text(m))) + budget < n_ctx)
        self.messages = msgs
        prompt_text = self._text(msgs)
        prompt = self._tokens(prompt_text)
        resp = self.session.generate(prompt, self.params, budget)
        self.last = resp.stats
        self._reply = (prompt_text, prompt, [], [])
        return self._record(resp), dropped

    def _record(self, stream: Iterator[Chunk]) -> Iterator[Chunk]:
        _, _, texts, toks = self._reply
        for ch in stream:
            texts.append(ch.text)
            toks.extend(ch.tokens)
            yield ch

    def finish(self) -> str:
        """Add the reply (complete or interrupted) to the conversation; returns its text. A turn
        interrupted before any token leaves the conversation as it was."""
        prompt_text, prompt, texts, toks = self._reply
        reply = "".join(texts)
        if not self.messages or self.messages[-1]["role"] != "user":
            return reply
        if not toks:
            self.messages.pop()
            return reply
        self.messages.append({"role": "assistant", "content": reply})
        self._hist_text, self._hist_tokens = prompt_text + reply, prompt + toks
        return reply

    def repair(self) -> None:
        """After an interrupted reply: drop cache entries the contexts do not account for."""
        self.session.ctx.repair()
        self.session.drafter.repair()
