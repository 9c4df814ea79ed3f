"""One drafter registry, one vocabulary: every mode builds through the registry and decodes the
target's own text, every command names modes with the same words, the decision is a frozen
plan that never writes back into the options, and a wrong name is one line."""

import dataclasses
import json

import pytest
import typer
from clihelp import specli
from conftest import TEST_CACHE
from tiny2026 import tiny_2026_model
from tinyheads import tiny_head_model

from specli.cli.common import app
from specli.errors import SpecliError
from specli.session import Options, Session
from specli.speculate import registry
from specli.speculate.drafters import PaidDrafter
from specli.speculate.registry import MODES, DraftKind, DraftMode
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams

PROMPT = "Once upon a time"


def _tokens(sess: Session, mode) -> tuple[list[int], str]:
    sess.ctx.clear()
    drafter = sess.drafter_for(mode)
    resp = sess.generate(sess.target.tokenize(PROMPT), SamplingParams(), 24, drafter)
    return [t for ch in resp for t in ch.tokens], resp.stats.mode


def test_every_kind_has_an_entry_and_every_mode_a_name():
    assert set(registry.REGISTRY) == set(DraftKind)
    assert list(MODES) == ["none", "lookup", "lookup-history", "lookup-fixed", "model", "hybrid", "model-fixed",
                           "mtp", "mtp-lookup", "mtp-fixed", "eagle3", "eagle3-lookup", "eagle3-fixed",
                           "dflash", "dflash-lookup", "dflash-fixed"]
    assert all(registry.mode(name).name == name for name in MODES)
    # --fixed on a kind with two sources drafts with its paid one alone; none has no length policy
    assert registry.mode_for(DraftKind.HYBRID, adaptive=False) == MODES["model-fixed"]
    assert registry.mode_for(DraftKind.MTP_LOOKUP, adaptive=False) == MODES["mtp-fixed"]
    assert registry.mode_for(DraftKind.NONE, adaptive=True) == MODES["none"]
    assert registry.with_lookup(DraftKind.MODEL, True) is DraftKind.HYBRID
    assert registry.with_lookup(DraftKind.MTP_LOOKUP, False) is DraftKind.MTP


def test_an_unknown_mode_is_one_line():
    with pytest.raises(SpecliError, match=r"unknown drafter mode 'plain' \(plain decoding is 'none'\); one of: none, "):
        registry.mode("plain")
    # before any model loads: the target does not even exist
    rc, out, err = specli("bench", "--target", "/nowhere/model.gguf", "--modes", "none,hybird")
    assert rc == 1 and out == ""
    assert err == "specli: error: unknown drafter mode 'hybird'; one of: " + ", ".join(MODES) + "\n"


def test_every_mode_builds_and_keeps_the_target_text(tiny_target, tiny_draft, smol_gguf):
    """The registry builds each mode over a session's models; every one decodes exactly the
    target's greedy text, and the stats name the mode as the registry does."""
    mtp_target = str(tiny_2026_model(TEST_CACHE, smol_gguf, "qwen35-mtp-full"))
    pair = Session(Options(target=tiny_target, draft=tiny_draft), build_drafter=False)
    mtp = Session(Options(target=mtp_target, draft="mtp", f32_kv=True), build_drafter=False)
    # drafting heads in their own files: an MTP-only sidecar (the MTP modes), an EAGLE-3 and a DFlash head
    trunk, sidecar = (str(tiny_2026_model(TEST_CACHE, smol_gguf, f"qwen35-{k}-full")) for k in ("trunk", "mtp-only"))
    side = Session(Options(target=trunk, draft=sidecar, f32_kv=True), build_drafter=False)
    bigram, head = (str(tiny_head_model(TEST_CACHE, smol_gguf, k)) for k in ("bigram", "eagle3-full"))
    eagle = Session(Options(target=bigram, draft=head, f32_kv=True), build_drafter=False)
    copy, dhead = (str(tiny_head_model(TEST_CACHE, smol_gguf, k)) for k in ("copy", "dflash-full"))
    dflash = Session(Options(target=copy, draft=dhead, f32_kv=True), build_drafter=False)
    built = set()
    try:
        assert side.draft.head == sidecar and side.draft.mtp and not side.draft.loads_mtp
        assert eagle.draft.head == head and eagle.draft.kind is DraftKind.EAGLE3_LOOKUP
        assert dflash.draft.head == dhead and dflash.draft.kind is DraftKind.DFLASH_LOOKUP
        for sess in (pair, mtp, side, eagle, dflash):
            plain, _ = _tokens(sess, "none")
            for m in sess.modes():
                sess.prepare(m)
                out, said = _tokens(sess, m)
                assert out == plain and said == m.name, m
                built.add(m.name)
        assert built == set(MODES)
        # a mode the session's models cannot draft in is refused, not approximated
        with pytest.raises(SpecliError, match="cannot draft in mode 'mtp'"):
            pair.drafter_for("mtp")
        assert isinstance(pair.paid(DraftKind.MODEL), PaidDrafter) and pair.paid(DraftKind.MODEL).token_cost() > 0
        assert isinstance(mtp.paid(DraftKind.MTP), PaidDrafter) and mtp.paid(DraftKind.MTP).token_cost() > 0
        assert eagle.paid(DraftKind.EAGLE3).token_cost() > 0 and side.paid(DraftKind.MTP).token_cost() > 0
        assert dflash.paid(DraftKind.DFLASH).token_cost() > 0
    finally:
        for sess in (pair, mtp, side, eagle, dflash):
            sess.close()


