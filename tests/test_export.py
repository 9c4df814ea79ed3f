"""specli export: the printed commands for each engine, every llama-server flag checked against
the llama.cpp that llama-cpp-python vendors, and the llama-server export run for real (built
from those sources against the installed libllama by tests/llama_server.py) on the default Qwen
pair and with prompt lookup."""

import json
import os
import re
import shlex
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import llama_server  # noqa: E402
from clihelp import specli  # noqa: E402

from specli import engine  # noqa: E402
from specli import export as ex  # noqa: E402
from specli.errors import SpecliError  # noqa: E402
from specli.resolve import hub  # noqa: E402
from specli.speculate.controller import best_length  # noqa: E402


def pair(**kw) -> ex.Pair:
    base = dict(target_path="/m/target.gguf", draft_path="/m/draft.gguf", lookup=True, n_ctx=4096,
                target_gpu_layers=-1, draft_gpu_layers=-1, draft_n=6, lookup_n=9, p_min=0.6)
    base.update(kw)
    return ex.Pair(**base)


def argv(e: ex.Export, index: int = 0) -> list[str]:
    return e.commands[index]


def value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


# -- llama-server flags against the vendored llama.cpp -------------------------------------------

def declared_flags(arg_cpp: str) -> tuple[set[str], set[str]]:
    """(accepted, removed): every flag common/arg.cpp declares, and those whose handler only
    reports that the flag was removed."""
    accepted, removed = set(), set()
    for chunk in arg_cpp.split("add_opt(common_arg(")[1:]:
        head = re.match(r"\s*((?:\{[^{}]*\}\s*,\s*)+)", chunk)
        if not head:
            continue
        names = set(re.findall(r'"(-[^"]+)"', head.group(1)))
        (removed if "arg_removed(" in chunk.split("add_opt(")[0] else accepted).update(names)
    return accepted, removed - accepted


@pytest.fixture(scope="module")
def vendored():
    src = llama_server.source()
    accepted, removed = declared_flags((src / "common" / "arg.cpp").read_text(encoding="utf-8"))
    spec_types = set(re.findall(r'\{"([a-z0-9-]+)",\s*COMMON_SPECULATIVE_TYPE_',
                                (src / "common" / "speculative.cpp").read_text(encoding="utf-8")))
    return accepted, removed, spec_types


def test_flag_parser_sees_the_rename(vendored):
    accepted, removed, spec_types = vendored
    assert {"--spec-draft-n-max", "--spec-draft-model", "-md", "--spec-type", "-hfd", "-ngl"} <= accepted
    assert {"--draft-max", "--draft-min"} <= removed
    assert {"draft-simple", "ngram-simple", "ngram-mod"} <= spec_types


