"""Every model on disk behind one server (``specli serve`` with no model option), end to end
with the official ``ollama`` client, langchain-ollama and the official ``openai`` client, on
tiny models in a fresh HOME with no network: two chat models and a draft in an Ollama store,
one model in an LM Studio folder. Each greedy answer equals ``specli run --target REF --draft
auto`` on that model; /api/ps, keep_alive, --max-loaded, unknown names, a vanished file and a
request that arrives during its model's load."""

import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from clihelp import specli
from conftest import DRAFT_KW, TARGET_KW, TEST_CACHE
from langchain_ollama import ChatOllama
from storehelp import clean_env, isolate_home, link, ollama_model
from tinymodels import tiny_model

from specli.serve.app import create_app
from specli.serve.models import Models
from specli.serve.runner import background
from specli.session import Options

CTX = 512
N = 12
PROMPT = "Tell me about lighthouses."
BIG_KW = dict(TARGET_KW, d=256, ff=512, metadata={"general.basename": "Tiny"})
OTHER_KW = dict(BIG_KW, seed=3)
FAMILY_DRAFT_KW = dict(DRAFT_KW, metadata={"general.basename": "Tiny"})
LMS = "tiny-org/Tiny-Target-GGUF"
NAMES = ["tiny-big:latest", "tiny-other:latest", "tiny-draft:latest", LMS]


def until(cond, timeout=60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture(scope="module")
def home(tmp_path_factory, smol_gguf, tiny_target):
    """A fresh HOME (in this process and the CLI's): two chat models and a draft of their family
    in Ollama's store, a smaller model in LM Studio's; the Hub offline."""
    h = tmp_path_factory.mktemp("many") / "home"
    h.mkdir()
    big, other = tiny_model(TEST_CACHE, smol_gguf, **BIG_KW), tiny_model(TEST_CACHE, smol_gguf, **OTHER_KW)
    draft = tiny_model(TEST_CACHE, smol_gguf, **FAMILY_DRAFT_KW)
    oll = h / ".ollama" / "models"
    ollama_model(oll, "tiny-big:latest", big)
    ollama_model(oll, "tiny-other:latest", other)
    ollama_model(oll, "tiny-draft:latest", draft)
    link(tiny_target, h / ".lmstudio" / "models" / LMS / "tiny-target-q8_0.gguf")
    with pytest.MonkeyPatch.context() as mp:
        isolate_home(mp, h)
        yield h


def serve(**kw):
    models = Models(Options(n_ctx=CTX), **kw)
    return models, background(create_app(models=models))


@pytest.fixture(scope="module")
def server(home):
    models, bg = serve()
    with bg as url:
        yield url, models
    models.stop()


@pytest.fixture(scope="module")
def refs(home):
    """What each listed model is as ``specli run --target`` takes it, and its greedy answer."""
    out = {}
    env = clean_env(home, SPECLI_CONFIG_DIR=home / ".config" / "specli")
    for e in Models(Options()).rescan().entries:
        rc, so, se = specli("run", "--target", e.ref, "--draft", "auto", "--ctx", str(CTX), "--temp", "0", "-n", str(N),
                            "--json", "--prompt", PROMPT, env=env)
        assert rc == 0, se
        out[e.name] = json.loads(so)
    return out


def names(url) -> list[str]:
    return [m.model for m in ollama.Client(host=url).list().models]


def test_every_model_is_listed_with_its_role(server):
    url, _ = server
    assert sorted(names(url)) == sorted(NAMES)
    tags = {m["name"]: m for m in httpx.get(url + "/api/tags").json()["models"]}
    roles = {n: m["specli"]["role"] for n, m in tags.items()}
    assert roles["tiny-big:latest"] == roles["tiny-other:latest"] == "model" and roles["tiny-draft:latest"] == "draft"
    assert tags["tiny-big:latest"]["details"]["family"] == "llama" and tags["tiny-big:latest"]["size"] > 0
    listed = openai.OpenAI(base_url=url + "/v1", api_key="x").models.list()
    assert sorted(m.id for m in listed.data) == sorted(NAMES)


def test_each_model_answers_as_specli_run(server, refs):
    url, _ = server
    oc = ollama.Client(host=url, timeout=300)
    oa = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    msgs = [{"role": "user", "content": PROMPT}]
    for name in NAMES:
        want = refs[name]["text"]
        assert len(want) > 5
        first = oc.chat(model=name, messages=msgs, options={"temperature": 0, "num_predict": N})
        assert first.message.content == want and first.load_duration > 0, name
        again = oc.chat(model=name, messages=msgs, options={"temperature": 0, "num_predict": N})
        assert again.message.content == want and again.load_duration == 0
        lc = ChatOllama(model=name, base_url=url, temperature=0, num_predict=N)
        assert lc.invoke(PROMPT).content == want, name
        r = oa.chat.completions.create(model=name, messages=msgs, temperature=0, max_tokens=N)
        assert r.choices[0].message.content == want, name
    ps = {m["name"]: m for m in httpx.get(url + "/api/ps").json()["models"]}
    assert set(ps) == set(NAMES)
    big = ps["tiny-big:latest"]
    assert big["specli"]["draft"] == refs["tiny-big:latest"]["draft"] and big["specli"]["draft"].startswith(str(
        Path.home() / ".ollama"))
    assert big["size"] > 0 and big["expires_at"] and big["context_length"] == CTX


def test_an_empty_request_loads_and_keep_alive_0_unloads(server):
    url, _ = server
    oc = ollama.Client(host=url, timeout=300)
    r = oc.generate(model="tiny-other", keep_alive="10m")
    assert r.done_reason == "load"
    assert "tiny-other:latest" in [m.model for m in oc.ps().models]
    r = oc.chat(model="ollama:tiny-other:latest", messages=[], keep_alive=0)
    assert r.done_reason == "unload"
    assert until(lambda: "tiny-other:latest" not in [m.model for m in oc.ps().models])
    r = oc.chat(model="tiny-other", messages=[{"role": "user", "content": "hi"}], keep_alive=0,
                options={"temperature": 0, "num_predict": 2})
    assert r.eval_count == 2 and r.load_duration > 0
    assert "tiny-other:latest" not in [m.model for m in oc.ps().models]  # answered, then unloaded


def test_unknown_names_get_a_404_naming_the_nearest(server):
    url, _ = server
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url).chat(model="tiny-bgi", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and "model 'tiny-bgi' not found" in e.value.error
    assert "tiny-big:latest" in e.value.error
    r = httpx.post(url + "/api/generate", json={"model": "nope", "prompt": "hi"})
    assert r.status_code == 404 and list(r.json()) == ["error"]
    with pytest.raises(openai.NotFoundError) as oe:
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="tiny-bgi", messages=[{"role": "user", "content": "hi"}])
    assert "tiny-big:latest" in str(oe.value)


