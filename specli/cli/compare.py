"""``specli bench --target A --target B``: files of one model compared side by side (the library:
:mod:`specli.measure.compare`)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from specli.cli.common import Terminated, err
from specli.measure import compare, quality
from specli.measure.suite import Suite
from specli.options import Options


def _paths(refs: list[str]) -> list[str]:
    from specli.resolve import models

    return [models.resolve(r, progress=err) for r in refs]


def compare_files(opts: Options, targets: list[str], reference: str | None, suites: list[Suite], modes: list[str],
                  max_tokens: int, repeat: int, as_json: bool, out: str | None) -> None:
    """Each target its own session (the options' draft and settings), every file's modes measured
    over every suite with the files' runs interleaved, then each file's answers to the quality
    sample scored by the reference; a table per suite and the files' summary, or JSON."""
    from rich.console import Console

    from specli.cli.benchreport import write_report
    from specli.session import Session

    cmp, ref = _comparison(targets, reference)
    sessions: list[Session] = []
    try:
        for p in cmp.paths:
            o = dataclasses.replace(opts, target=p, notes=[], given=set(opts.given))
            sessions.append(Session(o, progress=err, build_drafter=False))
            for note in o.notes:
                err(note)
        answered = _measure(cmp, sessions, suites, modes, max_tokens, repeat, as_json, out)
        cmp.reference = ref
        for f, q in zip(cmp.files, _score(ref, sessions, answered, opts.threads), strict=True):
            f.quality = q
    except (KeyboardInterrupt, Terminated):
        if out and any(f.reports for f in cmp.files):
            write_report(out, [{**cmp.to_dict(), "partial": True, "interrupted": True}], 1)
        raise
    finally:
        for s in sessions:
            s.close()
    if out:
        write_report(out, [cmp.to_dict()], 1)
    if as_json:
        print(json.dumps(cmp.to_dict(), indent=1))
        return
    from specli.measure.report import render_comparison
    render_comparison(cmp, Console(width=None if sys.stdout.isatty() else 160))


def _comparison(targets: list[str], reference: str | None) -> tuple[compare.Comparison, quality.Candidate]:
    """The files (resolved, their tokenizers compared from the headers before anything loads),
    their predicted curves, and the reference that will score their answers."""
    from specli.hardware import calibrate

    paths = _paths(targets)
    compare.check_files(paths)
    ref = quality.reference(paths, _paths([reference])[0] if reference else None)
    if reference and os.path.realpath(ref.path) != os.path.realpath(paths[0]):
        compare.check_files([paths[0], ref.path])  # one model's files, the reference too
    table = calibrate.kernel_table()
    return compare.Comparison([compare.file_result(p, table) for p in paths], sample="quality-sample"), ref


def _measure(cmp: compare.Comparison, sessions, suites: list[Suite], modes: list[str], max_tokens: int,
             repeat: int, as_json: bool, out: str | None) -> dict[str, list]:
    """Every suite over the files (a progress bar on a terminal; ``--out`` kept as it goes),
    then each file's greedy answers to the quality sample."""
    from specli.cli.benchreport import suite_progress, write_report

    def keep(reports) -> None:
        if out:
            partial = dataclasses.replace(cmp, files=[dataclasses.replace(f, reports=[*f.reports, r])
                                                      for f, r in zip(cmp.files, reports, strict=True)])
            write_report(out, [{**partial.to_dict(), "partial": True}], 1)

    with suite_progress(as_json) as progress_for:
        for s in suites:
            reports = compare.run_files(sessions, s, modes, max_tokens, repeat, progress_for(s.name), keep)
            for f, r in zip(cmp.files, reports, strict=True):
                f.reports.append(r)
        progress_for("quality sample")("each file's answers", 0, 1)
        return compare.answer_sample(sessions, quality.sample())


def _score(ref: quality.Candidate, sessions, answered, threads: int | None) -> list[float]:
    """Each file's answers scored by the reference, in the files' order: in one of the files'
    open contexts, or with the files closed first and the reference loaded for it alone."""
    for s in sessions:
        if os.path.realpath(s.target.path) == os.path.realpath(ref.path):
            return list(quality.score(s.ctx, answered).values())
    for s in sessions:
        s.close()
    err(f"quality: scoring the answers with {ref.path} ({ref.quant}, {ref.bits:.1f} bits per weight)")
    return list(quality.score_loading(ref, answered, threads).values())
