"""The fused from-logits backend of a chain verifier's Triton launcher (token and block
verification): every row's statistics (``core/logits/launch.py``), then the verifier's kernels
reading the logits through them; its torch twin is ``processed.on_processed_rows``."""

from __future__ import annotations

from ..core.logits.launch import row_statistics


def on_row_statistics(verify):
    """The fused from-logits backend of a Triton verifier of probabilities: every row's
    statistics first, then ``verify`` reading the logits through them (its ``target_stats`` and
    ``draft_stats``); no processed probabilities are written."""
    def backend(draft_probs, draft_token_ids, target_logits, draft_logits, accepted_num,
                emitted_num, seed, offset, temperature, top_k, top_p, min_p, *launch):
        parameters = (temperature, top_k, top_p, min_p)
        target_logits = (target_logits if target_logits.stride(2) == 1
                         else target_logits.contiguous())  # the row loops' unit stride
        target_stats = row_statistics(target_logits, *parameters)
        draft_stats = None
        if draft_logits is not None:
            draft_logits = (draft_logits if draft_logits.stride(2) == 1
                            else draft_logits.contiguous())
            draft_stats = row_statistics(draft_logits, *parameters)
            draft_probs = draft_logits
        return verify(draft_probs, draft_token_ids, target_logits, accepted_num, emitted_num,
                      seed, offset, *launch, target_stats=target_stats, draft_stats=draft_stats)
    backend.__name__ = verify.__name__.replace("_speculative_sampling",
                                               "_speculative_sampling_from_logits")
    return backend
