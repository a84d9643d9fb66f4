"""Triton twin of ``sums.py`` (beside this file): exact, order-free sums of float32 chunk masses as
integer bins, and the same float64 value as the torch code for the same masses."""

import triton
import triton.language as tl

from . import sums

NUM_BINS = tl.constexpr(sums.NUM_BINS)
BIN_LANES = tl.constexpr(16)  # NUM_BINS rounded up to a power of two; the lanes above stay 0
LOWEST_EXPONENT = tl.constexpr(sums.LOWEST_EXPONENT)
MASK = tl.constexpr(2**sums.BIN_BITS - 1)


@triton.jit
def add_masses(bins, masses):
    """``bins`` (ROWS, BIN_LANES) int64 plus the exact sum of each row of ``masses`` (ROWS, C)
    float32, finite and >= 0 (0 where absent): unnormalised, each bin grows by less than
    C * 2**32."""
    bits = masses.to(tl.int32, bitcast=True).to(tl.int64)
    exponent = bits >> 23  # biased; 0 for 0 and subnormal values
    significand = (bits & 0x7FFFFF) | tl.where(exponent > 0, 1 << 23, 0)
    k = tl.maximum(exponent, 1) - 1  # value = significand * 2**(k - 149)
    value = significand << (k & 31)  # in units of bin k >> 5: low 32 bits there, the rest above
    low = value & MASK
    high = value >> 32
    b = k >> 5
    lanes = tl.arange(0, BIN_LANES)
    for j in tl.static_range(NUM_BINS):
        part = tl.sum(tl.where(b == j, low, 0) + tl.where(b + 1 == j, high, 0), axis=1)
        bins = tl.where(lanes[None, :] == j, bins + part[:, None], bins)
    return bins


@triton.jit
def to_float(bins):
    """float64 value of each row of bins (ROWS, BIN_LANES) int64 below 2**63: carries
    normalised, then bin by bin from the highest, as sums.to_float."""
    lanes = tl.arange(0, BIN_LANES)
    for j in tl.static_range(BIN_LANES - 1):  # carries from the lowest bin up, in order
        column = tl.sum(tl.where(lanes[None, :] == j, bins, 0), axis=1)
        bins = tl.where(lanes[None, :] == j, (column & MASK)[:, None], bins)
        bins = tl.where(lanes[None, :] == j + 1, bins + (column >> 32)[:, None], bins)
    total = tl.zeros([bins.shape[0]], tl.float64)
    for b in tl.static_range(NUM_BINS - 1, -1, -1):
        term = tl.sum(tl.where(lanes[None, :] == b, bins, 0), axis=1).to(tl.float64)
        # 2**(32 b - 149) in float64, built from its exponent bits (a float literal is float32)
        unit = tl.full([], (1023 + 32 * b + LOWEST_EXPONENT) << 52, tl.int64).to(tl.float64,
                                                                                 bitcast=True)
        total = total + term * unit
    return total

