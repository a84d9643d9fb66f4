"""Triton twin of ``rule.py`` (beside this file): every row's statistics, from which a kernel
reads its processed probabilities straight from the logits, without writing them.

A row's statistics (float64, STATS fields, ``row_statistics_kernel``): its mode (NO_MASS,
SAMPLED, GREEDY), its largest finite logit m, the exponent scale c = log2(e) / T, the keep limit
L, the scale r = 1 / W of the kept mass, and the first index of m (a greedy row's token). A sampled
row's probability of logit x is then ``processed(x, ...)`` (core/sampling/values_triton.py, where
the kernels read rows): with n = m - x (float32), exp2(n (-c)) r where n's float32 bits, read
unsigned, are below L, else 0. The rule keeps the weights
e = exp2(n (-c)) at or above a floor t, and e falls as n grows: L is one above the bits of the
largest n >= 0 whose weight is >= t (``_keep_limit``, a bisection over n's bits that reads no
logit), so the test keeps exactly the rule's tokens. NaN, +inf and -inf logits give n = NaN, -inf
(the sign bit) and +inf, never kept (L is at most +inf's bits); m is stored as +0 where it is -0,
so n is never -0. A row that keeps nothing has L = 0. One compare and one select per value.

Each threshold is found as rule.py's: min-p directly; top-k as the largest weight t with at least
k kept weights >= t, and top-p as the largest t with W(t) >= P W(0), each by bisection over the
float32 bit patterns of t in [0, 1], one pass over the row per step: a row takes at most 2 + 31
(top-k) + 31 (top-p) passes, 2 with temperature and min-p alone.
"""

import triton
import triton.language as tl

from ..launch.rows_triton import flattened_request
from ..sampling.probs_triton import widen
from ..sampling.sums_triton import BIN_LANES, add_masses, to_float
from ..sampling.values_triton import GREEDY, NO_MASS, SAMPLED, STATS, processed
from . import rule as logits
from ..sampling.step_triton import adjusted_row, drafts_before, request_step, row_step

LOG2E = tl.constexpr(logits.LOG2E)
FLOAT32_MAX = tl.constexpr(logits.FLOAT32_MAX)  # c's largest value (rule.coefficient)
LN2 = tl.constexpr(0.6931471805599453)
ONE_BITS = tl.constexpr(0x3F800000)  # 1.0's float32 bits: the weights' range is [0, 1]
INF_BITS = tl.constexpr(0x7F800000)  # +inf's: n = +inf (a -inf logit) is never kept


# The statistics' passes keep per-lane partial results across a row's chunks (running maxima and
# their indices, counts) and reduce them over the block once per row; only the masses are summed
# per chunk, as the rule defines them, and binned a group of chunks at a time. Each pass streams
# the row's whole chunks with unmasked loads and reads a partial last chunk apart, masked (a mask
# in the loop would cost a compare and a register fill per load on every chunk).
STATS_GROUP = tl.constexpr(128)  # chunk masses a program holds before binning them


@triton.jit
def _chunk(row, vocab, first, lane, MASKED: tl.constexpr, step, STEP: tl.constexpr):
    """The float32 logits of the chunk at ``first`` (-inf past V when MASKED: the row's partial
    last chunk), after rule step 0 where STEP is on (core/sampling/step_triton.py)."""
    if MASKED:
        x = widen(tl.load(row + first + lane, mask=first + lane < vocab, other=-float("inf")))
    else:
        x = widen(tl.load(row + first + lane))
    if STEP:
        x = adjusted_row(x, first, lane, first + lane < vocab, step, STEP)
    return x


@triton.jit
def _kept(x, peak, coef, floor):
    """(weights of logits x, where they are in [floor, 1]): the finite logits with weight >=
    floor, by one unsigned compare of the weights' bits (NaN and +inf logits weigh NaN and +inf,
    above 1; a -inf logit weighs 0, kept only where floor is 0, where it adds nothing and every
    finite logit is kept). The weight exp2((m - x) (-c)) is exp2((x - m) c) bit for bit."""
    e = tl.exp2((peak - x) * -coef)
    above = floor.to(tl.uint32, bitcast=True)
    return e, e.to(tl.uint32, bitcast=True) - above <= ONE_BITS - above


