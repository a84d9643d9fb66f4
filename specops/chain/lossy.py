"""Opt-in lossy acceptance for a chain verified from logits (docs/semantics.md, "Lossy
acceptance"): the tokens do NOT follow the target's distribution. Medusa's typical acceptance
(Cai et al. 2024, as vLLM had it) keeps a draft whose probability under its position's processed
distribution p exceeds min(posterior_threshold, posterior_alpha * exp(-H(p))); a synthetic
acceptance rate keeps each draft with that probability, whatever the distributions, for
benchmarking an engine's loop. Both keep drafts up to the first one not kept, then emit one token
from that position's row: typical acceptance its argmax after a rejected draft, a draw from p
otherwise (every draft kept, or a synthetic rejection).

Each is composed of registered ops (the logprobs and entropy ops, and the exact chain op on one
row a request for the last token) and torch operations on (B, N) values: the rows written are
rule step 0's adjusted copy (where given) and that one row a request."""

from __future__ import annotations

import torch

from ..core.logits.acceptance import (last_token_rows, lossy_outputs, rate_passes,
                                      typical_passes)
from ..core.logits.rule import Step, chain_generated
from ..core.logprobs.op import row_entropy_op, token_logprobs_op


def lossy_chain(exact_op, draft_token_ids, target_logits, accepted_num, emitted_num, seed,
                offset, parameters, step: Step, order: str, posterior_threshold=None,
                posterior_alpha=None, acceptance_rate=None) -> torch.Tensor:
    """output_token_ids (B, N + 1) int32 of a chain under typical acceptance (acceptance_rate
    None) or a synthetic acceptance rate; the counters added to in place as the exact ops add to
    them. ``exact_op``: the chain's exact from-logits op, which draws the last token."""
    batch, rows, vocab = target_logits.shape
    num_draft = rows - 1
    logits = step.adjusted(target_logits,
                           lambda counts: chain_generated(counts, draft_token_ids))
    ids = draft_token_ids.long()
    drafting = ((ids >= 0) & (ids < vocab)).int().cumprod(dim=-1).bool()  # before the first -1
    if acceptance_rate is None:
        logprobs = token_logprobs_op(logits[:, :num_draft], ids, *parameters, 0, order)[0]
        entropy = row_entropy_op(logits[:, :num_draft], *parameters, order)
        kept = typical_passes(logprobs, entropy, posterior_threshold, posterior_alpha)
    else:
        kept = rate_passes(seed, offset, batch, vocab, num_draft, acceptance_rate)
    kept = kept & drafting
    # The last token, by the exact op on its row alone.
    length, temperature = last_token_rows(kept, drafting, parameters[0], acceptance_rate is None)
    last_rows = logits[torch.arange(batch, device=logits.device), length][:, None]
    scratch = torch.zeros(2, batch, dtype=torch.int32, device=logits.device)
    last = exact_op(None, ids[:, :0], last_rows, None, scratch[0], scratch[1], seed, offset,
                    temperature, *parameters[1:], None, None, None, None, None, None, None, None,
                    None, None, None, order)[:, 0]
    return lossy_outputs(draft_token_ids, kept, last, accepted_num, emitted_num)
