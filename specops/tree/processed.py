"""A tree's rows of logits processed by each request's sampling parameters, then verified as
probabilities: the rule of verification from logits (docs/semantics.md, "Verification from
logits") for the tree's backends. No op plumbing: the reference imports it."""

from __future__ import annotations

import torch

from ..core.logits import rule


def on_processed_rows(verify, process=rule.processed_requests):
    """The from-logits backend of a tree verifier of probabilities: the target's rows (after rule
    step 0 where given: grammar mask, logit bias, penalties counting each node's path as
    generated) and the draft's, given as logits, processed by ``process`` (requests' rows
    (B, rows, V) and 1 or B values of each parameter -> float32 rows: the rule of
    core/logits/rule.py, or a faster way to the same rows), then ``verify`` on them."""
    def backend(draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed, offset,
                temperature, top_k, top_p, min_p, with_replacement=True, *rest):
        draft_parameters, step, order, verification = rule.optional_arguments(rest)
        min_p_last = rule.ORDERS[order]
        parameters = (temperature, top_k, top_p, min_p)
        target_logits = step.adjusted(
            target_logits, lambda counts: tree_generated(counts, draft_token_ids, parents))
        target_probs = process(target_logits, *parameters, min_p_last=min_p_last)
        if draft_logits is not None:  # by the draft's own parameters, each None the target's
            draft_probs = process(draft_logits, *rule.drafts_own(draft_parameters, parameters),
                                  min_p_last=min_p_last)
        elif draft_probs is not None:
            draft_probs = draft_probs.float()  # the dtype of the processed target rows
        return verify(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                      with_replacement, *verification)
    backend.__name__ = verify.__name__.replace("_speculative_sampling",
                                               "_speculative_sampling_from_logits")
    return backend


def tree_generated(counts, draft_token_ids, parents) -> torch.Tensor:
    """(B, M + 1, V) int64: node n's generated tokens, the output's counts (B, V) and the tokens
    on the path from the root to node n, n's own included (row n is the target's after that
    path). An absent node's row, never read, counts whatever its links give."""
    vocab = counts.shape[-1]
    ids, given = draft_token_ids.long(), parents.long()
    batch, num_nodes = ids.shape
    out = counts.long()[:, None, :].repeat(1, num_nodes + 1, 1)
    request = torch.arange(batch, device=ids.device)
    for i in range(num_nodes):  # a parent comes before its children
        valid = (ids[:, i] >= 0) & (ids[:, i] < vocab)
        out[:, i + 1] = out[request, given[:, i].clamp(0, i)]
        out[request, i + 1, ids[:, i].clamp(0, vocab - 1)] += valid.long()  # its own token
    return out
