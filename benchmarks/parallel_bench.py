"""Many clients at once (issue #30): 1, 2, 4 and 8 concurrent clients on one server, specli's
serial server, batched plain and batched speculative, and llama-server with and without its
speculation, side by side in one run over HTTP.

Eight mixed prompts (code from the ``code`` suite, code edits and rewriting from ``grounded``,
prose from ``chat``) go to each server as waves of N simultaneous clients (N = 1: eight
waves of one; N = 8: one wave of eight), each client a thread with the official ``openai``
client, streamed, greedy (temperature 0). The modes:

- ``serial``: ``specli serve --parallel 1``, today's server (one request at a time, the
  others queue: with N clients, that is the serial baseline);
- ``batched-plain``: ``specli serve --parallel N --draft none`` (one batch, no drafting);
- ``batched-spec``: ``specli serve --parallel N`` (one batch, default drafting); with N = 1
  it is the serial server, measured once;
- ``llama-server`` / ``llama-server+draft`` (``--llama-server``): llama.cpp's server built from
  the llama.cpp that llama-cpp-python vendors (tests/llama_server.py), ``-np N``, plain and
  with the draft model (``-md``, ``--spec-type draft-simple``, llama.cpp's default lengths).

A specli without ``--parallel`` (before issue #30) runs ``serial`` and ``batched-plain`` at
N = 1 only and says so. The servers of one N run side by side, idle between waves; the modes
are interleaved wave by wave, in a rotating order, so a busy neighbour slows them alike.
Per mode and N: aggregate tokens/s (all clients' tokens over the waves' wall time), each
client's time to first token and tokens/s after it (as the client sees them).

Lossless check: first each prompt alone on the serial server, with the target's top-5
log-probabilities (``logprobs``/``top_logprobs=5``): the single-client text. Every other text
must equal it, or part where it goes on with a token the target scored within a near-tie
(specli.measure.lossless.NEAR_TIE) of the answer's token: the runner-up, or one further down.

The report states issue #30's goal and whether this run met it: with 4 clients, batched
speculative aggregate tokens/s >= 1.5x the serial server's and never below batched plain's,
every specli text identical to its single-client text or parted at a near-tie. Full run
(about 20-25 min on the idle 2-core development VM; ``--quick``: 2 prompts, N in {1, 2}, 32 tokens):

    python benchmarks/parallel_bench.py --profile default --llama-server \\
        --out benchmarks/results/parallel_bench.json --md benchmarks/results/parallel_bench.md
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from specli.engine import extra_buffer_types
from specli.measure.lossless import IDENTICAL, NEAR_TIE, NEAR_TIE_KIND
from specli.measure.suite import load_suite

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# code, code edit / rewrite (grounded), prose (chat), mixed so every wave of 2 or more holds two kinds
PROMPTS = (("code", "binary-search"), ("grounded", "rename-variable"), ("chat", "git-rebase"),
           ("code", "lru-cache"), ("grounded", "fix-off-by-one"), ("chat", "explain-hash-map"),
           ("code", "go-retry"), ("grounded", "csv-to-markdown"))
WARMUP = "Say hello in one word."  # not one of the prompts: warms each server without caching them
MODES = ("serial", "batched-plain", "batched-spec", "llama-server", "llama-server+draft")
SPECLI_MODES = MODES[:3]
GOAL_CLIENTS = 4
GOAL_RATIO = 1.5
PREFIX = "a prefix: one text stopped earlier"
TOP_LOGPROBS = 5  # the single-client answer's alternatives per token, for the near-tie check
SAME_AS_SERIAL = "= serial"  # batched speculative with one client: the serial server, measured once


# -- the lossless check on texts ---------------------------------------------------------------

@dataclass(frozen=True)
class TokenLp:
    """One token of the single-client answer: its bytes, and the target's top alternatives there
    as (bytes, logprob), best first."""

    data: bytes
    top: tuple[tuple[bytes, float], ...]


@dataclass(frozen=True)
class TextDivergence:
    char: int  # first character where the texts differ
    token: int | None  # the single-client answer's token covering it (None: no logprobs there)
    expected: str  # that token's text
    got: str  # the other text from that token's start, as long as the token
    runner_up: str | None  # the target's second choice there
    margin: float | None  # its top-1 minus top-2 logprob (= logit gap) there
    took: str | None = None  # the target's alternative there that the other text goes on with
    gap: float | None = None  # the answer's token's logprob minus that alternative's (a logit gap)

    @property
    def took_runner_up(self) -> bool:
        return self.took is not None and self.took == self.runner_up

    @property
    def near_tie(self) -> bool:
        """The other text goes on with a token the target scored within ``NEAR_TIE`` logits of
        the answer's (specli.measure.lossless's rule: batch-shape noise on a quantised model
        moves logits by up to ~0.6), the runner-up or one further down its top logprobs."""
        return self.took is not None and self.gap is not None and self.gap < NEAR_TIE

    def describe(self) -> str:
        where = f"differs from the single-client text at character {self.char}"
        if self.token is None:
            return f"{where}, past the tokens with logprobs: NOT shown a near-tie"
        kind = NEAR_TIE_KIND if self.near_tie else "NOT a near-tie: likely a bug"
        if self.took is None:
            took = f"the other text took none of the target's top {TOP_LOGPROBS} (runner-up {self.runner_up!r})"
        elif self.took_runner_up:
            took = f"the other text took the runner-up {self.took!r}"
        else:
            took = f"the other text took {self.took!r}, {self.gap:.3f} behind the answer's token"
        return (f"{where} (token {self.token}: {self.got!r} vs {self.expected!r}); target top-2 margin there "
                f"{self.margin:.3f}, {took}: {kind}")


def common_prefix_len(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def text_divergence(ref: str, ref_lps: list[TokenLp], other: str, back: int = 2) -> TextDivergence | None:
    """None when ``other`` is ``ref`` or one is a prefix of the other; else where they part, with
    the target's logprobs at the single-client answer's token covering that place. Only text
    is compared, so the token where the answers really parted may end before the first differing
    character: a run of spaces or dashes split '   ' + ' |' in one answer and '  ' + ' |' in the
    other agrees one character past the token that differs. So up to ``back`` tokens before the
    covering one are tried too, and the nearest where the other text goes on with one of the
    target's alternatives at a near-tie is the parting token; failing that, the covering token
    is reported."""
    rb, ob = ref.encode(), other.encode()
    b = common_prefix_len(rb, ob)
    if b == min(len(rb), len(ob)):
        return None
    char = len(rb[:b].decode("utf-8", errors="ignore"))
    starts = [0]
    for t in ref_lps:
        starts.append(starts[-1] + len(t.data))
    cover = next((j for j, t in enumerate(ref_lps) if starts[j] <= b < starts[j] + len(t.data)), None)
    if cover is None:
        return TextDivergence(char, None, "", "", None, None, False)

    def at(j: int) -> TextDivergence:
        t, start = ref_lps[j], starts[j]
        alts = [(d, lp) for d, lp in t.top if d != t.data]
        mine = next((lp for d, lp in t.top if d == t.data), None)  # the answer's token's logprob
        margin = t.top[0][1] - alts[0][1] if alts and t.top[0][0] == t.data else None
        runner = alts[0][0] if alts else None
        took = next(((d, lp) for d, lp in alts if ob[start:].startswith(d)), None)  # the best-ranked that fits
        got = ob[start:start + max(len(t.data), len(took[0]) if took else 0)]
        return TextDivergence(char, j, t.data.decode(errors="replace"), got.decode(errors="replace"),
                              runner.decode(errors="replace") if runner is not None else None, margin,
                              took[0].decode(errors="replace") if took else None,
                              mine - took[1] if took and mine is not None else None)

    tried = [at(j) for j in range(cover, max(cover - back, 0) - 1, -1)]
    return next((d for d in tried if d.near_tie), tried[0])


def verdict(ref: str, ref_lps: list[TokenLp], other: str) -> str:
    """``identical``, ``a prefix ...``, or where the texts part and whether at a near-tie."""
    if other == ref:
        return IDENTICAL
    d = text_divergence(ref, ref_lps, other)
    return PREFIX if d is None else d.describe()


def holds(v: str) -> bool:
    """The text is the target's own: identical, or parted at a near-tie (a shorter text does not
    count: every client asked for as many tokens)."""
    return v == IDENTICAL or v.endswith(": " + NEAR_TIE_KIND)


# -- servers -----------------------------------------------------------------------------------

def llama_server_module():
    sys.path.insert(0, str(ROOT / "tests"))
    import llama_server

    return llama_server


def specli_has_parallel() -> bool:
    out = subprocess.run([sys.executable, "-m", "specli", "serve", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    return "--parallel" in out.stdout


@dataclass
class ModelPaths:
    target: str
    draft: str | None


def model_paths(a) -> ModelPaths:
    """The pair ``specli serve`` loads for these options (resolved as it does), for llama-server."""
    from specli.options import Options
    from specli.resolve.choose import choose_models

    tpath, asked, _ = choose_models(Options(target=a.target, draft=a.draft, profile=None if a.target else a.profile))
    return ModelPaths(tpath, asked.draft_path)


def specli_argv(a, mode: str, n: int, parallel: bool, port: int) -> list[str]:
    models = ["--target", a.target] if a.target else ["--profile", a.profile]
    argv = [sys.executable, "-m", "specli", "serve", *models, "--draft", "none" if mode == "batched-plain" else a.draft,
            "--threads", str(a.threads), "--queue", "16", "--port", str(port)]
    return argv + (["--parallel", str(n)] if parallel else [])


def llama_argv(binary: str, paths: ModelPaths, threads: int, mode: str, n: int, port: int) -> list[str]:
    argv = [binary, "-m", paths.target, "-t", str(threads), "-tb", str(threads), "-np", str(n),
            "-c", str(2048 * n), "--no-warmup", "--port", str(port)]
    if mode == "llama-server+draft":
        argv += ["-md", paths.draft, "--spec-type", "draft-simple", "-td", str(threads), "-tbd", str(threads)]
    return argv + ([] if extra_buffer_types() else ["--no-repack"])  # AMX hosts, as specli loads (export.Pair)


class Servers:
    """Server processes by name, each started with tests/llama_server.running (polls /health)."""

    def __init__(self, log_dir: Path):
        self.ls = llama_server_module()
        self.log_dir = log_dir
        self.up: dict[str, tuple[contextlib.ExitStack, openai.OpenAI, str, list[str]]] = {}

    def start(self, name: str, argv_for, n: int) -> None:
        """Start a server and warm it with ``n`` clients at once (first-touch costs, buffers sized
        for a batch of ``n``: they belong to no mode)."""
        argv = argv_for(self.ls.free_port())
        print(f"starting {name}: {' '.join(argv)}", file=sys.stderr, flush=True)
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(self.ls.running(argv, self.log_dir / f"{name}.log"))
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=1200)
            stack.callback(client.close)
            model = client.models.list().data[0].id
            failed = [c["error"] for c in wave(client, model, [WARMUP] * n, 16)["clients"] if "error" in c]
            if failed:
                raise RuntimeError(f"{name} failed its warm-up: {failed[0]} (log: {self.log_dir / name}.log)")
            self.up[name] = (stack.pop_all(), client, model, argv)

    def client(self, name: str) -> tuple[openai.OpenAI, str]:
        return self.up[name][1], self.up[name][2]

    def stop(self, name: str) -> None:
        self.up.pop(name)[0].close()

    def close(self) -> None:
        for name in list(self.up):
            self.stop(name)


# -- clients -----------------------------------------------------------------------------------

def ask(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, logprobs: bool = False) -> dict:
    """One streamed greedy chat request: its text, tokens, time to first token, and when it ran."""
    extra = {"logprobs": True, "top_logprobs": TOP_LOGPROBS} if logprobs else {}
    t0 = time.perf_counter()
    first = None
    pieces, lps, usage, timings, chunks = [], [], None, None, 0
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            temperature=0, max_tokens=max_tokens, stream=True,
                                            stream_options={"include_usage": True}, **extra)
    for ch in stream:
        if ch.choices:
            c = ch.choices[0]
            if c.delta.content:
                first = first or time.perf_counter()
                pieces.append(c.delta.content)
                chunks += 1
            if c.logprobs and c.logprobs.content:
                lps += [{"bytes": e.bytes if e.bytes is not None else list(e.token.encode()),
                         "top": [[t.bytes if t.bytes is not None else list(t.token.encode()), t.logprob]
                                 for t in e.top_logprobs]} for e in c.logprobs.content]
        if ch.usage:
            usage = ch.usage
        timings = (ch.model_extra or {}).get("timings", timings)  # llama-server's, with its draft counts
    t1 = time.perf_counter()
    first = first or t1
    n = usage.completion_tokens if usage else chunks
    details = usage.prompt_tokens_details if usage else None
    spec = (usage.model_extra or {}).get("speculative") if usage else None
    out = {"text": "".join(pieces), "tokens": n, "start": t0, "end": t1, "ttft": first - t0,
           "tok_s": (n - 1) / (t1 - first) if n > 1 and t1 > first else 0.0,
           "prompt_tokens": usage.prompt_tokens if usage else None,
           "cached": details.cached_tokens if details else None,
           "drafted": (spec or {}).get("drafted", (timings or {}).get("draft_n")),
           "accepted": (spec or {}).get("accepted", (timings or {}).get("draft_n_accepted"))}
    if logprobs:
        out["logprobs"] = lps
    return out


def wave(client: openai.OpenAI, model: str, prompts: list[str], max_tokens: int) -> dict:
    """All ``prompts`` at once, one client thread each, released together."""
    results: list[dict | None] = [None] * len(prompts)
    gate = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        gate.wait()
        try:
            results[i] = ask(client, model, prompts[i], max_tokens)
        except (openai.APIError, httpx.HTTPError) as e:  # refused, or the stream broke: counted, not fatal
            results[i] = {"error": f"{type(e).__name__}: {e}"}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if "error" not in r]
    wall = max(r["end"] for r in ok) - min(r["start"] for r in ok) if ok else 0.0
    return {"clients": results, "wall": wall, "load": os.getloadavg()[0]}


# -- summary and goal (pure: tests/test_parallel_bench.py) -------------------------------------

def summarise(runs: list[dict]) -> dict:
    """One mode at one N: its waves' clients together."""
    clients = [c for w in runs for c in w["clients"]]
    ok = [c for c in clients if "error" not in c]
    tokens = sum(c["tokens"] for c in ok)
    wall = sum(w["wall"] for w in runs)
    return {"tokens": tokens, "wall": wall, "agg_tok_s": tokens / wall if wall else 0.0,
            "ttft_mean": statistics.fmean(c["ttft"] for c in ok) if ok else None,
            "ttft_max": max((c["ttft"] for c in ok), default=None),
            "client_tok_s_median": statistics.median(c["tok_s"] for c in ok) if ok else None,
            "client_tok_s_min": min((c["tok_s"] for c in ok), default=None),
            "cached": sum(c["cached"] or 0 for c in ok),
            "drafted": sum(c["drafted"] or 0 for c in ok), "accepted": sum(c["accepted"] or 0 for c in ok),
            "errors": [c["error"] for c in clients if "error" in c]}


