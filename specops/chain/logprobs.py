"""What a chain's verifier from logits adds to its outputs when a caller asks for logprobs
(docs/api.md, "Logprobs"): position j's token under row j, after rule step 0 for "processed"
(row j counting drafts 0..j-1 as generated)."""

from __future__ import annotations

from ..core.logits.rule import Step
from ..core.logprobs.outputs import run


def chain_logprobs(mode, num_top: int, target_logits, draft_token_ids, output, parameters,
                   step: Step, order: str) -> tuple:
    """A chain's (B, N + 1) outputs' logprobs: position j's token under row j."""
    if mode is None:
        return ()
    batch, rows, _ = target_logits.shape
    drafts = draft_token_ids[:, None, :].expand(batch, rows, -1)  # every row lists the drafts
    return run(mode, num_top, target_logits, output, parameters, order, drafts, None, step)