def test_show_describes_a_model_without_loading_it(home):
    """Clients ask /api/show for every model they list: it answers from the header and the
    placement, loads nothing, and takes the old ``name`` field too."""
    models, bg = serve()
    with bg as url:
        shown = ollama.Client(host=url).show("tiny-big")
        assert shown.details.family == "llama" and "completion" in shown.capabilities
        draft = {m["name"]: m["digest"] for m in httpx.get(url + "/api/tags").json()["models"]}["tiny-draft:latest"]
        assert shown.modelfile.startswith(f"# served by specli (drafter: hybrid, once loaded)\n# draft: sha256-{draft}")
        old = httpx.post(url + "/api/show", json={"name": "tiny-big:latest"}).json()
        assert old["details"] == shown.details.model_dump(exclude_none=True) | old["details"]
        assert httpx.get(url + "/api/ps").json()["models"] == []  # nothing loaded
        r = httpx.post(url + "/api/show", json={"model": "tiny-bgi"})
        assert r.status_code == 404 and "tiny-big:latest" in r.json()["error"]
        assert httpx.post(url + "/api/show", json={}).status_code == 400
        ollama.Client(host=url).generate(model="tiny-big")  # loaded: the card of what runs
        assert ollama.Client(host=url).show("tiny-big").modelfile.startswith("# served by specli (drafter: hybrid)\n")
    models.stop()


def test_writes_into_stores_are_refused(server):
    url, _ = server
    for method, path in (("DELETE", "/api/delete"), ("POST", "/api/create"), ("POST", "/api/copy"),
                         ("POST", "/api/push")):
        r = httpx.request(method, url + path, json={"model": "tiny-big"})
        assert 400 <= r.status_code < 500 and "never writes into another tool's model store" in r.json()["error"]


