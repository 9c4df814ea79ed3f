"""The models users already have: Ollama, LM Studio, the Hugging Face and llama.cpp caches,
specli's cache and their own folders, laid out in a temporary HOME the way each tool writes them
(hard links to the tiny test models, no copies); ``ollama:`` / ``lmstudio:`` references,
``specli models``, ``specli pairs``, ``--draft auto`` choosing a draft on disk with no network,
and every bad input as a skipped entry or one line."""

import errno
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from clihelp import specli
from conftest import DRAFT_KW, TARGET_KW, TEST_CACHE
from storehelp import clean_env, hf_cached, isolate_home, link, ollama_manifest, ollama_model, snapshot
from tinymodels import tiny_model

from specli.errors import SpecliError
from specli.resolve import local, models, stores
from specli.resolve.gguf_header import read_gguf
from specli.resolve.integrity import sha256_of

BIG_KW = dict(TARGET_KW, d=256, ff=512, metadata={"general.basename": "Tiny"})  # ~4x the tiny draft's parameters
FAMILY_DRAFT_KW = dict(DRAFT_KW, metadata={"general.basename": "Tiny"})
LMS_DRAFT = "tiny-org/Tiny-0.1B-GGUF/tiny-0.1b-q4_k_m.gguf"


@pytest.fixture(scope="module")
def big_target(smol_gguf) -> str:
    return str(tiny_model(TEST_CACHE, smol_gguf, **BIG_KW))


@pytest.fixture(scope="module")
def family_draft(smol_gguf) -> str:
    return str(tiny_model(TEST_CACHE, smol_gguf, **FAMILY_DRAFT_KW))


