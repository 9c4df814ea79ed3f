"""Where a batch job's results go: one JSON line per item, in input order, to standard output
or to an ``--out`` file that a restarted job resumes.

The file is appended to, one flushed and fsynced line per item, so a job killed at any moment
leaves whole lines and at most one torn last line. A restart reads the file, truncates a torn
last line (its item runs again) and skips every id already there: nothing is lost and nothing
is written twice."""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Protocol

from specli.batchjob.items import id_key
from specli.errors import SpecliError


class Sink(Protocol):
    """Takes each item's result, in input order."""

    def write(self, record: dict) -> None: ...

    def close(self) -> None: ...


def _line(record: dict) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


class StdoutSink:
    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream or sys.stdout

    def write(self, record: dict) -> None:
        try:
            self.stream.write(_line(record).decode("utf-8"))
            self.stream.flush()
        except BrokenPipeError:  # the reader left (`| head`): stop, quietly at exit too
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            raise SpecliError("standard output was closed: the job stopped", exit_code=141) from None

    def close(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            pass


class ResultFile:
    """An ``--out`` file: the ids already in it (:attr:`done`), then one durable line per
    :meth:`write`. ``torn`` tells whether a torn last line was dropped on opening."""

    def __init__(self, path: str):
        self.path = path
        self.done: set[str] = set()
        self.torn = False
        try:
            self._f = open(path, "a+b")  # noqa: SIM115 - held open for the job, closed by close()
        except OSError as e:
            raise SpecliError(f"cannot open --out {path}: {e.strerror or e}") from None
        try:
            self._resume()
        except BaseException:
            self._f.close()
            raise

    def _resume(self) -> None:
        f = self._f
        f.seek(0)
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line the last job was writing when it was killed
            f.truncate(end)
            self._sync()
            self.torn = True
        for n, raw in enumerate(data[:end].splitlines(), 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                rec = None
            if not isinstance(rec, dict) or "id" not in rec:
                raise SpecliError(f"--out {self.path}: line {n} is not a result of specli run --batch; "
                                  "give another --out file")
            self.done.add(id_key(rec["id"]))
        f.seek(0, os.SEEK_END)

    def _sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def write(self, record: dict) -> None:
        try:
            self._f.write(_line(record))
            self._sync()
        except OSError as e:
            raise SpecliError(f"cannot write to --out {self.path}: {e.strerror or e}") from None

    def close(self) -> None:
        self._f.close()


class InOrder:
    """Results that finish in any order, handed to ``sink`` in input order: ``put(i, record)``
    for the ``i``-th item; each is written as soon as every item before it has been."""

    def __init__(self, sink: Sink):
        self.sink = sink
        self.next = 0
        self.waiting: dict[int, dict] = {}

    def put(self, i: int, record: dict) -> list[dict]:
        """Take item ``i``'s result; the results written now, in order."""
        self.waiting[i] = record
        out = []
        while self.next in self.waiting:
            rec = self.waiting.pop(self.next)
            self.sink.write(rec)
            out.append(rec)
            self.next += 1
        return out
