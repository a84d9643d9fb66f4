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
The row a request samples is formed once: the residual where a valid draft token was rejected at
e, p_e itself elsewhere. ``sampled_rows_plain`` forms it as SPEC.md states it, on any device; on
CPU ``sampled_rows_cpu`` forms the same row with fewer passes over memory and hands over to the
plain path when its checks fail (docs/decisions.md, "Backends").
Chunk masses are float32 sums (the kernel sums in another order, so a race between two keys within
~1e-7 of each other may go the other way there); the in-chunk prefix sums, and the chunk total u is
scaled by, are float64 over the winning chunk alone, so a token moves only when a uniform lands
within ~1e-16 of a boundary.  docs/kernel.md records the measured kernel/reference agreement.
"""

from __future__ import annotations

import functools

import torch

from .randomness import CHUNK_SIZE, cdf_slot, num_chunks, race_slot, request_uniforms

_FLOAT32_INF_BITS = 0x7F800000  # +inf as int32 bits; every larger value is a NaN


def sanitize_(probs: torch.Tensor) -> torch.Tensor:
    """In place on a float32 tensor: NaN, +-inf and negative probabilities count as 0 (step 3)."""
    return probs.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).clamp_min_(0.0)


def sanitize_rows_(rows: torch.Tensor) -> torch.Tensor:
    """sanitize_ for the large (B, V) rows, skipping the rewrite when they are already clean.

    The bit patterns of finite non-negative float32 values are exactly the int32 values in
    [0, 0x7F800000), so one min/max pass over the bits tells (NaN, infinities and every negative
    number, -0.0 included, fall outside). On CPU that pass is cheaper than the two that rewrite the
    rows; on a GPU the answer would cost a host synchronisation (and break CUDA-graph capture).
    """
    if rows.device.type == "cpu" and rows.numel() > 0:
        low, high = torch.aminmax(rows.view(torch.int32))
        if int(low) >= 0 and int(high) < _FLOAT32_INF_BITS:
            return rows
    return sanitize_(rows)


def at_draft_ids(probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """probs[b, j, ids[b, j]] for every b and every draft position j, as float32: (B, N)."""
    batch, positions, vocab = probs.shape
    device = ids.device
    row = torch.arange(batch, device=device)[:, None] * positions
    row = row + torch.arange(ids.shape[1], device=device)
    return probs.take(row * vocab + ids).float()  # take indexes the logical (row-major) layout


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


def token_in_chunk(rows: torch.Tensor, chunk: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index, inside chunk ``chunk[b]`` of row b, of the token the inverse CDF picks with u[b]: (B,)."""
    batch, vocab = rows.shape
    full, tail = divmod(vocab, CHUNK_SIZE)  # whole chunks, and the width of a last partial one
    if tail:  # the partial last chunk, read in place
        in_last = inverse_cdf(rows[:, full * CHUNK_SIZE :], u)
        if not full:
            return in_last
    if batch == 0:
        return chunk
    # All windows of CHUNK_SIZE consecutive values of the flattened rows, as a view: whole chunk k
    # of row b is window b * V + k * CHUNK_SIZE.
    windows = rows.reshape(-1).unfold(0, CHUNK_SIZE, 1)
    start = torch.arange(batch, device=rows.device) * vocab + chunk.clamp(max=full - 1) * CHUNK_SIZE
    in_whole = inverse_cdf(windows.index_select(0, start), u)
    return torch.where(chunk == full, in_last, in_whole) if tail else in_whole


