"""Test-only: `python tests/pausehook.py ARGS` runs `specli ARGS` with generation held at a known
point until a signal arrives, so a test sends Ctrl-C or SIGTERM after an event it observes
instead of racing the model (a fast machine finishes a reply before a timed Ctrl-C).

From generation number PAUSEHOOK_FROM (1-based, default 1; every Session.generate call
counts: bench's warm-ups too) on, each generation stops after its first streamed chunk, prints
MARK on stderr and sleeps until a signal's exception (KeyboardInterrupt, SIGTERM's) comes; that
exception is then raised inside the decoding loop, where a real signal would land.
PAUSEHOOK_FROM=0: never hold. A SIGINT ignored by whoever started the tests (a shell's
background job) is restored to Ctrl-C's usual KeyboardInterrupt, as in a terminal."""

import os
import signal
import sys
import time

MARK = "[pausehook: holding for a signal]"


def _held(chunks):
    first = True
    for ch in chunks:
        yield ch
        if first:
            first = False
            print(MARK, file=sys.stderr, flush=True)
            try:
                while True:
                    time.sleep(1)
            except BaseException as e:  # noqa: BLE001 - the signal's exception, re-raised in the loop
                chunks.throw(e)


def install(hold_from: int) -> None:
    from specli.session import Session
    from specli.speculate.loop import Response

    generate, calls = Session.generate, [0]

    def held_generate(self, *a, **kw):
        resp = generate(self, *a, **kw)
        calls[0] += 1
        return Response(_held(iter(resp)), resp.stats) if 0 < hold_from <= calls[0] else resp

    Session.generate = held_generate


if __name__ == "__main__":
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    install(int(os.environ.get("PAUSEHOOK_FROM", "1")))
    sys.argv[0] = "specli"
    from specli.cli import main

    main()
