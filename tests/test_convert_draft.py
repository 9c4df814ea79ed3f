"""The draft is free to choose (issue 37, item 4): a copy of the draft model requantised by
llama.cpp's own quantizer into a type that runs fast here, offered where a FIXED kernel table
says it pays, cached by its source's SHA-256, used by --draft auto once made, and lossless:
the target's text is plain decoding's whatever drafts. Tiny f32 models; nothing here depends
on this machine's kernels."""

from __future__ import annotations

import json
import os

import pytest
from clihelp import specli
from storehelp import clean_env

from specli.hardware import calibrate, draft_offer
from specli.hardware.predict import matmul_weights
from specli.resolve import converted
from specli.resolve.gguf_header import read_gguf

ROWS = [1, 2, 4, 8, 16, 32]
# F32 read row by row at 4 ns a weight, Q4_0 at 1 ns (the table is fixed: not this machine's)
TABLE = {"rows": ROWS, "types": {"Q4_0": [1e-9 * (1 + (r - 1) / 7) for r in ROWS],
                                 "F32": [4e-9 * r for r in ROWS]}}
RUN = ["--raw", "--temp", "0", "-n", "40", "--json", "--prompt", "The quick brown fox jumps over the lazy dog"]


@pytest.fixture()
def home(tmp_path, monkeypatch, tiny_target, tiny_draft):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECLI_CACHE", str(cache))
    calibrate.install_kernels(TABLE)
    prof = tmp_path / "tinypair.yaml"
    prof.write_text(f"name: tinypair\ndescription: tiny pair\ntarget:\n  sources: [{tiny_target}]\n"
                    f"drafts:\n  - sources: [{tiny_draft}]\n")
    env = clean_env(tmp_path, SPECLI_CACHE=cache, SPECLI_CONFIG_DIR=tmp_path / "config")
    return env, str(prof)


def test_the_offer_prices_the_draft_in_target_tokens(tiny_target, tiny_draft):
    cost = draft_offer.pair_cost(tiny_target, tiny_draft, TABLE)
    assert cost.per_target and cost.shipped == pytest.approx(1.0)  # the tiny pair: one size
    assert cost.converted == pytest.approx(0.25) and cost.pays
    assert "1.00 of a target token as shipped, 0.25 of a target token with every matrix Q4_0" in cost.figures()
    assert "specli convert-draft d.gguf" in draft_offer.offer_line("d.gguf", cost)
    assert draft_offer.pair_cost(tiny_target, tiny_draft, None) is None
    cheap = {"rows": ROWS, "types": {"Q4_0": TABLE["types"]["Q4_0"], "F32": TABLE["types"]["Q4_0"]}}
    assert draft_offer.offer_line("d.gguf", draft_offer.pair_cost(tiny_target, tiny_draft, cheap)) is None


def test_conversion_makes_a_q4_0_gguf_once_and_finds_it_again(home, tiny_draft):
    assert converted.existing(tiny_draft) is None
    out, made = converted.convert(tiny_draft)
    assert made and out.parent == converted.folder() and out.name.endswith(".gguf")
    assert {t for _, t, _ in matmul_weights(read_gguf(str(out)))} == {"Q4_0"}
    assert {t for _, t, _ in matmul_weights(read_gguf(tiny_draft))} == {"F32"}
    assert not list(out.parent.glob("*.tmp"))  # written under a temporary name, renamed complete
    mtime = os.stat(out).st_mtime_ns
    again, made = converted.convert(tiny_draft)
    assert again == out and not made and os.stat(out).st_mtime_ns == mtime
    assert converted.existing(tiny_draft) == out == converted.existing(tiny_draft, "Q4_0")
    assert converted.existing(tiny_draft, "Q8_0") is None


def test_cli_offers_converts_and_auto_uses_the_copy_losslessly(home, tiny_target, tiny_draft):
    env, prof = home
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "none", *RUN, env=env)
    assert rc == 0, err
    plain = json.loads(out)
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, *RUN, env=env)
    assert rc == 0, err
    assert f"specli convert-draft {tiny_draft}" in err and "0.25 of a target token" in err
    assert json.loads(out)["tokens"] == plain["tokens"]

    rc, out, err = specli("convert-draft", prof, env=env)
    assert rc == 0, err
    copy = out.strip()
    assert os.path.isfile(copy) and "made:" in err and "0.25 of a target token" in err
    assert {t for _, t, _ in matmul_weights(read_gguf(copy))} == {"Q4_0"}
    rc, out, err = specli("convert-draft", tiny_draft, env=env)
    assert rc == 0 and out.strip() == copy and "already made" in err

    rc, out, err = specli("run", "--profile", prof, "--draft", "auto", *RUN, env=env)
    assert rc == 0, err
    j = json.loads(out)
    assert "using the converted copy" in err and j["draft"] == copy
    assert j["tokens"] == plain["tokens"] and j["stats"]["drafted"] > 0
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, *RUN, env=env)
    assert rc == 0 and f"--draft {copy}" in err  # named, not switched to: the user named a file


def test_cli_convert_draft_bad_input_is_one_line(home, tmp_path):
    env, _ = home
    rc, out, err = specli("convert-draft", str(tmp_path / "nope.gguf"), env=env)
    assert rc != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    rc, out, err = specli("convert-draft", str(tmp_path / "tinypair.yaml"), "--type", "Q9_9", env=env)
    assert rc != 0 and "Q9_9" in err and "Traceback" not in err, err
