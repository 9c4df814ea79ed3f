"""Every model on the machine behind one server: the catalog of what is on disk
(:mod:`specli.resolve.catalog`, rescanned as it changes), the pool of what is loaded
(:mod:`specli.serve.pool`), and each loaded model's runtime: a :class:`~specli.session.Session`
built as ``specli run --target REF --draft auto`` builds it (a profile's as ``--profile NAME``),
its own worker and queue (``--parallel`` applies per model). Unloading stops the worker and
closes the session; a load that fails closes what it opened."""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from specli.engine.weights import Weights
from specli.errors import SpecliError
from specli.hardware.devices import Hardware, detect
from specli.hardware.placement import Placement, place
from specli.hardware.plan import HostMemoryTooSmall, available_ram
from specli.resolve import catalog as cat
from specli.resolve import local
from specli.resolve.choose import choose_models
from specli.resolve.gguf_header import read_gguf
from specli.serve.directory import LoadedInfo, LoadFailed, NotAChatModel, Use, expires_at, openai_card
from specli.serve.ollama_card import ModelCard
from specli.serve.ollama_schemas import rfc3339
from specli.serve.pool import DEFAULT_KEEP_ALIVE, Cancelled, DoesNotFit, Pool, Want
from specli.serve.shared import Prompter, Served
from specli.serve.worker import Worker, make_worker
from specli.session import Options, Session

LATEST = ":latest"


@dataclass
class Loaded:
    """One loaded model: what answers with it and the catalog entry it came from."""

    entry: cat.Entry
    served: Served
    card: ModelCard


def options_for(base: Options, entry: cat.Entry) -> Options:
    """The options ``specli run --target REF --draft auto`` (a profile: ``--profile NAME``)
    would have, the server's own (context, threads, parallel, ...) kept."""
    target, profile = (None, entry.profile.name) if entry.profile else (entry.ref, None)
    return replace(base, target=target, profile=profile, draft="auto", spec=copy.deepcopy(base.spec),
                   given=set(base.given), notes=[])


def entry_info(e: cat.Entry) -> dict:
    """An entry as Ollama's /api/tags lists it, its role beside."""
    return {"name": e.name, "model": e.name, "modified_at": rfc3339(e.modified), "size": e.size,
            "digest": e.digest, "details": e.details(), "specli": {"role": e.role, "ref": e.ref}}


