"""One construction path: every command takes its defaults from one record and builds its
models through the session (profile, hardware plan, drafters); bench reports where the
models ran."""

import inspect
import json
import os
import signal
import stat
import sys

import pexpect
from clihelp import specli
from faulthelp import start, wait_for

from specli.cli import bench as bench_cli
from specli.cli import chat as chat_cli
from specli.cli import export as export_cli
from specli.cli import run as run_cli
from specli.cli import serve as serve_cli
from specli.hardware.placement import for_slots, place
from specli.measure.bench import run_bench
from specli.options import Options
from specli.resolve.choose import DraftPlan, choose_models
from specli.session import Session
from specli.speculate.controller import Controller
from specli.speculate.drafters import ModelDrafter
from specli.speculate.loop import generate
from specli.speculate.registry import DraftKind, mode_for
from specli.speculate.settings import DEFAULTS, SpecSettings


def _default(fn, name):
    d = inspect.signature(fn).parameters[name].default
    return getattr(d, "default", d)  # a Typer option carries its default


def test_one_record_of_defaults():
    assert DEFAULTS == SpecSettings() and Options().spec == DEFAULTS
    assert _default(generate, "draft_max") == DEFAULTS.draft_max
    assert Controller(cost=None).k_max == DEFAULTS.draft_max
    assert _default(ModelDrafter.__init__, "p_min") == DEFAULTS.draft_p_min
    for cmd in (run_cli.run, chat_cli.chat, bench_cli.bench):
        assert _default(cmd, "draft_max") == DEFAULTS.draft_max, cmd.__name__
    assert _default(run_cli.run, "draft_p_min") == DEFAULTS.draft_p_min
    assert "draft_max" not in inspect.signature(run_bench).parameters  # bench takes the session's


def _fake_nvidia_smi(tmp_path):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho 'Fake GPU 9000, 24576, 20480'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}


def test_bench_uses_the_hardware_plan(tmp_path, tiny_target, tiny_draft):
    suite = tmp_path / "s.yaml"
    suite.write_text("prompts:\n  - id: one\n    text: Hello there\n")
    env = _fake_nvidia_smi(tmp_path)
    rc, out, err = specli("bench", "--target", tiny_target, "--draft", tiny_draft, "--suite", str(suite), "-n", "8",
                          "--modes", "none,hybrid", "--vram", "4GiB", "--json", env=env)
    assert rc == 0, err
    p = json.loads(out)["placement"]
    # the plan puts both tiny models on the (pretended) GPU, as run would
    assert p["budget_source"] == "--vram" and p["devices"] == ["Fake GPU 9000"]
    assert p["target_gpu_layers"] == -1 and p["draft_gpu_layers"] == -1 and p["drafter"] == "hybrid"
    # the same plan run prints
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, "--vram", "4GiB", "--plan", env=env)
    assert rc == 0 and "target layers on GPU: all; drafter: hybrid (draft layers on GPU: all)" in out
    # without a budget: CPU, and an explicit --gpu-layers wins over the plan
    rc, out, err = specli("bench", "--target", tiny_target, "--draft", "lookup", "--suite", str(suite), "-n", "8",
                          "--modes", "none,lookup", "--gpu-layers", "1", "--json")
    assert rc == 0, err
    assert json.loads(out)["placement"]["target_gpu_layers"] == 1


def test_chat_colours_follow_the_terminal_conventions(tiny_target):
    """Rich decides: a terminal gets styled notes, a pipe plain text, FORCE_COLOR styles a pipe
    too (there was a private SPECLI_COLOR before), TERM=dumb turns styling off."""
    def banner(env, tty):
        if tty:
            argv = ["-m", "specli", "chat", "--target", tiny_target, "--draft", "lookup"]
            child = pexpect.spawn(sys.executable, argv, env=env, encoding="utf-8", timeout=120, dimensions=(40, 200))
            child.expect(">>> ")
            text = child.before
            child.sendeof()
            child.expect(pexpect.EOF)
            return text
        rc, out, err = specli("chat", "--target", tiny_target, "--draft", "lookup", stdin="/exit\n", env=env)
        assert rc == 0, err
        return out

    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    assert "\x1b[2m" in banner({**base, "TERM": "xterm-256color"}, tty=True)
    assert "\x1b[" not in banner({**base, "TERM": "dumb"}, tty=True)
    assert "\x1b[" not in banner(base, tty=False)
    assert "\x1b[2m" in banner({**base, "FORCE_COLOR": "1"}, tty=False)


def test_a_profile_fills_only_the_options_not_typed(tmp_path, tiny_target):
    prof = tmp_path / "pair.yaml"
    prof.write_text(f"name: pair\ntarget: {tiny_target}\ndrafts: [lookup]\ndefaults:\n  draft_max: 5\n  ctx: 512\n")
    rc, out, err = specli("run", "--profile", str(prof), "--prompt", "Hello", "-n", "4", "--raw", "--json")
    assert rc == 0, err
    s = json.loads(out)["settings"]
    assert (s["draft_max"], s["ctx"]) == (5, 512)
    rc, out, err = specli("run", "--profile", str(prof), "--prompt", "Hello", "-n", "4", "--raw", "--json",
                          "--draft-max", "16", "--ctx", "1024")
    assert rc == 0, err
    s = json.loads(out)["settings"]
    assert (s["draft_max"], s["ctx"]) == (16, 1024)  # typed, even where equal to the default


