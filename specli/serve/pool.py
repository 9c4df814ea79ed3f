"""Models loaded on demand and unloaded when idle, as Ollama's scheduler does it.

A request names a model; :meth:`Pool.lease` returns it loaded, loading it first when it is not
(one load per model: requests that arrive meanwhile wait for that load, and a client that
leaves while it waits gives up only its own request). While a lease is held the model is in
use and is never unloaded. When the last lease ends, the model stays loaded for its
``keep_alive`` (the last request's: seconds, ``0`` unloads it at once, ``None`` keeps it for
good), then unloads.

What fits together is decided before anything loads: each model declares the parts it holds
in host and GPU memory (:class:`Want`), parts shared by two models (a draft model two targets
use) are counted once, and loading beyond the budget or beyond ``max_loaded`` models unloads
the least recently used idle model first. A model that cannot fit even alone is refused
(:class:`DoesNotFit`); one that fits only once busy models finish waits for them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from specli.errors import SpecliError

DEFAULT_KEEP_ALIVE = 300.0  # Ollama's default, 5 minutes
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class DoesNotFit(SpecliError):
    """A model that cannot be loaded beside nothing else: too big for the memory budget."""


class Cancelled(SpecliError):
    """The request gave up while its model was loading (its client left)."""

    def __init__(self):
        super().__init__("the request was cancelled while its model loaded")


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive``: a JSON number is seconds, a string a Go duration ("5m",
    "1h30m", "-1s"; a bare number in a string is refused, as Ollama refuses it); any negative
    value keeps the model loaded for good (``None``); ``0`` unloads it as soon as it is idle."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SpecliError(f"keep_alive: expected a duration such as \"5m\" or a number of seconds, not {value!r}")
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        if body == "0":
            return 0.0
        parts = _DURATION.findall(body)
        if not body or "".join(n + u for n, u in parts) != body:
            raise SpecliError(f"keep_alive: invalid duration {value!r} (e.g. \"5m\", \"1h30m\", \"-1\" as a number)")
        seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        seconds = float(value)
    return None if seconds < 0 else seconds


@dataclass(frozen=True)
class Want:
    """A model as the pool loads it: ``key`` names it (its target file), ``parts`` the bytes
    each part holds in host memory and ``gpu`` on the GPU, keyed by what the part is (a file,
    or the model's own KV cache), so two models that share a part count it once."""

    key: str
    parts: dict[str, int] = field(default_factory=dict)
    gpu: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(self.parts.values()) + sum(self.gpu.values())

    @property
    def size_vram(self) -> int:
        return sum(self.gpu.values())


@dataclass(eq=False)
class Resident:
    """One model the pool holds: loading (``ready`` unset), in use (``refs``) or idle until
    ``expires`` (a ``clock`` time; None: for good)."""

    want: Want
    value: Any = None
    refs: int = 0
    keep_alive: float | None = DEFAULT_KEEP_ALIVE
    expires: float | None = None
    last_used: float = 0.0
    load_duration: float = 0.0
    error: BaseException | None = None
    evicted: list[Resident] = field(default_factory=list)  # the idle models its load unloads first
    evict_beside: bool = False  # memory holds them and this model together: unloaded during its load
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def idle(self) -> bool:
        return self.ready.is_set() and self.refs == 0


@dataclass
class Lease:
    """A loaded model, in use until the lease ends: ``value`` is what the loader returned,
    ``load_duration`` the seconds this request waited for its load (0 when it was loaded)."""

    value: Any
    load_duration: float
    resident: Resident
    keep_alive: float | None = DEFAULT_KEEP_ALIVE


class Pool:
    """The loaded models. ``load(want)`` loads one and returns its handle, ``unload(handle)``
    frees it; ``host`` / ``gpu`` are the memory budgets in bytes (None: unbounded) and
    ``max_loaded`` caps how many models are loaded at once (None: no cap)."""

    def __init__(self, load: Callable[[Want], Any], unload: Callable[[Any], None], *,
                 host: int | None = None, gpu: int | None = None, max_loaded: int | None = None,
                 clock: Callable[[], float] = time.monotonic, poll: float = 0.1):
        self._load, self._unload = load, unload
        self.host, self.gpu, self.max_loaded = host, gpu, max_loaded
        self.clock, self.poll = clock, poll
        self._held: dict[str, Resident] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._freeing: list[threading.Thread] = []  # unloads that run beside a load
        self._reaper = threading.Thread(target=self._reap, name="specli-pool-reaper", daemon=True)
        self._reaper.start()

    # -- what is loaded ------------------------------------------------------------------------
    def residents(self) -> list[Resident]:
        """The models loaded or loading, the latest to expire first (as Ollama's /api/ps)."""
        with self._cond:
            held = list(self._held.values())
        return sorted(held, key=lambda r: float("inf") if r.expires is None or r.refs else r.expires, reverse=True)

    def get(self, key: str) -> Resident | None:
        with self._cond:
            return self._held.get(key)

    # -- leases --------------------------------------------------------------------------------
    @contextmanager
    def lease(self, want: Want, keep_alive: float | None = DEFAULT_KEEP_ALIVE,
              cancelled: Callable[[], bool] | None = None) -> Iterator[Lease]:
        """``want`` loaded and in use for the ``with`` block; afterwards idle for ``keep_alive``."""
        lease = self.acquire(want, keep_alive, cancelled)
        try:
            yield lease
        finally:
            self.release(lease)

    def acquire(self, want: Want, keep_alive: float | None = DEFAULT_KEEP_ALIVE,
                cancelled: Callable[[], bool] | None = None) -> Lease:
        t0 = self.clock()
        with self._cond:
            res, mine = self._place(want, cancelled)
            res.refs += 1
            loaded = res.ready.is_set()
        if mine:
            self._load_into(res)
        elif not loaded:
            self._wait_ready(res, cancelled)
        return Lease(res.value, 0.0 if loaded else self.clock() - t0, res, keep_alive)

    def release(self, lease: Lease) -> None:
        res = lease.resident
        with self._cond:
            res.refs -= 1
            res.keep_alive = lease.keep_alive
            res.last_used = self.clock()
            if res.refs == 0:
                res.expires = None if lease.keep_alive is None else res.last_used + lease.keep_alive
            self._cond.notify_all()
        if res.refs == 0 and lease.keep_alive == 0:
            self._expire_due()

    def expire(self, key: str) -> bool:
        """Unload ``key`` as soon as it is idle (``keep_alive: 0`` with no prompt); False when
        it is not loaded."""
        with self._cond:
            res = self._held.get(key)
            if res is None:
                return False
            res.keep_alive, res.expires = 0.0, self.clock()
            self._cond.notify_all()
        self._expire_due()
        return True

    def close(self) -> None:
        """Unload everything (the server stops)."""
        with self._cond:
            self._closed = True
            held, self._held = list(self._held.values()), {}
            self._cond.notify_all()
        for r in held:
            if r.ready.is_set() and r.error is None:
                self._unload(r.value)
        for t in self._freeing:
            t.join()

    # -- inside ---------------------------------------------------------------------------------
    def _place(self, want: Want, cancelled: Callable[[], bool] | None) -> tuple[Resident, bool]:
        """Under the lock: the resident for ``want`` and whether this caller loads it; makes
        room first, waiting for busy models to finish when only they are in the way."""
        if self._closed:
            raise SpecliError("the server is shutting down")
        res = self._held.get(want.key)
        if res is not None:
            res.expires = None
            return res, False
        self._check_alone(want)
        while True:
            victims = self._victims(want)
            if victims is not None:
                break
            if cancelled is not None and cancelled():
                raise Cancelled()
            self._cond.wait(self.poll)
            res = self._held.get(want.key)
            if res is not None:  # another request loaded it meanwhile
                res.expires = None
                return res, False
        for v in victims:
            del self._held[v.want.key]
        # unloaded only for --max-loaded, with memory for both: freed beside the load, not before it
        beside = bool(victims) and self._fits(want, list(self._held.values()) + victims, counted=False)
        res = Resident(want, last_used=self.clock(), evicted=victims, evict_beside=beside)
        self._held[want.key] = res
        return res, True

    def _unload_all(self, victims: list[Resident]) -> None:
        for v in victims:
            if v.error is None:
                self._unload(v.value)

    def _free_beside(self, victims: list[Resident]) -> None:
        t = threading.Thread(target=self._unload_all, args=(victims,), name="specli-pool-unload", daemon=True)
        with self._cond:
            self._freeing = [th for th in self._freeing if th.is_alive()] + [t]
        t.start()

    def _check_alone(self, want: Want) -> None:
        host, gpu = sum(want.parts.values()), want.size_vram
        if self.host is not None and host > self.host:
            raise DoesNotFit(f"{want.key} needs {_gib(host)} of memory, more than the {_gib(self.host)} it may use")
        if self.gpu is not None and gpu > self.gpu:
            raise DoesNotFit(f"{want.key} needs {_gib(gpu)} of GPU memory, more than the {_gib(self.gpu)} it may use")

    def _fits(self, want: Want, staying: list[Resident], counted: bool = True) -> bool:
        if counted and self.max_loaded is not None and len(staying) + 1 > self.max_loaded:
            return False
        host, gpu = dict(want.parts), dict(want.gpu)
        for r in staying:
            host.update(r.want.parts)
            gpu.update(r.want.gpu)
        return ((self.host is None or sum(host.values()) <= self.host)
                and (self.gpu is None or sum(gpu.values()) <= self.gpu))

    def _victims(self, want: Want) -> list[Resident] | None:
        """The idle models to unload so ``want`` fits; None when
        it cannot fit until a busy model finishes."""
        staying = list(self._held.values())
        # the least recently used first; a model kept for good (a negative keep_alive) last
        idle = sorted((r for r in staying if r.idle), key=lambda r: (r.keep_alive is None, r.last_used))
        out: list[Resident] = []
        while not self._fits(want, staying):
            if not idle:
                return None
            v = idle.pop(0)
            staying.remove(v)
            out.append(v)
        return out

    def _load_into(self, res: Resident) -> None:
        t0 = self.clock()
        try:
            evicted, res.evicted = res.evicted, []
            if res.evict_beside:
                self._free_beside(evicted)
            else:
                self._unload_all(evicted)  # their memory is free before this load takes it
            res.value = self._load(res.want)
        except BaseException as e:
            res.error = e
            with self._cond:
                self._held.pop(res.want.key, None)
                res.refs = 0
                self._cond.notify_all()
            res.ready.set()
            raise
        res.load_duration = self.clock() - t0
        res.ready.set()

    def _wait_ready(self, res: Resident, cancelled: Callable[[], bool] | None) -> None:
        while not res.ready.wait(self.poll):
            if cancelled is not None and cancelled():
                with self._cond:
                    res.refs -= 1
                    self._cond.notify_all()
                raise Cancelled()
        if res.error is not None:
            raise res.error

    def _due(self) -> list[Resident]:
        now = self.clock()
        due = [r for r in self._held.values() if r.idle and r.expires is not None and r.expires <= now]
        for r in due:
            del self._held[r.want.key]
        if due:
            self._cond.notify_all()
        return due

    def _expire_due(self) -> None:
        with self._cond:
            due = self._due()
        self._unload_all(due)

    def _reap(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                due = self._due()
                if not due:
                    nxt = [r.expires for r in self._held.values() if r.idle and r.expires is not None]
                    wait = max(0.0, min(nxt) - self.clock()) if nxt else None
                    self._cond.wait(min(wait, 60.0) if wait is not None else 60.0)
                    continue
            self._unload_all(due)