def goal(summary: dict[str, dict[int, dict]], checks: dict[str, dict[int, list[str]]], n: int = GOAL_CLIENTS,
         ratio_goal: float = GOAL_RATIO) -> dict:
    """Issue #30's goal on this run: with ``n`` clients batched speculative aggregate tokens/s at
    least ``ratio_goal`` x the serial server's, batched speculative never below batched plain (at
    any N measured), every specli text identical to its single-client text or a near-tie."""
    spec, serial, plain = (summary.get(m, {}) for m in ("batched-spec", "serial", "batched-plain"))
    if 1 in serial:
        spec = {1: serial[1], **spec}  # with one client batched speculative is the serial server
    verdicts = [v for m in SPECLI_MODES for vs in checks.get(m, {}).values() for v in vs]
    bad = [v for v in verdicts if not holds(v)]
    out = {"clients": n, "ratio_goal": ratio_goal, "texts": len(verdicts),
           "identical": sum(v == IDENTICAL for v in verdicts),
           "near_ties": sum(holds(v) and v != IDENTICAL for v in verdicts), "not_holding": len(bad),
           "texts_ok": not bad and bool(verdicts)}
    if n not in spec or n not in serial or not serial[n]["agg_tok_s"]:
        return {**out, "measured": False, "met": False}
    ratio = spec[n]["agg_tok_s"] / serial[n]["agg_tok_s"]
    vs_plain = {k: spec[k]["agg_tok_s"] / plain[k]["agg_tok_s"] for k in sorted(spec)
                if k in plain and plain[k]["agg_tok_s"]}
    errors = sum(len(s["errors"]) for m in SPECLI_MODES for s in summary.get(m, {}).values())
    speed_ok, plain_ok = ratio >= ratio_goal, bool(vs_plain) and min(vs_plain.values()) >= 1.0
    return {**out, "measured": True, "ratio": ratio, "speed_ok": speed_ok, "vs_plain": vs_plain,
            "plain_ok": plain_ok, "errors": errors,
            "met": speed_ok and plain_ok and out["texts_ok"] and not errors}


