"""What the models already on disk are, read from their GGUF headers only (no weights), and what
they can do together: the rows of ``specli models``, the pairs of ``specli pairs``, the draft
``--draft auto`` finds on disk, and the profile whose pinned target a local file is.

A file seen through two stores (a hard link, a symlink) is read once and listed under each
name, the later ones marked as the same file. Drafting compatibility is llama.cpp's own rule
(:mod:`specli.resolve.vocab`), the same check as ``specli check``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from specli.errors import SpecliError
from specli.resolve import integrity, stores, vocab
from specli.resolve.gguf_header import (
    HEAD_NAMES,
    LLAMA_ARCHITECTURES,
    MTP_ARCHITECTURES,
    GGUFHeader,
    VocabInfo,
    head_fit,
    head_not_driven,
    read_gguf,
    unloadable,
    vocab_from_header,
)
from specli.util import cache_root

# `--draft auto` takes a draft on disk with at least this many times fewer parameters than the
# target (the default profile's Qwen2.5-Coder 1.5B / 0.5B: 2.8x, counted from their GGUF tensors), preferring
# the one nearest IDEAL_RATIO
MIN_DRAFT_RATIO = 2.5
IDEAL_RATIO = 10.0


@dataclass(frozen=True)
class Summary:
    """What ``specli models`` shows of a GGUF, from its header."""

    architecture: str
    params: int
    quant: str
    context: int
    mtp_layers: int
    mtp_usable: bool
    family: str  # general.basename ("" when the header has none)
    tokenizer: str  # fingerprint: vocabulary type and a hash of what llama.cpp compares
    vocab: VocabInfo  # without the token texts: llama.cpp's other rules, checked without reading them
    head: str = ""  # a drafting head's kind (gguf_header.HEAD_NAMES): not a model of its own

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Summary:
        return cls(**{**d, "vocab": VocabInfo(**{**d["vocab"], "tokens": ()})})


_VOCABS: dict[str, VocabInfo] = {}  # fingerprint -> vocabulary with its texts, one per tokenizer read


def fingerprint(v: VocabInfo) -> str:
    """Equal for two models whose tokenizers llama.cpp finds identical (same type, special
    tokens, token texts); ``specli pairs`` applies the full rule, which also lets the vocabulary
    sizes differ by up to 128."""
    h = hashlib.sha256(repr((v.vocab_type, v.bos, v.eos, v.add_bos, v.add_eos)).encode())
    h.update("\0".join(v.tokens).encode("utf-8", "surrogatepass"))
    return f"{v.vocab_type.lower()}-{h.hexdigest()[:10]}"


def quantisation(h: GGUFHeader) -> str:
    """The file type the header records (Q4_K_M), else the commonest tensor type by elements."""
    ft = h.get("general.file_type")
    if ft is not None:
        from gguf.constants import LlamaFileType
        try:
            return LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    count: dict[str, int] = {}
    for t in h.tensors:
        if len(t.shape) >= 2:
            count[t.type_name] = count.get(t.type_name, 0) + math.prod(t.shape)
    return max(count, key=count.get) if count else "?"


def summarise(h: GGUFHeader) -> Summary:
    v = vocab_from_header(h)
    fp = fingerprint(v)
    _VOCABS.setdefault(fp, v)
    return Summary(h.architecture, h.n_params, quantisation(h), int(h.arch_key("context_length", 0) or 0),
                   h.mtp_layers, h.mtp_usable, str(h.get("general.basename", "") or ""), fp,
                   dataclasses.replace(v, tokens=()), h.head_kind or "")


def same_model(a: Summary, b: Summary) -> bool:
    """Two files of one model (another quant, say): the same architecture, size, tokenizer and family."""
    return (a.architecture, a.params, a.tokenizer, a.family) == (b.architecture, b.params, b.tokenizer, b.family)


def other_files(h: GGUFHeader, exclude: Iterable[str] = (), models: list[LocalModel] | None = None
                ) -> list[LocalModel]:
    """The same model's other usable files in the local stores (``models``: a scan already
    made), each file once, none of the paths in ``exclude``."""
    mine = summarise(h)
    seen = {os.path.realpath(p) for p in exclude}
    out = []
    for m in scan() if models is None else models:
        if not m.ok or m.same_as or not m.summary or not m.path or os.path.realpath(m.path) in seen:
            continue
        if same_model(mine, m.summary):
            seen.add(os.path.realpath(m.path))
            out.append(m)
    return out


# what a remembered summary was judged against (usable MTP, loadable): another llama.cpp, read again
# (and summaries without the head kind)
_TABLES = hashlib.sha256(repr((sorted(MTP_ARCHITECTURES), sorted(LLAMA_ARCHITECTURES), "heads")).encode()
                         ).hexdigest()[:12]


def _headers_db() -> Path:
    """Summaries of the headers read before, by file version: a scan reads only new files."""
    return cache_root() / "headers.json"


@dataclass(frozen=True)
class LocalModel:
    found: stores.Found
    summary: Summary | None = None
    size: int = 0  # bytes on disk (every part of a split file)
    note: str = ""  # why it cannot be used (skipped), "" when it can
    same_as: stores.Found | None = None  # the same file, listed first under another name

    @property
    def ok(self) -> bool:
        return self.summary is not None and not self.note

    @property
    def path(self) -> str | None:
        return self.found.path

    def row(self) -> dict:
        s = self.summary
        return {"store": self.found.store, "name": self.found.name, "ref": self.found.ref, "path": self.path,
                "architecture": s.architecture if s else None, "parameters": s.params if s else None,
                "quantisation": s.quant if s else None, "size": self.size or None,
                "context_length": s.context if s else None, "mtp_layers": s.mtp_layers if s else None,
                "mtp_usable": s.mtp_usable if s else None, "family": (s.family or None) if s else None,
                "tokenizer": s.tokenizer if s else None,
                "same_file_as": f"{self.same_as.store}:{self.same_as.name}" if self.same_as else None,
                "skipped": self.note or None}


_SPLIT = re.compile(r"-00001-of-(\d{5})\.gguf$", re.IGNORECASE)


def disk_size(path: str) -> int:
    """Bytes of a GGUF on disk, with the other parts of a split file."""
    m = _SPLIT.search(path)
    if not m:
        return os.path.getsize(path)
    n = int(m.group(1))
    return sum(os.path.getsize(_SPLIT.sub(f"-{i:05d}-of-{n:05d}.gguf", path)) for i in range(1, n + 1)
               if os.path.exists(_SPLIT.sub(f"-{i:05d}-of-{n:05d}.gguf", path)))


def _read(f: stores.Found, size: int, known: dict, new: dict) -> LocalModel:
    """The model's summary: remembered (``known``) or read from its header (then added to ``new``)."""
    key = integrity.file_key(f.path)
    if isinstance(known.get(key), dict) and known[key].get("tables") == _TABLES:
        try:
            return LocalModel(f, Summary.from_json(known[key]["summary"]), size, known[key]["note"])
        except (KeyError, TypeError):
            pass  # written by another version of specli: read the header again
    try:
        h = read_gguf(f.path)
    except SpecliError as e:
        return LocalModel(f, None, size, str(e).removeprefix(f"{f.path}: "))
    m = LocalModel(f, summarise(h), size, unloadable(h) or "")
    new[key] = {"summary": m.summary.to_json(), "note": m.note, "tables": _TABLES}
    return m


