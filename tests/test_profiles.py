"""Profiles: the shipped ones, user ones, and one-line errors naming the file, line and key."""

import pytest

from clihelp import specli
from specli import profile as profiles
from specli.errors import SpecliError

GOOD = """name: mine
description: my pair
target:
  sources:
    - org/Big-7B-GGUF:Q4_K_M
    - pypi:qwen2.5-coder-1.5b-instruct-q4_k_m
  sha256: cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
drafts:
  - org/Small-0.5B-GGUF:Q4_K_M
defaults:
  draft_max: 12
  ctx: 2048
"""


def test_parse_a_good_profile():
    p = profiles.parse_profile(GOOD, "mine.yaml")
    assert p.name == "mine" and p.target.sources == ("org/Big-7B-GGUF:Q4_K_M",
                                                    "pypi:qwen2.5-coder-1.5b-instruct-q4_k_m")
    assert p.target.sha256.startswith("cc324a") and p.drafts[0].ref == "org/Small-0.5B-GGUF:Q4_K_M"
    assert p.defaults == {"draft_max": 12, "ctx": 2048}


@pytest.mark.parametrize("text, msg", [
    (GOOD.replace("  draft_max: 12", "  draft_mx: 12"), "mine.yaml:11: unknown key 'draft_mx' in defaults"),
    (GOOD.replace("drafts:", "draftz:"), "mine.yaml:8: unknown key 'draftz'"),
    (GOOD.replace("  sha256: cc", "  sha: cc"), "mine.yaml:7: unknown key 'sha' in target"),
    (GOOD.replace("  sha256: cc324a", "  sha256: zz324a"), "mine.yaml:7: sha256 must be 64 hexadecimal digits"),
    ("name: x\ntarget: [a, b\n", "mine.yaml:3: invalid YAML"),
    ("name: x\n", "mine.yaml:1: missing key 'target'"),
    ("- a\n- b\n", "mine.yaml:1: a profile is a mapping"),
    ("name: x\ntarget: !!python/object:os.system {}\n", "mine.yaml"),  # safe_load refuses python tags
])
def test_bad_profiles_name_file_line_and_key(text, msg):
    with pytest.raises(SpecliError) as e:
        profiles.parse_profile(text, "mine.yaml")
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)


def test_shipped_profiles():
    profs = profiles.load_all()
    for name in ("default", "qwen2.5-coder-7b", "qwen2.5-coder-14b", "qwen2.5-coder-32b", "qwen2.5-7b",
                 "qwen2.5-14b", "qwen2.5-32b", "llama-3.1-8b", "llama-3.3-70b", "gemma-3-4b", "gemma-3-12b",
                 "gemma-3-27b"):
        assert name in profs and profs[name].drafts
    d = profs["default"]
    # the Hub first, the PyPI wheels second, pinned by SHA-256
    assert d.target.sources[0].startswith("Qwen/") and d.target.sources[1].startswith("pypi:")
    assert d.target.sha256 and d.drafts[0].sha256 and d.drafts[0].sources[1].startswith("pypi:")
    assert profiles.for_target("pypi:qwen2.5-coder-1.5b-instruct-q4_k_m").name == "default"
    assert profiles.for_target("/x/cc324af070c2-qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                               "/x/cc324af070c2-qwen2.5-coder-1.5b-instruct-q4_k_m.gguf").name == "default"
    assert profiles.for_target("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M").name == "qwen2.5-coder-7b"
    assert profiles.for_target("some/Other-GGUF:Q4_K_M") is None


def test_user_profiles_and_the_cli(tmp_path, monkeypatch):
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "mine.yaml").write_text(GOOD)
    env = {"SPECLI_CONFIG_DIR": str(tmp_path)}
    import os
    env = dict(os.environ, **env)
    rc, out, err = specli("profiles", env=env)
    assert rc == 0 and "mine" in out and "default" in out
    rc, out, err = specli("profiles", "show", "mine", env=env)
    assert rc == 0 and "org/Small-0.5B-GGUF:Q4_K_M" in out and "default draft_max: 12" in out
    (d / "broken.yaml").write_text("name: b\ntarget: x\nextra: 1\n")
    rc, out, err = specli("profiles", env=env)
    assert rc != 0 and err.strip() == f"specli: error: {d / 'broken.yaml'}:3: unknown key 'extra' " \
                                      "(allowed: defaults, description, drafts, name, target)"
    rc, out, err = specli("profiles", "show", "nope", env=dict(env, SPECLI_CONFIG_DIR=str(tmp_path / "none")))
    assert rc != 0 and "no profile named 'nope'" in err