def goal_lines(g: dict) -> list[str]:
    head = (f"Goal (issue #30): with {g['clients']} clients, batched speculative aggregate tokens/s "
            f">= {g['ratio_goal']}x the serial server's, never below batched plain's, every specli text "
            "identical to its single-client text (or parted at a near-tie).")
    texts = (f"texts: {g['identical']} of {g['texts']} identical, {g['near_ties']} parted at a near-tie, "
             f"{g['not_holding']} otherwise")
    if not g["measured"]:
        return [head, "", f"**Not measured**: no batched speculative run with {g['clients']} clients (this "
                "specli has no `--parallel`, or the run did not include that many clients); " + texts + "."]
    r, rg = g["ratio"], g["ratio_goal"]
    speed = (f"batched speculative is **{r:.2f}x** the serial server with {g['clients']} clients "
             + (f"(goal {rg}x: met, {r / rg - 1:+.0%} over it)" if g["speed_ok"]
                else f"(goal {rg}x: short by {1 - r / rg:.0%}, {rg - r:.2f}x)"))
    worst_n = min(g["vs_plain"], key=g["vs_plain"].get) if g["vs_plain"] else None
    plain = ("no batched plain run to compare" if worst_n is None else
             "vs batched plain " + ", ".join(f"{v:.2f}x at {k}" for k, v in g["vs_plain"].items())
             + ("" if g["plain_ok"] else f" (below it at {worst_n} clients)"))
    lines = [head, "", f"**{'Met' if g['met'] else 'Not met'}**: {speed}; {plain}; {texts}"
             + (f"; {g['errors']} failed requests" if g["errors"] else "") + "."]
    return lines


