"""The fused from-logits backend of a chain verifier's Triton launcher (token and block
verification): every row's statistics (``core/logits/launch.py``), then the verifier's kernels
reading the logits through them; its torch twin is ``processed.on_processed_rows``."""

from __future__ import annotations

from ..core.logits.launch import row_statistics, step_arguments
from ..core.logits.rule import ORDERS, drafts_own, optional_arguments
from .rows import Flattened


def on_row_statistics(verify):
    """The fused from-logits backend of a Triton verifier of probabilities: every row's
    statistics first, then ``verify`` reading the logits through them (its ``target_stats`` and
    ``draft_stats``); no processed probabilities are written, and rule step 0 (a grammar mask, a
    logit bias, penalties) is applied to the target's logits as both read them."""
    def backend(draft_probs, draft_token_ids, target_logits, draft_logits, accepted_num,
                emitted_num, seed, offset, temperature, top_k, top_p, min_p, *rest,
                flattened: Flattened | None = None):
        parameters = (temperature, top_k, top_p, min_p)
        draft_parameters, step, order, launch = optional_arguments(rest)
        min_p_last = ORDERS[order]
        target_step = None  # none: the plain kernels, whatever the ids' dtype
        if step.changes_logits():
            target_step = step_arguments(step, draft_token_ids, target_logits.device,
                                         None if flattened is None
                                         else flattened.max_num_draft_tokens)

        def statistics(logits, bonus, parameters, step=None):
            """Its rows' statistics, laid out N + bonus a request (flattened too)."""
            logits = logits if logits.stride(-1) == 1 else logits.contiguous()  # unit stride
            layout = None if flattened is None else (
                flattened.cu_num_draft_tokens, flattened.max_num_draft_tokens + bonus, bonus)
            return logits, row_statistics(logits, *parameters, layout, min_p_last, step)

        target_logits, target_stats = statistics(target_logits, 1, parameters, target_step)
        draft_stats = None
        if draft_logits is not None:
            draft_probs, draft_stats = statistics(draft_logits, 0,
                                                  drafts_own(draft_parameters, parameters))
        return verify(draft_probs, draft_token_ids, target_logits, accepted_num, emitted_num,
                      seed, offset, *launch, target_stats=target_stats, draft_stats=draft_stats,
                      flattened=flattened, target_step=target_step)
    backend.__name__ = verify.__name__.replace("_speculative_sampling",
                                               "_speculative_sampling_from_logits")
    return backend
