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

import math

import torch

from ..core.logits.rule import Step, chain_generated
from ..core.logprobs.op import row_entropy_op, token_logprobs_op
from ..core.sampling.randomness import uniforms_at
from ..core.sampling.slots import coin_slot

ACCEPTANCES = ("exact", "typical")
# vLLM's defaults for Medusa's typical acceptance.
POSTERIOR_THRESHOLD, POSTERIOR_ALPHA = 0.09, 0.3


def check_lossy(acceptance, posterior_threshold, posterior_alpha, acceptance_rate,
                verification) -> bool:
    """The lossy arguments of a public function; whether the call is lossy."""
    if acceptance not in ACCEPTANCES:
        raise ValueError(f'acceptance must be "exact" or "typical" (lossy: Medusa\'s typical '
                         f"acceptance); got {acceptance!r}")
    for name, value in (("posterior_threshold", posterior_threshold),
                        ("posterior_alpha", posterior_alpha)):
        if value is None:
            continue
        if acceptance != "typical":
            raise ValueError(f'{name} applies to acceptance="typical" only')
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    if acceptance_rate is not None:
        if acceptance == "typical":
            raise ValueError('acceptance_rate replaces the acceptance rule: pass it without '
                             'acceptance="typical"')
        if isinstance(acceptance_rate, bool) or not isinstance(acceptance_rate, (int, float)) \
                or not 0 <= acceptance_rate <= 1:
            raise ValueError(f"acceptance_rate must be a number in [0, 1]; got "
                             f"{acceptance_rate!r}")
    lossy = acceptance == "typical" or acceptance_rate is not None
    if lossy and verification != "token":
        raise ValueError('verification="block" is a rule of exact acceptance; lossy acceptance '
                         "replaces it")
    return lossy


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
        threshold = POSTERIOR_THRESHOLD if posterior_threshold is None else posterior_threshold
        alpha = POSTERIOR_ALPHA if posterior_alpha is None else posterior_alpha
        logprobs = token_logprobs_op(logits[:, :num_draft], ids, *parameters, 0, order)[0]
        entropy = row_entropy_op(logits[:, :num_draft], *parameters, order)
        bar = torch.clamp(alpha * torch.exp(-entropy.double()), max=threshold)
        kept = logprobs.double().exp() > bar
    else:  # the token rule's acceptance coins (core/sampling/slots.py), compared with the rate
        slots = torch.tensor([coin_slot(vocab, j) for j in range(num_draft)], dtype=torch.int64)
        kept = uniforms_at(seed, offset, batch, slots) < acceptance_rate
    kept = kept & drafting
    length = kept.int().cumprod(dim=-1).sum(dim=-1)  # (B,): the drafts emitted
    # The last token, from row `length`: typical acceptance's argmax after a rejected draft
    # (temperature 0), a draw from the row otherwise, by the exact op on that row alone.
    rejected = length < drafting.sum(dim=-1)
    last_rows = logits[torch.arange(batch, device=logits.device), length][:, None]
    temperature = parameters[0].expand(batch)
    if acceptance_rate is None:
        temperature = torch.where(rejected, torch.zeros_like(temperature), temperature)
    scratch = torch.zeros(2, batch, dtype=torch.int32, device=logits.device)
    last = exact_op(None, ids[:, :0], last_rows, None, scratch[0], scratch[1], seed, offset,
                    temperature, *parameters[1:], None, None, None, None, None, None, None, None,
                    None, None, None, order)[:, 0]
    position = torch.arange(rows, device=logits.device)
    padded = torch.cat([draft_token_ids.int(), torch.full_like(draft_token_ids[:, :1], -1).int()],
                       dim=1)
    output = torch.where(position < length[:, None], padded,
                         torch.where(position == length[:, None], last[:, None], -1))
    accepted_num.add_(kept.sum(dim=-1).to(accepted_num.dtype))
    emitted_num.add_(length.to(emitted_num.dtype))
    return output.int()