# -- the run -----------------------------------------------------------------------------------

def machine() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), cpu)
    mem = None
    with contextlib.suppress(OSError, StopIteration, ValueError):
        mem = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                       if ln.startswith("MemTotal"))) // 1024
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"cpu": cpu or platform.machine(), "cores": os.cpu_count(), "memory_mib": mem,
            "system": f"{platform.system()} {platform.machine()}", "commit": commit,
            "llama_cpp_python": importlib.metadata.version("llama-cpp-python")}


def parse_clients(text: str) -> list[int]:
    try:
        ns = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated positive integers, not {text!r}") from None
    if not ns or ns[0] < 1:
        raise argparse.ArgumentTypeError(f"comma-separated positive integers, not {text!r}")
    return ns


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="full run:\n\n" + __doc__.rsplit("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--target", default=None, help="a target instead of the profile's")
    ap.add_argument("--draft", default="auto", help="specli's drafter for the speculative modes (and llama-server's)")
    ap.add_argument("--clients", type=parse_clients, default=None, help="concurrent clients (default 1,2,4,8)")
    ap.add_argument("--prompts", type=int, default=None, help=f"the first P of the {len(PROMPTS)} prompts")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens a request (default 96)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every wave in every mode")
    ap.add_argument("--threads", type=int, default=None, help="threads of every server (default: the cores)")
    ap.add_argument("--modes", default=",".join(MODES[:3]), help=f"of {', '.join(MODES[:3])}")
    ap.add_argument("--llama-server", action="store_true", help="also llama-server, plain and with the draft model")
    ap.add_argument("--quick", action="store_true", help="2 prompts, 1 and 2 clients, 32 tokens (a smoke run)")
    ap.add_argument("--logs", default=None, help="server logs here (default: a temporary folder)")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--md", default=None, help="markdown report")
    ap.add_argument("--recheck", default=None, metavar="JSON",
                    help="judge a saved run's texts again with this checker and write its report (runs nothing)")
    return ap


