"""Token and block verification of vocabulary shards: the references' steps (chain/token/
reference.py, chain/block/reference.py) where a step reads one rank's columns, and shards.py's
collectives where it needs every rank's (the values at the draft ids, the race, the exact row
masses). Every rank then finishes the same way from the same numbers, so every rank returns the
same outputs and counters.
"""

from __future__ import annotations

import torch

from ..core.sampling.probs import rows_at, sanitize
from ..chain.outputs import write_outputs
from ..chain.token import reference as token_reference, slots as token_slots
from ..chain.block import reference as block_reference, slots as block_slots
from ..core.sampling.randomness import request_uniforms
from .shards import Shard, exact_totals, exchanged_values, piece_masses, race, values_at_ids


def read_drafts(shard: Shard, draft_probs, draft_token_ids, target_probs, seed, offset):
    """What both verifications start with: each request's uniforms (B, slots), and (p[d], q[d])
    at every draft id (B, N), sanitised, from the rank that owns each id (one all_reduce); q is
    None for one-hot drafts."""
    batch = draft_token_ids.shape[0]
    uniforms = request_uniforms(seed, offset, batch,
                                token_slots.num_slots(draft_token_ids.shape[1], shard.vocab))
    ids = draft_token_ids.long()
    shares = [values_at_ids(shard, target_probs, ids)]
    if draft_probs is not None:
        shares.append(values_at_ids(shard, draft_probs, ids))
    values = exchanged_values(shard, torch.stack(shares))
    return uniforms, values[0], (values[1] if draft_probs is not None else None)


def without_draft_token(shard: Shard, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """rows (B, width) with column ids[b] zeroed where this shard owns it: a one-hot draft's
    residual."""
    columns = torch.arange(shard.width, device=rows.device)
    hit = (columns == shard.local(ids)[:, None]) & shard.owns(ids)[:, None]
    return rows.masked_fill(hit, 0.0)


def token_verification(shard: Shard, draft_probs, draft_token_ids, target_probs, accepted_num,
                       emitted_num, seed, offset) -> torch.Tensor:
    """chain/token/reference.py on shards: output (B, N + 1) int32, counters added to."""
    num_draft = draft_token_ids.shape[1]
    uniforms, p_d, q_d = read_drafts(shard, draft_probs, draft_token_ids, target_probs, seed,
                                     offset)
    verdict = token_reference.verdict_of(draft_token_ids, shard.vocab, p_d, q_d, uniforms)

    # Step 5 on this shard: both candidate rows race, and the residual's token is used where it
    # is wanted and has mass on some rank (the single-device rule, asked of every rank at once).
    p_e = sanitize(rows_at(target_probs, verdict.e))
    if draft_probs is None or not num_draft:  # one-hot drafts (or none at all)
        residual = without_draft_token(shard, p_e, verdict.d_e)
    else:
        q_e = sanitize(rows_at(draft_probs, verdict.e.clamp(max=num_draft - 1)))
        residual = (p_e - q_e).clamp_min(0.0)
    u_cdf = uniforms[:, token_slots.CDF_SLOT]
    from_residual, from_p = race(shard, torch.stack([residual, p_e]), seed, offset, u_cdf)
    token = torch.where(verdict.residual_at_e & (from_residual >= 0), from_residual, from_p)
    return write_outputs(verdict.ids, verdict.e, token, verdict.accepted, accepted_num,
                         emitted_num)


def block_verification(shard: Shard, draft_probs, draft_token_ids, target_probs, accepted_num,
                       emitted_num, seed, offset) -> torch.Tensor:
    """chain/block/reference.py on shards: output (B, N + 1) int32, counters added to."""
    batch, num_draft = draft_token_ids.shape
    uniforms, p_d, q_d = read_drafts(shard, draft_probs, draft_token_ids, target_probs, seed,
                                     offset)
    ids = draft_token_ids.long()
    drafts = block_reference.drafts_of(draft_token_ids, shard.vocab, p_d, q_d, uniforms)

    if draft_probs is None:
        # The reference removes d_t from each row by its column: ids this shard does not own
        # point at a spare zero column, cut off after.
        spare = torch.where(shard.owns(ids), ids - shard.start, shard.width)
        padded = torch.nn.functional.pad(target_probs, (0, 1))
        rows = block_reference.candidate_rows(None, padded, drafts._replace(safe_ids=spare),
                                              drafts.weights)[..., : shard.width]
    else:
        rows = block_reference.candidate_rows(draft_probs, target_probs, drafts, drafts.weights)
    masses = piece_masses(shard, rows.reshape(batch * (num_draft + 1), shard.width))
    totals = exact_totals(shard, masses).reshape(batch, num_draft + 1)
    tau = block_reference.choose_tau(block_reference.stop_probabilities_of_totals(totals, drafts),
                                     drafts)

    index = torch.arange(batch, device=rows.device)
    u_cdf = uniforms[:, block_slots.CDF_SLOT]
    candidates = torch.stack([rows[index, tau], sanitize(target_probs[index, tau])])
    from_row, from_p = race(shard, candidates, seed, offset, u_cdf)
    token = torch.where(from_row >= 0, from_row, from_p)  # R_tau without mass: from p_tau
    return write_outputs(drafts.ids, tau, token, drafts.accepted, accepted_num, emitted_num)


VERIFIERS = {"token": token_verification, "block": block_verification}
