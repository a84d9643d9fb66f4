"""Triton stages of the chunked exponential race (``race.py`` beside this file is the torch rule),
for every sampler's kernel: the same operations in the same precision, so the kernels and the torch
code draw the same tokens.
"""

import triton
import triton.language as tl

from .values_triton import GREEDY, ONE_HOT, load_stats, row_values
from .philox import philox_uniform
from .probs_triton import ABSENT, widen
from .step_triton import adjusted_row


@triton.jit
def race_key(mass, neg_log_u):
    """Exponential-race key of a chunk: -log(u) / mass in float64, +inf when it has no mass."""
    mass = mass.to(tl.float64)
    return tl.where(mass > 0, neg_log_u / tl.where(mass > 0, mass, 1.0), float("inf"))


@triton.jit
def inverse_cdf(values, u, CHUNK: tl.constexpr):
    """Index of the first positive value whose float64 prefix sum exceeds u * (the last prefix
    sum), as race.inverse_cdf; when rounding leaves none (possible here, where tl.cumsum is a tree
    scan, not torch's in-order sum), the last positive value."""
    idx = tl.arange(0, CHUNK)
    positive = values > 0
    cdf = tl.cumsum(values.to(tl.float64), axis=0)
    total = tl.sum(tl.where(idx == CHUNK - 1, cdf, 0.0), axis=0)  # the last prefix sum, exactly
    hit = positive & (cdf > u.to(tl.float64) * total)
    first_hit = tl.min(tl.where(hit, idx, CHUNK), axis=0)
    last_positive = tl.max(tl.where(positive, idx, -1), axis=0)
    return tl.where(first_hit < CHUNK, first_hit, last_positive)


# The row stages below serve both samplers' row passes. A row's values are w_row * p, less q where
# q is read, floored at 0 (float32): block verification passes its candidate row's weight w_t,
# token verification the constant 1.0, which the compiler folds away (its SASS is unchanged by it).
# p and q are probabilities, sanitised; or, with P_LOGITS / Q_LOGITS, logits read through their
# sampled rows' statistics (core/logits/triton.py; the stats arguments point at them), with P_STEP
# after rule step 0 (step_triton.py; p_step is the row's context).


@triton.jit
def _read_p(raw, start, lane, inside, p_step, P_STEP: tl.constexpr):
    """A chunk of p's raw values at tokens start + lane, after rule step 0 where P_STEP is on."""
    values = raw
    if P_STEP:
        values = adjusted_row(widen(raw), start, lane, inside, p_step, P_STEP)
    return values


@triton.jit
def _stats_or_none(stats, LOGITS: tl.constexpr):
    """(m, c, L, r, the one-hot token) of a row whose values are logits (values_triton.row_values;
    -1 unless ONE_HOT and greedy); placeholders otherwise."""
    if LOGITS:
        mode, peak, coef, limit, scale, index = load_stats(stats)
        hot = tl.full([], -1, tl.int32)
        if LOGITS == ONE_HOT:
            hot = tl.where(mode == GREEDY, index.to(tl.int32), hot)
        return peak, coef, limit, scale, hot
    return 0.0, 0.0, tl.zeros([], tl.uint32), 0.0, tl.full([], -1, tl.int32)


@triton.jit
def _p_values(raw, start, lane, w_row, SCALED: tl.constexpr, P_LOGITS: tl.constexpr, peak, coef,
              limit, scale, hot):
    """One chunk of p (SCALED: of w_row * p) at tokens start + lane, from its raw values."""
    p = row_values(raw, P_LOGITS, peak, coef, limit, scale, start, lane, hot)
    if SCALED:
        p = w_row * p
    return p


# The row loops below stream the group's whole chunks with unmasked loads, the next chunk loaded
# (into registers) before the current one is reduced, so two chunks per program are in flight.
# The last whole chunk and a row's partial last chunk (read masked) are reduced after the loop: a
# mask in the loop would cost a compare and a register fill per load on every chunk.


@triton.jit
def _whole_chunks(first, count, vocab, CHUNK: tl.constexpr):
    """How many of chunks first .. first + count - 1 are whole (all but a partial last chunk)."""
    return tl.where(vocab - (first + count - 1) * CHUNK < CHUNK, count - 1, count)


