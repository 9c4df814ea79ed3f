"""Hub references through the real huggingface-hub client, against a local Hub-compatible
server: resolution, split files, header-only checks, resume, offline mode, 404, 401, and
--draft auto."""

import json
import os
import socket

import pytest
from clihelp import specli
from hubhelp import cache_file, one_line_error
from hubserver import HubServer, HubState, Repo

from specli.errors import SpecliError
from specli.resolve.hub import (
    HubRef,
    family_of,
    parse_hub_ref,
    pick_files,
    quant_of,
    size_of,
)

T_REPO = "tiny-org/Tiny-Target-2B-GGUF"
D_REPO = "tiny-org/Tiny-Target-0.1B-GGUF"
BAD_REPO = "tiny-org/Tiny-Target-0.05B-GGUF"  # smallest, but another vocabulary
GATED = "tiny-org/Gated-2B-GGUF"


@pytest.fixture(scope="module")
def split_parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    parts = []
    for i in (1, 2):
        p = d / f"part{i}"
        p.write_bytes(os.urandom(200_000))
        parts.append(str(p))
    return parts


@pytest.fixture()
def hub(tiny_target, tiny_draft, tiny_draft_edited, split_parts):
    state = HubState(repos={
        T_REPO: Repo({"tiny-target-2b-q4_k_m.gguf": tiny_target, "tiny-target-2b-q8_0.gguf": tiny_target,
                      "README.md": __file__}),
        D_REPO: Repo({"tiny-target-0.1b-q4_k_m.gguf": tiny_draft}),
        BAD_REPO: Repo({"tiny-target-0.05b-q4_k_m.gguf": tiny_draft_edited}),
        GATED: Repo({"gated-2b-q4_k_m.gguf": tiny_target}, gated_token="hf_secret"),
        "tiny-org/Split-GGUF": Repo({"big-q4_k_m-00001-of-00002.gguf": split_parts[0],
                                     "big-q4_k_m-00002-of-00002.gguf": split_parts[1]}),
    })
    with HubServer(state) as srv:
        yield srv


@pytest.fixture()
def env(hub, tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), SPECLI_CONFIG_DIR=str(tmp_path / "config"),
             HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    return e


# -- pure parts ----------------------------------------------------------------------------

def test_reference_grammar():
    assert parse_hub_ref("org/repo:Q4_K_M") == HubRef("org/repo", "Q4_K_M")
    assert parse_hub_ref("org/repo") == HubRef("org/repo")
    assert parse_hub_ref("org/repo/sub/file.gguf") == HubRef("org/repo", None, "sub/file.gguf")
    assert parse_hub_ref("org/repo:q8_0@v2") == HubRef("org/repo", "q8_0", None, "v2")
    assert parse_hub_ref("just-a-name") is None and parse_hub_ref("org/repo/readme.md") is None
    assert quant_of("qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf") == "Q4_K_M"
    assert quant_of("model.IQ4_XS.gguf") == "IQ4_XS" and quant_of("model-f16.gguf") == "F16"
    assert size_of("Qwen2.5-Coder-7B-Instruct-GGUF") == 7e9 and size_of("SmolLM2-135M-Instruct") == 135e6
    assert family_of("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF") == "Qwen2.5-Coder"


def test_pick_files():
    files = ["a-q4_k_m.gguf", "a-Q8_0.gguf", "mmproj-a-f16.gguf", "b-q5_k_m-00002-of-00002.gguf",
             "b-q5_k_m-00001-of-00002.gguf"]
    assert pick_files(files, HubRef("o/r", "q8_0")) == ["a-Q8_0.gguf"]
    assert pick_files(files, HubRef("o/r", "Q5_K_M")) == ["b-q5_k_m-00001-of-00002.gguf",
                                                         "b-q5_k_m-00002-of-00002.gguf"]
    with pytest.raises(SpecliError, match="no GGUF of quantisation Q6_K; it has: Q4_K_M, Q5_K_M, Q8_0"):
        pick_files(files, HubRef("o/r", "Q6_K"))
    with pytest.raises(SpecliError, match="several GGUF files"):
        pick_files(files, HubRef("o/r"))
    assert pick_files(["only.gguf", "README.md"], HubRef("o/r")) == ["only.gguf"]
    with pytest.raises(SpecliError, match="has 1 of 3 parts"):
        pick_files(["c-00001-of-00003.gguf"], HubRef("o/r"))