def _settle(ap: argparse.ArgumentParser, a) -> list[str]:
    """The defaults that depend on --quick, the checks; the specli modes asked for."""
    a.clients = a.clients or ([1, 2] if a.quick else [1, 2, 4, 8])
    a.prompts = a.prompts or (2 if a.quick else len(PROMPTS))
    a.max_tokens = a.max_tokens or (32 if a.quick else 96)
    a.threads = a.threads or os.cpu_count() or 1
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in SPECLI_MODES]:
        ap.error(f"--modes: unknown {', '.join(unknown)} (choose from {', '.join(SPECLI_MODES)})")
    if "serial" not in modes:
        ap.error("--modes: serial is the reference (the single-client texts) and the baseline; keep it")
    if not 1 <= a.prompts <= len(PROMPTS):
        ap.error(f"--prompts: 1 to {len(PROMPTS)}")
    if bad := [n for n in a.clients if a.prompts % n]:
        ap.error(f"--clients: {bad} do not divide the {a.prompts} prompts into whole waves")
    if a.max_tokens < 2 or a.repeat < 1:
        ap.error("--max-tokens must be at least 2 and --repeat at least 1")

    return modes


def main() -> int:
    ap = _parser()
    a = ap.parse_args()
    if a.recheck:
        return recheck(Path(a.recheck), a.out, a.md)
    modes = _settle(ap, a)
    suites = {s: {p.id: p.text for p in load_suite(s).prompts} for s in {s for s, _ in PROMPTS}}
    prompts = [(pid, suites[s][pid]) for s, pid in PROMPTS[:a.prompts]]
    parallel = specli_has_parallel()
    paths = model_paths(a)
    binary = str(llama_server_module().build()) if a.llama_server else None
    if a.llama_server:
        modes += ["llama-server"] + (["llama-server+draft"] if paths.draft else [])
    notes = [] if parallel else ["this specli has no `--parallel` (before issue #30): batched modes only at "
                                 "1 client (batched plain = `--draft none`), the serial server queues the rest"]
    if a.llama_server and not paths.draft:
        notes.append(f"no draft model for --draft {a.draft}: llama-server+draft not run")
    log_dir = Path(a.logs) if a.logs else Path(tempfile.mkdtemp(prefix="parallel_bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"server logs in {log_dir}", file=sys.stderr)
    facts, t_start, load = machine(), time.time(), [os.getloadavg()]

    def argv_for(mode: str, n: int):
        if mode.startswith("llama-server"):
            return lambda port: llama_argv(binary, paths, a.threads, mode, n, port)
        return lambda port: specli_argv(a, mode, n, parallel, port)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run stops its servers (finally below)
    servers = Servers(log_dir)
    runs: dict[str, dict[int, list[dict]]] = {m: {} for m in modes}
    commands: dict[str, list[str]] = {}
    try:
        servers.start("serial", argv_for("serial", 1), 1)
        commands["serial"] = servers.up["serial"][3]
        client, model = servers.client("serial")
        ref = {}
        for pid, text in prompts:  # the single-client texts, with the target's top logprobs
            ref[pid] = ask(client, model, text, a.max_tokens, logprobs=True)
            print(f"reference {pid}: {ref[pid]['tokens']} tokens", file=sys.stderr, flush=True)
        for li, n in enumerate(a.clients):
            _at_clients(servers, a, li, n, [m for m in modes if runnable(m, n, parallel)], prompts, argv_for, runs,
                        commands, load)
    finally:
        servers.close()

    meta = {"command": "python " + " ".join(sys.argv), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "seconds": time.time() - t_start, "machine": facts, "load": [list(x) for x in load],
            "target": paths.target, "draft": paths.draft, "threads": a.threads, "clients": a.clients,
            "prompts": [pid for pid, _ in prompts], "max_tokens": a.max_tokens, "repeat": a.repeat,
            "specli_parallel": parallel, "notes": notes, "servers": commands}
    report = assemble(meta, runs, ref)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, ensure_ascii=False))
    md = render(report)
    if a.md:
        Path(a.md).write_text(md)
    print(md)
    return 0


