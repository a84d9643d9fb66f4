"""Triton twin of ``probs.py`` (beside this file): reading probabilities as every sampler's rules
read them."""

import triton
import triton.language as tl

from . import probs

PROBABILITY_BOUND = tl.constexpr(probs.PROBABILITY_BOUND)


@triton.jit
def widen(x):
    """x as float32, exactly. bfloat16 by moving its bits up (a shift, or a mask of a register's
    high half), where ptxas makes the conversion a permute and a shift."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def sanitize(x):
    """float32 value if in [0, PROBABILITY_BOUND), else 0 (probs.sanitize): max(x, 0) zeroes
    negatives (and NaN on a GPU), the bound zeroes +inf, values too large to sum (and NaN, where
    max propagates it, as under the interpreter). Two instructions per value; comparing 16-bit
    inputs directly compiles to bit tests."""
    x = tl.maximum(widen(x), 0.0)
    return tl.where(x < PROBABILITY_BOUND, x, 0.0)


# What masked loads of row values give: no mass, read as a probability (sanitize) or as a logit.
ABSENT = tl.constexpr(-float("inf"))
