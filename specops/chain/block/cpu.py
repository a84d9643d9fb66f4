"""The CPU backend of block verification: the reference's steps, without its (B, N + 1, V) rows.

Same tokens and counters as ``reference.py`` (tests/test_block_cpu.py checks them, and the chunk
masses and stop probabilities, against it). The reference forms every candidate row at once; here
one (B, V) buffer holds the rows of one position at a time, by the reference's own float32
operations, and only their chunk masses are kept. Row 0 is formed only for the requests whose tau
is 0, and of R_tau only the winning chunk is formed again, to draw the token in it. Rows are
sanitised only when a check of their bits finds a value that ``sanitize`` would change: on CPU a
question about the data costs no host synchronisation.
"""

from __future__ import annotations

import math
from array import array

import torch

from ...core.logits import cpu as logits_cpu
from ...core.sampling.probs import PROBABILITY_BOUND, as_float32, sanitize, sanitized
from ...core.sampling.race import (CHUNK_SIZE, chunk_mass_lists, chunk_masses, draw_on_host,
                                   inverse_cdf, num_chunks, race_winner)
from ...core.sampling.randomness import request_uniforms_host
from ...core.sampling.sums import exact_total_host
from ..outputs import write_outputs
from ..processed import on_processed_rows
from . import reference, slots

# Bits of PROBABILITY_BOUND in each probability dtype (float16 rounds it to inf): the values that
# sanitize leaves as they are have exactly the bit patterns in [0, bound) as signed integers.
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
_BOUND_BITS = {dtype: int(torch.tensor(PROBABILITY_BOUND, dtype=dtype).view(bits))
               for dtype, bits in _BITS.items()}


def is_clean(rows: torch.Tensor) -> bool:
    """True when ``sanitize`` would leave every value of the (B', V) rows as it is: no NaN,
    infinity, negative value (-0.0 included) or value of PROBABILITY_BOUND or more."""
    if rows.numel() == 0:
        return True
    bits = rows.view(_BITS[rows.dtype])
    # amin and amax along the rows: one reduction each, much faster than aminmax over a view.
    return (int(bits.amin(dim=-1).min()) >= 0
            and int(bits.amax(dim=-1).max()) < _BOUND_BITS[rows.dtype])


def cleaned(rows: torch.Tensor) -> torch.Tensor:
    """The rows as ``sanitize`` reads them, copied only when some value must change."""
    return rows if is_clean(rows) else sanitize(rows)


