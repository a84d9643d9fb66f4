"""What a chain's verifier from logits adds to its outputs when a caller asks for logprobs
(docs/api.md, "Logprobs"): position j's token under row j, after rule step 0 for "processed"."""

from __future__ import annotations

from ..core.logits.rule import Step, chain_generated
from ..core.logprobs.outputs import run


def chain_logprobs(mode, num_top: int, target_logits, draft_token_ids, output, parameters,
                   step: Step, order: str) -> tuple:
    """A chain's (B, N + 1) outputs' logprobs: position j's token under row j."""
    if mode is None:
        return ()
    if mode == "processed":
        target_logits = step.adjusted(
            target_logits, lambda counts: chain_generated(counts, draft_token_ids))
    return run(mode, num_top, target_logits, output, parameters, order)
