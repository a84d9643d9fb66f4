"""Triton twin of ``randomness.py`` (beside this file): Philox4x32-10 and the uint32 -> uniform map.

Must give the same bits as the torch reference for every (seed, offset, stream, slot), on the GPU
and under ``TRITON_INTERPRET=1``.  All arithmetic is on uint32, so multiplies and key additions wrap
modulo 2**32 exactly as in the reference's masked int64 arithmetic.
"""

import triton
import triton.language as tl

from . import randomness

# The contract's constants (ints in [2**31, 2**32) become uint32 constants in Triton; globals a
# kernel reads must be tl.constexpr instances).
PHILOX_ROUNDS = tl.constexpr(randomness.PHILOX_ROUNDS)
PHILOX_M0 = tl.constexpr(randomness.PHILOX_M0)
PHILOX_M1 = tl.constexpr(randomness.PHILOX_M1)
PHILOX_W0 = tl.constexpr(randomness.PHILOX_W0)
PHILOX_W1 = tl.constexpr(randomness.PHILOX_W1)


@triton.jit
def philox4x32_word0(c0, c1, c2, c3, k0, k1):
    """Word 0 of Philox4x32-10 for counter (c0, c1, c2, c3) and key (k0, k1), all uint32."""
    for round_ in tl.static_range(PHILOX_ROUNDS):
        if round_ > 0:
            k0 = k0 + PHILOX_W0
            k1 = k1 + PHILOX_W1
        hi0 = tl.umulhi(c0, PHILOX_M0)
        lo0 = c0 * PHILOX_M0
        hi1 = tl.umulhi(c2, PHILOX_M1)
        lo1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0


@triton.jit
def uint32_to_uniform(x):
    """(2k + 1) * 2**-24 for the top 23 bits k of x: float32 in (0, 1), exact on every backend."""
    # 2**-23 and 2**-24 written out: float32 constants, exact.
    return (x >> 9).to(tl.float32) * 1.1920928955078125e-07 + 5.9604644775390625e-08


@triton.jit
def split_int64(x):
    """(low, high) 32-bit words of an int64 value as uint32."""
    lo = (x & 0xFFFFFFFF).to(tl.uint32)
    hi = ((x >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return lo, hi


@triton.jit
def philox_uniform(slot, stream, off_lo, off_hi, key_lo, key_hi):
    """The uniform of counter (slot, stream, offset) under key (seed): word 0 mapped to (0, 1)."""
    # tl.cast also accepts Python ints (loop counters under the interpreter).
    c0 = tl.cast(slot, tl.uint32)
    c1 = tl.cast(stream, tl.uint32)
    word0 = philox4x32_word0(c0, c1, off_lo, off_hi, key_lo, key_hi)
    return uint32_to_uniform(word0)
