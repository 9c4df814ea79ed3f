"""The batch's decodes: one thread makes every llama_decode (:class:`DecodeThread`), and a
:class:`Batcher` per context runs the blocks its active sequences ask for as one decode."""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from specli.engine import Context
from specli.errors import SpecliError

# the batch's passes of each size: the median of the last few (the first pass of a new size also
# allocates its graph)
RECENT = 7


@dataclass
class _Item:
    seq: int
    tokens: Sequence[int]
    pos0: int
    want: Sequence[bool]
    rows: list[np.ndarray] | None = None
    error: BaseException | None = None
    done: bool = False


class DecodeThread:
    """One thread that makes every llama_decode of a batch (its target's and its draft model's
    contexts): llama.cpp's CPU backend (OpenMP) keeps a team of worker threads per calling
    thread, and decodes called from the requests' threads in turn were slower than from one
    thread (docs/benchmarks.md, "Many clients at once")."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="specli-decode", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, done, out = job
            try:
                out.append((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                out.append((False, e))
            done.set()

    def call(self, fn, *args):
        """``fn(*args)`` on the decode thread; its result, or its exception raised here."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():  # (closed: here)
            return fn(*args)
        done, out = threading.Event(), []
        self._jobs.put((fn, args, done, out))
        done.wait()
        ok, value = out[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()


class Batcher:
    """Collects the blocks the active sequences ask to decode and runs them as one
    llama_decode once every member has asked (a thread that is not a member is served at
    once, in the next batch). ``members``: the threads generating now (:meth:`join`,
    :meth:`leave`; :meth:`away` while one waits on something else, so it holds nobody up).
    ``lock`` guards every llama.cpp call on the context (a decode holds it; nobody holds it
    while waiting for a batch); the members' bookkeeping has a lock of its own, so admitting
    a request never waits for a decode."""

    def __init__(self, ctx: Context, thread: DecodeThread):
        self.ctx = ctx
        self.thread = thread  # where its decodes run (its batch's one decode thread)
        # a draft model's batcher: a sequence decoded here may draft there until its next block
        # here (it is inside that batcher's phase meanwhile; see :meth:`enter`)
        self.phase: Batcher | None = None
        self.inside: set[int] = set()  # (a phase) the sequences it waits for, besides the members
        self.lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[_Item] = []
        self.members = 0
        self.decodes = 0  # llama_decode calls
        self.rows = 0  # tokens they held
        self.shared = 0  # decodes that held two sequences or more
        self.max_seqs = 0  # the most sequences one decode held
        self.share: dict[int, float] = {}  # per sequence: its part of the last decode's time (by rows)
        self.timed_rows = 0  # decodes of at most this many rows are timed (the batch's steps: it prices drafts)
        self.measured: dict[int, float] = {}  # rows -> seconds a decode of that many took, lately (a median)
        self._recent: dict[int, deque[float]] = {}

    def join(self) -> None:
        with self._cond:
            self.members += 1

    def leave(self) -> None:
        with self._cond:
            self.members -= 1
            ready = self._take_if_ready()
        self._decode(ready)

    @contextmanager
    def away(self) -> Iterator[None]:
        """A member that waits on something else meanwhile (a client, a test's hook)."""
        self.leave()
        try:
            yield
        finally:
            self.join()

    def enter(self, seqs: set[int]) -> None:
        """These sequences may draft here now: a decode waits for their blocks too, until each
        has asked or dropped out (:meth:`drop`). Every sequence a step of the target's batch
        just decoded enters: their draft passes then go in one decode."""
        with self._cond:
            self.inside |= seqs

    def drop(self, seq: int) -> None:
        """``seq`` drafts no more until it enters again (it goes on to its target step, or away)."""
        with self._cond:
            if seq not in self.inside:
                return
            self.inside.discard(seq)
            ready = self._take_if_ready()
        self._decode(ready)

    def submit(self, seq: int, tokens: Sequence[int], pos0: int, want: Sequence[bool]) -> list[np.ndarray]:
        """Decode ``tokens`` in sequence ``seq`` with the others' blocks; the logits rows asked for."""
        if self.phase is not None:
            self.phase.drop(seq)
        item = _Item(seq, tokens, pos0, want)
        with self._cond:
            self._pending.append(item)
            ready = self._take_if_ready()
        self._decode(ready)
        with self._cond:
            while not item.done:
                self._cond.wait()
        if item.error is not None:
            raise item.error
        return item.rows

    def _take_if_ready(self) -> list[_Item]:
        """Every pending block once every member has asked (the caller then decodes them)."""
        if not self._pending or len(self._pending) < self.members or \
                not self.inside <= {it.seq for it in self._pending}:
            return []
        items, self._pending = sorted(self._pending, key=lambda it: it.seq), []
        return items

    def _decode(self, items: list[_Item]) -> None:
        if not items:
            return
        try:
            with self.lock:
                for group in self._groups(items):
                    self.thread.call(self._run, group)
        finally:
            if self.phase is not None:
                self.phase.enter({it.seq for it in items})
            with self._cond:
                for it in items:
                    it.done = True
                self._cond.notify_all()

    def _run(self, group: list[_Item]) -> None:
        t0 = time.perf_counter()
        try:
            out = self.ctx.decode_seqs([(it.seq, it.tokens, it.pos0, it.want) for it in group])
        except SpecliError as e:
            for it in group:
                it.error = SpecliError(str(e))
            return
        dt = time.perf_counter() - t0
        n = sum(len(it.tokens) for it in group)
        if n <= self.timed_rows:
            recent = self._recent.setdefault(n, deque(maxlen=RECENT))
            recent.append(dt)
            self.measured[n] = statistics.median(recent)
        for it, rows in zip(group, out, strict=True):
            it.rows = rows
            self.share[it.seq] = dt * len(it.tokens) / n
        self.decodes += 1
        self.rows += n
        self.shared += len(group) > 1
        self.max_seqs = max(self.max_seqs, len(group))

    def _groups(self, items: list[_Item]) -> Iterator[list[_Item]]:
        """The items in batches of at most n_batch tokens (one, unless prompts' chunks crowd it)."""
        group: list[_Item] = []
        n = 0
        for it in items:
            if group and n + len(it.tokens) > self.ctx.n_batch:
                yield group
                group, n = [], 0
            group.append(it)
            n += len(it.tokens)
        if group:
            yield group

    def stats(self) -> dict:
        with self._cond:
            return {"decodes": self.decodes, "rows": self.rows, "shared_decodes": self.shared,
                    "max_sequences": self.max_seqs}
