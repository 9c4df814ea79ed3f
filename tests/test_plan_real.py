"""The memory estimate against llama.cpp's own figures, and the lookup fallback end to end."""

import json
import re

import pytest
from clihelp import specli

import specli.engine as engine
from specli.engine import Context, ContextConfig, Model
from specli.hardware.plan import MiB, memory_from_header
from specli.resolve.gguf_header import read_gguf

pytestmark = pytest.mark.real
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def llama_reported(path: str, n_ctx: int) -> dict:
    engine.log_sink = []
    try:
        m = Model(path)
        c = Context(m, ContextConfig(n_ctx=n_ctx))
        log = "".join(engine.log_sink)
        c.close()
        m.close()
    finally:
        engine.log_sink = None

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
    assert json.loads(plain)["tokens"] == res["tokens"]


def test_plan_and_doctor_on_a_cpu_machine(real_model):
    t, d = real_model(TARGET), real_model(DRAFT)
    rc, out, err = specli("run", "--target", t, "--draft", d, "--plan", "--vram", "3GiB")
    assert rc == 0 and "[both-gpu]" in out and "target layers on GPU: all; drafter: hybrid" in out
    rc, out, err = specli("run", "--target", t, "--draft", d, "--plan")
    assert rc == 0 and "GPU budget   none (CPU only)" in out and "[cpu]" in out
    rc, out, err = specli("doctor")
    assert rc == 0
    assert "GPU offload in this build: no" in out and "no GPU found" in out and "CPU threads:" in out
