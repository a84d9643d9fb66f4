"""Chain speculative sampling with block verification: the plain reference.

docs/block.md ("What the op computes") written in torch, step for step, vectorised over the batch
and nothing more: the oracle the Triton kernel is tested against, and the torch backend. It forms
every candidate row R_t at once, (B, N + 1, V) float32, which a kernel never needs to hold.
The steps are separate functions so that tests can assemble variants (a deliberately broken one).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..outputs import write_outputs
from ...core.sampling.probs import sanitize
from ..drafts import at_draft_ids
from ..processed import on_processed_rows
from ...core.sampling.race import chunk_masses, num_chunks, sample_rows
from ...core.sampling.sums import exact_total
from ...core.sampling.randomness import request_uniforms
from . import slots


class Drafts(NamedTuple):
    """Steps 1-4 for each request; every field has B rows."""

    ids: torch.Tensor  # (B, N) int64 draft ids as given
    safe_ids: torch.Tensor  # (B, N) ids clamped into [0, V): safe to gather, meaningful where valid
    ended: torch.Tensor  # (B, N + 1) bool: the draft has ended at t (t >= its length L)
    weights: torch.Tensor  # (B, N + 1) float64: w_t, 0 past the draft's end
    accepted: torch.Tensor  # (B, N) bool: position j passes its own coin (the alignment counter)
    uniforms: torch.Tensor  # (B, slots) every uniform of the request (slots.py)
    etas: torch.Tensor  # (B, N) eta_1..eta_N, the stop coins (a view of uniforms)


def read_drafts(draft_probs, draft_token_ids, target_probs, seed, offset) -> Drafts:
    """Steps 1-4: uniforms, draft length, alignment coins, weights."""
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    uniforms = request_uniforms(seed, offset, batch, slots.num_slots(num_draft, vocab))
    safe_ids = draft_token_ids.long().clamp(0, vocab - 1)  # only to gather safely
    p_d = sanitize(at_draft_ids(target_probs, safe_ids))
    q_d = None if draft_probs is None else sanitize(at_draft_ids(draft_probs, safe_ids))
    return drafts_of(draft_token_ids, vocab, p_d, q_d, uniforms)


def drafts_of(draft_token_ids, vocab: int, p_d, q_d, uniforms) -> Drafts:
    """Steps 2-4 from the sanitised values at the draft ids, p_d and q_d (B, N) (q_d None:
    one-hot drafts), and the request's uniforms (at least its first num_slots)."""
    batch, num_draft = draft_token_ids.shape

    # Step 2: the draft ends at its first id outside [0, V); ids are clamped only to gather safely.
    ids = draft_token_ids.long()
    valid = (ids >= 0) & (ids < vocab)
    safe_ids = ids.clamp(0, vocab - 1)
    length = valid.cumprod(dim=1).sum(dim=1)  # L: the valid prefix
    ended = torch.arange(num_draft + 1, device=ids.device) >= length[:, None]
    if q_d is None:
        q_d = torch.ones_like(p_d)

    # Step 3: token verification's coin at every position, judged alone (the accepted counter).
    accepted = valid & (uniforms[:, slots.coin_slots(vocab, num_draft)] * q_d < p_d)

    # Step 4: w_0 = 1, w_t = min(1, w_{t-1} p[d] / q[d]) in float64; 0 from the draft's end on.
    weights = [torch.ones(batch, dtype=torch.float64, device=ids.device)]
    for j in range(num_draft):
        num = weights[-1] * p_d[:, j].double()
        q = q_d[:, j].double()
        w = torch.where(num < q, num / q, (num > 0).double())  # q = 0: 1 if num > 0, else 0
        weights.append(torch.where(ended[:, j], 0.0, w))  # d_j is past the end
    return Drafts(ids, safe_ids, ended, torch.stack(weights, dim=1), accepted, uniforms,
                  uniforms[:, slots.stop_slots(vocab, num_draft)])


