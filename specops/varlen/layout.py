"""``specops.varlen``'s references and CPU backends: the padded batch a flattened one stands for
(``core/sampling/flattened.py``), verified by the padded samplers; the Triton kernels read the
flattened rows where they are (core/launch/rows_triton.py)."""

from __future__ import annotations

from ..core.logits.rule import Step
from ..core.sampling.flattened import Padded


# A from-logits op's arguments after the layout: the draft's logits, the counters, seed, offset,
# the four sampling parameters, then the draft's four and step 0's (core/logits/rule.py), among
# them the target rows' grammar bitmask (T + B, words), if the caller gave it.
BITMASK = 1 + 2 + 2 + 4 + 4 + Step._fields.index("allowed_token_bitmask")


def on_padded_batch(verify, draft_logits: bool = False):
    """A flattened-batch backend made of a padded one: the batch padded (``Padded``), then
    ``verify`` on it. ``draft_logits``: the arguments after the layout are a from-logits op's,
    the draft's logits padded as the draft rows are and the grammar bitmask as the target's."""
    def backend(draft_probs, draft_token_ids, target, cu, max_num_draft_tokens, *rest):
        padded = Padded(cu, draft_token_ids.shape[0], max_num_draft_tokens)
        if draft_logits:
            rest = [padded.drafts(rest[0]), *rest[1:]]
            if len(rest) > BITMASK and rest[BITMASK] is not None:
                rest[BITMASK] = padded.targets(rest[BITMASK])
        return verify(padded.drafts(draft_probs), padded.ids(draft_token_ids),
                      padded.targets(target), *rest)
    backend.__name__ = f"varlen_{verify.__name__}"
    return backend
