"""A chain's rows of logits processed by each request's sampling parameters, then verified as
probabilities: the rule of verification from logits (docs/semantics.md, "Verification from
logits") for the chain references and CPU backends. No op plumbing: the references import it."""

from __future__ import annotations

from ..core.logits import rule as params


def processed_inputs(draft_probs, draft_token_ids, target_logits, draft_logits, parameters,
                     draft_parameters, process=params.each_processed, step=params.Step(),
                     min_p_last=False):
    """The (draft_probs, target_probs) the chain rules verify: the target's logits under ``step``
    (rule step 0: grammar mask, logit bias, penalties with the drafts before each row counted as
    generated) processed by each request's parameters (temperature, top_k, top_p, min_p), and the
    draft's when given by the draft's own (each None: the target's), by ``process`` (a
    ``processed_request_sets`` process: the rule's rows of each set, or a faster way to the same
    rows), in the order ``min_p_last`` says; draft_probs as given otherwise (None: one-hot
    drafts)."""
    target_logits = step.adjusted(
        target_logits, lambda counts: params.chain_generated(counts, draft_token_ids))
    sets = [(target_logits, parameters)]
    if draft_logits is not None:
        sets.append((draft_logits, params.drafts_own(draft_parameters, parameters)))
    processed = params.processed_request_sets(sets, process, min_p_last)
    return (processed[1] if draft_logits is not None else draft_probs), processed[0]


def on_processed_rows(verify, process=params.each_processed, tell_processed: bool = False):
    """The from-logits backend of a verifier of probabilities: every row processed as
    ``processed_inputs`` processes it (by ``process``), then ``verify`` on the processed rows.
    Its arguments: the from-logits op's (chain/from_logits.py), then a launcher's split.
    ``tell_processed``: ``verify`` is told which rows are processed logits (float32 values in
    [0, 1], which need no check): processed=(target's, draft's)."""
    def backend(draft_probs, draft_token_ids, target_logits, draft_logits, accepted_num,
                emitted_num, seed, offset, temperature, top_k, top_p, min_p, *rest):
        draft_parameters, step, order, launch = params.optional_arguments(rest)
        draft_probs, target_probs = processed_inputs(
            draft_probs, draft_token_ids, target_logits, draft_logits,
            (temperature, top_k, top_p, min_p), draft_parameters, process, step,
            params.ORDERS[order])
        told = dict(processed=(True, draft_logits is not None)) if tell_processed else {}
        # launch: a launcher's split, for warm-up and tests
        return verify(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num,
                      seed, offset, *launch, **told)
    backend.__name__ = verify.__name__.replace("_speculative_sampling",
                                               "_speculative_sampling_from_logits")
    return backend