# A greedy row's values are one-hot at its token (values_triton.ONE_HOT): the row loops read it
# as a sampled row (a greedy row keeps no logit, so all 0), then the one chunk that holds its
# token is read again with it, once a group of chunks, so that no chunk spends a compare and a
# select a value on the test (ptxas predicates a branch in the loop rather than skip it).


@triton.jit
def _hot_slot(hot, first, count, CHUNK: tl.constexpr):
    """The slot, among chunks first .. first + count - 1, of the chunk that holds token ``hot``
    (a greedy row's one-hot token); -1 where none does (hot -1: the row is not greedy)."""
    k = hot // CHUNK - first
    return tl.where((hot >= 0) & (k >= 0) & (k < count), k, -1)


@triton.jit
def _residual_chunk_again(res_masses, p_masses, k, row_p, row_q, w_row, first, vocab,
                          CHUNK: tl.constexpr, P_LOGITS: tl.constexpr, p_peak, p_coef, p_limit,
                          p_scale, p_hot, Q_LOGITS: tl.constexpr, q_peak, q_coef, q_limit,
                          q_scale, q_hot, P_STEP: tl.constexpr, p_step):
    """``masses_residual``'s masses with slot k's chunk (where k >= 0) read again, each row
    one-hot where greedy (the rows' statistics as ``_stats_or_none`` gives them)."""
    if k >= 0:
        lane = tl.arange(0, CHUNK)
        slot = tl.arange(0, res_masses.shape[0])
        offset = (first + k) * CHUNK
        inside = lane < vocab - offset
        raw_p = tl.load(row_p + offset + lane, mask=inside, other=ABSENT)
        res, p = _residual_values(_read_p(raw_p, offset, lane, inside, p_step, P_STEP),
                                  tl.load(row_q + offset + lane, mask=inside, other=ABSENT),
                                  offset, lane, w_row, P_LOGITS, p_peak, p_coef, p_limit, p_scale,
                                  p_hot, Q_LOGITS, q_peak, q_coef, q_limit, q_scale, q_hot)
        res_masses = tl.where(slot == k, tl.sum(res, axis=0), res_masses)
        p_masses = tl.where(slot == k, tl.sum(p, axis=0), p_masses)
    return res_masses, p_masses


@triton.jit
def masses_p(row_p, w_row, first, count, vocab, SCALED: tl.constexpr, GROUP: tl.constexpr,
             CHUNK: tl.constexpr, P_LOGITS: tl.constexpr = False, p_stats=None,
             P_STEP: tl.constexpr = 0, p_step=None):
    """float32 masses of sanitised p (SCALED: of w_row * p) over chunks first .. first + count - 1
    (count <= GROUP), chunk first + i in slot i: the row loop when q is not read."""
    peak, coef, limit, scale, hot = _stats_or_none(p_stats, P_LOGITS)
    slot = tl.arange(0, GROUP)
    lane = tl.arange(0, CHUNK)
    masses = tl.zeros([GROUP], tl.float32)
    whole = _whole_chunks(first, count, vocab, CHUNK)
    ptr = row_p + first * CHUNK
    start = first * CHUNK  # P_STEP and ONE_HOT only: the chunk's first token
    p_next = widen(tl.load(ptr + lane, mask=lane < tl.where(whole > 0, CHUNK, 0), other=ABSENT))
    for i in range(whole - 1):
        p = _p_values(_read_p(p_next, start, lane, lane < CHUNK, p_step, P_STEP), start, lane,
                      w_row, SCALED, P_LOGITS != 0, peak, coef, limit, scale, hot)
        ptr += CHUNK
        start += CHUNK
        p_next = widen(tl.load(ptr + lane))
        masses = tl.where(slot == i, tl.sum(p, axis=0), masses)
    if whole > 0:  # the last whole chunk, loaded by the loop
        p = _p_values(_read_p(p_next, start, lane, lane < CHUNK, p_step, P_STEP), start, lane,
                      w_row, SCALED, P_LOGITS != 0, peak, coef, limit, scale, hot)
        masses = tl.where(slot == whole - 1, tl.sum(p, axis=0), masses)
    if whole < count:
        offset = (first + whole) * CHUNK
        raw = tl.load(row_p + offset + lane, mask=lane < vocab - offset, other=ABSENT)
        raw = _read_p(raw, offset, lane, lane < vocab - offset, p_step, P_STEP)
        p = _p_values(raw, offset, lane, w_row, SCALED, P_LOGITS != 0, peak, coef, limit, scale,
                      hot)
        masses = tl.where(slot == whole, tl.sum(p, axis=0), masses)
    if P_LOGITS == ONE_HOT:  # a greedy row: the chunk of its token again, one-hot
        k = _hot_slot(hot, first, count, CHUNK)
        if k >= 0:
            offset = (first + k) * CHUNK
            inside = lane < vocab - offset
            raw = tl.load(row_p + offset + lane, mask=inside, other=ABSENT)
            p = _p_values(_read_p(raw, offset, lane, inside, p_step, P_STEP), offset, lane, w_row,
                          SCALED, P_LOGITS, peak, coef, limit, scale, hot)
            masses = tl.where(slot == k, tl.sum(p, axis=0), masses)
    return masses