class Models:
    """The catalog, the pool and the loaded models' runtimes (see the module's doc).

    ``base``: the options every model is loaded with; ``only``: the names to serve (None:
    every model on disk); ``scan``: the catalog (tests give their own); ``worker``: what
    makes a model's worker."""

    pulls = True

    def __init__(self, base: Options, *, queue: int = 8, keep_alive: float | None = DEFAULT_KEEP_ALIVE,
                 max_loaded: int | None = None, host: int | None = None, gpu: int | None = None,
                 only: list[str] | None = None, scan: Callable[[], list[local.LocalModel]] = local.scan,
                 worker: Callable[[Session, int], Worker] = make_worker, progress=None,
                 hardware: Hardware | None = None):
        self.base, self.queue, self.default_keep_alive = base, queue, keep_alive
        self._scan, self._make_worker, self._progress = scan, worker, progress
        self._only = only
        self._lock = threading.Lock()
        self._catalog: cat.Catalog | None = None
        self._plans: dict[str, tuple[Options, Placement]] = {}
        self.weights = Weights()  # a draft model two loaded targets use is loaded once
        self._hardware = hardware or detect(base.vram)  # the machine, detected once
        self.pool = Pool(self._load, self._unload, host=host, gpu=gpu, max_loaded=max_loaded)
        self._keys: dict[str, cat.Entry] = {}

    # -- the catalog -----------------------------------------------------------------------------
    def rescan(self) -> cat.Catalog:
        """The catalog as the disk holds it now (new files listed, vanished ones gone)."""
        found = self._scan()
        c = cat.scan(found)
        if self._only is not None:
            c = cat.Catalog([_chosen(c, n) for n in self._only])
        with self._lock:
            self._catalog = c
            self._plans = {}  # the files may have changed: plan again
        return c

    def catalog(self) -> cat.Catalog:
        return self._catalog or self.rescan()

    def find(self, name: str) -> cat.Entry:
        """The entry a request's ``model`` names (any listed name or alias, a store prefix or
        ``:latest`` or not); a name not known yet is looked for again on disk."""
        try:
            return _find(self.catalog(), name)
        except cat.UnknownModel:
            return _find(self.rescan(), name)

    # -- memory ----------------------------------------------------------------------------------
    def placed(self, e: cat.Entry) -> tuple[Options, Placement]:
        """``e``'s options, models and placement, decided before anything loads (the steps of
        ``specli run``: :func:`choose_models` picks the drafter ``--draft auto`` would, then
        :func:`place` plans where each part goes), kept until the catalog is read again."""
        key = _key(e)
        with self._lock:
            got = self._plans.get(key)
        if got is None:
            opts = options_for(self.base, e)
            got = (opts, place(opts, choose_models(opts), self._hardware))
            with self._lock:
                self._plans[key] = got
        return got

    def want(self, e: cat.Entry) -> Want:
        """What ``e`` holds once loaded, by part, as its placement has it: its file, its draft's
        (keyed by the draft's path: a draft two targets share counts once), its KV caches."""
        opts, placement = self.placed(e)
        fp = placement.footprint(opts.parallel)
        return Want(_key(e), fp.host, fp.gpu)

    # -- loading ---------------------------------------------------------------------------------
    def _load(self, want: Want) -> Loaded:
        e = self._keys[want.key]
        opts, placement = self.placed(e)
        try:
            sess = Session(opts, progress=self._progress, placement=placement, weights=self.weights)
        except SpecliError as err:
            raise LoadFailed(f"cannot load {e.name}: {err}") from None
        except Exception as err:  # noqa: BLE001 - llama.cpp's own failures
            raise LoadFailed(f"cannot load {e.name}: {type(err).__name__}: {err}") from None
        try:
            worker = self._make_worker(sess, self.queue)
            served = Served(sess, worker, Prompter(sess), _ids(e))
            card = ModelCard.of(served)
            worker.start()
        except BaseException:
            sess.close()
            raise
        return Loaded(e, served, card)

    def _unload(self, loaded: Loaded) -> None:
        try:
            loaded.served.worker.stop()
        finally:
            loaded.served.session.close()

    def _acquire(self, name: str, keep: float | None, gone: threading.Event):
        """On a worker thread: ``name``'s entry, loaded (by this request or one before it) and in use."""
        e = self.find(name)
        if e.role == cat.HEAD:
            raise NotAChatModel(f"{e.name} is a drafting head: it drafts for a target model and does not "
                                "answer on its own; chat with its target")
        try:
            want = self.want(e)
        except HostMemoryTooSmall as err:
            raise DoesNotFit(str(err)) from None
        except SpecliError as err:
            raise LoadFailed(f"cannot load {e.name}: {err}") from None
        self._keys[want.key] = e
        try:
            lease = self.pool.acquire(want, keep, gone.is_set)
        except (DoesNotFit, Cancelled, LoadFailed):
            raise
        except Exception as err:  # noqa: BLE001
            raise LoadFailed(f"cannot load {e.name}: {type(err).__name__}: {err}") from None
        finally:
            if not os.path.exists(e.path):
                self._catalog = None  # vanished: the next lookup rescans
        if gone.is_set():  # the client left while its model loaded: the model stays, the request goes
            self.pool.release(lease)
            raise Cancelled()
        return lease

    async def use(self, name: str, request: Request | None, keep_alive: float | None) -> Use:
        gone = threading.Event()
        watch = asyncio.ensure_future(_watch(request, gone)) if request is not None else None
        try:
            lease = await run_in_threadpool(self._acquire, name, keep_alive, gone)
        finally:
            if watch is not None:
                watch.cancel()
        loaded: Loaded = lease.value
        return Use(loaded.served, loaded.card, lease.load_duration, lease)

    def release(self, use: Use) -> None:
        self.pool.release(use.lease)

    async def unload(self, name: str) -> None:
        await run_in_threadpool(self._expire, name)

    def _expire(self, name: str) -> None:
        self.pool.expire(_key(self.find(name)))

    # -- listings --------------------------------------------------------------------------------
    async def show(self, name: str, verbose: bool) -> dict:
        return (await run_in_threadpool(self._card, name)).show(verbose)

    def _card(self, name: str) -> ModelCard:
        """``name``'s card: the loaded model's, else from its header and its placement (what
        loading it would run), without loading it: clients ask for every model's."""
        e = self.find(name)
        for info in self.loaded():
            if _key(info.value.entry) == _key(e):
                return info.value.card
        if e.role == cat.HEAD:
            h = read_gguf(e.path)
            return ModelCard(_ids(e), e.path, h, int(h.arch_key("context_length", 0) or 0), 0,
                             "none (a drafting head)")
        try:
            opts, placement = self.placed(e)
        except SpecliError as err:
            raise LoadFailed(f"cannot load {e.name}: {err}") from None
        return ModelCard(_ids(e), placement.target, read_gguf(placement.target), placement.n_ctx,
                         placement.target_gpu_layers, f"{placement.draft.mode.name}, once loaded",
                         placement.draft.draft_path)

    async def tags(self) -> list[dict]:
        c = await run_in_threadpool(self.rescan)
        return [entry_info(e) for e in c.entries]

    def loaded(self) -> list[LoadedInfo]:
        out = []
        now = self.pool.clock()
        for r in self.pool.residents():
            if not r.ready.is_set() or r.error is not None:
                continue
            left = (r.keep_alive if r.refs else None if r.expires is None else r.expires - now)
            out.append(LoadedInfo(r.value, r.want, left))
        return out

    async def running(self) -> list[dict]:
        out = []
        for info in self.loaded():
            lm: Loaded = info.value
            s = lm.served.session
            out.append({**entry_info(lm.entry), "expires_at": expires_at(info.seconds_left),
                        "size": info.want.size, "size_vram": info.want.size_vram,
                        "context_length": s.ctx.n_ctx,
                        "specli": {"role": lm.entry.role, "ref": lm.entry.ref, "drafter": lm.served.drafter,
                                   "draft": s.draft_path}})
        return out

    def openai_models(self) -> list[dict]:
        return [openai_card(e.name, e.path, {"specli": {"role": e.role}}) for e in self.rescan().entries]

    def openai_model(self, name: str) -> dict:
        e = self.find(name)
        return openai_card(e.name, e.path, {"specli": {"role": e.role}})

    # -- the server's life -----------------------------------------------------------------------
    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.pool.close()

    def cancel_all(self) -> None:
        for info in self.loaded():
            info.value.served.worker.cancel_all()


async def _watch(request: Request, gone: threading.Event) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _ids(e: cat.Entry) -> list[str]:
    return list(dict.fromkeys([e.name, *e.aliases, e.ref]))


def _key(e: cat.Entry) -> str:
    """What the pool knows a model by: its file (two names of one blob share it), or its profile."""
    return f"profile:{e.profile.name}" if e.profile else os.path.realpath(e.path)


def _find(c: cat.Catalog, name: str) -> cat.Entry:
    try:
        return c.find(name)
    except cat.UnknownModel:
        if name.lower().endswith(LATEST):  # Open WebUI adds :latest to a tagless name
            return c.find(name[:-len(LATEST)])
        raise


def _chosen(c: cat.Catalog, ref: str) -> cat.Entry:
    """The entry ``--target`` / ``--profile`` names: by any of its names, or by its file."""
    try:
        return _find(c, ref)
    except cat.UnknownModel:
        path = os.path.realpath(os.path.expanduser(ref))
        for e in c.entries:
            if os.path.realpath(e.path) == path:
                return e
        raise


def budgets(hardware: Hardware) -> tuple[int | None, int | None]:
    """The host and GPU memory the models may use together: what is free now."""
    host, _ = available_ram()
    return host, hardware.budget
