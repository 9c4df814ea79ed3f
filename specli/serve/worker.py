"""One llama.cpp context, one generation at a time: a worker thread owns the Session and
serves the queued jobs in arrival order; each job hands its text to the event loop that is
answering its request, and stops between chunks when its client has gone."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specli.constrain import Constraint
from specli.serve.schemas import FINISH
from specli.session import Session
from specli.speculate.loop import Stats, TokenLogprob
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
    generating; :meth:`submit` raises :class:`QueueFull` beyond that.

    ``before_job(job)`` and ``after_chunk(job, n)`` are called on the worker thread before a
    generation starts and after its n-th chunk has been handed on (tests hold a generation
    there)."""

    def __init__(self, session: Session, queue: int = 8):
        self.session = session
        self.limit = queue
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.active: Job | None = None
        self.served = self.cancelled = self.rejected = self.failed = self.submitted = 0
        self.before_job: Callable[[Job], None] | None = None
        self.after_chunk: Callable[[Job, int], None] | None = None

    # -- the event loop's side ---------------------------------------------------------
    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specli-generate", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._jobs) + (self.active is not None) > self.limit:
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
            for job in [*self._jobs, self.active]:
                if job is not None:
                    job.cancel()
            self._cond.notify()

    def stop(self) -> None:
        self.cancel_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def status(self) -> dict:
        with self._cond:
            return {"limit": self.limit, "waiting": len(self._jobs), "active": int(self.active is not None),
                    "served": self.served, "cancelled": self.cancelled, "rejected": self.rejected,
                    "failed": self.failed}

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
        if self.before_job is not None:
            self.before_job(job)
        try:
            finish, stats = self._generate(job)
        except Exception as e:  # noqa: BLE001 - the error goes to the client, the server keeps serving
            self._count("failed")
            self.session.ctx.clear()  # whatever the cache holds now, the next request re-evaluates
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
        # whole batches of a cached prompt only: a repeated prompt is answered as a fresh run is
        resp = self.session.generate(job.prompt, job.params, job.max_tokens, exact_prefill=True,
                                     constraint=job.constraint, logprobs=job.logprobs)
        scan = StopScanner(job.stop)
        stopped = cancelled = False
        try:
            for n, ch in enumerate(resp, 1):
                text, stopped = scan.feed(ch.text)
                if text or ch.logprobs:
                    job.put(Event("text", text, logprobs=ch.logprobs))
                if stopped:
                    break
                if self.after_chunk is not None:
                    self.after_chunk(job, n)
                if job.cancelled:
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

    def _count(self, what: str) -> None:
        with self._cond:
            setattr(self, what, getattr(self, what) + 1)