def test_max_loaded_1_swaps_models(home):
    models, bg = serve(max_loaded=1)
    with bg as url:
        oc = ollama.Client(host=url, timeout=300)
        for name in ("tiny-big:latest", "tiny-draft:latest", "tiny-big:latest"):
            oc.chat(model=name, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
            assert [m.model for m in oc.ps().models] == [name]
    models.stop()


def test_a_vanished_file_fails_only_its_request(home, tmp_path, smol_gguf):
    gone = tmp_path / "gone.gguf"
    gone.write_bytes(tiny_model(TEST_CACHE, smol_gguf, **dict(TARGET_KW, seed=5)).read_bytes())
    blob = ollama_model(home / ".ollama" / "models", "tiny-gone:latest", gone)
    models, bg = serve()
    try:
        with bg as url:
            assert "tiny-gone:latest" in names(url)
            os.unlink(blob)
            hi = {"model": "tiny-gone", "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(url + "/api/chat", json=hi, timeout=300)
            assert 400 <= r.status_code < 600 and list(r.json()) == ["error"] and "\n" not in r.json()["error"]
            assert "tiny-gone:latest" not in names(url)
            ok = ollama.Client(host=url).chat(model="tiny-draft", messages=[{"role": "user", "content": "hi"}],
                                              options={"num_predict": 2})
            assert ok.eval_count == 2
    finally:
        models.stop()
        for p in (home / ".ollama" / "models" / "manifests").rglob("tiny-gone"):
            shutil.rmtree(p)


def test_a_file_truncated_after_discovery_fails_only_its_request_and_holds_nothing(home, tmp_path, smol_gguf):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model(TEST_CACHE, smol_gguf, **dict(TARGET_KW, seed=6)).read_bytes())
    blob = ollama_model(home / ".ollama" / "models", "tiny-cut:latest", cut)
    models, bg = serve()
    try:
        with bg as url:
            assert "tiny-cut:latest" in names(url)
            with open(blob, "r+b") as f:
                f.truncate(os.path.getsize(blob) // 2)
            r = httpx.post(url + "/api/chat", json={"model": "tiny-cut", "messages": [{"role": "user",
                                                                                       "content": "hi"}]}, timeout=300)
            err = r.json()["error"]
            assert 400 <= r.status_code < 600 and "\n" not in err and "tiny-cut" in err, err
            assert models.pool.residents() == [] and httpx.get(url + "/api/ps").json()["models"] == []
            ok = ollama.Client(host=url).chat(model="tiny-draft", messages=[{"role": "user", "content": "hi"}],
                                              options={"num_predict": 2})
            assert ok.eval_count == 2
    finally:
        models.stop()
        for p in (home / ".ollama" / "models" / "manifests").rglob("tiny-cut"):
            shutil.rmtree(p)


def test_a_request_never_waits_on_another_models_generation(home):
    """Each loaded model has its own worker: one model held mid-answer, another answers."""
    from servehelp import hooked_worker
    workers = {}

    def make(session, queue):
        workers[session.target.path] = hooked_worker(session, queue)
        return workers[session.target.path]

    models, bg = serve(worker=make)
    go_on, held = threading.Event(), threading.Event()
    with bg as url:
        oc = ollama.Client(host=url, timeout=300)
        oc.generate(model="tiny-big")
        big = workers[models.find("tiny-big").path]
        big.after_chunk = lambda job, n: (held.set(), go_on.wait(120))
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("big", oc.chat(
            model="tiny-big", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4})))
        t.start()
        assert held.wait(120)
        other = oc.chat(model="tiny-other", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4})
        assert other.eval_count == 4 and "big" not in got  # answered while tiny-big is held mid-answer
        go_on.set()
        t.join(120)
        assert got["big"].eval_count == 4
    models.stop()


class GatedModels(Models):
    """Loads wait for ``gate``."""

    gate = threading.Event()

    def _load(self, want):
        assert self.gate.wait(120)
        return super()._load(want)


def test_requests_during_a_load_wait_for_it_and_a_leaving_client_cancels_only_its_own(home):
    models = GatedModels(Options(n_ctx=CTX))
    with background(create_app(models=models)) as url:
        body = {"model": "tiny-draft", "messages": [{"role": "user", "content": "hi"}], "stream": False,
                "options": {"temperature": 0, "num_predict": 3}}
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("r", httpx.post(url + "/api/chat", json=body, timeout=300)))
        t.start()
        assert until(lambda: any(r.refs == 1 for r in models.pool.residents()))
        # a second client asks, then leaves while the model still loads
        host, port = url.removeprefix("http://").split(":")
        data = json.dumps(body).encode()
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        assert until(lambda: any(r.refs == 2 for r in models.pool.residents()))
        s.close()
        assert until(lambda: any(r.refs == 1 for r in models.pool.residents()))
        GatedModels.gate.set()
        t.join(300)
        r = got["r"]
        assert r.status_code == 200 and r.json()["eval_count"] == 3 and r.json()["load_duration"] > 0
    models.stop()


