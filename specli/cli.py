"""The ``specli`` command line: parses options, calls the library, prints."""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Optional

import typer

from .errors import SpecliError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
    help="Faster answers from local GGUF models with lossless speculative decoding (llama.cpp).",
)


@app.callback()
def _root() -> None:
    """specli: lossless speculative decoding for local GGUF models."""


def err(msg: str) -> None:
    print(f"specli: {msg}", file=sys.stderr, flush=True)


def one_line_errors(fn):
    """Bad input ends in one line on stderr and a non-zero exit, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except SpecliError as e:
            err(f"error: {e}")
            raise typer.Exit(e.exit_code)
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(130)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as e:  # noqa: BLE001
            if os.environ.get("SPECLI_DEBUG"):
                raise
            err(f"internal error: {type(e).__name__}: {e} (set SPECLI_DEBUG=1 for a traceback)")
            raise typer.Exit(70)

    return wrapper


def read_prompt(prompt: Optional[str], file: Optional[str]) -> str:
    if prompt is not None and file is not None:
        raise SpecliError("give the prompt once: --prompt or --file, not both")
    if prompt is not None:
        text = prompt
    elif file is not None:
        try:
            with open(file, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise SpecliError(f"prompt file not found: {file}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecliError(f"cannot read prompt file {file}: {e}") from None
    else:
        if sys.stdin is None or sys.stdin.isatty():
            raise SpecliError("no prompt: pipe text in (specli run < prompt.txt), or use --prompt or --file")
        text = sys.stdin.read()
    if not text.strip():
        raise SpecliError("the prompt is empty" + ("" if prompt or file else " (nothing on standard input)"))
    return text


RUN_EPILOG = """
Examples:

  echo "Write a quicksort in Python" | specli run --target model.gguf --draft draft.gguf

  specli run --target qwen2.5-coder-1.5b-instruct-q4_k_m --draft lookup --file edit_request.txt --stats

  specli run --target model.gguf --draft none --prompt "Hello" --json
