"""Exact, order-free sums of chunk masses (specops/core/sampling/sums.py and its Triton twin): a row's total
mass must not depend on how its chunks are grouped (over programs, or over ranks), and must be
the exact sum to float64 precision."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch
import triton
import triton.language as tl

from inputs import DEVICE  # tests/inputs.py
from specops.core.sampling import sums
from specops.core.sampling.sums_triton import BIN_LANES, add_masses, to_float

# Chunk masses of every magnitude float32 has, zeros among them.
KINDS = {
    "probabilities": lambda g, k: torch.rand(k, generator=g),
    "tiny": lambda g, k: torch.rand(k, generator=g) ** 40,
    "every exponent": lambda g, k: torch.exp(torch.randn(k, generator=g) * 40).clamp(max=3e38),
    "subnormal": lambda g, k: torch.rand(k, generator=g) * 1e-40,
}


def exact(masses: torch.Tensor) -> Fraction:
    return sum((Fraction(float(m)) for m in masses.tolist()), Fraction(0))


@pytest.mark.parametrize("kind", KINDS)
def test_bins_do_not_depend_on_order_or_grouping(kind):
    g = torch.Generator().manual_seed(1)
    rng = random.Random(1)
    for _ in range(50):
        masses = KINDS[kind](g, rng.randint(1, 400)).float()
        masses[torch.rand(masses.shape, generator=g) < 0.2] = 0.0
        whole = sums.bins_of(masses[None])[0]
        shuffled = masses[torch.randperm(len(masses), generator=g)]
        cuts = sorted(rng.sample(range(len(masses) + 1), k=min(3, len(masses) + 1)))
        parts = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(masses)])]
        grouped = sum(sums.bins_of(part[None])[0] for part in parts)
        assert torch.equal(sums.normalise(grouped), whole)
        assert (whole < 2**32).all() and (whole >= 0).all()  # normalised: one form per sum
        total, value = exact(masses), Fraction(float(sums.to_float(whole[None])[0]))
        assert total == value == 0 or abs(value - total) <= total * Fraction(1, 2**50)


@pytest.mark.parametrize("kind", KINDS)
def test_host_total_is_the_torch_total_bit_for_bit(kind):
    """The CPU backends' few-row path sums masses on the host: its float64 value must be
    ``exact_total``'s exactly (the same rounding steps), or rows from logits would differ."""
    g = torch.Generator().manual_seed(2)
    rng = random.Random(2)
    for _ in range(200):
        masses = KINDS[kind](g, rng.randint(1, 40)).float()
        masses[torch.rand(masses.shape, generator=g) < 0.2] = 0.0
        expected = float(sums.exact_total(masses[None])[0])
        assert sums.exact_total_host(masses.tolist()) == expected


def test_many_masses_in_one_bin_do_not_overflow():
    masses = torch.full((1, 200_000), 1.0 - 2**-24)  # every significand bit set
    assert float(sums.exact_total(masses)[0]) == float(exact(masses[0]))


@triton.jit
def total_kernel(masses_ptr, out_ptr, rows, chunks, BLOCK_R: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    r = tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    bins = tl.zeros([BLOCK_R, BIN_LANES], tl.int64)
    for first in range(0, chunks, BLOCK_C):
        mask = (r < rows)[:, None] & (first + c < chunks)[None, :]
        masses = tl.load(masses_ptr + r[:, None] * chunks + first + c[None, :], mask=mask,
                         other=0.0)
        bins = add_masses(bins, masses)
    tl.store(out_ptr + r, to_float(bins), mask=r < rows)


@pytest.mark.interpreter
def test_triton_twin_gives_the_same_value():
    g = torch.Generator().manual_seed(2)
    masses = torch.cat([KINDS[kind](g, 300)[None] for kind in KINDS]).float().to(DEVICE)
    out = torch.empty(len(masses), dtype=torch.float64, device=DEVICE)
    total_kernel[(1,)](masses, out, len(masses), masses.shape[1], BLOCK_R=4, BLOCK_C=64)
    assert torch.equal(out.cpu(), sums.exact_total(masses.cpu()))
