"""Triton twin of ``logits.py`` (beside this file): every row's statistics, from which a kernel
reads its processed probabilities straight from the logits, without writing them.

A row's statistics (float64, STATS fields, ``row_statistics_kernel``): its mode (NO_MASS,
SAMPLED, GREEDY), its largest finite logit m, the exponent scale c = log2(e) / T, the least logit
kept theta (every step's threshold is a threshold on the weight e, which grows with the logit), the
scale r = 1 / W of the kept mass, and the first index of m (a greedy row's token). A sampled row's
probability of logit x is then ``processed(x, ...)``: exp2((x - m) c) r where theta <= x <= m, else
0; a greedy row's is 1 at its index.

Each threshold is found as logits.py's: min-p directly; top-k as the largest weight t with at least
k kept weights >= t, and top-p as the largest t with W(t) >= P W(0), each by bisection over the
float32 bit patterns of t in [0, 1], one pass over the row per step: a row takes at most 2 + 31
(top-k) + 31 (top-p) passes, 2 with temperature and min-p alone.
"""

import triton
import triton.language as tl

from . import logits
from .probs_triton import sanitize
from .sums_triton import BIN_LANES, add_masses, to_float

NO_MASS = tl.constexpr(0)
SAMPLED = tl.constexpr(1)
GREEDY = tl.constexpr(2)
STATS = tl.constexpr(6)  # mode, m, c, theta, r, greedy index
LOG2E = tl.constexpr(logits.LOG2E)
ONE_BITS = tl.constexpr(0x3F800000)  # 1.0's float32 bits: the weights' range is [0, 1]


@triton.jit
def weight(x, peak, coef):
    """e = exp2((x - m) c), float32, of finite logits (as logits.weights)."""
    return tl.exp2((x - peak) * coef)


@triton.jit
def processed(x, peak, coef, theta, scale):
    """A sampled row's probabilities of logits x (float32): exp2((x - m) c) r where theta <= x
    <= m (NaN and infinite logits fail one test or the other), else 0."""
    keep = (x >= theta) & (x <= peak)
    return tl.where(keep, weight(x, peak, coef) * scale, 0.0)


