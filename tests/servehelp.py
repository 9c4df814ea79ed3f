"""Shared by the serve tests: a worker that a test can hold at a point of a generation, and
the server's ``/health``. The hooks run on the worker's thread (with ``--parallel``, the job's
own, the batch's other steps going on meanwhile):

- ``before_job(job)``: before its generation starts;
- ``after_chunk(job, n)``: after its n-th chunk was handed on;
- ``prompt_chunk(job, n)`` (``--parallel``): after the n-th chunk of its prompt went in, when
  more follow;

and ``hold()``/``release()`` (``--parallel``) admit nothing meanwhile, so that several
requests start together."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from specli.serve.worker import Job, ParallelWorker, Worker


class Hooks:
    before_job: Callable[[Job], None] | None = None
    after_chunk: Callable[[Job, int], None] | None = None
    prompt_chunk: Callable[[Job, int], None] | None = None

    def reset(self, limit: int = 8) -> None:
        """Undo what a test set: the hooks, the queue's limit, a held admission."""
        self.before_job = self.after_chunk = self.prompt_chunk = None
        self.limit = limit

    def held(self, hook: Callable, *args) -> None:
        hook(*args)

    def _generate(self, job: Job):
        if self.before_job is not None:
            self.held(self.before_job, job)
        return super()._generate(job)

    def _go_on(self, job: Job, n: int) -> bool:
        if self.after_chunk is not None:
            self.held(self.after_chunk, job, n)
        return super()._go_on(job, n)


class HookedWorker(Hooks, Worker):
    pass


class HookedParallelWorker(Hooks, ParallelWorker):
    def __init__(self, session, queue: int = 8):
        super().__init__(session, queue)
        self.open = threading.Event()
        self.open.set()

    def held(self, hook: Callable, *args) -> None:
        with self.batch.away(self.current_slot()):  # the others' steps go on meanwhile
            hook(*args)

    def _prompt_go_on(self, job: Job, n: int) -> bool:
        if self.prompt_chunk is not None:
            self.held(self.prompt_chunk, job, n)
        return super()._prompt_go_on(job, n)

    def _admits(self) -> bool:
        return self.open.is_set() and super()._admits()

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()
        with self._cond:  # the worker thread looks at its queue again
            self._cond.notify_all()

    def reset(self, limit: int = 8) -> None:
        super().reset(limit)
        self.release()


def hooked_worker(session, queue: int = 8) -> HookedWorker | HookedParallelWorker:
    """The worker ``create_app`` would make for ``session``, with the hooks."""
    return HookedParallelWorker(session, queue) if session.ctx.n_seq > 1 else HookedWorker(session, queue)


def health(served) -> dict:
    """``/health`` of the ``served`` fixture's server."""
    return httpx.get(served[0] + "/health").json()
