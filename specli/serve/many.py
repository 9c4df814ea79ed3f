"""``specli serve`` over several models: every model on disk (no ``--target``/``--profile``)
or the chosen ones, each loaded on its first request with its automatic drafter."""

from __future__ import annotations

import re
from collections.abc import Callable

from specli.errors import SpecliError
from specli.hardware.devices import detect
from specli.serve.app import create_app
from specli.serve.models import Models, budgets
from specli.serve.pool import keep_alive_seconds
from specli.serve.runner import bound_port, check_bind, make_server, serve_forever
from specli.session import Options


def keep_alive_flag(text: str) -> float | None:
    """``--keep-alive``: a duration ("5m"), or a bare number of seconds (as OLLAMA_KEEP_ALIVE)."""
    t = text.strip()
    if re.fullmatch(r"-?\d+(\.\d*)?", t):
        return keep_alive_seconds(float(t))
    try:
        return keep_alive_seconds(t)
    except SpecliError:
        raise SpecliError(f"--keep-alive: not a duration: {text!r} (e.g. 5m, 1h, 300, 0, -1)") from None


def serve_many(base: Options, chosen: list[str] | None, *, host: str, port: int, api_key: str | list[str] | None,
               queue: int, temperature: float | None, keep_alive: str, max_loaded: int | None, log_level: str,
               say: Callable[[str], None]) -> None:
    if base.draft != "auto":
        raise SpecliError("--draft: serving several models, each drafts with what --draft auto finds for it; "
                          "give --draft with one --target")
    check_bind(host, port, api_key)
    keep = keep_alive_flag(keep_alive)
    hardware = detect(base.vram)  # once: the budgets and every model's placement
    host_mem, gpu_mem = budgets(hardware)
    models = Models(base, queue=queue, keep_alive=keep, max_loaded=max_loaded, host=host_mem, gpu=gpu_mem,
                    only=chosen, hardware=hardware)
    c = models.rescan()  # an unknown --target is one line now, not at the first request
    if not c.entries:
        raise SpecliError("no models on disk to serve (specli models lists what it finds; "
                          "or name one with --target REF)")
    api = create_app(models=models, api_key=api_key, temperature=temperature)
    shown = f"[{host}]" if ":" in host else host
    what = "every model on disk" if chosen is None else "the chosen models"

    def ready(server) -> None:
        say(f"serving {len(c.entries)} models ({what}; each loads on its first request) on "
            f"http://{shown}:{bound_port(server)}/v1 (OpenAI) and /api (Ollama)"
            + (" (API key required)" if api_key else "") + "; Ctrl-C stops")

    server = make_server(api, host, port, log_level, on_ready=ready)
    try:
        stopped_by = serve_forever(server)
    finally:
        models.stop()
    if not server.started:
        raise SystemExit(1)
    say(f"stopped ({stopped_by})" if stopped_by else "stopped")