@triton.jit
def load_stats(stats, mask=True):
    """A row's statistics at ``stats`` (a pointer, or a vector of pointers, read where ``mask``):
    (mode, m, c, theta, r, greedy index), in the types the kernels compute with."""
    mode = tl.load(stats, mask=mask, other=0.0).to(tl.int32)
    peak = tl.load(stats + 1, mask=mask, other=0.0).to(tl.float32)
    coef = tl.load(stats + 2, mask=mask, other=0.0).to(tl.float32)
    theta = tl.load(stats + 3, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(stats + 4, mask=mask, other=0.0).to(tl.float32)
    index = tl.load(stats + 5, mask=mask, other=0.0).to(tl.int64)
    return mode, peak, coef, theta, scale, index


@triton.jit
def row_values(raw, LOGITS: tl.constexpr, peak, coef, theta, scale):
    """A row's values as the rules read them: the sanitised probabilities, or (LOGITS) the
    probabilities a sampled row's statistics give its logits."""
    if LOGITS:
        return processed(raw.to(tl.float32), peak, coef, theta, scale)
    return sanitize(raw)


@triton.jit
def probabilities_at(raw, stats, ids, mask, LOGITS: tl.constexpr):
    """The probabilities of the logits (or probabilities) ``raw`` at token ``ids`` of their rows,
    whose statistics are at ``stats`` (vectors alike, read where ``mask``): greedy rows one-hot at
    their index."""
    if LOGITS:
        mode, peak, coef, theta, scale, index = load_stats(stats, mask)
        sampled = processed(raw.to(tl.float32), peak, coef, theta, scale)
        return tl.where(mode == GREEDY, (ids == index).to(tl.float32), sampled)
    return sanitize(raw)


@triton.jit
def _peak(row, vocab, CHUNK: tl.constexpr):
    """(largest finite logit, its first index; -inf and 0 without one)."""
    lane = tl.arange(0, CHUNK)
    best = tl.full([], -float("inf"), tl.float32)
    index = tl.zeros([], tl.int64)
    for first in range(0, vocab, CHUNK):
        x = tl.load(row + first + lane, mask=first + lane < vocab, other=-float("inf"))
        x = x.to(tl.float32)
        x = tl.where((x == x) & (tl.abs(x) < float("inf")), x, -float("inf"))
        top = tl.max(x, axis=0)
        at = tl.min(tl.where(x == top, lane, CHUNK), axis=0) + first
        better = top > best
        best, index = tl.where(better, top, best), tl.where(better, at, index)
    return best, index


@triton.jit
def _kept(row, vocab, peak, coef, floor, first, lane, CHUNK: tl.constexpr):
    """(weights of a chunk, where it keeps them: finite logits with weight >= floor)."""
    x = tl.load(row + first + lane, mask=first + lane < vocab, other=-float("inf")).to(tl.float32)
    valid = (x == x) & (tl.abs(x) < float("inf"))
    e = tl.where(valid, weight(x, peak, coef), 0.0)
    return e, valid & (e >= floor)


@triton.jit
def _count(row, vocab, peak, coef, floor, CHUNK: tl.constexpr):
    """How many finite logits have weight >= floor."""
    lane = tl.arange(0, CHUNK)
    total = tl.zeros([], tl.int64)
    for first in range(0, vocab, CHUNK):
        e, keep = _kept(row, vocab, peak, coef, floor, first, lane, CHUNK)
        total += tl.sum(keep.to(tl.int64), axis=0)
    return total


@triton.jit
def _mass(row, vocab, peak, coef, floor, CHUNK: tl.constexpr):
    """W(floor): the exact sum of the float32 chunk masses of the weights >= floor (float64), as
    logits.kept_mass; and the least logit among them."""
    lane = tl.arange(0, CHUNK)
    bins = tl.zeros([1, BIN_LANES], tl.int64)
    least = tl.full([], float("inf"), tl.float32)
    for first in range(0, vocab, CHUNK):
        e, keep = _kept(row, vocab, peak, coef, floor, first, lane, CHUNK)
        chunk = tl.sum(tl.where(keep, e, 0.0), axis=0)
        bins = add_masses(bins, tl.zeros([1, 1], tl.float32) + chunk)
        x = tl.load(row + first + lane, mask=first + lane < vocab, other=0.0).to(tl.float32)
        least = tl.minimum(least, tl.min(tl.where(keep, x, float("inf")), axis=0))
    return tl.sum(to_float(bins), axis=0), least


@triton.jit
def _largest_floor_with_count(row, vocab, peak, coef, floor, k, CHUNK: tl.constexpr):
    """The largest weight t >= floor with at least k weights >= t (the k-th largest kept
    weight), by bisection over float32 bit patterns in [bits(floor), bits(1.0)]."""
    lo = floor.to(tl.int32, bitcast=True)
    hi = ONE_BITS + 1  # count(>= hi) is 0 < k
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        enough = _count(row, vocab, peak, coef, mid.to(tl.float32, bitcast=True), CHUNK) >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    return lo.to(tl.float32, bitcast=True)


@triton.jit
def _largest_floor_with_mass(row, vocab, peak, coef, floor, goal, CHUNK: tl.constexpr):
    """The largest weight t >= floor with W(t) >= goal, by bisection as above."""
    lo = floor.to(tl.int32, bitcast=True)
    hi = ONE_BITS + 1
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        mass, least = _mass(row, vocab, peak, coef, mid.to(tl.float32, bitcast=True), CHUNK)
        enough = mass >= goal
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    return lo.to(tl.float32, bitcast=True)


# Specialised on the row addressing only (the logits pointer, V and the row strides: 16-byte row
# loads); no value of the other arguments compiles another kernel.
@triton.jit(do_not_specialize=["stats_ptr", "temperature_ptr", "top_k_ptr", "top_p_ptr",
                               "min_p_ptr", "positions", "temperature_stride", "top_k_stride",
                               "top_p_stride", "min_p_stride"])
def row_statistics_kernel(
    logits_ptr,  # (B, positions, V) logits, vocabulary stride 1
    stats_ptr,  # (B * positions, STATS) float64, written
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # (1,) or (B,) each
    positions, vocab, stride_b, stride_n,
    temperature_stride, top_k_stride, top_p_stride, min_p_stride,  # 0 for one value for all
    CHUNK: tl.constexpr,
):
    """One program per row: its statistics (module docstring), as logits.processed_rows
    decides them."""
    row = tl.program_id(0).to(tl.int64)
    b = row // positions
    logits_row = logits_ptr + b * stride_b + (row % positions) * stride_n
    temperature = tl.load(temperature_ptr + b * temperature_stride).to(tl.float32)
    top_k = tl.load(top_k_ptr + b * top_k_stride).to(tl.int64)
    top_p = tl.load(top_p_ptr + b * top_p_stride).to(tl.float32)
    min_p = tl.load(min_p_ptr + b * min_p_stride).to(tl.float32)
    in_range = ((temperature >= 0) & (top_k >= 0) & (top_p > 0) & (top_p <= 1) & (min_p >= 0)
                & (min_p <= 1))
    peak, index = _peak(logits_row, vocab, CHUNK)
    coef = tl.math.div_rn(tl.full([], LOG2E, tl.float32), temperature)
    mode = tl.where(in_range & (peak > -float("inf")),
                    tl.where(temperature == 0, GREEDY, SAMPLED), NO_MASS)
    theta = peak
    scale = tl.full([], 1.0, tl.float32)
    if mode == SAMPLED:
        floor = min_p
        if (top_k > 0) & (top_k < vocab):
            if _count(logits_row, vocab, peak, coef, floor, CHUNK) > top_k:
                floor = _largest_floor_with_count(logits_row, vocab, peak, coef, floor, top_k,
                                                  CHUNK)
        if top_p < 1:
            goal = top_p.to(tl.float64) * _mass(logits_row, vocab, peak, coef, floor, CHUNK)[0]
            floor = _largest_floor_with_mass(logits_row, vocab, peak, coef, floor, goal, CHUNK)
        mass, theta = _mass(logits_row, vocab, peak, coef, floor, CHUNK)
        scale = (1.0 / mass).to(tl.float32)
    theta = tl.where(mode == SAMPLED, theta, float("inf"))  # processed() keeps nothing then
    out = stats_ptr + row * STATS
    tl.store(out, mode.to(tl.float64))
    tl.store(out + 1, peak.to(tl.float64))
    tl.store(out + 2, coef.to(tl.float64))
    tl.store(out + 3, theta.to(tl.float64))
    tl.store(out + 4, scale.to(tl.float64))
    tl.store(out + 5, index.to(tl.float64))