def _at_clients(servers, a, li: int, n: int, here: list[str], prompts: list, argv_for, runs: dict, commands: dict,
                load: list) -> None:
    """Every mode runnable at ``n`` clients, wave after wave of ``n`` prompts, the modes' order
    rotated per wave and round; the servers of the batched modes started for ``n`` and stopped."""
    for m in here:
        if m != "serial":
            servers.start(m, argv_for(m, n), n)
            commands[f"{m} (N={n})"] = servers.up[m][3]
    waves = [prompts[i:i + n] for i in range(0, len(prompts), n)]
    for r in range(a.repeat):
        for w, batch in enumerate(waves):
            k = (li + r + w) % len(here)
            for m in here[k:] + here[:k]:
                cl, mdl = servers.client(m)
                res = wave(cl, mdl, [t for _, t in batch], a.max_tokens)
                for (pid, _), c in zip(batch, res["clients"]):
                    c["prompt"] = pid
                runs[m].setdefault(n, []).append({"round": r, "wave": w, **res})
                load.append(os.getloadavg())
                toks = sum(c.get("tokens", 0) for c in res["clients"])
                print(f"N={n} round {r} wave {w} {m:<20} {toks:4d} tok {res['wall']:6.1f} s "
                      f"{toks / res['wall'] if res['wall'] else 0:6.2f} tok/s", file=sys.stderr, flush=True)
    for m in here:
        if m != "serial":
            servers.stop(m)


