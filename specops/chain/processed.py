"""A chain's rows of logits processed by each request's sampling parameters, then verified as
probabilities: the rule of verification from logits (docs/semantics.md, "Verification from
logits") for the chain references and CPU backends. No op plumbing: the references import it."""

from __future__ import annotations

from ..core.logits import rule as params


def processed_inputs(draft_probs, target_logits, draft_logits, parameters, draft_parameters,
                     process=params.processed_rows):
    """The (draft_probs, target_probs) the chain rules verify: the target's logits processed by
    each request's parameters (temperature, top_k, top_p, min_p), and the draft's when given by
    the draft's own (each None: the target's), by ``process`` (the rule of core/logits/rule.py,
    or a faster way to the same rows); draft_probs as given otherwise (None: one-hot drafts)."""
    target_probs = params.processed_requests(target_logits, *parameters, process)
    if draft_logits is not None:
        draft_probs = params.processed_requests(
            draft_logits, *params.drafts_own(draft_parameters, parameters), process)
    return draft_probs, target_probs


def on_processed_rows(verify, process=params.processed_rows):
    """The from-logits backend of a verifier of probabilities: every row processed as
    ``processed_inputs`` processes it (by ``process``), then ``verify`` on the processed rows."""
    def backend(draft_probs, draft_token_ids, target_logits, draft_logits, accepted_num,
                emitted_num, seed, offset, temperature, top_k, top_p, min_p,
                draft_temperature=None, draft_top_k=None, draft_top_p=None, draft_min_p=None,
                *launch):
        draft_probs, target_probs = processed_inputs(
            draft_probs, target_logits, draft_logits, (temperature, top_k, top_p, min_p),
            (draft_temperature, draft_top_k, draft_top_p, draft_min_p), process)
        return verify(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num,
                      seed, offset, *launch)  # launch: a launcher's split, for warm-up and tests
    backend.__name__ = verify.__name__.replace("_speculative_sampling",
                                               "_speculative_sampling_from_logits")
    return backend
