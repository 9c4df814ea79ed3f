"""``specli run --batch FILE``: every line checked first, the ids an ``--out`` file already
holds skipped, the model loaded once, the items run, one result line each in input order.

Exit status (:func:`run_job` returns it): 0 when every line ran; 1 when some lines were bad
(each reported as ``line N: reason`` and skipped; the others ran); 2 with ``--strict`` when a
line is bad: then nothing runs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from specli.batchjob.items import BadLine, read_items
from specli.batchjob.output import InOrder, ResultFile, Sink, StdoutSink
from specli.batchjob.progress import BatchProgress
from specli.batchjob.runner import Defaults, ParallelRun, Prepared, prepare, run_serial
from specli.errors import SpecliError
from specli.utf8 import decode_utf8, read_utf8

STRICT_EXIT = 2


@dataclass
class BatchOptions:
    source: str  # the batch file, or "-" for standard input
    out: str | None = None  # the results file (appended to, resumed); None: standard output
    strict: bool = False
    parallel: int = 1
    stats: bool = False  # each line also carries the whole stats; a summary line at the end
    defaults: Defaults = field(default_factory=Defaults)


def read_source(source: str) -> str:
    if source == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:
            return sys.stdin.read()
        return decode_utf8(stream.read(), "standard input", "iconv -f {enc} -t UTF-8 items.jsonl | specli run ...")
    return read_utf8(source, "batch file", f"iconv -f {{enc}} -t UTF-8 {source} > items-utf8.jsonl")


class _Job:
    def __init__(self, opts: BatchOptions, notify: Callable[[str], None]):
        self.opts, self.notify = opts, notify
        self.bad: list[BadLine] = []
        self.sink: Sink | None = None

    def check(self, bad: list[BadLine]) -> None:
        """Report bad lines; under ``--strict`` stop before anything runs."""
        for b in bad:
            self.notify(str(b))
        self.bad += bad
        if bad and self.opts.strict:
            n = len(self.bad)
            raise SpecliError(f"{n} bad line{'s' if n > 1 else ''} in the batch; nothing ran (--strict)",
                              exit_code=STRICT_EXIT)

    def open_sink(self) -> set[str]:
        """The sink, and the ids it already holds."""
        if self.opts.out is None:
            self.sink = StdoutSink()
            return set()
        f = ResultFile(self.opts.out)
        self.sink = f
        if f.torn:
            self.notify(f"{self.opts.out}: dropped a torn last line (its item runs again)")
        return f.done

    def run(self, sess, jobs: list[Prepared]) -> BatchProgress:
        order = InOrder(self.sink)
        with BatchProgress(len(jobs)) as prog:
            def done(p: Prepared, rec: dict, stats) -> None:
                prog.done(stats)
                order.put(p.index, rec)

            if self.opts.parallel > 1:
                par = ParallelRun(sess, self.opts.parallel)
                try:
                    par.run(jobs, done, self.opts.stats)
                finally:
                    par.close()
            else:
                run_serial(sess, jobs, done, self.opts.stats)
        return prog


def run_job(opts: BatchOptions, open_session: Callable[[], object], notify: Callable[[str], None]) -> int:
    """The job, start to end; its exit status. ``open_session`` loads the models (only once
    there is something to run), ``notify`` prints a one-line message on standard error."""
    job = _Job(opts, notify)
    items, bad = read_items(read_source(opts.source))
    job.check(bad)
    done = job.open_sink()
    try:
        todo = [it for it in items if it.key not in done]
        if len(todo) < len(items):
            notify(f"{len(items) - len(todo)} of {len(items)} items already in {opts.out}: skipped")
        if not todo:
            if not items and not bad:
                notify("the batch has no items")
            return 1 if job.bad else 0
        sess = open_session()
        try:
            jobs, bad = prepare(sess, todo, opts.defaults)
            job.check(bad)
            prog = job.run(sess, jobs) if jobs else None
        finally:
            sess.close()
        if opts.stats and prog is not None:
            notify(prog.summary())
    finally:
        job.sink.close()
    return 1 if job.bad else 0