HUB_T = hub.parse_hub_ref("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M")
HUB_D = hub.parse_hub_ref("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


@pytest.mark.parametrize("p,use_hub", [
    (pair(), False),
    (pair(lookup=False), False),
    (pair(draft_path=None), False),
    (pair(target_gpu_layers=12, draft_gpu_layers=0, threads=4), False),
    (pair(target_hub=HUB_T, draft_hub=HUB_D), True),
    (pair(draft_path=None, mtp=True, head="side.gguf", head_type="draft-mtp"), False),
    (pair(draft_path=None, head="eagle3.gguf", head_type="draft-eagle3"), False),
    (pair(no_repack=True), False),
])
def test_every_llama_server_flag_is_declared_by_the_vendored_llama_cpp(vendored, p, use_hub):
    accepted, removed, spec_types = vendored
    cmd = argv(ex.llama_server(p, 8080, use_hub))
    flags = [t for t in cmd[1:] if t.startswith("-")]
    assert flags and all(f in accepted for f in flags), [f for f in flags if f not in accepted]
    assert not set(flags) & removed
    assert set(value(cmd, "--spec-type").split(",")) <= spec_types


def test_llama_server_commands():
    cmd = argv(ex.llama_server(pair(), 8123))
    assert cmd[0] == "llama-server" and "--no-repack" not in cmd
    # a CPU with AMX tiles: no weight repacking, as specli itself loads there (engine.extra_buffer_types)
    assert "--no-repack" in argv(ex.llama_server(pair(no_repack=True), 8123))
    assert value(cmd, "-m") == "/m/target.gguf" and value(cmd, "-md") == "/m/draft.gguf"
    # hybrid: prompt lookup first, the draft model when the context has no match
    assert value(cmd, "--spec-type") == "ngram-simple,draft-simple"
    assert value(cmd, "--spec-draft-n-max") == "6" and value(cmd, "--spec-ngram-simple-size-m") == "9"
    assert value(cmd, "--spec-ngram-simple-size-n") == str(ex.LOOKUP_MATCH)
    assert value(cmd, "-ngl") == "all" and value(cmd, "--spec-draft-ngl") == "all"
    assert value(cmd, "--spec-draft-p-min") == "0.6" and value(cmd, "-c") == "4096"
    assert value(cmd, "--port") == "8123" and value(cmd, "--host") == "127.0.0.1"

    # llama.cpp's ngram-simple drops a copy shorter than its match: a short measured length
    # must not switch lookup off (the ported policy proposes nothing then)
    from research.lab.llamacpp_policies import ngram_simple_draft
    short = argv(ex.llama_server(pair(lookup_n=3), 8123))
    n, m = int(value(short, "--spec-ngram-simple-size-n")), int(value(short, "--spec-ngram-simple-size-m"))
    text = list(range(100, 180))
    assert m >= n and ngram_simple_draft([1, 2] + text + text[:n - 1], text[n - 1], n, m) == text[n:n + m]

    only_model = argv(ex.llama_server(pair(lookup=False, target_gpu_layers=20, draft_gpu_layers=0), 8080))
    assert value(only_model, "--spec-type") == "draft-simple" and "--spec-ngram-simple-size-m" not in only_model
    assert value(only_model, "-ngl") == "20" and value(only_model, "--spec-draft-ngl") == "0"

    only_lookup = argv(ex.llama_server(pair(draft_path=None), 8080))
    assert value(only_lookup, "--spec-type") == "ngram-simple"
    assert "-md" not in only_lookup and "--spec-draft-n-max" not in only_lookup


def test_llama_server_hub_references():
    p = pair(target_hub=HUB_T, draft_hub=HUB_D)
    cmd = argv(ex.llama_server(p, 8080, use_hub=True))
    assert value(cmd, "-hf") == "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M" and "-m" not in cmd
    # a named draft file: -md names it inside the -hfd repo
    assert value(cmd, "-hfd") == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert value(cmd, "-md") == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    # without a Hub origin the local path stays
    assert value(argv(ex.llama_server(pair(), 8080, use_hub=True)), "-m") == "/m/target.gguf"


def test_mtp_exports(vendored):
    accepted, _, spec_types = vendored
    p = pair(draft_path=None, mtp=True, hf_target="org/t")
    cmd = argv(ex.llama_server(p, 8080))
    assert value(cmd, "--spec-type") == "ngram-simple,draft-mtp" and "-md" not in cmd
    assert value(cmd, "--spec-draft-n-max") == "6" and "--spec-draft-ngl" not in cmd
    assert all(f in accepted for f in cmd[1:] if f.startswith("-"))
    assert set(value(cmd, "--spec-type").split(",")) <= spec_types
    assert json.loads(value(argv(ex.vllm(p, 8000)), "--speculative-config")) == {
        "method": "mtp", "num_speculative_tokens": 6}
    sg = argv(ex.sglang(p, 30000))
    assert value(sg, "--speculative-algorithm") == "EAGLE" and "--speculative-draft-model-path" not in sg
    assert value(sg, "--speculative-num-draft-tokens") == "7"
    with pytest.raises(SpecliError, match="no MTP"):
        ex.lmstudio(p, 1234)


def test_render_is_comments_then_one_shell_line():
    e = ex.llama_server(pair(target_path="/m/with space.gguf"), 8080)
    lines = e.render().splitlines()
    assert all(line.startswith("# ") for line in lines[:-1])
    assert any("--tensor-split" in line for line in lines[:-1])  # multi-GPU, commented
    assert shlex.split(lines[-1]) == e.commands[0]


# -- vLLM, SGLang, LM Studio -----------------------------------------------------------------------

def test_vllm_commands():
    p = pair(hf_target="Qwen/Qwen2.5-Coder-7B-Instruct", hf_draft="Qwen/Qwen2.5-Coder-0.5B-Instruct")
    e = ex.vllm(p, 8000)
    cmd = argv(e)
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen2.5-Coder-7B-Instruct"]
    assert value(cmd, "--max-model-len") == "4096" and value(cmd, "--port") == "8000"
    assert json.loads(value(cmd, "--speculative-config")) == {
        "method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "num_speculative_tokens": 6}
    assert any("--tensor-parallel-size" in c for c in e.comments)
    assert any("cannot combine" in c for c in e.comments)  # hybrid becomes the draft model alone

    ngram = json.loads(value(argv(ex.vllm(pair(draft_path=None, hf_target="org/t"), 8000)), "--speculative-config"))
    assert ngram["method"] == "ngram" and ngram["num_speculative_tokens"] == 9
    assert ngram["prompt_lookup_min"] == ex.LOOKUP_MATCH <= ngram["prompt_lookup_max"]


def test_vllm_and_sglang_need_safetensors_repos():
    with pytest.raises(SpecliError, match="--hf-target"):
        ex.vllm(pair(), 8000)
    with pytest.raises(SpecliError, match="--hf-draft"):
        ex.sglang(pair(hf_target="org/t"), 30000)


def test_sglang_commands():
    p = pair(hf_target="org/target", hf_draft="org/draft")
    e = ex.sglang(p, 30000)
    cmd = argv(e)
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"] and value(cmd, "--model-path") == "org/target"
    assert value(cmd, "--speculative-algorithm") == "STANDALONE"
    assert value(cmd, "--speculative-draft-model-path") == "org/draft"
    # a chain of draft_n tokens: num-steps n, top-k 1, n + 1 tokens verified
    assert (value(cmd, "--speculative-num-steps"), value(cmd, "--speculative-eagle-topk"),
            value(cmd, "--speculative-num-draft-tokens")) == ("6", "1", "7")
    assert value(cmd, "--context-length") == "4096"
    assert any("--tp 2" in c for c in e.comments)
    ng = argv(ex.sglang(pair(draft_path=None, hf_target="org/target"), 30000))
    assert value(ng, "--speculative-algorithm") == "NGRAM" and value(ng, "--speculative-num-draft-tokens") == "9"
    assert value(ng, "--speculative-ngram-min-match-window-size") == str(ex.LOOKUP_MATCH)


def test_profiles_name_the_pair_as_safetensors(monkeypatch, tmp_path):
    from specli.resolve import profiles

    monkeypatch.setenv("SPECLI_CONFIG_DIR", str(tmp_path))
    shipped = profiles.load_all()
    # every shipped pair with a draft model (vLLM and SGLang cannot load a GGUF draft); a drafting
    # head's GGUF (qwen3-next's MTP-only sidecar, qwen3-8b's DFlash and gpt-oss-20b's EAGLE-3 heads) is
    # exported to llama-server only
    heads = {"qwen3-next-80b-a3b", "qwen3-8b", "gpt-oss-20b"}
    assert all(p.hf_target and p.hf_draft for p in shipped.values() if p.draft_models and p.name not in heads)
    assert (shipped["default"].hf_target, shipped["default"].hf_draft) == (
        "Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct")
    p = profiles.parse_profile("name: x\ntarget: a.gguf\nhf_target: org/t\n", "x.yaml")
    assert (p.hf_target, p.hf_draft) == ("org/t", None)
    with pytest.raises(SpecliError, match=r"x.yaml:3: hf_draft must be a non-empty string"):
        profiles.parse_profile("name: x\ntarget: a.gguf\nhf_draft: [a, b]\n", "x.yaml")


def test_lmstudio_commands_and_request_body():
    e = ex.lmstudio(pair(target_gpu_layers=0), 1234)
    assert [c[:2] for c in e.commands] == [["lms", "import"], ["lms", "import"], ["lms", "load"], ["lms", "server"]]
    load = e.commands[2]
    assert value(load, "--gpu") == "off" and value(load, "--context-length") == "4096"
    assert value(e.commands[3], "--port") == "1234"
    label, _, text = e.config.partition("\n")
    assert label.startswith("# request body")
    body = json.loads(text)
    assert body["model"] == value(load, "--identifier") and body["draft_model"] == "draft"
    assert any("no draft-model flag" in c for c in e.comments)
    with pytest.raises(SpecliError, match="draft model"):
        ex.lmstudio(pair(draft_path=None), 1234)


# -- the draft length: measured here, or the documented default -------------------------------------

def test_measured_length_uses_this_machines_calibration(tiny_target, tiny_draft, tmp_path, monkeypatch):
    from specli.hardware import calibrate

    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    model = ("draft", tiny_draft, 0)
    assert calibrate.measured_length(tiny_target, 0, 2, 512, 8, model) is None
    verify = [0.010, 0.012, 0.013, 0.014, 0.015, 0.016, 0.018, 0.020, 0.022]  # a GPU-like flat curve
    calibrate.install("verify", tiny_target, 0, 2, 512, 8, verify)
    assert calibrate.measured_length(tiny_target, 0, 2, 512, 8, model) is None  # draft cost not measured
    calibrate.install("draft", tiny_draft, 0, 2, 512, 0, 0.001)
    k = calibrate.measured_length(tiny_target, 0, 2, 512, 8, model)
    assert k == best_length(0.8, verify, 0.001, 8, 0.001, 0.8)[0] and k > 1
    assert calibrate.measured_length(tiny_target, 0, 2, 512, 8) == best_length(0.8, verify, 0.0, 8)[0]  # lookup
    # MTP layers are priced under their own key, on the target's file
    assert calibrate.measured_length(tiny_target, 0, 2, 512, 8, ("mtp", tiny_target, 0)) is None
    calibrate.install("mtp", tiny_target, 0, 2, 512, 0, 0.004)
    assert calibrate.measured_length(tiny_target, 0, 2, 512, 8, ("mtp", tiny_target, 0)) == \
        best_length(0.8, verify, 0.004, 8, 0.004, 0.8)[0]
    # a CPU-like curve where verifying costs as much as generating: nothing pays
    calibrate.install("verify", tiny_target, 0, 2, 512, 8, [0.01 * (k + 1) for k in range(9)])
    assert calibrate.measured_length(tiny_target, 0, 2, 512, 8, model) == 0


def test_cli_export_tiny_pair(tiny_target, tiny_draft, tmp_path):
    env = dict(os.environ, SPECLI_CACHE=str(tmp_path), SPECLI_VRAM="0")
    rc, out, err = specli("export", "--target", tiny_target, "--draft", tiny_draft, "--to", "llama-server",
                          "--port", "9123", env=env)
    assert rc == 0, err
    lines = out.splitlines()
    cmd = shlex.split(lines[-1])
    assert value(cmd, "-m") == tiny_target and value(cmd, "-md") == tiny_draft and value(cmd, "--port") == "9123"
    assert value(cmd, "--spec-draft-n-max") == str(ex.DEFAULT_DRAFT_N)  # nothing measured in a fresh cache
    assert any(line.startswith("# draft length: no cost measurement") for line in lines)
    assert any(line.startswith("# placement: ") for line in lines)


@pytest.mark.parametrize("extra,msg", [
    (["--draft", "none"], "plain decoding"),  # the last --draft given wins
    (["--to", "tgi"], "unknown engine"),
    (["--to", "vllm"], "--hf-target"),
])
def test_cli_export_bad_input_is_one_line(tiny_target, tiny_draft, tmp_path, extra, msg):
    env = dict(os.environ, SPECLI_CACHE=str(tmp_path))
    rc, out, err = specli("export", "--target", tiny_target, "--draft", tiny_draft, *extra, env=env)
    assert rc != 0 and out == ""
    assert err.strip().splitlines()[-1].startswith("specli: error:") and msg in err
    assert "Traceback" not in err


@pytest.mark.real
def test_cli_export_profile_to_vllm_uses_its_safetensors_repos(real_model):
    real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    real_model("qwen2.5-coder-0.5b-instruct-q4_k_m")
    rc, out, err = specli("export", "default", "--to", "vllm", env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert rc == 0, err
    cmd = shlex.split(out.splitlines()[-1])
    assert cmd[2] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert json.loads(value(cmd, "--speculative-config"))["model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"


# -- the exported llama-server command, run for real -------------------------------------------------

COPY_PROMPT = ("Repeat the following Python function exactly, character for character, with no other text:\n\n"
               "def moving_average(values, window):\n"
               "    if window <= 0:\n"
               "        raise ValueError('window must be positive')\n"
               "    out = []\n"
               "    total = 0.0\n"
               "    for i, v in enumerate(values):\n"
               "        total += v\n"
               "        if i >= window:\n"
               "            total -= values[i - window]\n"
               "        if i >= window - 1:\n"
               "            out.append(total / window)\n"
               "    return out\n")


def serve_exported(args: list[str], tmp_path) -> dict:
    """Export, start the printed llama-server command (binary built from the vendored llama.cpp,
    port replaced by a free one), send one completion, return its timings."""
    binary = llama_server.build()
    rc, out, err = specli("export", *args, "--to", "llama-server")
    assert rc == 0, err
    cmd = shlex.split(out.splitlines()[-1])
    assert cmd[0] == "llama-server"
    cmd[0] = str(binary)
    cmd[cmd.index("--port") + 1] = str(llama_server.free_port())
    assert ("--no-repack" in cmd) == (not engine.extra_buffer_types())  # AMX hosts: as specli itself loads
    with llama_server.running(cmd, tmp_path / "server.log") as base:
        reply = llama_server.post_json(base + "/completion", {
            "prompt": COPY_PROMPT, "n_predict": 96, "temperature": 0, "cache_prompt": False})
    assert reply["content"].strip()
    return reply["timings"]


@pytest.mark.real
def test_exported_llama_server_drafts_with_the_draft_model(real_model, tmp_path):
    target = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    draft = real_model("qwen2.5-coder-0.5b-instruct-q4_k_m")
    t = serve_exported(["--target", target, "--draft", draft, "--no-lookup", "--ctx", "2048"], tmp_path)
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"], t


@pytest.mark.real
def test_exported_llama_server_drafts_with_prompt_lookup(real_model, tmp_path):
    target = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    t = serve_exported(["--target", target, "--draft", "lookup", "--ctx", "2048"], tmp_path)
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"], t