@pytest.fixture(scope="module")
def not_llama(tmp_path_factory) -> str:
    """A well-formed GGUF of an architecture llama.cpp does not know."""
    import gguf
    import numpy as np
    p = tmp_path_factory.mktemp("arch") / "alien.gguf"
    w = gguf.GGUFWriter(str(p), "alien-arch")
    w.add_tensor("weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(p)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh HOME with no store variables, the Hub offline (in this process and the CLI's)."""
    h = tmp_path / "home"
    h.mkdir()
    isolate_home(monkeypatch, h)
    return h


def env_of(home: Path, **extra) -> dict:
    return clean_env(home, SPECLI_CONFIG_DIR=home / ".config" / "specli", **extra)


def one_line(rc, err) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- names ---------------------------------------------------------------------------------------

def test_ollama_names_as_ollama_writes_them():
    p = stores.parse_ollama_name
    assert p("qwen2.5-coder:7b") == ("registry.ollama.ai", "library", "qwen2.5-coder", "7b")
    assert p("qwen2.5-coder") == ("registry.ollama.ai", "library", "qwen2.5-coder", "latest")
    assert p("Qwen2.5-Coder:7B") == p("qwen2.5-coder:7b")  # Ollama matches names without case
    assert p("user/model:tag") == ("registry.ollama.ai", "user", "model", "tag")
    assert p("hf.co/bartowski/Qwen-GGUF:Q4_K_M") == ("hf.co", "bartowski", "qwen-gguf", "q4_k_m")
    assert p("localhost:5000/ns/model") == ("localhost:5000", "ns", "model", "latest")
    for bad in ("a/b/c/d", "model:", "/model"):
        with pytest.raises(SpecliError, match="not an Ollama model name"):
            p(bad)
    n = stores.ollama_name
    assert n("registry.ollama.ai", "library", "qwen2.5-coder", "7b") == "qwen2.5-coder:7b"
    assert n("registry.ollama.ai", "user", "m", "latest") == "user/m:latest"
    assert n("hf.co", "bartowski", "Qwen-GGUF", "Q4_K_M") == "hf.co/bartowski/Qwen-GGUF:Q4_K_M"


# -- discovery -----------------------------------------------------------------------------------

def test_every_store_as_its_tool_writes_it(home, tmp_path, monkeypatch, tiny_target, tiny_draft, big_target,
                                           family_draft, tiny_draft_edited):
    oll = home / ".ollama" / "models"
    ollama_model(oll, "tiny-big:latest", big_target)
    ollama_model(oll, "someone/tiny-draft:q4", tiny_draft, old_blob_name=True)  # an older install's blob name
    ollama_model(oll, "hf.co/tiny-org/Tiny-GGUF:Q8_0", tiny_target)
    lms = home / ".lmstudio" / "models"
    link(family_draft, lms / LMS_DRAFT)
    link(family_draft, lms / "tiny-org" / "Tiny-0.1B-GGUF" / "mmproj-tiny-f16.gguf")  # a projector: not a model
    link(tiny_draft, lms / "loose.gguf")  # LM Studio itself ignores files outside publisher/repo/
    link(tiny_draft_edited, home / ".cache" / "lm-studio" / "models" / "old" / "Edited-GGUF" / "edited.gguf")
    hf = home / ".cache" / "huggingface" / "hub"
    hf_cached(hf, "tiny-org/Tiny-Target-GGUF", "tiny-target-q8_0.gguf", tiny_target)
    hf_cached(hf, "tiny-org/Tiny-Target-GGUF", "README.md", __file__)
    link(tiny_draft, home / ".cache" / "llama.cpp" / "tiny-org_Tiny-GGUF_tiny-q4_0.gguf")
    mine = tmp_path / "my-models"
    link(tiny_target, mine / "deep" / "er" / "mine.gguf")
    conf = tmp_path / "more-models"
    link(tiny_draft, conf / "x.gguf")
    (home / ".config" / "specli").mkdir(parents=True)
    (home / ".config" / "specli" / "config.yaml").write_text(f"model_dirs:\n  - {conf}\n")
    monkeypatch.setenv("SPECLI_MODEL_DIRS", f"{mine}{os.pathsep}{tmp_path / 'absent'}")
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path / "specli-cache"))
    link(tiny_draft, tmp_path / "specli-cache" / "models" / "0123456789ab-tiny.gguf")

    found = {(f.store, f.name): f for f in stores.discover() if f.store != "ollama" or str(oll) in f.root}
    assert set(found) == {
        ("ollama", "tiny-big:latest"), ("ollama", "someone/tiny-draft:q4"), ("ollama", "hf.co/tiny-org/Tiny-GGUF:Q8_0"),
        ("lmstudio", LMS_DRAFT), ("lmstudio", "old/Edited-GGUF/edited.gguf"),
        ("hf", "tiny-org/Tiny-Target-GGUF/tiny-target-q8_0.gguf"),
        ("llama.cpp", "tiny-org_Tiny-GGUF_tiny-q4_0.gguf"), ("specli", "0123456789ab-tiny.gguf"),
        ("folder", str(mine / "deep" / "er" / "mine.gguf")), ("folder", str(conf / "x.gguf")),
        ("folder", str(tmp_path / "absent"))}
    assert found[("folder", str(tmp_path / "absent"))].note.startswith("cannot read it (No such file")
    assert all(f.ok for k, f in found.items() if k[0] != "folder" or "absent" not in k[1])
    big = found[("ollama", "tiny-big:latest")]
    assert big.path == str(oll / "blobs" / f"sha256-{sha256_of(big_target)}") and big.ref == "ollama:tiny-big:latest"
    assert found[("ollama", "someone/tiny-draft:q4")].path.endswith(f"sha256:{sha256_of(tiny_draft)}")
    assert found[("lmstudio", LMS_DRAFT)].ref == f"lmstudio:{LMS_DRAFT}"
    assert Path(found[("hf", "tiny-org/Tiny-Target-GGUF/tiny-target-q8_0.gguf")].path).is_symlink()

    # the rows of specli models, from the headers
    rows = {(m.found.store, m.found.name): m for m in local.scan()}
    b = rows[("ollama", "tiny-big:latest")]
    assert b.ok and b.summary.architecture == "llama" and b.summary.quant == "F32"
    assert b.summary.family == "Tiny" and b.summary.context == 4096 and b.size == os.path.getsize(big_target)
    same_tok = {m.summary.tokenizer for k, m in rows.items() if m.summary and k[1] != "old/Edited-GGUF/edited.gguf"}
    assert len(same_tok) == 1  # one SmolLM2 tokenizer; the edited vocabulary has another fingerprint
    assert rows[("lmstudio", "old/Edited-GGUF/edited.gguf")].summary.tokenizer not in same_tok