@triton.jit
def _residual_values(raw_p, raw_q, start, lane, w_row, P_LOGITS: tl.constexpr, p_peak, p_coef,
                     p_limit, p_scale, p_hot, Q_LOGITS: tl.constexpr, q_peak, q_coef, q_limit,
                     q_scale, q_hot):
    """One chunk of the residual max(w_row p - q, 0), and of p, at tokens start + lane from their
    raw values."""
    p = row_values(raw_p, P_LOGITS, p_peak, p_coef, p_limit, p_scale, start, lane, p_hot)
    q = row_values(raw_q, Q_LOGITS, q_peak, q_coef, q_limit, q_scale, start, lane, q_hot)
    return tl.maximum(w_row * p - q, 0.0), p


@triton.jit
def masses_residual(row_p, row_q, w_row, first, count, vocab, GROUP: tl.constexpr,
                    CHUNK: tl.constexpr, P_LOGITS: tl.constexpr = False, p_stats=None,
                    Q_LOGITS: tl.constexpr = False, q_stats=None, P_STEP: tl.constexpr = 0,
                    p_step=None):
    """float32 masses of the residual max(w_row p - q, 0) and of p over chunks first .. first +
    count - 1, chunk first + i in slot i: the row loop when q is read."""
    p_peak, p_coef, p_limit, p_scale, p_hot = _stats_or_none(p_stats, P_LOGITS)
    q_peak, q_coef, q_limit, q_scale, q_hot = _stats_or_none(q_stats, Q_LOGITS)
    slot = tl.arange(0, GROUP)
    lane = tl.arange(0, CHUNK)
    res_masses = tl.zeros([GROUP], tl.float32)
    p_masses = tl.zeros([GROUP], tl.float32)
    whole = _whole_chunks(first, count, vocab, CHUNK)
    offset = first * CHUNK
    in_range = lane < tl.where(whole > 0, CHUNK, 0)
    p_next = widen(tl.load(row_p + offset + lane, mask=in_range, other=ABSENT))
    q_next = widen(tl.load(row_q + offset + lane, mask=in_range, other=ABSENT))
    for i in range(whole - 1):
        res, p = _residual_values(_read_p(p_next, offset, lane, lane < CHUNK, p_step, P_STEP),
                                  q_next, offset, lane, w_row, P_LOGITS != 0, p_peak, p_coef,
                                  p_limit, p_scale, p_hot, Q_LOGITS != 0, q_peak, q_coef,
                                  q_limit, q_scale, q_hot)
        offset += CHUNK
        p_next = widen(tl.load(row_p + offset + lane))
        q_next = widen(tl.load(row_q + offset + lane))
        res_mass, p_mass = tl.split(tl.sum(tl.join(res, p), axis=0))
        res_masses = tl.where(slot == i, res_mass, res_masses)
        p_masses = tl.where(slot == i, p_mass, p_masses)
    if whole > 0:  # the last whole chunk, loaded by the loop
        res, p = _residual_values(_read_p(p_next, offset, lane, lane < CHUNK, p_step, P_STEP),
                                  q_next, offset, lane, w_row, P_LOGITS != 0, p_peak, p_coef,
                                  p_limit, p_scale, p_hot, Q_LOGITS != 0, q_peak, q_coef,
                                  q_limit, q_scale, q_hot)
        res_masses = tl.where(slot == whole - 1, tl.sum(res, axis=0), res_masses)
        p_masses = tl.where(slot == whole - 1, tl.sum(p, axis=0), p_masses)
    if whole < count:
        offset = (first + whole) * CHUNK
        in_range = lane < vocab - offset
        raw_p = tl.load(row_p + offset + lane, mask=in_range, other=ABSENT)
        res, p = _residual_values(_read_p(raw_p, offset, lane, in_range, p_step, P_STEP),
                                  tl.load(row_q + offset + lane, mask=in_range, other=ABSENT),
                                  offset, lane, w_row, P_LOGITS != 0, p_peak, p_coef,
                                  p_limit, p_scale, p_hot, Q_LOGITS != 0, q_peak, q_coef,
                                  q_limit, q_scale, q_hot)
        res_masses = tl.where(slot == whole, tl.sum(res, axis=0), res_masses)
        p_masses = tl.where(slot == whole, tl.sum(p, axis=0), p_masses)
    # Greedy rows: the chunk of each one's token again, both rows one-hot.
    if P_LOGITS == ONE_HOT:
        res_masses, p_masses = _residual_chunk_again(
            res_masses, p_masses, _hot_slot(p_hot, first, count, CHUNK), row_p, row_q, w_row,
            first, vocab, CHUNK, P_LOGITS, p_peak, p_coef, p_limit, p_scale, p_hot, Q_LOGITS,
            q_peak, q_coef, q_limit, q_scale, q_hot, P_STEP, p_step)
    if Q_LOGITS == ONE_HOT:
        res_masses, p_masses = _residual_chunk_again(
            res_masses, p_masses, _hot_slot(q_hot, first, count, CHUNK), row_p, row_q, w_row,
            first, vocab, CHUNK, P_LOGITS, p_peak, p_coef, p_limit, p_scale, p_hot, Q_LOGITS,
            q_peak, q_coef, q_limit, q_scale, q_hot, P_STEP, p_step)
    return res_masses, p_masses


