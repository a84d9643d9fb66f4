"""The Triton kernels of block verification (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``); ``launch.py`` launches them. docs/internals/kernel.md explains the design.

Row pass, grid (B, N + 1, S): program (b, t, s) owns candidate row t of request b and the
vocabulary chunks [s * chunks_per_program, (s + 1) * chunks_per_program). It recomputes w_t from
d_0..d_{t-1} (t scalar gathers), then, in groups of chunks, computes only the float32 chunk masses
of R_t (and of p_t where the fallback race may be used), resolves both exponential races (R_t and
p_t) over each group as vectors, and re-reads the one winning chunk for the inverse CDF. It writes
both race keys, the token of the race it used and its share of the mass to the partials tensor.
Scan, grid (B,): the weights again, h_t for every t from the partial masses, tau, the winner of row tau over the S programs,
the output row and the counters. A chunk's mass, key and token never depend on which program owns
it, so the tokens do not depend on S.

The algorithm is that of ``reference.py``, token for token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...core.sampling.values_triton import STATS, greedy_row, probabilities_at
from ...core.sampling.philox import philox_uniform, split_int64
from ...core.sampling.probs_triton import ABSENT, widen
from ...core.sampling.step_triton import adjusted_draft, drafts_before, request_step, row_step
from ...core.sampling.race_triton import (RACE_FIELDS, chunk_values, masses_p, masses_residual,
                                          race_group, race_start, race_token, store_race_partial,
                                          winning_token)
from ...core.sampling.sums_triton import BIN_LANES, add_masses, to_float
from ..drafts_triton import draft_probabilities
from ..rows_triton import first_target_row, request_rows

# The row pass's partials, float64 (B (N + 1), S, PARTIAL_FIELDS): program (b, t, s) writes row
# [b (N + 1) + t, s] with the race fields of core/sampling/race_triton.py (R_t-race key, p_t-race key, the
# token of the race it used). Beside them, float32 (B (N + 1), K): the mass of every chunk of
# every R_t, which the scan sums exactly (core/sampling/sums.py).
PARTIAL_FIELDS = tl.constexpr(RACE_FIELDS)
# Masses the scan sums at once, over its rows: up to 32 chunks a row, fewer for more rows. A wider
# tile gives each thread more rows of every per-row vector too (Philox lanes included), which
# made ptxas spill at BLOCK_N = 16 on sm_90.
MASS_TILE = tl.constexpr(256)


@triton.jit
def _weight_step(w, running, target_row0, draft_row0, ids0, target_stats0, draft_stats0, i,
                 vocab, stride_tn, stride_dn, stride_in, HAS_DRAFT: tl.constexpr,
                 LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr, step0):
    """(w_{i+1}, whether d_0..d_i are all valid) from (w_i, whether d_0..d_{i-1} are):
    w_{i+1} = min(1, w_i p_i[d_i] / q_i[d_i]) in float64, 0 once the draft has ended. With LOGITS
    (DRAFT_LOGITS) the rows are logits, read through their rows' statistics (the target's after
    rule step 0 where STEP is on; ``step0``: row 0's context)."""
    d = tl.load(ids0 + i * stride_in).to(tl.int64)
    valid = (d >= 0) & (d < vocab)
    running = running & valid
    d_safe = tl.where(valid, d, 0)
    raw_p = tl.load(target_row0 + i * stride_tn + d_safe, mask=valid, other=ABSENT)
    if STEP:
        raw_p = adjusted_draft(widen(raw_p), d, valid, i, vocab, step0, STEP)
    p = probabilities_at(raw_p, target_stats0 + i * STATS, d, valid, LOGITS).to(tl.float64)
    if HAS_DRAFT:
        q = probabilities_at(
            tl.load(draft_row0 + i * stride_dn + d_safe, mask=valid, other=ABSENT),
            draft_stats0 + i * STATS, d, valid, DRAFT_LOGITS).to(tl.float64)
    else:
        q = tl.full([], 1.0, tl.float64)
    num = w * p
    w_next = tl.where(num < q, num / tl.where(q > 0, q, 1.0), tl.where(num > 0, 1.0, 0.0))
    return tl.where(running, w_next, 0.0), running


