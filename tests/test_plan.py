"""The hardware planner: every branch, with boundaries exactly at the budget."""

import pytest

from specli.errors import SpecliError
from specli.hardware.plan import (
    GiB,
    MiB,
    ModelMemory,
    make_plan,
    memory_from_header,
    parse_size,
)
from specli.resolve.gguf_header import GGUFHeader, TensorInfo, read_gguf

CTX = 4096


def mem(name, n_layer, layer_mib, out_mib, kv_kib_per_token, n_vocab=32000, n_embd=2048):
    return ModelMemory(name, n_layer, tuple([layer_mib * MiB] * n_layer), out_mib * MiB, 100 * MiB,
                       kv_kib_per_token * 1024, n_vocab, n_embd)


T = mem("target", 32, 130, 300, 128)  # ~4.4 GiB of weights, 0.5 GiB KV at 4096
D = mem("draft", 16, 30, 100, 32)


def test_cpu_only_without_gpu_or_offload():
    assert make_plan(T, D, None, CTX, can_offload=True).branch == "cpu"
    p = make_plan(T, D, 8 * GiB, CTX, can_offload=False)
    assert (p.branch, p.target_gpu_layers, p.draft) == ("cpu", 0, "model")
    assert "no GPU offload in this llama.cpp build" in p.summary


def test_both_on_gpu_exactly_at_the_budget():
    need = T.gpu_bytes(-1, CTX) + D.gpu_bytes(-1, CTX)
    p = make_plan(T, D, need, CTX, True)
    assert (p.branch, p.target_gpu_layers, p.draft, p.draft_gpu_layers) == ("both-gpu", -1, "model", -1)
    assert make_plan(T, D, need - 1, CTX, True).branch != "both-gpu"


def test_draft_on_cpu_only_when_it_pays():
    budget = T.gpu_bytes(-1, CTX)  # the target alone, exactly
    p = make_plan(T, D, budget, CTX, True, draft_cpu_pays=True)
    assert (p.branch, p.target_gpu_layers, p.draft, p.draft_gpu_layers) == ("draft-cpu", -1, "model", 0)
    p = make_plan(T, D, budget, CTX, True, draft_cpu_pays=False)
    assert (p.branch, p.target_gpu_layers, p.draft) == ("target-gpu-lookup", -1, "lookup")
    assert "using prompt lookup" in p.summary and p.summary.count("\n") == 0


def test_partial_offload_with_lookup():
    budget = T.gpu_bytes(-1, CTX) - 1
    p = make_plan(T, D, budget, CTX, True)
    assert p.branch == "partial-lookup" and p.draft == "lookup"
    n = p.target_gpu_layers
    assert 0 < n <= T.n_layer
    assert T.gpu_bytes(n, CTX) <= budget < T.gpu_bytes(n + 1, CTX) or n == T.n_layer
    # a budget of exactly n layers keeps n, one byte less keeps n - 1
    exact = T.gpu_bytes(10, CTX)
    assert make_plan(T, D, exact, CTX, True).target_gpu_layers == 10
    assert make_plan(T, D, exact - 1, CTX, True).target_gpu_layers == 9


def test_nothing_fits():
    p = make_plan(T, D, T.gpu_bytes(1, CTX) - 1, CTX, True)
    assert (p.branch, p.target_gpu_layers, p.draft) == ("cpu-lookup", 0, "lookup")


def test_without_a_draft_model():
    p = make_plan(T, None, T.gpu_bytes(-1, CTX), CTX, True, wants_draft="lookup")
    assert (p.branch, p.target_gpu_layers, p.draft) == ("target-gpu", -1, "lookup")
    p = make_plan(T, None, 2 * GiB, CTX, True, wants_draft="none")
    assert p.branch == "partial-lookup" and p.draft == "none" and "lookup" not in p.summary


def test_context_size_moves_the_decision():
    budget = T.gpu_bytes(-1, 2048) + D.gpu_bytes(-1, 2048)
    assert make_plan(T, D, budget, 2048, True).branch == "both-gpu"
    assert make_plan(T, D, budget, 32768, True).branch != "both-gpu"


def test_parse_size():
    assert parse_size("6GiB") == 6 * GiB
    assert parse_size("6G") == 6 * GiB
    assert parse_size("512MiB") == 512 * MiB
    assert parse_size("1.5 GB") == int(1.5 * GiB)
    with pytest.raises(SpecliError, match="cannot read the memory size 'lots'"):
        parse_size("lots")


def test_memory_from_a_real_header(tiny_target):
    m = memory_from_header(read_gguf(tiny_target))
    assert m.n_layer == 2 and m.n_vocab == 49152 and m.n_embd == 64
    # 2 KV heads of 16 dims, K and V, f16, 2 layers
    assert m.kv_bytes_per_token == 2 * 2 * 16 * 2 * 2
    assert m.input_bytes == 49152 * 64 * 4 and m.output_bytes == 49152 * 64 * 4 + 64 * 4


def test_a_tensor_of_unknown_size_refuses_to_plan(tiny_target):
    h = read_gguf(tiny_target)
    i, t = next((i, t) for i, t in enumerate(h.tensors) if t.name.startswith("blk.1."))
    odd = GGUFHeader(h.version, h.metadata, h.tensors[:i] + [TensorInfo(t.name, t.shape, 9999, t.offset)]
                     + h.tensors[i + 1:], h.data_offset)
    with pytest.raises(SpecliError) as e:
        memory_from_header(odd, name="tiny")
    assert str(e.value) == (f"tiny: tensor {t.name} has ggml type 9999, whose size the installed gguf package "
                            "does not know; cannot plan memory (upgrade gguf)")
