"""Sums of chunk masses that do not depend on the order or grouping they are added in.

A row's total mass is summed from its chunks' masses, which programs (and, vocabulary-parallel,
ranks) hold in different groups. Floating-point sums depend on their grouping, so the total is
formed exactly instead: every chunk mass is a float32 value, an integer multiple of 2**-149, and
its integer is added into bins of 32 bits each (bin b counts multiples of 2**(32 b - 149)). Integer addition is exact, so
the bins of a row are the same however its chunks are grouped; with their carries normalised
(every bin below 2**32) they are one canonical form of the exact sum, and ``to_float`` turns that
form into a float64 value by one fixed sequence of operations. ``sums_triton.py`` beside this file
is the Triton twin.
"""

from __future__ import annotations

import torch

BIN_BITS = 32
# Bins 0..8 hold the masses (float32's bits lie 0..277 above 2**-149); bin 9 takes their carries,
# so no sum of fewer than 2**40 masses overflows.
NUM_BINS = 10
LOWEST_EXPONENT = -149  # of bin 0's unit: the least float32 value is 2**-149
_MASK = 2**BIN_BITS - 1


def bins_of(masses: torch.Tensor) -> torch.Tensor:
    """The exact sum of the float32 ``masses`` (..., K), each finite and >= 0, as normalised
    int64 bins (..., NUM_BINS)."""
    bits = masses.float().view(torch.int32).long()
    exponent = bits >> 23  # biased; 0 for 0 and subnormal values
    significand = (bits & 0x7FFFFF) | ((exponent > 0).long() << 23)
    # value = significand * 2**(max(exponent, 1) - 150): bit position k above 2**-149.
    k = exponent.clamp(min=1) - 1
    value = significand << (k & 31)  # < 2**55, in units of bin k >> 5: its low 32 bits go there,
    bins = torch.zeros((*masses.shape[:-1], NUM_BINS), dtype=torch.int64, device=masses.device)
    bins.scatter_add_(-1, k >> 5, value & _MASK)  # the rest one bin up, so that no bin passes
    bins.scatter_add_(-1, (k >> 5) + 1, value >> BIN_BITS)  # 2**63 before 2**31 masses
    return normalise(bins)


def normalise(bins: torch.Tensor) -> torch.Tensor:
    """The same exact sum with every bin below 2**32 (each carry moved one bin up, in order)."""
    bins = bins.clone()
    for b in range(NUM_BINS - 1):
        bins[..., b + 1] += bins[..., b] >> BIN_BITS
        bins[..., b] &= _MASK
    return bins


def to_float(bins: torch.Tensor) -> torch.Tensor:
    """float64 value of normalised bins (..., NUM_BINS): bin by bin from the highest, each term
    exact, so the value depends on the exact sum alone."""
    total = torch.zeros(bins.shape[:-1], dtype=torch.float64, device=bins.device)
    for b in reversed(range(NUM_BINS)):
        total = total + bins[..., b].double() * 2.0 ** (BIN_BITS * b + LOWEST_EXPONENT)
    return total


def exact_total(masses: torch.Tensor) -> torch.Tensor:
    """The sum of ``masses`` (..., K) along the last dimension, as ``to_float`` of its bins."""
    return to_float(bins_of(masses))


def exact_total_host(masses: list[float]) -> float:
    """``exact_total`` of one row's float32 masses (finite, >= 0) given as Python floats, on the
    host: the same float64 value, from the exact integer sum in units of 2**-149 and ``to_float``'s
    sequence of float64 operations (Python floats round as torch's float64 operations do). For a
    few masses, far cheaper than the torch operations of ``exact_total``."""
    if len(masses) == 1:  # one float32 value: every partial sum of its bins is exact (-0.0: 0)
        return abs(masses[0])
    exact = sum(map(int, map(_UNIT.__mul__, masses)))  # each product exact
    total = 0.0
    # to_float's terms from the highest bin down; an empty bin adds 0, which changes nothing.
    for b in reversed(range(min(exact.bit_length() // BIN_BITS + 1, NUM_BINS))):
        bin_value = exact >> (BIN_BITS * b)
        if b < NUM_BINS - 1:
            bin_value &= _MASK
        if bin_value:
            total = total + float(bin_value) * _SCALES[b]
    return total


_UNIT = 2.0 ** -LOWEST_EXPONENT  # masses in units of 2**-149
_SCALES = [2.0 ** (BIN_BITS * b + LOWEST_EXPONENT) for b in range(NUM_BINS)]