def assemble(meta: dict, runs: dict[str, dict[int, list[dict]]], ref: dict[str, dict]) -> dict:
    """The report: ``meta`` (the run's facts), each client's text checked against its prompt's
    single-client text ``ref`` (text and logprobs, as ``ask`` returns them), the summaries and
    the goal."""
    ref_lps = {pid: [TokenLp(bytes(t["bytes"]), tuple((bytes(b), lp) for b, lp in t["top"]))
                     for t in r["logprobs"]] for pid, r in ref.items()}
    for c in (c for by_n in runs.values() for ws in by_n.values() for w in ws for c in w["clients"]):
        c["verdict"] = ("failed: " + c["error"] if "error" in c
                        else verdict(ref[c["prompt"]]["text"], ref_lps[c["prompt"]], c["text"]))
    checks = {m: {n: [c["verdict"] for w in ws for c in w["clients"]] for n, ws in by_n.items()}
              for m, by_n in runs.items()}
    summary = {m: {n: summarise(ws) for n, ws in by_n.items()} for m, by_n in runs.items()}
    return {**meta, "goal": goal(summary, checks), "summary": summary, "checks": checks,
            "reference": {pid: {"text": r["text"], "logprobs": r["logprobs"]} for pid, r in ref.items()},
            "runs": {m: {n: [{**w, "clients": [{k: v for k, v in c.items() if k not in ("start", "end")}
                                               for c in w["clients"]]} for w in ws]
                         for n, ws in by_n.items()} for m, by_n in runs.items()}}


