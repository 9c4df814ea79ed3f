"""The llama.cpp library itself (through llama-cpp-python's ctypes bindings) and one model.

``L`` is llama-cpp-python's binding module, ``LX`` its MTP staging extension (None where this
llama-cpp-python has none). ``Model`` owns the weights and the vocabulary; its :attr:`Model.handle`
is the ``llama_model`` pointer for the few llama.cpp calls specli's drafting heads make themselves.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from specli.errors import SpecliError
from specli.resolve.gguf_header import VocabInfo, read_gguf

try:
    import llama_cpp as L
except ImportError as e:  # pragma: no cover - import guard for a broken install
    raise SpecliError(f"llama-cpp-python is not installed or failed to load: {e}") from None
try:
    from llama_cpp import llama_cpp_ext as LX
except ImportError:  # pragma: no cover - a llama-cpp-python without the MTP staging API
    LX = None

_VOCAB_TYPES = {0: "NONE", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLAMO2"}
_backend_ready = False
_log_cb = None
log_sink: list[str] | None = None  # a list while llama.cpp's log lines are collected (captured_log)


def _init_backend() -> None:
    global _backend_ready, _log_cb
    if _backend_ready:
        return
    if not os.environ.get("SPECLI_LLAMA_LOG"):
        # llama.cpp logs every load detail to stderr; keep stderr for specli's own one-liners
        @L.llama_log_callback
        def _quiet(level, text, user_data):  # noqa: ARG001
            if log_sink is not None and text:
                log_sink.append(text.decode("utf-8", "replace"))

        _log_cb = _quiet
        L.llama_log_set(_log_cb, ctypes.c_void_p(0))
    L.llama_backend_init()
    _backend_ready = True


def ready() -> None:
    """The back end initialised (once), llama.cpp's log kept off stderr: for the few library
    calls made without a model (a derived draft's copy: :mod:`specli.resolve.derive`)."""
    _init_backend()


@contextmanager
def captured_log() -> Iterator[list[str]]:
    """llama.cpp's log lines while inside, collected in the list yielded (tests, doctor); they
    reach stderr instead when SPECLI_LLAMA_LOG is set."""
    global log_sink
    log_sink = lines = []
    try:
        yield lines
    finally:
        log_sink = None


def libllama() -> ctypes.CDLL:
    """The loaded libllama, to bind the functions llama-cpp-python does not (the drafting
    heads' layer inputs: speculate/heads.py). llama-cpp-python keeps its CDLL only as ``llama_cpp.llama_cpp._lib``:
    no public attribute holds it, and loading the library again would repeat its search for
    the file (LLAMA_CPP_LIB_PATH, the package's lib/) and could find another copy."""
    return L.llama_cpp._lib  # noqa: SLF001 - see above: the only handle on the loaded library


def supports_gpu_offload() -> bool:
    return bool(L.llama_supports_gpu_offload())


def mtp_available() -> bool:
    """Does this llama-cpp-python expose what MTP drafting needs?"""
    return LX is not None and all(hasattr(LX, f) for f in (
        "llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith"))


def system_info() -> str:
    return L.llama_print_system_info().decode("utf-8", "replace").strip()


def extra_buffer_types() -> bool:
    """Whether llama.cpp may repack weights into its extra CPU buffer types. Not on a CPU with
    AMX tiles: there llama.cpp repacks quantised weights for AMX, and on hosts whose kernel (or
    sandbox) does not grant the AMX tile state the first decode dies with SIGSEGV.
    SPECLI_EXTRA_BUFTS=1 turns them back on."""
    if os.environ.get("SPECLI_EXTRA_BUFTS") == "1":
        return True
    try:
        with open("/proc/cpuinfo") as f:
            return not any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return True


class Model:
    """Weights and vocabulary of one GGUF model."""

    def __init__(self, path: str, n_gpu_layers: int = 0, vocab_only: bool = False, load_mtp: bool = False):
        _init_backend()
        self.header = read_gguf(path)  # clear errors for missing, non-GGUF and truncated files
        self.path = path
        self.n_gpu_layers = n_gpu_layers
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        mp.vocab_only = vocab_only
        mp.load_mtp = load_mtp
        mp.use_extra_bufts = extra_buffer_types()
        self._model = L.llama_model_load_from_file(path.encode(), mp)
        if not self._model:
            raise SpecliError(f"llama.cpp could not load {path} (architecture '{self.header.architecture}' "
                              "unsupported by this build, or a corrupt file)")
        self.vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.bos = int(L.llama_vocab_bos(self.vocab))
        self.eos = int(L.llama_vocab_eos(self.vocab))
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(self._model))
        self.recurrent = bool(L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model))
        self.n_embd = int(L.llama_model_n_embd(self._model))
        # MTP (NextN) layers loaded with the model: self-speculation needs them
        self.n_mtp_layers = int(L.llama_model_n_layer_nextn(self._model)) if load_mtp else 0
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._eog: dict[int, bool] = {}  # asked token by token (a 262k vocabulary takes 0.1 s to list)

    @property
    def handle(self):
        """The ``llama_model`` pointer (None once closed), for llama.cpp calls the engine does
        not wrap; valid while this object lives and is not closed."""
        return self._model

    @property
    def name(self) -> str:
        return str(self.header.get("general.name") or os.path.basename(self.path))

    def close(self) -> None:
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- vocabulary ---------------------------------------------------------------------
    def vocab_info(self) -> VocabInfo:
        texts = tuple((L.llama_vocab_get_text(self.vocab, i) or b"").decode("utf-8", "replace")
                      for i in range(self.n_vocab))
        return VocabInfo(
            vocab_type=_VOCAB_TYPES.get(int(L.llama_vocab_type(self.vocab)), "?"),
            n_tokens=self.n_vocab, bos=self.bos, eos=self.eos,
            add_bos=self.add_bos, add_eos=bool(L.llama_vocab_get_add_eos(self.vocab)), tokens=texts)

    def is_eog(self, token: int) -> bool:
        got = self._eog.get(token)
        if got is None:
            if not 0 <= token < self.n_vocab:
                raise IndexError(f"token {token} outside the vocabulary (0..{self.n_vocab - 1})")
            got = self._eog[token] = bool(L.llama_vocab_is_eog(self.vocab, int(token)))
        return got

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (L.llama_token * n_max)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        key = (token, special)
        got = self._pieces.get(key)
        if got is None:  # a buffer per call: requests of a batch detokenize on their own threads
            buf = ctypes.create_string_buffer(256)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            got = self._pieces[key] = buf.raw[:n]
        return got

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        t = self.header.get("tokenizer.chat_template")
        return str(t) if t else None
