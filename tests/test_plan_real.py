"""The memory estimate against llama.cpp's own figures, and the lookup fallback end to end."""

import json
import os
import re
import sys

import pytest
from clihelp import specli
from nearties import assert_same_or_near_tie

import specli.engine as engine
from specli.engine import Context, ContextConfig, Model
from specli.hardware.plan import MiB, memory_from_header
from specli.resolve.gguf_header import read_gguf

pytestmark = pytest.mark.real
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def llama_reported(path: str, n_ctx: int) -> dict:
    with engine.captured_log() as lines:
        m = Model(path)
        c = Context(m, ContextConfig(n_ctx=n_ctx))
        log = "".join(lines)
        c.close()
        m.close()

    def mib(pattern):
        return sum(float(x) for x in re.findall(pattern + r"\s*=\s*([\d.]+) MiB", log)) * MiB

    return {"weights": mib(r"CPU_Mapped model buffer size"), "kv": mib(r"KV buffer size"),
            "compute": mib(r"CPU compute buffer size") + mib(r"output buffer size")}


@pytest.mark.parametrize("name", [TARGET, DRAFT])
def test_estimate_matches_llama_cpp(real_model, name):
    path = real_model(name)
    got = llama_reported(path, 4096)
    est = memory_from_header(read_gguf(path))
    assert abs(est.weights - got["weights"]) < 0.01 * MiB
    assert est.kv(4096) == pytest.approx(got["kv"], abs=0.01 * MiB)
    # buffers: an upper bound with a margin, not a wild one
    assert got["compute"] <= est.compute(512) <= 1.15 * got["compute"]


def test_small_budget_falls_back_to_lookup_and_keeps_the_greedy_output(real_model):
    t, d = real_model(TARGET), real_model(DRAFT)
    prompt = "Write a Python function that returns the n-th Fibonacci number iteratively."
    rc, out, err = specli("run", "--target", t, "--draft", d, "--vram", "1GiB", "-n", "48", "--json", stdin=prompt)
    assert rc == 0, err
    assert "using prompt lookup" in err and "1.0 GiB free" in err
    res = json.loads(out)
    assert res["stats"]["mode"] == "lookup" and res["draft"] == "lookup"
    rc, plain, _ = specli("run", "--target", t, "--draft", "none", "-n", "48", "--json", stdin=prompt)
    plain = json.loads(plain)
    # lookup verifies in other batch shapes than plain decoding (and, on a GPU build, with other
    # layers offloaded): the same tokens, or a parting at a near-tie
    m = Model(t)
    ctx = Context(m, ContextConfig(n_ctx=1024))
    try:
        assert_same_or_near_tie(ctx, plain["prompt_tokens"], plain["tokens"], res["tokens"], "lookup")
    finally:
        ctx.close()
        m.close()


def _env_with_gpus(tmp_path, nvidia_smi_lines: list[str] | None) -> dict:
    """PATH holding only Python and, if given, an ``nvidia-smi`` that prints these lines: the
    same GPU view on every machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi_lines is not None:
        exe = bin_dir / "nvidia-smi"
        exe.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in nvidia_smi_lines))
        exe.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SPECLI_VRAM"}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}"}


@pytest.mark.parametrize("gpu", [False, True], ids=["no-gpu", "one-gpu"])
def test_plan_and_doctor_say_what_the_machine_and_the_build_can_do(real_model, tmp_path, gpu):
    """Holds on CPU and GPU machines alike: the GPU seen is a stand-in nvidia-smi's (or none),
    and whether this llama.cpp build can offload is asked of the build itself."""
    t, d = real_model(TARGET), real_model(DRAFT)
    can = engine.supports_gpu_offload()
    env = _env_with_gpus(tmp_path, ["Test GPU, 24576, 20000"] if gpu else None)
    rc, out, err = specli("run", "--target", t, "--draft", d, "--plan", "--vram", "3GiB", env=env)
    assert rc == 0 and "[both-gpu]" in out and "target layers on GPU: all; drafter: hybrid" in out
    rc, out, err = specli("run", "--target", t, "--draft", d, "--plan", env=env)
    assert rc == 0, err
    if gpu and can:
        assert "GPU budget   19.5 GiB (detected)" in out and "[both-gpu]" in out
    else:
        assert "GPU budget   none (CPU only)" in out and "[cpu]" in out
        assert ("no GPU found" if can else "no GPU offload in this llama.cpp build") in out
    rc, out, err = specli("doctor", env=env)
    assert rc == 0 and "CPU threads:" in out
    assert f"GPU offload in this build: {'yes' if can else 'no'}" in out
    if gpu:
        assert "device: Test GPU (cuda), 19.5 GiB free of 24.0 GiB" in out
        assert ("reinstall with" in out and "-DGGML_CUDA=on" in out) != can
    else:
        assert "no GPU found" in out and "reinstall" not in out
