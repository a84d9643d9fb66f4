"""The CPU backend of chain speculative sampling: the reference's steps, faster.

Same tokens as ``reference.py`` (tests/test_chain_cpu.py checks the rows and the tokens against it).
On CPU a question about the data costs no host synchronisation, so this path asks them to skip
work, and hands over to the reference's plain step 5 whenever a check fails (docs/internals/decisions.md,
"Validation, backends, environment"):
  * a single request (B = 1) is decided on the host from its scalars, its uniforms drawn on Python
    ints, its rows read in place: at that size the fixed cost of each torch operation is most of
    the cost, and it runs about 40 of them instead of about 270;
  * a batch draws its uniforms by ``randomness.request_uniforms_fast`` (the same bits from fewer
    operations) and forms each request's sampled row with fewer passes over memory.
"""

from __future__ import annotations

from array import array

import torch

from ..outputs import write_outputs
from ...core.ops.backends import in_inference_mode
from ...core.sampling.probs import PROBABILITY_BOUND, as_float32, rows_at, sanitized
from ...core.sampling.race import (CHUNK_SIZE, chunk_masses, draw_on_host, race_winner,
                                   token_in_chunk)
from ...core.sampling.randomness import request_uniforms_fast, request_uniforms_host
from ...core.logits import cpu as logits_cpu
from ..processed import on_processed_rows
from . import reference, slots

# The shortcut subtracts draft rows from target rows it has not sanitised. A target value of
# PROBABILITY_BOUND or more (which counts as 0) minus a draft value below half of it leaves at
# least half of it, so with clean draft values below HALF_BOUND every such row has a chunk mass of
# HALF_BOUND or more: those rows, and rows of such masses, take the plain path.
HALF_BOUND = PROBABILITY_BOUND / 2
# Adding k * one of the counter's own dtype in place wraps no Python number and promotes no type.
_ONES = {dtype: torch.ones((), dtype=dtype) for dtype in (torch.int32, torch.int64)}


def is_clean(rows: torch.Tensor) -> bool:
    """True when every float32 value is in [0, HALF_BOUND) (-0.0 included), from one pass: NaN
    makes both ends NaN, and no comparison with NaN holds."""
    if rows.numel() == 0:
        return True
    low, high = torch.aminmax(rows)
    return low.item() >= 0 and high.item() < HALF_BOUND