"""


def given_options(click_ctx: typer.Context) -> set[str]:
    """The options a profile could fill that the user typed (those stay as typed)."""
    from click.core import ParameterSource

    from .profile import DEFAULTS
    return {p for p in DEFAULTS if click_ctx.get_parameter_source(p) not in (None, ParameterSource.DEFAULT)}


TARGET_HELP = "Target model: a GGUF path, org/repo:QUANT on the Hub, pypi:NAME, or a profile name."
DRAFT_HELP = "Draft: a model reference (as for --target), 'lookup' (prompt lookup), 'auto' or 'none' (plain)."
# the model options run, chat and bench share
TARGET_OPTION = typer.Option(None, "--target", "-m", help=TARGET_HELP)
PROFILE_OPTION = typer.Option(None, "--profile", "-P", help="A target/draft pair (specli profiles).")
DRAFT_OPTION = typer.Option("auto", "--draft", "-d", help=DRAFT_HELP)
# generation and hardware options run and chat share (bench has its own --draft-max and --gpu-layers)
TEMP_OPTION = typer.Option(0.0, "--temp", min=0.0, help="Temperature; 0 is greedy.")
TOP_K_OPTION = typer.Option(0, "--top-k", min=0, help="Top-k sampling (0: off).")
TOP_P_OPTION = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Top-p (nucleus) sampling (1: off).")
SEED_OPTION = typer.Option(None, "--seed", help="Random seed for sampling.")
DRAFT_MAX_OPTION = typer.Option(16, "--draft-max", min=0, help="Most tokens drafted per step.")
LOOKUP_OPTION = typer.Option(True, "--lookup/--no-lookup",
                             help="With a draft model, also copy from the context when it repeats.")
CTX_OPTION = typer.Option(4096, "--ctx", "-c", min=0, help="Context size in tokens (0: the model's own).")
THREADS_OPTION = typer.Option(None, "--threads", "-t", min=1, help="CPU threads.")
GPU_LAYERS_OPTION = typer.Option(None, "--gpu-layers", "-ngl",
                                 help="Target layers on the GPU (-1: all; default: the hardware plan).")
VRAM_OPTION = typer.Option(None, "--vram", help="GPU memory budget, e.g. 6GiB (default: detected; env SPECLI_VRAM).")


@app.command(epilog=RUN_EPILOG)
@one_line_errors
def run(
    click_ctx: typer.Context,
    target: Optional[str] = TARGET_OPTION,
    profile: Optional[str] = PROFILE_OPTION,
    draft: str = DRAFT_OPTION,
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="Prompt text (default: standard input)."),
    file: Optional[str] = typer.Option(None, "--file", "-f", help="Read the prompt from this file."),
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", min=1, help="Most tokens to generate."),
    temp: float = TEMP_OPTION,
    top_k: int = TOP_K_OPTION,
    top_p: float = TOP_P_OPTION,
    seed: Optional[int] = SEED_OPTION,
    draft_max: int = DRAFT_MAX_OPTION,
    draft_p_min: float = typer.Option(0.6, "--draft-p-min", min=0.0, max=1.0,
                                      help="Draft model stops when its top probability falls below this."),
    adaptive: bool = typer.Option(True, "--adaptive/--fixed",
                                  help="Choose the draft length per step from measured costs (default), "
                                       "or always draft up to --draft-max."),
    lookup: bool = LOOKUP_OPTION,
    ctx: int = CTX_OPTION,
    threads: Optional[int] = THREADS_OPTION,
    gpu_layers: Optional[int] = GPU_LAYERS_OPTION,
    draft_gpu_layers: Optional[int] = typer.Option(None, "--draft-gpu-layers",
                                                   help="Draft layers on the GPU (default: the hardware plan)."),
    vram: Optional[str] = VRAM_OPTION,
    plan: bool = typer.Option(False, "--plan", help="Print where each model would go, and why; generate nothing."),
    chat: Optional[bool] = typer.Option(None, "--chat/--raw",
                                        help="Apply the model's chat template (default when it has one)."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt (with --chat)."),
    stats: bool = typer.Option(False, "--stats", help="Print a one-line summary to stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the text and stats."),
):
    """Generate from a prompt on standard input; text streams to standard output."""
    from .decode import Stats
    from .session import Options, Session
    from .verify import SamplingParams

    opts = Options(target=target, draft=draft, profile=profile, n_ctx=ctx, threads=threads, gpu_layers=gpu_layers,
                   draft_gpu_layers=draft_gpu_layers, vram=vram, draft_max=draft_max, draft_p_min=draft_p_min,
                   adaptive=adaptive, hybrid=lookup, given=given_options(click_ctx))
    if plan:
        print_plan(opts)
        return
    text = read_prompt(prompt, file)
    sess = Session(opts, progress=err)
    toks = sess.prompt_tokens(text, chat, system)
    for note in opts.notes:
        err(note)
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
    st = Stats()
    pieces: list[str] = []
    out_tokens: list[int] = []
    interrupted = False
    try:
        for ch in sess.generate(toks, params, max_tokens, st):
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
               "stats": {**st.to_dict(), **st_extra}}
        print(json.dumps(out, ensure_ascii=False))
    elif not interrupted:
        sys.stdout.write("\n")
    sys.stdout.flush()
    if stats:
        err(st.summary())
    slower = sess.slower_than_plain(st)
    if slower:
        err(slower)
    sess.close()
    if interrupted:
        raise typer.Exit(130)


def print_plan(opts) -> None:
    from .gguf_meta import read_gguf
    from .plan import fmt, memory_from_header
    from .session import choose_models, plan_for

    tpath, dpath, _ = choose_models(opts, progress=err)
    for note in opts.notes:
        err(note)
    p, hw, n_ctx = plan_for(opts, tpath, dpath)
    budget = "none (CPU only)" if hw.budget is None else f"{fmt(hw.budget)} ({hw.budget_source})"
    print(f"backend      {', '.join(hw.backends)} (GPU offload {'yes' if hw.can_offload else 'no'})")
    print(f"GPU budget   {budget}")
    print(f"context      {n_ctx} tokens")
    for label, path in (("target", tpath), ("draft", dpath)):
        if path:
            m = memory_from_header(read_gguf(path), name=label)
            print(f"{label:<12} {os.path.basename(path)}: weights {fmt(m.weights)} in {m.n_layer} layers, "
                  f"KV {fmt(m.kv(n_ctx))}, buffers {fmt(m.compute())}, all on GPU {fmt(m.gpu_bytes(-1, n_ctx))}")
    layers = "all" if p.target_gpu_layers < 0 else str(p.target_gpu_layers)
    dl = "all" if p.draft_gpu_layers < 0 else str(p.draft_gpu_layers)
    print(f"plan         target layers on GPU: {layers}; drafter: {p.draft}"
          + (f" (draft layers on GPU: {dl})" if p.draft == "model" else ""))
    print(f"why          {p.summary} [{p.branch}]")


@app.command()
@one_line_errors
def doctor(vram: Optional[str] = typer.Option(None, "--vram", help="Pretend this much GPU memory is free.")):
    """What this machine and this llama.cpp build can do, and how to fix a build that cannot use the GPU."""
    from .hardware import detect, reinstall_hint
    from .plan import fmt

    hw = detect(vram)
    print(f"llama-cpp-python {hw.llama_cpp_python}; backends: {', '.join(hw.backends)}")
    print(f"GPU offload in this build: {'yes' if hw.can_offload else 'no'}")
    if hw.devices:
        for d in hw.devices:
            print(f"device: {d.name} ({d.kind}), {fmt(d.free)} free of {fmt(d.total)}")
    else:
        print("devices: no GPU found (nvidia-smi absent or silent; not Apple silicon): CPU only")
    budget = "none" if hw.budget is None else f"{fmt(hw.budget)} ({hw.budget_source})"
    print(f"budget specli plans with: {budget}")
    print(f"CPU threads: {hw.threads}")
    print(f"llama.cpp: {hw.system_info}")
    hint = reinstall_hint(hw)
    if hint:
        print(f"this build cannot use your GPU; reinstall with:\n  {hint}")


BENCH_EPILOG = """
Examples:

  specli bench --target qwen2.5-coder-1.5b-instruct-q4_k_m --draft qwen2.5-coder-0.5b-instruct-q4_k_m

  specli bench --target model.gguf --draft lookup --suite grounded --json --out report.json

  specli bench --target model.gguf --suite my_prompts.yaml --modes plain,lookup --repeat 2
