"""The models a server answers with, as the routes see them: a request names a model and gets
it in use (:class:`Use`) for as long as it answers, then gives it back. :class:`One` is the
model a server started with (``specli serve --target X``: loaded at start, never unloaded);
:class:`specli.serve.models.Models` is every model on disk, loaded on demand. Both answer
the same calls, so the OpenAI and Ollama routes do not care which one they serve."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from specli.errors import SpecliError
from specli.resolve.catalog import UnknownModel
from specli.serve.ollama_card import ModelCard
from specli.serve.ollama_schemas import rfc3339
from specli.serve.pool import Cancelled, DoesNotFit, keep_alive_seconds
from specli.serve.shared import APIError, Served

FOREVER = timedelta(days=365 * 100).total_seconds()


class NotAChatModel(SpecliError):
    """A drafting head: it drafts for a target, it does not answer on its own."""


class LoadFailed(SpecliError):
    """A model that could not be loaded (its file vanished or is damaged, memory ran out)."""


@dataclass
class Use:
    """A model in use by one request: ``served`` answers, ``card`` describes it,
    ``load_duration`` is the seconds this request waited for its load (0: it was loaded)."""

    served: Served
    card: ModelCard
    load_duration: float = 0.0
    lease: Any = None


@dataclass
class LoadedInfo:
    """A loaded model as /api/ps shows it: its handle, what it holds, the seconds until it
    unloads (None: it stays)."""

    value: Any
    want: Any
    seconds_left: float | None


class Directory(Protocol):
    default_keep_alive: float | None
    pulls: bool  # /api/pull is served (a pulled model is then listed and served)

    async def use(self, name: str, request: Request | None, keep_alive: float | None) -> Use: ...

    def release(self, use: Use) -> None: ...

    async def unload(self, name: str) -> None: ...

    async def show(self, name: str, verbose: bool) -> dict: ...

    async def tags(self) -> list[dict]: ...

    async def running(self) -> list[dict]: ...

    def openai_models(self) -> list[dict]: ...

    def openai_model(self, name: str) -> dict: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def cancel_all(self) -> None: ...


def openai_card(name: str, path: str, extra: dict | None = None) -> dict:
    created = int(os.path.getmtime(path)) if os.path.exists(path) else 0
    return {"id": name, "object": "model", "created": created, "owned_by": "specli", **(extra or {})}


class One:
    """The one model a server started with: loaded at start, never unloaded, whatever a
    request's ``keep_alive`` says."""

    default_keep_alive = None
    pulls = False

    def __init__(self, served: Served):
        self.served, self.card = served, ModelCard.of(served)

    def _check(self, name: str) -> None:
        if name not in self.card.names():
            raise UnknownModel(name, [self.served.name])

    async def use(self, name: str, request: Request | None, keep_alive: float | None) -> Use:
        self._check(name)
        return Use(self.served, self.card)

    def release(self, use: Use) -> None:
        pass

    async def unload(self, name: str) -> None:
        self._check(name)  # it stays loaded: the server was started for it alone

    async def show(self, name: str, verbose: bool) -> dict:
        self._check(name)
        return self.card.show(verbose)

    async def tags(self) -> list[dict]:
        return [await self.card.listed()]

    async def running(self) -> list[dict]:
        return [await self.card.running()]

    def openai_models(self) -> list[dict]:
        return [openai_card(self.served.name, self.served.session.target.path)]

    def openai_model(self, name: str) -> dict:
        if name not in self.served.ids:
            raise UnknownModel(name, [self.served.name])
        return self.openai_models()[0]

    def start(self) -> None:
        self.served.worker.start()

    def stop(self) -> None:
        self.served.worker.stop()

    def cancel_all(self) -> None:
        self.served.worker.cancel_all()


def keep_alive(value: Any, default: float | None) -> float | None:
    """A request's ``keep_alive`` in seconds (None: for good); absent: the server's default."""
    if value is None:
        return default
    try:
        return keep_alive_seconds(value)
    except SpecliError as e:
        raise APIError(400, str(e), param="keep_alive") from None


def api_error(e: Exception) -> APIError:
    """What a failed lookup or load is answered with."""
    if isinstance(e, UnknownModel):
        return APIError(404, str(e), param="model", code="model_not_found")
    if isinstance(e, NotAChatModel):
        return APIError(400, str(e), param="model", code="not_a_chat_model")
    if isinstance(e, DoesNotFit):
        return APIError(400, str(e), param="model", code="model_too_large")
    if isinstance(e, Cancelled):
        return APIError(499, str(e), code="client_closed")
    return APIError(500, " ".join(str(e).split()), type="server_error", code="load_failed")


async def lease(d: Directory, name: str, request: Request | None, keep: float | None) -> Use:
    """``name`` in use (loaded first when it is not); every failure as the error a client gets."""
    try:
        return await d.use(name, request, keep)
    except (UnknownModel, NotAChatModel, DoesNotFit, Cancelled, LoadFailed) as e:
        raise api_error(e) from None


async def within(d: Directory, use: Use, make: Callable[[], Awaitable[Any]]):
    """``make()``'s answer with ``use`` held until it is written: a streamed one gives the model
    back once its last line went out (or its client left)."""
    try:
        out = await make()
    except BaseException:
        await run_in_threadpool(d.release, use)
        raise
    if isinstance(out, StreamingResponse):
        out.body_iterator = _releasing(out.body_iterator, lambda: d.release(use))
    else:
        await run_in_threadpool(d.release, use)
    return out


async def _releasing(body: AsyncIterator, release: Callable[[], None]) -> AsyncIterator:
    try:
        async for piece in body:
            yield piece
    finally:
        release()


def expires_at(seconds_left: float | None) -> str:
    return rfc3339(time.time() + (FOREVER if seconds_left is None else max(0.0, seconds_left)))