def candidate_rows(draft_probs, target_probs, drafts: Drafts, weights: torch.Tensor) -> torch.Tensor:
    """Step 5: R_t for t = 0..N, (B, N + 1, V) float32.

    R_t = relu(w_t p_t - q_t) (one-hot q: w_t p_t with d_t removed) while the draft runs at t;
    R_t = p_t where it has ended (t = L: the bonus row, or the row after the last valid draft).
    ``weights`` is drafts.weights; a parameter so that tests can build a wrong variant.
    """
    batch, positions, vocab = target_probs.shape
    p = sanitize(target_probs)
    running = ~drafts.ended
    w = torch.where(running, weights.float(), 1.0)[:, :, None]  # the float32 w_t the rows use
    if draft_probs is None:
        removed = torch.nn.functional.one_hot(drafts.safe_ids, vocab).bool()
        removed = torch.nn.functional.pad(removed & running[:, :-1, None], (0, 0, 0, 1))
        return (w * p).masked_fill(removed, 0.0)
    q = torch.nn.functional.pad(sanitize(draft_probs), (0, 0, 0, 1))  # q_N = 0
    q = torch.where(running[:, :, None], q, 0.0)
    return (w * p - q).clamp_min(0.0)


def stop_probabilities(rows: torch.Tensor, drafts: Drafts) -> torch.Tensor:
    """Step 6: h_t = m_t / (m_t + 1 - w_t), 1 where the denominator is 0: (B, N + 1) float64.

    m_t = sum(R_t) while the draft runs at t, w_t sum(p_t) where it has ended; the sums are the
    exact totals of the race's chunk masses (core/sampling/sums.py). h_0 is never used.
    """
    batch, positions, vocab = rows.shape
    masses = chunk_masses(rows.reshape(batch * positions, vocab))
    return stop_probabilities_of_masses(masses.reshape(batch, positions, num_chunks(vocab)), drafts)


def stop_probabilities_of_masses(masses: torch.Tensor, drafts: Drafts) -> torch.Tensor:
    """Step 6 from the chunk masses (B, N + 1, K) of the rows R_t: (B, N + 1) float64."""
    return stop_probabilities_of_totals(exact_total(masses), drafts)


def stop_probabilities_of_totals(row_mass: torch.Tensor, drafts: Drafts) -> torch.Tensor:
    """Step 6 from sum(R_t), the exact totals (B, N + 1) float64 of the rows' chunk masses."""
    w = drafts.weights
    mass = torch.where(drafts.ended, w * row_mass, row_mass)
    denominator = mass + (1.0 - w)
    return torch.where(denominator > 0, mass / denominator, 1.0)


def choose_tau(h: torch.Tensor, drafts: Drafts) -> torch.Tensor:
    """Step 7: tau = the largest t in 1..N with eta_t <= h_t, 0 if none: (B,) int64."""
    stops = torch.nn.functional.pad(drafts.etas.double() <= h[:, 1:], (1, 0), value=True)  # t = 0
    t = torch.arange(h.shape[1], device=h.device)
    return torch.where(stops, t, 0).amax(dim=1)


def sample_at(rows: torch.Tensor, target_probs: torch.Tensor, tau: torch.Tensor,
              drafts: Drafts) -> torch.Tensor:
    """Step 8: one token from R_tau; from p_tau when R_tau has no mass; -1 when p_tau has none."""
    batch, positions, vocab = rows.shape
    index = torch.arange(batch, device=rows.device)
    u_cdf = drafts.uniforms[:, slots.CDF_SLOT]
    u_race = drafts.uniforms[:, slots.race_slots(vocab)]
    row = rows[index, tau]
    has_mass = chunk_masses(row).sum(dim=1) > 0  # as the race sees it: some chunk mass > 0
    row = torch.where(has_mass[:, None], row, sanitize(target_probs[index, tau]))
    return sample_rows(row, u_race, u_cdf)


def block_speculative_sampling_reference(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
) -> torch.Tensor:
    """Returns output_token_ids (B, N+1) int32 and adds to accepted_num / emitted_num in place."""
    drafts = read_drafts(draft_probs, draft_token_ids, target_probs, seed, offset)
    rows = candidate_rows(draft_probs, target_probs, drafts, drafts.weights)
    tau = choose_tau(stop_probabilities(rows, drafts), drafts)
    token = sample_at(rows, target_probs, tau, drafts)
    # Step 9: d_0..d_{tau-1}, the token, then -1; the counters.
    return write_outputs(drafts.ids, tau, token, drafts.accepted, accepted_num, emitted_num)


# Verification from logits: the rows processed (chain/processed.py), then the function above.
block_speculative_sampling_from_logits_reference = on_processed_rows(block_speculative_sampling_reference)
