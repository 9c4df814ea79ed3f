"""One llama.cpp context, one generation at a time: a worker thread owns the Session and
serves the queued jobs in arrival order; each job hands its text to the event loop that is
answering its request, and stops between chunks when its client has gone. With
``--parallel N`` (:class:`ParallelWorker`) up to N jobs generate at once, in one batch."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field

from specli.constrain import Constraint
from specli.errors import Interrupted
from specli.serve.schemas import FINISH
from specli.session import Session
from specli.speculate.batch import Batch, Slot
from specli.speculate.loop import Response, Stats, TokenLogprob
from specli.speculate.verify import SamplingParams


class QueueFull(Exception):
    """Every place in the queue is taken; the client should retry later."""


@dataclass
class Event:
    kind: str  # "text", "done" (finish and stats set), "error" (error set), "cancelled", "gone" (the client left)
    text: str = ""
    finish: str | None = None
    stats: Stats | None = None
    error: BaseException | None = None
    logprobs: list[TokenLogprob] | None = None  # the text's tokens', when the job asked for them


class StopScanner:
    """Cuts the text at the first stop sequence. Text that could be the start of a stop
    sequence is held back until the next chunk says whether it is one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.buf = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that is safe to send now, and whether a stop sequence was found."""
        if not self.stops:
            return text, False
        self.buf += text
        hits = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buf = self.buf[:min(hits)], ""
            return out, True
        hold = max((k for s in self.stops for k in range(1, min(len(s), len(self.buf) + 1))
                    if self.buf.endswith(s[:k])), default=0)
        out, self.buf = self.buf[:len(self.buf) - hold], self.buf[len(self.buf) - hold:]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    constraint: Constraint | None = None  # the output must match it (a schema, a grammar, tool calls)
    logprobs: int | None = None  # the target's log-probabilities of each token, and this many alternatives
    owner: str | None = None  # whose earlier answers lookup copies from and this one joins (an API key's, or None)
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    seq: int = -1  # arrival order, set by Worker.submit

    def __post_init__(self):
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if self.events is None:
            self.events = asyncio.Queue()

    @property
    def cancelled(self) -> bool:
        return self.cancel_requested.is_set()

    def cancel(self) -> None:
        self.cancel_requested.set()

    def put(self, ev: Event) -> None:
        """Hand an event to the request's event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, ev)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            self.cancel()


class Worker:
    """Serves jobs one at a time on ``session``. At most ``queue`` jobs wait behind the one
    generating; :meth:`submit` raises :class:`QueueFull` beyond that."""

    slots = 1  # jobs generating at once

    def __init__(self, session: Session, queue: int = 8):
        self.session = session
        self.limit = queue
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.active: Job | None = None
        self.served = self.cancelled = self.rejected = self.failed = self.submitted = 0

    # -- the event loop's side ---------------------------------------------------------
    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specli-generate", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._jobs) + self.n_active >= self.limit + self.slots:
                self.rejected += 1
                raise QueueFull(f"{self.limit} requests are already waiting")
            job.seq = self.submitted
            self.submitted += 1
            self._jobs.append(job)
            self._cond.notify()

    def cancel_all(self) -> None:
        """Stop the running generation and drop the waiting ones (shutting down)."""
        with self._cond:
            self._stopping = True
            for job in [*self._jobs, *self._current()]:
                job.cancel()
            self._cond.notify()

    def stop(self) -> None:
        self.cancel_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def status(self) -> dict:
        with self._cond:
            return {"limit": self.limit, "waiting": len(self._jobs), "active": self.n_active,
                    "served": self.served, "cancelled": self.cancelled, "rejected": self.rejected,
                    "failed": self.failed}

    @property
    def drafter(self) -> str:
        """The name of the drafter the generations use."""
        return self.session.drafter.name

    @property
    def n_active(self) -> int:
        return int(self.active is not None)

    def _current(self) -> list[Job]:
        return [self.active] if self.active is not None else []

    # -- the worker thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self.active = self._jobs.popleft()
            try:
                self._serve(job)
            finally:
                with self._cond:
                    self.active = None

    def _serve(self, job: Job) -> None:
        if job.cancelled:  # its client left (or the server is stopping) while it waited
            self._count("cancelled")
            job.put(Event("cancelled"))
            return
        try:
            finish, stats = self._generate(job)
        except Interrupted:  # its client left while its prompt went in, chunk by chunk
            self._count("cancelled")
            job.put(Event("cancelled"))
            return
        except Exception as e:  # noqa: BLE001 - the error goes to the client, the server keeps serving
            self._count("failed")
            self._reset()  # whatever the cache holds now, the next request re-evaluates
            job.put(Event("error", error=e))
            return
        if finish is None:
            self._count("cancelled")
            job.put(Event("cancelled", stats=stats))
        else:
            self._count("served")
            job.put(Event("done", finish=finish, stats=stats))

    def _generate(self, job: Job) -> tuple[str | None, Stats]:
        """Run the generation; the finish reason (None: cancelled) and the stats."""
        resp = self._start(job)
        scan = StopScanner(job.stop)
        stopped = cancelled = False
        try:
            for n, ch in enumerate(resp, 1):
                text, stopped = scan.feed(ch.text)
                if text or ch.logprobs:
                    job.put(Event("text", text, logprobs=ch.logprobs))
                if stopped:
                    break
                if not self._go_on(job, n):
                    cancelled = True
                    break
        finally:
            resp.close()
        if cancelled:
            return None, resp.stats
        tail = scan.flush()
        if tail:
            job.put(Event("text", tail))
        return ("stop" if stopped else FINISH.get(resp.finish_reason or "", "stop")), resp.stats

    def _start(self, job: Job) -> Response:
        # whole batches of a cached prompt only: a repeated prompt is answered as a fresh run is
        return self.session.generate(job.prompt, job.params, job.max_tokens, exact_prefill=True,
                                     constraint=job.constraint, logprobs=job.logprobs, owner=job.owner)

    def _go_on(self, job: Job, n: int) -> bool:
        """After the job's ``n``-th chunk was handed on: whether to generate the next (not
        once its client has gone)."""
        return not job.cancelled

    def _reset(self) -> None:
        self.session.ctx.clear()

    def _count(self, what: str) -> None:
        with self._cond:
            setattr(self, what, getattr(self, what) + 1)


