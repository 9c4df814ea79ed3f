"""Model weights loaded once and shared: the sessions of one server that name the same file at
the same placement (a draft model two targets use, say) hold one :class:`Model`, closed when the
last of them lets it go. Weights are read-only to llama.cpp, so each session keeps its own
contexts over them."""

from __future__ import annotations

import os
import threading

from specli.engine.binding import Model


class Weights:
    """The shared models, counted by their holders."""

    def __init__(self):
        self._held: dict[tuple[str, int, bool], tuple[Model, int]] = {}
        self._lock = threading.Lock()

    def get(self, path: str, n_gpu_layers: int = 0, load_mtp: bool = False) -> Model:
        """The model of ``path`` at this placement: the one already loaded, else loaded now."""
        key = (os.path.realpath(path), n_gpu_layers, load_mtp)
        with self._lock:
            model, n = self._held.get(key, (None, 0))
            if model is None:
                model = Model(path, n_gpu_layers=n_gpu_layers, load_mtp=load_mtp)
            self._held[key] = (model, n + 1)
            return model

    def put(self, model: Model) -> None:
        """One holder lets ``model`` go; the last one closes it (outside the lock: freeing a
        model's memory takes a while, and a load beside it need not wait)."""
        with self._lock:
            for key, (m, n) in self._held.items():
                if m is model:
                    if n > 1:
                        self._held[key] = (m, n - 1)
                        return
                    del self._held[key]
                    break
        model.close()

    def holders(self, path: str) -> int:
        """How many hold a model of ``path`` (at any placement)."""
        real = os.path.realpath(path)
        with self._lock:
            return sum(n for (p, _, _), (_, n) in self._held.items() if p == real)
