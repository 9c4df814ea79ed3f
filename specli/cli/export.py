"""specli export: the command line that serves the same pair on llama-server, vLLM, SGLang or LM Studio."""

from __future__ import annotations

import sys

import typer

from specli.cli.common import (
    CtxOpt,
    DraftGpuLayersOpt,
    DraftMaxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LookupOpt,
    TargetOpt,
    ThreadsOpt,
    VramOpt,
    app,
    err,
    model_options,
    one_line_errors,
)
from specli.speculate.settings import DEFAULTS, N_CTX

EXPORT_EPILOG = """
Examples:

  specli export default --to llama-server

  specli export qwen2.5-coder-7b --to vllm

  specli export --target model.gguf --draft lookup --to llama-server --port 9000
"""


@app.command(epilog=EXPORT_EPILOG)
@one_line_errors
def export(
    click_ctx: typer.Context,
    profile: str | None = typer.Argument(None, help="A profile (specli profiles); or use --target/--draft."),
    to: str = typer.Option("llama-server", "--to", help="Engine: llama-server, vllm, sglang or lmstudio."),
    target: TargetOpt = None,
    draft: DraftOpt = "auto",
    port: int | None = typer.Option(None, "--port", min=1, max=65535,
                                       help="Port to serve on (default: the engine's own)."),
    hub_refs: bool = typer.Option(False, "--hub", help="llama-server: name Hub models with -hf/-hfd instead of "
                                                       "this machine's file paths (to serve elsewhere)."),
    hf_target: str | None = typer.Option(None, "--hf-target",
                                            help="vLLM/SGLang: the target's safetensors repo (org/repo)."),
    hf_draft: str | None = typer.Option(None, "--hf-draft",
                                           help="vLLM/SGLang: the draft's safetensors repo (org/repo)."),
    draft_max: DraftMaxOpt = DEFAULTS.draft_max,
    draft_p_min: DraftPMinOpt = DEFAULTS.draft_p_min,
    lookup: LookupOpt = True,
    ctx: CtxOpt = N_CTX,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = None,
    draft_gpu_layers: DraftGpuLayersOpt = None,
    vram: VramOpt = None,
):
    """Print the command that serves this target/draft pair with speculative decoding on another
    engine, with this machine's GPU placement and measured draft length."""
    from specli.errors import SpecliError
    from specli.export import export as build

    if profile and target:
        raise SpecliError("name the pair once: a PROFILE or --target, not both")
    opts = model_options(click_ctx)
    out = build(opts, to, port, hub_refs, hf_target, hf_draft, progress=err)
    for note in opts.notes:
        err(note)
    sys.stdout.write(out.render())