"""


@app.command(epilog=BENCH_EPILOG)
@one_line_errors
def bench(
    target: Optional[str] = TARGET_OPTION,
    profile: Optional[str] = PROFILE_OPTION,
    draft: str = DRAFT_OPTION,
    suite: str = typer.Option("code,grounded,chat,unpredictable", "--suite", "-s",
                              help="Suite names (comma-separated) or a YAML/JSONL file of prompts."),
    modes: str = typer.Option("plain,lookup,model,hybrid", "--modes",
                              help="Modes to compare: plain, lookup, model, hybrid, lookup-fixed, model-fixed."),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", min=1, help="Tokens per prompt."),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Measured passes over the suite."),
    draft_max: int = typer.Option(16, "--draft-max", min=1, help="Most tokens drafted per step."),
    ctx: int = CTX_OPTION,
    threads: Optional[int] = THREADS_OPTION,
    gpu_layers: int = typer.Option(0, "--gpu-layers", "-ngl", help="Layers to offload to the GPU (-1: all)."),
    compare_lcp: bool = typer.Option(False, "--compare-llama-cpp-python",
                                     help="Also time llama-cpp-python's own LlamaPromptLookupDecoding."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Write the JSON report to this file."),
):
    """Plain vs speculative decoding side by side: speed, acceptance, and proof the text is the same."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .bench import run_bench
    from .session import Options, choose_models
    from .suite import load_suite

    opts = Options(target=target, draft=draft, profile=profile)
    tpath, dpath, _ = choose_models(opts, progress=err)
    for note in opts.notes:
        err(note)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    if compare_lcp:
        mode_list.append("llama-cpp-python-lookup")
    suites = [load_suite(s.strip()) for s in suite.split(",") if s.strip()] if not os.path.exists(suite) \
        else [load_suite(suite)]
    console = Console(stderr=True)
    reports = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=as_json and not console.is_terminal) as prog:
        task = prog.add_task("bench", total=1)
        for s in suites:
            def progress(desc, done, total, _s=s):
                prog.update(task, description=f"{_s.name} · {desc}", completed=done, total=total)
            reports.append(run_bench(tpath, dpath, s, mode_list, max_tokens, repeat, ctx, threads, draft_max,
                                     gpu_layers, progress))
    data = [r.to_dict() for r in reports]
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(data if len(data) > 1 else data[0], f, indent=1)
    if as_json:
        print(json.dumps(data if len(data) > 1 else data[0], indent=1))
        return
    from .report import render_tables
    render_tables(reports, Console(width=None if sys.stdout.isatty() else 160))


