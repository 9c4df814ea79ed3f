"""Tokenizer compatibility of a target and a draft model: llama.cpp's rules, as plain functions.

The rules (llama.cpp ``common_speculative_are_compatible``): same vocabulary type; same BOS/EOS
ids and add-BOS/add-EOS settings; vocabulary sizes within 128; identical token text from id 5
up to the smaller vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from specli.errors import TokenizerMismatch
from specli.resolve.gguf_header import VocabInfo

MAX_VOCAB_SIZE_DIFFERENCE = 128
CHECK_START_TOKEN_ID = 5


@dataclass(frozen=True)
class Rule:
    name: str
    ok: bool
    detail: str


def check_vocab(target: VocabInfo, draft: VocabInfo) -> list[Rule]:
    """Every rule with its verdict, in the order llama.cpp checks them."""
    rules = [
        Rule("vocabulary type", target.vocab_type == draft.vocab_type,
             f"target {target.vocab_type}, draft {draft.vocab_type}"),
    ]
    for attr, label in (("bos", "BOS token"), ("eos", "EOS token"),
                        ("add_bos", "add-BOS setting"), ("add_eos", "add-EOS setting")):
        a, b = getattr(target, attr), getattr(draft, attr)
        rules.append(Rule(label, a == b, f"target {a}, draft {b}"))
    diff = abs(target.n_tokens - draft.n_tokens)
    rules.append(Rule("vocabulary size", diff <= MAX_VOCAB_SIZE_DIFFERENCE,
                      f"target {target.n_tokens}, draft {draft.n_tokens} "
                      f"(differ by {diff}, at most {MAX_VOCAB_SIZE_DIFFERENCE} allowed)"))
    first = first_token_difference(target.tokens, draft.tokens)
    if first is None:
        n = max(0, min(len(target.tokens), len(draft.tokens)) - CHECK_START_TOKEN_ID)
        rules.append(Rule("token text", True, f"{n} tokens identical from id {CHECK_START_TOKEN_ID}"))
    else:
        rules.append(Rule("token text", False,
                          f"at token {first}: {target.tokens[first]!r} vs {draft.tokens[first]!r}"))
    return rules


def first_token_difference(a: tuple[str, ...] | list[str], b: tuple[str, ...] | list[str]) -> int | None:
    n = min(len(a), len(b))
    if a[CHECK_START_TOKEN_ID:n] == b[CHECK_START_TOKEN_ID:n]:
        return None
    for i in range(CHECK_START_TOKEN_ID, n):
        if a[i] != b[i]:
            return i
    return None  # unreachable


def mismatch_message(rules: list[Rule]) -> str | None:
    """One line naming the first failing rule, or None when the pair is compatible."""
    for r in rules:
        if not r.ok:
            if r.name == "token text":
                return f"draft vocabulary differs from target {r.detail}"
            return f"draft tokenizer is incompatible with the target: {r.name} differs ({r.detail})"
    return None


def ensure_compatible(target: VocabInfo, draft: VocabInfo) -> None:
    msg = mismatch_message(check_vocab(target, draft))
    if msg:
        raise TokenizerMismatch(msg)