def test_llama_cpp_cache_with_llama_cache_set_holds_both_layouts(home, tmp_path, monkeypatch, tiny_target,
                                                                  tiny_draft):
    """With LLAMA_CACHE set, llama.cpp writes -hf downloads there in the Hugging Face layout
    (common/hf-cache.cpp) and -mu downloads as flat files (common/common.cpp)."""
    lc = tmp_path / "llama-cache"
    monkeypatch.setenv("LLAMA_CACHE", str(lc))
    link(tiny_draft, lc / "model.gguf")
    hf_cached(lc, "org/Repo-GGUF", "repo-q4_k_m.gguf", tiny_target)
    names = {f.name for f in stores.discover("llama.cpp")}
    assert names == {"model.gguf", "org/Repo-GGUF/repo-q4_k_m.gguf"}


def test_same_file_in_two_stores_is_read_once_and_listed_under_both_names(home, tiny_target):
    oll = home / ".ollama" / "models"
    blob = ollama_model(oll, "tiny:latest", tiny_target)
    link(blob, home / ".lmstudio" / "models" / "me" / "Tiny-GGUF" / "tiny.gguf")
    rows = [m for m in local.scan() if m.found.store in ("ollama", "lmstudio")]
    assert [(m.found.store, m.found.name) for m in rows] == [("ollama", "tiny:latest"),
                                                             ("lmstudio", "me/Tiny-GGUF/tiny.gguf")]
    assert rows[0].same_as is None and rows[1].same_as == rows[0].found and rows[1].summary == rows[0].summary
    assert local.pairs(rows) == []  # a file is no draft for itself


def test_a_second_scan_reads_no_header(home, big_target, tiny_draft, tiny_draft_edited, monkeypatch):
    """Summaries are remembered by file version in specli's cache; token texts are read only for
    tokenizers that pass llama.cpp's other rules and still differ."""
    oll = home / ".ollama" / "models"
    ollama_model(oll, "big:latest", big_target)
    ollama_model(oll, "draft:latest", tiny_draft)
    ollama_model(oll, "edited:latest", tiny_draft_edited)
    first = local.scan()
    assert (home / ".cache" / "specli" / "headers.json").exists()
    monkeypatch.setattr(local, "read_gguf", lambda p: pytest.fail(f"read the header of {p} again"))
    monkeypatch.setattr(local, "_VOCABS", {})
    again = local.scan()
    assert [(m.found, m.summary, m.note) for m in again] == [(m.found, m.summary, m.note) for m in first]
    # the edited vocabulary passes every rule but the token texts: only its and the target's are read
    read = []
    monkeypatch.setattr(local, "read_gguf", lambda p: read.append(p) or read_gguf(p))
    big = next(m for m in again if m.found.name == "big:latest")
    assert [p.draft.found.name for p in local.drafts_for(big.summary, big.path, again)] == ["draft:latest"]
    assert sorted(read) == sorted([big.path, next(m.path for m in again if m.found.name == "edited:latest")])


# -- references ----------------------------------------------------------------------------------

