"""Weights shared by a server's sessions (specli.engine.weights): one load per file and
placement, closed with its last holder; a session given them loads its draft model there."""

from specli.engine.weights import Weights
from specli.options import Options
from specli.session import Session
from specli.speculate.verify import SamplingParams


def test_one_load_per_file_closed_with_its_last_holder(tiny_draft):
    w = Weights()
    a, b = w.get(tiny_draft), w.get(tiny_draft)
    assert a is b and w.holders(tiny_draft) == 2
    w.put(a)
    assert w.holders(tiny_draft) == 1 and b.n_vocab > 0  # still loaded for the other holder
    w.put(b)
    assert w.holders(tiny_draft) == 0


def test_two_sessions_share_their_draft_model(tiny_target, tiny_draft):
    w = Weights()
    opts = dict(target=tiny_target, draft=tiny_draft, threads=2, f32_kv=True)
    one, two = Session(Options(**opts), weights=w), Session(Options(**opts), weights=w)
    try:
        assert one.draft_model is two.draft_model and w.holders(tiny_draft) == 2
        prompt = one.prompt_tokens("Hello there", chat=False)
        texts = [s.generate(prompt, SamplingParams(temperature=0.0), 12).text() for s in (one, two)]
        assert texts[0] == texts[1]
    finally:
        one.close()
        assert w.holders(tiny_draft) == 1
        two.close()
    assert w.holders(tiny_draft) == 0
