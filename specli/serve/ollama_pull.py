"""``/api/pull``: a Hub model downloaded into the Hugging Face cache (where ``specli models``
and the next ``/api/tags`` find it), with Ollama's streamed progress lines. Ollama's own
registry is not pulled from: specli never writes into another tool's store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field

from specli.errors import SpecliError
from specli.resolve import hub
from specli.resolve.hfcache import blob_sha256
from specli.serve.ollama_reply import MEDIA_TYPE, line
from specli.serve.ollama_schemas import _Body
from specli.serve.shared import APIError

HF_PREFIXES = ("hf.co/", "huggingface.co/")


class PullBody(_Body):
    model: str = Field(min_length=1)
    stream: bool = True
    insecure: bool | None = None  # ignored, as Ollama now ignores it


def hub_ref(name: str) -> hub.HubRef:
    """Ollama's ``hf.co/org/repo:QUANT`` (or plain ``org/repo:QUANT``) as a Hub reference."""
    for p in HF_PREFIXES:
        if name.lower().startswith(p):
            name = name[len(p):]
    ref = hub.parse_hub_ref(name)
    if ref is None:
        raise APIError(400, f"cannot pull '{name}': specli pulls from the Hugging Face Hub into its cache "
                            "(org/repo:QUANT or hf.co/org/repo:QUANT); Ollama's own registry is pulled by ollama pull")
    return ref


def _bytes_line(name: str, digest: str, completed: int, total: int) -> dict:
    """Ollama's progress line for one file (its CLI draws a bar per ``digest``)."""
    return {"status": f"pulling {digest[:12] or name}", "digest": f"sha256:{digest}" if digest else name,
            "total": total, "completed": completed}


def _done(path: str, streamed: bool = False) -> list[dict]:
    sha = blob_sha256(path) or ""
    size = os.path.getsize(path)
    last = [] if streamed else [_bytes_line(os.path.basename(path), sha, size, size)]
    return [*last, {"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}]


async def _lines(ref: hub.HubRef) -> AsyncIterator[str]:
    """The download in a thread; its notes and byte counts streamed as they come."""
    loop = asyncio.get_running_loop()
    notes: asyncio.Queue[dict] = asyncio.Queue()

    def note(obj: dict) -> None:
        loop.call_soon_threadsafe(notes.put_nowait, obj)

    yield line({"status": "pulling manifest"})
    fut = loop.run_in_executor(None, lambda: hub.download(
        ref, lambda m: note({"status": m}), on_bytes=lambda *a: note(_bytes_line(*a))))
    streamed = False
    while not fut.done() or not notes.empty():
        try:
            obj = await asyncio.wait_for(notes.get(), 0.2)
        except asyncio.TimeoutError:
            continue
        streamed = streamed or "total" in obj
        yield line(obj)
    try:
        path = fut.result()
    except SpecliError as e:
        yield line({"error": " ".join(str(e).split())})
        return
    for obj in _done(path, streamed):
        yield line(obj)


def add_pull(router: APIRouter, auth: list, parse) -> None:
    @router.post("/api/pull", dependencies=auth)
    async def pull(request: Request):
        body = await parse(request, PullBody)
        ref = hub_ref(body.model)
        if hub.offline():
            raise APIError(400, f"cannot pull {ref}: the Hub is offline here (HF_HUB_OFFLINE is set)")
        if body.stream:
            return StreamingResponse(_lines(ref), media_type=MEDIA_TYPE)
        try:
            path = await asyncio.get_running_loop().run_in_executor(None, hub.download, ref)
        except SpecliError as e:
            raise APIError(400, " ".join(str(e).split())) from None
        return JSONResponse(_done(path)[-1])
