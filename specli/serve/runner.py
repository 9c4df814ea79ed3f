"""Running the API with uvicorn: in the foreground (``specli serve``, Ctrl-C and SIGTERM
stop it cleanly) or on a background thread (tests, the benchmark)."""

from __future__ import annotations

import ipaddress
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from specli.errors import SpecliError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_bind(host: str, port: int, api_key: str | list[str] | None) -> None:
    """Refuse, before any model loads, to listen beyond this machine without an API key, or
    on an address that is taken."""
    if not is_loopback(host) and not api_key:
        raise SpecliError(f"refusing to listen on {host} without an API key: anyone who can reach it could use "
                          "the model; give --api-key KEY (or set SPECLI_API_KEY), or bind 127.0.0.1")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise SpecliError(f"cannot listen on {host}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise SpecliError(f"cannot listen on {host}:{port}: {e.strerror}") from None


class Server(uvicorn.Server):
    """uvicorn's server; on shutdown the running generation is stopped at its next chunk
    and the waiting ones are dropped, so open requests end at once. ``ready`` is set once
    it listens."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[Server], None] | None = None):
        super().__init__(config)
        self.ready = threading.Event()
        self.on_ready = on_ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready(self)
        self.ready.set()

    async def shutdown(self, sockets=None) -> None:
        worker = getattr(self.config.app.state, "worker", None) if isinstance(self.config.app, FastAPI) else None
        if worker is not None:
            worker.cancel_all()
        await super().shutdown(sockets)


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                on_ready: Callable[[Server], None] | None = None) -> Server:
    return Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                                 lifespan="on"), on_ready)


def serve_forever(server: Server) -> str | None:
    """Run in the foreground until Ctrl-C or SIGTERM; returns the signal's name (None when
    the server stopped by itself). uvicorn re-raises the signal once it has shut down; the
    handlers here swallow it, so the process exits normally."""
    got: list[int] = []
    handlers = {sig: signal.signal(sig, lambda s, f: got.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
    return signal.Signals(got[0]).name if got else None


def bound_port(server: Server) -> int:
    return server.servers[0].sockets[0].getsockname()[1]


@contextmanager
def background(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` on a thread; yields the base URL (``http://host:port``); stops on exit."""
    server = make_server(app, host, port)
    thread = threading.Thread(target=server.run, name="specli-serve", daemon=True)
    thread.start()
    while not server.ready.wait(0.05):
        if not thread.is_alive():
            break
    try:
        if not server.ready.is_set() or server.should_exit:
            raise SpecliError(f"the server did not start on {host}:{port}")
        yield f"http://{host}:{bound_port(server)}"
    finally:
        server.should_exit = True
        thread.join()
