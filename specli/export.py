"""The command line that serves the same target/draft pair, with speculative decoding, on
another engine: llama.cpp's ``llama-server``, vLLM, SGLang or LM Studio.

The pair is chosen exactly as ``specli run`` chooses it (:func:`specli.resolve.choose.choose_models`,
profiles and ``--draft auto`` included, tokenizers checked), the GPU placement comes from the
same hardware plan (:func:`specli.hardware.placement.plan_for`), and the draft length is this machine's
measured choice: the controller's best length (:func:`specli.speculate.controller.best_length`)
over the verify and draft costs specli calibrated here (``specli run`` stores them), at a
typical 80% acceptance. Engines draft a fixed length per step, so this is the one length
specli would pick on average; without a measurement it is :data:`DEFAULT_DRAFT_N`, and the
output says so. Flag names follow each engine's own sources; see docs/serving.md.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from specli.engine import extra_buffer_types
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.resolve import hub
from specli.resolve.gguf_header import read_gguf
from specli.speculate.registry import DraftKind

ENGINES = ("llama-server", "vllm", "sglang", "lmstudio")
DEFAULT_PORT = {"llama-server": 8080, "vllm": 8000, "sglang": 30000, "lmstudio": 1234}
TYPICAL_ACCEPTANCE = calibrate.TYPICAL_ACCEPTANCE  # assumed when measured costs become one fixed length
# with nothing measured: vLLM's and SGLang's documented examples draft 4-5 tokens; llama.cpp's own
# default is 3. Longer drafts only pay where verifying a block costs little more than one token.
DEFAULT_DRAFT_N = 5
# prompt lookup drafts after an exact match of this many tokens: a 4+ token match is followed far more
# often than a 2-3 token one (drafters.lookup_key); a fixed-length engine cannot learn that per match,
# so it starts at 4
LOOKUP_MATCH = 4


@dataclass
class Pair:
    """What every engine's command is built from: the resolved pair and this machine's choices."""

    target_path: str
    draft_path: str | None  # a draft model's file (None: MTP or prompt lookup)
    lookup: bool  # prompt lookup in play (alone, or hybrid with the draft model or MTP)
    n_ctx: int
    target_gpu_layers: int  # -1: all
    draft_gpu_layers: int
    draft_n: int  # draft-model tokens per step
    lookup_n: int  # prompt-lookup tokens per step
    p_min: float
    threads: int | None = None
    target_hub: hub.HubRef | None = None  # where the files came from, for -hf / -hfd
    draft_hub: hub.HubRef | None = None
    hf_target: str | None = None  # safetensors repos, for vLLM / SGLang
    hf_draft: str | None = None
    notes: list[str] = field(default_factory=list)  # comment lines for the output
    mtp: bool = False  # the target drafts for itself through its multi-token-prediction layers
    # a drafting head's file and llama.cpp's --spec-type for it: an MTP-only sidecar (draft-mtp),
    # an EAGLE-3 head (draft-eagle3) or a DFlash head (draft-dflash)
    head: str | None = None
    head_type: str = ""
    no_repack: bool = False  # this CPU has AMX tiles: no weight repacking (specli.engine.extra_buffer_types)

    @property
    def drafts(self) -> bool:
        """A drafter that costs a forward pass per token: a draft model, the MTP layers or a head."""
        return bool(self.draft_path or self.head) or self.mtp


@dataclass
class Export:
    engine: str
    commands: list[list[str]]
    comments: list[str] = field(default_factory=list)
    config: str | None = None  # what the engine takes besides its command line, if anything

    def render(self) -> str:
        lines = [f"# {c}" for c in self.comments]
        lines += [shlex.join(cmd) for cmd in self.commands]
        if self.config:
            lines += ["", self.config]
        return "\n".join(lines) + "\n"


def _tokens(n: int) -> str:
    return f"{n} token" + ("s" if n != 1 else "")


def _length(measured: int | None, what: str, notes: list[str]) -> int:
    if measured is None:
        notes.append(f"{what}: no cost measurement for this pair and placement on this machine yet; "
                     f"using specli's default of {_tokens(DEFAULT_DRAFT_N)} (run `specli run` with the same "
                     "options once to measure, then export again)")
        return DEFAULT_DRAFT_N
    if measured == 0:
        notes.append(f"{what}: measured on this machine, drafting does not pay even at "
                     f"{TYPICAL_ACCEPTANCE:.0%} acceptance (best length 0); drafting 1 token, the least an "
                     "engine takes. Plain decoding may be faster here.")
        return 1
    notes.append(f"{what}: {_tokens(measured)} per step, the best length for this machine's measured verify "
                 f"and draft costs at {TYPICAL_ACCEPTANCE:.0%} acceptance")
    return measured


def _hub_of(refs) -> hub.HubRef | None:
    for r in refs:
        h = hub.parse_hub_ref(r) if r and not os.path.exists(os.path.expanduser(r)) else None
        if h is not None:
            return h
    return None


def pair_for(opts, progress: Callable[[str], None] | None = None, hf_target: str | None = None,
             hf_draft: str | None = None) -> Pair:
    """Resolve the pair as ``specli run`` would (downloading what is not cached, as ``--plan``
    does), plan its placement, and choose the draft lengths from this machine's measurements."""
    from specli.hardware.placement import gpu_layers, plan_for
    from specli.resolve.choose import choose_models

    if opts.draft == "none":
        raise SpecliError("--draft none is plain decoding: nothing to export (name a draft model, "
                          "'lookup' or 'auto')")
    given_target, given_draft = opts.target, opts.draft
    tpath, asked, prof = choose_models(opts, progress)
    plan, _, n_ctx = plan_for(opts, tpath, asked)
    draft = asked.placed(plan)
    notes = [f"placement: {plan.summary}"]
    if asked.draft_path and not draft.draft_path:
        notes.append("the GPU cannot hold both models, so specli would draft with prompt lookup: exported that way")
    elif plan.own_path:
        notes.append(f"the GPU cannot hold both models, so specli would draft with {plan.own_label}, derived from "
                     "the target's own layers: exported that way")
    dpath, mtp = draft.draft_path, draft.mtp
    tngl, dngl = gpu_layers(opts, plan)
    s = opts.spec
    lookup = draft.kind.entry.lookup or not (dpath or mtp)
    threads = opts.threads or os.cpu_count() or 1
    n_batch = min(512, n_ctx)
    head = draft.head
    # a head's cost is not measured per file yet: its length is specli's default
    drafter = ("draft", dpath, dngl or 0) if dpath else ("mtp", tpath, tngl) if mtp and not head else None
    measured = calibrate.measured_length(tpath, tngl, threads, n_batch, s.draft_max, drafter) if drafter else None
    draft_n = _length(measured, "MTP draft length" if mtp else "draft length", notes) \
        if dpath or mtp or head else 0
    if draft.dflash:  # llama.cpp clamps the draft to the head's block (and warns)
        draft_n = min(draft_n, int(read_gguf(head).arch_key("block_size", 16) or 16) - 1)
    lookup_n = _length(calibrate.measured_length(tpath, tngl, threads, n_batch, s.draft_max),
                       "prompt-lookup length", notes) if lookup else 0
    tspec = prof.target.sources if prof and not opts.target else (given_target,)
    auto_model = given_draft == "auto" and prof and prof.draft_models  # the profile's draft: _auto_draft's pick
    dspec = prof.draft_models[0].sources if auto_model else (given_draft,)
    return Pair(tpath, dpath, lookup, n_ctx, tngl, dngl, draft_n, lookup_n, s.draft_p_min, opts.threads,
                _hub_of(tspec), _hub_of(dspec) if dpath else None,
                hf_target or (prof.hf_target if prof else None),
                hf_draft or (prof.hf_draft if auto_model and dpath else None), notes, mtp,
                head, _HEAD_TYPES[draft.kind.entry.paid] if head else "",
                no_repack=not extra_buffer_types())