def test_a_chosen_set_lists_only_those(home):
    models = Models(Options(n_ctx=CTX), only=["ollama:tiny-big", f"lmstudio:{LMS}"])
    with background(create_app(models=models)) as url:
        assert sorted(names(url)) == sorted(["tiny-big:latest", LMS])
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=url).chat(model="tiny-other", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 404
    models.stop()


def test_specli_serve_with_no_model_option_serves_all_and_pulls_from_the_hub(home, tiny_target):
    """The CLI end to end: every model listed, /api/pull into the HF cache with Ollama's progress
    lines, the pulled model listed and answering, Ctrl-C stops."""
    import signal
    import subprocess

    from faulthelp import start, wait_for
    from hubserver import HubServer, HubState, Repo
    repo = "tiny-org/Tiny-Pulled-GGUF"
    state = HubState(repos={repo: Repo({"tiny-pulled-q8_0.gguf": tiny_target})})
    with HubServer(state) as hub:
        env = clean_env(home, SPECLI_CONFIG_DIR=home / ".config" / "specli", HF_HUB_OFFLINE="0", HF_ENDPOINT=hub.url,
                        HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        proc = start("serve", "--port", "0", "--ctx", str(CTX), "--max-loaded", "1", env=env)
        try:
            lines: list[str] = []
            wait_for("the server to listen", lambda: lines.append(proc.stderr.readline()) or "serving" in lines[-1],
                     300)
            assert "serving 4 models (every model on disk" in lines[-1], lines
            url = re.search(r"(http://\S+)/v1 ", lines[-1]).group(1)
            assert sorted(names(url)) == sorted(NAMES)
            with httpx.stream("POST", url + "/api/pull", json={"model": f"hf.co/{repo}:Q8_0"}, timeout=300) as r:
                assert r.headers["content-type"] == "application/x-ndjson"
                pulled = [json.loads(x) for x in r.iter_lines() if x]
            assert pulled[0] == {"status": "pulling manifest"} and pulled[-1] == {"status": "success"}, pulled
            size, sha = os.path.getsize(tiny_target), hashlib.sha256(open(tiny_target, "rb").read()).hexdigest()
            progress = [(p["completed"], p["total"]) for p in pulled if p.get("digest") == f"sha256:{sha}"]
            assert progress[0] == (0, size) and progress[-1] == (size, size), pulled  # bytes as they arrive
            assert all(p["status"] == f"pulling {sha[:12]}" for p in pulled if "digest" in p)
            new = [n for n in names(url) if "Tiny-Pulled-GGUF" in n]
            assert len(new) == 1, names(url)
            r = ollama.Client(host=url, timeout=300).chat(model=new[0], messages=[{"role": "user", "content": "hi"}],
                                                          options={"num_predict": 3})
            assert r.eval_count == 3
            r = httpx.post(url + "/api/pull", json={"model": "nothing", "stream": False})
            assert r.status_code == 400 and "Hugging Face Hub" in r.json()["error"]
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_a_drafting_head_is_listed_but_not_chatted_with(home, tmp_path, monkeypatch, smol_gguf):
    from tinyheads import tiny_head_model
    link(tiny_head_model(TEST_CACHE, smol_gguf, "eagle3-full"), tmp_path / "heads" / "tiny-eagle3.gguf")
    monkeypatch.setenv("SPECLI_MODEL_DIRS", str(tmp_path / "heads"))
    models = Models(Options(n_ctx=CTX))
    with background(create_app(models=models)) as url:
        roles = {m["name"]: m["specli"]["role"] for m in httpx.get(url + "/api/tags").json()["models"]}
        assert roles["tiny-eagle3"] == "head"
        r = httpx.post(url + "/api/chat", json={"model": "tiny-eagle3", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "drafting head" in r.json()["error"]
        r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny-eagle3",
                                                          "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "not_a_chat_model"
    models.stop()
