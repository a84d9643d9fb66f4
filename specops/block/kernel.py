"""The Triton kernels of block verification (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``); ``launch.py`` launches them. docs/block.md explains the design.

Row pass, grid (B, N + 1, S): program (b, t, s) owns candidate row t of request b and the
vocabulary chunks [s * chunks_per_program, (s + 1) * chunks_per_program). It recomputes w_t from
d_0..d_{t-1} (t scalar gathers), then makes ONE pass over its chunks of p_t (and q_t while the draft
runs at t), forming R_t chunk by chunk: its mass, and the best chunk so far of two exponential races
(R_t and the fallback p_t), all positions of all requests in parallel. It writes (mass, two local
winners) to a small scratch. Scan, grid (B,): h_t for every t from the masses, tau, the winner of
row tau over the S programs, the output row and the counters. A program's result for a chunk never
depends on which other chunks it saw, so the tokens do not depend on S.

The algorithm is that of ``reference.py``, token for token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.philox import philox_uniform, split_int64
from ..core.race_triton import inverse_cdf, race_key, sanitize


@triton.jit(
    # Not on the row-addressing path: out of the specialisation key, so that no value of them (a
    # stride of 1, an odd count, a pointer 8 bytes past 16-byte alignment) compiles another kernel.
    do_not_specialize=["ids_ptr", "seed_ptr", "offset_ptr", "weight_ptr", "mass_ptr", "key_ptr",
                       "token_ptr", "num_draft", "num_chunks_total", "chunks_per_program",
                       "num_splits", "stride_ib", "stride_in", "seed_stride", "offset_stride",
                       "seed_per_request", "cdf_slot", "race_slot0"],
)
def block_row_pass_kernel(
    target_ptr, draft_ptr, ids_ptr, seed_ptr, offset_ptr,
    weight_ptr, mass_ptr, key_ptr, token_ptr,  # scratch: (B, N+1), (B, N+1, S), (B, N+1, S, 2) x2
    num_draft, vocab, num_chunks_total, chunks_per_program, num_splits,
    stride_tb, stride_tn, stride_db, stride_dn,  # vocabulary stride is 1
    stride_ib, stride_in, seed_stride, offset_stride, seed_per_request,
    cdf_slot, race_slot0,  # Philox slots of the inverse-CDF uniform and of chunk 0's race (slots.py)
    HAS_DRAFT: tl.constexpr, CHUNK: tl.constexpr,
):
    # 64-bit request and row indices: b * stride never overflows, whatever B * (N + 1) * V.
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    seed = tl.load(seed_ptr + b * seed_stride)
    offset = tl.load(offset_ptr + b * offset_stride)
    key_lo, key_hi = split_int64(seed)
    off_lo, off_hi = split_int64(offset)
    stream = tl.where(seed_per_request != 0, 0, b)

    # ---- w_t = min(1, w_{t-1} p[d] / q[d]) in float64 over d_0..d_{t-1}; 0 past the draft's end.
    w = tl.full([], 1.0, tl.float64)
    running = t >= 0  # True: the draft is still running
    for i in range(0, t):
        d = tl.load(ids_ptr + b * stride_ib + i * stride_in).to(tl.int64)
        valid = (d >= 0) & (d < vocab)
        running = running & valid
        d_safe = tl.where(valid, d, 0)
        p = sanitize(tl.load(target_ptr + b * stride_tb + i * stride_tn + d_safe, mask=valid,
                             other=0.0)).to(tl.float64)
        if HAS_DRAFT:
            q = sanitize(tl.load(draft_ptr + b * stride_db + i * stride_dn + d_safe, mask=valid,
                                 other=0.0)).to(tl.float64)
        else:
            q = tl.full([], 1.0, tl.float64)
        num = w * p
        w_next = tl.where(num < q, num / tl.where(q > 0, q, 1.0), tl.where(num > 0, 1.0, 0.0))
        w = tl.where(running, w_next, 0.0)
    # Does the draft run at t (d_t valid, after valid d_0..d_{t-1})? Else R_t = p_t.
    is_draft = t < num_draft
    d_t = tl.load(ids_ptr + b * stride_ib + t * stride_in, mask=is_draft, other=-1).to(tl.int64)
    running = running & is_draft & (d_t >= 0) & (d_t < vocab)
    w_row = tl.where(running, w.to(tl.float32), 1.0)  # the float32 weight R_t is formed with
    removed = tl.where(running, d_t, -1)  # one-hot drafts: the token removed from p_t
    q_limit = tl.where(running, vocab, 0)  # how far q_t is read (0: not at all)
    row_p = target_ptr + b * stride_tb + t * stride_tn
    if HAS_DRAFT:
        row_q = draft_ptr + b * stride_db + tl.minimum(t, num_draft - 1) * stride_dn
    u_cdf = philox_uniform(cdf_slot, stream, off_lo, off_hi, key_lo, key_hi)

    # ---- One pass over this program's chunks of row t: mass of R_t, best chunk of both races.
    lane = tl.arange(0, CHUNK).to(tl.int64)
    mass = tl.zeros([], tl.float64)
    res_key = tl.zeros([], tl.float64) + float("inf")
    res_chunk = tl.zeros([], tl.int64)
    res_vals = tl.zeros([CHUNK], tl.float32)
    p_key = tl.zeros([], tl.float64) + float("inf")
    p_chunk = tl.zeros([], tl.int64)
    p_vals = tl.zeros([CHUNK], tl.float32)
    k_begin = split.to(tl.int64) * chunks_per_program
    k_end = tl.minimum(k_begin + chunks_per_program, num_chunks_total)
    p_limit = tl.minimum(vocab, k_end * CHUNK)
    q_limit = tl.minimum(q_limit, k_end * CHUNK)
    # Software prefetch in registers: chunk k + 1 is in flight while chunk k is reduced.
    cols = k_begin * CHUNK + lane
    p_next = tl.load(row_p + cols, mask=cols < p_limit, other=0.0)
    if HAS_DRAFT:
        q_next = tl.load(row_q + cols, mask=cols < q_limit, other=0.0)
    for k in range(k_begin, k_end):
        p = sanitize(p_next)
        if HAS_DRAFT:
            q = sanitize(q_next)
        cols = k * CHUNK + lane
        cols_next = cols + CHUNK
        p_next = tl.load(row_p + cols_next, mask=cols_next < p_limit, other=0.0)
        if HAS_DRAFT:
            q_next = tl.load(row_q + cols_next, mask=cols_next < q_limit, other=0.0)
            res = tl.maximum(w_row * p - q, 0.0)
        else:
            res = tl.where(cols == removed, 0.0, w_row * p)
        w_res = tl.sum(res, axis=0)  # float32 chunk masses, as the reference's
        w_p = tl.sum(p, axis=0)
        mass += w_res.to(tl.float64)
        u_race = philox_uniform(race_slot0 + k, stream, off_lo, off_hi, key_lo, key_hi)
        neg_log_u = -tl.log(u_race.to(tl.float64))
        key = race_key(w_res, neg_log_u)
        better = key < res_key  # strict: ties keep the lower chunk
        res_key = tl.where(better, key, res_key)
        res_chunk = tl.where(better, k, res_chunk)
        res_vals = tl.where(better, res, res_vals)
        key = race_key(w_p, neg_log_u)
        better = key < p_key
        p_key = tl.where(better, key, p_key)
        p_chunk = tl.where(better, k, p_chunk)
        p_vals = tl.where(better, p, p_vals)

    # ---- Local results: the scan combines the S programs of each row.
    row = b * (num_draft + 1) + t
    slot = (row * num_splits + split) * 2
    tl.store(mass_ptr + row * num_splits + split, mass)
    tl.store(key_ptr + slot, res_key)
    tl.store(key_ptr + slot + 1, p_key)
    tl.store(token_ptr + slot, (res_chunk * CHUNK + inverse_cdf(res_vals, u_cdf, CHUNK)).to(tl.int32))
    tl.store(token_ptr + slot + 1, (p_chunk * CHUNK + inverse_cdf(p_vals, u_cdf, CHUNK)).to(tl.int32))
    tl.store(weight_ptr + row, w, mask=split == 0)


@triton.jit(
    do_not_specialize=["ids_ptr", "accepted_ptr", "emitted_ptr", "seed_ptr", "offset_ptr",
                       "out_ptr", "weight_ptr", "mass_ptr", "key_ptr", "token_ptr", "num_draft",
                       "num_splits", "stride_ib", "stride_in", "stride_acc", "stride_emit",
                       "stride_ob", "seed_stride", "offset_stride", "seed_per_request",
                       "stop_slot0"],
)
def block_scan_kernel(
    target_ptr, draft_ptr, ids_ptr, accepted_ptr, emitted_ptr, seed_ptr, offset_ptr, out_ptr,
    weight_ptr, mass_ptr, key_ptr, token_ptr,
    num_draft, vocab, num_splits,
    stride_tb, stride_tn, stride_db, stride_dn,
    stride_ib, stride_in, stride_acc, stride_emit, stride_ob,
    seed_stride, offset_stride, seed_per_request,
    stop_slot0,  # eta_t's Philox slot is stop_slot0 + t (slots.py); coin j's is j
    HAS_DRAFT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """tau from the row pass's masses, the token at tau, the output row and the counters."""
    b = tl.program_id(0).to(tl.int64)
    seed = tl.load(seed_ptr + b * seed_stride)
    offset = tl.load(offset_ptr + b * offset_stride)
    key_lo, key_hi = split_int64(seed)
    off_lo, off_hi = split_int64(offset)
    stream = tl.where(seed_per_request != 0, 0, b)

    # Lanes t = 0..N: draft positions (t < N) and candidate rows (t <= N).
    t = tl.arange(0, BLOCK_N)
    t64 = t.to(tl.int64)
    is_draft = t < num_draft
    is_row = t <= num_draft
    d = tl.load(ids_ptr + b * stride_ib + t64 * stride_in, mask=is_draft, other=-1).to(tl.int64)
    valid = is_draft & (d >= 0) & (d < vocab)
    length = tl.min(tl.where(is_draft & ~valid, t, num_draft), axis=0)
    ended = t >= length

    # The alignment counter: token verification's coin at every position, judged alone.
    d_safe = tl.where(valid, d, 0)
    p_d = sanitize(tl.load(target_ptr + b * stride_tb + t64 * stride_tn + d_safe, mask=valid,
                           other=0.0))
    if HAS_DRAFT:
        q_d = sanitize(tl.load(draft_ptr + b * stride_db + t64 * stride_dn + d_safe, mask=valid,
                               other=0.0))
    else:
        q_d = tl.full([BLOCK_N], 1.0, tl.float32)
    coins = philox_uniform(t, stream, off_lo, off_hi, key_lo, key_hi)
    num_accepted = tl.sum((valid & (coins * q_d < p_d)).to(tl.int32), axis=0)

    # h_t = m_t / (m_t + 1 - w_t) and tau = the largest t >= 1 with eta_t <= h_t.
    rows = b * (num_draft + 1) + t64
    w = tl.load(weight_ptr + rows, mask=is_row, other=0.0)
    s = tl.arange(0, BLOCK_S)
    partial = tl.load(mass_ptr + rows[:, None] * num_splits + s[None, :],
                      mask=is_row[:, None] & (s[None, :] < num_splits), other=0.0)
    row_mass = tl.sum(partial, axis=1)
    m = tl.where(ended, w * row_mass, row_mass)
    denominator = m + (1.0 - w)
    h = tl.where(denominator > 0, m / tl.where(denominator > 0, denominator, 1.0), 1.0)
    eta = philox_uniform(stop_slot0 + t, stream, off_lo, off_hi, key_lo, key_hi)  # t >= 1
    stop = (t >= 1) & is_row & (eta.to(tl.float64) <= h)
    tau = tl.max(tl.where(stop, t, 0), axis=0)

    # The winner of row tau over the S programs: the R_tau race, else the p_tau race, else -1.
    in_range = s < num_splits
    base = ((b * (num_draft + 1) + tau) * num_splits + s) * 2
    res_keys = tl.load(key_ptr + base, mask=in_range, other=float("inf"))
    p_keys = tl.load(key_ptr + base + 1, mask=in_range, other=float("inf"))
    res_best = tl.min(res_keys, axis=0)
    p_best = tl.min(p_keys, axis=0)
    res_split = tl.min(tl.where(in_range & (res_keys == res_best), s, BLOCK_S), axis=0)
    p_split = tl.min(tl.where(in_range & (p_keys == p_best), s, BLOCK_S), axis=0)
    use_res = res_best < float("inf")
    has_mass = use_res | (p_best < float("inf"))
    row_tau = b * (num_draft + 1) + tau
    winner = tl.where(use_res, (row_tau * num_splits + res_split) * 2,
                      (row_tau * num_splits + p_split) * 2 + 1)
    token = tl.load(token_ptr + winner, mask=has_mass, other=-1)

    out = tl.where(t < tau, d.to(tl.int32), -1)
    out = tl.where(t == tau, token, out)
    tl.store(out_ptr + b * stride_ob + t64, out, mask=is_row)
    acc_old = tl.load(accepted_ptr + b * stride_acc)
    tl.store(accepted_ptr + b * stride_acc, acc_old + num_accepted.to(acc_old.dtype))
    emit_old = tl.load(emitted_ptr + b * stride_emit)
    tl.store(emitted_ptr + b * stride_emit, emit_old + tau.to(emit_old.dtype))
