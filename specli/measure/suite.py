"""Prompt suites for measuring: the shipped ones (``BUILTIN_SUITES``) or a user's YAML / JSONL file
(a ``specli run --batch`` file is one: its ``seed`` and ``json_schema`` keys apply)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources

import yaml

from specli.constrain import Constraint
from specli.errors import SpecliError

BUILTIN_SUITES = ("code", "grounded", "chat", "unpredictable",
                  "multiturn", "translation", "summarise", "qa", "maths", "rag")
# the prompt itself: `text`, or `prompt` (common in JSONL sets), or `turns` (multi-turn sets such as
# MT-Bench / Spec-Bench: the first turn is used), or `messages` (a whole conversation, rendered with
# the model's chat template); `question_id` names it there, `category` and `reference` are their
# metadata (kept out of the prompt); `seed` and `json_schema` as a `specli run --batch` file gives them
TEXT_KEYS = ("text", "prompt", "turns", "messages")
ROLES = ("system", "user", "assistant")
PROMPT_KEYS = {"id", "question_id", "category", "reference", "temperature", "top_p", "top_k", "max_tokens",
               "seed", "json_schema", *TEXT_KEYS}


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    text: str
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    # a conversation as (role, content) pairs ending with a user turn; `text` is then its last user turn
    messages: tuple[tuple[str, str], ...] = ()
    seed: int | None = None  # the sampler's seed (bench's own when None)
    json_schema: str | None = None  # the output's JSON schema, as JSON text

    def constraint(self) -> Constraint | None:
        return None if self.json_schema is None else Constraint.json_schema(self.json_schema)


@dataclass
class Suite:
    name: str
    description: str = ""
    prompts: list[SuitePrompt] = field(default_factory=list)


def _first_turn(turns, where: str) -> str:
    """The first user turn of a `turns` list: strings, or {role, content} / {content} mappings."""
    if not isinstance(turns, list) or not turns:
        raise SpecliError(f"{where}: 'turns' must be a non-empty list")
    if all(isinstance(t, str) for t in turns):
        return turns[0]
    if not all(isinstance(t, dict) and "content" in t for t in turns):
        raise SpecliError(f"{where}: 'turns' entries must be strings, or mappings with 'content' (and 'role')")
    users = [t for t in turns if t.get("role", "user") == "user"]
    if not users:
        raise SpecliError(f"{where}: 'turns' has no user turn")
    return users[0]["content"]


def parse_messages(msgs, where: str) -> tuple[tuple[str, str], ...]:
    """A `messages` list: {role, content} mappings, roles system (first only) / user / assistant,
    ending with a user turn."""
    if not isinstance(msgs, list) or not msgs:
        raise SpecliError(f"{where}: 'messages' must be a non-empty list of {{role, content}} mappings")
    out = []
    for n, m in enumerate(msgs, 1):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise SpecliError(f"{where}: message {n} must be a mapping with exactly 'role' and 'content'")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise SpecliError(f"{where}: message {n} has role {role!r}; roles are {', '.join(ROLES)}")
        if role == "system" and n != 1:
            raise SpecliError(f"{where}: message {n} is a system message; only the first may be one")
        if not isinstance(content, str) or not content.strip():
            raise SpecliError(f"{where}: message {n} has no content")
        out.append((role, content))
    if out[-1][0] != "user":
        raise SpecliError(f"{where}: 'messages' must end with a user message (the last is {out[-1][0]!r})")
    return tuple(out)


def _prompt(d: dict, where: str, i: int) -> SuitePrompt:
    if not isinstance(d, dict):
        raise SpecliError(f"{where}: prompt {i + 1} must be a mapping with 'text'")
    unknown = set(d) - PROMPT_KEYS
    if unknown:
        raise SpecliError(f"{where}: prompt {i + 1}: unknown key '{sorted(unknown)[0]}' "
                          f"(allowed: {', '.join(sorted(PROMPT_KEYS))})")
    given = [k for k in TEXT_KEYS if k in d]
    if len(given) > 1:
        raise SpecliError(f"{where}: prompt {i + 1} has both '{given[0]}' and '{given[1]}'; give one")
    messages = ()
    if not given:
        text = None
    elif given[0] == "messages":
        messages = parse_messages(d["messages"], f"{where}: prompt {i + 1}")
        text = messages[-1][1]
    elif given[0] == "turns":
        text = _first_turn(d["turns"], f"{where}: prompt {i + 1}")
    else:
        text = d[given[0]]
    if not isinstance(text, str) or not text.strip():
        raise SpecliError(f"{where}: prompt {i + 1} has no text (give 'text', 'prompt', 'turns' or 'messages')")
    pid = d.get("id", d.get("question_id", f"p{i + 1}"))
    try:
        return SuitePrompt(id=str(pid), text=text,
                           temperature=float(d.get("temperature", 0.0)), top_p=float(d.get("top_p", 1.0)),
                           top_k=int(d.get("top_k", 0)),
                           max_tokens=None if d.get("max_tokens") is None else int(d["max_tokens"]),
                           messages=messages, **_sampling_extras(d, f"{where}: prompt {i + 1}"))
    except (TypeError, ValueError) as e:
        raise SpecliError(f"{where}: prompt {i + 1}: {e}") from None


def _sampling_extras(d: dict, where: str) -> dict:
    """A batch file's ``seed`` and ``json_schema``, as :class:`SuitePrompt` keeps them."""
    seed = d.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SpecliError(f"{where}: 'seed' must be an integer")
    schema = d.get("json_schema")
    return {"seed": seed, "json_schema": None if schema is None else schema_text(schema, where)}