@triton.jit
def chunk_values(row_p, row_q, chunk, vocab, w_row, read_q, removed, HAS_DRAFT: tl.constexpr,
                 CHUNK: tl.constexpr, P_LOGITS: tl.constexpr = False, p_stats=None,
                 Q_LOGITS: tl.constexpr = False, q_stats=None, P_STEP: tl.constexpr = 0,
                 p_step=None):
    """The CHUNK values of the sampled row in one chunk, 0 past V: max(w_row p - q, 0) when read_q
    (draft given), w_row p with token ``removed`` zeroed (draft None; -1: none), else w_row p.
    With w_row = 1, read_q False and removed -1: p."""
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    p_peak, p_coef, p_limit, p_scale, p_hot = _stats_or_none(p_stats, P_LOGITS)
    raw_p = _read_p(tl.load(row_p + cols, mask=cols < vocab, other=ABSENT), chunk * CHUNK,
                    tl.arange(0, CHUNK), cols < vocab, p_step, P_STEP)
    p = row_values(raw_p, P_LOGITS, p_peak, p_coef, p_limit, p_scale, chunk * CHUNK,
                   tl.arange(0, CHUNK), p_hot)
    if HAS_DRAFT:
        q_peak, q_coef, q_limit, q_scale, q_hot = _stats_or_none(q_stats, Q_LOGITS)
        q = row_values(tl.load(row_q + cols, mask=(cols < vocab) & read_q, other=ABSENT), Q_LOGITS,
                       q_peak, q_coef, q_limit, q_scale, chunk * CHUNK, tl.arange(0, CHUNK),
                       tl.where(read_q, q_hot, -1))
        return tl.maximum(w_row * p - q, 0.0)  # == w_row p when q is not read
    else:
        return tl.where(cols == removed, 0.0, w_row * p)


@triton.jit
def keep_best(best_key, best_chunk, masses, first, count, neg_log_u, GROUP: tl.constexpr):
    """The running best (key, chunk) of a race against the group of chunks first + i, i < count,
    with masses[i]: lowest key wins; ties go to the lower chunk (the running best holds lower
    chunks). Key -log(u) / mass in float64, +inf without mass, as the reference."""
    slot = tl.arange(0, GROUP)
    keys = race_key(tl.where(slot < count, masses, 0.0), neg_log_u)
    key = tl.min(keys, axis=0)
    winner = tl.min(tl.where(keys == key, slot, GROUP), axis=0)
    better = key < best_key
    return tl.where(better, key, best_key), tl.where(better, first + winner, best_chunk)


