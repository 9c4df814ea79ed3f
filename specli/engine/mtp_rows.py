"""The MTP (NextN) hidden rows: what an MTP context reads from its target.

A target context with an MTP context over it exports a hidden row for every token it decodes
(:meth:`HiddenRows.hidden_rows`); the MTP context exports one where logits are asked
(:meth:`HiddenRows.hidden_row`). llama.cpp aborts the process on misuse, so
:func:`check_mtp_head` checks its preconditions before an MTP context is made
(:meth:`specli.engine.Context.mtp_context`).
"""

from __future__ import annotations

import numpy as np

from specli.engine.binding import LX, Model, mtp_available
from specli.errors import SpecliError


def check_mtp_head(target: Model, head: Model) -> None:
    """Refuse an MTP context of ``head`` (``target`` itself, or an MTP-only sidecar GGUF of it)
    over ``target`` when llama.cpp would abort on it."""
    if not mtp_available():
        raise SpecliError("this llama-cpp-python has no MTP support (llama_cpp_ext nextn functions)")
    if head.n_mtp_layers <= 0:
        raise SpecliError(f"{head.name} has no MTP layers loaded (converted without its MTP block?)")
    # a sidecar reads the target's hidden rows and speaks its vocabulary (llama.cpp asserts
    # the first: "MTP input row width must match the target h_nextn width")
    for what, mine, its in (("hidden size", target.n_embd, head.n_embd),
                            ("vocabulary", target.n_vocab, head.n_vocab)):
        if mine != its:
            raise SpecliError(f"{head.name}: an MTP head for {what} {its}, the target's is {mine} "
                              "(a sidecar for another model)")


class HiddenRows:
    """The hidden-row half of :class:`specli.engine.Context` (which provides ``handle`` and
    ``model``)."""

    def export_hidden_rows(self, every_token: bool) -> None:
        """From now on export hidden rows: one per token decoded (``every_token``: a target
        feeding an MTP context), or only where logits are asked (the MTP context itself)."""
        LX.llama_set_embeddings_nextn(self.handle, True, not every_token)

    def hidden_rows(self, n: int) -> np.ndarray | None:
        """A copy of the hidden rows of the last decode's ``n`` tokens (a context whose hidden
        rows are exported: :meth:`specli.engine.Context.mtp_context`); None when llama.cpp has none."""
        ptr = LX.llama_get_embeddings_nextn(self.handle)
        return np.ctypeslib.as_array(ptr, shape=(n, self.model.n_embd)).copy() if ptr else None

    def hidden_row(self, i: int) -> np.ndarray:
        """A copy of the hidden row of the last decode's output ``i`` (an MTP context's own)."""
        return np.ctypeslib.as_array(LX.llama_get_embeddings_nextn_ith(self.handle, i),
                                     shape=(self.model.n_embd,)).copy()
