"""specli serve: the HTTP server, OpenAI's API and Ollama's on one port."""

from __future__ import annotations

from dataclasses import replace

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
    ProfilesOpt,
    TargetsOpt,
    ThreadsOpt,
    VramOpt,
    app,
    err,
    model_options,
    one_line_errors,
)
from specli.errors import SpecliError
from specli.speculate.settings import DEFAULTS, N_CTX

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
SERVE_EPILOG = """
Examples:

  specli serve --profile default

  specli serve --target model.gguf --draft draft.gguf --port 8080 --queue 16

  specli serve --profile default --parallel 4     # four clients in one batch

  SPECLI_API_KEY=secret specli serve --profile default --host 0.0.0.0

  specli serve --port 11434                        # every model on disk, where Ollama's clients look

  specli serve --target ollama:qwen3:8b --target lmstudio:lmstudio-community/gemma-3-4b-it-GGUF --max-loaded 1

Then point any OpenAI client at http://127.0.0.1:8000/v1 (curl, openai-python, ...), or any
Ollama client at http://127.0.0.1:8000 (ollama-python, OLLAMA_HOST=127.0.0.1:8000, ...).
"""


@app.command(epilog=SERVE_EPILOG)
@one_line_errors
def serve(
    click_ctx: typer.Context,
    target: TargetsOpt = None,
    profile: ProfilesOpt = None,
    draft: DraftOpt = "auto",
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (beyond loopback needs --api-key)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on."),
    api_key: list[str] | None = typer.Option(None, "--api-key", envvar="SPECLI_API_KEY", show_envvar=True,
                                             help="Require 'Authorization: Bearer KEY' on /v1 and /api requests. "
                                                  "Repeat it (or give SPECLI_API_KEY several, space-separated) for "
                                                  "several keys: each key's requests copy only from its own "
                                                  "earlier answers (--lookup-history)."),
    queue: int = typer.Option(8, "--queue", min=0,
                              help="Requests that may wait behind the ones generating; more get 503."),
    parallel: int = typer.Option(1, "--parallel", min=1, max=64,
                                 help="Requests generated at once, in one batch, each speculating in its own slot. "
                                      "Every slot has its own KV cache of --ctx tokens (memory for N of them is "
                                      "planned); MTP, EAGLE-3 and DFlash heads fall back to prompt lookup."),
    name: str | None = typer.Option(None, "--name",
                                       help="Model name in /v1/models (default: the profile or GGUF file name)."),
    temp: float | None = typer.Option(None, "--temp", min=0.0, max=2.0,
                                         help="Temperature for requests that give none "
                                              "(default: each API's own, OpenAI's 1, Ollama's 0.8)."),
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
    keep_alive: str = typer.Option("5m", "--keep-alive",
                                   help="Serving several models: how long one stays loaded after its last request "
                                        "(Ollama's keep_alive: 5m, 1h, 300 seconds, 0 unloads at once, -1 keeps it); "
                                        "a request's keep_alive overrides it."),
    max_loaded: int | None = typer.Option(None, "--max-loaded", min=1,
                                          help="Serving several models: at most this many loaded at once "
                                               "(default: as many as memory holds)."),
    log_level: str = typer.Option("warning", "--log-level",
                                  help="uvicorn's log level: warning, info (one line per request), debug, ..."),
):
    """Serve models over OpenAI's HTTP API (/v1/chat/completions, /v1/completions) and Ollama's
    (/api/chat, /api/generate) on one port: with no --target/--profile every model on disk (specli models),
    each loaded on its first request with its automatic drafter; with several, those; with one, that
    model alone, loaded at start."""
    try:
        from specli.serve.app import create_app
        from specli.serve.many import serve_many
        from specli.serve.runner import (
            bound_port,
            check_bind,
            make_server,
            serve_forever,
        )
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("fastapi", "uvicorn", "starlette"):
            raise
        raise SpecliError(f"specli serve needs FastAPI and uvicorn ({e.name} is missing): "
                          "pip install 'specli[serve]'") from None
    from specli.session import Session

    if log_level not in LOG_LEVELS:
        raise SpecliError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    api_key = [k for k in api_key or [] if k] or None  # an empty SPECLI_API_KEY is no key
    check_bind(host, port, api_key)
    opts = model_options(click_ctx)
    chosen = [*(target or []), *(profile or [])]
    if len(chosen) != 1:  # every model on disk, or the chosen set: loaded on demand
        base = replace(opts, target=None, profile=None)
        serve_many(base, chosen or None, host=host, port=port, api_key=api_key, queue=queue, temperature=temp,
                   keep_alive=keep_alive, max_loaded=max_loaded, log_level=log_level, say=err)
        return
    opts = replace(opts, target=target[0] if target else None, profile=profile[0] if profile else None)
    sess = Session(opts, progress=err)
    for note in opts.notes:
        err(note)
    try:
        api = create_app(sess, name=name, api_key=api_key, queue=queue, temperature=temp)
        shown = f"[{host}]" if ":" in host else host

        def ready(server) -> None:
            slots = f", {parallel} slots" if parallel > 1 else ""
            err(f"serving {api.state.model_ids[0]} (drafter: {sess.drafter_name}{slots}) on "
                f"http://{shown}:{bound_port(server)}/v1 (OpenAI) and /api (Ollama)"
                + (" (API key required)" if api_key else "")
                + "; Ctrl-C stops")

        server = make_server(api, host, port, log_level, on_ready=ready)
        stopped_by = serve_forever(server)
        if not server.started:
            raise typer.Exit(1)  # uvicorn has said why (the port was taken meanwhile, ...)
    finally:
        sess.close()
    err(f"stopped ({stopped_by})" if stopped_by else "stopped")