@triton.jit
def _weight(target_row0, draft_row0, ids0, target_stats0, draft_stats0, t, vocab, stride_tn,
            stride_dn, stride_in, HAS_DRAFT: tl.constexpr, LOGITS: tl.constexpr,
            DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr, step0):
    """w_t over d_0..d_{t-1} (0 past the draft's end), and whether d_0..d_{t-1} are all valid."""
    w = tl.full([], 1.0, tl.float64)
    running = t >= 0
    for i in range(0, t):
        w, running = _weight_step(w, running, target_row0, draft_row0, ids0, target_stats0,
                                  draft_stats0, i, vocab, stride_tn, stride_dn, stride_in,
                                  HAS_DRAFT, LOGITS, DRAFT_LOGITS, STEP, step0)
    return w, running


@triton.jit
def _candidate_row(target_row0, draft_row0, ids0, target_stats0, draft_stats0, t, num_draft,
                   vocab, stride_tn, stride_dn, stride_in, HAS_DRAFT: tl.constexpr,
                   LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr, step0):
    """What R_t is formed from: (w_t in float64, the float32 weight of p_t, whether q_t is read,
    the token removed from p_t with one-hot drafts or -1). The draft runs at t when d_t is valid
    after valid d_0..d_{t-1}; elsewhere R_t = p_t."""
    w, running = _weight(target_row0, draft_row0, ids0, target_stats0, draft_stats0, t, vocab,
                         stride_tn, stride_dn, stride_in, HAS_DRAFT, LOGITS, DRAFT_LOGITS, STEP,
                         step0)
    is_draft = t < num_draft
    d_t = tl.load(ids0 + t * stride_in, mask=is_draft, other=-1).to(tl.int64)
    running = running & is_draft & (d_t >= 0) & (d_t < vocab)
    w_row = tl.where(running, w.to(tl.float32), 1.0)
    if HAS_DRAFT:
        removed = tl.full([], -1, tl.int64)
    else:
        removed = tl.where(running, d_t, -1)
    return w, w_row, HAS_DRAFT & running, removed


