"""Which Philox slot each random number of one tree request uses (docs/internals/randomness.md, "Slots of
a tree request").

M nodes (node i = 1..M; node 0 is the root), K = ceil(V / CHUNK_SIZE) vocabulary chunks; a call
draws tokens by the chunked race in numbered draws r = 0, 1, ..., each with its own block of
K + 1 slots:
    slot r (K + 1),               0 <= r <= M : the inverse-CDF uniform of draw r
    slot r (K + 1) + 1 + k,       k < K       : the race uniform of chunk k in draw r
    slot 1 + K + 2 (i - 1),       1 <= i <= M : the acceptance coin of node i (draft
                                                probabilities given)
With draft probabilities a call makes one draw (r = 0), at the node where the walk stops, and node
i's coin is the chain's coin of position i - 1: the chain op's slots (core/sampling/slots.py), so
that a chain of nodes gives the chain op's tokens. Target-only, draw r is the one at depth r of
the path (the root's is r = 0), so the draws along a path never share a uniform; no coin is used
then, so draws past the first may share slots with coins. No slot depends on M.
"""

from __future__ import annotations

from ..core.sampling.slots import coin_slot as chain_coin_slot
from ..core.sampling.race import num_chunks


def coin_slot(vocab: int, node: int) -> int:
    return chain_coin_slot(vocab, node - 1)


def draw_slot(vocab: int, draw: int) -> int:
    """The inverse-CDF uniform's slot of draw ``draw``; its race slots follow it."""
    return draw * slots_per_draw(vocab)


def race_slot(vocab: int, draw: int, chunk: int) -> int:
    return draw_slot(vocab, draw) + 1 + chunk


def slots_per_draw(vocab: int) -> int:
    return num_chunks(vocab) + 1
