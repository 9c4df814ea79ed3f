"""What a slot's next draft is worth to the batch (:class:`Estimate`), and the draft lengths
that promise the batch the most tokens/s (:func:`allocate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specli.speculate.controller import block_ratio


@dataclass
class Estimate:
    """What one request's next draft is worth: the chance its first token is accepted, each
    later one (given the ones before), the wall time of a one-row pass of what drafts (0:
    free, prompt lookup or tokens a grammar forces), the most tokens it may draft, and the
    rows its first pass holds (a draft model's catch-up over what its cache lacks, which
    yields its first token). A draft model's passes stall the whole batch (every member
    waits for its block), so they are priced as the batch's time; the slots drafting at once
    share them (one decode of the draft model's context per pass)."""

    first: float
    rest: float
    draft_token: float
    cap: int
    behind: int = 1


NOTHING = Estimate(0.0, 0.0, 0.0, 0)  # a request with nothing to draft this step
# who drafts a slot's share (:meth:`Batch.plan`): its own controller as served alone (no other
# slot busy, or fixed lengths), prompt lookup's copy at the length the batch gives it, or the
# draft model up to that length
ALONE, LOOKUP_SHARE, MODEL_SHARE = "alone", "lookup", "model"


def _draft_cost(r: Estimate, j: int, depth: list[int], passes: Sequence[float]) -> float:
    """Seconds ``r``'s token at depth ``j`` adds to the draft model's passes, which hold
    ``depth[j]`` rows at that depth so far."""
    if r.draft_token <= 0:
        return 0.0

    def pass_rows(rows: int) -> float:  # a draft pass over ``rows`` rows, in one-row passes
        return block_ratio(passes, rows) if rows > 0 else 0.0

    have = depth[j] if j < len(depth) else 0
    return r.draft_token * (pass_rows(have + (r.behind if j == 0 else 1)) - pass_rows(have))


def _next_token(requests: Sequence[Estimate], k: list[int], p: list[float], plain: float, depth: list[int],
                passes: Sequence[float]) -> tuple[int, float]:
    """The request whose next draft token nets the most at the ``plain`` rate (-1: none may
    draft more), and what that token costs to draft."""
    top, pick, cost = float("-inf"), -1, 0.0
    for i, r in enumerate(requests):
        if k[i] >= r.cap:
            continue
        c = _draft_cost(r, k[i], depth, passes)
        net = p[i] * (r.first if k[i] == 0 else r.rest) - plain * c
        if net > top:
            top, pick, cost = net, i, c
    return pick, cost


def allocate(requests: Sequence[Estimate], passes: Sequence[float]) -> tuple[list[int], float]:
    """Draft lengths for one batch step of these requests, and the tokens/s the step promises.
    ``passes[n - 1]``: the seconds of a pass over n rows (the batch's curve, :meth:`Batch.curve`:
    on a CPU it rises in steps, a tile of rows costing about as much as one row of it). The
    step costs the pass over all its rows (one per request, plus the drafts) and the draft
    model's passes, and yields one token per request plus the expected accepted drafts.

    Draft tokens are lined up by what each nets: its chance of being kept (a request's tokens
    in order, each worth less than the one before) less its drafting time at the batch's
    plain rate. A draft model's pass holds every slot drafting that deep at once, so a
    slot's token there costs only the rows it adds to the pass (priced by the curve's shape);
    the first token at a depth pays for the pass. The step takes the prefix of that line with
    the best tokens/s, none when no prefix beats the plain batch: over costs that rise in
    steps a token that does not pay alone may pay with the tokens that fill its tile or share
    its pass, so every prefix is priced. One request alone drafts up to its cap: its own
    controller prices its draft as it does serving alone."""
    n = len(requests)
    if n <= 1:
        return [r.cap for r in requests], 0.0
    if n > len(passes) or passes[n - 1] <= 0:
        return [0] * n, 0.0

    plain = n / passes[n - 1]
    k, p = [0] * n, [1.0] * n
    depth: list[int] = []  # rows of the draft model's pass at each depth so far
    tokens, drafting, rows = float(n), 0.0, n
    best, best_rate = list(k), plain
    while rows < len(passes):
        pick, cost = _next_token(requests, k, p, plain, depth, passes)
        if pick < 0:
            break
        r, j = requests[pick], k[pick]
        if r.draft_token > 0:
            if j == len(depth):
                depth.append(0)
            depth[j] += r.behind if j == 0 else 1
        drafting += cost
        p[pick] *= r.first if j == 0 else r.rest
        tokens += p[pick]
        k[pick] += 1
        rows += 1
        rate = tokens / (passes[rows - 1] + drafting)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = list(k), rate
    return best, best_rate