def test_pick_files_prefers_one_file_to_a_split_set_of_the_same_quant():
    both = ["m-Q4_K_M.gguf", "m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q8_0.gguf"]
    notes = []
    assert pick_files(both, HubRef("o/r", "Q4_K_M"), note=notes.append) == ["m-Q4_K_M.gguf"]
    assert notes == ["o/r: Q4_K_M is there both as one file and split in parts; using the single file m-Q4_K_M.gguf"]
    notes.clear()
    assert pick_files(both, HubRef("o/r", "Q8_0"), note=notes.append) == ["m-Q8_0.gguf"] and notes == []
    # bartowski/Llama-3.3-70B-Instruct-GGUF (the llama-3.3-70b profile): Q4_K_M is one file, Q5_K_M split in a folder
    bart = ["Llama-3.3-70B-Instruct-Q4_K_M.gguf", "Llama-3.3-70B-Instruct-Q4_K_L.gguf",
            "Llama-3.3-70B-Instruct-Q5_K_M/Llama-3.3-70B-Instruct-Q5_K_M-00001-of-00002.gguf",
            "Llama-3.3-70B-Instruct-Q5_K_M/Llama-3.3-70B-Instruct-Q5_K_M-00002-of-00002.gguf"]
    assert pick_files(bart, HubRef("b/r", "Q4_K_M")) == ["Llama-3.3-70B-Instruct-Q4_K_M.gguf"]
    assert len(pick_files(bart, HubRef("b/r", "Q5_K_M"))) == 2


# -- through the CLI and the real client ---------------------------------------------------

def test_pull_by_quant_case_insensitive(env, tiny_target):
    rc, out, err = specli("pull", f"{T_REPO}:q4_k_m", env=env)
    assert rc == 0, err
    got = cache_file(env, T_REPO, "tiny-target-2b-q4_k_m.gguf")
    assert got and out.strip().endswith(got)
    assert open(got, "rb").read() == open(tiny_target, "rb").read()


def test_quant_errors(env):
    rc, out, err = specli("pull", f"{T_REPO}:Q5_K_M", env=env)
    assert one_line_error(rc, err) == (f"specli: error: {T_REPO} has no GGUF of quantisation Q5_K_M; "
                                       "it has: Q4_K_M, Q8_0")
    rc, out, err = specli("pull", T_REPO, env=env)
    assert "several GGUF files; name one with" in one_line_error(rc, err)


def test_split_gguf_downloads_every_part(env, split_parts):
    rc, out, err = specli("pull", "tiny-org/Split-GGUF:Q4_K_M", env=env)
    assert rc == 0, err
    assert out.strip().endswith("big-q4_k_m-00001-of-00002.gguf")
    for i, part in enumerate(split_parts, 1):
        got = cache_file(env, "tiny-org/Split-GGUF", f"big-q4_k_m-0000{i}-of-00002.gguf")
        assert got and open(got, "rb").read() == open(part, "rb").read()


def test_check_reads_only_the_header(env, hub, tiny_target):
    rc, out, err = specli("check", f"{T_REPO}:Q4_K_M", f"{D_REPO}:Q4_K_M", env=env)
    assert rc == 0, err
    assert "✓ token text" in out and "compatible" in out
    size = os.path.getsize(tiny_target)
    served = hub.state.served
    assert 0 < served["tiny-target-2b-q4_k_m.gguf"] < 0.25 * size, served
    assert served["tiny-target-0.1b-q4_k_m.gguf"] < 0.25 * size
    assert cache_file(env, T_REPO, "tiny-target-2b-q4_k_m.gguf") is None  # nothing downloaded


