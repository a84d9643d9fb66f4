"""Which Philox slot each random number of one chain request uses: the shared layout of
core/sampling/slots.py (docs/internals/randomness.md), all of whose slots token verification uses
but the stop coins'."""

from __future__ import annotations

from ...core.sampling.slots import (CDF_SLOT, coin_slot, coin_slots, num_slots, race_slot,
                                    race_slots)

__all__ = ["CDF_SLOT", "coin_slot", "coin_slots", "num_slots", "race_slot", "race_slots"]