def schema_text(value, where: str) -> str:
    """A ``json_schema`` value as JSON text, checked: the schema itself (an object), or the
    path of a .json file that holds it (as ``specli run --json-schema FILE`` takes it)."""
    if isinstance(value, str):
        try:
            with open(value, encoding="utf-8") as f:
                value = f.read()
        except FileNotFoundError:
            raise SpecliError(f"{where}: json_schema file not found: {value}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecliError(f"{where}: cannot read json_schema {value}: {getattr(e, 'strerror', None) or e}") \
                from None
    elif not isinstance(value, (dict, bool)):
        raise SpecliError(f"{where}: 'json_schema' must be a schema object or the path of a .json file")
    try:
        c = Constraint.json_schema(value)
        c.check()
    except SpecliError as e:
        raise SpecliError(f"{where}: {e}") from None
    return c.source


def parse_suite(text: str, where: str, default_name: str) -> Suite:
    if where.endswith(".jsonl"):
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise SpecliError(f"{where}:{n}: not valid JSON ({e.msg})") from None
            prompts.append(_prompt(d, f"{where}:{n}", len(prompts)))
        return Suite(default_name, "", prompts)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise SpecliError(f"{where}{line}: invalid YAML ({getattr(e, 'problem', None) or e})") from None
    if isinstance(data, list):
        data = {"prompts": data}
    if not isinstance(data, dict) or not isinstance(data.get("prompts"), list) or not data["prompts"]:
        raise SpecliError(f"{where}: a suite needs a non-empty 'prompts' list")
    unknown = set(data) - {"name", "description", "prompts"}
    if unknown:
        raise SpecliError(f"{where}: unknown key '{sorted(unknown)[0]}' (allowed: name, description, prompts)")
    prompts = [_prompt(d, where, i) for i, d in enumerate(data["prompts"])]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise SpecliError(f"{where}: prompt ids repeat; each prompt must be distinct")
    return Suite(str(data.get("name", default_name)), str(data.get("description", "")), prompts)


def load_suite(ref: str) -> Suite:
    if ref in BUILTIN_SUITES:
        text = resources.files("specli.measure.suites").joinpath(f"{ref}.yaml").read_text(encoding="utf-8")
        return parse_suite(text, f"{ref}.yaml", ref)
    if not os.path.exists(ref):
        raise SpecliError(f"unknown suite '{ref}': not a file, nor one of {', '.join(BUILTIN_SUITES)}")
    try:
        with open(ref, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecliError(f"cannot read suite {ref}: {e}") from None
    return parse_suite(text, ref, os.path.splitext(os.path.basename(ref))[0])
