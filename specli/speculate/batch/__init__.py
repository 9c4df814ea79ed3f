"""Several requests at once on one target context, speculation kept (``specli serve --parallel N``).

The target's context holds N sequences (slots). Each request runs the ordinary decoding loop
(:func:`specli.speculate.loop.generate`) on its own thread, on its slot's
:class:`~specli.engine.SeqContext`, with the slot's own drafter (lookup index, controller,
its sequence of the draft model's context, whose passes are batched the same way) and its
own :class:`~specli.speculate.verify.Sampler` (its seed's noise).
Every decode a request asks for goes to the :class:`Batcher`, which waits until every active
request has asked (its next token plus its draft block, or a chunk of its prompt) and runs
them as ONE llama_decode.
Each request therefore sees exactly the logits it would see alone (up to the float rounding
of another batch shape), and its output is what it gets served alone.

Draft lengths are chosen for the whole batch (:func:`allocate`): from the cost of a pass over
n rows (the calibrated batch curve, scaled by the passes timed lately: on a CPU it rises in
steps, so a tile of rows costs about what one row of it does), the draft model's measured pass
(batch time: every member waits for it; the slots drafting at once share each pass) and each
request's acceptance estimates (lookup's by the bucket of the match it has now), the draft
tokens are lined up by what each nets and the batch takes the prefix with the best tokens/s.
With one busy slot each request drafts as it does alone; with many, the batch already yields a
token per slot, so only likely tokens, or tokens that fill a tile already paid for, are worth
their rows, and a draft model drafts only where its passes pay (:meth:`Batch.plan`).


The package, by job: :mod:`.decode` (the decode thread and the :class:`Batcher`),
:mod:`.pricing` (what a draft is worth: :class:`Estimate`, :func:`allocate`), :mod:`.drafter`
(a slot's drafter, :class:`BatchDrafter`), :mod:`.pool` (the slots: :class:`Batch`, :class:`Slot`).
"""

from specli.speculate.batch.decode import Batcher, DecodeThread
from specli.speculate.batch.drafter import BatchDrafter
from specli.speculate.batch.pool import PREFILL_CHUNK, Batch, Slot
from specli.speculate.batch.pricing import ALONE, LOOKUP_SHARE, MODEL_SHARE, NOTHING, Estimate, allocate

__all__ = ["ALONE", "LOOKUP_SHARE", "MODEL_SHARE", "NOTHING", "PREFILL_CHUNK", "Batch", "BatchDrafter", "Batcher",
           "DecodeThread", "Estimate", "Slot", "allocate"]
