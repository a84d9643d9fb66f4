"""Pure-torch reference of chain speculative sampling: the specification in code.

This is the CPU implementation of ``torch.ops.specops.chain_speculative_sampling`` and the oracle the
Triton kernel is tested against token for token.  It is vectorised over the batch and reads only
what SPEC.md's performance model allows: the 2N scalars p_j[d_j], q_j[d_j] and, per request, the
row(s) at the first rejected position e.  Step numbers refer to SPEC.md, "Semantics".

Sampling from a row r (step 5) uses the launch-independent algorithm the kernel uses:
  * split the vocabulary into chunks of CHUNK_SIZE tokens; chunk k has mass w_k = sum(r[chunk k]);
  * chunk k wins an exponential race with key -log(u_k) / w_k (smallest key wins, ties go to the
    lower chunk), which picks chunk k with probability w_k / sum(w);
  * inside the winning chunk, the token is the first t with r_t > 0 and cumsum(r)_t > u * w_k.
Masses and cumulative sums are float64 so that the kernel's different summation order changes a
token only when a uniform lands within ~1e-16 of a boundary.
"""

from __future__ import annotations

import torch

from .randomness import CHUNK_SIZE, cdf_slot, num_chunks, race_slot, request_uniforms


def sanitize(probs: torch.Tensor) -> torch.Tensor:
    """Float32 copy in which NaN, +-inf and negative probabilities count as 0 (step 3)."""
    return probs.float().nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).clamp_min_(0.0)


def chunk_masses(rows: torch.Tensor) -> torch.Tensor:
    """Float64 mass of every CHUNK_SIZE-token chunk of each row: (B, V) -> (B, K)."""
    batch, vocab = rows.shape
    full = vocab // CHUNK_SIZE
    masses = [rows[:, : full * CHUNK_SIZE].view(batch, full, CHUNK_SIZE).sum(-1, dtype=torch.float64)]
    if vocab % CHUNK_SIZE:
        masses.append(rows[:, full * CHUNK_SIZE :].sum(-1, keepdim=True, dtype=torch.float64))
    return torch.cat(masses, dim=1)


def race_winner(masses: torch.Tensor, race_uniforms: torch.Tensor):
    """Exponential race over chunks: (winning chunk, winning key); key is inf when all masses are 0."""
    keys = -torch.log(race_uniforms.double()) / masses  # mass 0 -> +inf: never wins
    key, chunk = keys.min(dim=1)  # min returns the first (lowest) chunk among ties
    return chunk, key


def chunk_values(rows: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """The CHUNK_SIZE values of chunk ``chunk[b]`` of each row b, zero past the vocabulary: (B, C)."""
    vocab = rows.shape[1]
    token = chunk[:, None] * CHUNK_SIZE + torch.arange(CHUNK_SIZE, device=rows.device)
    return rows.gather(1, token.clamp(max=vocab - 1)).where(token < vocab, 0.0)


def inverse_cdf(values: torch.Tensor, mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index in each (B, C) chunk of the first positive value whose float64 prefix sum exceeds u * mass."""
    positive = values > 0
    cdf = values.double().cumsum(dim=1)
    hit = positive & (cdf > (u.double() * mass)[:, None])
    # Rounding can leave u * mass at or above the last prefix sum: take the last positive value.
    last_positive = values.shape[1] - 1 - positive.flip(1).to(torch.int8).argmax(dim=1)
    return torch.where(hit.any(dim=1), hit.to(torch.int8).argmax(dim=1), last_positive)


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
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    device = target_probs.device
    rows = torch.arange(batch, device=device)

    uniforms = request_uniforms(seed, offset, batch, race_slot(num_draft, num_chunks(vocab)))
    coins = uniforms[:, :num_draft]
    u_cdf = uniforms[:, cdf_slot(num_draft)]
    u_race = uniforms[:, race_slot(num_draft, 0) :]

    # Step 2: ids outside [0, V) end the draft; clamp them only to make the gathers safe.
    ids = draft_token_ids.long()
    valid = (ids >= 0) & (ids < vocab)
    safe_ids = ids.clamp(0, vocab - 1)

    # Step 3: one coin per position, judged on p_j[d_j] and q_j[d_j] alone.
    p_draft = sanitize(target_probs[:, :num_draft].gather(2, safe_ids[..., None]).squeeze(2))
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = sanitize(draft_probs.gather(2, safe_ids[..., None]).squeeze(2))
    accepted = valid & (coins * q_draft < p_draft)

    # Step 4: e = first position not accepted (N when all are).
    rejected = ~accepted
    e = torch.where(rejected.any(dim=1), rejected.to(torch.int8).argmax(dim=1), num_draft)

    # Step 5: the distribution at e. Residual when a valid draft token was rejected at e,
    # else p_e itself (bonus token, or the draft ended at e).
    e_draft = e.clamp(max=num_draft - 1)
    residual_at_e = (e < num_draft) & valid[rows, e_draft]
    d_e = safe_ids[rows, e_draft]
    p_row = sanitize(target_probs[rows, e])  # (B, V): the only target row read
    if draft_probs is None:
        # q is one-hot at d_e: relu(p - q) is p with d_e removed.
        residual = p_row.clone()
        residual[rows, d_e] = torch.where(residual_at_e, 0.0, residual[rows, d_e])
    else:
        q_row = sanitize(draft_probs[rows, e_draft]).mul_(residual_at_e[:, None])
        residual = torch.sub(p_row, q_row).clamp_min_(0.0)

    # Both races share the race uniforms; p_e's is the fallback when the residual has no mass.
    res_masses, p_masses = chunk_masses(residual), chunk_masses(p_row)
    res_chunk, res_key = race_winner(res_masses, u_race)
    p_chunk, p_key = race_winner(p_masses, u_race)
    use_residual = torch.isfinite(res_key)
    has_mass = use_residual | torch.isfinite(p_key)
    chunk = torch.where(use_residual, res_chunk, p_chunk)
    mass = torch.where(use_residual, res_masses[rows, res_chunk], p_masses[rows, p_chunk])
    values = torch.where(
        use_residual[:, None], chunk_values(residual, chunk), chunk_values(p_row, chunk)
    )
    token = chunk * CHUNK_SIZE + inverse_cdf(values, mass, u_cdf)

    # Step 4: output = accepted prefix, the sampled token at e (-1 without mass), then -1.
    output = torch.full((batch, num_draft + 1), -1, dtype=torch.int32, device=device)
    prefix = torch.arange(num_draft, device=device)[None, :] < e[:, None]
    output[:, :num_draft] = torch.where(prefix, ids, -1).to(torch.int32)
    output[rows, e] = torch.where(has_mass, token, -1).to(torch.int32)

    # Step 6: counters, added in place whatever their integer dtype.
    accepted_num.add_(accepted.sum(dim=1).to(accepted_num.dtype))
    emitted_num.add_(e.to(emitted_num.dtype))
    return output
