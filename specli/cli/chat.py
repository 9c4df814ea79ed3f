"""specli chat."""

from __future__ import annotations

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
    error_line,
    model_options,
    one_line_errors,
)
from specli.errors import SpecliError
from specli.speculate.settings import DEFAULTS, N_CTX

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
    target: TargetOpt = None,
    profile: ProfileOpt = None,
    draft: DraftOpt = "auto",
    system: str | None = typer.Option(None, "--system", help="System prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", min=1, help="Most tokens per reply."),
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
    show_drafts: bool = typer.Option(False, "--show-drafts", help="Colour the tokens that came from the drafter."),
):
    """Interactive chat, streamed, with the conversation kept in the KV cache between turns."""
    from specli.chat import Chat
    from specli.session import Session
    from specli.speculate.verify import SamplingParams

    opts = model_options(click_ctx)
    sess = Session(opts, progress=err)
    try:
        if sess.target.chat_template() is None:
            raise SpecliError(f"{sess.target.name} has no chat template; use specli run --raw")
        for line in opts.notes:
            err(line)
        repl = _Repl(Chat(sess, SamplingParams(temp, top_k, top_p, seed), max_tokens, system), show_drafts)
        repl.note(f"specli chat · {sess.target.name} · drafter {sess.drafter.name} · /help for commands")
        repl.loop()
    finally:
        sess.close()


HELP = ("/reset forget the conversation · /stats last reply · /exit quit · "
        "end a line with \\ or use \"\"\" for several lines")
QUIT = ("/exit", "/quit", "/bye")


class _Repl:
    """The chat's read-reply loop on a terminal (or a pipe): Rich decides on colour (a
    terminal, NO_COLOR, FORCE_COLOR, TERM=dumb)."""

    def __init__(self, conv, show_drafts: bool):
        from rich.console import Console

        self.conv, self.show_drafts = conv, show_drafts
        self.console = Console(highlight=False, emoji=False, markup=False, soft_wrap=True)

    def note(self, text: str) -> None:
        self.console.print(text, style="dim")

    def write(self, text) -> None:
        self.console.print(text, end="")
        self.console.file.flush()

    def loop(self) -> None:
        """Messages until /exit or end of input; Ctrl-C at the prompt only says how to quit."""
        while True:
            try:
                text = _read_message()
            except EOFError:
                print()
                return
            except KeyboardInterrupt:
                self.note("\n(Ctrl-C stops a reply; /exit or Ctrl-D quits)")
                continue
            cmd = text.strip()
            if cmd in QUIT:
                return
            if cmd and not self.command(cmd):
                self.reply(text)

    def command(self, cmd: str) -> bool:
        """Run a chat command (/help, /reset, /stats); False when ``cmd`` is a message."""
        if cmd == "/help":
            self.note(HELP)
        elif cmd == "/reset":
            self.conv.reset()
            self.note("(conversation cleared)")
        elif cmd == "/stats":
            self.note(self.conv.last.summary() if self.conv.last else "(no reply yet)")
        else:
            return False
        return True

    def reply(self, text: str) -> None:
        """Stream the reply to ``text``, then its one line of numbers; Ctrl-C stops it."""
        conv = self.conv
        interrupted = False
        try:
            stream, dropped = conv.send(text)
            if dropped:
                self.note(f"(the conversation no longer fits the context: dropped the {dropped} oldest messages)")
            for ch in stream:
                self.show(ch)
        except SpecliError as e:
            err(error_line(e))
            conv.finish()
            return
        except KeyboardInterrupt:
            interrupted = True
            conv.repair()
            if conv.last is not None:
                conv.last.stop = "interrupted"
        conv.finish()
        st = conv.last
        if st is None:
            return
        line = f"{st.tokens_per_s:.1f} tok/s · {st.generated} tokens · mode {st.mode}"
        if st.drafted:
            line += f" · acceptance {100 * st.acceptance:.0f}%"
        line += f" · prompt {st.prompt_tokens - st.prompt_tokens_cached} new / {st.prompt_tokens_cached} cached"
        self.console.print()
        self.note(("(stopped) " if interrupted else "") + line)

    def show(self, ch) -> None:
        """One chunk of the reply; with --show-drafts the drafted tokens in colour."""
        from rich.text import Text

        target = self.conv.session.target
        pieces = [target.piece(t).decode("utf-8", "replace") for t in ch.tokens]
        if self.show_drafts and any(ch.from_draft) and "".join(pieces) == ch.text:
            self.write(Text.assemble(*((p, "cyan" if f else "") for p, f in zip(pieces, ch.from_draft))))
        else:
            self.write(ch.text)