def test_references_resolve_in_place(home, tiny_target, tiny_draft, family_draft):
    oll = home / ".ollama" / "models"
    blob = ollama_model(oll, "tiny:latest", tiny_target)
    ollama_model(oll, "tiny:draft", tiny_draft)
    lms = home / ".lmstudio" / "models"
    link(family_draft, lms / LMS_DRAFT)
    link(tiny_draft, lms / "two" / "Files-GGUF" / "a-q4_0.gguf")
    link(tiny_draft, lms / "two" / "Files-GGUF" / "a-q8_0.gguf")
    before = snapshot(oll, lms)
    assert models.resolve("ollama:tiny") == str(blob) == models.resolve("ollama:library/tiny:latest")
    assert models.resolve("ollama:registry.ollama.ai/library/TINY:latest") == str(blob)
    assert models.header_of("ollama:tiny:draft").n_params > 0
    assert models.resolve(f"lmstudio:{LMS_DRAFT}") == str(lms / LMS_DRAFT)
    assert models.resolve("lmstudio:tiny-org/Tiny-0.1B-GGUF") == str(lms / LMS_DRAFT)  # its only GGUF
    with pytest.raises(SpecliError, match=r"lmstudio:two/Files-GGUF: 2 GGUF files there; name one: "
                                          r"lmstudio:two/Files-GGUF/a-q4_0.gguf, lmstudio:two/Files-GGUF/a-q8_0.gguf"):
        models.resolve("lmstudio:two/Files-GGUF")
    # an unknown name: what exists, nearest first
    with pytest.raises(SpecliError) as e:
        models.resolve("ollama:tiny:draf")
    assert str(e.value) == "ollama:tiny:draf: no such Ollama model; it has: tiny:draft, tiny:latest"
    with pytest.raises(SpecliError, match=r"^lmstudio:tiny-org/Tiny-GGUF: no such LM Studio model; it has: "
                                          r"tiny-org/Tiny-0.1B-GGUF/tiny-0.1b-q4_k_m.gguf, two/"):
        models.resolve("lmstudio:tiny-org/Tiny-GGUF")
    with pytest.raises(SpecliError, match=r"^'ollama:' names no model: write ollama:NAME\[:TAG\]$"):
        models.resolve("ollama:")
    assert snapshot(oll, lms) == before


def test_no_store_at_all_says_where_it_looked(home):
    with pytest.raises(SpecliError) as e:
        models.resolve("ollama:qwen2.5-coder:7b")
    assert str(e.value).startswith(f"ollama:qwen2.5-coder:7b: no Ollama models found (searched {home}/.ollama/models")


# -- bad input and faults ------------------------------------------------------------------------