def add_rows_(rows: torch.Tensor, probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """rows[b] += probs[b, position[b]] for every b, in place; rows is float32 (B, V)."""
    batch, positions, vocab = probs.shape
    if (probs.device.type != "cpu" or probs.dtype != torch.float32 or batch == 0
            or probs.stride(0) != positions * probs.stride(1)):
        return rows.add_(gather_rows(probs, position))
    # A sparse (B, B*M) matrix with one 1 per row, at column b*M + position[b], selects the rows:
    # addmm_ adds them to ``rows`` where they lie, without first copying them out as a gather does
    # (one write of 4*B*V bytes fewer; docs/performance.md).
    index = torch.arange(batch, device=rows.device)
    select = torch.sparse_coo_tensor(
        torch.stack([index, index * positions + position]),
        torch.ones(batch, device=rows.device),
        (batch, batch * positions),
        is_coalesced=True,  # one entry per row, in row order
        check_invariants=False,
    )
    return rows.addmm_(select, probs.view(batch * positions, vocab))


def sampled_rows_plain(target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                       e: torch.Tensor, e_draft: torch.Tensor, use_residual: torch.Tensor,
                       d_e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The row each request samples, (B, V), and its chunk masses (B, K), on any device.

    That row is relu(p_e - q_e) where use_residual and the residual has mass, p_e elsewhere; p_e
    and q_e are the sanitised rows at e and e_draft, and without draft_probs q_e is one-hot at d_e.
    """
    p_e = sanitize_rows_(gather_rows(target_probs, e))
    if draft_probs is None:
        # q is one-hot at d_e: the residual is p with d_e removed.
        rows = p_e.clone()
        rows[torch.arange(rows.shape[0], device=rows.device), d_e] *= ~use_residual
    else:
        q_e = sanitize_rows_(gather_rows(draft_probs, e_draft))
        # p - w * q with w = 1 where the residual is wanted and 0 elsewhere, then the relu (in q_e).
        weight = use_residual[:, None].float()
        rows = torch.addcmul(p_e, q_e, weight, value=-1.0, out=q_e).clamp_min_(0.0)
    p_instead = use_residual & (chunk_masses(rows).sum(dim=1) == 0)  # a residual without mass
    rows = torch.where(p_instead[:, None], p_e, rows)
    return rows, chunk_masses(rows)


def sampled_rows_cpu(target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                     e: torch.Tensor, e_draft: torch.Tensor, use_residual: torch.Tensor,
                     d_e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """sampled_rows_plain's result with fewer passes over the rows, or None when the plain path
    must run instead: some row mass is NaN or infinite, or some residual has no mass.

    It does not sanitise p_e: the relu zeroes its negative and -inf values, which is what
    sanitising them first would give, and a NaN or +inf shows as a non-finite row mass. It does not
    gather p_e either: it gathers -w * q_e (w = 1 where the residual is wanted, 0 elsewhere) and
    adds p_e's rows to it where they lie. The questions it asks of the data are host reads, cheap on
    CPU; on a GPU they would be synchronisations (and break CUDA-graph capture).
    """
    if draft_probs is None:
        rows = gather_rows(target_probs, e).clamp_min_(0.0)
        rows[torch.arange(rows.shape[0], device=rows.device), d_e] *= ~use_residual
    else:
        rows = sanitize_rows_(gather_rows(draft_probs, e_draft)).mul_(-use_residual[:, None].float())
        add_rows_(rows, target_probs, e).clamp_min_(0.0)  # relu(p_e - w * q_e)
    masses = chunk_masses(rows)
    row_mass = masses.sum(dim=1)  # NaN or inf when any chunk mass is
    if bool((~row_mass.isfinite() | (use_residual & (row_mass == 0))).any()):
        return None
    return rows, masses


def race_winner(masses: torch.Tensor, exponentials: torch.Tensor):
    """Exponential race over chunks, given -log(u_k) per chunk: (winning chunk, winning key); the
    key is inf when all masses are 0."""
    keys = exponentials / masses.double()  # mass 0 -> +inf: never wins
    key, chunk = keys.min(dim=1)  # min returns the first (lowest) chunk among ties
    return chunk, key


def inverse_cdf(values: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index in each row of the (B, C) values of a chunk of the first value whose float64 prefix
    sum exceeds u * (the row's float64 total).

    That value is positive: torch's CPU cumsum adds in order, so the prefix sum never decreases
    and grows only at positive values. A chunk with mass always has such a value, as u < 1; an
    empty chunk (whose token is discarded) gives the last index, C - 1.
    """
    cdf = values.cumsum(dim=1, dtype=torch.float64)
    threshold = u.double()[:, None] * cdf[:, -1:]
    first = torch.searchsorted(cdf, threshold, right=True).squeeze(1)  # first cdf > threshold
    return first.clamp(max=values.shape[1] - 1)


def in_inference_mode(function):
    """Run ``function`` in inference mode and clone its tensor result out of it.

    Inference mode spares each of the reference's ~250 operations autograd's bookkeeping (about a
    tenth of a call, docs/performance.md); the clone gives the caller an ordinary tensor (an
    inference tensor refuses in-place updates outside inference mode). In-place updates of the
    caller's counters inside it are allowed.
    """

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with torch.inference_mode():
            result = function(*args, **kwargs)
        return result.clone()

    return wrapper


@in_inference_mode
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
    p_draft = sanitize_(at_draft_ids(target_probs, safe_ids))
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = sanitize_(at_draft_ids(draft_probs, safe_ids))
    accepted = valid & (coins * q_draft < p_draft)

    # Step 4: e = first position not accepted (N when all are).
    position = torch.arange(num_draft, device=device)
    e = torch.where(accepted, num_draft, position).amin(dim=1)

    # Step 5: the distribution at e. Residual when a valid draft token was rejected at e,
    # else p_e itself (bonus token, or the draft ended at e).
    e_draft = e.clamp(max=num_draft - 1)
    residual_at_e = (e < num_draft) & valid[rows, e_draft]
    d_e = safe_ids[rows, e_draft]
    # The row each request samples ("dist"): the residual relu(p_e - q_e) where a valid draft token
    # was rejected at e, p_e itself elsewhere, and its chunk masses. On CPU a shortcut forms it with
    # fewer passes and hands over to the plain path when its checks fail.
    sampled = None
    if device.type == "cpu":
        sampled = sampled_rows_cpu(target_probs, draft_probs, e, e_draft, residual_at_e, d_e)
    if sampled is None:
        sampled = sampled_rows_plain(target_probs, draft_probs, e, e_draft, residual_at_e, d_e)
    dist, masses = sampled

    # Exponential race over the chunks, then the inverse CDF inside the winning one. With no mass
    # at all (p_e is zero too) the key is infinite and the token -1.
    chunk, key = race_winner(masses, -torch.log(u_race.double()))
    has_mass = torch.isfinite(key)
    token = chunk * CHUNK_SIZE + token_in_chunk(dist, chunk, u_cdf)

    # Step 4: output = accepted prefix, the sampled token at e (-1 without mass), then -1.
    output = torch.full((batch, num_draft + 1), -1, dtype=torch.int32, device=device)
    prefix = position[None, :] < e[:, None]
    output[:, :num_draft] = torch.where(prefix, ids, -1).to(torch.int32)
    output[rows, e] = torch.where(has_mass, token, -1).to(torch.int32)

    # Step 6: counters, added in place whatever their integer dtype.
    accepted_num.add_(accepted.sum(dim=1).to(accepted_num.dtype))
    emitted_num.add_(e.to(emitted_num.dtype))
    return output
