"""The CPU backend of chain speculative sampling: the reference's steps with a faster step 5.

Same tokens as ``reference.py`` (tests/test_chain_cpu.py checks the rows and the tokens against it).
On CPU a question about the data costs no host synchronisation, so this path asks them to skip
work: it forms each request's sampled row with fewer passes over memory, and hands over to the
reference's plain step 5 whenever a check fails (docs/decisions.md, "Backends").
"""

from __future__ import annotations

import functools

import torch

from ..outputs import write_outputs
from ...core.probs import rows_at
from ...core.probs import PROBABILITY_BOUND
from ...core.race import CHUNK_SIZE, chunk_masses, inverse_cdf, race_winner
from ..from_logits import on_processed_rows
from . import reference, slots

# The shortcut subtracts draft rows from target rows it has not sanitised. A target value of
# PROBABILITY_BOUND or more (which counts as 0) minus a draft value below half of it leaves at
# least half of it, so with clean draft values below HALF_BOUND every such row has a chunk mass of
# HALF_BOUND or more: those rows, and rows of such masses, take the plain path.
HALF_BOUND = PROBABILITY_BOUND / 2


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
    if draft_probs is None:
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


def token_in_chunk(rows: torch.Tensor, chunk: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``inverse_cdf`` inside chunk ``chunk[b]`` of row b, read in place (no padded copy): (B,)."""
    batch, vocab = rows.shape
    full, tail = divmod(vocab, CHUNK_SIZE)  # whole chunks, and the width of a last partial one
    if tail:
        in_last = inverse_cdf(rows[:, full * CHUNK_SIZE :], u)
        if not full:
            return in_last
    if batch == 0:
        return chunk
    # All windows of CHUNK_SIZE consecutive values of the flattened rows, as a view: whole chunk k
    # of row b is window b * V + k * CHUNK_SIZE.
    windows = rows.reshape(-1).unfold(0, CHUNK_SIZE, 1)
    start = torch.arange(batch) * vocab + chunk.clamp(max=full - 1) * CHUNK_SIZE
    in_whole = inverse_cdf(windows.index_select(0, start), u)
    return torch.where(chunk == full, in_last, in_whole) if tail else in_whole


def in_inference_mode(function):
    """Run ``function`` in inference mode, which spares each of its operations autograd's
    bookkeeping, and clone its result out (an inference tensor refuses in-place updates outside)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with torch.inference_mode():
            result = function(*args, **kwargs)
        return result.clone()

    return wrapper


@in_inference_mode
def chain_speculative_sampling_cpu(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
) -> torch.Tensor:
    """``reference.chain_speculative_sampling_reference`` for CPU tensors, faster."""
    verdict = reference.verify_drafts(draft_probs, draft_token_ids, target_probs, seed, offset)
    sampled = sampled_rows_fast(draft_probs, target_probs, verdict)
    if sampled is None:
        rows = reference.sampled_rows(draft_probs, target_probs, verdict)
        sampled = rows, chunk_masses(rows)
    rows, masses = sampled
    num_draft = draft_token_ids.shape[1]
    u_race = verdict.uniforms[:, slots.race_slot(num_draft, 0):]
    chunk, key = race_winner(masses, -torch.log(u_race.double()))
    token = chunk * CHUNK_SIZE + token_in_chunk(rows, chunk, verdict.uniforms[:, slots.cdf_slot(num_draft)])
    token = torch.where(torch.isfinite(key), token, -1)
    return write_outputs(verdict.ids, verdict.e, token, verdict.accepted, accepted_num, emitted_num)


# Verification from logits: the rows processed (chain/from_logits.py), then the function above.
chain_speculative_sampling_from_logits_cpu = on_processed_rows(chain_speculative_sampling_cpu)