@triton.jit
def race_start():
    """(residual key, its chunk, p key, its chunk) before any chunk: no mass yet."""
    return (tl.zeros([], tl.float64) + float("inf"), tl.zeros([], tl.int64),
            tl.zeros([], tl.float64) + float("inf"), tl.zeros([], tl.int64))


@triton.jit
def race_group(res_key, res_chunk, p_key, p_chunk, res_masses, p_masses, first, count,
               race_slot0, stream, off_lo, off_hi, key_lo, key_hi, GROUP: tl.constexpr):
    """Both races' running best after the group of chunks first + i, i < count, with these
    masses: chunk k's uniform is the Philox slot race_slot0 + k, shared by the two races."""
    slot = tl.arange(0, GROUP)
    u = philox_uniform(race_slot0 + first + slot, stream, off_lo, off_hi, key_lo, key_hi)
    neg_log_u = -tl.log(u.to(tl.float64))
    res_key, res_chunk = keep_best(res_key, res_chunk, res_masses, first, count, neg_log_u, GROUP)
    p_key, p_chunk = keep_best(p_key, p_chunk, p_masses, first, count, neg_log_u, GROUP)
    return res_key, res_chunk, p_key, p_chunk


@triton.jit
def race_token(row_p, row_q, res_key, res_chunk, p_chunk, vocab, w_row, read_q, removed, u_cdf,
               HAS_DRAFT: tl.constexpr, CHUNK: tl.constexpr, P_LOGITS: tl.constexpr = False,
               p_stats=None, Q_LOGITS: tl.constexpr = False, q_stats=None,
               P_STEP: tl.constexpr = 0, p_step=None):
    """The token of the race a program's result stands for, by one inverse CDF in its winning
    chunk (read again): the residual race wherever it has mass here (then it has mass in the row,
    so it is the race used), else the p race."""
    use_res = res_key < float("inf")
    chunk = tl.where(use_res, res_chunk, p_chunk)
    values = chunk_values(row_p, row_q, chunk, vocab, tl.where(use_res, w_row, 1.0),
                          read_q & use_res, tl.where(use_res, removed, -1), HAS_DRAFT, CHUNK,
                          P_LOGITS, p_stats, Q_LOGITS, q_stats, P_STEP, p_step)
    return (chunk * CHUNK + inverse_cdf(values, u_cdf, CHUNK)).to(tl.int32)


# The race fields of a row pass's partial result (the first fields of every sampler's partials
# row, float64): the residual-race key, the p-race key (+inf where the program's chunks have no
# mass), and the token of the race the program used (the residual race where it has mass there).
RACE_FIELDS = tl.constexpr(3)


@triton.jit
def store_race_partial(partial_ptr, res_key, p_key, token):
    """Write a program's race fields at ``partial_ptr`` (float64)."""
    tl.store(partial_ptr, res_key)
    tl.store(partial_ptr + 1, p_key)
    tl.store(partial_ptr + 2, token.to(tl.float64))


@triton.jit
def winning_token(partials_ptr, row, programs, FIELDS: tl.constexpr, BLOCK: tl.constexpr,
                  SAME_LAUNCH: tl.constexpr):
    """The token of row ``row`` over the partial results of its ``programs`` programs (float64
    rows of FIELDS fields at partials_ptr[(row * programs + s) * FIELDS], race fields first): the
    residual race's winner when it has mass in any program, else the p race's (lowest key; ties:
    lowest program, which holds the lower chunks); -1 when neither has mass. SAME_LAUNCH: other
    programs of this launch wrote them, so they are read past the SM's own cache."""
    s = tl.arange(0, BLOCK)
    in_range = s < programs
    partial = partials_ptr + (row * programs + s) * FIELDS
    res_keys = tl.load(partial, mask=in_range, other=float("inf"), volatile=SAME_LAUNCH)
    p_keys = tl.load(partial + 1, mask=in_range, other=float("inf"), volatile=SAME_LAUNCH)
    use_res = tl.min(res_keys, axis=0) < float("inf")
    keys = tl.where(use_res, res_keys, p_keys)
    best = tl.min(keys, axis=0)
    winner = tl.min(tl.where(in_range & (keys == best), s, BLOCK), axis=0)
    token = tl.load(partials_ptr + (row * programs + winner) * FIELDS + 2, mask=best < float("inf"),
                    other=-1.0, volatile=SAME_LAUNCH)
    return token.to(tl.int32)