# llama.cpp's --spec-type for a drafting head, by what drafts with it
_HEAD_TYPES = {DraftKind.MTP: "draft-mtp", DraftKind.EAGLE3: "draft-eagle3", DraftKind.DFLASH: "draft-dflash"}


# -- llama.cpp's llama-server ----------------------------------------------------------------

def _layers(n: int) -> str:
    return "all" if n < 0 else str(n)


def _model_args(path: str, ref: hub.HubRef | None, use_hub: bool, flags: tuple[str, str]) -> list[str]:
    """``-m PATH`` (the local file), or ``-hf REPO[:QUANT]`` [+ file] for a Hub model."""
    path_flag, hub_flag = flags
    if not use_hub or ref is None:
        return [path_flag, path]
    repo = ref.repo + (f":{ref.quant}" if ref.quant else "")
    # a named file: -hff for the target; for the draft, -md names the file inside the -hfd repo
    file_flag = "--hf-file" if path_flag == "-m" else path_flag
    return [hub_flag, repo] + ([file_flag, ref.filename] if ref.filename else [])


def llama_server(p: Pair, port: int, use_hub: bool = False) -> Export:
    """llama-server's flags as the llama.cpp vendored by llama-cpp-python 0.3.36 declares them
    (common/arg.cpp): ``--spec-type`` with ``--spec-draft-model``/``-md``, ``--spec-draft-n-max``,
    ``--spec-draft-p-min``, ``--spec-draft-ngl``; ``ngram-simple`` for prompt lookup."""
    cmd = ["llama-server"] + _model_args(p.target_path, p.target_hub, use_hub, ("-m", "-hf"))
    types = []
    if p.lookup:
        types.append("ngram-simple")  # tried first: llama.cpp falls back to the draft model when it has no match
    if p.draft_path:
        cmd += _model_args(p.draft_path, p.draft_hub, use_hub, ("-md", "-hfd"))
        types.append("draft-simple")
    elif p.head:  # the head's file as the draft model, drafting as its type says
        cmd += ["-md", p.head]
        types.append(p.head_type)
    elif p.mtp:
        types.append("draft-mtp")  # the target's own MTP layers: no second file
    cmd += ["-c", str(p.n_ctx), "-ngl", _layers(p.target_gpu_layers)]
    cmd += ["--spec-type", ",".join(types)]
    if p.draft_path or p.head:
        cmd += ["--spec-draft-ngl", _layers(p.draft_gpu_layers if p.draft_path else p.target_gpu_layers)]
    if p.drafts:
        cmd += ["--spec-draft-n-max", str(p.draft_n), "--spec-draft-p-min", f"{p.p_min:g}"]
    if p.lookup:
        # ngram-simple drops any copy shorter than its match (common/ngram-map.cpp, copy_max <
        # size_n): a measured length under LOOKUP_MATCH would never draft
        cmd += ["--spec-ngram-simple-size-n", str(LOOKUP_MATCH),
                "--spec-ngram-simple-size-m", str(max(p.lookup_n, LOOKUP_MATCH))]
    if p.threads:
        cmd += ["-t", str(p.threads)]
    if p.no_repack:
        cmd.append("--no-repack")
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    notes = list(p.notes)
    if p.no_repack:
        notes.append("--no-repack: this CPU has AMX tiles, and llama.cpp's AMX weight repacking crashes where the "
                     "kernel does not grant them (specli loads without it here too; SPECLI_EXTRA_BUFTS=1)")
    if p.drafts:
        notes.append(f"--spec-draft-p-min {p.p_min:g}: the draft stops early when unsure, llama.cpp's nearest "
                     "thing to specli's per-step length choice")
    notes.append("several GPUs: add --split-mode layer --tensor-split 1,1 (llama.cpp splits layers; it has no "
                 "--tensor-parallel-size)")
    notes.append("flags as in the llama.cpp that llama-cpp-python 0.3.36 vendors; llama.cpp before the "
                 "2026 rename used --draft-max/--draft-min, which now fail")
    return Export("llama-server", [cmd], notes)