@triton.jit
def _peak_step(best, at, x, index):
    """The running per-lane maximum of finite logits and its first index, after logits x."""
    better = (x > best) & (x < float("inf"))  # NaN and -inf never are; the first index stays
    return tl.where(better, x, best), tl.where(better, index, at)


@triton.jit
def _peak(row, vocab, step, STEP: tl.constexpr, CHUNK: tl.constexpr):
    """(largest finite logit, its first index; -inf and 0 without one)."""
    lane = tl.arange(0, CHUNK)
    best = tl.full([CHUNK], -float("inf"), tl.float32)
    at = tl.zeros([CHUNK], tl.int32)
    whole = vocab // CHUNK * CHUNK
    for first in range(0, whole, CHUNK):
        best, at = _peak_step(best, at, _chunk(row, vocab, first, lane, False, step, STEP),
                              first + lane)
    if whole < vocab:
        best, at = _peak_step(best, at, _chunk(row, vocab, whole, lane, True, step, STEP),
                              whole + lane)
    top = tl.max(best, axis=0)
    index = tl.min(tl.where(best == top, at, vocab), axis=0)
    return top, tl.where(top > -float("inf"), index, 0).to(tl.int64)


@triton.jit
def _count(row, vocab, peak, coef, floor, step, STEP: tl.constexpr, CHUNK: tl.constexpr):
    """How many finite logits have weight >= floor (where floor is 0, the -inf logits and the
    lanes past V too: of weight 0, they change no probability the threshold gives)."""
    lane = tl.arange(0, CHUNK)
    counts = tl.zeros([CHUNK], tl.int32)
    whole = vocab // CHUNK * CHUNK
    for first in range(0, whole, CHUNK):
        e, keep = _kept(_chunk(row, vocab, first, lane, False, step, STEP), peak, coef, floor)
        counts += keep.to(tl.int32)
    if whole < vocab:
        e, keep = _kept(_chunk(row, vocab, whole, lane, True, step, STEP), peak, coef, floor)
        counts += keep.to(tl.int32)
    return tl.sum(counts, axis=0).to(tl.int64)


