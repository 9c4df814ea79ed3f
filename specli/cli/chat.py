"""specli chat."""

from __future__ import annotations

import typer

from specli.cli.common import (
    ADAPTIVE_OPTION,
    CTX_OPTION,
    DRAFT_GPU_LAYERS_OPTION,
    DRAFT_MAX_OPTION,
    DRAFT_OPTION,
    DRAFT_P_MIN_OPTION,
    GPU_LAYERS_OPTION,
    LOOKUP_OPTION,
    PROFILE_OPTION,
    SEED_OPTION,
    TARGET_OPTION,
    TEMP_OPTION,
    THREADS_OPTION,
    TOP_K_OPTION,
    TOP_P_OPTION,
    VRAM_OPTION,
    app,
    err,
    error_line,
    given_options,
    one_line_errors,
)
from specli.errors import SpecliError

CHAT_EPILOG = """
Examples:

  specli chat --target qwen2.5-coder-1.5b-instruct-q4_k_m --draft qwen2.5-coder-0.5b-instruct-q4_k_m

  specli chat --target model.gguf --draft lookup --system "You are terse." --show-drafts

In the chat: /reset forgets the conversation, /stats shows the last reply's numbers, /exit (or
Ctrl-D) quits, Ctrl-C stops the current reply. End a line with \\ to continue on the next, or
wrap several lines in triple quotes (\"\"\").
"""



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
    target: str | None = TARGET_OPTION,
    profile: str | None = PROFILE_OPTION,
    draft: str = DRAFT_OPTION,
    system: str | None = typer.Option(None, "--system", help="System prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", min=1, help="Most tokens per reply."),
    temp: float = TEMP_OPTION,
    top_k: int = TOP_K_OPTION,
    top_p: float = TOP_P_OPTION,
    seed: int | None = SEED_OPTION,
    draft_max: int = DRAFT_MAX_OPTION,
    draft_p_min: float = DRAFT_P_MIN_OPTION,
    adaptive: bool = ADAPTIVE_OPTION,
    lookup: bool = LOOKUP_OPTION,
    ctx: int = CTX_OPTION,
    threads: int | None = THREADS_OPTION,
    gpu_layers: int | None = GPU_LAYERS_OPTION,
    draft_gpu_layers: int | None = DRAFT_GPU_LAYERS_OPTION,
    vram: str | None = VRAM_OPTION,
    show_drafts: bool = typer.Option(False, "--show-drafts", help="Colour the tokens that came from the drafter."),
):
    """Interactive chat, streamed, with the conversation kept in the KV cache between turns."""
    from specli.chat import Chat
    from specli.session import Options, Session
    from specli.speculate.settings import SpecSettings
    from specli.speculate.verify import SamplingParams

    opts = Options(target=target, draft=draft, profile=profile, n_ctx=ctx, threads=threads, gpu_layers=gpu_layers,
                   draft_gpu_layers=draft_gpu_layers, vram=vram, given=given_options(click_ctx),
                   spec=SpecSettings(draft_max=draft_max, draft_p_min=draft_p_min, adaptive=adaptive, hybrid=lookup))
    sess = Session(opts, progress=err)
    if sess.target.chat_template() is None:
        raise SpecliError(f"{sess.target.name} has no chat template; use specli run --raw")
    for line in opts.notes:
        err(line)
    from rich.console import Console
    from rich.text import Text

    conv = Chat(sess, SamplingParams(temp, top_k, top_p, seed), max_tokens, system)
    # Rich decides on colour: a terminal, NO_COLOR, FORCE_COLOR, TERM=dumb
    console = Console(highlight=False, emoji=False, markup=False, soft_wrap=True)

    def note(text: str) -> None:
        console.print(text, style="dim")

    def write(text) -> None:
        console.print(text, end="")
        console.file.flush()

    note(f"specli chat · {sess.target.name} · drafter {sess.drafter.name} · /help for commands")
    while True:
        try:
            text = _read_message()
        except EOFError:
            print()
            break
        except KeyboardInterrupt:
            note("\n(Ctrl-C stops a reply; /exit or Ctrl-D quits)")
            continue
        cmd = text.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit", "/bye"):
            break
        if cmd == "/help":
            note("/reset forget the conversation · /stats last reply · /exit quit · "
                 "end a line with \\ or use \"\"\" for several lines")
            continue
        if cmd == "/reset":
            conv.reset()
            note("(conversation cleared)")
            continue
        if cmd == "/stats":
            note(conv.last.summary() if conv.last else "(no reply yet)")
            continue
        interrupted = False
        try:
            stream, dropped = conv.send(text)
            if dropped:
                note(f"(the conversation no longer fits the context: dropped the {dropped} oldest messages)")
            for ch in stream:
                pieces = [sess.target.piece(t).decode("utf-8", "replace") for t in ch.tokens]
                if show_drafts and any(ch.from_draft) and "".join(pieces) == ch.text:
                    write(Text.assemble(*((p, "cyan" if f else "") for p, f in zip(pieces, ch.from_draft))))
                else:
                    write(ch.text)
        except SpecliError as e:
            err(error_line(e))
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
        console.print()
        note(("(stopped) " if interrupted else "") + line)
    sess.close()


