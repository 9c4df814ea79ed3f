"""What a quant costs in quality, seen beside what it gains in speed (``specli bench --target A
--target B``): each file answers a shipped text sample greedily, and the best file of the model
at hand (Q8_0 or better when one is on disk: the reference) scores every file's answers, as the
mean log-probability per token it gives them. A file whose answers the reference finds as
likely as its own lost little by its quantisation."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

from specli.engine import Context, ContextConfig, Model
from specli.errors import SpecliError
from specli.measure.suite import Suite, parse_suite
from specli.prompt import prompt_tokens
from specli.resolve import local
from specli.resolve.gguf_header import GGUFHeader, read_gguf
from specli.speculate.verify import SamplingParams, log_softmax

SAMPLE_TOKENS = 64  # tokens of each answer to the sample


def sample() -> Suite:
    """The shipped text sample: short prompts of several kinds (code, prose, explanation, maths)."""
    text = resources.files("specli.measure.suites").joinpath("quality-sample.yaml").read_text(encoding="utf-8")
    return parse_suite(text, "quality-sample.yaml", "quality-sample")


def bits_per_weight(h: GGUFHeader) -> float:
    """Bits per weight of the file's matrices: what ranks quants of one model by precision."""
    bits = weights = 0.0
    for t in h.tensors:
        if len([d for d in t.shape if d > 1]) < 2 or t.nbytes is None:
            continue
        n = float(np.prod(t.shape))
        bits += 8.0 * t.nbytes
        weights += n
    return bits / weights if weights else 0.0


@dataclass(frozen=True)
class Candidate:
    path: str
    quant: str
    bits: float  # bits per weight


def candidate(path: str) -> Candidate:
    h = read_gguf(path)
    return Candidate(path, local.summarise(h).quant, bits_per_weight(h))


def reference(paths: list[str], explicit: str | None = None,
              on_disk: list[local.LocalModel] | None = None) -> Candidate:
    """The file that scores the others: ``explicit`` when given; else, among ``paths`` and the
    other files of the same model in the local stores, the one with the most bits per weight."""
    if explicit:
        return candidate(explicit)
    others = local.other_files(read_gguf(paths[0]), paths, on_disk)
    return max((candidate(p) for p in [*paths, *(m.path for m in others)]), key=lambda c: c.bits)


def answers(model: Model, ctx: Context, suite: Suite, generate, max_tokens: int = SAMPLE_TOKENS
            ) -> list[tuple[list[int], list[int]]]:
    """(prompt, greedy answer) token lists of every sample prompt; ``generate(tokens, params,
    n)`` yields response chunks (a session's plain decoding)."""
    use_chat = model.chat_template() is not None
    out = []
    for p in suite.prompts:
        toks = prompt_tokens(model, p, use_chat)
        ctx.clear()
        resp = generate(toks, SamplingParams(0.0), max_tokens)
        out.append((toks, [t for ch in resp for t in ch.tokens]))
    return out


def mean_logprob(ctx: Context, pairs: list[tuple[list[int], list[int]]]) -> float:
    """Mean log-probability per answer token that ``ctx``'s model gives the answers, each
    after its prompt (natural log)."""
    total, n = 0.0, 0
    for prompt, answer in pairs:
        if not answer:
            continue
        ctx.clear()
        ctx.eval(prompt[:-1], logits="none")
        block = [prompt[-1], *answer[:-1]]
        for start in range(0, len(block), ctx.n_batch):
            chunk = block[start:start + ctx.n_batch]
            rows = ctx.eval(chunk, logits="all")
            for i, row in enumerate(rows):
                total += float(log_softmax(row)[answer[start + i]])
                n += 1
    return total / n if n else float("nan")


def score(ctx: Context, answered: dict[str, list[tuple[list[int], list[int]]]]) -> dict[str, float]:
    """Each file's answers (by path) scored by the reference's context ``ctx``."""
    return {path: mean_logprob(ctx, pairs) for path, pairs in answered.items()}


def score_loading(ref: Candidate, answered: dict[str, list[tuple[list[int], list[int]]]], threads: int | None,
                  n_gpu_layers: int = 0) -> dict[str, float]:
    """:func:`score` with the reference loaded for this alone (it is none of the files compared)."""
    try:
        m = Model(ref.path, n_gpu_layers=n_gpu_layers)
    except Exception as e:  # noqa: BLE001 - llama.cpp's load failure, said in one line
        raise SpecliError(f"cannot load the quality reference {ref.path}: {e}") from None
    try:
        longest = max((len(p) + len(a) for pairs in answered.values() for p, a in pairs), default=16)
        ctx = Context(m, ContextConfig(n_ctx=longest + 16, n_threads=threads))
        try:
            return score(ctx, answered)
        finally:
            ctx.close()
    finally:
        m.close()
