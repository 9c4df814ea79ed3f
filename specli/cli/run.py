"""specli run (and --plan), specli doctor."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import typer

from specli.cli.common import (
    AdaptiveOpt,
    CtxOpt,
    DraftGpuLayersOpt,
    DraftMaxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LookupHistoryOpt,
    LookupOpt,
    ProfileOpt,
    SeedOpt,
    TargetOpt,
    TempOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VramOpt,
    app,
    err,
    model_options,
    one_line_errors,
    read_prompt,
)
from specli.speculate.settings import DEFAULTS, N_CTX

RUN_EPILOG = """
Examples:

  echo "Write a quicksort in Python" | specli run --target model.gguf --draft draft.gguf

  specli run --target qwen2.5-coder-1.5b-instruct-q4_k_m --draft lookup --file edit_request.txt --stats

  specli run --target model.gguf --draft none --prompt "Hello" --json

  specli run --profile default --json-schema person.schema.json --prompt "Extract: Ada Lovelace, 36"

  specli run --profile default --batch items.jsonl --out results.jsonl --parallel 4
"""


@app.command(epilog=RUN_EPILOG)
@one_line_errors
def run(
    click_ctx: typer.Context,
    target: TargetOpt = None,
    profile: ProfileOpt = None,
    draft: DraftOpt = "auto",
    prompt: str | None = typer.Option(None, "--prompt", "-p", help="Prompt text (default: standard input)."),
    file: str | None = typer.Option(None, "--file", "-f", help="Read the prompt from this file."),
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", min=1, help="Most tokens to generate."),
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = None,
    draft_max: DraftMaxOpt = DEFAULTS.draft_max,
    draft_p_min: DraftPMinOpt = DEFAULTS.draft_p_min,
    adaptive: AdaptiveOpt = True,
    lookup: LookupOpt = True,
    lookup_history: LookupHistoryOpt = DEFAULTS.lookup_history,
    ctx: CtxOpt = N_CTX,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = None,
    draft_gpu_layers: DraftGpuLayersOpt = None,
    vram: VramOpt = None,
    plan: bool = typer.Option(False, "--plan", help="Print where each model would go, and why; generate nothing."),
    chat: bool | None = typer.Option(None, "--chat/--raw",
                                        help="Apply the model's chat template (default when it has one)."),
    system: str | None = typer.Option(None, "--system", help="System prompt (with --chat)."),
    stats: bool = typer.Option(False, "--stats", help="Print a one-line summary to stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the text and stats."),
    json_schema: str | None = typer.Option(None, "--json-schema", metavar="FILE",
                                              help="Constrain the output to this JSON schema (a .json file)."),
    regex: str | None = typer.Option(None, "--regex", metavar="RE",
                                        help="Constrain the output to match this regular expression."),
    grammar: str | None = typer.Option(None, "--grammar", metavar="FILE",
                                          help="Constrain the output to this grammar: GBNF (llama.cpp's), "
                                               "or Lark when the file ends in .lark."),
    batch: str | None = typer.Option(None, "--batch", metavar="FILE",
                                        help="Run every line of this JSONL file ('-': standard input): {\"id\", "
                                             "\"prompt\" or \"messages\"}, optionally max_tokens, temperature, "
                                             "seed, json_schema. One JSON line per item, in input order "
                                             "(docs/batch.md)."),
    out: str | None = typer.Option(None, "--out", "-o", metavar="FILE",
                                      help="With --batch: append the results here; a rerun skips the ids "
                                           "already written."),
    strict: bool = typer.Option(False, "--strict", help="With --batch: a bad line stops the job before "
                                                        "anything runs (default: it is reported and skipped)."),
    parallel: int = typer.Option(1, "--parallel", min=1, max=64,
                                 help="With --batch: items generated at once, in one batch (as serve --parallel)."),
):
    """Generate from a prompt on standard input; text streams to standard output."""
    from specli.constrain import from_options
    from specli.session import Session
    from specli.speculate.verify import SamplingParams

    opts = model_options(click_ctx)
    code = _other_job(click_ctx, opts)  # --plan, --batch
    if code is not None:
        raise typer.Exit(code)
    constraint = from_options(json_schema, regex, grammar)
    text = read_prompt(prompt, file)
    sess = Session(opts, progress=err)
    toks = sess.prompt_tokens(text, chat, system)
    for note in opts.notes:
        err(note)
    _cheaper_quant(opts.target, sess.target.path, sess.draft_model.path if sess.draft_model else None)
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
    resp = sess.generate(toks, params, max_tokens, constraint=constraint)
    st = resp.stats
    pieces: list[str] = []
    out_tokens: list[int] = []
    interrupted = False
    try:
        for ch in resp:
            out_tokens += ch.tokens
            if as_json:
                pieces.append(ch.text)
            else:
                sys.stdout.write(ch.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
        st.stop = "interrupted"
    if as_json:
        est = sess.plain_rate_estimate()
        st_extra = {"plain_tokens_per_s_estimate": est} if est else {}
        out = {"text": "".join(pieces), "tokens": out_tokens, "prompt_tokens": toks, "target": sess.target.path,
               "draft": sess.draft_model.path if sess.draft_model else sess.drafter.name,
               "finish_reason": resp.finish_reason, "placement": sess.placement(),
               "settings": settings_report(sess),
               "stats": {**st.to_dict(), **st_extra}}
        print(json.dumps(out, ensure_ascii=False))
    elif not interrupted:
        sys.stdout.write("\n")
    sys.stdout.flush()
    if resp.finish_reason == "context":
        err(f"stopped after {len(out_tokens)} tokens: the context ({sess.ctx.n_ctx} tokens) is full; "
            "use a larger --ctx")
    if stats:
        err(st.summary())
    slower = sess.slower_than_plain(st)
    if slower:
        err(slower)
    sess.close()
    if interrupted:
        raise typer.Exit(130)


def _other_job(click_ctx: typer.Context, opts) -> int | None:
    """``--plan`` (print the plan) or ``--batch`` (run the file's items); their exit status,
    None for a single prompt."""
    p = click_ctx.params
    if p["plan"]:
        print_plan(opts)
        return 0
    if p["batch"] is not None or p["out"] or p["strict"] or p["parallel"] > 1:
        from specli.cli.batch import run_batch
        return run_batch(click_ctx, opts)
    return None


def _cheaper_quant(ref: str | None, path: str, draft: str | None = None) -> None:
    """One line when the same model verifies clearly cheaper here in another quant (never a
    switch); one when a converted copy of the draft would draft cheaper."""
    from specli.errors import SpecliError
    from specli.hardware import advice, draft_offer
    from specli.resolve.gguf_header import read_gguf

    try:
        hints = [advice.flatter_line(ref, read_gguf(path), path), draft_offer.run_line(path, draft)]
    except SpecliError:
        return
    for hint in filter(None, hints):
        err(hint)


def settings_report(sess) -> dict:
    """The settings the run used: the context, the speculation settings and --lookup."""
    spec = dataclasses.asdict(sess.opts.spec)
    return {"ctx": sess.ctx.n_ctx, **spec, "lookup": sess.opts.lookup}


def print_plan(opts) -> None:
    from specli.hardware.placement import plan_for
    from specli.hardware.plan import memory_from_header
    from specli.resolve.choose import choose_models
    from specli.resolve.gguf_header import read_gguf
    from specli.util import fmt_size

    tpath, asked, _ = choose_models(opts, progress=err)
    for note in opts.notes:
        err(note)
    p, hw, n_ctx = plan_for(opts, tpath, asked)
    draft = asked.placed(p)
    budget = "none (CPU only)" if hw.budget is None else f"{fmt_size(hw.budget)} ({hw.budget_source})"
    print(f"backend      {', '.join(hw.backends)} (GPU offload {'yes' if hw.can_offload else 'no'})")
    print(f"GPU budget   {budget}")
    print(f"context      {n_ctx} tokens")
    own = draft.draft_path if draft.draft_path != asked.draft_path else None  # the VRAM fallback's
    for label, path in (("target", tpath), ("draft", asked.draft_path), ("derived", own), ("head", asked.head)):
        if path:
            h = read_gguf(path)
            m = memory_from_header(h, name=label)
            mtp = f" (MTP layers: {h.mtp_layers})" if h.mtp_layers else ""
            print(f"{label:<12} {os.path.basename(path)}: weights {fmt_size(m.weights)} in {m.n_layer} layers{mtp}, "
                  f"KV {fmt_size(m.kv(n_ctx))}, buffers {fmt_size(m.compute())}, "
                  f"all on GPU {fmt_size(m.gpu_bytes(-1, n_ctx))}")
    layers = "all" if p.target_gpu_layers < 0 else str(p.target_gpu_layers)
    dl = "all" if p.draft_gpu_layers < 0 else str(p.draft_gpu_layers)
    print(f"plan         target layers on GPU: {layers}; drafter: {draft.mode}"
          + (f" (draft layers on GPU: {dl})" if draft.draft_path else "")
          + (f" (head: {os.path.basename(draft.head)}, placed as the target)" if draft.head else ""))
    print(f"why          {p.summary} [{p.branch}]")


@app.command()
@one_line_errors
def doctor(vram: str | None = typer.Option(None, "--vram", help="Pretend this much GPU memory is free."),
           measure_kernels: bool = typer.Option(False, "--kernels", help="Time each quant type's batched kernels "
                                                "now (tiny generated models; a minute or two) and cache them.")):
    """What this machine and this llama.cpp build can do, and how to fix a build that cannot use the GPU."""
    from specli.hardware.devices import detect, reinstall_hint
    from specli.util import fmt_size

    hw = detect(vram)
    print(f"llama-cpp-python {hw.llama_cpp_python}; backends: {', '.join(hw.backends)}")
    print(f"GPU offload in this build: {'yes' if hw.can_offload else 'no'}")
    if hw.devices:
        for d in hw.devices:
            print(f"device: {d.name} ({d.kind}), {fmt_size(d.free)} free of {fmt_size(d.total)}")
    else:
        print("devices: no GPU found (nvidia-smi absent or silent; not Apple silicon): CPU only")
    budget = "none" if hw.budget is None else f"{fmt_size(hw.budget)} ({hw.budget_source})"
    print(f"budget specli plans with: {budget}")
    print(f"CPU threads: {hw.threads}")
    from specli.engine import mtp_available
    print(f"MTP self-speculation (models with MTP layers, --draft mtp): {'yes' if mtp_available() else 'no'}; "
          "hybrid/recurrent targets: rollback by snapshots or checkpoints")
    print(f"llama.cpp: {hw.system_info}")
    from specli.hardware import kernels
    print(kernels.doctor_line(kernels.costs(measure_now=measure_kernels, progress=err)))
    hint = reinstall_hint(hw)
    if hint:
        print(f"this build cannot use your GPU; reinstall with:\n  {hint}")