CHAT_EPILOG = """
Examples:

  specli chat --target qwen2.5-coder-1.5b-instruct-q4_k_m --draft qwen2.5-coder-0.5b-instruct-q4_k_m

  specli chat --target model.gguf --draft lookup --system "You are terse." --show-drafts

In the chat: /reset forgets the conversation, /stats shows the last reply's numbers, /exit (or
Ctrl-D) quits, Ctrl-C stops the current reply. End a line with \\ to continue on the next, or
wrap several lines in triple quotes (\"\"\").
"""

DIM, CYAN, RESET = "\033[2m", "\033[36m", "\033[0m"


def _read_message(first_prompt: str = ">>> ", more_prompt: str = "... ") -> str:
    """One message: a line; a line ending in a backslash continues; triple quotes open a block."""
    line = input(first_prompt)
    if line.strip().startswith('"""'):
        body = [line.strip()[3:]]
        if body[0].endswith('"""') and len(line.strip()) >= 6:
            return body[0][:-3]
        while True:
            nxt = input(more_prompt)
            if nxt.rstrip().endswith('"""'):
                body.append(nxt.rstrip()[:-3])
                return "\n".join(body).strip("\n")
            body.append(nxt)
    parts = []
    while line.endswith("\\"):
        parts.append(line[:-1])
        line = input(more_prompt)
    parts.append(line)
    return "\n".join(parts)


@app.command(epilog=CHAT_EPILOG)
@one_line_errors
def chat(
    click_ctx: typer.Context,
    target: Optional[str] = TARGET_OPTION,
    profile: Optional[str] = PROFILE_OPTION,
    draft: str = DRAFT_OPTION,
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", min=1, help="Most tokens per reply."),
    temp: float = TEMP_OPTION,
    top_k: int = TOP_K_OPTION,
    top_p: float = TOP_P_OPTION,
    seed: Optional[int] = SEED_OPTION,
    draft_max: int = DRAFT_MAX_OPTION,
    lookup: bool = LOOKUP_OPTION,
    ctx: int = CTX_OPTION,
    threads: Optional[int] = THREADS_OPTION,
    gpu_layers: Optional[int] = GPU_LAYERS_OPTION,
    vram: Optional[str] = VRAM_OPTION,
    show_drafts: bool = typer.Option(False, "--show-drafts", help="Colour the tokens that came from the drafter."),
):
    """Interactive chat, streamed, with the conversation kept in the KV cache between turns."""
    from .chat import Chat
    from .session import Options, Session
    from .verify import SamplingParams

    opts = Options(target=target, draft=draft, profile=profile, n_ctx=ctx, threads=threads, gpu_layers=gpu_layers,
                   vram=vram, draft_max=draft_max, hybrid=lookup, given=given_options(click_ctx))
    sess = Session(opts, progress=err)
    if sess.target.chat_template() is None:
        raise SpecliError(f"{sess.target.name} has no chat template; use specli run --raw")
    for note in opts.notes:
        err(note)
    conv = Chat(sess, SamplingParams(temp, top_k, top_p, seed), max_tokens, system)
    color = sys.stdout.isatty() or os.environ.get("SPECLI_COLOR") == "1"
    dim = (lambda t: f"{DIM}{t}{RESET}") if color else (lambda t: t)
    print(dim(f"specli chat · {sess.target.name} · drafter {sess.drafter.name} · /help for commands"))
    while True:
        try:
            text = _read_message()
        except EOFError:
            print()
            break
        except KeyboardInterrupt:
            print(dim("\n(Ctrl-C stops a reply; /exit or Ctrl-D quits)"))
            continue
        cmd = text.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit", "/bye"):
            break
        if cmd == "/help":
            print(dim("/reset forget the conversation · /stats last reply · /exit quit · "
                      "end a line with \\ or use \"\"\" for several lines"))
            continue
        if cmd == "/reset":
            conv.reset()
            print(dim("(conversation cleared)"))
            continue
        if cmd == "/stats":
            print(dim(conv.last.summary() if conv.last else "(no reply yet)"))
            continue
        interrupted = False
        try:
            stream, dropped = conv.send(text)
            if dropped:
                print(dim(f"(the conversation no longer fits the context: dropped the {dropped} oldest messages)"))
            for ch in stream:
                if show_drafts and color and any(ch.from_draft):
                    pieces = [sess.target.piece(t).decode("utf-8", "replace") for t in ch.tokens]
                    out = "".join(f"{CYAN}{p}{RESET}" if f else p for p, f in zip(pieces, ch.from_draft))
                    sys.stdout.write(out if "".join(pieces) == ch.text else ch.text)
                else:
                    sys.stdout.write(ch.text)
                sys.stdout.flush()
        except SpecliError as e:
            err(f"error: {e}")
            conv.finish()
            continue
        except KeyboardInterrupt:
            interrupted = True
            conv.repair()
            if conv.last is not None:
                conv.last.stop = "interrupted"
        conv.finish()
        st = conv.last
        if st is None:
            continue
        line = f"{st.tokens_per_s:.1f} tok/s · {st.generated} tokens · mode {st.mode}"
        if st.drafted:
            line += f" · acceptance {100 * st.acceptance:.0f}%"
        line += f" · prompt {st.prompt_tokens - st.prompt_tokens_cached} new / {st.prompt_tokens_cached} cached"
        print("\n" + dim(("(stopped) " if interrupted else "") + line))
    sess.close()


