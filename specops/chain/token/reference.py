"""Chain speculative sampling with token verification: the plain reference.

docs/token.md written in torch, step for step, vectorised over the batch and nothing more: it is
the oracle every backend is tested against. ``cpu.py`` beside it is the fast CPU backend; ``kernel.py``
the Triton kernel. The steps are separate functions so that the CPU backend can reuse them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..outputs import write_outputs
from ...core.sampling.probs import rows_at, sanitize
from ..drafts import at_draft_ids
from ..processed import on_processed_rows
from ...core.sampling.race import sample_rows
from ...core.sampling.randomness import request_uniforms
from . import slots


class Verdict(NamedTuple):
    """What steps 1-4 decide for each request; every field has B rows."""

    ids: torch.Tensor  # (B, N) int64 draft ids as given
    accepted: torch.Tensor  # (B, N) bool: position j accepted by its own coin (step 3)
    e: torch.Tensor  # (B,) the first position not accepted, N when all are (step 4)
    residual_at_e: torch.Tensor  # (B,) bool: a valid draft token was rejected at e (step 5)
    d_e: torch.Tensor  # (B,) the draft token at e, clamped into [0, V) (meaningful where residual)
    uniforms: torch.Tensor  # (B, slots) every uniform of the request (docs/internals/randomness.md)


def verify_drafts(draft_probs, draft_token_ids, target_probs, seed, offset,
                  uniforms=None) -> Verdict:
    """Steps 1-4: coins, draft length, acceptance of each position, and e. ``uniforms``: the
    request uniforms of (seed, offset) when the caller has drawn them already."""
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    if uniforms is None:
        uniforms = request_uniforms(seed, offset, batch, slots.num_slots(num_draft, vocab))
    # Step 2: ids outside [0, V) end the draft; clamped only to make the gathers safe.
    safe_ids = draft_token_ids.long().clamp(0, vocab - 1)
    p_draft = sanitize(at_draft_ids(target_probs, safe_ids))
    q_draft = None if draft_probs is None else sanitize(at_draft_ids(draft_probs, safe_ids))
    return verdict_of(draft_token_ids, vocab, p_draft, q_draft, uniforms)


def verdict_of(draft_token_ids, vocab: int, p_draft, q_draft, uniforms) -> Verdict:
    """Steps 2-4 from the sanitised values at the draft ids, p_draft and q_draft (B, N) (q_draft
    None: one-hot drafts), and the request's uniforms (at least its first num_slots)."""
    batch, num_draft = draft_token_ids.shape
    device = draft_token_ids.device
    coins = uniforms[:, slots.coin_slots(vocab, num_draft)]  # step 1

    # Step 2: ids outside [0, V) end the draft; clamped only to make the gathers safe.
    ids = draft_token_ids.long()
    valid = (ids >= 0) & (ids < vocab)
    safe_ids = ids.clamp(0, vocab - 1)

    # Step 3: one coin per position, judged on p_j[d_j] and q_j[d_j] alone.
    if q_draft is None:
        q_draft = torch.ones_like(p_draft)
    accepted = valid & (coins * q_draft < p_draft)

    # Step 4: e = the first position not accepted (N when all are; 0 without drafts).
    e = accepted.long().cumprod(dim=1).sum(dim=1)

    # Position N holds no draft: a valid draft was rejected at e only where e < N.
    rows = torch.arange(batch, device=device)
    residual_at_e = torch.nn.functional.pad(valid, (0, 1), value=False)[rows, e]
    d_e = torch.nn.functional.pad(safe_ids, (0, 1))[rows, e]
    return Verdict(ids, accepted, e, residual_at_e, d_e, uniforms)


def sampled_rows(draft_probs, target_probs, verdict: Verdict) -> torch.Tensor:
    """Step 5: the row each request samples, (B, V) float32.

    relu(p_e - q_e) where a valid draft token was rejected at e and that residual has mass; p_e
    elsewhere (the bonus token, a draft that ended at e, or a residual without mass).
    """
    e, use_residual = verdict.e, verdict.residual_at_e
    p_e = sanitize(rows_at(target_probs, e))
    if draft_probs is None or not draft_probs.shape[1]:  # q_e one-hot at d_e (or no drafts)
        at_d_e = torch.nn.functional.one_hot(verdict.d_e, p_e.shape[1]).bool()
        residual = p_e.masked_fill(at_d_e, 0.0)
    else:
        q_e = sanitize(rows_at(draft_probs, e.clamp(max=draft_probs.shape[1] - 1)))
        residual = (p_e - q_e).clamp_min(0.0)
    use_residual = use_residual & (residual.sum(dim=1) > 0)
    return torch.where(use_residual[:, None], residual, p_e)


def chain_speculative_sampling_reference(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
) -> torch.Tensor:
    """Returns output_token_ids (B, N+1) int32 and adds to accepted_num / emitted_num in place."""
    verdict = verify_drafts(draft_probs, draft_token_ids, target_probs, seed, offset)
    rows = sampled_rows(draft_probs, target_probs, verdict)
    u_cdf = verdict.uniforms[:, slots.CDF_SLOT]
    u_race = verdict.uniforms[:, slots.race_slots(target_probs.shape[2])]
    token = sample_rows(rows, u_race, u_cdf)  # -1 when p_e has no mass either
    # Steps 4 and 6: the accepted prefix, the token, then -1; the counters.
    return write_outputs(verdict.ids, verdict.e, token, verdict.accepted, accepted_num, emitted_num)


# Verification from logits: the rows processed (chain/processed.py), then the function above.
chain_speculative_sampling_from_logits_reference = on_processed_rows(chain_speculative_sampling_reference)
