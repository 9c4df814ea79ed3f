"""Profiles: the shipped ones, user ones, and one-line errors naming the file, line and key."""

import pytest
from clihelp import specli

from specli.errors import SpecliError
from specli.resolve import profiles

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
    rc, out, err = specli("profiles", "show", "nope", env=dict(env, SPECLI_CONFIG_DIR=str(tmp_path / "none")))
    assert rc != 0 and "no profile named 'nope'" in err


def test_a_broken_user_profile_breaks_only_itself(tmp_path):
    import os
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "mine.yaml").write_text(GOOD)
    (d / "broken.yaml").write_text("name: b\ntarget: x\nextra: 1\n")
    env = dict(os.environ, SPECLI_CONFIG_DIR=str(tmp_path))
    why = f"{d / 'broken.yaml'}:3: unknown key 'extra' (allowed: {', '.join(sorted(profiles.TOP_KEYS))})"
    # the others are listed and usable; the broken one is named once, with the parser's file:line
    rc, out, err = specli("profiles", env=env)
    listed = [line.split()[0] for line in out.splitlines()]
    assert rc == 0 and "mine" in listed and "default" in listed and "b" not in listed
    assert err == f"specli: ignoring a broken profile: {why}\n"
    rc, out, err = specli("profiles", "show", "mine", env=env)
    assert rc == 0 and "org/Small-0.5B-GGUF:Q4_K_M" in out and err == f"specli: ignoring a broken profile: {why}\n"
    # asking for the broken one (its name is the file stem) is the one thing that fails
    rc, out, err = specli("profiles", "show", "broken", env=env)
    assert rc == 1 and err == f"specli: error: {why}\n"
    # a file that is not UTF-8 is broken the same way
    (d / "latin.yaml").write_bytes("name: caf\xe9\ntarget: x\n".encode("latin-1"))
    rc, out, err = specli("profiles", env=env)
    assert rc == 0 and "mine" in out and len(err.splitlines()) == 2 and "latin.yaml is not UTF-8 text" in err


def test_broken_profiles_are_reported_once_a_process(tmp_path, monkeypatch):
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "broken.yaml").write_text("name: [\n")
    (d / "default.yaml").write_text("name: default\ntarget: x\ndraftz: [y]\n")
    monkeypatch.setenv("SPECLI_CONFIG_DIR", str(tmp_path))
    notes: list[str] = []
    monkeypatch.setattr(profiles, "warn", notes.append)
    monkeypatch.setattr(profiles, "_reported", set())
    for _ in range(3):
        assert "qwen2.5-7b" in profiles.load_all()
    assert profiles.get("qwen2.5-7b").name == "qwen2.5-7b"
    assert profiles.for_target("Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M").name == "qwen2.5-7b"
    assert sorted(n.split(": ", 1)[1].split(":")[0] for n in notes) == [str(d / "broken.yaml"),
                                                                        str(d / "default.yaml")]
    # a broken user file named like a shipped profile is what the user asked for: refused, not
    # silently replaced by the shipped one
    with pytest.raises(SpecliError, match=r"default\.yaml:3: unknown key 'draftz'"):
        profiles.get("default")


def test_a_profile_given_as_a_path(tmp_path, tiny_target):
    import os
    (tmp_path / "x.yaml").write_text(f"name: my-pair\ntarget: {tiny_target}\n")
    env = dict(os.environ, SPECLI_CONFIG_DIR=str(tmp_path / "config"))
    rc, out, err = specli("profiles", "show", "./x.yaml", env=env, cwd=tmp_path)
    assert rc == 0 and "name:        my-pair" in out and "file:        ./x.yaml" in out and tiny_target in out
    rc, out, err = specli("run", "--plan", "--profile", "./x.yaml", "--draft", "lookup", env=env, cwd=tmp_path)
    assert rc == 0, err
    assert f"target       {os.path.basename(tiny_target)}:" in out  # the profile is the only place it is named
    rc, out, err = specli("run", "--plan", "--profile", "./nope.yaml", env=env, cwd=tmp_path)
    assert rc == 1 and err == "specli: error: profile file not found: ./nope.yaml\n"
    # a name is still a name
    assert profiles.is_path("./x.yaml") and profiles.is_path("other.yml") and not profiles.is_path("default")


def test_drafts_may_name_mtp_or_lookup():
    p = profiles.parse_profile("name: q\ntarget: org/Q-GGUF:Q4_K_M\ndrafts: [mtp, lookup, org/S-GGUF:Q8_0]\n",
                               "q.yaml")
    assert [d.sources for d in p.drafts] == [("mtp",), ("lookup",), ("org/S-GGUF:Q8_0",)]
    assert [d.kind for d in p.drafts] == ["mtp", "lookup", "model"]
    assert p.wants_mtp and [d.ref for d in p.draft_models] == ["org/S-GGUF:Q8_0"]
    assert not profiles.parse_profile(GOOD, "mine.yaml").wants_mtp
    with pytest.raises(SpecliError, match=r"^q\.yaml:2: target must be a model, not 'mtp'"):
        profiles.parse_profile("name: q\ntarget: mtp\n", "q.yaml")
    with pytest.raises(SpecliError, match=r"^q\.yaml:5: 'mtp' and 'lookup' are drafters, not model sources"):
        profiles.parse_profile("name: q\ntarget: a/B-GGUF:Q4_K_M\ndrafts:\n  - sources:\n      - mtp\n", "q.yaml")


# the 2026 families: MTP where the family ships MTP layers (qwen3-next: in an MTP-only sidecar file), else lookup
NEW_FAMILIES = {"qwen3.5-9b": "mtp", "qwen3.5-27b": "mtp", "qwen3.5-35b-a3b": "mtp", "qwen3-next-80b-a3b": "model",
                "glm-4.5-air": "mtp", "lfm2-8b-a1b": "lookup", "granite-4.0-h-small": "lookup",
                "nemotron-3-nano-30b-a3b": "lookup"}


def test_shipped_profiles_for_the_2026_families():
    from specli.resolve import hub
    profs = profiles.load_all()
    for name, kind in NEW_FAMILIES.items():
        assert profs[name].drafts[0].kind == kind, name
        assert profs[name].description
    for p in profs.values():  # every shipped reference is one the resolver understands
        for spec in [p.target, *p.draft_models]:
            h = hub.parse_hub_ref(spec.ref)
            assert spec.ref.startswith("pypi:") or (h and (h.quant or h.filename)), (p.name, spec.ref)