def test_incompatible_draft_is_refused_before_download(env, hub, tiny_target):
    rc, out, err = specli("run", "--target", f"{T_REPO}:Q4_K_M", "--draft", f"{BAD_REPO}:Q4_K_M",
                          "--prompt", "hi", env=env)
    assert one_line_error(rc, err).startswith("specli: error: draft vocabulary differs from target at token 1234")
    assert hub.state.served.get("tiny-target-0.05b-q4_k_m.gguf", 0) < 0.25 * os.path.getsize(tiny_target)
    assert cache_file(env, BAD_REPO, "tiny-target-0.05b-q4_k_m.gguf") is None
    rc, out, err = specli("check", f"{T_REPO}:Q4_K_M", f"{BAD_REPO}:Q4_K_M", env=env)
    assert rc == 1 and "✗ token text: at token 1234" in out


def test_resume_after_the_server_cuts_a_download(env, hub, tiny_target):
    size = os.path.getsize(tiny_target)
    hub.state.cut_once["tiny-target-2b-q8_0.gguf"] = size // 2
    rc, out, err = specli("pull", f"{T_REPO}:Q8_0", env=env)
    if rc != 0:  # the client gave up on the cut connection: a second pull resumes
        rc, out, err = specli("pull", f"{T_REPO}:Q8_0", env=env)
    assert rc == 0, err
    got = cache_file(env, T_REPO, "tiny-target-2b-q8_0.gguf")
    assert open(got, "rb").read() == open(tiny_target, "rb").read()
    # resumed, not restarted: well under two full copies crossed the wire
    assert hub.state.served["tiny-target-2b-q8_0.gguf"] < 1.3 * size


def test_offline_revision_reads_that_revisions_file(env, hub, tiny_target, tiny_draft_edited):
    """Two revisions of a repo in the cache: offline, `@rev` reads that revision's file (a
    hand-walk of the cache took whichever snapshot was newest)."""
    rev = "tiny-org/Rev-2B-GGUF"
    hub.state.repos[rev] = Repo({"rev-2b-q4_k_m.gguf": tiny_target}, sha="a" * 40, revisions={
        "v1": Repo({"rev-2b-q4_k_m.gguf": tiny_target}, sha="1" * 40),
        "v2": Repo({"rev-2b-q4_k_m.gguf": tiny_draft_edited}, sha="2" * 40)})
    for r in ("v1", "v2"):
        rc, out, err = specli("pull", f"{rev}:Q4_K_M@{r}", env=env)
        assert rc == 0, err
    off = dict(env, HF_HUB_OFFLINE="1")
    for a, b in (("v1", "v2"), ("v2", "v1"), ("1" * 40, "v2")):
        rc, out, err = specli("check", f"{rev}:Q4_K_M@{a}", f"{rev}:Q4_K_M@{b}", env=off)
        assert rc == 1 and "✗ token text: at token 1234" in out, (a, b, out, err)
    rc, out, err = specli("check", f"{rev}:Q4_K_M@v1", f"{rev}:Q4_K_M@{'1' * 40}", env=off)
    assert rc == 0 and "compatible" in out, err
    rc, out, err = specli("pull", f"{rev}:Q4_K_M", env=off)  # main was never fetched
    assert "HF_HUB_OFFLINE is set and tiny-org/Rev-2B-GGUF is not in the cache" in one_line_error(rc, err)
    rc, out, err = specli("pull", f"{rev}:Q4_K_M@v2", env=off)
    assert rc == 0 and open(out.split()[-1], "rb").read() == open(tiny_draft_edited, "rb").read(), err


def test_offline_mode(env, tiny_target):
    off = dict(env, HF_HUB_OFFLINE="1")
    rc, out, err = specli("run", "--target", f"{T_REPO}:Q4_K_M", "--draft", "none", "--raw", "-n", "8",
                          "--prompt", "hi", env=off)
    assert "HF_HUB_OFFLINE is set and tiny-org/Tiny-Target-2B-GGUF is not in the cache" in one_line_error(rc, err)
    assert specli("pull", f"{T_REPO}:Q4_K_M", env=env)[0] == 0
    rc, out, err = specli("run", "--target", f"{T_REPO}:Q4_K_M", "--draft", "none", "--raw", "-n", "8",
                          "--prompt", "hi", env=off)
    assert rc == 0 and out.strip(), err


