"""Triton twin of ``probs.py`` (beside this file): reading probabilities as every sampler's rules
read them."""

import triton
import triton.language as tl

from . import probs

PROBABILITY_BOUND = tl.constexpr(probs.PROBABILITY_BOUND)


@triton.jit
def sanitize(x):
    """float32 value if in [0, PROBABILITY_BOUND), else 0 (probs.sanitize): max(x, 0) zeroes
    negatives (and NaN on a GPU), the bound zeroes +inf, values too large to sum (and NaN, where
    max propagates it, as under the interpreter). Two instructions per value; comparing 16-bit
    inputs directly compiles to bit tests."""
    x = tl.maximum(x.to(tl.float32), 0.0)
    return tl.where(x < PROBABILITY_BOUND, x, 0.0)


# What masked loads of row values give: no mass, read as a probability (sanitize) or as a logit.
ABSENT = tl.constexpr(-float("inf"))
