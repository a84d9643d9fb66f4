"""The randomness contract shared by every sampler: counter-based Philox4x32-10.

Every random number a sampler uses is a pure function of (seed, offset, stream, slot), so the
pure-torch code, the Triton kernel under ``TRITON_INTERPRET=1`` and the Triton kernel on a GPU draw
the same numbers bit for bit, whatever the launch configuration.  ``docs/randomness.md`` states the
contract; ``philox.py`` beside this file is its Triton twin; each sampler documents which slot
each of its random numbers uses.
"""

from __future__ import annotations

import torch

PHILOX_ROUNDS = 10
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9  # golden ratio
PHILOX_W1 = 0xBB67AE85  # sqrt(3) - 1

_MASK32 = 0xFFFFFFFF


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor]):
    """Philox4x32-10 on int64 tensors holding uint32 values (broadcasting). Returns 4 words.

    Each round multiplies two counter words into 64-bit products: the high halves are mixed into
    the next round's words, the low halves become words themselves. int64 multiplication wraps
    modulo 2**64 (on every torch backend), which keeps all 64 bits of the unsigned product; the
    arithmetic shift and the unmasked low halves and keys leave garbage above bit 31, and masking a
    word once before it is multiplied (and on return) removes it: only low bits feed low bits.
    The known-answer tests in tests/test_randomness.py would catch a platform where this failed.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_ in range(PHILOX_ROUNDS):
        if round_ > 0:
            k0 = k0 + PHILOX_W0  # the key bump is modulo 2**32: its high bits are masked below
            k1 = k1 + PHILOX_W1
        product0 = c0 * PHILOX_M0
        product1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = (
            ((product1 >> 32) ^ c1 ^ k0) & _MASK32,  # high half of product1
            product1,  # low half of product1, masked later
            ((product0 >> 32) ^ c3 ^ k1) & _MASK32,
            product0,
        )
    return c0, c1 & _MASK32, c2, c3 & _MASK32


def uint32_to_uniform(x: torch.Tensor) -> torch.Tensor:
    """Map a uint32 word to float32 in the open interval (0, 1), exactly.

    The top 23 bits k give (2k + 1) * 2**-24: exactly representable in float32, never 0 or 1,
    and computed the same way (one int->float conversion, one multiply, one add) in Triton.
    """
    return (x >> 9).to(torch.float32) * (2.0**-23) + 2.0**-24


def split64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) 32-bit words of int64 values, as non-negative int64."""
    return x & _MASK32, (x >> 32) & _MASK32


def request_uniforms(seed: torch.Tensor, offset: torch.Tensor, batch_size: int, num_slots: int,
                     first_slot: int = 0):
    """The uniforms of slots ``first_slot .. first_slot + num_slots - 1`` of every request: a
    float32 (batch_size, num_slots) tensor.

    seed, offset: int64 tensors of 1 or batch_size elements. The Philox key is the seed; the
    counter is (slot, stream, offset), where stream is the request's batch row when one seed serves
    the whole batch and 0 when every request has its own seed (batch invariance).
    """
    device = seed.device
    per_request_seed = seed.numel() != 1
    seed = seed.reshape(-1, 1).to(torch.int64)
    offset = offset.reshape(-1, 1).to(torch.int64)
    k0, k1 = split64(seed)
    off_lo, off_hi = split64(offset)
    rows = torch.arange(batch_size, device=device, dtype=torch.int64).reshape(-1, 1)
    stream = torch.zeros_like(rows) if per_request_seed else rows
    slot = torch.arange(first_slot, first_slot + num_slots, device=device,
                        dtype=torch.int64).reshape(1, -1)
    word0, _, _, _ = philox4x32((slot, stream, off_lo, off_hi), (k0, k1))
    return uint32_to_uniform(word0.expand(batch_size, num_slots))