def scan(found: list[stores.Found] | None = None, max_size: int | None = None) -> list[LocalModel]:
    """Every model the stores hold, read from its header once per file (``max_size``: only
    files smaller than that many bytes are read; the others are left out)."""
    found = stores.discover() if found is None else found
    first: dict[tuple[int, int], LocalModel] = {}
    known, new = integrity.load_db(_headers_db()), {}
    out = []
    for f in found:
        if not f.ok:
            out.append(LocalModel(f, note=f.note))
            continue
        try:
            st = os.stat(f.path)
            size = disk_size(f.path)
        except OSError as e:
            out.append(LocalModel(f, note=f"cannot read it ({e.strerror or e})"))
            continue
        if max_size is not None and size >= max_size:
            continue
        key = (st.st_dev, st.st_ino)
        if key in first:
            m = first[key]
            out.append(LocalModel(f, m.summary, size, m.note, same_as=m.found))
            continue
        first[key] = _read(f, size, known, new)
        out.append(first[key])
    if new:
        integrity.store_db(_headers_db(), new)
    return out


# -- pairs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pairing:
    draft: LocalModel
    ratio: float  # target parameters / draft parameters
    same_family: bool


def _texts(s: Summary, path: str | None) -> VocabInfo:
    """The vocabulary with its token texts (read from the file's header the first time)."""
    if s.tokenizer not in _VOCABS:
        _VOCABS[s.tokenizer] = vocab_from_header(read_gguf(path))
    return _VOCABS[s.tokenizer]


