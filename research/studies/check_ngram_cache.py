#!/usr/bin/env python3
"""The Python port of llama.cpp's n-gram cache (``NgramCache`` in
research/lab/llamacpp_policies.py, both forms) against the C++ it ports, on random token
histories: the vendored ``common/ngram-cache.cpp`` compiled with a small driver that updates
the cache and drafts as llama-server's ``ngram-cache`` and the ``llama-lookup`` tool do.

Needs the llama.cpp build the tests make for llama-server (``tests/llama_server.py``:
~/.cache/specli/llama-server/VERSION/build; ``pytest tests/test_export.py`` builds it) and g++.

    python -m research.studies.check_ngram_cache [--cases 3000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from research.lab.llamacpp_policies import NgramCache
from tests import llama_server

DRIVER = r"""#include "ngram-cache.h"
#include <cstdio>
#include <iostream>
#include <vector>
// per case: whole n_draft L tokens... C calls...; prints each call's draft on a line
int main() {
    int whole, n_draft, L, C;
    while (std::cin >> whole >> n_draft >> L) {
        std::vector<llama_token> toks(L);
        for (auto & t : toks) std::cin >> t;
        std::cin >> C;
        common_ngram_cache ctx, dyn, stat;
        int seen = 0;
        for (int k = 0; k < C; ++k) {
            int c; std::cin >> c;
            std::vector<llama_token> inp(toks.begin(), toks.begin() + c);
            if (whole) {
                common_ngram_cache_update(ctx, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, inp, c - seen, false);
            } else {
                std::vector<llama_token> nw(toks.begin() + seen, toks.begin() + c);
                common_ngram_cache_update(ctx, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, nw, nw.size(), false);
            }
            seen = c;
            std::vector<llama_token> draft = {inp.back()};
            common_ngram_cache_draft(inp, draft, n_draft, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, ctx, dyn, stat);
            for (size_t i = 1; i < draft.size(); ++i) printf("%d ", draft[i]);
            printf("\n");
        }
    }
}
"""

LIBS = ["common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a", "ggml/src/libggml.a",
        "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a"]


def histories(rng: random.Random, n: int) -> list[tuple[bool, int, list[int], list[int]]]:
    """(whole history?, n_draft, tokens, the context lengths drafted from): half of them copies
    of a short source with edits, half random, over small and large vocabularies."""
    cases = []
    for _ in range(n):
        vocab, length = rng.choice([3, 5, 8, 20, 200]), rng.randint(3, 120)
        if rng.random() < 0.5:
            src = [rng.randrange(vocab) for _ in range(rng.randint(2, 30))]
            toks: list[int] = []
            while len(toks) < length:
                toks += [t if rng.random() > 0.1 else rng.randrange(vocab) for t in src]
        else:
            toks = [rng.randrange(vocab) for _ in range(length)]
        toks = toks[:length]
        calls, c = [], rng.randint(2, min(length, 40))
        while c <= length:
            calls.append(c)
            c += rng.randint(1, 5)
        cases.append((rng.random() < 0.5, rng.choice([1, 3, 8, 16]), toks, calls))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    build, src = llama_server.cache_dir() / "build", llama_server.source()
    missing = [lib for lib in LIBS if not (build / lib).is_file()]
    if missing:
        sys.exit(f"check_ngram_cache: no llama.cpp build at {build} ({missing[0]} missing); "
                 "run pytest tests/test_export.py first")
    with tempfile.TemporaryDirectory() as tmp:
        driver, exe = Path(tmp) / "driver.cpp", Path(tmp) / "driver"
        driver.write_text(DRIVER)
        subprocess.run(["g++", "-O1", "-std=c++17", f"-I{src / 'common'}", f"-I{src / 'include'}",
                        f"-I{src / 'ggml' / 'include'}", str(driver), str(src / "common" / "ngram-cache.cpp"),
                        "-o", str(exe), *(str(build / lib) for lib in LIBS), "-lpthread", "-fopenmp"], check=True)
        cases = histories(random.Random(a.seed), a.cases)
        text = "\n".join(f"{int(w)} {n} {len(t)} {' '.join(map(str, t))} {len(cs)} {' '.join(map(str, cs))}"
                         for w, n, t, cs in cases)
        done = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True)
        out = iter(done.stdout.splitlines())
    same = total = 0
    for whole, n_draft, toks, calls in cases:
        port = NgramCache(n_draft, whole_history=whole)
        for c in calls:
            ours, theirs = port.propose(toks[:c], 10 ** 6).tokens, [int(x) for x in next(out).split()]
            total += 1
            same += ours == theirs
            if ours != theirs and total - same <= 3:
                print(f"differs: whole={whole} n_draft={n_draft} history={toks[:c]}: port {ours}, C++ {theirs}")
    print(f"{same} of {total} drafts identical")
    sys.exit(0 if same == total else 1)


if __name__ == "__main__":
    main()
