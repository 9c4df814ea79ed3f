import pytest

from specli.errors import TokenizerMismatch
from specli.resolve.gguf_header import VocabInfo, read_gguf, vocab_from_header
from specli.resolve.vocab import check_vocab, ensure_compatible, mismatch_message


def vocab(**kw):
    base = dict(vocab_type="BPE", n_tokens=300, bos=1, eos=2, add_bos=False, add_eos=False,
                tokens=tuple(f"t{i}" for i in range(300)))
    base.update(kw)
    if "n_tokens" in kw and "tokens" not in kw:
        base["tokens"] = tuple(f"t{i}" for i in range(kw["n_tokens"]))
    return VocabInfo(**base)


def test_identical_vocabularies_pass_every_rule():
    rules = check_vocab(vocab(), vocab())
    assert [r.name for r in rules] == ["vocabulary type", "BOS token", "EOS token", "add-BOS setting",
                                       "add-EOS setting", "vocabulary size", "token text"]
    assert all(r.ok for r in rules)
    assert mismatch_message(rules) is None


@pytest.mark.parametrize("kw, needle", [
    (dict(vocab_type="SPM"), "vocabulary type differs (target BPE, draft SPM)"),
    (dict(bos=7), "BOS token differs (target 1, draft 7)"),
    (dict(eos=9), "EOS token differs"),
    (dict(add_bos=True), "add-BOS setting differs"),
    (dict(add_eos=True), "add-EOS setting differs"),
    (dict(n_tokens=300 + 129), "vocabulary size differs (target 300, draft 429 (differ by 129"),
])
def test_each_rule_is_named(kw, needle):
    msg = mismatch_message(check_vocab(vocab(), vocab(**kw)))
    assert needle in msg


def test_size_within_128_and_token_text_from_id_5():
    assert mismatch_message(check_vocab(vocab(), vocab(n_tokens=428))) is None
    toks = list(vocab().tokens)
    toks[4] = "differs-below-5-is-ignored"
    assert mismatch_message(check_vocab(vocab(), vocab(tokens=tuple(toks)))) is None
    toks[123] = "foo"
    msg = mismatch_message(check_vocab(vocab(), vocab(tokens=tuple(toks))))
    assert msg == "draft vocabulary differs from target at token 123: 't123' vs 'foo'"
    with pytest.raises(TokenizerMismatch, match="at token 123"):
        ensure_compatible(vocab(), vocab(tokens=tuple(toks)))


def test_real_headers(tiny_target, tiny_draft, tiny_draft_edited):
    t = vocab_from_header(read_gguf(tiny_target))
    assert t.vocab_type == "BPE" and t.n_tokens == 49152
    assert mismatch_message(check_vocab(t, vocab_from_header(read_gguf(tiny_draft)))) is None
    msg = mismatch_message(check_vocab(t, vocab_from_header(read_gguf(tiny_draft_edited))))
    assert msg.startswith("draft vocabulary differs from target at token 1234: ") and msg.endswith("vs 'zzspecli'")
