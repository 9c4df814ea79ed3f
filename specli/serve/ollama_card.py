"""The served model as Ollama's listing endpoints describe it (``/api/tags``, ``/api/show``,
``/api/ps``), from its GGUF header: the details, the digest, the model card."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import numpy as np
from gguf.constants import LlamaFileType
from starlette.concurrency import run_in_threadpool

from specli import toolcalls
from specli.errors import SpecliError
from specli.resolve import integrity
from specli.resolve.hfcache import blob_sha256
from specli.serve.ollama_schemas import DEFAULTS, rfc3339
from specli.serve.shared import Served


def parameter_size(n: int) -> str:
    """Ollama's way of writing a parameter count: 1.5B, 494.03M."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            x = n / scale
            return f"{x:.0f}{unit}" if x == int(x) else f"{x:.1f}{unit}" if unit == "B" else f"{x:.2f}{unit}"
    return str(n)


def quantization_level(header) -> str:
    """The file type as Ollama names it (Q4_K_M, F16, ...), from ``general.file_type``."""
    ft = header.get("general.file_type")
    try:
        name = LlamaFileType(int(ft)).name
    except (TypeError, ValueError):
        return "unknown"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def file_digest(path: str) -> str:
    """The file's SHA-256: the Hub's blob name, or what specli verified before, else hashed once
    (seconds for GB files) and remembered beside the other verified files."""
    return blob_sha256(path) or integrity.cached_sha256(path)


def _plain(v: Any, verbose: bool) -> Any:
    """A header value as JSON; arrays (the vocabulary, merges) empty unless ``verbose``, as Ollama does."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return (v.tolist() if isinstance(v, np.ndarray) else list(v)) if verbose else []
    return v.item() if isinstance(v, np.generic) else v


def _tools_supported(template: str) -> bool:
    try:
        toolcalls.detect(template)
    except SpecliError:
        return False
    return True


class ModelCard:
    """A model as Ollama's listing endpoints describe it, from its GGUF header and how it is
    (or would be) run: its context, its GPU layers, its drafter."""

    def __init__(self, ids: list[str], path: str, header, n_ctx: int, gpu_layers: int, drafter: str,
                 draft_path: str | None = None):
        self.ids, self.path, self.header, self.n_ctx, self.gpu_layers = ids, path, header, n_ctx, gpu_layers
        self.drafter, self.draft_path = drafter, draft_path
        self.name = ids[0] if ":" in ids[0] else f"{ids[0]}:latest"
        h = header
        arch = h.architecture
        self.details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                        "parameter_size": parameter_size(h.n_params), "quantization_level": quantization_level(h)}
        self.size = os.path.getsize(self.path)
        self.modified_at = rfc3339(os.path.getmtime(self.path))
        self._digest: str | None = None

    @classmethod
    def of(cls, served: Served) -> ModelCard:
        """A loaded model's card: the drafter its generations use (with --parallel, the slots')."""
        s = served.session
        return cls(served.ids, s.target.path, s.target.header, s.ctx.n_ctx, s.target_gpu_layers, served.drafter,
                   s.draft_path)

    def names(self) -> set[str]:
        """Every name a request may use: the served ones, with or without ``:latest``."""
        return {n for i in self.ids for n in (i, f"{i}:latest")}

    async def digest(self) -> str:
        if self._digest is None:
            self._digest = await run_in_threadpool(file_digest, self.path)
        return self._digest

    async def listed(self) -> dict:
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": await self.digest(), "details": self.details}

    async def running(self) -> dict:
        layers = int(self.header.arch_key("block_count", 0) or 0)
        on_gpu = layers if self.gpu_layers < 0 else min(self.gpu_layers, layers)
        size_vram = self.size * on_gpu // layers if layers else 0
        # loaded until the server stops, whatever keep_alive said
        expires = rfc3339(time.time() + timedelta(days=365 * 100).total_seconds())
        return {**await self.listed(), "expires_at": expires, "size_vram": size_vram,
                "context_length": self.n_ctx}

    def show(self, verbose: bool) -> dict:
        info = {k: _plain(v, verbose) for k, v in self.header.metadata.items() if k != "tokenizer.chat_template"}
        template = str(self.header.get("tokenizer.chat_template") or "")
        caps = ["completion"] + (["tools"] if template and _tools_supported(template) else [])
        params = "\n".join(f"{k:<30} {v}" for k, v in [*DEFAULTS.items(), ("num_ctx", self.n_ctx)])
        draft = f"# draft: {os.path.basename(self.draft_path)}\n" if self.draft_path else ""
        served_by = f"# served by specli (drafter: {self.drafter})\n"
        return {"modelfile": f"{served_by}{draft}FROM {self.path}\n",
                "parameters": params, "template": template, "details": self.details, "model_info": info,
                "capabilities": caps, "modified_at": self.modified_at,
                "license": str(self.header.get("general.license", ""))}
