"""Model stores laid out the way each tool writes them, from existing GGUF files linked in (hard
links, or symlinks across file systems; never copies), under a temporary HOME."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specli.resolve.integrity import sha256_of

MODEL = "application/vnd.ollama.image.model"


def link(src: str | os.PathLike, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system
        os.symlink(os.path.abspath(src), dst)
    return dst


def _blob(root: Path, data: bytes) -> dict:
    import hashlib
    sha = hashlib.sha256(data).hexdigest()
    p = root / "blobs" / f"sha256-{sha}"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return {"digest": f"sha256:{sha}", "size": len(data)}


def ollama_manifest(root: Path, registry: str, namespace: str, model: str, tag: str, layers: list[dict]) -> Path:
    """``manifests/<registry>/<namespace>/<model>/<tag>``, as ``ollama pull`` writes it."""
    cfg = _blob(root, json.dumps({"model_format": "gguf", "model_family": "llama"}).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **cfg},
                "layers": layers}
    p = root / "manifests" / registry / namespace / model / tag
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(manifest))
    return p


def ollama_model(root: Path, name: str, gguf: str | os.PathLike, sha256: str | None = None,
                 old_blob_name: bool = False) -> Path:
    """An Ollama model ``[registry/][namespace/]model:tag`` whose weights are ``gguf`` (linked as
    its blob), with a template and params layer beside it; returns the blob path."""
    base, tag = name.rsplit(":", 1) if ":" in name.rsplit("/", 1)[-1] else (name, "latest")
    parts = base.split("/")
    registry, namespace, model = (["registry.ollama.ai", "library"][:3 - len(parts)] + parts)
    sha = sha256 or sha256_of(gguf)
    blob = root / "blobs" / (f"sha256:{sha}" if old_blob_name else f"sha256-{sha}")
    if not blob.exists():
        link(gguf, blob)
    layers = [{"mediaType": MODEL, "digest": f"sha256:{sha}", "size": os.path.getsize(gguf)},
              {"mediaType": "application/vnd.ollama.image.template", **_blob(root, b"{{ .Prompt }}")},
              {"mediaType": "application/vnd.ollama.image.params", **_blob(root, b'{"stop": ["<|im_end|>"]}')}]
    ollama_manifest(root, registry, namespace, model, tag, layers)
    return blob


def hf_cached(cache: Path, repo_id: str, filename: str, gguf: str | os.PathLike, sha256: str | None = None,
              revision: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """A file of ``repo_id`` in huggingface-hub's cache layout: the blob named by its SHA-256,
    the snapshot's relative symlink to it, ``refs/main``; returns the snapshot path."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    blob = folder / "blobs" / (sha256 or sha256_of(gguf))
    if not blob.exists():
        link(gguf, blob)
    snap = folder / "snapshots" / revision / filename
    snap.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(blob, snap.parent), snap)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    return snap


def snapshot(*roots: Path) -> dict:
    """Every entry under the roots with its size, modification time and inode: equal before and
    after a command means the command wrote, moved and deleted nothing there."""
    out = {}
    for root in roots:
        for d, dirs, files in os.walk(root):
            for n in dirs + files:
                p = os.path.join(d, n)
                st = os.lstat(p)
                out[p] = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)
    return out


def clean_env(home: Path, **extra) -> dict:
    """The environment of a user whose HOME is ``home``: no store variables, the Hub offline and
    unreachable, no package index."""
    drop = ("HF_", "HUGGINGFACE_", "OLLAMA_", "LLAMA_", "XDG_", "SPECLI_", "PIP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9", PIP_NO_INDEX="1",
               PIP_INDEX_URL="http://127.0.0.1:9/simple")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def isolate_home(mp, h: Path) -> None:
    """Through the monkeypatch ``mp``: ``h`` as HOME with no store variables, specli's config
    there, the Hub offline (in this process and the CLI's)."""
    import huggingface_hub.constants
    for k in list(os.environ):
        if k.startswith(("OLLAMA_", "LLAMA_", "XDG_", "HF_", "HUGGINGFACE_")) or k in ("SPECLI_MODEL_DIRS",
                                                                                       "SPECLI_CACHE"):
            mp.delenv(k)
    mp.setenv("HOME", str(h))
    mp.setenv("SPECLI_CONFIG_DIR", str(h / ".config" / "specli"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(h / ".cache" / "huggingface" / "hub"))
