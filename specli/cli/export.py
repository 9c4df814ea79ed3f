"""specli export: the command line that serves the same pair on llama-server, vLLM, SGLang or LM Studio."""

from __future__ import annotations

import sys

import typer

from specli.cli.common import (
    CTX_OPTION,
    DRAFT_GPU_LAYERS_OPTION,
    DRAFT_MAX_OPTION,
    DRAFT_OPTION,
    DRAFT_P_MIN_OPTION,
    GPU_LAYERS_OPTION,
    LOOKUP_OPTION,
    TARGET_OPTION,
    THREADS_OPTION,
    VRAM_OPTION,
    app,
    err,
    given_options,
    one_line_errors,
)

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
    target: str | None = TARGET_OPTION,
    draft: str = DRAFT_OPTION,
    port: int | None = typer.Option(None, "--port", min=1, max=65535,
                                       help="Port to serve on (default: the engine's own)."),
    hub_refs: bool = typer.Option(False, "--hub", help="llama-server: name Hub models with -hf/-hfd instead of "
                                                       "this machine's file paths (to serve elsewhere)."),
    hf_target: str | None = typer.Option(None, "--hf-target",
                                            help="vLLM/SGLang: the target's safetensors repo (org/repo)."),
    hf_draft: str | None = typer.Option(None, "--hf-draft",
                                           help="vLLM/SGLang: the draft's safetensors repo (org/repo)."),
    draft_max: int = DRAFT_MAX_OPTION,
    draft_p_min: float = DRAFT_P_MIN_OPTION,
    lookup: bool = LOOKUP_OPTION,
    ctx: int = CTX_OPTION,
    threads: int | None = THREADS_OPTION,
    gpu_layers: int | None = GPU_LAYERS_OPTION,
    draft_gpu_layers: int | None = DRAFT_GPU_LAYERS_OPTION,
    vram: str | None = VRAM_OPTION,
):
    """Print the command that serves this target/draft pair with speculative decoding on another
    engine, with this machine's GPU placement and measured draft length."""
    from specli.errors import SpecliError
    from specli.export import export as build
    from specli.session import Options
    from specli.speculate.settings import SpecSettings

    if profile and target:
        raise SpecliError("name the pair once: a PROFILE or --target, not both")
    opts = Options(target=target, draft=draft, profile=profile, n_ctx=ctx, threads=threads, gpu_layers=gpu_layers,
                   draft_gpu_layers=draft_gpu_layers, vram=vram, given=given_options(click_ctx),
                   spec=SpecSettings(draft_max=draft_max, draft_p_min=draft_p_min, hybrid=lookup))
    out = build(opts, to, port, hub_refs, hf_target, hf_draft, progress=err)
    for note in opts.notes:
        err(note)
    sys.stdout.write(out.render())
