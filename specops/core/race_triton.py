"""Triton stages of the chunked exponential race (``race.py`` beside this file is the torch rule),
for every sampler's kernel: the same operations in the same precision, so the kernels and the torch
code draw the same tokens.
"""

import triton
import triton.language as tl


@triton.jit
def sanitize(x):
    """float32 value if finite and > 0, else 0: max(x, 0) zeroes negatives (and NaN on a GPU),
    the < inf test zeroes +inf (and NaN, where max propagates it, as under the interpreter).
    Two instructions per value; comparing 16-bit inputs directly compiles to bit tests."""
    x = tl.maximum(x.to(tl.float32), 0.0)
    return tl.where(x < float("inf"), x, 0.0)


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
