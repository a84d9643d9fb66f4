"""Reading probabilities as every sampler's rules read them: NaN, negative, infinite and too large
values count as 0 (docs/token.md)."""

from __future__ import annotations

import math
import struct

import torch


# Values from here up, +inf among them, count as 0: 1024 of them (a chunk) sum to less than the
# float32 maximum, so no chunk's mass overflows. Probabilities are at most 1; a bound of 2**117
# (about 1.7e35) refuses only values no distribution has.
PROBABILITY_BOUND = 2.0**117


def sanitize(probs: torch.Tensor) -> torch.Tensor:
    """Float32 copy in which NaN, negative and infinite probabilities, and those of
    PROBABILITY_BOUND or more, count as 0."""
    probs = probs.float()
    return torch.where((probs > 0) & (probs < PROBABILITY_BOUND), probs, 0.0)


def rows_at(probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Row probs[b, position[b]] of every request b: (B, M, V) -> (B, V)."""
    return probs[torch.arange(probs.shape[0], device=probs.device), position]


def as_float32(x: float) -> float:
    """x rounded to float32 (to nearest, ties to even), as float32 arithmetic rounds its exact
    result."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # rounds past float32's largest value
        return math.copysign(math.inf, x)


def as_float(value) -> float:
    """A Python number as a float: an int past float64's range is an infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def sanitized(x: float) -> float:
    """A probability as ``sanitize`` reads it: NaN, negative, infinite and too large -> 0."""
    return x if 0.0 < x < PROBABILITY_BOUND else 0.0