def test_choose_place_and_run_are_steps_apart(tiny_target, tiny_draft):
    """The models are chosen, then placed, before anything loads (a pool of models plans its
    memory across models between the two); a session runs a placement it is given."""
    opts = Options(target=tiny_target, draft=tiny_draft, vram="4GiB")
    choice = choose_models(opts)
    assert choice.target == tiny_target and choice.draft.draft_path == tiny_draft and choice.profile is None
    placed = place(opts, choice)
    assert placed.draft.mode.name == "hybrid" and placed.target_gpu_layers == -1
    assert placed.report()["drafter"] == "hybrid" and placed.report()["budget_source"] == "--vram"
    sess = Session(opts, placement=placed)
    try:
        assert sess.placed is placed and sess.drafter.name == sess.drafter_name == "hybrid"
        assert sess.placement() == placed.report() and sess.draft_path == tiny_draft
    finally:
        sess.close()


def test_no_lookup_lands_in_its_own_field(tiny_target, tiny_draft):
    opts = Options(target=tiny_target, draft=tiny_draft, lookup=False)
    assert choose_models(opts).draft.mode.name == "model"
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, "--no-lookup", "--plan")
    assert rc == 0 and "drafter: model" in out, err
    rc, out, err = specli("run", "--target", tiny_target, "--draft", tiny_draft, "--no-lookup", "-n", "4", "--raw",
                          "--json", "--prompt", "Hello")
    assert rc == 0, err
    assert json.loads(out)["settings"]["lookup"] is False and json.loads(out)["stats"]["mode"] == "model"


def test_the_shared_options_build_one_options_record():
    """run, chat, bench, serve and export read their model options in one place: the same
    parameters, each typed once (a command without one keeps Options' default)."""
    shared = {"target", "draft", "draft_max", "ctx", "threads", "gpu_layers", "vram"}
    for cmd in (run_cli.run, chat_cli.chat, bench_cli.bench, serve_cli.serve, export_cli.export):
        params = inspect.signature(cmd).parameters
        assert shared <= set(params), cmd.__name__
        assert "click_ctx" in params, cmd.__name__  # model_options reads what the user typed


def test_parallel_slots_name_the_drafter_they_use(tiny_target):
    """With --parallel, a drafting head's modes fall back to prompt lookup (a head drafts from
    one sequence's hidden states), and the session names the slots' drafter, not its own (it
    builds none)."""
    notes: list[str] = []
    head = DraftPlan(mode_for(DraftKind.MTP_LOOKUP, True), head="head.gguf")
    assert for_slots(head, 1, notes) is head and not notes
    assert for_slots(head, 2, notes).mode.name == "lookup" and "--parallel 2: mtp drafts" in notes[0]
    model = DraftPlan(mode_for(DraftKind.HYBRID, False), draft_path="d.gguf")
    assert for_slots(model, 4, notes) is model
    sess = Session(Options(target=tiny_target, draft="lookup", parallel=2))
    try:
        assert sess.drafter.name == "none" and sess.drafter_name == "lookup"
    finally:
        sess.close()


def test_serve_parallel_names_the_slots_drafter_at_start(tiny_target):
    proc = start("serve", "--target", tiny_target, "--draft", "lookup", "--fixed", "--parallel", "2", "--port", "0",
                 "--ctx", "256", env=dict(os.environ))
    try:
        lines: list[str] = []
        wait_for("the server to listen", lambda: lines.append(proc.stderr.readline()) or "serving" in lines[-1], 120)
        assert "(drafter: lookup-fixed, 2 slots)" in lines[-1], lines
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def test_a_placement_counts_its_parts_before_loading(tiny_target, tiny_draft):
    """What a placement will hold, per part, from the headers: a pool of models adds these up
    (a file two placements share counted once) before it loads anything."""
    gpu = place(Options(target=tiny_target, draft=tiny_draft, vram="4GiB"),
                choose_models(Options(target=tiny_target, draft=tiny_draft)))
    fp = gpu.footprint()
    state = f"{tiny_target}#state"
    assert set(fp.gpu) == {tiny_target, tiny_draft, state} and all(v > 0 for v in fp.gpu.values())
    assert set(fp.host) == {tiny_target, tiny_draft}  # the token embeddings stay in host memory
    assert fp.gpu[state] < gpu.footprint(parallel=4).gpu[state]  # a KV cache per slot
    opts = Options(target=tiny_target, draft=tiny_draft, gpu_layers=0)
    cpu = place(opts, choose_models(opts)).footprint()
    assert not cpu.gpu and cpu.host[state] > 0 and cpu.host[tiny_target] > fp.host[tiny_target]


def test_model_options_reads_the_typed_options_a_command_declares():
    import typer
    from typer.testing import CliRunner

    from specli.cli.common import AdaptiveOpt, CtxOpt, DraftMaxOpt, DraftOpt, LookupOpt, TargetOpt, model_options

    app, got = typer.Typer(), []

    @app.command()
    def cmd(click_ctx: typer.Context, target: TargetOpt = None, draft: DraftOpt = "auto",
            draft_max: DraftMaxOpt = DEFAULTS.draft_max, adaptive: AdaptiveOpt = True, lookup: LookupOpt = True,
            ctx: CtxOpt = 4096):
        got.append(model_options(click_ctx))

    r = CliRunner().invoke(app, ["-m", "t.gguf", "--draft", "lookup", "--no-lookup", "--fixed", "--ctx", "4096"])
    assert r.exit_code == 0, r.output
    o = got[0]
    assert (o.target, o.draft, o.lookup, o.n_ctx, o.parallel, o.vram) == ("t.gguf", "lookup", False, 4096, 1, None)
    assert o.spec == SpecSettings(adaptive=False) and o.given == {"ctx"}  # typed, though equal to the default
