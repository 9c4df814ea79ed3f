"""Prompt suites for measuring: the shipped ones (code, grounded, chat, unpredictable) or a
user's YAML / JSONL file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources

import yaml

from .errors import SpecliError

BUILTIN_SUITES = ("code", "grounded", "chat", "unpredictable")
PROMPT_KEYS = {"id", "text", "temperature", "top_p", "top_k", "max_tokens"}


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    text: str
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None


@dataclass
class Suite:
    name: str
    description: str = ""
    prompts: list[SuitePrompt] = field(default_factory=list)


def _prompt(d: dict, where: str, i: int) -> SuitePrompt:
    if not isinstance(d, dict):
        raise SpecliError(f"{where}: prompt {i + 1} must be a mapping with 'text'")
    unknown = set(d) - PROMPT_KEYS
    if unknown:
        raise SpecliError(f"{where}: prompt {i + 1}: unknown key '{sorted(unknown)[0]}' "
                          f"(allowed: {', '.join(sorted(PROMPT_KEYS))})")
    if not isinstance(d.get("text"), str) or not d["text"].strip():
        raise SpecliError(f"{where}: prompt {i + 1} has no 'text'")
    try:
        return SuitePrompt(id=str(d.get("id", f"p{i + 1}")), text=d["text"],
                           temperature=float(d.get("temperature", 0.0)), top_p=float(d.get("top_p", 1.0)),
                           top_k=int(d.get("top_k", 0)),
                           max_tokens=None if d.get("max_tokens") is None else int(d["max_tokens"]))
    except (TypeError, ValueError) as e:
        raise SpecliError(f"{where}: prompt {i + 1}: {e}") from None


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
        text = resources.files("specli.suites").joinpath(f"{ref}.yaml").read_text(encoding="utf-8")
        return parse_suite(text, f"{ref}.yaml", ref)
    if not os.path.exists(ref):
        raise SpecliError(f"unknown suite '{ref}': not a file, nor one of {', '.join(BUILTIN_SUITES)}")
    try:
        with open(ref, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecliError(f"cannot read suite {ref}: {e}") from None
    return parse_suite(text, ref, os.path.splitext(os.path.basename(ref))[0])
