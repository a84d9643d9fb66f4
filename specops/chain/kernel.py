"""The Triton kernels of chain speculative sampling (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``); ``launch.py`` launches them.  ``docs/kernel.md`` explains the design.

Grid (B, S): program (b, s) owns request b and the vocabulary chunks
[s * chunks_per_program, (s + 1) * chunks_per_program).  Every program recomputes the acceptance
prefix of its request (2N scalar gathers, cheap), then makes ONE pass over its chunks of the row at
e, keeping in registers the best chunk so far of two exponential races (residual and p), and ends
with one in-chunk inverse CDF.  With S == 1 the program writes the final answer; with S > 1 each
program writes its two local winners (key, token) to a small (B, S) scratch and a tiny combine
kernel picks the global winner (lowest key, ties to the lowest chunk).  A program's result for a
chunk never depends on which other chunks it saw, so the tokens do not depend on S.

The algorithm is that of ``reference.py``, token for token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.philox import philox_uniform, split_int64

@triton.jit
def _sanitize(x):
    """float32 value if finite and > 0, else 0 (NaN compares false, so it becomes 0)."""
    x = x.to(tl.float32)
    return tl.where((x > 0) & (x < float("inf")), x, 0.0)


@triton.jit
def _race_key(mass, neg_log_u):
    """Exponential-race key of a chunk: -log(u) / mass in float64, +inf when it has no mass."""
    mass = mass.to(tl.float64)
    return tl.where(mass > 0, neg_log_u / tl.where(mass > 0, mass, 1.0), float("inf"))


@triton.jit
def _inverse_cdf(values, u, CHUNK: tl.constexpr):
    """Index of the first positive value whose float64 prefix sum exceeds u * (the last prefix
    sum), as reference.inverse_cdf; when rounding leaves none (possible here, where tl.cumsum is a
    tree scan, not with the reference's in-order sum), the last positive value."""
    idx = tl.arange(0, CHUNK)
    positive = values > 0
    cdf = tl.cumsum(values.to(tl.float64), axis=0)
    total = tl.sum(tl.where(idx == CHUNK - 1, cdf, 0.0), axis=0)  # the last prefix sum, exactly
    hit = positive & (cdf > u.to(tl.float64) * total)
    first_hit = tl.min(tl.where(hit, idx, CHUNK), axis=0)
    last_positive = tl.max(tl.where(positive, idx, -1), axis=0)
    return tl.where(first_hit < CHUNK, first_hit, last_positive)


@triton.jit(
    # Not on the row-addressing path: keep them out of the specialisation key (a stride of 1 would
    # otherwise compile a separate kernel).
    do_not_specialize=["num_draft", "num_chunks_total", "chunks_per_program", "stride_ib",
                       "stride_in", "stride_acc", "stride_emit", "stride_ob", "seed_stride",
                       "offset_stride", "seed_per_request", "num_splits"],
)
def chain_speculative_sampling_kernel(
    target_ptr, draft_ptr, ids_ptr, accepted_ptr, emitted_ptr, seed_ptr, offset_ptr, out_ptr,
    split_key_ptr, split_token_ptr, split_e_ptr,  # (B, S, 2) / (B, S, 2) / (B,) scratch; SPLIT only
    num_draft, vocab, num_chunks_total, chunks_per_program, num_splits,
    stride_tb, stride_tn, stride_db, stride_dn,  # vocabulary stride is 1
    stride_ib, stride_in, stride_acc, stride_emit, stride_ob,
    seed_stride, offset_stride, seed_per_request,
    HAS_DRAFT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
):
    # 64-bit request index: b * stride never overflows, whatever B * (N + 1) * V.
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    owner = split == 0  # the one program that writes the output prefix and the counters

    # ---- Randomness: key = seed, counter = (slot, stream, offset) (specops/randomness.py). ----
    seed = tl.load(seed_ptr + b * seed_stride)
    offset = tl.load(offset_ptr + b * offset_stride)
    key_lo, key_hi = split_int64(seed)
    off_lo, off_hi = split_int64(offset)
    stream = tl.where(seed_per_request != 0, 0, b)

    # ---- Acceptance: lanes j < N are draft positions, lane N the bonus position. ----
    j = tl.arange(0, BLOCK_N)
    j64 = j.to(tl.int64)
    is_draft = j < num_draft
    d = tl.load(ids_ptr + b * stride_ib + j64 * stride_in, mask=is_draft, other=-1).to(tl.int64)
    valid = is_draft & (d >= 0) & (d < vocab)
    d_safe = tl.where(valid, d, 0)  # invalid ids are never dereferenced (masked) anyway
    p_d = _sanitize(tl.load(target_ptr + b * stride_tb + j64 * stride_tn + d_safe, mask=valid,
                            other=0.0))
    if HAS_DRAFT:
        q_d = _sanitize(tl.load(draft_ptr + b * stride_db + j64 * stride_dn + d_safe, mask=valid,
                                other=0.0))
    else:
        q_d = tl.full([BLOCK_N], 1.0, tl.float32)
    # Slots 0..BLOCK_N-1 in one Philox call: lane j < N is coin j, lane N the inverse-CDF uniform.
    coins = philox_uniform(j, stream, off_lo, off_hi, key_lo, key_hi)
    u_cdf = tl.sum(tl.where(j == num_draft, coins, 0.0), axis=0)  # exact: one nonzero term
    accepted = valid & (coins * q_d < p_d)
    e = tl.min(tl.where(is_draft & ~accepted, j, num_draft), axis=0)
    num_accepted = tl.sum(accepted.to(tl.int32), axis=0)

    # ---- The distribution at e: residual when a valid draft token was rejected at e. ----
    at_e = is_draft & (j == e)
    residual_at_e = tl.sum((at_e & valid).to(tl.int32), axis=0) > 0
    # The draft token removed from p_e (draft None), -1 when none is; and how far q_e is read
    # (0: not at all). Scalars folded into comparisons, which keeps the masks simple.
    removed = tl.sum(tl.where(at_e & valid, d, 0), axis=0)
    removed = tl.where(residual_at_e, removed, -1)
    q_limit = tl.where(residual_at_e, vocab, 0)
    e64 = e.to(tl.int64)
    row_p = target_ptr + b * stride_tb + e64 * stride_tn
    if HAS_DRAFT:
        row_q = draft_ptr + b * stride_db + tl.minimum(e64, num_draft - 1) * stride_dn

    # ---- Written before the row pass, so none of it stays live (in registers) across it. ----
    # Output: the accepted prefix, then -1 after e (output[e] has one writer: the token store
    # below, or the combine kernel).
    out = tl.where(j < e, d.to(tl.int32), -1)
    tl.store(out_ptr + b * stride_ob + j64, out,
             mask=(j <= tl.where(owner, num_draft, -1)) & (j != e))
    # Counters: plain read-add-write by the owner (one program per request owns them).
    acc_old = tl.load(accepted_ptr + b * stride_acc, mask=owner, other=0)
    tl.store(accepted_ptr + b * stride_acc, acc_old + num_accepted.to(acc_old.dtype), mask=owner)
    emit_old = tl.load(emitted_ptr + b * stride_emit, mask=owner, other=0)
    tl.store(emitted_ptr + b * stride_emit, emit_old + e.to(emit_old.dtype), mask=owner)

    # ---- One pass over this program's chunks of row e, best chunk of each race kept. ----
    lane = tl.arange(0, CHUNK).to(tl.int64)
    res_key = tl.zeros([], tl.float64) + float("inf")
    res_chunk = tl.zeros([], tl.int64)
    res_vals = tl.zeros([CHUNK], tl.float32)
    p_key = tl.zeros([], tl.float64) + float("inf")
    p_chunk = tl.zeros([], tl.int64)
    p_vals = tl.zeros([CHUNK], tl.float32)
    k_begin = split.to(tl.int64) * chunks_per_program
    k_end = tl.minimum(k_begin + chunks_per_program, num_chunks_total)
    # Loads stop at this program's last chunk (and at V: tail lanes read 0, never positive, so
    # never sampled); q_e is masked off entirely (no traffic) unless the residual needs it.
    p_limit = tl.minimum(vocab, k_end * CHUNK)
    q_limit = tl.minimum(q_limit, k_end * CHUNK)
    # Software prefetch in registers: chunk k + 1 is in flight while chunk k is reduced.
    cols = k_begin * CHUNK + lane
    p_next = tl.load(row_p + cols, mask=cols < p_limit, other=0.0)
    if HAS_DRAFT:
        q_next = tl.load(row_q + cols, mask=cols < q_limit, other=0.0)
    for k in range(k_begin, k_end):
        p = _sanitize(p_next)  # native dtype converted in registers
        if HAS_DRAFT:
            q = _sanitize(q_next)
        cols = k * CHUNK + lane
        cols_next = cols + CHUNK
        p_next = tl.load(row_p + cols_next, mask=cols_next < p_limit, other=0.0)
        if HAS_DRAFT:
            q_next = tl.load(row_q + cols_next, mask=cols_next < q_limit, other=0.0)
            res = tl.maximum(p - q, 0.0)
        else:
            res = tl.where(cols == removed, 0.0, p)
        # float32 masses, as the reference: they only rank the chunks (docs/kernel.md).
        w_res = tl.sum(res, axis=0)
        w_p = tl.sum(p, axis=0)
        u_race = philox_uniform(num_draft + 1 + k, stream, off_lo, off_hi, key_lo, key_hi)
        neg_log_u = -tl.log(u_race.to(tl.float64))
        key = _race_key(w_res, neg_log_u)
        better = key < res_key  # strict: ties keep the lower chunk
        res_key = tl.where(better, key, res_key)
        res_chunk = tl.where(better, k, res_chunk)
        res_vals = tl.where(better, res, res_vals)
        key = _race_key(w_p, neg_log_u)
        better = key < p_key
        p_key = tl.where(better, key, p_key)
        p_chunk = tl.where(better, k, p_chunk)
        p_vals = tl.where(better, p, p_vals)

    # ---- The token at e (the prefix and the -1s were written before the pass). ----
    if SPLIT:
        # Local winners of both races; the combine kernel picks the global ones.
        res_token = res_chunk * CHUNK + _inverse_cdf(res_vals, u_cdf, CHUNK)
        p_token = p_chunk * CHUNK + _inverse_cdf(p_vals, u_cdf, CHUNK)
        slot = (b * num_splits + split) * 2
        tl.store(split_key_ptr + slot, res_key)
        tl.store(split_key_ptr + slot + 1, p_key)
        tl.store(split_token_ptr + slot, res_token.to(tl.int32))
        tl.store(split_token_ptr + slot + 1, p_token.to(tl.int32))
        tl.store(split_e_ptr + b, e, mask=owner)
    else:
        use_res = res_key < float("inf")
        has_mass = use_res | (p_key < float("inf"))
        vals = tl.where(use_res, res_vals, p_vals)  # one inverse CDF, on the race that is used
        chunk = tl.where(use_res, res_chunk, p_chunk)
        token = chunk * CHUNK + _inverse_cdf(vals, u_cdf, CHUNK)
        tl.store(out_ptr + b * stride_ob + e, tl.where(has_mass, token, -1).to(tl.int32))


@triton.jit(do_not_specialize=["num_splits", "stride_ob"])
def chain_speculative_sampling_combine_kernel(
    split_key_ptr, split_token_ptr, split_e_ptr, out_ptr, num_splits, stride_ob,
    BLOCK_S: tl.constexpr,
):
    """Global winner of each race over the S local winners (lowest key; ties: lowest split, which
    holds the lower chunks) and output[b, e] = its token (-1 when neither race has mass)."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    in_range = s < num_splits
    base = (b * num_splits + s) * 2
    res_keys = tl.load(split_key_ptr + base, mask=in_range, other=float("inf"))
    p_keys = tl.load(split_key_ptr + base + 1, mask=in_range, other=float("inf"))
    res_best = tl.min(res_keys, axis=0)
    p_best = tl.min(p_keys, axis=0)
    res_split = tl.min(tl.where(in_range & (res_keys == res_best), s, BLOCK_S), axis=0)
    p_split = tl.min(tl.where(in_range & (p_keys == p_best), s, BLOCK_S), axis=0)
    use_res = res_best < float("inf")
    has_mass = use_res | (p_best < float("inf"))
    winner = tl.where(use_res, (b * num_splits + res_split) * 2, (b * num_splits + p_split) * 2 + 1)
    token = tl.load(split_token_ptr + winner, mask=has_mass, other=-1)
    e = tl.load(split_e_ptr + b)
    tl.store(out_ptr + b * stride_ob + e, tl.where(has_mass, token, -1))
