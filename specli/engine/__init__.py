"""A thin layer over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

- :mod:`specli.engine.binding`: the library (``L``, ``LX``, back-end set-up, its log) and
  :class:`Model` (weights and vocabulary);
- :mod:`specli.engine.context`: :class:`Context`, one KV cache: evaluate a block of tokens asking
  for logits only at chosen positions, read those logits without copying the whole buffer;
- :mod:`specli.engine.rollback`: the rollback policy (KV cut, recurrent-state snapshots,
  checkpoints) that rolls the cache back to a shorter prefix;
- :mod:`specli.engine.mtp_rows`: the MTP (NextN) hidden rows an MTP context reads;
- :mod:`specli.engine.seq`: :class:`SeqContext`, one sequence of a shared context.

``Model.handle`` and ``Context.handle`` (with ``Context.memory``) are the llama.cpp pointers for
the few calls the engine does not wrap (the drafting heads'), so no caller reads a private field.
"""

from specli.engine.binding import (
    LX,
    L,
    Model,
    captured_log,
    extra_buffer_types,
    libllama,
    mtp_available,
    supports_gpu_offload,
    system_info,
)
from specli.engine.context import Context, ContextConfig, DecodeListener
from specli.engine.seq import SeqContext
from specli.errors import ContextFull

__all__ = ["LX", "L", "Context", "ContextConfig", "ContextFull", "DecodeListener", "Model", "SeqContext",
           "captured_log", "extra_buffer_types", "libllama", "mtp_available", "supports_gpu_offload",
           "system_info"]