# -- vLLM and SGLang (safetensors) -----------------------------------------------------------

def _need_hf(p: Pair, engine: str, flag_hint: str) -> None:
    if p.head:
        raise SpecliError(f"{engine} cannot load a GGUF drafting head ({os.path.basename(p.head)}): export "
                          "--engine llama-server, or --draft lookup")
    if not p.hf_target:
        raise SpecliError(f"{engine} loads Hugging Face safetensors repos, not GGUF files: give "
                          f"--hf-target ORG/REPO{flag_hint}, or use a profile that names them (hf_target:)")
    if p.draft_path and not p.hf_draft:
        raise SpecliError(f"{engine} cannot load a GGUF draft: give --hf-draft ORG/REPO (the draft's "
                          "safetensors repo), or --draft lookup")


def _placement_notes(p: Pair, engine: str) -> list[str]:
    notes = [n for n in p.notes if not n.startswith("prompt-lookup") or not p.drafts]
    if p.target_gpu_layers >= 0:
        notes.append(f"{engine} keeps the whole model on the GPU; the plan above does not fit it there "
                     "(only part of the target fits, or there is no GPU)")
    if p.drafts and p.lookup:
        notes.append(f"{engine} cannot combine a draft model or MTP with prompt lookup (specli's hybrid): "
                     f"exporting the {'MTP layers' if p.mtp else 'draft model'} alone")
    return notes


def vllm(p: Pair, port: int) -> Export:
    """``vllm serve`` with ``--speculative-config`` (method ``draft_model`` or ``ngram``)."""
    _need_hf(p, "vLLM", "")
    if p.draft_path:
        spec = {"method": "draft_model", "model": p.hf_draft, "num_speculative_tokens": p.draft_n}
    elif p.mtp:
        spec = {"method": "mtp", "num_speculative_tokens": p.draft_n}
    else:
        spec = {"method": "ngram", "num_speculative_tokens": p.lookup_n,
                "prompt_lookup_min": LOOKUP_MATCH, "prompt_lookup_max": max(LOOKUP_MATCH, 8)}
    cmd = ["vllm", "serve", p.hf_target, "--max-model-len", str(p.n_ctx), "--host", "127.0.0.1",
           "--port", str(port), "--speculative-config", json.dumps(spec)]
    notes = _placement_notes(p, "vLLM")
    notes.append("several GPUs: add --tensor-parallel-size 2 (and \"draft_tensor_parallel_size\": 1 in the "
                 "speculative config to keep the draft on one)")
    return Export("vllm", [cmd], notes)


