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
Chunk masses are float32 sums (the kernel sums in another order, so a race between two keys within
~1e-7 of each other may go the other way there); the in-chunk prefix sums, and the chunk total u is
scaled by, are float64 over the winning chunk alone, so a token moves only when a uniform lands
within ~1e-16 of a boundary.  docs/kernel.md records the measured kernel/reference agreement.
"""

from __future__ import annotations

import torch

from .randomness import CHUNK_SIZE, cdf_slot, num_chunks, race_slot, request_uniforms


def sanitize_(probs: torch.Tensor) -> torch.Tensor:
    """In place on a float32 tensor: NaN, +-inf and negative probabilities count as 0 (step 3)."""
    return probs.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).clamp_min_(0.0)


def gather_rows(probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Float32 copy of row probs[b, position[b]] for every b: (B, M, V) -> (B, V), one read."""
    batch, positions, vocab = probs.shape
    if probs.stride(0) != positions * probs.stride(1):  # e.g. expand()ed over the batch
        return probs[torch.arange(batch, device=probs.device), position].float()
    flat_row = torch.arange(batch, device=probs.device) * positions + position
    return probs.reshape(batch * positions, vocab).index_select(0, flat_row).float()


def chunk_masses(rows: torch.Tensor) -> torch.Tensor:
    """Float32 mass of every CHUNK_SIZE-token chunk of each row: (B, V) -> (B, K)."""
    batch, vocab = rows.shape
    full = vocab // CHUNK_SIZE
    masses = [rows[:, : full * CHUNK_SIZE].view(batch, full, CHUNK_SIZE).sum(-1)]
    if vocab % CHUNK_SIZE:
        masses.append(rows[:, full * CHUNK_SIZE :].sum(-1, keepdim=True))
    return torch.cat(masses, dim=1)


def race_winner(masses: torch.Tensor, exponentials: torch.Tensor):
    """Exponential race over chunks, given -log(u_k) per chunk: (winning chunk, winning key); the
    key is inf when all masses are 0."""
    keys = exponentials / masses.double()  # mass 0 -> +inf: never wins
    key, chunk = keys.min(dim=1)  # min returns the first (lowest) chunk among ties
    return chunk, key


def chunk_lanes(chunk: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of chunk ``chunk[b]`` for every b, clamped into the vocabulary, and which of them
    are real tokens: two (B, C) tensors (C no wider than the vocabulary)."""
    width = min(CHUNK_SIZE, vocab)  # lanes past the vocabulary would only hold zeros
    token = chunk[:, None] * CHUNK_SIZE + torch.arange(width, device=chunk.device)
    return token.clamp(max=vocab - 1), token < vocab


def inverse_cdf(values: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index in each (B, C) chunk of the first positive value whose float64 prefix sum exceeds
    u * (the chunk's float64 total)."""
    width = values.shape[1]
    positive = values > 0
    cdf = values.double().cumsum(dim=1)
    hit = positive & (cdf > u.double()[:, None] * cdf[:, -1:])
    any_hit, first_hit = hit.to(torch.uint8).max(dim=1)  # max(dim) gives the first maximum
    # Rounding could leave no hit (not with a sequential sum): then take the last positive value.
    last_positive = width - 1 - positive.flip(1).to(torch.uint8).max(dim=1).indices
    return torch.where(any_hit.bool(), first_hit, last_positive)


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
    p_draft = sanitize_(target_probs[:, :num_draft].gather(2, safe_ids[..., None]).squeeze(2).float())
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = sanitize_(draft_probs.gather(2, safe_ids[..., None]).squeeze(2).float())
    accepted = valid & (coins * q_draft < p_draft)

    # Step 4: e = first position not accepted (N when all are).
    position = torch.arange(num_draft, device=device)
    e = torch.where(accepted, num_draft, position).amin(dim=1)

    # Step 5: the distribution at e. Residual when a valid draft token was rejected at e,
    # else p_e itself (bonus token, or the draft ended at e).
    e_draft = e.clamp(max=num_draft - 1)
    residual_at_e = (e < num_draft) & valid[rows, e_draft]
    d_e = safe_ids[rows, e_draft]
    # (Rows that sample from p_e compute a residual too, and ignore it: cheaper than masking.)
    p_row = sanitize_(gather_rows(target_probs, e))  # (B, V): the only target row read
    if draft_probs is None:
        # q is one-hot at d_e: relu(p - q) is p with d_e removed.
        residual = p_row.clone()
        residual[rows, d_e] = 0.0
    else:
        q_row = sanitize_(gather_rows(draft_probs, e_draft))
        residual = torch.sub(p_row, q_row, out=q_row).clamp_min_(0.0)

    # Both races share the race uniforms; p_e's is used when the residual is not wanted or has
    # no mass, and when p_e has none either the token is -1.
    exponentials = -torch.log(u_race.double())
    res_chunk, res_key = race_winner(chunk_masses(residual), exponentials)
    p_chunk, p_key = race_winner(chunk_masses(p_row), exponentials)
    use_residual = residual_at_e & torch.isfinite(res_key)
    has_mass = use_residual | torch.isfinite(p_key)
    chunk = torch.where(use_residual, res_chunk, p_chunk)
    lanes, in_vocab = chunk_lanes(chunk, vocab)
    values = torch.where(use_residual[:, None], residual.gather(1, lanes), p_row.gather(1, lanes))
    token = chunk * CHUNK_SIZE + inverse_cdf(values.mul_(in_vocab), u_cdf)

    # Step 4: output = accepted prefix, the sampled token at e (-1 without mass), then -1.
    output = torch.full((batch, num_draft + 1), -1, dtype=torch.int32, device=device)
    prefix = position[None, :] < e[:, None]
    output[:, :num_draft] = torch.where(prefix, ids, -1).to(torch.int32)
    output[rows, e] = torch.where(has_mass, token, -1).to(torch.int32)

    # Step 6: counters, added in place whatever their integer dtype.
    accepted_num.add_(accepted.sum(dim=1).to(accepted_num.dtype))
    emitted_num.add_(e.to(emitted_num.dtype))
    return output
