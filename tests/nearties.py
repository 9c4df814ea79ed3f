"""Two greedy outputs of one target compared the way `specli bench` compares them: identical,
or parted where the target's top two candidates were a near-tie (batch shapes move the
numerics). A divergence that is not a near-tie fails."""

from specli.measure import lossless
from specli.measure.lossless import tokens_of_text

__all__ = ["assert_same_or_near_tie", "tokens_of_text"]


def assert_same_or_near_tie(ctx, prompt_tokens, reference, other, label: str = "") -> str:
    """The verdict on ``other`` against ``reference`` (``ctx``, a context on the target, is
    used as scratch); fails unless it holds."""
    v = lossless.verdict(lossless.divergence(ctx, prompt_tokens, reference, other))
    assert lossless.holds(v), f"{label}: {v}"
    return v