def recheck(path: Path, out: str | None, md: str | None) -> int:
    """A saved report judged again: its texts against its single-client texts, by this checker."""
    try:
        saved = json.loads(path.read_text())
        runs = {m: {int(n): ws for n, ws in by_n.items()} for m, by_n in saved["runs"].items()}
        meta = {k: v for k, v in saved.items() if k not in ("goal", "summary", "checks", "reference", "runs")}
        report = assemble(meta, runs, saved["reference"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"parallel_bench: error: --recheck {path}: not a saved report ({e})", file=sys.stderr)
        return 2
    if out:
        Path(out).write_text(json.dumps(report, indent=1, ensure_ascii=False))
    text = render(report)
    if md:
        Path(md).write_text(text)
    print(text)
    return 0


def runnable(mode: str, n: int, parallel: bool) -> bool:
    """Whether ``mode`` runs with ``n`` clients: batched speculative with one client is the serial
    server (measured once, as serial); a specli without --parallel batches nothing."""
    if mode == "batched-spec":
        return parallel and n > 1
    if mode == "batched-plain":
        return parallel or n == 1
    return True


def text_cell(vs: list[str] | None, missing: str) -> str:
    if vs is None:
        return missing
    ties, bad = sum(holds(v) and v != IDENTICAL for v in vs), sum(not holds(v) for v in vs)
    return (f"{sum(v == IDENTICAL for v in vs)} identical of {len(vs)}" + (f", {ties} near-tie" if ties else "")
            + (f", **{bad} not**" if bad else ""))


def per_client(rep: dict, modes: list[str], n: int) -> list[str]:
    """Every client of the first round with ``n`` clients: time to first token and tokens/s by mode."""
    firsts = {m: [c for w in rep["runs"][m].get(n, []) if w["round"] == 0 for c in w["clients"]] for m in modes}
    shown = [m for m in modes if firsts[m]]
    if not shown:
        return []
    lines = ["", f"## Each of {n} clients (round 0): time to first token s / tokens/s", "",
             "| wave | prompt | " + " | ".join(shown) + " |", "|---" * (len(shown) + 2) + "|"]
    for i, c0 in enumerate(firsts[shown[0]]):
        cells = [f"{c['ttft']:.2f} / {c['tok_s']:.2f}" if "error" not in c else "failed"
                 for c in (firsts[m][i] for m in shown)]
        lines.append(f"| {i // n} | {c0['prompt']} | " + " | ".join(cells) + " |")
    return lines


def render(rep: dict) -> str:
    modes = [m for m in rep["summary"] if rep["summary"][m]]
    ns = rep["clients"]
    mf = rep["machine"]
    loads = [x[0] for x in rep["load"]]
    serial = rep["summary"]["serial"]

    def cell(m, n, fmt):
        s = rep["summary"][m].get(n)
        return fmt(s) if s else SAME_AS_SERIAL if m == "batched-spec" and n == 1 else "–"

    lines = [f"# Many clients at once (issue #30), {rep['when']}", "",
             f"    {rep['command']}", "",
             f"Machine: {mf['cpu']}, {mf['cores']} cores, {mf['memory_mib']} MiB, {mf['system']}; load average "
             f"{loads[0]:.2f} at the start, {min(loads):.2f}–{max(loads):.2f} over the run (1-minute, sampled "
             f"after every wave), {loads[-1]:.2f} at the end. specli {mf['commit']}, llama-cpp-python "
             f"{mf['llama_cpp_python']}; {rep['seconds'] / 60:.1f} min.", "",
             f"Target `{os.path.basename(rep['target'])}`"
             + (f", draft `{os.path.basename(rep['draft'])}`" if rep["draft"] else "")
             + f", {rep['threads']} threads a server, {len(rep['prompts'])} prompts ({', '.join(rep['prompts'])}), "
             f"greedy, up to {rep['max_tokens']} tokens each, {rep['repeat']} round(s); streamed openai clients, "
             "N at once per wave, modes interleaved wave by wave.", ""]
    lines += [f"Note: {n}." for n in rep["notes"]] + ([""] if rep["notes"] else [])
    def table(title: str, fmt) -> list[str]:
        """Clients by mode, one summary figure a cell."""
        return ["", f"## {title}", "", "| clients | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|",
                *(f"| {n} | " + " | ".join(cell(m, n, lambda s, n=n: fmt(s, n)) for m in modes) + " |" for n in ns)]

    def agg(s: dict, n: int) -> str:
        base = serial.get(n, {}).get("agg_tok_s")
        return f"{s['agg_tok_s']:.2f}" + (f" ({s['agg_tok_s'] / base:.2f}x)" if base else "")

    lines += goal_lines(rep["goal"])
    lines += table("Aggregate tokens/s (x the serial server with as many clients)", agg)
    lines += table("Each client: time to first token, mean / max (s)",
                   lambda s, n: f"{s['ttft_mean']:.2f} / {s['ttft_max']:.2f}")
    lines += table("Each client: tokens/s after its first token, median (slowest)",
                   lambda s, n: f"{s['client_tok_s_median']:.2f} ({s['client_tok_s_min']:.2f})")
    lines += per_client(rep, modes, GOAL_CLIENTS if GOAL_CLIENTS in ns else ns[-1])
    lines += table("Drafted / accepted tokens, cached prompt tokens, failed requests",
                   lambda s, n: f"{s['drafted']} / {s['accepted']}, {s['cached']}, {len(s['errors'])}")
    lines += ["", "## Texts against the single-client text", "",
              f"Each prompt alone on the serial server first (with the target's top-{TOP_LOGPROBS} logprobs) "
              "gave the single-client text; a text that parts from it is checked at the reference token where "
              f"it parts: a near-tie when the text goes on with a token the target scored under {NEAR_TIE} "
              "logits below the reference token there (the runner-up, or one further down). llama-server "
              "renders and decodes on its own; its texts are shown for comparison, outside the goal.", "",
              "| mode | " + " | ".join(f"N = {n}" for n in ns) + " |", "|---" * (len(ns) + 1) + "|"]
    for m in modes:
        cells = [text_cell(rep["checks"][m].get(n), SAME_AS_SERIAL if m == "batched-spec" and n == 1 else "–")
                 for n in ns]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    parted = [(m, n, c["prompt"], c["verdict"]) for m in modes for n, ws in rep["runs"][m].items() for w in ws
              for c in w["clients"] if c["verdict"] != IDENTICAL]
    if parted:
        lines += ["", "Where texts parted:", ""] + [f"- {m}, {n} clients, {pid}: {v}" for m, n, pid, v in parted]
    lines += ["", "## Servers", ""] + [f"- {name}: `{' '.join(os.path.basename(x) for x in argv)}`"
                                       for name, argv in rep["servers"].items()]
    lines += ["", "Aggregate tokens/s: every client's completion tokens over the waves' wall time (first "
              "request sent to last token received). A client's tokens/s: its tokens after the first over "
              "the time from its first token to its last. Time to first token includes the wait in the "
              "serial server's queue. One run on one machine: ratios taken side by side, absolute figures "
              "hold for this machine and its load only."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
