"""The randomness contract shared by every sampler: counter-based Philox4x32-10.

Every random number a sampler uses is a pure function of (seed, offset, stream, slot), so the
pure-torch code, the Triton kernel under ``TRITON_INTERPRET=1`` and the Triton kernel on a GPU draw
the same numbers bit for bit, whatever the launch configuration.  ``docs/internals/randomness.md`` states the
contract; ``philox.py`` beside this file is its Triton twin; each sampler documents which slot
each of its random numbers uses.
"""

from __future__ import annotations

import functools
import sys
import threading
from array import array
from typing import NamedTuple

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
    slots = torch.arange(first_slot, first_slot + num_slots, device=seed.device, dtype=torch.int64)
    return uniforms_at(seed, offset, batch_size, slots)


def uniforms_at(seed: torch.Tensor, offset: torch.Tensor, batch_size: int, slots: torch.Tensor):
    """The uniforms of every request at the given slots (S,) int64: float32 (batch_size, S), the
    columns ``request_uniforms`` would give at those slots (a vocabulary shard needs only its own
    chunks' slots)."""
    device = seed.device
    per_request_seed = seed.numel() != 1
    seed = seed.reshape(-1, 1).to(torch.int64)
    offset = offset.reshape(-1, 1).to(torch.int64)
    k0, k1 = split64(seed)
    off_lo, off_hi = split64(offset)
    rows = torch.arange(batch_size, device=device, dtype=torch.int64).reshape(-1, 1)
    stream = torch.zeros_like(rows) if per_request_seed else rows
    slot = slots.to(device=device, dtype=torch.int64).reshape(1, -1)
    word0, _, _, _ = philox4x32((slot, stream, off_lo, off_hi), (k0, k1))
    return uint32_to_uniform(word0.expand(batch_size, slot.shape[1]))


@functools.lru_cache(maxsize=64)
def _lanes(num_slots: int) -> tuple[int, int]:
    """(1 in each of num_slots 64-bit fields, the slot numbers 0, 1, ... in them) as ints."""
    ones = ((1 << (64 * num_slots)) - 1) // ((1 << 64) - 1)
    return ones, int.from_bytes(array("Q", range(num_slots)).tobytes(), sys.byteorder)


def request_uniforms_host(seed: int, offset: int, stream: int, num_slots: int) -> list[float]:
    """One request's row of ``request_uniforms``, bit for bit, as Python floats computed on the
    host: for a few dozen numbers, faster than any sequence of torch operations.

    Every slot is a lane: its 32-bit words sit in 64-bit fields of Python ints, so one multiply
    forms every lane's 64-bit product (a product never carries into the next field), and a shift
    and a mask give every lane's high or low half.
    """
    ones, slots = _lanes(num_slots)
    lane_mask = ones * _MASK32
    seed, offset = seed & (2**64 - 1), offset & (2**64 - 1)  # two's complement bits
    k0, k1 = seed & _MASK32, seed >> 32
    c0, c1, c2, c3 = slots, stream * ones, (offset & _MASK32) * ones, (offset >> 32) * ones
    for round_ in range(PHILOX_ROUNDS):
        if round_ > 0:
            k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
        product0, product1 = c0 * PHILOX_M0, c2 * PHILOX_M1
        c0, c1, c2, c3 = (
            ((product1 >> 32) & lane_mask) ^ c1 ^ (k0 * ones),
            product1 & lane_mask,
            ((product0 >> 32) & lane_mask) ^ c3 ^ (k1 * ones),
            product0 & lane_mask,
        )
    # uint32_to_uniform of every lane's word 0: (2k + 1) * 2**-24, exact as a float.
    odd = (((c0 >> 9) & (ones * 0x7FFFFF)) << 1) | ones  # 2k + 1 in every lane
    return [x * 2.0**-24 for x in array("Q", odd.to_bytes(8 * num_slots, sys.byteorder))]


# request_uniforms_fast reads the halves of int64 values through int32 views: low half first.
_LITTLE_ENDIAN = sys.byteorder == "little"
_FAST_CONSTANTS: dict = {}  # device -> the constant tensors of request_uniforms_fast
# Workspaces of request_uniforms_fast, per thread, for calls of up to _WORKSPACE_LANES numbers:
# on such sizes making the buffers and their views would cost as much as the rounds.
_WORKSPACES = threading.local()
_WORKSPACE_LANES = 2**16
_WORKSPACES_PER_THREAD = 16


def _fast_constants(device: torch.device):
    """request_uniforms_fast's constants on ``device``, made once: operations whose operands are
    tensors are cheaper than those that must first wrap a Python number in one."""
    constants = _FAST_CONSTANTS.get(device)
    if constants is None:
        def tensor(values, dtype=torch.int64):
            return torch.tensor(values, dtype=dtype, device=device)

        with torch.inference_mode(False), torch.no_grad():
            constants = _FAST_CONSTANTS[device] = (
                tensor([PHILOX_M1, PHILOX_M0]).view(2, 1, 1, 1),
                # Round r's key is the seed's words plus r * [W0, W1] (their low 32 bits).
                tensor([[r * PHILOX_W0, r * PHILOX_W1] for r in range(PHILOX_ROUNDS)])
                .view(PHILOX_ROUNDS, 2, 1, 1),
                tensor([0, 32]).view(1, 2, 1, 1),  # shifts that split an int64 into its words
                tensor(_MASK32), tensor(32), tensor(9),
                tensor(2.0**-23, torch.float32), tensor(2.0**-24, torch.float32),
                tensor([True, False], torch.bool).view(2, 1, 1),  # row 0 of a stacked pair
            )
    return constants


