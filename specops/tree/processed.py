"""A tree's rows of logits processed by each request's sampling parameters, then verified as
probabilities: the rule of verification from logits (docs/semantics.md, "Verification from
logits") for the tree's backends. No op plumbing: the reference imports it."""

from __future__ import annotations

from ..core.logits import rule


def on_processed_rows(verify, process=rule.processed_requests):
    """The from-logits backend of a tree verifier of probabilities: the target's rows (and the
    draft's, given as logits) processed by ``process`` (requests' rows (B, rows, V) and 1 or B
    values of each parameter -> float32 rows: the rule of core/logits/rule.py, or a faster way to
    the same rows), then ``verify`` on them."""
    def backend(draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed, offset,
                temperature, top_k, top_p, min_p, with_replacement=True, draft_temperature=None,
                draft_top_k=None, draft_top_p=None, draft_min_p=None):
        parameters = (temperature, top_k, top_p, min_p)
        target_probs = process(target_logits, *parameters)
        if draft_logits is not None:  # by the draft's own parameters, each None the target's
            draft_probs = process(draft_logits, *rule.drafts_own(
                (draft_temperature, draft_top_k, draft_top_p, draft_min_p), parameters))
        elif draft_probs is not None:
            draft_probs = draft_probs.float()  # the dtype of the processed target rows
        return verify(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                      with_replacement)
    backend.__name__ = verify.__name__.replace("_speculative_sampling",
                                               "_speculative_sampling_from_logits")
    return backend