def gather_rows(probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Float32 copy of row probs[b, position[b]] for every b: (B, M, V) -> (B, V), one read."""
    batch, positions, vocab = probs.shape
    if probs.stride(0) != positions * probs.stride(1):  # e.g. expand()ed over the batch
        return rows_at(probs, position).float()
    flat_row = torch.arange(batch, device=probs.device) * positions + position
    return probs.reshape(batch * positions, vocab).index_select(0, flat_row).float()


def add_rows_(rows: torch.Tensor, probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """rows[b] += probs[b, position[b]] for every b, in place; rows is float32 (B, V)."""
    batch, positions, vocab = probs.shape
    if probs.dtype != torch.float32 or batch == 0 or probs.stride(0) != positions * probs.stride(1):
        return rows.add_(gather_rows(probs, position))
    # A sparse (B, B*M) matrix with one 1 per row, at column b*M + position[b], selects the rows:
    # addmm_ adds them where they lie, without first copying them out as a gather does.
    index = torch.arange(batch, device=rows.device)
    select = torch.sparse_coo_tensor(
        torch.stack([index, index * positions + position]),
        torch.ones(batch, device=rows.device),
        (batch, batch * positions),
        is_coalesced=True,  # one entry per row, in row order
        check_invariants=False,
    )
    return rows.addmm_(select, probs.view(batch * positions, vocab))


def sampled_rows_fast(draft_probs, target_probs, verdict: reference.Verdict):
    """(rows, chunk masses) as ``reference.sampled_rows`` forms them, or None when that plain path
    must run instead: a draft row is not clean, some chunk mass is NaN, infinite or HALF_BOUND or
    more (a value that counts as 0 may be in it), or some residual has no mass.

    p_e is neither sanitised nor gathered: the relu of p_e - w q_e (w = 1 where the residual is
    wanted, 0 elsewhere) zeroes its negative and -inf values, a NaN, +inf or too large value
    shows in the chunk masses, and p_e's rows are added to -w q_e where they lie.
    """
    e, use_residual = verdict.e, verdict.residual_at_e
    if draft_probs is None or not draft_probs.shape[1]:  # one-hot drafts (or none at all)
        rows = gather_rows(target_probs, e).clamp_min_(0.0)
        rows[torch.arange(rows.shape[0]), verdict.d_e] *= ~use_residual
    else:
        rows = gather_rows(draft_probs, e.clamp(max=draft_probs.shape[1] - 1))
        if not is_clean(rows):
            return None
        rows.mul_(-use_residual[:, None].float())
        add_rows_(rows, target_probs, e).clamp_min_(0.0)  # relu(p_e - w * q_e)
    masses = chunk_masses(rows)
    largest = masses.amax(dim=1)  # NaN when any mass is
    if bool((~(largest < HALF_BOUND) | (use_residual & (largest == 0))).any()):
        return None
    return rows, masses


def float32(rows: torch.Tensor) -> torch.Tensor:
    """Float32 rows as they are (a view), others as a float32 copy."""
    return rows if rows.dtype == torch.float32 else rows.float()


def one_row(draft_probs, target_probs, e: int, residual: bool, d_e: int, draft_clean: bool):
    """Step 5's row of a single request, (V,) float32, as ``sampled_rows_fast`` forms it from
    rows read in place; None when its draft row is not clean (``draft_clean``: known to be)."""
    p_e = float32(target_probs[0, e])
    if not residual:
        return p_e.clamp_min(0.0)
    if draft_probs is None:  # q_e is one-hot at d_e
        row = p_e.clamp_min(0.0)
        row[d_e] = 0.0
        return row
    q_e = float32(draft_probs[0, e])
    return torch.sub(p_e, q_e).clamp_min_(0.0) if draft_clean or is_clean(q_e) else None


def chunk_mass_list(row: torch.Tensor) -> list[float]:
    """``chunk_masses`` of a (V,) row as a list: the same sums of the same views of the row, not
    joined into a tensor first."""
    full, tail = divmod(row.shape[0], CHUNK_SIZE)
    whole = row[: full * CHUNK_SIZE].view(full, CHUNK_SIZE).sum(1).tolist()
    return whole + [row[full * CHUNK_SIZE :].sum().item()] if tail else whole


def one_request(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed,
                offset, processed: tuple[bool, bool] = (False, False)):
    """The call for B = 1, the reference's steps on the request's scalars: the output row, or
    None (nothing written) when the row to sample needs the reference's plain step 5.
    ``processed``: whether the target's and the draft's rows are processed logits (float32
    values in [0, 1], clean)."""
    num_draft, vocab = draft_token_ids.shape[1], target_probs.shape[2]
    # Its stream is 0: its batch row, or the stream of a request with a seed of its own.
    u = request_uniforms_host(seed.item(), offset.item(), 0, slots.num_slots(num_draft, vocab))
    ids = draft_token_ids.tolist()[0]
    safe_ids = [min(max(d, 0), vocab - 1) for d in ids]
    # Steps 2-3. Position j's values sit at flat index j * V + d_j of the (1, M, V) rows (an array
    # becomes a tensor faster than a list). The coin times q is exact in float64 (two 24-bit
    # significands), so rounding it once gives float32's product.
    p, q = [], []  # no drafts: nothing to judge
    if num_draft:
        index = torch.frombuffer(array("q", [j * vocab + d for j, d in enumerate(safe_ids)]),
                                 dtype=torch.int64)
        p = [sanitized(x) for x in target_probs.take(index).tolist()]
        q = ([1.0] * num_draft if draft_probs is None
             else [sanitized(x) for x in draft_probs.take(index).tolist()])
    coins = u[slots.coin_slots(vocab, num_draft)]
    accepted = [0 <= ids[j] < vocab and as_float32(coins[j] * q[j]) < p[j]
                for j in range(num_draft)]
    e = accepted.index(False) if False in accepted else num_draft
    residual = e < num_draft and 0 <= ids[e] < vocab

    # Step 5, where the plain path is not needed.
    row = one_row(draft_probs, target_probs, e, residual, safe_ids[e] if residual else -1,
                  processed[1])
    if row is None:
        return None
    masses = chunk_mass_list(row)
    # Masses are sums of values >= 0: their sum is below HALF_BOUND only when none is NaN or
    # HALF_BOUND or more (a sum that reaches it from smaller masses takes the plain path too).
    total = sum(masses)
    if not total < HALF_BOUND or (residual and total == 0):
        return None
    token = -1  # p_e has no mass either
    if total > 0:
        token = draw_on_host(row, masses, u[slots.race_slots(vocab)], u[slots.CDF_SLOT])

    # Steps 4 and 6 (adding 0 is no operation).
    num_accepted = sum(accepted)
    if num_accepted:
        accepted_num.add_(_ONES[accepted_num.dtype], alpha=num_accepted)
    if e:
        emitted_num.add_(_ONES[emitted_num.dtype], alpha=e)
    output = array("i", ids[:e] + [token] + [-1] * (num_draft - e))
    return torch.frombuffer(output, dtype=torch.int32).view(1, -1)  # cloned by the caller


@in_inference_mode
def chain_speculative_sampling_cpu(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    processed: tuple[bool, bool] = (False, False),
) -> torch.Tensor:
    """``reference.chain_speculative_sampling_reference`` for CPU tensors, faster (``processed``:
    as ``one_request``'s)."""
    if draft_token_ids.shape[0] == 1:
        output = one_request(draft_probs, draft_token_ids, target_probs, accepted_num,
                             emitted_num, seed, offset, processed)
        if output is not None:
            return output
    return batch_of_requests(draft_probs, draft_token_ids, target_probs, accepted_num,
                             emitted_num, seed, offset)


def batch_of_requests(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num,
                      seed, offset) -> torch.Tensor:
    """The call for any B: the reference's steps 1-4 on the fast uniforms, then the shortcut
    step 5 (or the plain one) and the race in chunks read in place."""
    batch, num_draft = draft_token_ids.shape
    uniforms = request_uniforms_fast(seed, offset, batch,
                                     slots.num_slots(num_draft, target_probs.shape[2]))
    verdict = reference.verify_drafts(draft_probs, draft_token_ids, target_probs, seed, offset,
                                      uniforms)
    sampled = sampled_rows_fast(draft_probs, target_probs, verdict)
    if sampled is None:
        rows = reference.sampled_rows(draft_probs, target_probs, verdict)
        sampled = rows, chunk_masses(rows)
    rows, masses = sampled
    u_race = verdict.uniforms[:, slots.race_slots(target_probs.shape[2])]
    chunk, key = race_winner(masses, -torch.log(u_race.double()))
    u_cdf = verdict.uniforms[:, slots.CDF_SLOT]
    token = chunk * CHUNK_SIZE + token_in_chunk(rows, chunk, u_cdf)
    token = torch.where(torch.isfinite(key), token, -1)
    return write_outputs(verdict.ids, verdict.e, token, verdict.accepted, accepted_num, emitted_num)


# Verification from logits: the rows processed (chain/processed.py), then the function above.
chain_speculative_sampling_from_logits_cpu = on_processed_rows(
    chain_speculative_sampling_cpu, logits_cpu.processed_row_sets, tell_processed=True)