class _Workspace(NamedTuple):
    """request_uniforms_fast's buffers for one shape of call, and the views the rounds use."""

    keys: torch.Tensor  # (ROUNDS, 2, seeds, 1): every round's key [k0, k1]
    round_keys: tuple  # its rows
    slots: torch.Tensor  # (1, B, S): the slot of every number
    streams: torch.Tensor  # (B, 1) or (1, 1): the stream of every request
    words: torch.Tensor  # (2, B, S): [c0, c2], uint32 in int64
    low_words: torch.Tensor  # their low halves, int32
    words_row: torch.Tensor  # (1, 2, B, S): words broadcast against the multipliers
    previous: torch.Tensor  # (2, B or 1, 1): [c1, c3] before the first round
    grids: tuple  # two (2, 2, B, S) grids of products, for alternate rounds
    highs: tuple  # of each grid, the high halves of c2 * M1 and c0 * M0
    lows: tuple  # and their low halves


def _new_workspace(batch_size, num_slots, seeds, offsets, device) -> _Workspace:
    def empty(*shape):
        return torch.empty(shape, dtype=torch.int64, device=device)

    keys = empty(PHILOX_ROUNDS, 2, seeds, 1)
    words = empty(2, batch_size, num_slots)
    streams = torch.arange(batch_size if seeds == 1 else 1, device=device).view(-1, 1)
    grids = empty(2, 2, 2, batch_size, num_slots)
    halves = grids.view(torch.int32).view(2, 4, batch_size, num_slots, 2)[:, 1:3]
    return _Workspace(
        keys, keys.unbind(0),
        torch.arange(num_slots, device=device).expand(1, batch_size, num_slots).contiguous(),
        streams, words, words.view(torch.int32)[..., ::2], words.unsqueeze(0),
        empty(2, *torch.broadcast_shapes(streams.shape, (offsets, 1))),
        grids.unbind(0), halves[..., 1].unbind(0), halves[..., 0].unbind(0),
    )


def _workspace(batch_size, num_slots, seeds, offsets, device) -> _Workspace:
    if batch_size * num_slots > _WORKSPACE_LANES:
        return _new_workspace(batch_size, num_slots, seeds, offsets, device)
    cache = getattr(_WORKSPACES, "cache", None)
    if cache is None:
        cache = _WORKSPACES.cache = {}
    key = (batch_size, num_slots, seeds, offsets, device)
    workspace = cache.get(key)
    if workspace is None:
        if len(cache) >= _WORKSPACES_PER_THREAD:
            cache.pop(next(iter(cache)))  # the oldest
        with torch.inference_mode(False), torch.no_grad():
            workspace = cache[key] = _new_workspace(*key)
    return workspace


def request_uniforms_fast(seed: torch.Tensor, offset: torch.Tensor, batch_size: int,
                          num_slots: int) -> torch.Tensor:
    """``request_uniforms`` bit for bit, from about 45 torch operations instead of about 140.

    On small tensors a torch operation costs microseconds whatever it computes, so the rounds are
    arranged to take three operations each, on uint32 words held in int64 (high halves 0):
      * the words [c0, c2] are one (2, B, S) tensor, and one broadcasting multiply forms the grid
        [M1, M0] x [c0, c2]; the two products a round needs, c2 * M1 and c0 * M0, are its middle
        two, so their high and low halves are int32 views (little-endian) of the grid;
      * the new [c0, c2] are those high halves xored with the previous round's low halves (the
        old [c1, c3]), written into the low halves of the words, then xored with the round's key.
    The buffers and views are made once per shape and thread, and the setup is done in place.
    """
    if not _LITTLE_ENDIAN:
        return request_uniforms(seed, offset, batch_size, num_slots)
    device = seed.device
    multipliers, bumps, shifts, mask, shift32, shift9, scale, half, first = _fast_constants(device)
    ws = _workspace(batch_size, num_slots, seed.shape[0], offset.shape[0], device)
    torch.add(seed.view(1, 1, -1, 1) >> shifts, bumps, out=ws.keys).bitwise_and_(mask)
    offset = offset.view(-1, 1)
    torch.where(first, ws.slots, offset & mask, out=ws.words)
    torch.where(first, ws.streams, offset >> shift32, out=ws.previous)
    previous_low = ws.previous
    for round_, key in enumerate(ws.round_keys):  # two grids: a round reads the last one's lows
        torch.mul(ws.words_row, multipliers, out=ws.grids[round_ % 2])
        torch.bitwise_xor(ws.highs[round_ % 2], previous_low, out=ws.low_words)
        ws.words.bitwise_xor_(key)
        previous_low = ws.lows[round_ % 2]
    # uint32_to_uniform with tensor operands: (2k + 1) * 2**-24, exact in any order of operations.
    return torch.addcmul(half, (ws.words[0] >> shift9).float(), scale)