def compatible(t: Summary, t_path: str | None, d: Summary, d_path: str | None) -> bool:
    """llama.cpp's tokenizer rules (vocab.check_vocab) between two summarised models: the same
    fingerprint passes, the rules other than the token texts are checked from the summaries, and
    only pairs that pass them have their token texts read and compared."""
    if t.tokenizer == d.tokenizer:
        return True
    if vocab.mismatch_message(vocab.check_vocab(t.vocab, d.vocab)) is not None:
        return False
    try:
        return vocab.mismatch_message(vocab.check_vocab(_texts(t, t_path), _texts(d, d_path))) is None
    except SpecliError:  # the file changed or went away since it was listed
        return False


def drafts_for(target: Summary, target_path: str | None, models: list[LocalModel]) -> list[Pairing]:
    """The local models that can draft for this target: usable, another file, fewer parameters,
    a tokenizer llama.cpp accepts, not a drafting head (:func:`heads_for`); one entry per file,
    most suitable first (same family, then the size ratio nearest IDEAL_RATIO)."""
    same = _file_key(target_path)
    out = []
    for m in models:
        s = m.summary
        if (not m.ok or m.same_as or s.head or s.params <= 0 or s.params >= target.params
                or _file_key(m.path) == same):
            continue
        if compatible(target, target_path, s, m.path):
            out.append(Pairing(m, target.params / s.params, bool(target.family) and
                               target.family.lower() == s.family.lower()))
    return sorted(out, key=lambda p: (not p.same_family, abs(math.log(p.ratio / IDEAL_RATIO)), p.draft.found.name))


@dataclass(frozen=True)
class HeadFit:
    """A drafting head on disk with a target's tokenizer, and what it is to that target."""

    head: LocalModel
    kind: str  # gguf_header.HEAD_NAMES's key: mtp-only, eagle3, dflash, dspark
    problems: tuple[str, ...]  # the rules it fails ("rule: detail"): built for another target
    not_driven: str | None  # why specli does not draft with it (gguf_header.head_not_driven)

    @property
    def usable(self) -> bool:
        return not self.problems and not self.not_driven


def heads_of(th: GGUFHeader | Callable[[], GGUFHeader], target_path: str | None,
             models: list[LocalModel]) -> list[HeadFit]:
    """Every drafting head on disk (MTP-only, EAGLE-3, DFlash, ...) with this target's tokenizer,
    checked against it by llama.cpp's rules from the headers (gguf_header.head_fit). ``th``: the
    target's header, or what reads it (read only when a head has its tokenizer)."""
    out = []
    target = None
    for m in models:
        s = m.summary
        if not m.ok or m.same_as or not s.head or _file_key(m.path) == _file_key(target_path):
            continue
        if target is None:
            th = th() if callable(th) else th
            target = summarise(th)
        if not compatible(target, target_path, s, m.path):
            continue
        try:
            hh = read_gguf(m.path)
        except SpecliError:  # the file changed or went away since it was listed
            continue
        bad = tuple(f"{rule}: {detail}" for ok, rule, detail in head_fit(th, hh) if not ok)
        out.append(HeadFit(m, s.head, bad, head_not_driven(hh)))
    return out


def heads_for(th: GGUFHeader, target_path: str | None, models: list[LocalModel],
              note: Callable[[str], None]) -> list[LocalModel]:
    """The drafting heads on disk that specli drafts with (MTP-only, EAGLE-3, DFlash) and that fit
    this target (:func:`heads_of`). A head of this tokenizer built for another target is left out
    with a note."""
    out = []
    for h in heads_of(th, target_path, models):
        if h.problems and not h.not_driven:
            note(f"--draft auto: skipped {h.head.path}: {HEAD_NAMES[h.kind]} built for another target "
                 f"({'; '.join(h.problems)})")
        elif h.usable:
            out.append(h.head)
    return out


def auto_pick(p: Pairing) -> bool:
    """Small enough for ``--draft auto`` to take it."""
    return p.ratio >= MIN_DRAFT_RATIO


def _file_key(path: str | None) -> tuple[int, int] | None:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st else None


def pairs(models: list[LocalModel]) -> list[tuple[LocalModel, list[Pairing], list[HeadFit]]]:
    """Each usable model (not a head) with the local models that can draft for it and the drafting
    heads of its tokenizer (targets with none of these and no MTP layers of their own left out)."""
    out = []
    heads = [m for m in models if m.ok and m.summary.head]
    for t in models:
        if t.ok and not t.same_as and not t.summary.head:
            found = drafts_for(t.summary, t.path, models)
            fits = heads_of(lambda t=t: read_gguf(t.path), t.path, heads) if heads else []
            if found or fits or t.summary.mtp_usable:
                out.append((t, found, fits))
    return out
