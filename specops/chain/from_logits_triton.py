"""The fused from-logits backend of a chain verifier's Triton launcher (token and block
verification): every row's statistics (``core/logits/launch.py``), then the verifier's kernels
reading the logits through them; its torch twin is ``processed.on_processed_rows``."""

from __future__ import annotations

import torch

from ..core.logits.launch import row_statistics, step_arguments
from ..core.logits.rule import (ORDERS, Step, chain_generated, drafts_own, generated_counts,
                                optional_arguments)
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


def adjusted_target_logits(target_logits, draft_token_ids, step: Step,
                           flattened: Flattened | None):
    """The target's rows after rule step 0 (``Step.adjusted``), for the callers that read
    adjusted rows rather than apply step 0 as they read them (logprobs). A flattened batch's rows
    (T + B, V) are each taken as a request of one row: its request's bias and output counts, and
    as generated the drafts before it (request b's rows from row cu[b] + b, as core/sampling/flattened.py
    places them; its drafts from cu[b])."""
    if flattened is None:
        return step.adjusted(target_logits,
                             lambda counts: chain_generated(counts, draft_token_ids))
    cu = flattened.cu_num_draft_tokens
    batch, rows = cu.shape[0] - 1, target_logits.shape[0]
    num_tokens = rows - batch
    # Each row's request and position, its request's start clamped into [0, T] as the kernels
    # clamp it, so that no layout reads out of bounds.
    start = cu[:-1].to(torch.int64).clamp(0, num_tokens)
    first_rows = start + torch.arange(batch, device=cu.device)
    row = torch.arange(rows, device=cu.device)
    request = (torch.searchsorted(first_rows, row, right=True) - 1).clamp(0, batch - 1)
    position = row - first_rows[request]

    def generated(counts):  # a row's output counts, and its drafts [cu[b], cu[b] + position)
        most = flattened.max_num_draft_tokens
        if num_tokens == 0 or most == 0:  # no drafts at all
            return counts.int()[:, None]
        window = start[request][:, None] + torch.arange(most, device=cu.device)  # (rows, most)
        before = (window < start[request][:, None] + position[:, None]) & (window < num_tokens)
        drafts = draft_token_ids[window.clamp(max=num_tokens - 1)]
        return generated_counts(counts, drafts, before)[:, None]

    def per_row(value):  # a request's tensor (B, ...) or parameter (1 or B,), for each row
        if value is None or value.dim() == 1 and value.shape[0] == 1:
            return value
        return value[request]

    bitmask = step.allowed_token_bitmask
    rows_step = Step(*(per_row(value) for value in step._replace(allowed_token_bitmask=None)))
    rows_step = rows_step._replace(allowed_token_bitmask=None if bitmask is None else
                                   bitmask[:, None])
    return rows_step.adjusted(target_logits[:, None], generated)[:, 0]