def candidate_row(p: torch.Tensor, q: torch.Tensor | None, weight: torch.Tensor,
                  running: torch.Tensor, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """R_t of each request at one position t, float32 (B', V), the reference's step 5 one
    position at a time, with the same float32 operations in the same order.

    p, q: the rows p_t and q_t (B', V); q is None for one-hot drafts (d_t removed where the draft
    runs) and for t = N, where no draft runs. weight: w_t (B',) float64; running: whether the
    draft runs at t (B',); ids: d_t, clamped into [0, V). ``out`` is a float32 (B', V) buffer;
    the result is ``out`` or, where R_t = p_t, p itself.
    """
    p = cleaned(p)
    if not bool(running.any()):  # every draft has ended: R_t = p_t
        if p.dtype == torch.float32 and p.stride(-1) == 1:
            return p
        return out.copy_(p)
    w = torch.where(running, weight.float(), 1.0)
    torch.mul(p, w[:, None], out=out)  # (a 16-bit p is read as float32, as sanitize would)
    if q is None:
        rows = running.nonzero().squeeze(1)
        out[rows, ids[rows]] = 0.0
        return out
    out.sub_(cleaned(q)).clamp_min_(0.0)
    ended = (~running).nonzero().squeeze(1)
    if ended.numel():  # R_t = p_t where the draft has ended
        out.index_copy_(0, ended, p.index_select(0, ended).float())
    return out


def chunk_at(probs: torch.Tensor, position: torch.Tensor, chunk: torch.Tensor):
    """(values, vocabulary index) of chunk ``chunk[b]`` of row probs[b, position[b]], both
    (B, CHUNK_SIZE): the values sanitised, float32, 0 past the vocabulary, as
    ``core.sampling.race.chunk_values`` lays them out. Whole chunks are read as windows of a view, which
    copies only the chunk (indexing by value index costs far more)."""
    batch, _, vocab = probs.shape
    full = vocab // CHUNK_SIZE
    request = torch.arange(batch)
    if full:
        windows = probs[..., : full * CHUNK_SIZE].unfold(2, CHUNK_SIZE, CHUNK_SIZE)
        values = windows[request, position, chunk.clamp(max=full - 1)]
    else:
        values = probs.new_zeros(batch, CHUNK_SIZE)
    tail = vocab - full * CHUNK_SIZE
    if tail:  # the last chunk is partial: its values, then zeros
        in_last = (chunk == full).nonzero().squeeze(1)
        values[in_last] = 0
        values[in_last, :tail] = probs[in_last, position[in_last], full * CHUNK_SIZE :]
    index = chunk[:, None] * CHUNK_SIZE + torch.arange(CHUNK_SIZE)
    return sanitize(values), index


def sampled_chunk(draft_probs, target_probs, drafts: reference.Drafts, tau: torch.Tensor,
                  chunk: torch.Tensor, has_mass: torch.Tensor) -> torch.Tensor:
    """The values of the winning chunk of the row ``reference.sample_at`` samples: R_tau where it
    has mass, else p_tau; (B, CHUNK_SIZE), formed as ``reference.candidate_rows`` forms R_tau."""
    batch, num_draft = drafts.ids.shape
    request = torch.arange(batch)
    p, index = chunk_at(target_probs, tau, chunk)
    if not num_draft:  # no draft runs: R_0 = p_0
        return p
    running = ~drafts.ended[request, tau]
    w = torch.where(running, drafts.weights[request, tau].float(), 1.0)[:, None]
    draft_at = tau.clamp(max=num_draft - 1)  # q_N = 0 and no draft runs at N
    if draft_probs is None:
        removed = running[:, None] & (index == drafts.safe_ids[request, draft_at][:, None])
        rows = (w * p).masked_fill(removed, 0.0)
    else:
        q = torch.where(running[:, None], chunk_at(draft_probs, draft_at, chunk)[0], 0.0)
        rows = (w * p - q).clamp_min(0.0)
    return torch.where(has_mass[:, None], rows, p)


def one_request(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed,
                offset, processed: tuple[bool, bool] = (False, False)) -> torch.Tensor:
    """The call for B = 1: the reference's steps on the request's scalars (uniforms, coins,
    weights, stop probabilities, tau and the race on the host), its candidate rows R_1..R_N formed
    by the reference's float32 operations on the rows where the draft runs (R_t = p_t where it
    has ended), their chunk masses summed exactly on the host. ``processed``: whether the target's
    and the draft's rows are processed logits (float32 values in [0, 1]), which ``sanitize``
    leaves as they are."""
    num_draft, vocab = draft_token_ids.shape[1], target_probs.shape[2]
    u = request_uniforms_host(seed.item(), offset.item(), 0, slots.num_slots(num_draft, vocab))
    ids = draft_token_ids.tolist()[0]
    valid = [0 <= d < vocab for d in ids]
    safe_ids = [min(max(d, 0), vocab - 1) for d in ids]
    length = valid.index(False) if False in valid else num_draft  # L: the valid prefix

    # Steps 3-4 from the sanitised values at the draft ids (float32 products rounded once, float64
    # weights: Python floats round as torch's float64 operations do).
    p_d, q_d = [], []  # no drafts: nothing to judge
    if num_draft:  # an array becomes a tensor faster than a list
        index = torch.frombuffer(array("q", [j * vocab + d for j, d in enumerate(safe_ids)]),
                                 dtype=torch.int64)
        p_d = [sanitized(x) for x in target_probs.take(index).tolist()]
        q_d = ([1.0] * num_draft if draft_probs is None
               else [sanitized(x) for x in draft_probs.take(index).tolist()])
    coins = u[slots.coin_slots(vocab, num_draft)]
    accepted = [valid[j] and as_float32(coins[j] * q_d[j]) < p_d[j] for j in range(num_draft)]
    weights = [1.0]
    for j in range(num_draft):
        num = weights[-1] * p_d[j]
        w = num / q_d[j] if num < q_d[j] else float(num > 0)
        weights.append(0.0 if j >= length else w)

    # Step 5: R_t = relu(w_t p_t - q_t) (one-hot q: w_t p_t with d_t removed) where the draft runs
    # (t < L); R_t = p_t from L on. Rows are read contiguous along V, as chunk_masses views them.
    p = target_probs[0] if processed[0] else cleaned(target_probs[0])
    if p.dtype != torch.float32 or p.stride(-1) != 1:
        p = p.float().contiguous()
    q = None if draft_probs is None else draft_probs[0] if processed[1] else \
        cleaned(draft_probs[0])

    def running_rows(first: int, last: int) -> torch.Tensor:  # R_first..R_last, all t < L
        w = torch.tensor([as_float32(weights[t]) for t in range(first, last + 1)],
                         dtype=torch.float32)[:, None]
        rows = p[first : last + 1] * w
        if q is None:
            rows[list(range(last + 1 - first)), safe_ids[first : last + 1]] = 0.0
            return rows
        return rows.sub_(q[first : last + 1]).clamp_min_(0.0)

    rows = [running_rows(1, length - 1)] if length > 1 else []
    rows.append(p[max(length, 1) :])
    masses = [m for part in rows for m in chunk_mass_lists(part)]  # R_1..R_N
    if not all(math.isfinite(m) for row in masses for m in row):
        return None

    # Steps 6-7: h_t, then tau = the largest t with eta_t <= h_t (0 if none).
    tau = 0
    for t in range(1, num_draft + 1):
        row_mass = exact_total_host(masses[t - 1])
        w = weights[t]
        mass = w * row_mass if t >= length else row_mass
        denominator = mass + (1.0 - w)
        h = mass / denominator if denominator > 0 else 1.0
        if u[slots.stop_slot(vocab, t)] <= h:
            tau = t

    # Step 8: one token from R_tau (from p_tau when R_tau has no mass).
    if tau == 0:
        row = running_rows(0, 0)[0] if length > 0 else p[0]
        sampled = chunk_mass_lists(row[None])[0]
    else:
        sampled = masses[tau - 1]
        row = rows[0][tau - 1] if tau < length else p[tau]
    if not any(m > 0 for m in sampled):
        row = p[tau]
        sampled = chunk_mass_lists(row[None])[0]
    token = -1
    if any(m > 0 for m in sampled):
        token = draw_on_host(row, sampled, u[slots.race_slots(vocab)], u[slots.CDF_SLOT])

    # Step 9 (adding 0 is no operation).
    if sum(accepted):
        accepted_num.add_(sum(accepted))
    if tau:
        emitted_num.add_(tau)
    return torch.tensor([ids[:tau] + [token] + [-1] * (num_draft - tau)], dtype=torch.int32)


def block_speculative_sampling_cpu(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    processed: tuple[bool, bool] = (False, False),
) -> torch.Tensor:
    """``reference.block_speculative_sampling_reference`` for CPU tensors, faster (``processed``:
    as ``one_request``'s)."""
    if draft_token_ids.shape[0] == 1:
        output = one_request(draft_probs, draft_token_ids, target_probs, accepted_num,
                             emitted_num, seed, offset, processed)
        if output is not None:
            return output
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    drafts = reference.read_drafts(draft_probs, draft_token_ids, target_probs, seed, offset)
    running = ~drafts.ended

    # Steps 5-6: the chunk masses of R_1..R_N, one position at a time; R_0's come after tau.
    masses = torch.zeros(batch, num_draft + 1, num_chunks(vocab))
    out = torch.empty(batch, vocab)
    for t in range(1, num_draft + 1):
        q = draft_probs[:, t] if draft_probs is not None and t < num_draft else None
        ids = drafts.safe_ids[:, min(t, num_draft - 1)]
        row = candidate_row(target_probs[:, t], q, drafts.weights[:, t], running[:, t], ids, out)
        masses[:, t] = chunk_masses(row)
    h = reference.stop_probabilities_of_masses(masses, drafts)
    tau = reference.choose_tau(h, drafts)

    # R_0, for the requests that keep no draft (h_0 is never used, so only these need it).
    zero = (tau == 0).nonzero().squeeze(1)
    if zero.numel():
        q = draft_probs[:, 0].index_select(0, zero) if draft_probs is not None and num_draft \
            else None
        p = target_probs[:, 0].index_select(0, zero)
        ids = drafts.safe_ids[zero, 0] if num_draft else torch.zeros_like(zero)  # none runs
        row = candidate_row(p, q, drafts.weights[zero, 0], running[zero, 0], ids,
                            out[: zero.numel()])
        masses[zero, 0] = chunk_masses(row)

    # Step 8: the race over R_tau's chunk masses, or p_tau's where R_tau has none.
    request = torch.arange(batch)
    sampled = masses[request, tau]
    has_mass = sampled.sum(dim=1) > 0  # as the reference asks it
    empty = (~has_mass).nonzero().squeeze(1)
    if empty.numel():
        sampled[empty] = chunk_masses(sanitize(target_probs[empty, tau[empty]]))
    u_race = drafts.uniforms[:, slots.race_slots(target_probs.shape[2])]
    chunk, key = race_winner(sampled, -torch.log(u_race.double()))
    values = sampled_chunk(draft_probs, target_probs, drafts, tau, chunk, has_mass)
    token = chunk * CHUNK_SIZE + inverse_cdf(values, drafts.uniforms[:, slots.CDF_SLOT])
    token = torch.where(torch.isfinite(key), token, -1)
    return write_outputs(drafts.ids, tau, token, drafts.accepted, accepted_num, emitted_num)


# Verification from logits: the rows processed (chain/processed.py), then the function above.
block_speculative_sampling_from_logits_cpu = on_processed_rows(
    block_speculative_sampling_cpu, logits_cpu.processed_row_sets, tell_processed=True)
