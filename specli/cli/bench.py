"""specli bench."""

from __future__ import annotations

import json
import os
import sys

import typer

from specli.cli.benchreport import suite_progress, write_report
from specli.cli.common import (
    TARGET_HELP,
    CtxOpt,
    DraftMaxOpt,
    DraftOpt,
    GpuLayersOpt,
    LookupHistoryOpt,
    ProfileOpt,
    Terminated,
    ThreadsOpt,
    VramOpt,
    app,
    err,
    model_options,
    one_line_errors,
)
from specli.errors import SpecliError
from specli.speculate.settings import DEFAULTS, N_CTX

BENCH_EPILOG = """
Examples:

  specli bench --target qwen2.5-coder-1.5b-instruct-q4_k_m --draft qwen2.5-coder-0.5b-instruct-q4_k_m

  specli bench --target model.gguf --draft lookup --suite grounded --json --out report.json

  specli bench --target model.gguf --suite my_prompts.yaml --modes none,lookup --repeat 2

  specli bench --target model-Q4_K_M.gguf --target model-Q4_0.gguf --suite grounded --modes none,lookup
"""


@app.command(epilog=BENCH_EPILOG)
@one_line_errors
def bench(
    click_ctx: typer.Context,
    target: list[str] | None = typer.Option(None, "--target", "-m",
                                            help=TARGET_HELP + " Repeat it to compare files of one model (two "
                                                               "quants) side by side."),
    profile: ProfileOpt = None,
    draft: DraftOpt = "auto",
    suite: str = typer.Option("code,grounded,chat,unpredictable", "--suite", "-s",
                              help="Suite names (comma-separated) or a YAML/JSONL file of prompts."),
    modes: str = typer.Option("none,lookup,lookup-history,model,hybrid,mtp,mtp-lookup,eagle3,eagle3-lookup,dflash,"
                              "dflash-lookup", "--modes",
                              help="Modes to compare, named as --draft and --stats name them: none (plain "
                                   "decoding, the baseline), lookup, lookup-history (lookup that also copies from "
                                   "the answers to the suite's earlier prompts; every other mode runs without "
                                   "history), lookup-fixed, model, hybrid, model-fixed, mtp, "
                                   "mtp-lookup, mtp-fixed, eagle3, eagle3-lookup, eagle3-fixed, dflash, "
                                   "dflash-lookup, dflash-fixed (those the models allow: model and hybrid with a "
                                   "draft model, mtp with MTP layers, the target's or an MTP-only head's, eagle3 "
                                   "with an EAGLE-3 head, dflash with a DFlash head)."),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", min=1, help="Tokens per prompt."),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Measured passes over the suite."),
    draft_max: DraftMaxOpt = DEFAULTS.draft_max,
    lookup_history: LookupHistoryOpt = DEFAULTS.lookup_history,
    ctx: CtxOpt = N_CTX,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = None,
    vram: VramOpt = None,
    compare_lcp: bool = typer.Option(False, "--compare-llama-cpp-python",
                                     help="Also time llama-cpp-python's own LlamaPromptLookupDecoding."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    out: str | None = typer.Option(None, "--out", "-o", help="Write the JSON report to this file."),
    reference: str | None = typer.Option(None, "--reference",
                                         help="With several --target files: the file whose log-probabilities "
                                              "score their answers to the quality sample (default: the one with "
                                              "the most bits per weight among them and the same model's files "
                                              "on disk, Q8_0 or better where there is one)."),
):
    """Plain vs speculative decoding side by side: speed, acceptance, and proof the text is the same.
    Several --target files of one model (two quants) are compared side by side in one run."""
    from specli.measure.bench import LCP, parse_modes
    from specli.speculate import registry

    mode_list = parse_modes(modes)  # a wrong name fails before any model loads
    if compare_lcp:
        mode_list.append(LCP)
    opts = model_options(click_ctx)
    if opts.draft == "auto" and all(m == LCP or registry.mode(m).kind.entry.paid is None for m in mode_list):
        opts.draft = "none"  # no mode compared drafts with a model or a head: none is looked for or loaded
    targets = list(target or [])
    opts.target = targets[0] if targets else None
    suites = _suites(suite)
    if len(targets) > 1:
        from specli.cli.compare import compare_files
        compare_files(opts, targets, reference, suites, mode_list, max_tokens, repeat, as_json, out)
        return
    if reference:
        raise SpecliError("--reference scores several --target files against each other: give two or more")
    _bench_one(opts, suites, mode_list, max_tokens, repeat, as_json, out)


def _bench_one(opts, suites: list, mode_list: list[str], max_tokens: int, repeat: int, as_json: bool,
               out: str | None) -> None:
    """One target: every mode over every suite, a table per suite (or JSON)."""
    from rich.console import Console

    from specli.measure.bench import run_bench
    from specli.session import Session

    sess = Session(opts, progress=err, build_drafter=False)
    for note in opts.notes:
        err(note)
    reports: list = []
    partial: list = []  # the suite being measured, as far as it got

    def keep(rep) -> None:
        partial[:] = [rep]
        if out:
            write_report(out, [r.to_dict() for r in reports] + [{**rep.to_dict(), "partial": True}], len(suites))

    try:
        with suite_progress(as_json) as progress_for:
            for s in suites:
                reports.append(run_bench(sess, s, mode_list, max_tokens, repeat, progress_for(s.name), on_result=keep))
                partial.clear()
    except (KeyboardInterrupt, Terminated):
        # Ctrl-C or SIGTERM: the --out file keeps every prompt measured so far, marked as such
        if out and (reports or partial):
            cut = [{**r.to_dict(), "partial": True, "interrupted": True} for r in partial]
            write_report(out, [r.to_dict() for r in reports] + cut, len(suites))
        raise
    sess.close()
    data = [r.to_dict() for r in reports]
    if out:
        write_report(out, data, len(suites))
    if as_json:
        print(json.dumps(data if len(data) > 1 else data[0], indent=1))
        return
    from specli.measure.report import render_tables
    render_tables(reports, Console(width=None if sys.stdout.isatty() else 160))


def _suites(suite: str):
    """``--suite``: shipped suite names, comma-separated, or one file."""
    from specli.measure.suite import load_suite

    if os.path.exists(suite):
        return [load_suite(suite)]
    return [load_suite(s.strip()) for s in suite.split(",") if s.strip()]
