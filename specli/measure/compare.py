"""Files of one model side by side (``specli bench --target A --target B``): two quants, say. Each
file is a target of its own (its own session, drafters and plain baseline), the files' rounds
interleaved step by step so a busy neighbour slows them alike; each mode's speed is given over
its own file's plain decoding, and over the first file's plain, with each file's verify curve
predicted from its header (this machine's kernel table) and the quality its quantisation kept
(:mod:`specli.measure.quality`)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specli.errors import SpecliError
from specli.hardware.predict import Prediction, predict
from specli.measure import quality
from specli.measure.bench import PLAIN, BenchReport, BenchRun
from specli.measure.suite import Suite
from specli.resolve import local
from specli.resolve.gguf_header import read_gguf

if TYPE_CHECKING:
    from specli.session import Session


@dataclass
class FileResult:
    """One file's row of the comparison."""

    path: str
    quant: str
    bits: float  # bits per weight of its matrices
    prediction: Prediction | None  # its verify curve here, from the header (None: kernels not measured)
    reports: list[BenchReport] = field(default_factory=list)  # one per suite
    quality: float | None = None  # mean log-probability the reference gives its answers to the sample

    def plain(self, suite: int = 0) -> float:
        r = self.reports[suite].results.get(PLAIN) if self.reports else None
        return r.tokens_per_s if r else 0.0

    def to_dict(self) -> dict:
        return {"file": self.path, "quant": self.quant, "bits_per_weight": round(self.bits, 3),
                "predicted": self.prediction.to_json() if self.prediction else None,
                "quality_mean_logprob": None if self.quality is None else round(self.quality, 4),
                "suites": [r.to_dict() for r in self.reports]}


@dataclass
class Comparison:
    files: list[FileResult]
    reference: quality.Candidate | None = None  # the file that scored the answers (None: not scored)
    sample: str = ""

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def to_dict(self) -> dict:
        ref = self.reference
        return {"files": [f.to_dict() for f in self.files],
                "quality": None if ref is None else {
                    "reference": ref.path, "reference_quant": ref.quant, "sample": self.sample,
                    "tokens_per_answer": quality.SAMPLE_TOKENS,
                    "measure": "mean log-probability per token the reference gives each file's greedy answers"}}


def check_files(paths: list[str]) -> None:
    """Files compared must be one model's (architecture, size, tokenizer: checked from the
    headers, before anything loads); the same file twice is a mistake."""
    seen: dict[str, str] = {}
    first = local.summarise(read_gguf(paths[0]))
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            raise SpecliError(f"--target {p} names the same file as {seen[real]}: bench compares different files")
        seen[real] = p
        s = local.summarise(read_gguf(p))
        if not local.same_model(first, s):
            what = "another tokenizer" if s.tokenizer != first.tokenizer else \
                f"another model ({s.architecture}, {s.params / 1e6:.0f}M parameters)"
            raise SpecliError(f"{p} has {what} than {paths[0]}: bench compares files of one model (two quants, say)")


def file_result(path: str, table: dict | None) -> FileResult:
    c = quality.candidate(path)
    return FileResult(path, c.quant, c.bits, predict(read_gguf(path), table))


def run_files(sessions: list[Session], suite: Suite, modes: list[str], max_tokens: int, repeat: int,
              progress: Callable[[str, int, int], None] | None = None,
              on_result: Callable[[list[BenchReport]], None] | None = None) -> list[BenchReport]:
    """Every mode over ``suite`` on each session's target, the files' measured runs alternating
    one by one (a :class:`BenchRun` per file)."""
    names = [os.path.basename(s.target.path) for s in sessions]
    runs: list[BenchRun] = []

    def tell(i: int):
        def prog(desc: str, _done: int, _total: int) -> None:
            if progress:
                progress(f"{names[i]} · {desc}", sum(r.done for r in runs), sum(r.total for r in runs))
        return prog

    def keep(_rep: BenchReport) -> None:
        if on_result and len(runs) == len(sessions):
            on_result([r.report() for r in runs])

    runs.extend(BenchRun(s, suite, modes, max_tokens, repeat, tell(i), None, keep) for i, s in enumerate(sessions))
    for r in runs:
        r.warm_up()
    for rep in range(repeat):
        for _ in itertools.zip_longest(*(r.steps(rep) for r in runs)):
            pass
    return [r.report() for r in runs]


def answer_sample(sessions: list[Session], sample: Suite) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Each file's greedy answers to the sample (plain decoding), by path."""
    from specli.speculate.drafters import NoDrafter

    out: dict[str, list[tuple[list[int], list[int]]]] = {}
    for s in sessions:
        def gen(toks, params, n, s=s):
            return s.generate(toks, params, n, NoDrafter(), history=None)
        out[s.target.path] = quality.answers(s.target, s.ctx, sample, gen)
    return out