@triton.jit
def _races(row_p, row_q, k_begin, k_end, vocab, w_row, read_q, scaled, removed, race_slot0,
           stream, off_lo, off_hi, key_lo, key_hi, masses_row, p_stats, q_stats,
           HAS_DRAFT: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr,
           LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr, p_step):
    """Over chunks [k_begin, k_end), in groups of GROUP chunks: the masses of R_t's chunks (stored
    at masses_row[k]) and the best (key, chunk) of the R_t race and of the p_t race; masses first,
    then the group's race uniforms and keys as vectors. ``scaled``: w_row < 1 with draft None, the
    one case whose p_t masses are not taken (there the p_t race is never used: R_t without mass
    gives h_t = 0)."""
    # Draft None: R_t differs from (w_row times) p_t in the removed token's chunk only; its mass is
    # taken here, before the row pass, so nothing of it stays live across the loop.
    removed_chunk = tl.where(removed >= 0, removed // CHUNK, -1)
    removed_mass = 0.0
    if not HAS_DRAFT:
        if (removed_chunk >= k_begin) & (removed_chunk < k_end):
            removed_mass = tl.sum(chunk_values(row_p, row_q, removed_chunk, vocab, w_row, False,
                                               removed, False, CHUNK, LOGITS, p_stats, False, None,
                                               STEP, p_step), axis=0)
    res_key, res_chunk, p_key, p_chunk = race_start()
    slot = tl.arange(0, GROUP)
    for first in range(k_begin, k_end, GROUP):
        count = tl.minimum(k_end - first, GROUP).to(tl.int32)
        if read_q:
            res_masses, p_masses = masses_residual(row_p, row_q, w_row, first, count, vocab, GROUP,
                                                   CHUNK, LOGITS, p_stats, DRAFT_LOGITS, q_stats,
                                                   STEP, p_step)
        elif scaled:
            res_masses = masses_p(row_p, w_row, first, count, vocab, True, GROUP, CHUNK, LOGITS,
                                  p_stats, STEP, p_step)
            res_masses = tl.where(slot == removed_chunk - first, removed_mass, res_masses)
            p_masses = res_masses
        else:
            p_masses = masses_p(row_p, w_row, first, count, vocab, False, GROUP, CHUNK, LOGITS,
                                p_stats, STEP, p_step)
            res_masses = tl.where(slot == removed_chunk - first, removed_mass, p_masses)
        tl.store(masses_row + (first + slot), res_masses, mask=slot < count)
        res_key, res_chunk, p_key, p_chunk = race_group(
            res_key, res_chunk, p_key, p_chunk, res_masses, p_masses, first, count, race_slot0,
            stream, off_lo, off_hi, key_lo, key_hi, GROUP)
    return res_key, res_chunk, p_key, p_chunk


@triton.jit
def _greedy_races(row_q, token, k_begin, k_end, w_row, read_q, scaled, removed, race_slot0, stream,
                  off_lo, off_hi, key_lo, key_hi, masses_row, q_stats, HAS_DRAFT: tl.constexpr,
                  GROUP: tl.constexpr, CHUNK: tl.constexpr, DRAFT_LOGITS: tl.constexpr):
    """``_races`` for a greedy p_t, one-hot at ``token``, without reading the row: R_t and p_t
    have their one value there (chunk_values' value at that token), so every chunk's mass is that
    value or 0, and the races are run on those masses exactly as on read ones."""
    if HAS_DRAFT:
        q = probabilities_at(tl.load(row_q + token, mask=read_q, other=ABSENT), q_stats, token,
                             read_q, DRAFT_LOGITS)
        value = tl.maximum(w_row * 1.0 - tl.where(read_q, q, 0.0), 0.0)
    else:
        value = tl.where(token == removed, 0.0, w_row * 1.0)
    p_value = tl.where(scaled, value, 1.0)  # scaled: the p_t race runs on R_t's masses
    res_key, res_chunk, p_key, p_chunk = race_start()
    slot = tl.arange(0, GROUP)
    for first in range(k_begin, k_end, GROUP):
        count = tl.minimum(k_end - first, GROUP).to(tl.int32)
        here = slot == token // CHUNK - first
        res_masses = tl.where(here, value, 0.0)
        tl.store(masses_row + (first + slot), res_masses, mask=slot < count)
        res_key, res_chunk, p_key, p_chunk = race_group(
            res_key, res_chunk, p_key, p_chunk, res_masses, tl.where(here, p_value, 0.0), first,
            count, race_slot0, stream, off_lo, off_hi, key_lo, key_hi, GROUP)
    return res_key, res_chunk, p_key, p_chunk


@triton.jit(
    # Not on the row-addressing path: out of the specialisation key, so that no value of them (a
    # stride of 1, an odd count, a pointer 8 bytes past 16-byte alignment) compiles another kernel.
    do_not_specialize=["ids_ptr", "seed_ptr", "offset_ptr", "partials_ptr", "masses_ptr",
                       "target_stats_ptr", "draft_stats_ptr", "cu_ptr", "penalties_ptr",
                       "penalty_stride", "num_draft",
                       "num_tokens", "chunks_per_program", "stride_ib", "stride_in", "seed_stride",
                       "offset_stride", "seed_per_request", "cdf_slot", "race_slot0"],
)
def block_row_pass_kernel(
    target_ptr,  # (B, N+1, V) target probabilities (LOGITS: logits), vocabulary stride 1
    # (VARLEN: (T + B, V))
    draft_ptr,  # (B, N, V) draft probabilities (DRAFT_LOGITS: logits), vocabulary stride 1
    # (VARLEN: (T, V))
    ids_ptr,  # (B, N) draft token ids (VARLEN: (T,))
    seed_ptr,  # (1,) or (B,) int64
    offset_ptr,  # (1,) or (B,) int64
    partials_ptr,  # (B (N + 1), S, PARTIAL_FIELDS) float64
    masses_ptr,  # (B (N + 1), K) float32
    target_stats_ptr,  # LOGITS: (B (N+1), STATS) float64 statistics of the target's rows
    draft_stats_ptr,  # DRAFT_LOGITS: (B N, STATS) float64 statistics of the draft's rows
    cu_ptr,  # VARLEN: (B + 1,) cumulative draft counts (unused otherwise)
    # Rule step 0 of the target's rows (LOGITS, where STEP says; core/sampling/step_triton.py):
    bias_ptr,  # (B, V) logit bias, contiguous
    bitmask_ptr,  # (B, N + 1, ceil(V / 32)) int32 (VARLEN: (T + B, ...)), contiguous
    counts_ptr,  # (B, V) output token counts, contiguous
    prompt_ptr,  # (B, V) bool prompt token mask, contiguous
    penalties_ptr, penalty_stride,  # (1 or B, 4) float64: repetition, frequency, presence, 1/r
    num_draft,  # N (VARLEN: the most drafts of a request)
    num_tokens,  # VARLEN: T, the drafts of all requests (unused otherwise)
    vocab, chunks_per_program,
    stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,  # VARLEN: the b's 0
    seed_stride, offset_stride, seed_per_request,
    cdf_slot, race_slot0,  # Philox slots (slots.py) of the inverse-CDF uniform and of chunk 0
    HAS_DRAFT: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr,
    LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr,  # the rows are logits (core/logits/rule.py)
    VARLEN: tl.constexpr,  # a flattened batch (rows_triton.py)
    STEP: tl.constexpr = 0,  # the parts of rule step 0 that are on (step_triton.py's flags)
):
    # 64-bit request and row indices: b * stride never overflows, whatever B * (N + 1) * V.
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    splits = tl.num_programs(2)
    # n: this request's drafts. Statistics, partials and masses are laid out as a padded batch's.
    n, target_row0, draft_row0, ids0 = request_rows(
        b, cu_ptr, target_ptr, draft_ptr, ids_ptr, num_draft, num_tokens, stride_tb, stride_tn,
        stride_db, stride_dn, stride_ib, stride_in, VARLEN)
    if VARLEN:
        if t > n:  # no such row: the scan reads rows 0..n only
            return
    seed = tl.load(seed_ptr + b * seed_stride)
    offset = tl.load(offset_ptr + b * offset_stride)
    key_lo, key_hi = split_int64(seed)
    off_lo, off_hi = split_int64(offset)
    stream = tl.where(seed_per_request != 0, 0, b)
    target_stats0 = target_stats_ptr + b * (num_draft + 1) * STATS
    draft_stats0 = draft_stats_ptr + b * num_draft * STATS
    step0, p_step = None, None
    if STEP:
        request = request_step(b, vocab, bias_ptr, counts_ptr, prompt_ptr, penalties_ptr,
                               penalty_stride, STEP)
        first_row = first_target_row(b, cu_ptr, num_draft, num_tokens, VARLEN)
        step0 = row_step(request, bitmask_ptr, first_row, vocab, ids0, stride_in, 0)
        p_step = row_step(request, bitmask_ptr, first_row + t, vocab, ids0, stride_in,
                          drafts_before(ids0, stride_in, t, vocab))
    w, w_row, read_q, removed = _candidate_row(
        target_row0, draft_row0, ids0, target_stats0, draft_stats0, t, n, vocab, stride_tn,
        stride_dn, stride_in, HAS_DRAFT, LOGITS, DRAFT_LOGITS, STEP, step0)
    scaled = (removed >= 0) & (w_row != 1.0)
    row_p = target_row0 + t * stride_tn
    row_q = draft_row0 + tl.minimum(t, n - 1) * stride_dn  # read only at a draft: t < n
    k_begin = split.to(tl.int64) * chunks_per_program
    k_end = tl.minimum(k_begin + chunks_per_program, tl.cdiv(vocab, CHUNK))
    row = b * (num_draft + 1) + t
    masses_row = masses_ptr + row * tl.cdiv(vocab, CHUNK)
    p_stats = target_stats_ptr + row * STATS
    q_stats = draft_stats_ptr + (b * num_draft + tl.minimum(t, n - 1)) * STATS
    greedy, greedy_token = False, tl.zeros([], tl.int64)  # rows of probabilities
    if LOGITS:
        greedy, greedy_token = greedy_row(p_stats)
    if greedy:  # p_t one-hot: its races from its one value, its token that one
        res_key, res_chunk, p_key, p_chunk = _greedy_races(
            row_q, greedy_token, k_begin, k_end, w_row, read_q, scaled, removed, race_slot0,
            stream, off_lo, off_hi, key_lo, key_hi, masses_row, q_stats, HAS_DRAFT, GROUP, CHUNK,
            DRAFT_LOGITS)
        token = greedy_token.to(tl.int32)
    else:
        res_key, res_chunk, p_key, p_chunk = _races(
            row_p, row_q, k_begin, k_end, vocab, w_row, read_q, scaled, removed, race_slot0,
            stream, off_lo, off_hi, key_lo, key_hi, masses_row, p_stats, q_stats, HAS_DRAFT,
            GROUP, CHUNK, LOGITS, DRAFT_LOGITS, STEP, p_step)
        u_cdf = philox_uniform(cdf_slot, stream, off_lo, off_hi, key_lo, key_hi)
        token = race_token(row_p, row_q, res_key, res_chunk, p_chunk, vocab, w_row, read_q,
                           removed, u_cdf, HAS_DRAFT, CHUNK, LOGITS, p_stats, DRAFT_LOGITS,
                           q_stats, STEP, p_step)
    # The partial result, for the scan to combine over the S programs of the row.
    store_race_partial(partials_ptr + (row * splits + split) * PARTIAL_FIELDS, res_key, p_key,
                       token)


@triton.jit
def _drafts(target_row0, draft_row0, ids0, target_stats0, draft_stats0, num_draft, vocab,
            stride_tn, stride_dn, stride_in, stream, off_lo, off_hi, key_lo, key_hi, coin_slot0,
            HAS_DRAFT: tl.constexpr, BLOCK_N: tl.constexpr, LOGITS: tl.constexpr,
            DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr, step0):
    """Lanes t = 0..N of a request of num_draft drafts (rows at the given pointers): the draft ids
    d (-1 past N), whether the draft has ended at t, and the alignment counter (token
    verification's coin at every position, judged alone)."""
    t, is_draft, d, valid, p_d, q_d = draft_probabilities(
        target_row0, draft_row0, ids0, target_stats0, draft_stats0, num_draft, vocab, stride_tn,
        stride_dn, stride_in, HAS_DRAFT, BLOCK_N, LOGITS, DRAFT_LOGITS, STEP, step0)
    length = tl.min(tl.where(is_draft & ~valid, t, num_draft), axis=0)
    coins = philox_uniform(coin_slot0 + 2 * t, stream, off_lo, off_hi, key_lo, key_hi)  # slots.py
    num_accepted = tl.sum((valid & (coins * q_d < p_d)).to(tl.int32), axis=0)
    return d, t >= length, num_accepted


@triton.jit
def _weights(target_row0, draft_row0, ids0, target_stats0, draft_stats0, num_draft, vocab,
             stride_tn, stride_dn, stride_in, HAS_DRAFT: tl.constexpr, BLOCK_N: tl.constexpr,
             LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr, step0):
    """w_t for t = 0..N as lanes: the row pass's _weight for every t, by the same steps."""
    t = tl.arange(0, BLOCK_N)
    weights = tl.where(t == 0, 1.0, 0.0).to(tl.float64)
    w = tl.full([], 1.0, tl.float64)
    running = num_draft >= 0
    for i in range(0, num_draft):
        w, running = _weight_step(w, running, target_row0, draft_row0, ids0, target_stats0,
                                  draft_stats0, i, vocab, stride_tn, stride_dn, stride_in,
                                  HAS_DRAFT, LOGITS, DRAFT_LOGITS, STEP, step0)
        weights = tl.where(t == i + 1, w, weights)
    return weights


@triton.jit
def _row_masses(masses_ptr, b, num_draft, n, chunks, BLOCK_N: tl.constexpr):
    """float64 mass of R_t for t = 0..n (lanes) of request b, whose rows are laid out N + 1 a
    request: the exact sum of its chunk masses, as core/sampling/sums.py's exact_total."""
    t = tl.arange(0, BLOCK_N)
    rows = b * (num_draft + 1) + t.to(tl.int64)
    MASS_BLOCK: tl.constexpr = max(1, min(32, MASS_TILE // BLOCK_N))  # chunks a row, at once
    c = tl.arange(0, MASS_BLOCK)
    bins = tl.zeros([BLOCK_N, BIN_LANES], tl.int64)
    for first in range(0, chunks, MASS_BLOCK):
        in_range = (t <= n)[:, None] & (first + c < chunks)[None, :]
        masses = tl.load(masses_ptr + rows[:, None] * chunks + first + c[None, :], mask=in_range,
                         other=0.0)
        bins = add_masses(bins, masses)
    return to_float(bins)


@triton.jit
def _tau(row_mass, w, num_draft, ended, stop_slot0, stream, off_lo, off_hi, key_lo, key_hi,
         BLOCK_N: tl.constexpr):
    """h_t = m_t / (m_t + 1 - w_t) from the rows' masses and the weights w, and tau = the largest
    t >= 1 with eta_t <= h_t (0 if none)."""
    t = tl.arange(0, BLOCK_N)
    is_row = t <= num_draft
    m = tl.where(ended, w * row_mass, row_mass)
    denominator = m + (1.0 - w)
    h = tl.where(denominator > 0, m / tl.where(denominator > 0, denominator, 1.0), 1.0)
    eta = philox_uniform(stop_slot0 + 2 * t, stream, off_lo, off_hi, key_lo, key_hi)  # t >= 1
    stop = (t >= 1) & is_row & (eta.to(tl.float64) <= h)
    return tl.max(tl.where(stop, t, 0), axis=0)


@triton.jit(
    do_not_specialize=["ids_ptr", "accepted_ptr", "emitted_ptr", "seed_ptr", "offset_ptr",
                       "out_ptr", "partials_ptr", "masses_ptr", "target_stats_ptr",
                       "draft_stats_ptr", "cu_ptr", "bias_ptr", "bitmask_ptr", "counts_ptr",
                       "prompt_ptr", "penalties_ptr", "penalty_stride", "num_draft", "num_tokens",
                       "splits",
                       "stride_ib", "stride_in",
                       "stride_acc", "stride_emit", "seed_stride", "offset_stride",
                       "seed_per_request", "stop_slot0"],
)
def block_scan_kernel(
    target_ptr,  # (B, N+1, V) target probabilities, vocabulary stride 1 (VARLEN: (T + B, V))
    draft_ptr,  # (B, N, V) draft probabilities, vocabulary stride 1, or target_ptr when None
    # (VARLEN: (T, V))
    ids_ptr,  # (B, N) draft token ids (VARLEN: (T,))
    accepted_ptr,  # (B,) counter, added to
    emitted_ptr,  # (B,) counter, added to
    seed_ptr,  # (1,) or (B,) int64
    offset_ptr,  # (1,) or (B,) int64
    out_ptr,  # (B, N+1) int32 contiguous
    partials_ptr,  # (B (N + 1), S, PARTIAL_FIELDS) float64, written by the row pass
    masses_ptr,  # (B (N + 1), K) float32, written by the row pass
    target_stats_ptr,  # LOGITS: (B (N+1), STATS) float64 statistics of the target's rows
    draft_stats_ptr,  # DRAFT_LOGITS: (B N, STATS) float64 statistics of the draft's rows
    cu_ptr,  # VARLEN: (B + 1,) cumulative draft counts (unused otherwise)
    # Rule step 0 of the target's rows (LOGITS, where STEP says; core/sampling/step_triton.py):
    bias_ptr,  # (B, V) logit bias, contiguous
    bitmask_ptr,  # (B, N + 1, ceil(V / 32)) int32 (VARLEN: (T + B, ...)), contiguous
    counts_ptr,  # (B, V) output token counts, contiguous
    prompt_ptr,  # (B, V) bool prompt token mask, contiguous
    penalties_ptr, penalty_stride,  # (1 or B, 4) float64: repetition, frequency, presence, 1/r
    num_draft,  # N (VARLEN: the most drafts of a request, the output's width less one)
    num_tokens,  # VARLEN: T, the drafts of all requests (unused otherwise)
    vocab, splits,
    stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in, stride_acc, stride_emit,
    seed_stride, offset_stride, seed_per_request,
    stop_slot0,  # eta_t's Philox slot is stop_slot0 + 2t, coin j's stop_slot0 + 1 + 2j (slots.py)
    HAS_DRAFT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK: tl.constexpr,
    LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr,
    VARLEN: tl.constexpr,  # a flattened batch (rows_triton.py)
    STEP: tl.constexpr = 0,  # the parts of rule step 0 that are on (step_triton.py's flags)
):
    """tau from the row pass's masses, the token at tau, the output row and the counters."""
    b = tl.program_id(0).to(tl.int64)
    seed = tl.load(seed_ptr + b * seed_stride)
    offset = tl.load(offset_ptr + b * offset_stride)
    key_lo, key_hi = split_int64(seed)
    off_lo, off_hi = split_int64(offset)
    stream = tl.where(seed_per_request != 0, 0, b)
    n, target_row0, draft_row0, ids0 = request_rows(
        b, cu_ptr, target_ptr, draft_ptr, ids_ptr, num_draft, num_tokens, stride_tb, stride_tn,
        stride_db, stride_dn, stride_ib, stride_in, VARLEN)
    target_stats0 = target_stats_ptr + b * (num_draft + 1) * STATS
    draft_stats0 = draft_stats_ptr + b * num_draft * STATS
    step0 = None
    if STEP:
        step0 = row_step(request_step(b, vocab, bias_ptr, counts_ptr, prompt_ptr, penalties_ptr,
                                      penalty_stride, STEP), bitmask_ptr,
                         first_target_row(b, cu_ptr, num_draft, num_tokens, VARLEN), vocab, ids0,
                         stride_in, 0)
    d, ended, num_accepted = _drafts(
        target_row0, draft_row0, ids0, target_stats0, draft_stats0, n, vocab, stride_tn,
        stride_dn, stride_in, stream, off_lo, off_hi, key_lo, key_hi, stop_slot0 + 1, HAS_DRAFT,
        BLOCK_N, LOGITS, DRAFT_LOGITS, STEP, step0)  # coin 0's slot
    w = _weights(target_row0, draft_row0, ids0, target_stats0, draft_stats0, n, vocab,
                 stride_tn, stride_dn, stride_in, HAS_DRAFT, BLOCK_N, LOGITS, DRAFT_LOGITS, STEP,
                 step0)
    row_mass = _row_masses(masses_ptr, b, num_draft, n, tl.cdiv(vocab, CHUNK), BLOCK_N)
    tau = _tau(row_mass, w, n, ended, stop_slot0, stream, off_lo, off_hi, key_lo, key_hi,
               BLOCK_N)
    token = winning_token(partials_ptr, b * (num_draft + 1) + tau, splits, PARTIAL_FIELDS,
                          BLOCK_S, False)
    t = tl.arange(0, BLOCK_N)
    out = tl.where(t < tau, d.to(tl.int32), -1)
    out = tl.where(t == tau, token, out)
    tl.store(out_ptr + b * (num_draft + 1) + t, out, mask=t <= num_draft)
    # Plain read-add-write: one program per request owns the counters.
    acc_old = tl.load(accepted_ptr + b * stride_acc)
    tl.store(accepted_ptr + b * stride_acc, acc_old + num_accepted.to(acc_old.dtype))
    emit_old = tl.load(emitted_ptr + b * stride_emit)
    tl.store(emitted_ptr + b * stride_emit, emit_old + tau.to(emit_old.dtype))