@pytest.fixture
def broken(home, tmp_path, tiny_target, tiny_draft, not_llama):
    """One store of each kind holding every fault the issue lists, beside good models."""
    oll = home / ".ollama" / "models"
    ollama_model(oll, "good:latest", tiny_target)
    bad = oll / "manifests" / "registry.ollama.ai" / "library"
    (bad / "notjson").mkdir(parents=True)
    (bad / "notjson" / "latest").write_text("{not json")
    missing = "ab" * 32
    ollama_manifest(oll, "registry.ollama.ai", "library", "missing", "latest",
                    [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{missing}", "size": 1}])
    junk = oll / "blobs" / ("sha256-" + "cd" * 32)
    junk.write_bytes(b"\x00\x01safetensors, not GGUF" * 4)
    ollama_manifest(oll, "registry.ollama.ai", "library", "notgguf", "latest",
                    [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "cd" * 32, "size": 80}])
    ollama_model(oll, "alien:latest", not_llama)
    ollama_manifest(oll, "registry.ollama.ai", "library", "adapteronly", "latest",
                    [{"mediaType": "application/vnd.ollama.image.adapter", "digest": "sha256:" + "ef" * 32}])
    lms = home / ".lmstudio" / "models"
    link(tiny_draft, lms / "pub" / "Draft-GGUF" / "draft.gguf")
    os.symlink("loop.gguf", lms / "pub" / "Draft-GGUF" / "loop.gguf")  # a link to itself
    blob = oll / "blobs" / f"sha256-{sha256_of(tiny_target)}"
    link(blob, lms / "pub" / "Same-GGUF" / "same.gguf")  # the Ollama blob, also in LM Studio
    legacy = home / ".cache" / "lm-studio"
    legacy.mkdir(parents=True)
    os.symlink("models", legacy / "models")  # the store folder itself is a symlink loop
    mine = tmp_path / "mine"
    link(tiny_draft, mine / "a" / "m.gguf")
    os.symlink("..", mine / "a" / "up")  # a folder link back up the tree
    return {"home": home, "ollama": oll, "lmstudio": lms, "mine": mine}


def test_every_fault_is_a_skipped_entry_with_a_note(broken, monkeypatch):
    monkeypatch.setenv("SPECLI_MODEL_DIRS", str(broken["mine"]))
    before = snapshot(broken["ollama"], broken["lmstudio"], broken["mine"])
    rows = {(m.found.store, m.found.name): m for m in local.scan()}
    notes = {k: m.note for k, m in rows.items() if m.note}
    blobs = broken["ollama"] / "blobs"
    assert notes[("ollama", "notjson:latest")] == "its manifest is not JSON"
    assert notes[("ollama", "missing:latest")] == f"its blob sha256-{'ab' * 6}… is missing from {blobs}"
    assert notes[("ollama", "notgguf:latest")].startswith("not a GGUF file (starts with b'\\x00\\x01sa'")
    assert notes[("ollama", "alien:latest")] == "architecture 'alien-arch' is not one this llama.cpp can load"
    assert notes[("ollama", "adapteronly:latest")].startswith("no GGUF weights layer")
    assert notes[("lmstudio", "pub/Draft-GGUF/loop.gguf")] == "cannot read it (symlink loop)"
    legacy = str(broken["home"] / ".cache" / "lm-studio" / "models")
    assert notes[("lmstudio", legacy)] == "cannot read it (symlink loop)"
    up = str(broken["mine"] / "a" / "up")
    assert notes[("folder", up)] == f"symlink loop ({up} -> ..): not followed"
    assert rows[("ollama", "good:latest")].ok and rows[("lmstudio", "pub/Draft-GGUF/draft.gguf")].ok
    same = rows[("lmstudio", "pub/Same-GGUF/same.gguf")]
    assert same.same_as == rows[("ollama", "good:latest")].found and same.ok
    assert rows[("folder", str(broken["mine"] / "a" / "m.gguf"))].ok
    assert snapshot(broken["ollama"], broken["lmstudio"], broken["mine"]) == before  # nothing written or moved


def test_an_unreadable_store_is_skipped(home, monkeypatch, tiny_target):
    """Tests run as root, which reads anything: the permission error is raised where the store is read."""
    oll = home / ".ollama" / "models"
    ollama_model(oll, "good:latest", tiny_target)
    lms = home / ".lmstudio" / "models"
    link(tiny_target, lms / "pub" / "Repo-GGUF" / "m.gguf")
    real = os.scandir

    def scandir(path="."):
        if str(path) in (str(oll / "manifests" / "registry.ollama.ai"), str(lms)):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    found = {(f.store, f.name): f for f in stores.discover() if str(home) in f.root}
    assert found == {
        ("ollama", str(oll / "manifests" / "registry.ollama.ai")): stores.Found(
            "ollama", str(oll / "manifests" / "registry.ollama.ai"), None, str(oll / "manifests"),
            "cannot read it (Permission denied)"),
        ("lmstudio", str(lms)): stores.Found("lmstudio", str(lms), None, str(lms),
                                             "cannot read it (Permission denied)")}


def test_bad_config_file_is_one_line(home):
    cfg = home / ".config" / "specli" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("model_dirs: [a\n")
    with pytest.raises(SpecliError, match=r"config.yaml:2: invalid YAML"):
        stores.discover()
    cfg.write_text("model_dir: [a]\n")
    with pytest.raises(SpecliError, match=r"config.yaml: expected 'model_dirs:' with a list of folders"):
        stores.discover()


def test_cli_models_lists_faults_and_refuses_bad_references_in_one_line(broken):
    env = env_of(broken["home"], SPECLI_MODEL_DIRS=broken["mine"])
    before = snapshot(broken["ollama"], broken["lmstudio"], broken["mine"])
    rc, out, err = specli("models", "--json", env=env)
    assert rc == 0 and "Traceback" not in err, err
    rows = {(r["store"], r["name"]): r for r in json.loads(out)}
    assert rows[("ollama", "notjson:latest")]["skipped"] == "its manifest is not JSON"
    assert rows[("ollama", "good:latest")]["skipped"] is None and rows[("ollama", "good:latest")]["parameters"] > 0
    assert rows[("lmstudio", "pub/Same-GGUF/same.gguf")]["same_file_as"] == "ollama:good:latest"
    rc, out, err = specli("models", env=env)
    assert rc == 0 and "Traceback" not in err, err
    for text in ("good:latest", "notjson:latest", "skipped: its manifest is not JSON", "symlink loop",
                 "same file as ollama:good:latest", "pub/Draft-GGUF/draft.gguf", "searched: Ollama"):
        assert text in out, (text, out)
    run = ("run", "--draft", "none", "--raw", "-n", "4", "--prompt", "hi", "--target")
    blobs = broken["ollama"] / "blobs"
    cases = {
        "ollama:notjson": "specli: error: ollama:notjson: its manifest is not JSON",
        "ollama:missing": f"specli: error: ollama:missing: its blob sha256-{'ab' * 6}… is missing from {blobs}",
        "ollama:notgguf": f"specli: error: ollama:notgguf ({blobs}/sha256-{'cd' * 32}): not a GGUF file "
                          "(starts with b'\\x00\\x01sa', expected b'GGUF')",
        "ollama:alien": "architecture 'alien-arch' is not one this llama.cpp can load",
        "ollama:goood": "specli: error: ollama:goood: no such Ollama model; it has: good:latest, ",
        "lmstudio:pub/Draft-GGUF/loop.gguf": "specli: error: lmstudio:pub/Draft-GGUF/loop.gguf: cannot read it "
                                             "(symlink loop)",
    }
    for ref, want in cases.items():
        line = one_line(*specli(*run, ref, env=env)[::2])
        assert line.startswith(want) or want in line, (ref, line)
    assert snapshot(broken["ollama"], broken["lmstudio"], broken["mine"]) == before


# -- pairs and --draft auto ----------------------------------------------------------------------

@pytest.fixture
def pair_home(home, big_target, tiny_draft, family_draft, tiny_draft_edited):
    """A 4x bigger target in Ollama; a same-family draft in LM Studio, another draft (no family in
    its header) and one with an edited vocabulary in Ollama."""
    oll = home / ".ollama" / "models"
    ollama_model(oll, "tiny-big:latest", big_target)
    ollama_model(oll, "tiny-draft:latest", tiny_draft)
    ollama_model(oll, "tiny-edited:latest", tiny_draft_edited)
    link(family_draft, home / ".lmstudio" / "models" / LMS_DRAFT)
    return home


def test_pairs_by_llama_cpp_rules(pair_home):
    found = local.scan()
    by_name = {t.found.name: [p.draft.found.name for p in d] for t, d, _ in local.pairs(found)}
    assert by_name == {"tiny-big:latest": [LMS_DRAFT, "tiny-draft:latest"]}  # same family first; edited: no
    ((_, drafts, _),) = local.pairs(found)
    assert drafts[0].same_family and not drafts[1].same_family and 3.5 < drafts[0].ratio < 5
    rc, out, err = specli("pairs", "--json", env=env_of(pair_home))
    assert rc == 0, err
    (p,) = json.loads(out)
    assert p["ref"] == "ollama:tiny-big:latest" and p["mtp_usable"] is False
    assert [(d["ref"], d["auto"]) for d in p["drafts"]] == [(f"lmstudio:{LMS_DRAFT}", True),
                                                           ("ollama:tiny-draft:latest", False)]
    rc, out, err = specli("pairs", "ollama:tiny-big", env=env_of(pair_home))
    assert rc == 0 and f"lmstudio:{LMS_DRAFT}" in out and "ollama:tiny-draft:latest" in out, err
    assert "tiny-edited" not in out
    rc, out, err = specli("pairs", "ollama:tiny-draft", env=env_of(pair_home))
    assert rc == 0 and "none on disk (4 usable models)" in out, out


def run_json(env, *args) -> tuple[dict, str]:
    rc, out, err = specli("run", "--raw", "-n", "24", "--json", "--prompt", "Once upon a time", *args, env=env)
    assert rc == 0, err
    return json.loads(out), err


def test_draft_auto_takes_a_compatible_draft_found_on_disk(pair_home, big_target, family_draft):
    env = env_of(pair_home)
    before = snapshot(pair_home / ".ollama", pair_home / ".lmstudio")
    res, err = run_json(env, "--target", "ollama:tiny-big", "--draft", "auto")
    note = [ln for ln in err.splitlines() if "--draft auto" in ln]
    lms = str(pair_home / ".lmstudio" / "models" / LMS_DRAFT)
    ratio = read_gguf(big_target).n_params / read_gguf(family_draft).n_params
    assert note == [(f"specli: --draft auto: LM Studio {LMS_DRAFT} ({lms}), found on disk: tokenizer compatible, "
                     f"{ratio:.1f}x fewer parameters, same family (Tiny); hybrid with prompt lookup")], err
    assert res["draft"] == lms and res["target"].startswith(str(pair_home / ".ollama" / "models" / "blobs"))
    assert res["stats"]["mode"] == "hybrid"
    plain, _ = run_json(env, "--target", "ollama:tiny-big", "--draft", "none")
    assert plain["tokens"] == res["tokens"]  # lossless: the target's own greedy text
    assert snapshot(pair_home / ".ollama", pair_home / ".lmstudio") == before


def test_every_command_takes_store_references(pair_home, tmp_path):
    """run (above), export, bench, chat and serve all go through the same resolution."""
    import httpx
    import pexpect
    from faulthelp import start, wait_for
    env = env_of(pair_home)
    blob = models.resolve("ollama:tiny-big")
    lms = str(pair_home / ".lmstudio" / "models" / LMS_DRAFT)
    rc, out, err = specli("export", "--target", "ollama:tiny-big", "--to", "llama-server", env=env)
    assert rc == 0 and f"-m {blob}" in out and f"-md {lms}" in out, (out, err)
    suite = tmp_path / "s.yaml"
    suite.write_text("prompts:\n  - id: one\n    text: Hello there\n")
    rc, out, err = specli("bench", "--target", "ollama:tiny-big", "--suite", str(suite), "-n", "8",
                          "--modes", "none,hybrid", "--json", env=env)
    assert rc == 0 and "found on disk" in err, err
    assert json.loads(out)["modes"]["hybrid"]["lossless"] == {"one": "identical"}
    import sys
    child = pexpect.spawn(sys.executable, ["-m", "specli", "chat", "--target", f"lmstudio:{LMS_DRAFT}", "--draft",
                                           "ollama:tiny-draft", "-n", "8"], env=env, encoding="utf-8", timeout=120,
                          dimensions=(40, 200))
    child.expect(">>> ")
    child.sendline("Hello")
    child.expect(r"mode (\w+)")
    assert child.match.group(1) == "hybrid"
    child.expect(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    proc = start("serve", "--target", "ollama:tiny-big", "--port", "0", "--ctx", "512", env=env)
    try:
        lines: list[str] = []
        wait_for("the server to listen", lambda: lines.append(proc.stderr.readline()) or "serving" in lines[-1], 120)
        assert "(drafter: " in lines[-1] and "found on disk" in "".join(lines), lines
        url = lines[-1].split(" on ")[1].split("/v1")[0] + "/v1"
        ids = [m["id"] for m in httpx.get(url + "/models").json()["data"]]
        assert ids == ["tiny-big:latest"], ids
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_file_with_a_profiles_pinned_sha256_gets_its_draft_and_settings(pair_home, big_target, tiny_draft):
    """The profile names its models on the Hub; the files are on disk under other names (an
    Ollama blob, an LM Studio file): matched by SHA-256, the profile's draft found on disk wins
    over the better-ranked same-family one, and its settings apply."""
    prof = pair_home / ".config" / "specli" / "profiles" / "tiny-pinned.yaml"
    prof.parent.mkdir(parents=True)
    prof.write_text(f"name: tiny-pinned\n"
                    f"target: {{sources: [tiny-org/Big-GGUF/big.gguf], sha256: {sha256_of(big_target)}}}\n"
                    f"drafts:\n  - {{sources: [tiny-org/Small-GGUF/small.gguf], sha256: {sha256_of(tiny_draft)}}}\n"
                    "defaults: {draft_max: 5, ctx: 1024}\n")
    link(big_target, pair_home / ".lmstudio" / "models" / "me" / "Renamed-GGUF" / "renamed.gguf")
    env = env_of(pair_home)
    draft_blob = models.resolve("ollama:tiny-draft")
    for ref in ("ollama:tiny-big", "lmstudio:me/Renamed-GGUF"):
        res, err = run_json(env, "--target", ref, "--draft", "auto")
        assert f"specli: {ref} is profile tiny-pinned's target (SHA-256 {sha256_of(big_target)[:12]}…)" in err, err
        assert (f"--draft auto: Ollama tiny-draft:latest ({draft_blob}): profile tiny-pinned's draft "
                "tiny-org/Small-GGUF/small.gguf, found on disk (SHA-256 match)") in err, err
        assert res["draft"] == draft_blob and res["settings"]["ctx"] == 1024 and res["settings"]["draft_max"] == 5
    # the renamed file was hashed once, into specli's cache, not into any store
    assert (pair_home / ".cache" / "specli" / "verified.json").exists()


def test_draft_auto_takes_a_head_that_fits_and_skips_one_for_another_target(home, smol_gguf):
    """Drafting heads on disk are not draft models: ``--draft auto`` takes one that fits the
    target (checked from its header), says why it skips one built for another target, and
    ``specli pairs`` does not offer either as a draft model."""
    from tinyheads import tiny_head_model

    target = str(tiny_head_model(TEST_CACHE, smol_gguf, "bigram"))
    fits = str(tiny_head_model(TEST_CACHE, smol_gguf, "eagle3-full"))
    other = str(tiny_head_model(TEST_CACHE, smol_gguf, "eagle3-full", target_hidden=4096, layers=(2, 20, 40)))
    oll = home / ".ollama" / "models"
    ollama_model(oll, "bigram:latest", target)
    ollama_model(oll, "other-head:latest", other)
    link(fits, home / ".lmstudio" / "models" / "pub" / "Head-GGUF" / "eagle3.gguf")
    env = env_of(home)
    res, err = run_json(env, "--target", "ollama:bigram", "--draft", "auto")
    notes = [ln for ln in err.splitlines() if "--draft auto" in ln]
    assert any("skipped" in ln and "built for another target (" in ln and "hidden size" in ln for ln in notes), err
    assert any("eagle3.gguf), found on disk: an EAGLE-3 head" in ln and "fits this target" in ln for ln in notes), err
    assert res["stats"]["mode"] == "eagle3-lookup"
    plain, _ = run_json(env, "--target", "ollama:bigram", "--draft", "none")
    assert plain["tokens"] == res["tokens"]
    # specli pairs lists them as heads, what each is and whether it fits, never as draft models
    rc, out, err = specli("pairs", "ollama:bigram", "--json", env=env)
    assert rc == 0, err
    ((group),) = json.loads(out)
    assert group["drafts"] == []
    by_name = {h["name"]: h for h in group["heads"]}
    assert set(by_name) == {"pub/Head-GGUF/eagle3.gguf", "other-head:latest"}, by_name
    good, bad = by_name["pub/Head-GGUF/eagle3.gguf"], by_name["other-head:latest"]
    assert good["kind"] == "eagle3" and good["fits"] and good["drafts"] and good["problems"] == []
    assert not bad["fits"] and not bad["drafts"]
    assert any(p.startswith("hidden size: head reads rows of 4096") for p in bad["problems"]), bad
    rc, out, err = specli("pairs", "ollama:bigram", env=env)
    assert rc == 0 and "EAGLE-3 head" in out and "fits this target" in out and "built for another target" in out, out
    assert "draft model" not in out