@triton.jit
def _mass(row, vocab, peak, coef, floor, step, STEP: tl.constexpr, CHUNK: tl.constexpr):
    """W(floor): the exact sum of the float32 chunk masses of the weights >= floor (float64), as
    logits.kept_mass."""
    lane = tl.arange(0, CHUNK)
    slot = tl.arange(0, STATS_GROUP)
    bins = tl.zeros([1, BIN_LANES], tl.int64)
    whole = vocab // CHUNK * CHUNK
    for group in range(0, whole, STATS_GROUP * CHUNK):
        masses = tl.zeros([STATS_GROUP], tl.float32)
        chunk = row + group
        for i in range(tl.minimum((whole - group) // CHUNK, STATS_GROUP)):
            x = widen(tl.load(chunk + lane))
            if STEP:
                x = adjusted_row(x, group + i * CHUNK, lane, lane < CHUNK, step, STEP)
            e, keep = _kept(x, peak, coef, floor)
            chunk += CHUNK
            masses = tl.where(slot == i, tl.sum(tl.where(keep, e, 0.0), axis=0), masses)
        bins = add_masses(bins, masses[None, :])
    if whole < vocab:
        e, keep = _kept(_chunk(row, vocab, whole, lane, True, step, STEP), peak, coef, floor)
        bins = add_masses(bins, tl.zeros([1, 1], tl.float32) + tl.sum(tl.where(keep, e, 0.0),
                                                                      axis=0))
    return tl.sum(to_float(bins), axis=0)


@triton.jit
def _largest_floor(row, vocab, peak, coef, floor, goal, step, STEP: tl.constexpr,
                   MASS: tl.constexpr, CHUNK: tl.constexpr):
    """The largest weight t >= floor whose kept weights (those >= t) still reach ``goal``: at
    least ``goal`` of them (top-k: the k-th largest kept weight) or, with MASS, a mass W(t) >=
    goal (top-p); by bisection over float32 bit patterns in [bits(floor), bits(1.0)]."""
    lo = floor.to(tl.int32, bitcast=True)
    hi = ONE_BITS + 1  # no weight is >= hi
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        t = mid.to(tl.float32, bitcast=True)
        if MASS:
            enough = _mass(row, vocab, peak, coef, t, step, STEP, CHUNK) >= goal
        else:
            enough = _count(row, vocab, peak, coef, t, step, STEP, CHUNK) >= goal
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    return lo.to(tl.float32, bitcast=True)


@triton.jit
def _keep_limit(coef, floor):
    """One above the float32 bits of the largest n >= 0 whose weight exp2(n (-c)) is >= floor
    (at most +inf's bits), by bisection over n's bits: the weight falls as n grows."""
    lo = tl.zeros([], tl.int32)  # n = 0: weight 1 >= floor
    hi = tl.full([], INF_BITS + 1, tl.int32)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        kept = tl.exp2(mid.to(tl.float32, bitcast=True) * -coef) >= floor
        lo = tl.where(kept, mid, lo)
        hi = tl.where(kept, hi, mid)
    return tl.minimum(lo + 1, INF_BITS)


@triton.jit
def _entropy(row, vocab, peak, coef, limit, scale, step, STEP: tl.constexpr,
             CHUNK: tl.constexpr):
    """A sampled row's entropy H = ln W * sum p - ln 2 * sum p t (nats), p its processed
    probabilities (r = 1 / W) and t = (x - m) c the base-2 log of a kept token's weight (a p of 0
    adds nothing): one more pass over the row, once its statistics are known."""
    lane = tl.arange(0, CHUNK)
    mass = tl.zeros([CHUNK], tl.float32)
    weighted = tl.zeros([CHUNK], tl.float32)
    for first in range(0, vocab, CHUNK):
        x = _chunk(row, vocab, first, lane, True, step, STEP)
        p = processed(x, peak, coef, limit.to(tl.uint32), scale)
        mass += p
        weighted += tl.where(p > 0, p * ((x - peak) * coef), 0.0)
    return -tl.log(scale) * tl.sum(mass, 0) - LN2 * tl.sum(weighted, 0)


# Specialised on the row addressing only (the logits pointer, V and the row strides: 16-byte row
# loads); no value of the other arguments compiles another kernel.
@triton.jit(do_not_specialize=["stats_ptr", "temperature_ptr", "top_k_ptr", "top_p_ptr",
                               "min_p_ptr", "cu_ptr", "positions", "num_tokens", "bonus",
                               "temperature_stride", "top_k_stride", "top_p_stride",
                               "min_p_stride", "min_p_last", "ids_ptr", "stride_ib", "stride_in",
                               "stride_it", "penalties_ptr", "penalty_stride", "entropy_ptr"])
def row_statistics_kernel(
    logits_ptr,  # (B, positions, V) logits, vocabulary stride 1 (VARLEN: (T + B bonus, V))
    stats_ptr,  # (B * positions, STATS) float64, written (VARLEN: request b's rows only)
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # (1,) or (B,) each
    cu_ptr,  # VARLEN: (B + 1,) cumulative draft counts (unused otherwise)
    positions,  # rows a request (VARLEN: the most a request has)
    num_tokens,  # VARLEN: T, the drafts of all requests (unused otherwise)
    bonus,  # VARLEN: 1 where request b has n_b + 1 rows (a target's), 0 where n_b (a draft's)
    vocab, stride_b, stride_n,  # VARLEN: stride_b unused
    temperature_stride, top_k_stride, top_p_stride, min_p_stride,  # 0 for one value for all
    min_p_last,  # 1: min-p after top-k and top-p (Hugging Face transformers' order)
    # Rule step 0 (core/sampling/step_triton.py), read where STEP says, for a target's rows:
    # (B, N) draft ids, row t counting d_0 .. d_{t-1} (VARLEN: (T,), stride_ib unused); or a
    # tree's paths (B, M + 1, max(M, 1)), row t counting its own list (stride_it: 0 but there)
    ids_ptr, stride_ib, stride_in, stride_it,
    bias_ptr,  # (B, V) logit bias, contiguous
    bitmask_ptr,  # (B, positions, ceil(V / 32)) int32 (VARLEN: (T + B, ...)), contiguous
    counts_ptr,  # (B, V) output token counts, contiguous
    prompt_ptr,  # (B, V) bool prompt token mask, contiguous
    penalties_ptr, penalty_stride,  # (1 or B, 4) float64: repetition, frequency, presence, 1/r
    entropy_ptr,  # ENTROPY: (B * positions,) float32, written as the statistics are
    CHUNK: tl.constexpr,
    VARLEN: tl.constexpr,  # a flattened batch (core/launch/rows_triton.py)
    STEP: tl.constexpr = 0,  # the parts of rule step 0 that are on (step_triton.py's flags)
    ENTROPY: tl.constexpr = False,  # each row's entropy too (typical acceptance reads it)
):
    """One program per row: its statistics (module docstring), as logits.processed_rows
    decides them. The statistics are laid out as a padded batch's, ``positions`` a request."""
    row = tl.program_id(0).to(tl.int64)
    b = row // positions
    t = row % positions
    if VARLEN:
        start, n = flattened_request(b, cu_ptr, positions - bonus, num_tokens)
        if t >= n + bonus:  # no such row
            return
        flat_row = start + b * bonus + t
        logits_row = logits_ptr + flat_row * stride_n
        ids0 = ids_ptr + start * stride_in
    else:
        flat_row = row
        logits_row = logits_ptr + b * stride_b + t * stride_n
        ids0 = ids_ptr + b * stride_ib + t * stride_it
    step = None
    if STEP:
        step = row_step(request_step(b, vocab, bias_ptr, counts_ptr, prompt_ptr, penalties_ptr,
                                     penalty_stride, STEP),
                        bitmask_ptr, flat_row, vocab, ids0, stride_in,
                        drafts_before(ids0, stride_in, t, vocab))
    temperature = tl.load(temperature_ptr + b * temperature_stride).to(tl.float32)
    top_k = tl.load(top_k_ptr + b * top_k_stride).to(tl.int64)
    top_p = tl.load(top_p_ptr + b * top_p_stride).to(tl.float32)
    min_p = tl.load(min_p_ptr + b * min_p_stride).to(tl.float32)
    in_range = ((temperature >= 0) & (top_k >= 0) & (top_p > 0) & (top_p <= 1) & (min_p >= 0)
                & (min_p <= 1))
    # First, while few values are live: its slow path is a call, around which ptxas saves them.
    coef = tl.minimum(tl.math.div_rn(tl.full([], LOG2E, tl.float32), temperature), FLOAT32_MAX)
    peak, index = _peak(logits_row, vocab, step, STEP, CHUNK)
    peak = tl.where(peak == 0, 0.0, peak)  # +0 for -0: n = m - x is then never -0 (kept)
    mode = tl.where(in_range & (peak > -float("inf")),
                    tl.where(temperature == 0, GREEDY, SAMPLED), NO_MASS)
    scale = tl.full([], 1.0, tl.float32)
    limit = tl.zeros([], tl.int32)  # keeps nothing
    if mode == SAMPLED:
        floor = tl.where(min_p_last != 0, 0.0, min_p)
        if (top_k > 0) & (top_k < vocab):
            if _count(logits_row, vocab, peak, coef, floor, step, STEP, CHUNK) > top_k:
                floor = _largest_floor(logits_row, vocab, peak, coef, floor, top_k, step, STEP,
                                       False, CHUNK)
        if top_p < 1:
            goal = top_p.to(tl.float64) * _mass(logits_row, vocab, peak, coef, floor, step, STEP,
                                                CHUNK)
            floor = _largest_floor(logits_row, vocab, peak, coef, floor, goal, step, STEP, True,
                                   CHUNK)
        floor = tl.maximum(floor, min_p)  # min-p last; in vLLM's order the floor is above it
        mass = _mass(logits_row, vocab, peak, coef, floor, step, STEP, CHUNK)
        scale = (1.0 / mass).to(tl.float32)
        if mass > 0:
            limit = tl.full([], INF_BITS, tl.int32)  # floor 0: every finite logit is kept
            if floor > 0:
                limit = _keep_limit(coef, floor)
    out = stats_ptr + row * STATS
    tl.store(out, mode.to(tl.float64))
    tl.store(out + 1, peak.to(tl.float64))
    tl.store(out + 2, coef.to(tl.float64))
    tl.store(out + 3, limit.to(tl.float64))
    tl.store(out + 4, scale.to(tl.float64))
    tl.store(out + 5, index.to(tl.float64))
    if ENTROPY:  # 0 for a greedy row (one-hot) and a row without mass
        entropy = tl.zeros([], tl.float32)
        if mode == SAMPLED:
            entropy = _entropy(logits_row, vocab, peak, coef, limit, scale, step, STEP, CHUNK)
        tl.store(entropy_ptr + row, entropy)
