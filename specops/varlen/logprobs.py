"""What ``specops.varlen``'s verifier from logits adds to its outputs when a caller asks for
logprobs: the logprobs op on the flattened rows as the padded batch they stand for, request b's
position j under row cu[b] + b + j (``chain/logprobs.py`` and ``tree/logprobs.py`` do it for the
padded layouts)."""

from __future__ import annotations

from ..core.logits.rule import Step
from ..core.logprobs.outputs import run


def varlen_logprobs(mode, num_top: int, target_logits, draft_token_ids, cu_num_draft_tokens,
                    output, parameters, step: Step, order: str) -> tuple:
    """A flattened batch's (B, max + 1) outputs' logprobs."""
    if mode is None:
        return ()
    return run(mode, num_top, target_logits, output, parameters, order, draft_token_ids,
               cu_num_draft_tokens, step)