class ParallelWorker(Worker):
    """Serves up to ``parallel`` jobs at once, in one batch (:class:`specli.speculate.batch.Batch`
    over the session's context of that many sequences): the worker thread admits waiting jobs
    into free slots between steps, each on its own thread; a job that ends or whose client
    has gone frees its slot at its next step (or its prompt's next chunk). At most ``queue``
    jobs wait behind the running ones."""

    def __init__(self, session: Session, queue: int = 8):
        super().__init__(session, queue)
        self.slots = session.ctx.n_seq
        self.batch = Batch(session, self.slots)
        self.running: list[Job] = []
        self._threads: list[threading.Thread] = []
        self._mine = threading.local()  # the slot of the job the current thread serves

    @property
    def n_active(self) -> int:
        return len(self.running)

    @property
    def drafter(self) -> str:
        """The name of the drafter the slots use (each slot builds its own, of one mode)."""
        return self.batch.slots[0].drafter.name

    def _current(self) -> list[Job]:
        return list(self.running)

    def current_slot(self) -> Slot:
        """The slot of the job the calling thread serves."""
        return self._mine.slot

    def _admits(self) -> bool:
        """Whether a waiting job may take a slot now (called holding the queue's lock)."""
        return len(self.running) < self.slots

    def status(self) -> dict:
        return {**super().status(), "parallel": self.slots, "batch": self.batch.stats()}

    def stop(self) -> None:
        super().stop()
        self.batch.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._jobs or not self._admits()):
                    self._cond.wait()
                if self._stopping:
                    dropped, self._jobs = list(self._jobs), deque()
                    break
                take: list[tuple[Job, Slot]] = []
                while self._jobs and self._admits():
                    job = self._jobs.popleft()
                    take.append((job, self.batch.acquire(job.prompt)))
                    self.running.append(job)
                    self.batch.batcher.join()  # from now on each step waits for its first block
            for job, slot in take:
                t = threading.Thread(target=self._serve_in, args=(job, slot), name="specli-slot", daemon=True)
                self._threads = [th for th in self._threads if th.is_alive()] + [t]
                t.start()
        for job in dropped:
            self._count("cancelled")
            job.put(Event("cancelled"))
        for t in self._threads:
            t.join()

    def _serve_in(self, job: Job, slot: Slot) -> None:
        self._mine.slot = slot
        try:
            self._serve(job)
        finally:
            slot.ctx.interrupt = None
            self.batch.batcher.leave()
            self.batch.release(slot)
            with self._cond:
                self.running.remove(job)
                self._cond.notify_all()

    def _start(self, job: Job) -> Response:
        slot = self.current_slot()
        chunks = itertools.count(1)
        slot.ctx.interrupt = lambda: not self._prompt_go_on(job, next(chunks))
        return self.batch.generate(slot, job.prompt, job.params, job.max_tokens, exact_prefill=True,
                                   constraint=job.constraint, logprobs=job.logprobs, owner=job.owner)

    def _prompt_go_on(self, job: Job, n: int) -> bool:
        """After the ``n``-th chunk of the job's prompt went in, more to follow: whether to
        go on (not once its client has gone)."""
        return not job.cancelled

    def _reset(self) -> None:
        self.current_slot().ctx.clear()


def make_worker(session: Session, queue: int = 8) -> Worker:
    """The worker for ``session``: one job at a time, or a batch where its context holds several sequences."""
    return ParallelWorker(session, queue) if session.ctx.n_seq > 1 else Worker(session, queue)