def sglang(p: Pair, port: int) -> Export:
    """``sglang.launch_server`` with ``--speculative-algorithm STANDALONE`` (a draft model, a
    chain of ``draft_n`` tokens) or ``NGRAM``."""
    _need_hf(p, "SGLang", "")
    cmd = ["python3", "-m", "sglang.launch_server", "--model-path", p.hf_target, "--context-length", str(p.n_ctx),
           "--host", "127.0.0.1", "--port", str(port)]
    if p.drafts:
        # a chain of draft_n tokens; SGLang runs MTP layers through its EAGLE worker
        cmd += ["--speculative-algorithm", "STANDALONE" if p.draft_path else "EAGLE"]
        cmd += ["--speculative-draft-model-path", p.hf_draft] if p.draft_path else []
        cmd += ["--speculative-num-steps", str(p.draft_n), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(p.draft_n + 1)]
    else:
        cmd += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(p.lookup_n),
                "--speculative-ngram-min-match-window-size", str(LOOKUP_MATCH),
                "--speculative-ngram-max-match-window-size", str(max(LOOKUP_MATCH, 8))]
    notes = _placement_notes(p, "SGLang")
    notes.append("several GPUs: add --tp 2 (tensor parallelism)")
    if not p.drafts:
        notes.append("SGLang's NGRAM speculation runs on CUDA only")
    return Export("sglang", [cmd], notes)


# -- LM Studio -------------------------------------------------------------------------------

def _gpu_share(path: str, layers: int) -> str:
    if layers < 0:
        return "max"
    if layers == 0:
        return "off"
    n = int(read_gguf(path).arch_key("block_count", 0) or 0)
    return f"{min(1.0, layers / n):.2f}" if n else "max"


def lmstudio(p: Pair, port: int) -> Export:
    """``lms`` commands to import and load the pair and start the server, and the request body
    that turns speculation on: ``lms`` has no draft-model flag."""
    if not p.draft_path:
        raise SpecliError("LM Studio speculates only with a draft model (no prompt lookup, no MTP): "
                          "name a draft with --draft REF")
    tkey = "specli-target"
    dkey = os.path.splitext(os.path.basename(p.draft_path))[0].lower()
    cmds = [["lms", "import", p.target_path, "--copy", "--yes"],
            ["lms", "import", p.draft_path, "--copy", "--yes"],
            ["lms", "load", os.path.splitext(os.path.basename(p.target_path))[0].lower(),
             "--context-length", str(p.n_ctx), "--gpu", _gpu_share(p.target_path, p.target_gpu_layers),
             "--identifier", tkey],
            ["lms", "server", "start", "--port", str(port)]]
    notes = [n for n in p.notes if not n.startswith("prompt-lookup")]
    notes += [("LM Studio's lms CLI has no draft-model flag (lms load takes --gpu, --context-length, --ttl, "
               "--identifier): the draft is chosen per request with \"draft_model\" (LM Studio >= 0.3.10), or "
               "in the app: Power User mode, chat sidebar, Speculative Decoding, Draft Model"),
              f"model keys are as `lms ls` lists them after the import ({dkey} assumed for the draft)",
              f"LM Studio sets the draft length itself; specli's choice here is {_tokens(p.draft_n)}"]
    body = {"model": tkey, "draft_model": dkey, "messages": [{"role": "user", "content": "Hello"}]}
    return Export("lmstudio", cmds, notes,
                  "# request body for POST /v1/chat/completions:\n" + json.dumps(body, indent=2))


def export(opts, engine: str, port: int | None = None, use_hub: bool = False, hf_target: str | None = None,
           hf_draft: str | None = None, progress: Callable[[str], None] | None = None) -> Export:
    """The command(s) that serve the pair ``opts`` names on ``engine``."""
    if engine not in ENGINES:
        raise SpecliError(f"unknown engine '{engine}' (one of: {', '.join(ENGINES)})")
    p = pair_for(opts, progress, hf_target, hf_draft)
    port = port or DEFAULT_PORT[engine]
    if engine == "llama-server":
        return llama_server(p, port, use_hub)
    return {"vllm": vllm, "sglang": sglang, "lmstudio": lmstudio}[engine](p, port)