@app.command(epilog="""
Examples:

  specli pull Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M

  specli pull default            # a whole profile: its target and drafts
""")
@one_line_errors
def pull(refs: list[str] = typer.Argument(..., help="Model references or profile names.")):
    """Download models (or every model of a profile) into the cache, checked."""
    from . import models
    from . import profile as profiles

    profs = profiles.load_all()
    for ref in refs:
        specs = []
        if ref in profs and not os.path.exists(ref):
            specs = [("target", profs[ref].target)] + [("draft", d) for d in profs[ref].drafts]
        else:
            specs = [("model", profiles.ModelSpec((ref,)))]
        for label, spec in specs:
            notes: list[str] = []
            path = models.resolve_spec(spec, progress=err, notes=notes)
            for n in notes:
                err(n)
            print(f"{label} {spec.ref}: {path}")


@app.command(epilog="""
Examples:

  specli check Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M

  specli check target.gguf draft.gguf
""")
@one_line_errors
def check(target: str = typer.Argument(..., help="Target model reference."),
          draft: str = typer.Argument(..., help="Draft model reference.")):
    """Can this draft speculate for this target? llama.cpp's tokenizer rules, from the GGUF
    headers alone (Hub files are read with range requests, not downloaded)."""
    from . import compat, models
    from .gguf_meta import vocab_from_header

    th, dh = models.header_of(target), models.header_of(draft)
    rules = compat.check_vocab(vocab_from_header(th), vocab_from_header(dh))
    for r in rules:
        print(f"{'✓' if r.ok else '✗'} {r.name}: {r.detail}")
    msg = compat.mismatch_message(rules)
    if msg:
        err(f"error: {msg}")
        raise typer.Exit(1)
    print("compatible: the draft can speculate for the target")


profiles_app = typer.Typer(help="Curated target/draft pairs: list them, or show one.", invoke_without_command=True)
app.add_typer(profiles_app, name="profiles")


@profiles_app.callback()
@one_line_errors
def profiles_list(click_ctx: typer.Context):
    """List the profiles (shipped, and yours in the config directory)."""
    if click_ctx.invoked_subcommand:
        return
    from . import profile as profiles

    for name, p in sorted(profiles.load_all().items()):
        drafts = ", ".join(d.ref for d in p.drafts) or "prompt lookup"
        print(f"{name:<20} {p.target.ref}  ⇐  {drafts}")
    print(f"(your own: {profiles.user_profile_dir()}/*.yaml)")


@profiles_app.command("show")
@one_line_errors
def profiles_show(name: str = typer.Argument(..., help="Profile name.")):
    """Show one profile: target, drafts, sources and defaults."""
    from . import profile as profiles

    p = profiles.get(name)
    print(f"name:        {p.name}\nfile:        {p.path}\ndescription: {p.description}")
    for label, spec in [("target", p.target)] + [("draft", d) for d in p.drafts]:
        print(f"{label}:")
        for src in spec.sources:
            print(f"  - {src}")
        if spec.sha256:
            print(f"  sha256: {spec.sha256}")
    for k, v in p.defaults.items():
        print(f"default {k}: {v}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
