"""The Triton kernels of chain speculative sampling (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``); ``launch.py`` launches them.  ``docs/internals/kernel.md`` explains the design.

Grid (B, P): program (b, s) owns request b and the vocabulary chunks
[s * chunks_per_program, (s + 1) * chunks_per_program), P programs per request.  Each program
recomputes the acceptance of its request, makes one pass over its chunks of row e that computes
only chunk masses, resolves both exponential races (residual and p) over them, then re-reads the
one winning chunk for the inverse CDF.  With P == 1 the program writes the token; with P > 1 each
program writes its local result to the partials tensor and counts itself in, and the last of a
request's programs to arrive picks the global winner (lowest key, ties to the lowest chunk).  A
chunk's mass, key and token never depend on which program owns it, so the tokens do not depend on
P.

The algorithm is that of ``reference.py``, token for token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...core.sampling.values_triton import STATS, greedy_row
from ...core.sampling.step_triton import request_step, row_step
from ...core.sampling.philox import philox_uniform, split_int64
from ...core.sampling.race_triton import (RACE_FIELDS, chunk_values, masses_p, masses_residual,
                                          race_group, race_start, race_token, store_race_partial,
                                          winning_token)
from ..drafts_triton import draft_probabilities
from ..rows_triton import first_target_row, request_rows
from . import slots

# The Philox slots of the inverse-CDF uniform and of chunk 0's race (slots.py): constants of the
# layout, so no argument carries them.
CDF_SLOT = tl.constexpr(slots.CDF_SLOT)
RACE_SLOT0 = tl.constexpr(slots.race_slot(0))

# The partials of a P > 1 launch, float64 (B, P, PARTIAL_FIELDS): program s of request b writes
# row [b, s]: the race fields of core/sampling/race_triton.py (residual-race key, p-race key, the token of
# the race it used).
PARTIAL_FIELDS = RACE_FIELDS


@triton.jit
def _acceptance(target_row0, draft_row0, ids0, target_stats0, draft_stats0, num_draft, vocab,
                stride_tn, stride_dn, stride_in, stream, off_lo, off_hi, key_lo, key_hi,
                coin_slot0, HAS_DRAFT: tl.constexpr, BLOCK_N: tl.constexpr,
                LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr,
                step0):
    """Steps 1-4 for a request of num_draft drafts whose rows start at the given pointers: (draft
    ids d (BLOCK_N,), e, accepted count, inverse-CDF uniform, whether a valid draft token was
    rejected at e, that token (-1 when none)). With LOGITS (and DRAFT_LOGITS) the rows are logits,
    read through their rows' statistics (the target's after rule step 0 where STEP is on)."""
    j, is_draft, d, valid, p_d, q_d = draft_probabilities(
        target_row0, draft_row0, ids0, target_stats0, draft_stats0, num_draft, vocab, stride_tn,
        stride_dn, stride_in, HAS_DRAFT, BLOCK_N, LOGITS, DRAFT_LOGITS, STEP, step0)
    # One Philox call: lane j < N draws position j's coin (slot coin_slot0 + 2j, slots.py), lane
    # N the inverse-CDF uniform.
    coins = philox_uniform(tl.where(j == num_draft, CDF_SLOT, coin_slot0 + 2 * j), stream, off_lo,
                           off_hi, key_lo, key_hi)
    u_cdf = tl.sum(tl.where(j == num_draft, coins, 0.0), axis=0)  # exact: one nonzero term
    accepted = valid & (coins * q_d < p_d)
    e = tl.min(tl.where(is_draft & ~accepted, j, num_draft), axis=0)
    num_accepted = tl.sum(accepted.to(tl.int32), axis=0)
    at_e = is_draft & (j == e) & valid
    residual_at_e = tl.sum(at_e.to(tl.int32), axis=0) > 0
    removed = tl.where(residual_at_e, tl.sum(tl.where(at_e, d, 0), axis=0), -1)
    return d, e, num_accepted, u_cdf, residual_at_e, removed


@triton.jit
def _write_prefix_and_counters(out_ptr, accepted_ptr, emitted_ptr, b, d, e, num_accepted,
                               num_draft, stride_acc, stride_emit, BLOCK_N: tl.constexpr):
    """The owner program's writes that do not need the row: output[:e] = d, output[e+1:] = -1
    (output[e] has one writer: the token store, or the request's last program), and the
    counters."""
    j = tl.arange(0, BLOCK_N)
    out = tl.where(j < e, d.to(tl.int32), -1)
    tl.store(out_ptr + b * (num_draft + 1) + j, out, mask=(j <= num_draft) & (j != e))
    # Plain read-add-write: one program per request owns the counters.
    acc_old = tl.load(accepted_ptr + b * stride_acc)
    tl.store(accepted_ptr + b * stride_acc, acc_old + num_accepted.to(acc_old.dtype))
    emit_old = tl.load(emitted_ptr + b * stride_emit)
    tl.store(emitted_ptr + b * stride_emit, emit_old + e.to(emit_old.dtype))


@triton.jit
def _races(row_p, row_q, k_begin, k_end, vocab, read_q, removed, race_slot0, stream, off_lo,
           off_hi, key_lo, key_hi, p_stats, q_stats, HAS_DRAFT: tl.constexpr,
           GROUP: tl.constexpr, CHUNK: tl.constexpr, LOGITS: tl.constexpr,
           DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr, p_step):
    """Best (key, chunk) of the residual race and of the p race over chunks [k_begin, k_end), in
    groups of GROUP chunks: masses first, then the group's race uniforms and keys as vectors."""
    # Draft None: the residual (p without the removed token) differs from p in one chunk only;
    # its mass is taken here, before the row pass, so nothing of it stays live across the loop.
    removed_chunk = tl.where(removed >= 0, removed // CHUNK, -1)
    removed_mass = 0.0
    if not HAS_DRAFT:
        if (removed_chunk >= k_begin) & (removed_chunk < k_end):
            removed_mass = tl.sum(chunk_values(row_p, row_q, removed_chunk, vocab, 1.0, False,
                                               removed, False, CHUNK, LOGITS, p_stats, False, None,
                                               STEP, p_step), axis=0)
    res_key, res_chunk, p_key, p_chunk = race_start()
    slot = tl.arange(0, GROUP)
    for first in range(k_begin, k_end, GROUP):
        count = tl.minimum(k_end - first, GROUP).to(tl.int32)
        if read_q:
            res_masses, p_masses = masses_residual(row_p, row_q, 1.0, first, count, vocab,
                                                   GROUP, CHUNK, LOGITS, p_stats, DRAFT_LOGITS,
                                                   q_stats, STEP, p_step)
        else:
            p_masses = masses_p(row_p, 1.0, first, count, vocab, False, GROUP, CHUNK, LOGITS,
                                p_stats, STEP, p_step)
            res_masses = tl.where(slot == removed_chunk - first, removed_mass, p_masses)
        res_key, res_chunk, p_key, p_chunk = race_group(
            res_key, res_chunk, p_key, p_chunk, res_masses, p_masses, first, count, race_slot0,
            stream, off_lo, off_hi, key_lo, key_hi, GROUP)
    return res_key, res_chunk, p_key, p_chunk


@triton.jit(do_not_specialize=[
    # Not on the row-addressing path: out of the specialisation key, so that no value of them (a
    # stride of 1, an odd count, a pointer 8 bytes past 16-byte alignment) compiles another kernel.
    "ids_ptr", "accepted_ptr", "emitted_ptr", "seed_ptr", "offset_ptr", "out_ptr", "partials_ptr",
    "arrivals_ptr", "target_stats_ptr", "draft_stats_ptr", "cu_ptr", "penalties_ptr",
    "penalty_stride", "num_draft", "num_tokens",
    "stride_ib", "stride_in", "stride_acc", "stride_emit", "seed_stride", "offset_stride",
    "seed_per_request", "chunks_per_program", "coin_slot0"])
def chain_speculative_sampling_kernel(
    target_ptr,  # (B, N+1, V) target probabilities, vocabulary stride 1 (VARLEN: (T + B, V))
    draft_ptr,  # (B, N, V) draft probabilities, vocabulary stride 1, or target_ptr when None
    # (VARLEN: (T, V))
    ids_ptr,  # (B, N) draft token ids (VARLEN: (T,))
    accepted_ptr,  # (B,) counter, added to
    emitted_ptr,  # (B,) counter, added to
    seed_ptr,  # (1,) or (B,) int64
    offset_ptr,  # (1,) or (B,) int64
    out_ptr,  # (B, N+1) int32 contiguous
    partials_ptr,  # (B, P, PARTIAL_FIELDS) float64 when P > 1 (unused when P == 1)
    arrivals_ptr,  # (B,) int32 when P > 1, zero before the launch and after it (unused when 1)
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
    vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,  # VARLEN: the b's 0
    stride_acc, stride_emit, seed_stride, offset_stride, seed_per_request, chunks_per_program,
    coin_slot0,  # position 0's coin's Philox slot, 1 + K (slots.py); position j's: + 2j
    HAS_DRAFT: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr,
    LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr,  # the rows are logits (core/logits/rule.py)
    BLOCK_P: tl.constexpr,  # the most programs per request, a power of 2
    VARLEN: tl.constexpr,  # a flattened batch (rows_triton.py)
    STEP: tl.constexpr = 0,  # the parts of rule step 0 that are on (step_triton.py's flags)
):
    b = tl.program_id(0).to(tl.int64)  # 64-bit: b * stride never overflows
    program = tl.program_id(1)
    programs = tl.num_programs(1)
    seed = tl.load(seed_ptr + b * seed_stride)
    offset = tl.load(offset_ptr + b * offset_stride)
    key_lo, key_hi = split_int64(seed)
    off_lo, off_hi = split_int64(offset)
    stream = tl.where(seed_per_request != 0, 0, b)
    race_slot0 = tl.full([], RACE_SLOT0, tl.int32)  # a value, as the interpreter needs it
    # n: this request's drafts; the statistics are laid out as a padded batch's, N per request.
    n, target_row0, draft_row0, ids0 = request_rows(
        b, cu_ptr, target_ptr, draft_ptr, ids_ptr, num_draft, num_tokens, stride_tb, stride_tn,
        stride_db, stride_dn, stride_ib, stride_in, VARLEN)
    target_stats0 = target_stats_ptr + b * (num_draft + 1) * STATS
    draft_stats0 = draft_stats_ptr + b * num_draft * STATS
    request, first_row, step0 = None, 0, None
    if STEP:
        request = request_step(b, vocab, bias_ptr, counts_ptr, prompt_ptr, penalties_ptr,
                               penalty_stride, STEP)
        first_row = first_target_row(b, cu_ptr, num_draft, num_tokens, VARLEN)
        step0 = row_step(request, bitmask_ptr, first_row, vocab, ids0, stride_in, 0)
    d, e, num_accepted, u_cdf, residual_at_e, removed = _acceptance(
        target_row0, draft_row0, ids0, target_stats0, draft_stats0, n, vocab, stride_tn,
        stride_dn, stride_in, stream, off_lo, off_hi, key_lo, key_hi, coin_slot0, HAS_DRAFT,
        BLOCK_N, LOGITS, DRAFT_LOGITS, STEP, step0)
    if program == 0:
        _write_prefix_and_counters(out_ptr, accepted_ptr, emitted_ptr, b, d, e, num_accepted,
                                   num_draft, stride_acc, stride_emit, BLOCK_N)
    e64 = e.to(tl.int64)
    row_p = target_row0 + e64 * stride_tn
    row_q = draft_row0 + tl.minimum(e64, n - 1) * stride_dn  # read only at a draft: e < n
    read_q = HAS_DRAFT & residual_at_e
    k_begin = program.to(tl.int64) * chunks_per_program
    k_end = tl.minimum(k_begin + chunks_per_program, tl.cdiv(vocab, CHUNK))
    p_stats = target_stats0 + e64 * STATS
    q_stats = draft_stats0 + tl.minimum(e64, n - 1) * STATS
    p_step = None
    if STEP:  # row e: the drafts before it are all valid (an invalid one is never accepted)
        p_step = row_step(request, bitmask_ptr, first_row + e64, vocab, ids0, stride_in, e)
    greedy, greedy_token = False, tl.zeros([], tl.int64)  # rows of probabilities
    if LOGITS:
        greedy, greedy_token = greedy_row(p_stats)
    if greedy:  # the residual of a one-hot row has its mass at its token, or none: the token
        res_key = tl.where(program == 0, 0.0, float("inf")).to(tl.float64)
        p_key = tl.zeros([], tl.float64) + float("inf")
        token = greedy_token.to(tl.int32)
    else:
        # The row is p_e itself: weight 1.0, never scaled (the row's total mass is not used).
        res_key, res_chunk, p_key, p_chunk = _races(
            row_p, row_q, k_begin, k_end, vocab, read_q, removed, race_slot0, stream, off_lo,
            off_hi, key_lo, key_hi, p_stats, q_stats, HAS_DRAFT, GROUP, CHUNK, LOGITS,
            DRAFT_LOGITS, STEP, p_step)
        token = race_token(row_p, row_q, res_key, res_chunk, p_chunk, vocab, 1.0, read_q,
                           removed, u_cdf, HAS_DRAFT, CHUNK, LOGITS, p_stats, DRAFT_LOGITS,
                           q_stats, STEP, p_step)
    if programs == 1:
        has_mass = (res_key < float("inf")) | (p_key < float("inf"))
        tl.store(out_ptr + b * (num_draft + 1) + e, tl.where(has_mass, token, -1))
    else:
        store_race_partial(partials_ptr + (b * programs + program) * PARTIAL_FIELDS, res_key, p_key,
                           token)
        # Every thread's stores before the count, which releases them (gpu scope); the last
        # program's count acquires all of them. It sets the count back to 0 for the next launch.
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals_ptr + b, 1, sem="acq_rel")  # scope: the GPU
        if arrived == programs - 1:
            token = winning_token(partials_ptr, b, programs, PARTIAL_FIELDS, BLOCK_P, True)
            tl.store(out_ptr + b * (num_draft + 1) + e, token)
            tl.store(arrivals_ptr + b, 0)
