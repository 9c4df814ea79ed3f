"""A local HTTP server on 127.0.0.1 that answers the Hugging Face Hub's model-info, tree,
search and file (resolve) requests, with HEAD, range requests, ETags (the content's SHA-256, as
the Hub gives for LFS files), revisions, gating, a switch that cuts a download mid-file and one
that holds it there until released, so the real huggingface-hub client is what the tests
exercise."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse


@dataclass
class Repo:
    files: dict[str, str]  # repo path -> local file
    gated_token: str | None = None  # requests need "Authorization: Bearer <token>"
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    tags: tuple[str, ...] = ("gguf",)
    revisions: dict[str, Repo] = field(default_factory=dict)  # branch or tag -> its files and commit

    def at(self, rev: str | None) -> Repo:
        for name, r in self.revisions.items():
            if rev in (name, r.sha):
                return r
        return self


@dataclass
class HubState:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut_once: dict[str, int] = field(default_factory=dict)  # path -> bytes to send before dropping
    served: dict[str, int] = field(default_factory=dict)  # path -> bytes of file content sent
    requests: list[str] = field(default_factory=list)
    pause_at: dict[str, int] = field(default_factory=dict)  # path -> bytes to send, then hold until release
    paused: threading.Event = field(default_factory=threading.Event)  # set when a download is held
    release: threading.Event = field(default_factory=threading.Event)
    _etags: dict[str, str] = field(default_factory=dict)

    def etag(self, path: str) -> str:
        if path not in self._etags:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            self._etags[path] = h.hexdigest()
        return self._etags[path]


class HubHandler(BaseHTTPRequestHandler):
    """The Hub's routes that huggingface-hub calls: model info and search, file trees, files
    (ranges, a cut-off or a held download as the state asks)."""

    protocol_version = "HTTP/1.1"
    state: HubState  # set per server (:func:`_handler`)

    def log_message(self, *a):  # quiet
        pass

    def _json(self, code: int, obj, headers: dict | None = None):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, err_code: str, msg: str):
        self._json(code, {"error": msg}, {"X-Error-Code": err_code, "X-Error-Message": msg})

    def _repo(self, rid: str) -> Repo | None:
        repo = self.state.repos.get(rid)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository not found: {rid}")
            return None
        if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            self._error(401, "GatedRepo", f"Access to model {rid} is restricted. You must have access to it "
                                          "and be authenticated to access it.")
            return None
        return repo

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        u = urlparse(self.path)
        self.state.requests.append(f"{self.command} {self.path}")
        parts = [p for p in unquote(u.path).split("/") if p]
        if parts[:2] == ["api", "models"] and len(parts) == 2:
            return self._search(parse_qs(u.query).get("search", [""])[0].lower())
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._model_api("/".join(parts[2:4]), parts[4:], parse_qs(u.query))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        self._error(404, "RepoNotFound", "not found")

    def _search(self, q: str):
        out = [{"id": rid, "modelId": rid, "tags": list(r.tags), "private": False}
               for rid, r in self.state.repos.items() if q in rid.lower()]
        return self._json(200, out)

    def _model_api(self, rid: str, rest: list[str], query: dict):
        repo = self._repo(rid)
        if repo is None:
            return None
        if len(rest) >= 2 and rest[0] in ("revision", "tree"):
            repo = repo.at(rest[1])
        if not rest or rest[0] == "revision":
            sib = [{"rfilename": f, "size": os.path.getsize(p)} for f, p in repo.files.items()]
            return self._json(200, {"id": rid, "modelId": rid, "sha": repo.sha, "siblings": sib,
                                    "private": False, "gated": bool(repo.gated_token), "tags": list(repo.tags),
                                    "downloads": 0, "likes": 0, "lastModified": "2026-01-01T00:00:00.000Z"})
        if rest[0] == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._json(200, self._tree(repo, "/".join(rest[2:]), recursive))
        return self._error(404, "EntryNotFound", "unknown api route")

    def _tree(self, repo: Repo, prefix: str, recursive: bool) -> list[dict]:
        entries, dirs = [], set()
        for f, p in sorted(repo.files.items()):
            if prefix and not f.startswith(prefix + "/"):
                continue
            sub = f[len(prefix) + 1:] if prefix else f
            if "/" in sub and not recursive:
                d = (prefix + "/" if prefix else "") + sub.split("/")[0]
                if d not in dirs:
                    dirs.add(d)
                    entries.append({"type": "directory", "path": d, "oid": "0" * 40, "size": 0})
                continue
            entries.append({"type": "file", "path": f, "size": os.path.getsize(p), "oid": self.state.etag(p)[:40]})
        return entries

    def _resolve(self, rid: str, revision: str, fname: str):
        repo = self._repo(rid)
        if repo is None:
            return None
        repo = repo.at(revision)
        local = repo.files.get(fname)
        if local is None:
            return self._error(404, "EntryNotFound", f"{fname} does not exist in {rid}")
        return self._file(repo, fname, local)

    def _range(self, size: int) -> tuple[int, int, int] | None:
        """(status, first byte, last byte) of the request's Range; None after answering 416."""
        rng = self.headers.get("Range")
        if not (rng and rng.startswith("bytes=")):
            return 200, 0, size - 1
        a, _, b = rng[6:].partition("-")
        start = int(a) if a else 0
        end = min(int(b), size - 1) if b else size - 1
        if start >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return 206, start, end

    def _file(self, repo: Repo, fname: str, local: str):
        size = os.path.getsize(local)
        got = self._range(size)
        if got is None:
            return
        code, start, end = got
        length = end - start + 1
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{self.state.etag(local)}"')
        self.send_header("X-Repo-Commit", repo.sha)
        if code == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.command != "HEAD":
            self._send(fname, local, start, length)

    def _send(self, fname: str, local: str, start: int, length: int):
        """The bytes, cut off or held where the state asks (once)."""
        cut = self.state.cut_once.pop(fname, None)
        hold = self.state.pause_at.pop(fname, None)
        sent = 0
        with open(local, "rb") as f:
            f.seek(start)
            left = length
            while left > 0:
                n = min(left, 1 << 20)
                if cut is not None and sent + n > cut:
                    n = cut - sent
                if hold is not None and sent < hold < sent + n:
                    n = hold - sent
                chunk = f.read(n)
                if not chunk:
                    break
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    return
                sent += len(chunk)
                left -= len(chunk)
                self.state.served[fname] = self.state.served.get(fname, 0) + len(chunk)
                if hold is not None and sent >= hold:
                    hold = None
                    self.wfile.flush()
                    self.state.paused.set()
                    self.state.release.wait()
                if cut is not None and sent >= cut:
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return


def _handler(state: HubState):
    return type("H", (HubHandler,), {"state": state})


class LocalServer:
    """A threaded HTTP server on 127.0.0.1 for one test; ``state.release`` is set on exit so a
    held download never outlives it."""

    def __init__(self, state, handler, path: str = ""):
        self.state = state
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.state.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class HubServer(LocalServer):
    def __init__(self, state: HubState):
        super().__init__(state, _handler(state))
