"""How a kernel reads a row's values: probabilities as the rules read them (sanitised), or logits
through their row's statistics, the probabilities each request's sampling parameters make of them
(``core/logits/triton.py`` computes the statistics and says what they hold).
"""

import triton
import triton.language as tl

from .probs_triton import sanitize, widen

NO_MASS = tl.constexpr(0)
SAMPLED = tl.constexpr(1)
GREEDY = tl.constexpr(2)
STATS = tl.constexpr(6)  # mode, m, c, L, r, greedy index
# A kernel's LOGITS flag for rows of logits that may be greedy: their values are then one-hot at
# the row's index (a tree's row passes read such rows; a chain's kernels draw a greedy row's
# token without a pass, so theirs compile without the test).
ONE_HOT = tl.constexpr(2)


@triton.jit
def processed(x, peak, coef, limit, scale):
    """A sampled row's probabilities of logits x (float32): exp2(n (-c)) r, n = m - x, where n's
    bits are below the keep limit (module docstring), else 0. exp2(n (-c)) is exp2((x - m) c)
    bit for bit: float32 subtraction and product round symmetrically."""
    n = peak - x
    keep = n.to(tl.uint32, bitcast=True) < limit
    return tl.where(keep, tl.exp2(n * -coef) * scale, 0.0)


@triton.jit
def load_stats(stats, mask=True):
    """A row's statistics at ``stats`` (a pointer, or a vector of pointers, read where ``mask``):
    (mode, m, c, L, r, greedy index), in the types the kernels compute with."""
    mode = tl.load(stats, mask=mask, other=0.0).to(tl.int32)
    peak = tl.load(stats + 1, mask=mask, other=0.0).to(tl.float32)
    coef = tl.load(stats + 2, mask=mask, other=0.0).to(tl.float32)
    limit = tl.load(stats + 3, mask=mask, other=0.0).to(tl.uint32)
    scale = tl.load(stats + 4, mask=mask, other=0.0).to(tl.float32)
    index = tl.load(stats + 5, mask=mask, other=0.0).to(tl.int64)
    return mode, peak, coef, limit, scale, index


@triton.jit
def greedy_row(stats):
    """(whether a row of logits is greedy, its token: the first index of its largest logit), from
    the row's statistics at ``stats``."""
    mode, peak, coef, limit, scale, index = load_stats(stats)
    return mode == GREEDY, index


@triton.jit
def row_values(raw, LOGITS: tl.constexpr, peak, coef, limit, scale, start=None, lane=None,
               hot=None):
    """A row's values at tokens start + lane as the rules read them: the sanitised probabilities,
    or (LOGITS) the probabilities a sampled row's statistics give its logits, with ONE_HOT 1 at
    token ``hot`` (int32: a greedy row's index, else -1; a greedy row keeps no logit)."""
    if LOGITS:
        values = processed(widen(raw), peak, coef, limit, scale)
        if LOGITS == ONE_HOT:
            values = tl.where(lane == hot - start.to(tl.int32), 1.0, values)
        return values
    return sanitize(raw)


@triton.jit
def probabilities_at(raw, stats, ids, mask, LOGITS: tl.constexpr):
    """The probabilities of the logits (or probabilities) ``raw`` at token ``ids`` of their rows,
    whose statistics are at ``stats`` (vectors alike, read where ``mask``): greedy rows one-hot at
    their index."""
    if LOGITS:
        mode, peak, coef, limit, scale, index = load_stats(stats, mask)
        sampled = processed(widen(raw), peak, coef, limit, scale)
        return tl.where(mode == GREEDY, (ids == index).to(tl.float32), sampled)
    return sanitize(raw)
