"""Every model on disk behind one server, on the real models: a fresh HOME with no network
holding Qwen2.5-Coder 1.5B and Gemma 3 270M (chat models) and Qwen2.5-Coder 0.5B (their draft)
in an Ollama store, SmolLM2 135M in an LM Studio folder. ``specli serve --max-loaded 1`` lists
them all; the official ``ollama`` client, langchain-ollama and the official ``openai`` client
chat with each in turn, and each greedy answer is ``specli run --target REF --draft auto``'s
(where the two part, only at a near-tie of the target: the adaptive drafter's batch shapes
follow this machine's timings, and quantised logits move with them); /api/ps shows the one
loaded model and its drafter; ``keep_alive: 0`` unloads."""

import json
import re
import signal
import subprocess

import httpx
import ollama
import openai
import pytest
from clihelp import specli
from faulthelp import start, wait_for
from langchain_ollama import ChatOllama, OllamaLLM
from nearties import assert_same_or_near_tie, tokens_of_text
from storehelp import clean_env, link, ollama_model

from specli.engine import Context, ContextConfig, Model

pytestmark = pytest.mark.real

CTX = 2048
N = 20
PROMPT = "Write a Python function that returns the square of a number."
QWEN, GEMMA, DRAFT = "qwen2.5-coder:1.5b", "gemma3:270m", "qwen2.5-coder:0.5b"
SMOL = "bartowski/SmolLM2-135M-Instruct-GGUF"
FILES = {QWEN: "qwen2.5-coder-1.5b-instruct-q4_k_m", GEMMA: "gemma-3-270m-q4_k_m",
         DRAFT: "qwen2.5-coder-0.5b-instruct-q4_k_m", SMOL: "smollm2-135m-instruct-q4_1"}


@pytest.fixture(scope="module")
def home(tmp_path_factory, real_model):
    h = tmp_path_factory.mktemp("many-real") / "home"
    oll = h / ".ollama" / "models"
    for name in (QWEN, GEMMA, DRAFT):
        ollama_model(oll, name, real_model(FILES[name]))
    link(real_model(FILES[SMOL]), h / ".lmstudio" / "models" / SMOL / "SmolLM2-135M-Instruct-Q4_1.gguf")
    return h


@pytest.fixture(scope="module")
def env(home):
    return clean_env(home, SPECLI_CONFIG_DIR=home / ".config" / "specli")


@pytest.fixture(scope="module")
def server(env):
    proc = start("serve", "--port", "0", "--ctx", str(CTX), "--max-loaded", "1", env=env)
    try:
        lines: list[str] = []
        wait_for("the server to listen", lambda: lines.append(proc.stderr.readline()) or "serving" in lines[-1], 300)
        yield re.search(r"(http://\S+)/v1 ", lines[-1]).group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def reference(env, ref: str) -> dict:
    rc, out, err = specli("run", "--target", ref, "--draft", "auto", "--ctx", str(CTX), "--temp", "0", "-n", str(N),
                          "--json", "--prompt", PROMPT, env=env)
    assert rc == 0, err
    return json.loads(out)


def test_every_real_model_listed_and_each_answers_as_specli_run(server, env):
    tags = {m["name"]: m for m in httpx.get(server + "/api/tags").json()["models"]}
    want = {f"{QWEN}", f"{GEMMA}", f"{DRAFT}", SMOL}
    assert want <= set(tags), sorted(tags)
    assert tags[DRAFT]["specli"]["role"] == "draft" and tags[QWEN]["specli"]["role"] == "model"
    assert tags[QWEN]["details"]["quantization_level"] == "Q4_K_M" and tags[GEMMA]["details"]["family"] == "gemma3"
    oa = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=600)
    assert want <= {m.id for m in oa.models.list().data}
    oc = ollama.Client(host=server, timeout=600)
    msgs = [{"role": "user", "content": PROMPT}]
    for name in (QWEN, GEMMA, DRAFT, SMOL):
        ref = reference(env, tags[name]["specli"]["ref"])
        if name == GEMMA:  # a base model, no chat template: completions, as `specli run` does
            first = oc.generate(model=name, prompt=PROMPT, options={"temperature": 0, "num_predict": N})
            texts = {"ollama": first.response}
        else:
            first = oc.chat(model=name, messages=msgs, options={"temperature": 0, "num_predict": N})
            texts = {"ollama": first.message.content}
        assert first.load_duration > 0, name  # --max-loaded 1: each model in turn is loaded
        ps = httpx.get(server + "/api/ps").json()["models"]
        assert [p["name"] for p in ps] == [name]  # and the one before it swapped out
        assert ps[0]["specli"]["drafter"] == ref["stats"]["mode"]
        assert (ps[0]["specli"]["draft"] or ps[0]["specli"]["drafter"]) == ref["draft"]  # a draft model's file
        if name == GEMMA:
            texts["langchain-ollama"] = OllamaLLM(model=name, base_url=server, temperature=0, num_predict=N).invoke(
                PROMPT)
            texts["openai"] = oa.completions.create(model=name, prompt=PROMPT, temperature=0, max_tokens=N).choices[
                0].text
        else:
            texts["langchain-ollama"] = ChatOllama(model=name, base_url=server, temperature=0,
                                                   num_predict=N).invoke(PROMPT).content
            texts["openai"] = oa.chat.completions.create(model=name, messages=msgs, temperature=0,
                                                         max_tokens=N).choices[0].message.content
        parted = {client: text for client, text in texts.items() if text != ref["text"]}
        if not parted:
            continue
        target = Model(ref["target"])  # where a text parts: the position and the target's top-2 margin
        try:
            ctx = Context(target, ContextConfig(n_ctx=CTX))
            for client, text in parted.items():
                other = tokens_of_text(target, ref["tokens"], text)
                assert_same_or_near_tie(ctx, ref["prompt_tokens"], ref["tokens"], other, f"{name} via {client}")
            ctx.close()
        finally:
            target.close()
    r = oc.chat(model=SMOL, messages=[], keep_alive=0)
    assert r.done_reason == "unload"
    assert httpx.get(server + "/api/ps").json()["models"] == []
