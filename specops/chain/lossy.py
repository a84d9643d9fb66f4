"""Opt-in lossy acceptance for a chain verified from logits (docs/semantics.md, "Lossy
acceptance"): the tokens do NOT follow the target's distribution. Medusa's typical acceptance
(Cai et al. 2024, as vLLM had it) keeps a draft whose probability under its position's processed
distribution p exceeds min(posterior_threshold, posterior_alpha * exp(-H(p))); a synthetic
acceptance rate keeps each draft with that probability, whatever the distributions, for
benchmarking an engine's loop. Both keep drafts up to the first one not kept, then emit one token
from that position's row: typical acceptance its argmax after a rejected draft, a draw from p
otherwise (every draft kept, or a synthetic rejection).

Each is composed of registered ops (the logprobs op with each row's entropy, and the exact chain
op on one row a request for the last token) and torch operations on (B, N) values; rule step 0
is applied as those ops read the logits, so the rows written are that one row a request."""

from __future__ import annotations

import torch

from ..core.logits.acceptance import (last_token_rows, lossy_outputs, rate_passes,
                                      typical_passes)
from ..core.logits.rule import Step, generated_counts
from ..core.logprobs.op import token_logprobs_op
from ..core.sampling.flattened import Padded


def lossy_chain(exact_op, draft_token_ids, target_logits, accepted_num, emitted_num, seed,
                offset, parameters, step: Step, order: str, posterior_threshold=None,
                posterior_alpha=None, acceptance_rate=None, cu_num_draft_tokens=None,
                max_num_draft_tokens: int = 0) -> torch.Tensor:
    """output_token_ids (B, N + 1) int32 of a chain under typical acceptance (acceptance_rate
    None) or a synthetic acceptance rate; the counters added to in place as the exact ops add to
    them. ``exact_op``: the chain's exact from-logits op, which draws the last token. Padded:
    draft ids (B, N), target logits (B, N + 1, V); flattened (``cu_num_draft_tokens`` given):
    (T,) and (T + B, V), N = max_num_draft_tokens, as the padded batch they stand for."""
    vocab = target_logits.shape[-1]
    bitmask = step.allowed_token_bitmask
    if cu_num_draft_tokens is None:
        ids = draft_token_ids.long()
        batch, num_draft = ids.shape
        rows = torch.arange(num_draft + 1, device=ids.device).expand(batch, -1)  # (B, N + 1)
    else:
        padded = Padded(cu_num_draft_tokens, draft_token_ids.shape[0], max_num_draft_tokens)
        ids = padded.ids(draft_token_ids).long()
        batch, num_draft = ids.shape
        rows = padded.target_rows  # each position's flattened row
    drafting = ((ids >= 0) & (ids < vocab)).int().cumprod(dim=-1).bool()  # before the first -1
    if acceptance_rate is None:  # each draft under its row: logprob and the row's entropy
        if cu_num_draft_tokens is None:
            logprobs, _, _, entropy = token_logprobs_op(
                target_logits[:, :num_draft], ids, *parameters, 0, order, True,
                ids[:, None, :].expand(batch, num_draft, -1), None,
                *step._replace(allowed_token_bitmask=None if bitmask is None
                               else bitmask[:, :num_draft]))
        else:
            tokens = torch.nn.functional.pad(ids, (0, 1), value=-1)
            logprobs, _, _, entropy = token_logprobs_op(
                target_logits, tokens, *parameters, 0, order, True, draft_token_ids,
                cu_num_draft_tokens, *step)
            logprobs, entropy = logprobs[:, :num_draft], entropy[:, :num_draft]
        kept = typical_passes(logprobs, entropy, posterior_threshold, posterior_alpha)
    else:
        kept = rate_passes(seed, offset, batch, vocab, num_draft, acceptance_rate)
    kept = kept & drafting
    # The last token, by the exact op on its row alone, the drafts before it counted.
    length, temperature = last_token_rows(kept, drafting, parameters[0], acceptance_rate is None)
    request = torch.arange(batch, device=ids.device)
    row = rows[request, length]
    if cu_num_draft_tokens is None:
        last_rows = target_logits[request, row][:, None]
        last_mask = None if bitmask is None else bitmask[request, row][:, None]
    else:
        last_rows = target_logits[row][:, None]
        last_mask = None if bitmask is None else bitmask[row][:, None]
    counts = step.output_token_counts
    if step.penalties() is not None:
        before = torch.arange(num_draft, device=ids.device) < length[:, None]
        counts = generated_counts(counts, ids, before)
    last_step = step._replace(allowed_token_bitmask=last_mask, output_token_counts=counts)
    last = exact_op(None, ids[:, :0], last_rows, None, seed, offset, temperature,
                    *parameters[1:], None, None, None, None, *last_step, order)[0][:, 0]
    return lossy_outputs(ids, kept, last, accepted_num, emitted_num)
