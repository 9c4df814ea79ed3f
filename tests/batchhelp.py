"""Test helpers for :mod:`specli.speculate.batch`: several requests served together."""

import threading
from collections.abc import Sequence

from specli.errors import SpecliError
from specli.speculate.batch import Batch
from specli.speculate.loop import Response


def run_together(batch: Batch, requests: Sequence[dict]) -> list[Response]:
    """Serve ``requests`` together (keyword arguments of :meth:`Batch.generate` without the
    slot), each on its own thread from the same first step; the finished responses, in order,
    with their chunks in ``.chunks``. At most one request per slot."""
    if len(requests) > len(batch.slots):
        raise SpecliError(f"{len(requests)} requests for {len(batch.slots)} slots")
    slots = [batch.acquire(r["prompt"]) for r in requests]
    out: list[Response | None] = [None] * len(requests)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            resp = batch.generate(slots[i], **requests[i])
            resp.chunks = list(resp)
            out[i] = resp
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(e)
        finally:
            batch.batcher.leave()
            batch.release(slots[i])

    for _ in requests:
        batch.batcher.join()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out
