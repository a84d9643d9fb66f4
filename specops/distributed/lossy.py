"""Opt-in lossy acceptance on vocabulary shards (docs/semantics.md, "Lossy acceptance"): the
chain rule of chain/lossy.py, each draft's logprob and each row's entropy found over every rank
(distributed/logits.py), the last token drawn by the exact vocabulary-parallel call on one row a
request. Its tokens do NOT follow the target's distribution."""

from __future__ import annotations

import torch

from ..core.logits.acceptance import (last_token_rows, lossy_outputs, rate_passes,
                                      typical_passes)
from ..core.logits.rule import per_row
from .logits import shard_entropy, shard_logprobs
from .shards import Shard


def lossy_shard_chain(shard: Shard, exact, logits, draft_token_ids, accepted_num, emitted_num,
                      seed, offset, parameters, searches: int, min_p_last: bool, order: str,
                      posterior_threshold=None, posterior_alpha=None, acceptance_rate=None):
    """output_token_ids (B, N + 1) int32 of a chain's shard rows (B, N + 1, width), already
    adjusted by rule step 0; the counters added to in place. ``exact``: the vocabulary-parallel
    from-logits function, which draws the last token."""
    batch, rows, width = logits.shape
    num_draft = rows - 1
    ids = draft_token_ids.long()
    drafting = ((ids >= 0) & (ids < shard.vocab)).int().cumprod(dim=-1).bool()
    if acceptance_rate is None:
        drafts = logits[:, :num_draft].reshape(batch * num_draft, width)
        each = [per_row(value, batch, num_draft) for value in parameters]
        logprobs = shard_logprobs(shard, drafts, ids.reshape(-1), *each, searches, min_p_last,
                                  0)[0].view(batch, num_draft)
        entropy = shard_entropy(shard, drafts, *each, searches, min_p_last).view(batch,
                                                                                num_draft)
        kept = typical_passes(logprobs, entropy, posterior_threshold, posterior_alpha)
    else:
        kept = rate_passes(seed, offset, batch, shard.vocab, num_draft, acceptance_rate)
    kept = kept & drafting
    length, temperature = last_token_rows(kept, drafting, parameters[0], acceptance_rate is None)
    last_rows = logits[torch.arange(batch, device=logits.device), length][:, None]
    last = exact(None, ids[:, :0], last_rows, temperature=temperature, top_k=parameters[1],
                 top_p=parameters[2], min_p=parameters[3], processing_order=order, seed=seed,
                 offset=offset, vocab_start=shard.start, vocab_size=shard.vocab,
                 group=shard.group)[0][:, 0]
    return lossy_outputs(draft_token_ids, kept, last, accepted_num, emitted_num)
