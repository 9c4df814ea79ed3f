"""A batch job's items through ONE loaded :class:`~specli.session.Session`: one after another
on the session's own drafter (``--parallel 1``, as ``serve`` answers one request at a time),
or N at once in the batch engine ``serve --parallel N`` uses
(:class:`specli.speculate.batch.Batch`), each slot a thread. Whatever the session keeps
between generations spans every item.

Each item is generated as a fresh ``specli run`` of it would be (only whole batches of a
cached prompt are reused: ``exact_prefill``), so its text is that run's: the same greedy text,
and at T > 0 the same text for the same seed. :func:`record` is the one place an item's result
becomes its output line."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specli.batchjob.items import BadLine, BatchItem
from specli.constrain import Constraint
from specli.errors import SpecliError
from specli.prompt import chat_text, tokenize_prompt
from specli.speculate.loop import Response, Stats, check_prompt_fits
from specli.speculate.verify import SamplingParams


@dataclass(frozen=True)
class Defaults:
    """What an item does not set itself: the command line's options."""

    max_tokens: int = 256
    params: SamplingParams = field(default_factory=SamplingParams)
    constraint: Constraint | None = None
    chat: bool | None = None
    system: str | None = None


@dataclass(frozen=True)
class Prepared:
    """An item ready to generate: ``index`` its place in the output."""

    index: int
    item: BatchItem
    tokens: list[int]
    params: SamplingParams
    max_tokens: int
    constraint: Constraint | None


def record(p: Prepared, text: str, resp: Response, full_stats: bool = False) -> dict:
    """An item's output line: its id, text, finish reason, then the token counts and the
    ``speculative`` object exactly as ``serve`` reports them in ``usage``; with ``--stats`` the
    whole :class:`~specli.speculate.loop.Stats` too (as ``specli run --json`` gives it)."""
    from specli.serve.schemas import usage  # the server's shape, one definition

    rec = {"id": p.item.id, "text": text, "finish_reason": resp.finish_reason, **usage(resp.stats, len(p.tokens))}
    if full_stats:
        rec["stats"] = resp.stats.to_dict()
    return rec


def _tokens(sess, item: BatchItem, d: Defaults) -> list[int]:
    if item.prompt is not None:
        return sess.prompt_tokens(item.prompt, d.chat, d.system)
    model = sess.target
    if d.chat is False:
        raise SpecliError("'messages' need the model's chat template, and --raw turns it off")
    msgs = [{"role": r, "content": c} for r, c in item.messages]
    if d.system and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": d.system})
    toks = tokenize_prompt(model, chat_text(model, msgs), templated=True)
    check_prompt_fits(len(toks), sess.ctx.n_ctx)
    return toks


def prepare(sess, items: list[BatchItem], d: Defaults) -> tuple[list[Prepared], list[BadLine]]:
    """Every item's prompt tokens and settings on the loaded model; an item whose prompt cannot
    run there (too long for the context, a conversation without a chat template) is a bad line."""
    out: list[Prepared] = []
    bad: list[BadLine] = []
    for item in items:
        try:
            toks = _tokens(sess, item, d)
        except SpecliError as e:
            bad.append(BadLine(item.line, str(e)))
            continue
        params = d.params
        if item.temperature is not None:
            params = replace(params, temperature=item.temperature)
        if item.seed is not None:
            params = replace(params, seed=item.seed)
        constraint = Constraint.json_schema(item.json_schema) if item.json_schema is not None else d.constraint
        out.append(Prepared(len(out), item, toks, params, item.max_tokens or d.max_tokens, constraint))
    return out, bad


Done = Callable[[Prepared, dict, Stats], None]  # an item's record and stats, as it finishes


def _consume(resp: Response, stop: threading.Event | None = None) -> str | None:
    """The whole text (None: stopped first); the response is closed either way."""
    pieces = []
    try:
        for ch in resp:
            pieces.append(ch.text)
            if stop is not None and stop.is_set():
                return None
    finally:
        resp.close()
    return "".join(pieces)


def run_serial(sess, jobs: list[Prepared], done: Done, full_stats: bool = False) -> None:
    """One item after another on the session's drafter."""
    for p in jobs:
        resp = sess.generate(p.tokens, p.params, p.max_tokens, exact_prefill=True, constraint=p.constraint)
        done(p, record(p, _consume(resp), resp, full_stats), resp.stats)


class ParallelRun:
    """Up to ``n`` items at once in one :class:`~specli.speculate.batch.Batch` on the session's
    context of ``n`` sequences; the items are taken in input order and finish in any order."""

    def __init__(self, sess, n: int):
        from specli.speculate.batch import Batch

        self.batch = Batch(sess, n)
        self.n = n
        self._todo: deque[Prepared] = deque()
        self._lock = threading.Lock()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self.full_stats = False

    def _next(self) -> Prepared | None:
        with self._lock:
            return self._todo.popleft() if self._todo and not self._stop.is_set() else None

    def _member(self) -> None:
        """A slot's thread: items one after another, each a member of the batch while it runs."""
        b = self.batch
        while (p := self._next()) is not None:
            slot = b.acquire(p.tokens)
            b.batcher.join()
            try:
                resp = b.generate(slot, p.tokens, p.params, p.max_tokens, exact_prefill=True,
                                  constraint=p.constraint)
                text = _consume(resp, self._stop)
                if text is None:
                    return
                self._results.put((p, record(p, text, resp, self.full_stats), resp.stats, None))
            except BaseException as e:  # noqa: BLE001 - raised again on the job's thread
                self._stop.set()
                self._results.put((p, None, None, e))
                return
            finally:
                b.batcher.leave()
                b.release(slot)

    def run(self, jobs: list[Prepared], done: Done, full_stats: bool = False) -> None:
        self.full_stats = full_stats
        self._todo.extend(jobs)
        threads = [threading.Thread(target=self._member, name="specli-batch-slot", daemon=True)
                   for _ in range(min(self.n, len(jobs)))]
        for t in threads:
            t.start()
        try:
            for _ in jobs:
                p, rec, stats, error = self._get()
                if error is not None:
                    raise error
                done(p, rec, stats)
        finally:
            self._stop.set()
            for t in threads:
                t.join()

    def _get(self):
        while True:  # a timeout, so that Ctrl-C reaches this thread while it waits
            try:
                return self._results.get(timeout=0.5)
            except queue.Empty:
                continue

    def close(self) -> None:
        self.batch.close()
