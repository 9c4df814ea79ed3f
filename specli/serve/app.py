"""The HTTP API over one Session or every model on disk (FastAPI): OpenAI's under ``/v1``
(:mod:`specli.serve.openai_api`), Ollama's under ``/api`` (:mod:`specli.serve.ollama`), and
``/health``; both APIs answer through one path (:mod:`specli.serve.answer`) on the model they
share (:class:`~specli.serve.shared.Served`), whose
:class:`~specli.serve.worker.Worker` thread generates."""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from specli.serve import ollama, openai_api
from specli.serve.directory import Directory, One
from specli.serve.models import Models
from specli.serve.schemas import error_body
from specli.serve.shared import APIError, Prompter, Served, model_ids
from specli.serve.worker import Worker, make_worker
from specli.session import Session


def create_app(session: Session | None = None, name: str | None = None, api_key: str | list[str] | None = None,
               queue: int = 8, temperature: float | None = None, worker: Worker | None = None,
               models: Models | None = None) -> FastAPI:
    """The API over ``session`` (the caller closes it), or over every model of ``models``
    (loaded on demand; the app unloads them when it stops): OpenAI's under /v1, Ollama's under
    /api. ``temperature`` is what a request that gives none gets (None: each API's own
    default, OpenAI's 1 and Ollama's 0.8). ``worker``: the one that generates on ``session``
    (default :func:`~specli.serve.worker.make_worker`'s, ``queue`` places deep). ``api_key``:
    the key, or keys, a request must bear; each key's requests are their own owner of the
    earlier answers lookup copies from (:meth:`Session.history`), so that no response's timing
    depends on another key's texts."""
    d: Directory
    if models is not None:
        d = models
    elif session is not None:
        served = Served(session, worker or make_worker(session, queue), Prompter(session), model_ids(session, name))
        d = One(served)
    else:
        raise ValueError("create_app needs a session or models")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        d.start()
        yield
        await run_in_threadpool(d.stop)

    keys = [api_key] if isinstance(api_key, str) else list(api_key or [])

    def authorized(request: Request) -> None:
        request.state.owner = None
        if not keys:
            return
        auth = request.headers.get("authorization", "").encode()
        # every key compared, in constant time each: which key matched takes no longer to find
        match = [hmac.compare_digest(auth, f"Bearer {k}".encode()) for k in keys]
        if not any(match):
            raise APIError(401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key")
        request.state.owner = f"key{match.index(True) + 1}"

    app = FastAPI(title="specli", lifespan=lifespan)
    app.state.models = d
    if isinstance(d, One):
        app.state.served, app.state.worker, app.state.session, app.state.model_ids = (
            d.served, d.served.worker, session, d.served.ids)
    else:
        app.state.worker = d  # what the server's shutdown cancels
    _error_handlers(app)
    auth = [Depends(authorized)]
    app.include_router(ollama.make_router(d, auth, temperature))
    app.include_router(openai_api.make_router(d, auth, temperature))

    @app.get("/health")
    async def health() -> dict:
        if isinstance(d, One):
            return {"status": "ok", "model": d.served.name, "mode": d.served.session.draft.mode.name,
                    **d.served.worker.status()}
        return {"status": "ok", "loaded": [i.value.entry.name for i in d.loaded()]}

    return app


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body, status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        errs = e.errors()
        if errs[0]["type"] == "json_invalid":
            first = errs[0]
            return JSONResponse(error_body(f"invalid JSON: {first.get('ctx', {}).get('error', first['msg'])}"),
                                status_code=400)
        # a union's members each report; the member the value was meant for says most
        first = next((x for x in errs if not x["type"].endswith("_type")), errs[0])
        param = _param(first["loc"], e.body) or None
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = "unknown field: this server does not implement it (nothing is ignored silently)"
        return JSONResponse(error_body(f"{param}: {msg}" if param else msg, param=param,
                                       code="invalid_value"), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return JSONResponse(error_body(str(e.detail), param=None, code=str(e.status_code)),
                            status_code=e.status_code, headers=getattr(e, "headers", None))


def _param(loc: tuple, body) -> str:
    """The dotted path of the field an error is about, as the client wrote it: pydantic's
    union member names (``str``, ``list[Part]``) in the path are left out."""
    out, cur = [], body
    for i, p in enumerate(p for p in loc if p != "body"):
        if isinstance(cur, dict) and p in cur or isinstance(cur, list) and isinstance(p, int) and p < len(cur):
            out.append(str(p))
            cur = cur[p]
        elif i == len(loc) - 1 - ("body" in loc) and isinstance(cur, dict):
            out.append(p)  # a missing field
    return ".".join(out)