def test_not_found_gated_and_unreachable(env, hub):
    rc, out, err = specli("pull", "tiny-org/Nope-GGUF:Q4_K_M", env=env)
    assert one_line_error(rc, err) == (f"specli: error: repository tiny-org/Nope-GGUF not found on {hub.url} "
                                       "(or it is private: set HF_TOKEN)")
    rc, out, err = specli("pull", f"{GATED}:Q4_K_M", env=env)
    assert "is gated" in one_line_error(rc, err) and "set HF_TOKEN" in err
    rc, out, err = specli("pull", f"{GATED}:Q4_K_M", env=dict(env, HF_TOKEN="hf_secret"))
    assert rc == 0, err
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    rc, out, err = specli("pull", f"{D_REPO}:Q4_K_M", env=dict(env, HF_ENDPOINT=dead))
    assert one_line_error(rc, err).endswith("no cached copy")
    rc, out, err = specli("pull", f"{GATED}:Q4_K_M", env=dict(env, HF_ENDPOINT=dead))
    assert one_line_error(rc, err).endswith("a cached copy exists: set HF_HUB_OFFLINE=1 to use it")


def test_draft_auto_from_a_search(env, tiny_target):
    rc, out, err = specli("run", "--target", f"{T_REPO}:Q4_K_M", "--draft", "auto", "--raw", "-n", "24",
                          "--json", "--prompt", "Once upon a time", env=env)
    assert rc == 0, err
    # the choice's note (an offer of a converted copy may follow it, where this machine's kernel
    # table says the draft's types run slowly)
    note = [ln for ln in err.splitlines() if ln.startswith("specli: --draft auto:")]
    assert len(note) == 1 and f"{D_REPO}:Q4_K_M" in note[0] and "smallest compatible" in note[0]
    res = json.loads(out)
    assert res["draft"].endswith("tiny-target-0.1b-q4_k_m.gguf") and res["stats"]["mode"] == "hybrid"
    # the output is the target's own
    rc, plain, _ = specli("run", "--target", tiny_target, "--draft", "none", "--raw", "-n", "24", "--json",
                          "--prompt", "Once upon a time")
    assert json.loads(plain)["tokens"] == res["tokens"]


def test_draft_auto_from_a_profile_and_fallback_to_lookup(env, tmp_path, hub):
    prof_dir = tmp_path / "config" / "profiles"
    prof_dir.mkdir(parents=True)
    (prof_dir / "tiny.yaml").write_text(f"name: tiny\ntarget: {T_REPO}:Q8_0\ndrafts:\n  - {D_REPO}:Q4_K_M\n"
                                        "defaults:\n  draft_max: 4\n")
    rc, out, err = specli("run", "--target", f"{T_REPO}:Q8_0", "--draft", "auto", "--raw", "-n", "8",
                          "--prompt", "hi", env=env)
    assert rc == 0 and f"--draft auto: {D_REPO}:Q4_K_M (profile tiny)" in err, err
    rc, out, err = specli("run", "--profile", "tiny", "--raw", "-n", "8", "--prompt", "hi", env=env)
    assert rc == 0 and "(profile tiny)" in err, err
    rc, out, err = specli("run", "--target", "tiny", "--raw", "-n", "8", "--prompt", "hi", env=env)
    assert rc == 0 and "(profile tiny)" in err, err  # a profile name as --target
    # a target whose family has no smaller sibling on the Hub: prompt lookup
    hub.state.repos["solo/Solo-3B-GGUF"] = Repo({"solo-3b-q4_k_m.gguf": hub.state.repos[T_REPO].files[
        "tiny-target-2b-q4_k_m.gguf"]})
    rc, out, err = specli("run", "--target", "solo/Solo-3B-GGUF:Q4_K_M", "--raw", "-n", "8", "--json",
                          "--prompt", "hi", env=env)
    assert rc == 0, err
    assert "--draft auto: no smaller compatible Solo GGUF on the Hub; using prompt lookup" in err
    assert json.loads(out)["draft"] == "lookup"
