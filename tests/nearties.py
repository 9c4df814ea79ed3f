"""Two greedy outputs of one target compared the way `specli bench` compares them: identical,
or parted where the target's top two candidates were a near-tie (batch shapes move the
numerics). A divergence that is not a near-tie fails."""

from specli.measure import lossless


def assert_same_or_near_tie(ctx, prompt_tokens, reference, other, label: str = "") -> str:
    """The verdict on ``other`` against ``reference`` (``ctx``, a context on the target, is
    used as scratch); fails unless it holds."""
    v = lossless.verdict(lossless.divergence(ctx, prompt_tokens, reference, other))
    assert lossless.holds(v), f"{label}: {v}"
    return v


def tokens_of_text(model, reference, text: str) -> list[int]:
    """``text`` (an answer that came back as text, e.g. from a server) as tokens: those of
    ``reference`` while their text is a prefix of it, then the rest tokenized."""
    i = 0
    while i < len(reference) and text.startswith(model.detokenize(reference[:i + 1])):
        i += 1
    head = model.detokenize(reference[:i])
    return list(reference[:i]) + model.tokenize(text[len(head):], add_special=False, parse_special=False)
