"""Which Philox slot each random number of one block-verification request uses
(docs/internals/randomness.md): the shared layout of core/sampling/slots.py, token verification's,
with the stop coins in the slots it leaves free between the coins.

N draft positions, K = ceil(V / CHUNK_SIZE) vocabulary chunks:
    slot 0                       : the inverse-CDF uniform inside the winning chunk
    slot 1 + k,        k < K     : the exponential-race uniform of chunk k (one race serves every
                                   t: only the row at tau is sampled, and tau depends on the etas)
    slot 1 + K + 2j,   j < N     : the alignment coin of draft position j, the very slot and rule
                                   of token verification, so the accepted counter is the same
    slot K + 2t,       1 <= t <= N: eta_t, the coin that lets the block stop at t (keep t drafts)
"""

from __future__ import annotations

from ...core.sampling.slots import (CDF_SLOT, coin_slot, coin_slots, num_slots, race_slot,
                                    race_slots)

# Token verification's slots, the same numbers, and the stop coins'.
__all__ = ["CDF_SLOT", "coin_slot", "coin_slots", "num_slots", "race_slot", "race_slots",
           "stop_slot", "stop_slots"]


def stop_slot(vocab: int, t: int) -> int:
    return coin_slot(vocab, t - 1) + 1


def stop_slots(vocab: int, num_draft: int) -> slice:
    """eta_1..eta_N, as a slice of a request's uniforms."""
    return slice(stop_slot(vocab, 1), stop_slot(vocab, num_draft) + 1, 2)
