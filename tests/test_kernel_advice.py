"""The predicted verify cost said where people choose a file (check, pull, pairs, doctor, run),
and the same model in a clearly cheaper quant named with its --target, local and on the Hub.
Two quants of one tiny generated model; a FIXED kernel table installed as this machine's:
nothing here depends on this machine's kernels."""

from __future__ import annotations

import json
import os

import pytest
from clihelp import specli
from hubserver import HubServer, HubState, Repo
from storehelp import clean_env

from specli.hardware import calibrate, kernel_models

ROWS = [1, 2, 4, 8, 16, 32]
# Q4_0 repacked (8 rows cost 2 single rows), Q6_K row by row (8 rows cost 8)
TABLE = {"rows": ROWS, "types": {"Q4_0": [1e-9 * (1 + (r - 1) / 7) for r in ROWS],
                                 "Q6_K": [2e-9 * r for r in ROWS]}}
REPO = "tiny-org/Probe-GGUF"


@pytest.fixture(scope="module")
def quants(tmp_path_factory):
    d = tmp_path_factory.mktemp("probes")
    shape = kernel_models.Shape(d=256, ff=256, n_layer=1, n_head=4, n_vocab=512)
    return kernel_models.probe_models(d, ("Q4_0", "Q6_K"), shape)


@pytest.fixture()
def home(tmp_path, quants, monkeypatch):
    models = tmp_path / "mine"
    models.mkdir()
    for t, p in quants.items():
        os.link(p, models / f"probe-{t.lower()}.gguf")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECLI_CACHE", str(cache))
    calibrate.install_kernels(TABLE)
    env = clean_env(tmp_path, SPECLI_CACHE=cache, SPECLI_MODEL_DIRS=models,
                    SPECLI_CONFIG_DIR=tmp_path / "config")
    return env, models


def test_check_json_carries_the_curve_and_names_the_cheaper_quant(home):
    env, models = home
    rc, out, err = specli("check", str(models / "probe-q6_k.gguf"), "--json", env=env)
    assert rc == 0, err
    j = json.loads(out)
    assert len(j["verify_curve"]) == 16 and j["verify_curve"][0] == 1.0
    assert j["verify_8"] == pytest.approx(8.0, rel=0.01) and j["ceiling"] == pytest.approx(1.0, rel=0.01)
    rc, out, err = specli("check", str(models / "probe-q4_0.gguf"), env=env)
    assert rc == 0, err
    assert "8 tokens 2.0× one token" in out and "ceiling 5.09×" in out
    assert "--target" not in err  # already the cheapest
    rc, out, err = specli("check", str(models / "probe-q6_k.gguf"), env=env)
    assert rc == 0 and "8 tokens 8.0×" in out
    assert "as Q4_0 verifies clearly cheaper" in err and f"--target {models / 'probe-q4_0.gguf'}" in err


def test_pairs_doctor_and_run(home):
    env, models = home
    target = str(models / "probe-q6_k.gguf")
    rc, out, err = specli("pairs", target, "--json", env=env)
    assert rc == 0, err
    (p,) = json.loads(out)
    assert p["verify_8"] == pytest.approx(8.0, rel=0.01) and len(p["verify_curve"]) == 16
    rc, out, err = specli("pairs", target, env=env)
    assert rc == 0 and "8 tokens 8.0× one token (predicted)" in out, out + err
    rc, out, err = specli("doctor", env=env)
    assert rc == 0 and "verify cheaply on this CPU" in out and "Q4_0 2.0×" in out, out + err
    rc, out, err = specli("run", "--target", target, "--draft", "none", "-p", "hello", "-n", "2", env=env)
    assert rc == 0, err
    assert "--target" in err and "probe-q4_0.gguf" in err


def test_no_table_says_how_to_measure(home, tmp_path):
    env, models = home
    env = dict(env, SPECLI_CACHE=str(tmp_path / "empty"))
    rc, out, err = specli("check", str(models / "probe-q6_k.gguf"), env=env)
    assert rc == 0 and "specli doctor --kernels" in out and "--target" not in err
    rc, out, err = specli("check", str(models / "probe-q6_k.gguf"), "--json", env=env)
    assert rc == 0 and json.loads(out)["verify_curve"] is None


def test_hub_header_is_priced_remotely_check_and_pull(home, quants, tmp_path):
    env, _ = home
    state = HubState(repos={REPO: Repo({"probe-q6_k.gguf": str(quants["Q6_K"]),
                                        "probe-q4_0.gguf": str(quants["Q4_0"])})})
    with HubServer(state) as srv:
        env = dict(env, HF_ENDPOINT=srv.url, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0",
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        env.pop("SPECLI_MODEL_DIRS")
        rc, out, err = specli("check", f"{REPO}:Q6_K", "--json", env=env)
        assert rc == 0, err
        j = json.loads(out)
        assert j["verify_8"] == pytest.approx(8.0, rel=0.01)
        assert j["cheaper_quant"]["target"] == f"{REPO}:Q4_0" and j["cheaper_quant"]["verify_8"] == 2.0
        assert f"--target {REPO}:Q4_0" in err
        read = srv.state.served["probe-q4_0.gguf"]
        rc, out, err = specli("pull", f"{REPO}:Q6_K", env=env)
        assert srv.state.served["probe-q4_0.gguf"] == read  # its curve was remembered
        assert rc == 0 and "8 tokens 8.0×" in err and f"--target {REPO}:Q4_0" in err, out + err
        assert out.strip().endswith("probe-q6_k.gguf")  # stdout: the path alone


def test_a_profile_names_its_cpu_file_on_a_cpu(home, tmp_path):
    """A profile's cpu_target is named on a CPU run when the installed table says its type
    verifies cheaply here; never with another --target, never without a table, never switched."""
    env, models = home
    target = str(models / "probe-q6_k.gguf")
    prof = tmp_path / "probe.yaml"
    prof.write_text(f"name: probe\ntarget: {target}\ncpu_target: {REPO}:Q4_0\ndrafts: [lookup]\n")
    run = ["run", "--draft", "none", "-p", "hello", "-n", "2", "--gpu-layers", "0"]
    rc, out, err = specli(*run, "--profile", str(prof), env=env)
    assert rc == 0, err
    assert "profile probe names a CPU file of this model, Q4_0" in err and f"--target {REPO}:Q4_0" in err
    assert "8 tokens cost 2.0× one token" in err
    rc, out, err = specli(*run, "--profile", str(prof), "--target", target, env=env)
    assert rc == 0 and "CPU file" not in err, err  # the user named the file
    rc, out, err = specli("profiles", "show", str(prof), env=env)
    assert rc == 0 and f"cpu file:    {REPO}:Q4_0" in out, out + err
    # a table where Q4_0 is no cheaper than Q6_K here: nothing to say
    steep = {"rows": ROWS, "types": {"Q4_0": [1e-9 * r for r in ROWS], "Q6_K": [2e-9 * r for r in ROWS]}}
    calibrate.install_kernels(steep)
    rc, out, err = specli(*run, "--profile", str(prof), env=env)
    assert rc == 0 and "CPU file" not in err, err
    prof.write_text(f"name: probe\ntarget: {target}\ncpu_target: mtp\n")
    rc, out, err = specli(*run, "--profile", str(prof), env=env)
    assert rc != 0 and "cpu_target must be a model" in err and len(err.strip().splitlines()) == 1, err
