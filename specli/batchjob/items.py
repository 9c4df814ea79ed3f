"""The lines of a ``specli run --batch`` file: one JSON object per line, each checked before
anything runs. A line that cannot run is a :class:`BadLine` (its number and why), never an
exception: the job skips it, or stops before it starts (``--strict``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from specli.errors import SpecliError
from specli.measure.suite import parse_messages, schema_text

KEYS = ("id", "prompt", "messages", "max_tokens", "temperature", "seed", "json_schema")


@dataclass(frozen=True)
class BatchItem:
    """One line to run: ``id`` as given (a string or an integer), ``line`` its line number,
    ``prompt`` its text or ``messages`` its conversation ((role, content) pairs), and what
    it sets itself (None: the command line's)."""

    id: str | int
    line: int
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    json_schema: str | None = None  # JSON text, checked

    @property
    def key(self) -> str:
        """The id as an output file spells it (``1`` and ``"1"`` are two ids)."""
        return id_key(self.id)


@dataclass(frozen=True)
class BadLine:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def id_key(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _int(d: dict, key: str, low: int | None = None) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecliError(f"'{key}' must be an integer, not {json.dumps(v)}")
    if low is not None and v < low:
        raise SpecliError(f"'{key}' must be at least {low}, not {v}")
    return v


def _temperature(d: dict) -> float | None:
    v = d.get("temperature")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise SpecliError(f"'temperature' must be a number >= 0, not {json.dumps(v)}")
    return float(v)


def _text(d: dict) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    given = [k for k in ("prompt", "messages") if k in d]
    if len(given) != 1:
        raise SpecliError("give 'prompt' or 'messages'" + (", not both" if given else ""))
    if given[0] == "messages":
        return None, parse_messages(d["messages"], "messages")
    text = d["prompt"]
    if not isinstance(text, str) or not text.strip():
        raise SpecliError("'prompt' must be a non-empty string")
    return text, ()


def parse_item(d, line: int) -> BatchItem:
    """One decoded line as an item; a :class:`SpecliError` (one line) says what is wrong."""
    if not isinstance(d, dict):
        raise SpecliError(f"a line is a JSON object with 'id' and 'prompt', not {type(d).__name__}")
    unknown = sorted(set(d) - set(KEYS))
    if unknown:
        raise SpecliError(f"unknown key '{unknown[0]}' (allowed: {', '.join(KEYS)})")
    if "id" not in d:
        raise SpecliError("no 'id'")
    if isinstance(d["id"], bool) or not isinstance(d["id"], (str, int)):
        raise SpecliError(f"'id' must be a string or an integer, not {json.dumps(d['id'])}")
    prompt, messages = _text(d)
    schema = d.get("json_schema")
    return BatchItem(d["id"], line, prompt, messages, _int(d, "max_tokens", 1), _temperature(d), _int(d, "seed"),
                     None if schema is None else schema_text(schema, "json_schema"))


def read_items(text: str) -> tuple[list[BatchItem], list[BadLine]]:
    """Every line of a batch file checked: the items, in order, and the lines that cannot run
    (blank lines are neither). A repeated id is bad where it repeats."""
    items: list[BatchItem] = []
    bad: list[BadLine] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except ValueError as e:
            bad.append(BadLine(n, f"not valid JSON ({getattr(e, 'msg', e)})"))
            continue
        try:
            item = parse_item(d, n)
        except SpecliError as e:
            bad.append(BadLine(n, str(e)))
            continue
        if item.key in seen:
            bad.append(BadLine(n, f"id {item.key} repeats line {seen[item.key]}'s"))
            continue
        seen[item.key] = n
        items.append(item)
    return items, bad