def test_the_plan_is_decided_once_and_never_written_into_the_options(tiny_target, tiny_draft):
    opts = Options(target=tiny_target, draft=tiny_draft, spec=SpecSettings(adaptive=False))
    before = dataclasses.replace(opts, notes=[], spec=dataclasses.replace(opts.spec))
    sess = Session(opts)
    try:
        assert sess.draft.mode == MODES["model-fixed"] and sess.draft.draft_path == tiny_draft
        assert sess.drafter.name == "model-fixed"
        with pytest.raises(dataclasses.FrozenInstanceError):
            sess.draft.mode = MODES["none"]
        assert dataclasses.replace(opts, notes=[]) == before and not hasattr(opts, "drafter")
    finally:
        sess.close()


def _params(command: str) -> dict:
    cmd = typer.main.get_command(app).commands[command]
    return {p.name: p for p in cmd.params}


def test_every_command_takes_the_same_words(tiny_target, tmp_path):
    """run, chat, serve, bench and export share --draft (and its help); run, chat and serve
    the speculation options; bench's --modes and every report use the registry's names."""
    commands = ("run", "chat", "serve", "bench", "export")
    params = {c: _params(c) for c in commands}
    for c in commands:
        assert params[c]["draft"].help == params["run"]["draft"].help, c
        assert params[c]["draft_max"].default == params["run"]["draft_max"].default, c
    for c in ("chat", "serve"):
        for opt in ("adaptive", "lookup", "draft_p_min", "draft_gpu_layers"):
            assert opt in params[c], (c, opt)
    assert all(name in params["bench"]["modes"].help for name in MODES)
    # one mode, one name: run's stats, bench's report, chat's reply line, the server's health
    suite = tmp_path / "s.yaml"
    suite.write_text("prompts:\n  - id: one\n    text: Hello there\n")
    rc, out, err = specli("run", "--target", tiny_target, "--draft", "lookup", "--fixed", "--raw", "-n", "8",
                          "--prompt", "Hello there", "--json")
    assert rc == 0, err
    assert json.loads(out)["stats"]["mode"] == "lookup-fixed"
    rc, out, err = specli("bench", "--target", tiny_target, "--draft", "lookup", "--suite", str(suite), "-n", "8",
                          "--modes", "none,lookup-fixed", "--json")
    assert rc == 0, err
    assert list(json.loads(out)["modes"]) == ["none", "lookup-fixed"]
    rc, out, err = specli("chat", "--target", tiny_target, "--draft", "lookup", "--fixed", "-n", "8",
                          stdin="Hello\n/exit\n")
    assert rc == 0, err
    assert "drafter lookup-fixed" in out and "mode lookup-fixed" in out
    from fastapi.testclient import TestClient

    from specli.serve.app import create_app
    sess = Session(Options(target=tiny_target, draft="lookup", spec=SpecSettings(adaptive=False)))
    try:
        with TestClient(create_app(sess)) as client:
            assert client.get("/health").json()["mode"] == "lookup-fixed"
    finally:
        sess.close()


def test_draft_mode_names_are_stable():
    assert str(DraftMode(DraftKind.MTP_LOOKUP)) == "mtp-lookup"
    assert f"{DraftKind.HYBRID}" == "hybrid" and DraftKind("mtp-lookup") is DraftKind.MTP_LOOKUP
